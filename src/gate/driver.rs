//! [`Gate`] and [`Acquire`]: the driver that puts the sans-IO state machine
//! behind one short critical section per event and turns its decisions into
//! a future and an RAII handle.
//!
//! Every event takes the lock once, updates the state, collects the wakers
//! of requests that became admitted and, when an observer wants them, the
//! plain values of what changed; then it releases the lock, wakes, and
//! observes. Capacity freed by an event is handed to the oldest waiter that
//! fits *inside* that critical section, so a newcomer can never slip in
//! between the release and the wake-up.
//!
//! One kind of request skips the lock: a plain one (no rank, no cost) on
//! a gate whose observer is idle and whose configuration keeps no time,
//! while nothing is queued. The lock-free [`lane`](super::lane) admits it
//! and takes back its capacity with one atomic operation per event; every
//! critical section closes the lane and folds what it holds into the
//! state first, so the state stays the whole truth wherever it decides.
//!
//! No user code runs under the lock: not a waker (woken after it), not a
//! metrics recorder (observed after it, and contained: see
//! [`contain`](super::observe::contain)). The sections themselves do not
//! panic, so the lock is never poisoned by the gate's own code.

use std::fmt;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::PoisonError;
use std::task::{Context, Poll};
use std::time::Instant;

// Model-checked under `--cfg loom` (see `loom_tests.rs`).
#[cfg(loom)]
use ::loom::sync::{Arc, Mutex};
#[cfg(not(loom))]
use std::sync::{Arc, Mutex};

use super::lane::Lane;
use super::locked::{Locked, Waiter, stamp_queued, take_offers, wake_all};
use super::observe::{BucketEvent, Configured, Observation, Observer, Stamp, contain};
use super::permit::Permit;
use super::state::{Arrival, Expiry, Grant, Polled, State, Ticket};
use super::types::{Descriptor, Overloaded, RejectionReason, Snapshot};
use crate::DefaultObserver;
use crate::config::{AdmissionConfig, Clock, EngineCapacity, LimitsInForce};

/// The admission gate of one worker. Cheap to clone: clones share one state.
///
/// Create it once per worker and hand clones to every endpoint; never create
/// it inside `Layer::layer` (axum applies a layer per route).
///
/// ```
/// use tower_admission::{AdmissionConfig, Gate};
///
/// # futures::executor::block_on(async {
/// let gate = Gate::new(AdmissionConfig::new().engine_request_limit(1).request_queue_limit(0));
/// let mut permit = gate.acquire(None).await.expect("room for one");
/// assert!(gate.acquire(None).await.is_err()); // full, and no queue
/// permit.first_token(); // waiting capacity is free; request capacity is held
/// drop(permit); // the response ended
/// assert!(gate.acquire(None).await.is_ok());
/// # });
/// ```
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State<Waiter>>,
    /// Plain unranked requests while nothing is queued, without the lock.
    lane: Lane,
    observer: DefaultObserver,
    /// Whether deadlines are on; only then is `clock` read.
    timed: bool,
    clock: Clock,
    /// A stamp taken when the gate was built: what a queued request's
    /// arrival stamp holds until it is stamped (see [`stamp_queued`]).
    built: Stamp,
}

/// Whom an event concerned, for its observation.
enum Concerned {
    /// One bucket.
    Bucket(BucketEvent),
    /// Every bucket and the limits: the configuration changed.
    Everything,
}

