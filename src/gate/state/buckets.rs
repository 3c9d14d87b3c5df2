//! Bucket addressing and rank retirement: which [`Bucket`] a request, a
//! ticket or a grant is counted in, and what happens to a rank's bucket
//! when the engine reports fewer ranks.
//!
//! # Invariants
//!
//! * A [`BucketKey::Rank`] names a recognised rank only while the engine's
//!   last report had that rank: before the first report every request is
//!   unranked ([`State::recognise`]).
//! * A vanished rank's bucket stays in `ranks` (vanished buckets keep their
//!   tallies for observers), with its generation bumped: a [`Held`] made
//!   before it vanished no longer matches it, so a grant of a vanished rank
//!   counts in the unranked bucket ([`State::current_bucket`]) even after
//!   the rank reappears.
//! * Retiring a rank moves its counts and its queue into the unranked
//!   bucket, the two queues merged by arrival: `total` does not change,
//!   and no queued request loses its place relative to older ones.

use std::time::Instant;

use slab::Slab;

use super::queue::Queue;
use super::{Entry, Slot, State, Status};
use crate::gate::types::{BandTally, Counts, Tally};

/// Which capacity a request is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BucketKey {
    Unranked,
    Rank(u32),
}

impl BucketKey {
    /// The key of a known rank's bucket (`None`: the unranked one).
    pub(super) fn of(rank: Option<u32>) -> BucketKey {
        rank.map_or(BucketKey::Unranked, BucketKey::Rank)
    }

    /// The rank it names, `None` for the unranked bucket.
    pub(super) fn rank(self) -> Option<u32> {
        match self {
            BucketKey::Unranked => None,
            BucketKey::Rank(rank) => Some(rank),
        }
    }
}

/// Where a grant's capacity is counted. The generation tells a grant made on
/// a rank that has since vanished (its counts moved to the unranked bucket)
/// from one made on the same rank number after it reappeared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) bucket: BucketKey,
    pub(super) generation: u32,
}

#[derive(Debug, Default)]
pub(super) struct Bucket {
    pub(super) counts: Counts,
    pub(super) queue: Queue,
    pub(super) tally: Tally,
    /// Tallies per configured priority band, by rung; empty (and never
    /// allocated) unless bands are configured.
    pub(super) bands: Vec<BandTally>,
    pub(super) generation: u32,
    /// The last queue admission, or when the queue last became non-empty:
    /// the start of the interval the next queue admission ends.
    pub(super) drain_mark: Option<Instant>,
    /// Mean time between queue admissions while the queue is not empty
    /// (seconds, a moving average): how fast it drains.
    pub(super) drain_interval: Option<f64>,
    /// Controlled delay's state of its queue.
    pub(super) codel: super::codel::Codel,
}

/// Every bucket: one per rank ever recognised (a vanished rank's stays, for
/// its tallies and its generation) and the unranked one. The one place a
/// [`BucketKey`] is resolved to its bucket.
#[derive(Debug, Default)]
pub(super) struct Buckets {
    pub(super) ranks: Vec<Bucket>,
    pub(super) unranked: Bucket,
}

impl Buckets {
    pub(super) fn get(&self, key: BucketKey) -> &Bucket {
        match key {
            BucketKey::Unranked => &self.unranked,
            BucketKey::Rank(rank) => &self.ranks[rank as usize],
        }
    }

    pub(super) fn get_mut(&mut self, key: BucketKey) -> &mut Bucket {
        match key {
            BucketKey::Unranked => &mut self.unranked,
            BucketKey::Rank(rank) => &mut self.ranks[rank as usize],
        }
    }
}

impl<T> State<T> {
    /// The ranks currently recognised (0 before the first report).
    pub(super) fn recognised_ranks(&self) -> usize {
        if self.capacity.is_some() {
            self.active_ranks
        } else {
            0
        }
    }

    /// The bucket a live entry is counted in: its queue's, or, once
    /// offered, its grant's.
    pub(super) fn held_bucket_of(&self, slot: Slot) -> BucketKey {
        let entry = &self.entries[slot];
        match &entry.status {
            Status::Queued | Status::Displaced(_) => entry.bucket,
            Status::Offered(grant) => self.current_bucket(grant.held),
        }
    }

    pub(super) fn recognise(&self, rank: Option<u32>) -> BucketKey {
        match rank {
            Some(rank) if self.capacity.is_some() && (rank as usize) < self.active_ranks => {
                BucketKey::Rank(rank)
            }
            _ => BucketKey::Unranked,
        }
    }

    pub(super) fn bucket(&self, key: BucketKey) -> &Bucket {
        self.buckets.get(key)
    }

    pub(super) fn bucket_mut(&mut self, key: BucketKey) -> &mut Bucket {
        self.buckets.get_mut(key)
    }

    /// The worker's total and a bucket's counts, to change both alike.
    pub(super) fn total_and(&mut self, key: BucketKey) -> [&mut Counts; 2] {
        [&mut self.total, &mut self.buckets.get_mut(key).counts]
    }

    pub(super) fn active_buckets(&self) -> impl Iterator<Item = &Bucket> + '_ {
        self.buckets.ranks.iter().take(if self.capacity.is_some() {
            self.active_ranks
        } else {
            0
        })
    }

    /// The bucket a grant's capacity is counted in now: its own rank's, or
    /// the unranked one if that rank vanished since.
    pub(super) fn current_bucket(&self, held: Held) -> BucketKey {
        match held.bucket {
            BucketKey::Rank(rank)
                if (rank as usize) < self.active_ranks
                    && self.buckets.ranks[rank as usize].generation == held.generation =>
            {
                held.bucket
            }
            _ => BucketKey::Unranked,
        }
    }

    /// A bucket's queue and the entries it links, to change both.
    pub(super) fn queue_and_entries(
        &mut self,
        key: BucketKey,
    ) -> (&mut Queue, &mut Slab<Entry<T>>) {
        (&mut self.buckets.get_mut(key).queue, &mut self.entries)
    }

    /// A rank vanished: capacity held on it and its queue move to the
    /// unranked bucket; the queue merges into the unranked queue by age.
    pub(super) fn retire_rank(&mut self, rank: u32) {
        let bucket = &mut self.buckets.ranks[rank as usize];
        let counts = std::mem::take(&mut bucket.counts);
        let mut queue = std::mem::take(&mut bucket.queue);
        bucket.generation = bucket.generation.wrapping_add(1);
        self.buckets.unranked.counts.add(&counts);

        let mut moved = queue.take_all(&self.entries);
        if moved.is_empty() {
            return;
        }
        // Requeue both queues together in arrival order; fair shares start
        // afresh.
        moved.append(&mut self.buckets.unranked.queue.take_all(&self.entries));
        moved.sort_by_key(|&slot| self.entries[slot].node.seq);
        for slot in moved {
            self.entries[slot].bucket = BucketKey::Unranked;
            self.buckets.unranked.queue.push(&mut self.entries, slot);
        }
    }
}
