//! Observation of the gate, flowing one way: after each event the driver
//! hands plain values — the counts and tallies of the buckets the event
//! changed, and the durations it measured — to an [`Observer`], outside the
//! gate's lock. Observers never see the state machine and cannot change it.
//!
//! An observer is user code at one remove (a metrics recorder), so the
//! driver calls it through [`contain`]: a panicking observer loses its own
//! observation, never capacity, a wake-up or the process.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use super::types::{BandTally, Counts, Tally};
use crate::config::{AdmissionConfig, Clock, Limits};

/// One bucket — a rank, or the unranked requests — after an event.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct BucketView {
    /// The rank, `None` for the unranked requests.
    pub(crate) rank: Option<u32>,
    pub(crate) counts: Counts,
    pub(crate) tally: Tally,
    /// Each configured priority band, lowest first; `None` unless bands
    /// are configured. The buffer is a spare one ([`spare`]) and goes back
    /// to the spares once observed, so observing allocates nothing.
    pub(crate) bands: Option<Vec<BandView>>,
    /// How long the bucket's oldest queued request has waited, measured
    /// after the lock was released; `None` when its queue is empty.
    pub(crate) oldest_wait: Option<Duration>,
    /// How saturated the bucket's rank is, 0 to 1; for the unranked
    /// requests, the whole worker ([`Gate::saturation`](crate::Gate::saturation)).
    /// Always 0 unless the saturation gauge is recorded.
    pub(crate) saturation: f64,
    /// When the bucket's oldest queued request arrived, read under the
    /// lock; [`Collected::measure`] turns it into `oldest_wait`.
    pub(crate) arrived: Option<Arrived>,
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
    /// The event: whose bucket, whether its tally changed, the durations
    /// it measured.
    pub(crate) event: BucketEvent,
    /// The bucket the event concerned.
    pub(crate) bucket: BucketView,
    /// Other buckets whose queued requests the event admitted.
    pub(crate) offered: Vec<BucketView>,
    /// The whole worker's saturation after the event: every event changes
    /// it, whichever bucket it concerned. Always 0 unless the saturation
    /// gauge is recorded.
    pub(crate) worker_saturation: f64,
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

/// What an observation reads from the gate's state, under its lock.
pub(crate) trait Observed {
    /// The next event's place in the order of the gate's events.
    fn next_event(&mut self) -> u64;
    /// The bucket of `rank` (`None`: the unranked requests) as it is now.
    fn view(&self, rank: Option<u32>) -> BucketView;
    /// The whole worker's saturation, 0 to 1; 0 unless its gauge is recorded.
    fn worker_saturation(&self) -> f64;
    /// When that bucket's oldest queued request arrived; `None` when its
    /// queue is empty.
    fn oldest_arrival(&self, rank: Option<u32>) -> Option<Arrived>;
    fn limits(&self) -> Limits;
    /// Ranks recognised (0 before the engine's first report).
    fn recognised_ranks(&self) -> usize;
    /// Every rank ever recognised.
    fn known_ranks(&self) -> usize;
}

/// An event that concerned one bucket, with the durations it measured.
#[derive(Debug, Clone, Copy)]
// The durations are read only by observers, and there is none without the
// `metrics` feature.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct BucketEvent {
    /// The bucket's rank, `None` for the unranked requests.
    pub(crate) rank: Option<u32>,
    /// Whether the event changed the bucket's tally (an arrival, a
    /// hand-over, a cancellation) or only its counts (a release).
    pub(crate) tally_changed: bool,
    /// Time in the queue of a request the event handed its admission.
    pub(crate) queue_wait: Option<Duration>,
    /// Admission to first token or completion, for a request whose waiting
    /// the event ended.
    pub(crate) engine_waiting: Option<Duration>,
    /// The gate's time the event was applied at, if the gate keeps time
    /// (the same reading the state was given): ages on the gate's clock
    /// reuse it.
    pub(crate) read_at: Option<Instant>,
}

impl BucketEvent {
    /// An event that changed the tally of `rank`'s bucket (and perhaps its
    /// counts), measuring no duration, applied at `read_at`.
    pub(crate) fn tally_of(rank: Option<u32>, read_at: Option<Instant>) -> Self {
        BucketEvent {
            rank,
            tally_changed: true,
            queue_wait: None,
            engine_waiting: None,
            read_at,
        }
    }
}