impl Concerned {
    /// An event that changed the tally of `rank`'s bucket (and perhaps its
    /// counts), measuring no duration.
    fn tally_of(rank: Option<u32>, read_at: Option<Instant>) -> Self {
        Concerned::Bucket(BucketEvent::tally_of(rank, read_at))
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

impl Gate {
    /// A gate with `config`.
    pub fn new(config: AdmissionConfig) -> Gate {
        // The clock calibrates on first use; pay for it here rather than in
        // the first request's path.
        let built = Stamp::now();
        let observer = DefaultObserver::new(&config);
        let timed = config.keeps_time();
        let clock = config.clock.clone();
        let gate = Gate {
            inner: Arc::new(Inner {
                state: Mutex::new(State::new(config)),
                lane: Lane::new(),
                observer,
                timed,
                clock,
                built,
            }),
        };
        let state = gate.lock();
        let in_force = state.view().limits_in_force();
        gate.end_event(state, Concerned::Everything, DefaultObserver::ENABLED);
        log_limits(&in_force, "the gate was built");
        gate
    }

    /// Decides, now, what happens to a request for `rank`: admitted,
    /// queued, or rejected. The returned future resolves at once unless the
    /// request was queued; dropping it while queued cancels the request.
    ///
    /// A rank the engine has not reported (or any rank before the first
    /// report) is treated as no rank: the request is unranked and draws on
    /// the combined capacity of all ranks.
    ///
    /// The shorthand of [`acquire_with`](Self::acquire_with) for a request
    /// described by its rank alone.
    pub fn acquire(&self, rank: Option<u32>) -> Acquire {
        self.acquire_with(Descriptor::new().with_rank(rank))
    }

    /// Decides, now, what happens to the request `descriptor` describes:
    /// its rank as for [`acquire`](Self::acquire), its cost against the
    /// token limits, if any are set.
    ///
    /// ```
    /// use tower_admission::{AdmissionConfig, Cost, Descriptor, Gate};
    ///
    /// # futures::executor::block_on(async {
    /// let gate = Gate::new(AdmissionConfig::new().engine_waiting_token_limit(1000));
    /// let long = Descriptor::new().with_cost(Cost::prompt(800));
    /// let first = gate.acquire_with(long).await.expect("admitted");
    /// let second = gate.acquire_with(long);
    /// assert!(second.is_queued()); // 1600 prompt tokens would be waiting
    /// drop(first);
    /// assert!(second.await.is_ok());
    /// # });
    /// ```
    pub fn acquire_with(&self, descriptor: Descriptor) -> Acquire {
        let observing = self.observing();
        if !observing && descriptor.may_take_lane() && self.inner.lane.try_admit() {
            let permit = Permit::new(self.clone(), Grant::in_lane(), None);
            return Acquire {
                step: Step::Decided(Some(Ok(permit))),
            };
        }
        // Read the clocks (observers', deadlines') before taking the lock.
        let now = Stamp::now_if(observing);
        let time = self.time();
        // A gate that keeps no time still starts a client's deadline at
        // the arrival.
        let arrived_at = match descriptor.deadline {
            Some(_) if !self.inner.timed => Some(self.inner.clock.now()),
            _ => time,
        };
        let mut state = self.lock();
        let stamp = now.unwrap_or(self.inner.built);
        let waiter = Waiter {
            waker: None,
            queued_at: stamp,
            offered_at: stamp,
        };
        let (arrival, rank) = state.receive(&descriptor, arrived_at, waiter);
        if let Arrival::Queued(ticket, _) = &arrival {
            if DefaultObserver::ENABLED && now.is_none() {
                // Nothing observed the arrival, but a recorder installed
                // while it waits will want its queue wait: stamp it (a
                // queued arrival only, so the fast path reads no clock).
                stamp_queued(&mut state, *ticket);
            }
        }
        // An arrival offers nothing, so this only observes.
        self.end_event(state, Concerned::tally_of(rank, time), observing);
        let step = match arrival {
            Arrival::Admitted(grant) => {
                Step::Decided(Some(Ok(Permit::new(self.clone(), grant, now))))
            }
            Arrival::Queued(ticket, expires_at) => Step::Queued {
                gate: self.clone(),
                ticket,
                expires_at,
            },
            Arrival::Rejected(overloaded) => Step::Decided(Some(Err(overloaded))),
        };
        Acquire { step }
    }

    /// Counts a request turned away in front of the gate, before it was
    /// described: by the sidecar while it shuts down
    /// ([`Shutdown`](RejectionReason::Shutdown)), by
    /// [`OpenAiCostLayer`](crate::http::OpenAiCostLayer) while too many
    /// bodies are being read ([`BodyReads`](RejectionReason::BodyReads)).
    /// It counts as an unranked arrival rejected at once, worker-scoped,
    /// in the tallies and `rejection_total` like the gate's own
    /// rejections; the returned [`Overloaded`] is the answer's.
    ///
    /// ```
    /// use tower_admission::{AdmissionConfig, Gate, RejectionReason, RejectionScope};
    ///
    /// let gate = Gate::new(AdmissionConfig::new());
    /// let overloaded = gate.reject(RejectionReason::Shutdown);
    /// assert_eq!(overloaded.scope(), RejectionScope::Worker);
    /// let tally = gate.snapshot().tally;
    /// assert_eq!((tally.received, tally.shutdown_worker), (1, 1));
    /// ```
    pub fn reject(&self, reason: RejectionReason) -> Overloaded {
        let observing = self.observing();
        let mut state = self.lock();
        let overloaded = state.reject_unseen(reason);
        self.end_event(state, Concerned::tally_of(None, None), observing);
        overloaded
    }

    /// Shuts the gate down, for good: every queued request is rejected
    /// with reason [`Shutdown`](RejectionReason::Shutdown) (worker scope)
    /// at once, and so is every request that arrives from now on; admitted
    /// requests run on and release their capacity as usual. A server
    /// calls it when it begins to drain, so that requests that never
    /// reached the engine are answered (the HTTP layer answers them `503`,
    /// whatever its overload status: another worker may take them at once)
    /// and counted in `rejection_total{reason="shutdown"}`.
    ///
    /// ```
    /// use tower_admission::{AdmissionConfig, Gate, RejectionReason};
    ///
    /// # futures::executor::block_on(async {
    /// let gate = Gate::new(AdmissionConfig::new().engine_request_limit(1));
    /// let running = gate.acquire(None).await.expect("admitted");
    /// let queued = gate.acquire(None);
    /// gate.shut_down();
    /// assert_eq!(queued.await.unwrap_err().reason(), RejectionReason::Shutdown);
    /// let late = gate.acquire(None).await.unwrap_err();
    /// assert_eq!(late.reason(), RejectionReason::Shutdown);
    /// drop(running); // runs to its end
    /// assert_eq!(gate.snapshot().tally.shutdown_worker, 2);
    /// # });
    /// ```
    pub fn shut_down(&self) {
        let mut state = self.lock();
        state.shut_down();
        // Every bucket's tally may have changed: observe the whole picture.
        self.end_event(state, Concerned::Everything, DefaultObserver::ENABLED);
    }

    /// The engine reports its capacity: defaults follow it, explicit
    /// settings stay. Growth admits queued requests at once; shrinking never
    /// revokes admitted work. A report of zero ranks or zero `max_num_seqs`
    /// is ignored with a warning.
    pub fn report_capacity(&self, capacity: EngineCapacity) {
        let time = self.time();
        let mut state = self.lock();
        let before = state.view().limits_in_force();
        if state.report_capacity(capacity, time) {
            let after = state.view().limits_in_force();
            self.end_event(state, Concerned::Everything, DefaultObserver::ENABLED);
            // Engines report again and again; say so only when it matters.
            if after.per_rank != before.per_rank || after.ranks != before.ranks {
                log_limits(&after, "the engine reported its capacity");
            }
        }
    }

    /// The limits in force, per rank and combined, and where each comes
    /// from (a flag, a variable, the code, or the default following the
    /// engine's reported capacity). The gate logs the same at `INFO` when it
    /// is built and whenever a capacity report changes them; a server
    /// prints it at start-up.
    ///
    /// ```
    /// use tower_admission::{AdmissionConfig, EngineCapacity, Gate};
    ///
    /// let gate = Gate::new(AdmissionConfig::new().request_queue_limit(8));
    /// gate.report_capacity(EngineCapacity::new(4, 2)); // 2 ranks of 4
    /// let in_force = gate.limits_in_force();
    /// assert_eq!(in_force.per_rank.engine_request_limit, 4); // the reported max_num_seqs
    /// assert_eq!(in_force.combined().engine_request_limit, 8); // unranked: both ranks'
    /// assert_eq!(in_force.combined().request_queue_limit, 16);
    /// println!("admission: {in_force}");
    /// ```
    pub fn limits_in_force(&self) -> LimitsInForce {
        self.lock().view().limits_in_force()
    }

    /// Counts, limits and tallies at this instant.
    pub fn snapshot(&self) -> Snapshot {
        self.lock().view().snapshot()
    }

    /// How saturated the whole worker is, from 0 (idle) to 1 (the next
    /// request would be rejected): demand over what the gate can hold in
    /// the engine and in its queue, `(e × E + q × Q) / (E + Q)` with `e`
    /// the engine's fill (the fullest of its limits), `q` the queue's, `E`
    /// and `Q` the combined engine request and queue limits. The same
    /// value as the `saturation{dp_rank="unspecified"}` gauge (with
    /// [`AdmissionConfig::saturation_metric`](crate::AdmissionConfig::saturation_metric)).
    ///
    /// ```
    /// use tower_admission::{AdmissionConfig, Gate};
    ///
    /// # futures::executor::block_on(async {
    /// let gate = Gate::new(AdmissionConfig::new().engine_request_limit(2).request_queue_limit(2));
    /// assert_eq!(gate.saturation(), 0.0);
    /// let _a = gate.acquire(None).await.unwrap();
    /// let _b = gate.acquire(None).await.unwrap();
    /// assert_eq!(gate.saturation(), 0.5); // the engine is full, the queue empty
    /// let _c = gate.acquire(None);
    /// let _d = gate.acquire(None);
    /// assert_eq!(gate.saturation(), 1.0); // the next request is rejected
    /// assert!(gate.acquire(None).await.is_err());
    /// # });
    /// ```
    pub fn saturation(&self) -> f64 {
        self.lock().saturation(None)
    }

    /// How saturated `rank` is, 0 to 1: the larger of the rank's own
    /// saturation (its counts over its limits) and the worker's, since a
    /// ranked request needs room in both. A rank the engine has not
    /// reported is unranked: the worker's.
    pub fn rank_saturation(&self, rank: u32) -> f64 {
        self.lock().saturation(Some(rank))
    }

    /// The gate's time, read once per event before taking the lock and
    /// passed to the state's event; `None` unless the gate keeps time.
    #[inline]
    fn time(&self) -> Option<Instant> {
        self.inner.timed.then(|| self.inner.clock.now())
    }

    /// Takes the lock: closes the lane and folds what it holds and
    /// admitted into the state, so the state is the whole truth until the
    /// returned guard drops (and opens the lane again if it may).
    #[inline]
    fn lock(&self) -> Locked<'_> {
        loop {
            // No user code runs under the lock and the state machine does
            // not panic, so poisoning can only come from a bug; the state
            // is still the best there is.
            let state = self
                .inner
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let locked = Locked::new(state, &self.inner.lane, &self.inner.observer);
            if !locked.has_offers() {
                return locked;
            }
            // Capacity the lane gave back reached the queue: the fold was
            // an event of its own. End it (wake, observe) before the
            // caller's, which may be the cancellation of an offered request.
            self.end_lane_event(locked, self.observing());
        }
    }

    /// Ends an event of the lane seen under the lock (a give-back, or the
    /// fold of one): it concerned the unranked bucket, whose tallies the
    /// fold may have changed.
    #[cold]
    fn end_lane_event(&self, locked: Locked<'_>, observing: bool) {
        self.end_event(locked, Concerned::tally_of(None, None), observing);
    }

    /// Whether the observer records events now; asked before the lock.
    #[inline]
    fn observing(&self) -> bool {
        self.inner.observer.records()
    }

    /// Who hears of the gate's events: with feature `metrics`, the recorder
    /// that also holds the HTTP layer's client-view series.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn observer(&self) -> &DefaultObserver {
        &self.inner.observer
    }

