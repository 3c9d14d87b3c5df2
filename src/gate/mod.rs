//! The gate of one worker: the [`state`] machine behind one short critical
//! section per event, and the waker plumbing that turns its decisions into a
//! future ([`Acquire`]) and an RAII handle ([`Permit`]).
//!
//! Every event takes the lock once, updates the state, collects the wakers
//! of requests that became admitted, and wakes them after unlocking. Capacity
//! freed by an event is handed to the oldest waiter that fits *inside* that
//! critical section, so a newcomer can never slip in between the release and
//! the wake-up.

mod permit;
pub(crate) mod state;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::PoisonError;

// Model-checked under `--cfg loom` (see `loom_tests.rs`).
#[cfg(loom)]
use ::loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(loom))]
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

pub use self::permit::Permit;
pub(crate) use self::permit::Stamp;
pub use self::state::Tally;
use self::state::{Arrival, Polled, State, Ticket};
use crate::config::{AdmissionConfig, EngineCapacity, Limits};
#[cfg(feature = "metrics")]
use crate::metrics::Recorder;

/// How an admitted request got in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdmitSource {
    /// Admitted on arrival: both engine limits had room and its queue was empty.
    Direct,
    /// Admitted after waiting in the gate's queue.
    Queue,
}

impl AdmitSource {
    /// The `source` label of the admission metric: `"direct"` or `"queue"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            AdmitSource::Direct => "direct",
            AdmitSource::Queue => "queue",
        }
    }
}

/// Whom a rejection concerns (SPEC §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectionScope {
    /// Only this rank is full; the worker could still admit or queue other
    /// requests, so a frontend keeps routing to it.
    Rank(u32),
    /// The worker could neither admit nor queue any request; a frontend
    /// should stop routing to it for up to one second. Rejections of
    /// unranked requests are always worker-scoped.
    Worker,
}

impl RejectionScope {
    /// The `scope` label of the rejection metric: `"rank"` or `"worker"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RejectionScope::Rank(_) => "rank",
            RejectionScope::Worker => "worker",
        }
    }
}

/// A request was rejected before it reached the engine: its queue was full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overloaded {
    scope: RejectionScope,
}

impl Overloaded {
    /// Whom the rejection concerns.
    pub fn scope(&self) -> RejectionScope {
        self.scope
    }
}

impl fmt::Display for Overloaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.scope {
            RejectionScope::Rank(rank) => write!(
                f,
                "overloaded: data-parallel rank {rank} has no room to admit or queue the request"
            ),
            RejectionScope::Worker => {
                f.write_str("overloaded: the worker has no room to admit or queue the request")
            }
        }
    }
}

impl std::error::Error for Overloaded {}

/// Engine and queue occupancy of one rank, of the unranked requests, or of
/// the whole worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Counts {
    /// Admitted requests whose response has not ended.
    pub engine_requests: usize,
    /// Admitted requests without a first token or completion yet.
    pub engine_waiting: usize,
    /// Requests waiting in the gate's queue.
    pub queued: usize,
}

/// A consistent picture of a gate at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The whole worker: `unranked` plus every rank.
    pub total: Counts,
    /// Requests with no recognised rank.
    pub unranked: Counts,
    /// Each recognised rank, by rank number (empty before the engine reports).
    pub ranks: Vec<Counts>,
    /// The per-rank limits in force.
    pub limits: Limits,
    /// The engine's last valid capacity report, if any.
    pub capacity: Option<EngineCapacity>,
    /// How the requests received so far have ended, over the whole worker.
    pub tally: Tally,
    /// The same for unranked requests alone.
    pub unranked_tally: Tally,
    /// The same per rank, for every rank ever recognised.
    pub rank_tallies: Vec<Tally>,
}

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
    #[cfg(feature = "metrics")]
    metrics: Recorder,
}