/// An observation read under the gate's lock whose ages are not measured
/// yet: [`measure`](Self::measure) does that once the lock is released,
/// so no clock is read inside it.
///
/// This is the only way an [`Observation`] or a [`Configured`] is built:
/// every event path measures ages by the same rule, on the same clocks.
#[derive(Debug)]
pub(crate) struct Collected<T> {
    observation: T,
    /// The gate's clock as the event read it, if it did: ages on that
    /// clock reuse the reading.
    read_at: Option<Instant>,
}

impl Observation {
    /// Reads what `event` changed: its bucket, and the other buckets among
    /// `offered_ranks` (whose queued requests it admitted). `read_at` is
    /// the gate's time the event was applied at, if it read one.
    #[inline]
    pub(crate) fn collect(
        state: &mut impl Observed,
        event: BucketEvent,
        offered_ranks: &[Option<u32>],
    ) -> Collected<Observation> {
        let mut offered = Vec::new();
        if offered_ranks.iter().any(|&offered| offered != event.rank) {
            offered = spare::views();
            offered.extend(
                offered_ranks
                    .iter()
                    .filter(|&&offered| offered != event.rank)
                    .map(|&offered| state.view(offered)),
            );
        }
        let observation = Observation {
            seq: state.next_event(),
            event,
            bucket: state.view(event.rank),
            offered,
            worker_saturation: state.worker_saturation(),
        };
        Collected::of(state, observation, event.read_at)
    }
}

impl Configured {
    /// Reads the limits in force and every bucket.
    pub(crate) fn collect(state: &mut impl Observed) -> Collected<Configured> {
        let configured = Configured {
            seq: state.next_event(),
            limits: state.limits(),
            ranks: state.recognised_ranks(),
            unranked: state.view(None),
            rank_buckets: (0..state.known_ranks() as u32)
                .map(|rank| state.view(Some(rank)))
                .collect(),
        };
        Collected::of(state, configured, None)
    }
}

/// An observation's bucket views, in one order.
pub(crate) trait Buckets {
    fn views(&mut self) -> impl Iterator<Item = &mut BucketView>;
}

impl Buckets for Observation {
    fn views(&mut self) -> impl Iterator<Item = &mut BucketView> {
        std::iter::once(&mut self.bucket).chain(self.offered.iter_mut())
    }
}

impl Buckets for Configured {
    fn views(&mut self) -> impl Iterator<Item = &mut BucketView> {
        std::iter::once(&mut self.unranked).chain(self.rank_buckets.iter_mut())
    }
}

impl<T: Buckets> Collected<T> {
    #[inline]
    fn of(state: &impl Observed, mut observation: T, read_at: Option<Instant>) -> Self {
        for view in observation.views() {
            view.arrived = state.oldest_arrival(view.rank);
        }
        Collected {
            observation,
            read_at,
        }
    }

    /// The observation, with the age of each bucket's oldest queued request
    /// measured now. Call it after releasing the lock. (In place: an
    /// observation is a few hundred bytes, and the hot path does not copy
    /// it about.)
    #[inline]
    pub(crate) fn measure(&mut self, clock: &Clock) -> &T {
        let mut now = Now {
            clock,
            gate: self.read_at,
            stamp: None,
        };
        for view in self.observation.views() {
            if let Some(arrived) = view.arrived {
                view.oldest_wait = Some(now.since(arrived));
            }
        }
        &self.observation
    }
}

impl Collected<Observation> {
    /// Gives the observation's buffers back to the spares, once observed.
    #[inline]
    pub(crate) fn recycle(self) {
        self.observation.recycle();
    }
}

/// When a queued request arrived, on the clock its age is measured with.
///
/// A gate that keeps time (deadlines or aging on) records each queued
/// request's arrival on its own clock
/// ([`AdmissionConfig::clock`](crate::AdmissionConfig::clock)), so ages
/// agree with deadlines and aging, and with a test's paused clock. Any
/// other gate measures on the observer's clock, from the stamp it takes at
/// every arrival anyway (for `request_queue_wait_seconds`): recording the
/// age costs an arrival nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrived {
    Gate(Instant),
    Stamp(Stamp),
}