    /// Ends a critical section: collects the wakers of the requests the
    /// event admitted and, when `observing` (see
    /// [`observing`](Self::observing), asked before the lock), what the
    /// observer should hear; releases the lock, wakes, and observes.
    fn end_event(&self, mut state: Locked<'_>, concerned: Concerned, observing: bool) {
        let mut wakers = Vec::new();
        let mut offered_ranks: Vec<Option<u32>> = Vec::new();
        if state.has_offers() {
            take_offers(&mut state, &mut wakers, &mut offered_ranks, observing);
        }
        if !observing {
            // Opens the lane if it may, and unlocks.
            drop(state);
            wake_all(wakers);
            return;
        }
        let observer = &self.inner.observer;
        match concerned {
            Concerned::Bucket(mut event) => {
                // Controlled delay's rejections change tallies at any
                // event, in the buckets of the offers.
                event.tally_changed |= state.take_shed();
                let mut collected = Observation::collect(&mut *state, event, &offered_ranks);
                drop(state);
                wake_all(wakers);
                let observation = collected.measure(&self.inner.clock);
                let refresh = contain(|| observer.observe(observation));
                collected.recycle();
                if refresh {
                    self.refresh_metrics();
                }
            }
            Concerned::Everything => {
                let mut collected = Configured::collect(&mut *state);
                drop(state);
                wake_all(wakers);
                let configured = collected.measure(&self.inner.clock);
                contain(|| observer.configured(configured));
            }
        }
    }

