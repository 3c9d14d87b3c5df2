//! The gate's public vocabulary: how a request got in, whom a rejection
//! concerns, and the counts and tallies a gate reports. A leaf: the state
//! machine, the driver and every observer import from here, never the other
//! way round.

use std::fmt;

use crate::config::{EngineCapacity, Limits};

/// How an admitted request got in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
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

/// Whom a rejection concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
    pub(crate) scope: RejectionScope,
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
#[non_exhaustive]
pub struct Counts {
    /// Admitted requests whose response has not ended.
    pub engine_requests: usize,
    /// Admitted requests without a first token or completion yet.
    pub engine_waiting: usize,
    /// Requests waiting in the gate's queue.
    pub queued: usize,
}

impl Counts {
    /// Counts of `engine_requests`, `engine_waiting` and `queued` requests.
    pub const fn new(engine_requests: usize, engine_waiting: usize, queued: usize) -> Self {
        Counts {
            engine_requests,
            engine_waiting,
            queued,
        }
    }

    /// Whether nothing is admitted or queued.
    pub fn is_idle(&self) -> bool {
        *self == Counts::default()
    }
}

/// How requests have ended, for one rank, the unranked requests, or the
/// whole worker. `received = admitted_direct + admitted_queue + rejected +
/// cancelled + (queued or offered right now)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tally {
    /// Requests that arrived.
    pub received: u64,
    /// Requests admitted at arrival.
    pub admitted_direct: u64,
    /// Requests admitted from the queue.
    pub admitted_queue: u64,
    /// Requests rejected with [`RejectionScope::Rank`].
    pub rejected_rank: u64,
    /// Requests rejected with [`RejectionScope::Worker`].
    pub rejected_worker: u64,
    /// Requests cancelled while queued (including a cancellation that won a
    /// race against an admission offer).
    pub cancelled: u64,
}

impl Tally {
    /// All admissions, from both sources.
    pub fn admitted(&self) -> u64 {
        self.admitted_direct + self.admitted_queue
    }

    /// All rejections, of both scopes.
    pub fn rejected(&self) -> u64 {
        self.rejected_rank + self.rejected_worker
    }

    /// Requests that have reached their end state.
    pub fn settled(&self) -> u64 {
        self.admitted() + self.rejected() + self.cancelled
    }

    /// What happened between an `earlier` tally of the same gate and this
    /// one: each count's difference (zero where `earlier` is larger).
    pub fn since(&self, earlier: &Tally) -> Tally {
        Tally {
            received: self.received.saturating_sub(earlier.received),
            admitted_direct: self.admitted_direct.saturating_sub(earlier.admitted_direct),
            admitted_queue: self.admitted_queue.saturating_sub(earlier.admitted_queue),
            rejected_rank: self.rejected_rank.saturating_sub(earlier.rejected_rank),
            rejected_worker: self.rejected_worker.saturating_sub(earlier.rejected_worker),
            cancelled: self.cancelled.saturating_sub(earlier.cancelled),
        }
    }

    pub(crate) fn add(&mut self, other: &Tally) {
        self.received += other.received;
        self.admitted_direct += other.admitted_direct;
        self.admitted_queue += other.admitted_queue;
        self.rejected_rank += other.rejected_rank;
        self.rejected_worker += other.rejected_worker;
        self.cancelled += other.cancelled;
    }
}

/// A consistent picture of a gate at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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

impl Snapshot {
    /// Whether nothing is admitted or queued and every request received has
    /// reached its end state.
    pub fn is_idle(&self) -> bool {
        self.total.is_idle() && self.tally.received == self.tally.settled()
    }
}
