//! Observation getters: plain values of the state for the driver's
//! observer and its snapshot. Nothing here changes the state except the
//! event counter ([`State::next_event`]).
//!
//! # Invariants
//!
//! * A view never includes the age of a queued request: the state keeps
//!   no clock; the driver measures ages from [`State::oldest_queued`] once
//!   it has left its lock.

use std::time::Instant;

use super::State;
use super::buckets::{Bucket, BucketKey};
use crate::config::{EngineCapacity, LimitSource, Limits, LimitsInForce};
use crate::gate::observe::{BandView, BucketView, spare};
use crate::gate::types::{Counts, Tally};

impl<T> State<T> {
    /// Counts and tally of the bucket of a recognised rank (`None`: the
    /// unranked requests), for observers.
    ///
    /// The age of its oldest queued request is left out (`None`): the
    /// state keeps no clock. The driver measures it from
    /// [`oldest_queued`](Self::oldest_queued) once it has left its lock.
    #[inline]
    pub(crate) fn view(&self, rank: Option<u32>) -> BucketView {
        let bucket = self.bucket(BucketKey::of(rank));
        BucketView {
            rank,
            counts: bucket.counts,
            tally: bucket.tally,
            bands: bucket.band_views(self.ladder.configured_bands()),
            oldest_wait: None,
            saturation: self.saturation(rank),
            arrived: None,
        }
    }

    /// The request that has waited longest in the queue of a recognised
    /// rank's bucket (`None`: the unranked requests), if any is queued:
    /// when it was queued, if the gate keeps time, and its payload (where
    /// a driver that does not keep time may have noted its arrival).
    #[inline]
    pub(crate) fn oldest_queued(&self, rank: Option<u32>) -> Option<(Option<Instant>, &T)> {
        let bucket = self.bucket(BucketKey::of(rank));
        if bucket.queue.is_empty() {
            return None;
        }
        let slot = bucket.queue.oldest(&self.entries)?;
        let entry = &self.entries[slot];
        Some((entry.node.queued_at, &entry.payload))
    }

    /// Numbers the event just applied, for observers: later events get
    /// higher numbers.
    #[inline]
    pub(crate) fn next_event(&mut self) -> u64 {
        self.events += 1;
        self.events
    }

    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    pub(crate) fn capacity(&self) -> Option<EngineCapacity> {
        self.capacity
    }

    /// The limits in force, per rank and combined, with their sources.
    pub(crate) fn limits_in_force(&self) -> LimitsInForce {
        let mut sources = self.config.sources;
        if let Some(adaptive) = &self.adaptive {
            let (floor, ceiling) = adaptive.bounds();
            sources.engine_request_waiting_limit = LimitSource::Adaptive { floor, ceiling };
        }
        LimitsInForce {
            per_rank: self.limits,
            ranks: self.recognised_ranks().max(1),
            capacity: self.capacity,
            sources,
        }
    }

    pub(crate) fn total(&self) -> Counts {
        self.total
    }

    pub(crate) fn unranked_counts(&self) -> Counts {
        self.unranked.counts
    }

    pub(crate) fn rank_counts(&self) -> impl Iterator<Item = Counts> + '_ {
        self.active_buckets().map(|bucket| bucket.counts)
    }

    pub(crate) fn unranked_tally(&self) -> Tally {
        self.unranked.tally
    }

    /// Tallies of every rank ever recognised, active or vanished.
    pub(crate) fn rank_tallies(&self) -> impl Iterator<Item = Tally> + '_ {
        self.ranks.iter().map(|bucket| bucket.tally)
    }

    pub(crate) fn tally(&self) -> Tally {
        let mut tally = self.unranked.tally;
        for bucket in &self.ranks {
            tally.add(&bucket.tally);
        }
        tally
    }

    /// Queued requests plus offers not yet handed over.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.entries.len()
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