    /// Brings the gate's time-dependent metrics up to date: the age of the
    /// oldest queued request of each rank
    /// (`request_queue_oldest_age_seconds`) is measured now, and every
    /// other series is set again from the gate's counts and tallies.
    ///
    /// The gate records metrics at its events (arrivals, admissions,
    /// releases, cancellations); between events a queued request grows
    /// older with no event to say so. Call this just before rendering
    /// the metrics, in the `/metrics` handler, so a scrape sees the age
    /// at the scrape:
    ///
    /// ```
    /// use tower_admission::{AdmissionConfig, Gate};
    ///
    /// let gate = Gate::new(AdmissionConfig::new());
    /// // in the /metrics handler, before `PrometheusHandle::render`:
    /// gate.refresh_metrics();
    /// ```
    ///
    /// It takes the gate's lock once, briefly, and records outside it,
    /// like any event. Without the `metrics` feature it does nothing.
    pub fn refresh_metrics(&self) {
        if DefaultObserver::ENABLED {
            self.end_event(self.lock(), Concerned::Everything, true);
        }
    }

    /// Ends a grant's waiting (`finished`: the whole request). `admitted_at`
    /// is `None` when nothing observed its admission.
    pub(crate) fn release(&self, grant: &mut Grant, finished: bool, admitted_at: Option<Stamp>) {
        // Read the clock (observers only) before taking the lock.
        let observing = self.observing();
        if grant.is_in_lane() {
            let closed = self.inner.lane.give_back(grant.leave_lane(finished));
            if closed || observing {
                // Something may wait for the capacity (the lock passes it
                // on), or the observer wants the counts.
                self.end_lane_event(self.lock(), observing);
            }
            return;
        }
        let engine_waiting = admitted_at
            .filter(|_| observing && grant.is_waiting())
            .map(|admitted_at| Stamp::now().since(admitted_at));
        let time = self.time();
        let mut state = self.lock();
        if finished {
            state.finish(grant, time);
        } else {
            state.first_token(grant, time);
        }
        let concerned = Concerned::Bucket(BucketEvent {
            rank: state.view().grant_rank(grant),
            tally_changed: false,
            queue_wait: None,
            engine_waiting,
            read_at: time,
        });
        self.end_event(state, concerned, observing);
    }
}