/// What the gate keeps for each queued request.
#[derive(Debug)]
pub(crate) struct Waiter {
    waker: Option<Waker>,
    #[cfg(feature = "metrics")]
    queued_at: Stamp,
    /// When the request was offered an admission (its arrival until then):
    /// its time in the queue ends and its engine waiting time begins.
    offered_at: Stamp,
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
        #[cfg(feature = "metrics")]
        let metrics = Recorder::new(&config);
        // The clock calibrates on first use; pay for it here rather than in
        // the first request's path.
        let _ = Stamp::now();
        let state = State::new(config);
        let gate = Gate {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                #[cfg(feature = "metrics")]
                metrics,
            }),
        };
        #[cfg(feature = "metrics")]
        gate.inner.metrics.on_configured(&gate.lock());
        gate
    }

    /// Decides, now, what happens to a request for `rank`: admitted,
    /// queued, or rejected. The returned future resolves at once unless the
    /// request was queued; dropping it while queued cancels the request.
    ///
    /// A rank the engine has not reported (or any rank before the first
    /// report) is treated as no rank: the request is unranked and draws on
    /// the combined capacity of all ranks.
    pub fn acquire(&self, rank: Option<u32>) -> Acquire {
        // Read the clock (metrics only) before taking the lock.
        let now = Stamp::now();
        let mut state = self.lock();
        let waiter = Waiter {
            waker: None,
            #[cfg(feature = "metrics")]
            queued_at: now,
            offered_at: now,
        };
        let arrival = state.arrive(rank, waiter);
        #[cfg(feature = "metrics")]
        self.inner.metrics.on_arrival(&state, rank, &arrival);
        let step = match arrival {
            Arrival::Admitted(grant) => {
                drop(state);
                Step::Decided(Some(Ok(Permit::new(self.clone(), grant, now))))
            }
            Arrival::Queued(ticket) => Step::Queued {
                gate: self.clone(),
                ticket,
            },
            Arrival::Rejected(scope) => Step::Decided(Some(Err(Overloaded { scope }))),
        };
        Acquire { step }
    }

    /// The engine reports its capacity: defaults follow it, explicit
    /// settings stay. Growth admits queued requests at once; shrinking never
    /// revokes admitted work. A report of zero ranks or zero `max_num_seqs`
    /// is ignored with a warning.
    pub fn report_capacity(&self, capacity: EngineCapacity) {
        let mut state = self.lock();
        if state.report_capacity(capacity) {
            #[cfg(feature = "metrics")]
            self.inner.metrics.on_configured(&state);
        }
        self.wake_offered(state);
    }

    /// Counts, limits and tallies at this instant.
    pub fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        Snapshot {
            total: state.total(),
            unranked: state.unranked_counts(),
            ranks: state.rank_counts().collect(),
            limits: state.limits(),
            capacity: state.capacity(),
            tally: state.tally(),
            unranked_tally: state.unranked_tally(),
            rank_tallies: state.rank_tallies().collect(),
        }
    }

    /// The per-rank limits in force.
    pub fn limits(&self) -> Limits {
        self.lock().limits()
    }

    fn lock(&self) -> MutexGuard<'_, State<Waiter>> {
        // The state is only changed inside short sections that do not panic;
        // a poisoned lock means a panic elsewhere while it was held (a
        // waker's clone, say), and the state is still consistent.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends a critical section: wakes every request the event admitted,
    /// after releasing the lock.
    fn wake_offered(&self, mut state: MutexGuard<'_, State<Waiter>>) {
        if !state.has_offers() {
            return;
        }
        let mut wakers = Vec::new();
        let mut now = None;
        state.drain_offered(|waiter| {
            waiter.offered_at = *now.get_or_insert_with(Stamp::now);
            if let Some(waker) = waiter.waker.take() {
                wakers.push(waker);
            }
        });
        drop(state);
        // Every admitted waiter must hear of it: should one waker panic, the
        // rest are still woken while the panic unwinds.
        let mut pending = WakeOnDrop(wakers.into_iter());
        for waker in &mut pending.0 {
            waker.wake();
        }
    }

    pub(crate) fn release(&self, grant: &mut state::Grant, finished: bool, admitted_at: Stamp) {
        // Read the clock (metrics only) before taking the lock.
        #[cfg(feature = "metrics")]
        let waited = grant.is_waiting().then(|| admitted_at.at().elapsed());
        #[cfg(not(feature = "metrics"))]
        let _ = admitted_at;
        let mut state = self.lock();
        if finished {
            state.finish(grant);
        } else {
            state.first_token(grant);
        }
        #[cfg(feature = "metrics")]
        self.inner.metrics.on_release(&state, grant, waited);
        self.wake_offered(state);
    }
}

/// Wakes whatever wakers are left when dropped.
struct WakeOnDrop(std::vec::IntoIter<Waker>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        for waker in &mut self.0 {
            waker.wake();
        }
    }
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
    /// Waiting in the gate's queue.
    Queued { gate: Gate, ticket: Ticket },
    /// Admitted from the queue and handed over.
    Done,
}

impl Acquire {
    /// Whether the request is waiting in the gate's queue.
    pub fn is_queued(&self) -> bool {
        matches!(self.step, Step::Queued { .. })
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
        match &mut this.step {
            Step::Decided(decision) => {
                Poll::Ready(decision.take().expect("Acquire polled after completion"))
            }
            Step::Queued { gate, ticket } => {
                let ticket = *ticket;
                let mut state = gate.lock();
                // Read before `poll` hands the admission over and drops the waiter.
                let offered_at = state.payload_mut(ticket).offered_at;
                #[cfg(feature = "metrics")]
                let queued_at = state.payload_mut(ticket).queued_at;
                match state.poll(ticket) {
                    Polled::Admitted(grant) => {
                        #[cfg(feature = "metrics")]
                        gate.inner
                            .metrics
                            .on_admitted_from_queue(&state, &grant, queued_at, offered_at);
                        drop(state);
                        let Step::Queued { gate, .. } =
                            std::mem::replace(&mut this.step, Step::Done)
                        else {
                            unreachable!("matched above")
                        };
                        Poll::Ready(Ok(Permit::new(gate, grant, offered_at)))
                    }
                    Polled::Waiting => {
                        let waker = &mut state.payload_mut(ticket).waker;
                        match waker {
                            Some(waker) if waker.will_wake(cx.waker()) => {}
                            _ => *waker = Some(cx.waker().clone()),
                        }
                        Poll::Pending
                    }
                }
            }
            Step::Done => panic!("Acquire polled after completion"),
        }
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        if let Step::Queued { gate, ticket } = &self.step {
            let mut state = gate.lock();
            #[cfg(feature = "metrics")]
            let bucket = state.ticket_rank(*ticket);
            state.cancel(*ticket);
            #[cfg(feature = "metrics")]
            gate.inner.metrics.on_cancelled(&state, bucket);
            gate.wake_offered(state);
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests;
