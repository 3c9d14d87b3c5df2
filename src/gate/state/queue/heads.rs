//! A band's flow heads in fair order: a 4-ary min-heap.
//!
//! Four children per node halve the depth of a binary heap, and a node's
//! children lie side by side (two cache lines), so taking the first head
//! of a band of a thousand flows waits on five loads in a row, not ten.
//!
//! # Invariants
//!
//! * Every entry is at least its parent (`(index - 1) / 4`).

/// A flow head: (start tag, arrival, flow id). Arrivals differ, so no two
/// entries are equal, and the first entry does not depend on the order
/// entries came in.
pub(super) type Head = (u128, u64, u32);

const ARITY: usize = 4;

#[derive(Debug, Default)]
pub(super) struct Heads {
    heap: Vec<Head>,
}

impl Heads {
    pub(super) fn first(&self) -> Option<&Head> {
        self.heap.first()
    }

    pub(super) fn len(&self) -> usize {
        self.heap.len()
    }

    pub(super) fn push(&mut self, head: Head) {
        self.heap.push(head);
        let mut index = self.heap.len() - 1;
        while index > 0 {
            let parent = (index - 1) / ARITY;
            if self.heap[parent] <= head {
                break;
            }
            self.heap[index] = self.heap[parent];
            index = parent;
        }
        self.heap[index] = head;
    }

    /// Drops the first entry.
    pub(super) fn pop(&mut self) {
        let Some(last) = self.heap.pop() else {
            return;
        };
        if !self.heap.is_empty() {
            self.heap[0] = last;
            self.sift_down(0);
        }
    }

    /// Replaces every entry with `heads`, keeping the buffer unless it is
    /// more than twice the room `keep` entries need.
    pub(super) fn rebuild(&mut self, heads: impl Iterator<Item = Head>, keep: usize) {
        self.heap.clear();
        if self.heap.capacity() > 2 * (keep + 1) {
            self.heap.shrink_to(keep);
        }
        self.heap.extend(heads);
        for index in (0..self.heap.len().div_ceil(ARITY)).rev() {
            self.sift_down(index);
        }
    }

    fn sift_down(&mut self, mut index: usize) {
        let head = self.heap[index];
        let len = self.heap.len();
        loop {
            let first_child = index * ARITY + 1;
            if first_child >= len {
                break;
            }
            let mut least = first_child;
            for child in first_child + 1..(first_child + ARITY).min(len) {
                if self.heap[child] < self.heap[least] {
                    least = child;
                }
            }
            if head <= self.heap[least] {
                break;
            }
            self.heap[index] = self.heap[least];
            index = least;
        }
        self.heap[index] = head;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{Head, Heads};

    proptest! {
        /// Pushes, pops and rebuilds, against a sorted list of the same
        /// entries: the first entry is always the least.
        #[test]
        fn the_first_head_is_always_the_least(
            steps in proptest::collection::vec((0u8..3, 0u128..8), 1..200),
        ) {
            let mut heads = Heads::default();
            let mut model: Vec<Head> = Vec::new();
            for (seq, (step, start)) in steps.into_iter().enumerate() {
                match step {
                    0 | 1 => {
                        let head = (start, seq as u64, seq as u32);
                        heads.push(head);
                        model.push(head);
                    }
                    _ if seq % 7 == 0 => heads.rebuild(model.iter().copied(), model.len()),
                    _ => {
                        heads.pop();
                        model.sort();
                        if !model.is_empty() {
                            model.remove(0);
                        }
                    }
                }
                model.sort();
                prop_assert_eq!(heads.first(), model.first());
                prop_assert_eq!(heads.len(), model.len());
            }
        }
    }
}