/// Logs the limits in force, outside the gate's lock (a subscriber is user
/// code).
fn log_limits(in_force: &LimitsInForce, why: &str) {
    let (per_rank, combined) = (in_force.per_rank, in_force.combined());
    tracing::info!(
        ranks = in_force.ranks,
        engine_request_limit = per_rank.engine_request_limit,
        engine_request_waiting_limit = per_rank.engine_request_waiting_limit,
        request_queue_limit = per_rank.request_queue_limit,
        combined_engine_request_limit = combined.engine_request_limit,
        combined_engine_request_waiting_limit = combined.engine_request_waiting_limit,
        combined_request_queue_limit = combined.request_queue_limit,
        "admission limits in force ({why}): {in_force}"
    );
}

/// The decision on one request; resolves to a [`Permit`] once admitted.
///
/// The decision is taken when [`Gate::acquire`] is called, so arrival order
/// is call order. Dropping an `Acquire` while its request is queued cancels
/// the request and frees its queue place; if an admission was offered to it
/// in the meantime, the cancellation still wins and the capacity passes on
/// to the next waiter.
#[must_use = "a queued request waits only while its Acquire is polled or held"]
pub struct Acquire {
    step: Step,
}

enum Step {
    /// Admitted or rejected on arrival; taken by the first poll.
    Decided(Option<Result<Permit, Overloaded>>),
    /// Waiting in the gate's queue, until its budget ends if it has one.
    Queued {
        gate: Gate,
        ticket: Ticket,
        expires_at: Option<Instant>,
    },
    /// Admitted from the queue and handed over.
    Done,
}

impl Acquire {
    /// Whether the request is waiting in the gate's queue.
    pub fn is_queued(&self) -> bool {
        matches!(self.step, Step::Queued { .. })
    }