/// The present, on each clock, read at most once and only when needed: an
/// event that leaves every queue it touched empty reads no clock.
struct Now<'a> {
    clock: &'a Clock,
    gate: Option<Instant>,
    stamp: Option<Stamp>,
}

impl Now<'_> {
    fn since(&mut self, arrived: Arrived) -> Duration {
        match arrived {
            Arrived::Gate(at) => self
                .gate
                .get_or_insert_with(|| self.clock.now())
                .saturating_duration_since(at),
            Arrived::Stamp(at) => self.stamp.get_or_insert_with(Stamp::now).since(at),
        }
    }
}

/// Receives the gate's observations, after its lock is released.
pub(crate) trait Observer: Send + Sync + 'static {
    /// Whether observations are wanted at all; when not, the driver neither
    /// collects them nor reads the clock.
    const ENABLED: bool;

    fn new(config: &AdmissionConfig) -> Self;
    /// Whether the observer records events now: when it does not (a
    /// metrics recorder is not installed yet), the driver neither collects
    /// an event's observation nor reads a clock for it. Cheap (an atomic
    /// load or two), and no user code: the driver asks before its lock.
    fn active(&self) -> bool;
    /// Whether events are observed now: observations are wanted at all,
    /// and the observer is [`active`](Self::active).
    #[inline]
    fn records(&self) -> bool
    where
        Self: Sized,
    {
        Self::ENABLED && self.active()
    }
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

    fn active(&self) -> bool {
        false
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

    /// [`now`](Self::now) when `observing`, else `None`: an event the
    /// observer does not record reads no clock.
    #[inline]
    pub(crate) fn now_if(observing: bool) -> Option<Stamp> {
        observing.then(Stamp::now)
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

/// Spare buffers for observations, one set per thread: an observation
/// takes its band views and its list of offered buckets from here and
/// gives them back once observed ([`Observation::recycle`]), so that in a
/// steady state observing allocates nothing. A buffer taken while another
/// use on the same thread holds the spares (it cannot happen: no user code
/// runs while they are borrowed) or after the thread's spares are gone is
/// simply a new one.
pub(crate) mod spare {
    use std::cell::RefCell;

    use super::{BandView, BucketView};

    /// At most this many spare buffers of each kind are kept per thread.
    const KEEP: usize = 8;

    #[derive(Default)]
    struct Spares {
        bands: Vec<Vec<BandView>>,
        views: Vec<Vec<BucketView>>,
    }

    thread_local! {
        static SPARES: RefCell<Spares> = RefCell::new(Spares::default());
    }

    fn with<R>(use_them: impl FnOnce(&mut Spares) -> R) -> Option<R> {
        SPARES
            .try_with(|spares| {
                let mut spares = spares.try_borrow_mut().ok()?;
                Some(use_them(&mut spares))
            })
            .ok()
            .flatten()
    }

    /// An empty buffer for band views.
    pub(crate) fn bands() -> Vec<BandView> {
        with(|spares| spares.bands.pop())
            .flatten()
            .unwrap_or_default()
    }

    /// An empty buffer for bucket views.
    pub(crate) fn views() -> Vec<BucketView> {
        with(|spares| spares.views.pop())
            .flatten()
            .unwrap_or_default()
    }

    pub(crate) fn give_back_bands(mut bands: Vec<BandView>) {
        bands.clear();
        if bands.capacity() > 0 {
            with(|spares| {
                if spares.bands.len() < KEEP {
                    spares.bands.push(bands);
                }
            });
        }
    }

    pub(crate) fn give_back_views(mut views: Vec<BucketView>) {
        for view in views.drain(..) {
            view.recycle();
        }
        if views.capacity() > 0 {
            with(|spares| {
                if spares.views.len() < KEEP {
                    spares.views.push(views);
                }
            });
        }
    }
}

impl BucketView {
    /// Gives the view's buffers back to the spares.
    pub(crate) fn recycle(self) {
        if let Some(bands) = self.bands {
            spare::give_back_bands(bands);
        }
    }
}

impl Observation {
    /// Gives the observation's buffers back to the spares, once observed.
    #[inline]
    pub(crate) fn recycle(self) {
        self.bucket.recycle();
        spare::give_back_views(self.offered);
    }
}
