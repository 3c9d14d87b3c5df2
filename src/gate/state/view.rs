//! Observation getters: plain values of the state for the driver's
//! observer and its snapshot, through [`View`], a borrow of the state that
//! can only read it ([`State::view`]). Nothing here changes the state
//! except the event counter ([`State::next_event`]).
//!
//! # Invariants
//!
//! * A view never includes the age of a queued request: the state keeps
//!   no clock; the driver measures ages from [`View::oldest_queued`] once
//!   it has left its lock.

use std::time::Instant;

use super::buckets::{Bucket, BucketKey};
use super::{Grant, State};
use crate::config::{EngineCapacity, LimitSource, Limits, LimitsInForce};
use crate::gate::observe::{BandView, BucketView, spare};
use crate::gate::types::{Counts, Snapshot, Tally};

/// The state, read-only: what observers and snapshots are told.
#[derive(Debug)]
pub(crate) struct View<'a, T> {
    state: &'a State<T>,
}

// A view is a shared borrow: copyable whatever `T` is.
impl<T> Clone for View<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for View<'_, T> {}

impl<T> State<T> {
    /// The state, read-only, for observers.
    #[inline]
    pub(crate) fn view(&self) -> View<'_, T> {
        View { state: self }
    }

    /// Numbers the event just applied, for observers: later events get
    /// higher numbers.
    #[inline]
    pub(crate) fn next_event(&mut self) -> u64 {
        self.events += 1;
        self.events
    }
}

impl<'a, T> View<'a, T> {
    /// Counts and tally of the bucket of a recognised rank (`None`: the
    /// unranked requests), for observers.
    ///
    /// The age of its oldest queued request is left out (`None`): the
    /// state keeps no clock. The driver measures it from
    /// [`oldest_queued`](Self::oldest_queued) once it has left its lock.
    #[inline]
    pub(crate) fn bucket(self, rank: Option<u32>) -> BucketView {
        let state = self.state;
        let bucket = state.bucket(BucketKey::of(rank));
        BucketView {
            rank,
            counts: bucket.counts,
            tally: bucket.tally,
            bands: bucket.band_views(state.ladder.configured_bands()),
            oldest_wait: None,
            saturation: state.observed_saturation(rank),
            arrived: None,
        }
    }

    /// The request that has waited longest in the queue of a recognised
    /// rank's bucket (`None`: the unranked requests), if any is queued:
    /// when it was queued, if the gate keeps time, and its payload (where
    /// a driver that does not keep time may have noted its arrival).
    #[inline]
    pub(crate) fn oldest_queued(self, rank: Option<u32>) -> Option<(Option<Instant>, &'a T)> {
        let state = self.state;
        let bucket = state.bucket(BucketKey::of(rank));
        if bucket.queue.is_empty() {
            return None;
        }
        let slot = bucket.queue.oldest(&state.entries)?;
        let entry = &state.entries[slot];
        Some((entry.node.queued_at, &entry.payload))
    }

    /// Counts, limits and tallies, as the gate's snapshot tells them.
    pub(crate) fn snapshot(self) -> Snapshot {
        Snapshot {
            total: self.total(),
            unranked: self.unranked_counts(),
            ranks: self.rank_counts().collect(),
            limits: self.limits(),
            capacity: self.capacity(),
            tally: self.tally(),
            unranked_tally: self.unranked_tally(),
            rank_tallies: self.rank_tallies().collect(),
        }
    }

    pub(crate) fn limits(self) -> Limits {
        self.state.limits
    }

    pub(crate) fn capacity(self) -> Option<EngineCapacity> {
        self.state.capacity
    }

    /// The limits in force, per rank and combined, with their sources.
    pub(crate) fn limits_in_force(self) -> LimitsInForce {
        let state = self.state;
        let mut sources = state.config.sources;
        if let Some(adaptive) = &state.adaptive {
            let (floor, ceiling) = adaptive.bounds();
            sources.engine_request_waiting_limit = LimitSource::Adaptive { floor, ceiling };
        }
        LimitsInForce {
            per_rank: state.limits,
            ranks: state.recognised_ranks().max(1),
            capacity: state.capacity,
            sources,
        }
    }

    pub(crate) fn total(self) -> Counts {
        self.state.total
    }

    pub(crate) fn unranked_counts(self) -> Counts {
        self.state.buckets.unranked.counts
    }

    pub(crate) fn rank_counts(self) -> impl Iterator<Item = Counts> + 'a {
        self.state.active_buckets().map(|bucket| bucket.counts)
    }

    pub(crate) fn unranked_tally(self) -> Tally {
        self.state.buckets.unranked.tally
    }

    /// Tallies of every rank ever recognised, active or vanished.
    pub(crate) fn rank_tallies(self) -> impl Iterator<Item = Tally> + 'a {
        self.state.buckets.ranks.iter().map(|bucket| bucket.tally)
    }

    pub(crate) fn tally(self) -> Tally {
        let mut tally = self.state.buckets.unranked.tally;
        for bucket in &self.state.buckets.ranks {
            tally.add(&bucket.tally);
        }
        tally
    }

    /// The rank a grant's capacity is counted under now (`None` once its
    /// rank vanished, or when unranked).
    pub(crate) fn grant_rank(self, grant: &Grant) -> Option<u32> {
        self.state.current_bucket(grant.held).rank()
    }

    /// Every rank ever recognised, vanished ones included (they keep their
    /// tallies): observers see `0..known_ranks()`.
    pub(crate) fn known_ranks(self) -> usize {
        self.state.buckets.ranks.len()
    }

    /// The ranks currently recognised (0 before the first report).
    pub(crate) fn recognised_ranks(self) -> usize {
        self.state.recognised_ranks()
    }

    /// Queued requests plus offers not yet handed over.
    #[cfg(test)]
    pub(crate) fn pending(self) -> usize {
        self.state.entries.len()
    }
}

impl Bucket {
    /// Each of the `configured` bands, lowest first: its queued requests
    /// and its tally. `None` without configured bands.
    ///
    /// The buffer is a spare one (see [`spare`]): in a steady state this
    /// allocates nothing.
    #[inline]
    fn band_views(&self, configured: usize) -> Option<Vec<BandView>> {
        if configured == 0 {
            return None;
        }
        let mut bands = spare::bands();
        bands.resize(configured, BandView::default());
        for (band, tally) in bands.iter_mut().zip(&self.bands) {
            band.tally = *tally;
        }
        // With bands configured, a rung is the index of its band.
        for (rung, queued) in self.queue.band_lengths() {
            bands[rung as usize].queued = queued;
        }
        Some(bands)
    }
}