    /// When the queued request's wait budget runs out, on the gate's clock
    /// ([`AdmissionConfig::clock`](crate::AdmissionConfig::clock)); `None`
    /// when it is not queued or has no budget (deadlines are off).
    ///
    /// The gate keeps no timers: whoever awaits the `Acquire` arms one for
    /// this instant and calls [`expire`](Self::expire) when it fires (the
    /// HTTP layer does, with tokio's timer).
    pub fn expires_at(&self) -> Option<Instant> {
        match &self.step {
            Step::Queued { expires_at, .. } => *expires_at,
            _ => None,
        }
    }

    /// The queued request's wait budget ran out: it leaves the queue, and
    /// the `Acquire` resolves to an [`Overloaded`] with reason
    /// [`Deadline`](crate::RejectionReason::Deadline). If it was offered an
    /// admission meanwhile, the admission stands and the `Acquire` resolves
    /// to its permit. Does nothing unless the request is queued.
    pub fn expire(&mut self) {
        let Step::Queued { gate, ticket, .. } = &self.step else {
            return;
        };
        let gate = gate.clone();
        let observing = gate.observing();
        let time = gate.time();
        let mut state = gate.lock();
        match state.expire(*ticket, time) {
            Expiry::Rejected(overloaded, rank) => {
                gate.end_event(state, Concerned::tally_of(rank, time), observing);
                self.step = Step::Decided(Some(Err(overloaded)));
            }
            Expiry::Decided | Expiry::Stale => {}
        }
    }
}

impl fmt::Debug for Acquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let step = match &self.step {
            Step::Decided(Some(Ok(_))) => "admitted",
            Step::Decided(Some(Err(_))) => "rejected",
            Step::Queued { .. } => "queued",
            Step::Decided(None) | Step::Done => "done",
        };
        f.debug_struct("Acquire").field("step", &step).finish()
    }
}

impl Future for Acquire {
    type Output = Result<Permit, Overloaded>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (grant, offered_at, observation) = match &mut this.step {
            Step::Decided(decision) => {
                return Poll::Ready(decision.take().expect("Acquire polled after completion"));
            }
            Step::Done => panic!("Acquire polled after completion"),
            Step::Queued { gate, ticket, .. } => {
                let observing = gate.observing();
                let mut state = gate.lock();
                match state.poll(*ticket) {
                    Polled::Waiting(waiter) => {
                        match &mut waiter.waker {
                            Some(waker) if waker.will_wake(cx.waker()) => {}
                            waker => *waker = Some(cx.waker().clone()),
                        }
                        return Poll::Pending;
                    }
                    Polled::Admitted(grant, waiter) => {
                        // The counts moved when the admission was offered;
                        // what is new is the tally and the queue wait.
                        let observation = observing.then(|| {
                            let event = BucketEvent {
                                rank: state.view().grant_rank(&grant),
                                tally_changed: true,
                                queue_wait: Some(waiter.offered_at.since(waiter.queued_at)),
                                engine_waiting: None,
                                // A hand-over reads no time of the gate.
                                read_at: None,
                            };
                            Observation::collect(&mut *state, event, &[])
                        });
                        (grant, waiter.offered_at, observation)
                    }
                    Polled::Rejected(overloaded, _) => {
                        // Counted and observed when it was displaced.
                        drop(state);
                        this.step = Step::Done;
                        return Poll::Ready(Err(overloaded));
                    }
                    Polled::Stale => unreachable!("an Acquire holds its ticket until it is spent"),
                }
            }
        };
        // The ticket is spent: from here on nothing can reach it again.
        let Step::Queued { gate, .. } = mem::replace(&mut this.step, Step::Done) else {
            unreachable!("matched above")
        };
        if let Some(mut collected) = observation {
            let observation = collected.measure(&gate.inner.clock);
            let observer = &gate.inner.observer;
            let refresh = contain(|| observer.observe(observation));
            collected.recycle();
            if refresh {
                gate.refresh_metrics();
            }
        }
        Poll::Ready(Ok(Permit::new(gate, grant, Some(offered_at))))
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        if let Step::Queued { gate, ticket, .. } = &self.step {
            let observing = gate.observing();
            let time = gate.time();
            let mut state = gate.lock();
            // A stale ticket cannot happen (the ticket is spent only when
            // the step becomes `Done`), but if it did it must not touch the
            // request that reuses its slot.
            if let Ok(rank) = state.cancel(*ticket, time) {
                gate.end_event(state, Concerned::tally_of(rank, time), observing);
            }
        }
    }
}
