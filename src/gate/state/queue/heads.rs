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

/// Whether `a` goes before `b`: by start tag, then arrival (the id never
/// decides, arrivals differ). Computed as the borrow of a 192-bit
/// subtraction, without branches: which child of a node is least is data
/// a branch predictor cannot learn, and a sift through a deep band would
/// pay a misprediction at most levels.
#[inline]
fn before(a: &Head, b: &Head) -> bool {
    let (_, seq_borrow) = a.1.overflowing_sub(b.1);
    let (start_difference, start_borrow) = a.0.overflowing_sub(b.0);
    let (_, tie_borrow) = start_difference.overflowing_sub(u128::from(seq_borrow));
    start_borrow | tie_borrow
}

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
        self.sift_up(self.heap.len() - 1);
    }

    /// Drops the first entry. The hole it leaves moves down along the
    /// least children to the bottom, and the last entry fills it from
    /// there: the last entry belongs near the bottom, so this compares
    /// fewer pairs than sifting it down from the top.
    pub(super) fn pop(&mut self) {
        let Some(last) = self.heap.pop() else {
            return;
        };
        let len = self.heap.len();
        if len == 0 {
            return;
        }
        let mut hole = 0;
        loop {
            let first_child = hole * ARITY + 1;
            if first_child >= len {
                break;
            }
            let least = self.least_child(first_child);
            self.heap[hole] = self.heap[least];
            hole = least;
        }
        self.heap[hole] = last;
        self.sift_up(hole);
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

    fn sift_up(&mut self, mut index: usize) {
        let head = self.heap[index];
        while index > 0 {
            let parent = (index - 1) / ARITY;
            if !before(&head, &self.heap[parent]) {
                break;
            }
            self.heap[index] = self.heap[parent];
            index = parent;
        }
        self.heap[index] = head;
    }

    fn sift_down(&mut self, mut index: usize) {
        let head = self.heap[index];
        while index * ARITY + 1 < self.heap.len() {
            let least = self.least_child(index * ARITY + 1);
            if !before(&self.heap[least], &head) {
                break;
            }
            self.heap[index] = self.heap[least];
            index = least;
        }
        self.heap[index] = head;
    }

    /// The least of the children starting at `first_child` (which exists).
    fn least_child(&self, first_child: usize) -> usize {
        let mut least = first_child;
        for child in first_child + 1..(first_child + ARITY).min(self.heap.len()) {
            least = if before(&self.heap[child], &self.heap[least]) {
                child
            } else {
                least
            };
        }
        least
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{Head, Heads, before};

    proptest! {
        #[test]
        fn before_is_the_order_of_start_tag_then_arrival(
            a in (any::<u128>(), any::<u64>()),
            b in (any::<u128>(), any::<u64>()),
            same_start in any::<bool>(),
        ) {
            let b = if same_start { (a.0, b.1) } else { b };
            prop_assert_eq!(before(&(a.0, a.1, 0), &(b.0, b.1, 1)), a < b);
        }


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
