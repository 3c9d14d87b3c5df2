//! Observation of the gate, flowing one way: after each event the driver
//! hands plain values — the counts and tallies of the buckets the event
//! changed, and the durations it measured — to an [`Observer`], outside the
//! gate's lock. Observers never see the state machine and cannot change it.
//!
//! An observer is user code at one remove (a metrics recorder), so the
//! driver calls it through [`contain`]: a panicking observer loses its own
//! observation, never capacity, a wake-up or the process.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use super::types::{BandTally, Counts, Tally};
use crate::config::{AdmissionConfig, Limits};

/// One bucket — a rank, or the unranked requests — after an event.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct BucketView {
    /// The rank, `None` for the unranked requests.
    pub(crate) rank: Option<u32>,
    pub(crate) counts: Counts,
    pub(crate) tally: Tally,
    /// Each configured priority band, lowest first; `None` unless bands
    /// are configured.
    pub(crate) bands: Option<Box<[BandView]>>,
    /// How long the bucket's oldest queued request has waited, measured
    /// after the lock was released; `None` when its queue is empty.
    pub(crate) oldest_wait: Option<Duration>,
}

/// One configured priority band of a bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct BandView {
    /// Requests of the band waiting in the queue.
    pub(crate) queued: usize,
    pub(crate) tally: BandTally,
}

/// What one event changed, in plain values.
#[derive(Debug, Clone)]
// Read only by observers, and there is none without the `metrics` feature.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Observation {
    /// The event's place in the order of the gate's events: an observer that
    /// receives two observations out of order keeps the later one's values.
    pub(crate) seq: u64,
    /// The bucket the event concerned.
    pub(crate) bucket: BucketView,
    /// Whether the event changed that bucket's tally, or only its counts.
    pub(crate) tally_changed: bool,
    /// Other buckets whose queued requests the event admitted.
    pub(crate) offered: Vec<BucketView>,
    /// Time in the queue of a request the event handed its admission.
    pub(crate) queue_wait: Option<Duration>,
    /// Admission to first token or completion, for a request whose waiting
    /// the event ended.
    pub(crate) engine_waiting: Option<Duration>,
}

/// The limits in force and every bucket, after the gate was built, the
/// engine reported its capacity, or metrics were refreshed
/// ([`Gate::refresh_metrics`](crate::Gate::refresh_metrics)): the whole
/// picture, ages of the oldest queued requests measured afresh.
#[derive(Debug, Clone)]
// Read only by observers, and there is none without the `metrics` feature.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Configured {
    pub(crate) seq: u64,
    pub(crate) limits: Limits,
    /// Ranks recognised (0 before the engine's first report).
    pub(crate) ranks: usize,
    pub(crate) unranked: BucketView,
    /// Every rank ever recognised; `rank_buckets[ranks..]` have vanished.
    pub(crate) rank_buckets: Vec<BucketView>,
}

/// Receives the gate's observations, after its lock is released.
pub(crate) trait Observer: Send + Sync + 'static {
    /// Whether observations are wanted at all; when not, the driver neither
    /// collects them nor reads the clock.
    const ENABLED: bool;

    fn new(config: &AdmissionConfig) -> Self;
    fn configured(&self, configured: &Configured);
    /// Returns whether the observer wants the whole picture now (it has
    /// just registered its series): the driver then refreshes it, as
    /// [`Gate::refresh_metrics`](crate::Gate::refresh_metrics) does.
    fn observe(&self, observation: &Observation) -> bool;
}

/// The observer when nothing observes.
#[derive(Debug)]
#[cfg_attr(feature = "metrics", allow(dead_code))]
pub(crate) struct NoObserver;

impl Observer for NoObserver {
    const ENABLED: bool = false;

    fn new(_: &AdmissionConfig) -> Self {
        NoObserver
    }

    fn configured(&self, _: &Configured) {}

    fn observe(&self, _: &Observation) -> bool {
        false
    }
}

/// Runs observer code, swallowing a panic: it must not unwind through the
/// gate (a permit dropped during unwinding would abort the process), and
/// the gate's state is consistent whatever the observer did.
pub(crate) fn contain<T: Default>(observe: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(observe)).unwrap_or_else(|_| {
        tracing::warn!("a gate observer (metrics recorder) panicked; its observation was dropped");
        T::default()
    })
}

/// An instant, for the observer's durations. Without an observer that wants
/// them it is empty and taking one does not read the clock.
///
/// It reads `quanta`'s clock (the CPU's invariant TSC where there is one,
/// else the OS's monotonic clock): two reads per request are the largest
/// cost metrics add to the gate's uncontended path, and the TSC is about
/// three times cheaper than `std::time::Instant` here (see BENCHMARKS.md).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamp {
    #[cfg(feature = "metrics")]
    at: quanta::Instant,
}

impl Stamp {
    #[inline]
    pub(crate) fn now() -> Stamp {
        Stamp {
            #[cfg(feature = "metrics")]
            at: quanta::Instant::now(),
        }
    }

    /// Time from `earlier` to this stamp (zero if `earlier` is later).
    #[inline]
    pub(crate) fn since(self, earlier: Stamp) -> Duration {
        #[cfg(feature = "metrics")]
        return self.at.saturating_duration_since(earlier.at);
        #[cfg(not(feature = "metrics"))]
        {
            let _ = earlier;
            Duration::ZERO
        }
    }
}
