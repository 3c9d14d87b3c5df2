//! The gate's public vocabulary: how a request got in, whom a rejection
//! concerns, and the counts and tallies a gate reports. A leaf: the state
//! machine, the driver and every observer import from here, never the other
//! way round.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::OnceLock;
use std::time::Duration;

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
    /// Only the request's tenant is over its limit
    /// ([`RejectionReason::TenantLimit`]); the worker has room for other
    /// tenants, so a frontend keeps routing to it.
    Tenant,
}

impl RejectionScope {
    /// The `scope` label of the rejection metric: `"rank"` or `"worker"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RejectionScope::Rank(_) => "rank",
            RejectionScope::Worker => "worker",
            RejectionScope::Tenant => "tenant",
        }
    }
}

/// Why a request was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionReason {
    /// Its queue was full: it could neither enter the engine nor wait.
    QueueFull,
    /// Its queue wait budget ran out while it waited, or it was predicted to
    /// run out before the request could be admitted.
    Deadline,
    /// It waited in a full queue and gave its place to an arrival of higher
    /// priority (behaviour §8): the newest request of the lowest band goes first.
    Displaced,
    /// It waited in a standing queue longer than the queue delay target
    /// ([`AdmissionConfig::queue_delay_target`](crate::AdmissionConfig::queue_delay_target)):
    /// controlled delay sheds the standing queue. Always worker-scoped.
    QueueDelay,
    /// The server is shutting down: the request never reached the engine,
    /// and another worker may take it at once. Always worker-scoped;
    /// counted by [`Gate::reject`](crate::Gate::reject).
    Shutdown,
    /// Too many request bodies were being read at once (the limit of
    /// [`OpenAiCostLayer::max_concurrent_reads`](crate::http::OpenAiCostLayer::max_concurrent_reads)),
    /// so the request was turned away before its body was read. Always
    /// worker-scoped; counted by [`Gate::reject`](crate::Gate::reject).
    BodyReads,
    /// Its tenant already had as many requests queued as its tenant queue
    /// limit allows ([`AdmissionConfig::tenant_queue_limit`](crate::AdmissionConfig::tenant_queue_limit)).
    /// Always tenant-scoped.
    TenantLimit,
}

impl RejectionReason {
    /// The `reason` label and header value: `"queue_full"`, `"deadline"`,
    /// `"displaced"`, `"queue_delay"`, `"shutdown"` or `"body_reads"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RejectionReason::QueueFull => "queue_full",
            RejectionReason::Deadline => "deadline",
            RejectionReason::Displaced => "displaced",
            RejectionReason::QueueDelay => "queue_delay",
            RejectionReason::Shutdown => "shutdown",
            RejectionReason::BodyReads => "body_reads",
            RejectionReason::TenantLimit => "tenant_limit",
        }
    }

    /// Whether a rejection for this reason concerns the whole worker
    /// whatever the request's rank: a standing queue, a shutdown and a
    /// flood of bodies are the worker's, not a rank's.
    pub(crate) fn is_worker_wide(self) -> bool {
        matches!(
            self,
            RejectionReason::QueueDelay | RejectionReason::Shutdown | RejectionReason::BodyReads
        )
    }
}

/// A request was rejected before it reached the engine, for a
/// [`RejectionReason`]: its queue was full, its queue wait budget ran out,
/// the server is shutting down, …
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overloaded {
    pub(crate) scope: RejectionScope,
    pub(crate) reason: RejectionReason,
    /// The budget that ran out was the client's own deadline.
    pub(crate) client_deadline: bool,
    /// When the worker should have room, for a worker-scoped rejection of
    /// a gate that estimates it from its drain rate.
    pub(crate) retry_after: Option<Duration>,
}

impl Overloaded {
    /// A worker-scoped rejection for `reason` that no gate counted.
    // Made only by the HTTP layers.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn worker(reason: RejectionReason) -> Self {
        Overloaded {
            scope: RejectionScope::Worker,
            reason,
            client_deadline: false,
            retry_after: None,
        }
    }

    /// Whom the rejection concerns.
    pub fn scope(&self) -> RejectionScope {
        self.scope
    }

    /// Why the request was rejected.
    pub fn reason(&self) -> RejectionReason {
        self.reason
    }

    /// Whether the budget that ran out was the client's own deadline (a
    /// gRPC `grpc-timeout`, say) rather than the server's queue wait limit
    /// or its time-to-first-token objective.
    pub fn client_deadline_passed(&self) -> bool {
        self.client_deadline
    }

    /// When the worker should have room again: for a worker-scoped
    /// rejection by a gate with
    /// [`retry_after_from_drain_rate`](crate::AdmissionConfig::retry_after_from_drain_rate),
    /// the requests queued at the rejection divided by the rate the queue
    /// has drained at, rounded up to whole seconds, clamped to `[1 s,
    /// max]`. `None` for rank-scoped rejections, when the estimate is off
    /// (the default), and before a drain rate has been measured; the HTTP
    /// layer then sends its fixed `Retry-After`. For a tenant-scoped
    /// rejection, the tenant's own queued requests over the rate its own
    /// requests left the queue at, the same way (at most a minute unless
    /// the drain-rate estimate sets another maximum); `None` before a rate
    /// was measured.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl fmt::Display for Overloaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.reason {
            RejectionReason::QueueFull => "has no room to admit or queue the request",
            RejectionReason::Deadline => "could not admit the request within its queue wait budget",
            RejectionReason::Displaced => {
                "gave the request's queue place to a request of higher priority"
            }
            RejectionReason::QueueDelay => {
                "has a standing queue: the request waited longer than the queue delay target"
            }
            RejectionReason::Shutdown => "is shutting down; the request did not reach the engine",
            RejectionReason::BodyReads => "is reading too many request bodies at once",
            RejectionReason::TenantLimit => {
                "already has as many requests queued as its tenant queue limit allows"
            }
        };
        match self.scope {
            RejectionScope::Rank(rank) => {
                write!(f, "overloaded: data-parallel rank {rank} {what}")
            }
            RejectionScope::Worker => write!(f, "overloaded: the worker {what}"),
            RejectionScope::Tenant => write!(f, "overloaded: the request's tenant {what}"),
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
    /// Prompt plus maximum output tokens of the admitted requests.
    pub engine_tokens: usize,
    /// Prompt tokens of the admitted requests without a first token or
    /// completion yet.
    pub engine_waiting_tokens: usize,
    /// Prompt tokens of the requests waiting in the gate's queue.
    pub queued_tokens: usize,
}

/// Adds each named field of `$other` to the same field of `$into`: the
/// one rule by which counts and tallies are summed over buckets.
macro_rules! add_fields {
    ($into:ident, $other:ident; $($field:ident),+ $(,)?) => {
        $($into.$field += $other.$field;)+
    };
}

impl Counts {
    /// Counts of `engine_requests`, `engine_waiting` and `queued` requests,
    /// with no tokens.
    pub const fn new(engine_requests: usize, engine_waiting: usize, queued: usize) -> Self {
        Counts {
            engine_requests,
            engine_waiting,
            queued,
            engine_tokens: 0,
            engine_waiting_tokens: 0,
            queued_tokens: 0,
        }
    }

    /// The same counts with these token counts: `engine_tokens`,
    /// `engine_waiting_tokens`, `queued_tokens`.
    pub const fn with_tokens(
        mut self,
        engine_tokens: usize,
        engine_waiting_tokens: usize,
        queued_tokens: usize,
    ) -> Self {
        self.engine_tokens = engine_tokens;
        self.engine_waiting_tokens = engine_waiting_tokens;
        self.queued_tokens = queued_tokens;
        self
    }

    pub(crate) fn add(&mut self, other: &Counts) {
        add_fields!(self, other; engine_requests, engine_waiting, queued,
            engine_tokens, engine_waiting_tokens, queued_tokens);
    }

    /// Whether nothing is admitted or queued.
    pub fn is_idle(&self) -> bool {
        *self == Counts::default()
    }
}

/// What a request costs the engine, in tokens: its prompt and, when known,
/// the most it may generate. The gate weighs requests by it only where a
/// token limit is set; a request of unknown cost counts 0 tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Cost {
    /// Prompt tokens: the prefill work, and the KV cache taken at once.
    pub prompt_tokens: usize,
    /// The most output tokens the request may generate (`max_tokens`), if
    /// known.
    pub max_output_tokens: Option<usize>,
}

impl Cost {
    /// A cost of `prompt_tokens`, with at most `max_output_tokens` generated.
    pub const fn new(prompt_tokens: usize, max_output_tokens: Option<usize>) -> Self {
        Cost {
            prompt_tokens,
            max_output_tokens,
        }
    }

    /// A cost of `prompt_tokens`, output unknown.
    pub const fn prompt(prompt_tokens: usize) -> Self {
        Cost::new(prompt_tokens, None)
    }

    /// Prompt plus maximum output tokens: what the engine token limit
    /// counts.
    pub const fn engine_tokens(&self) -> usize {
        match self.max_output_tokens {
            Some(output) => self.prompt_tokens.saturating_add(output),
            None => self.prompt_tokens,
        }
    }
}

/// What the gate is told about one request before it decides: the
/// data-parallel rank it asks for and its cost. [`Gate::acquire`](crate::Gate::acquire)
/// is the shorthand for a request with a rank and nothing else.
///
/// ```
/// use tower_admission::{Cost, Descriptor};
///
/// let request = Descriptor::new()
///     .with_rank(Some(1))
///     .with_cost(Cost::new(800, Some(256)));
/// assert_eq!(request.cost.engine_tokens(), 1056);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Descriptor {
    /// The rank asked for; `None` (or a rank the engine has not reported)
    /// makes the request unranked.
    pub rank: Option<u32>,
    /// Its cost in tokens (zero unless known).
    pub cost: Cost,
    /// The client's own deadline, as time from arrival (a gRPC
    /// `grpc-timeout`, say): waiting in the queue longer is pointless. With
    /// the gate's own queue wait limit and time-to-first-token objective it
    /// makes the request's queue wait budget, the smallest of the three.
    pub deadline: Option<Duration>,
    /// Its priority (behaviour §8): higher is served first; 0 by default;
    /// negative marks sheddable work, the first to be displaced from a full
    /// queue. Requests of one priority form one band, or, with
    /// [`AdmissionConfig::priority_bands`](crate::AdmissionConfig::priority_bands),
    /// of the configured band at or below it.
    pub priority: i32,
    /// The fairness key it is served under (behaviour §8): within a band, tenants
    /// share the engine by weight; `None` is one more tenant.
    pub tenant: Option<Tenant>,
}

impl Descriptor {
    /// Whether the request asks for no rank and has no cost, so that the
    /// gate's lock-free lane may admit it (see `gate/lane.rs`).
    #[inline]
    pub(crate) fn may_take_lane(&self) -> bool {
        self.rank.is_none() && self.cost.engine_tokens() == 0
    }

    /// A plain request: unranked, of unknown cost, priority 0, no tenant.
    pub const fn new() -> Self {
        Descriptor {
            rank: None,
            cost: Cost::new(0, None),
            deadline: None,
            priority: 0,
            tenant: None,
        }
    }

    /// The same request, at `priority`.
    pub const fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The same request, served as `tenant`: a [`Tenant`], or its name.
    pub fn with_tenant(mut self, tenant: impl Into<Tenant>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// The same request, asking for `rank`.
    pub const fn with_rank(mut self, rank: Option<u32>) -> Self {
        self.rank = rank;
        self
    }

    /// The same request, costing `cost`.
    pub const fn with_cost(mut self, cost: Cost) -> Self {
        self.cost = cost;
        self
    }

    /// The same request, with the client's own deadline `after` arrival.
    pub const fn with_deadline(mut self, after: Duration) -> Self {
        self.deadline = Some(after);
        self
    }
}

/// A tenant: the key weighted fair sharing is done by (behaviour §8). It is a
/// 64-bit keyed digest of the tenant's name (SipHash-1-3 under a key drawn
/// at random once per process), so a descriptor stays `Copy` and the gate
/// stores no strings; equal names are equal tenants within a process. A
/// client that picks names cannot aim them at one another or at a weighted
/// tenant: without the key, hitting a given tenant takes about 2^64 tries.
/// Digests differ between processes: send names, not [`id`](Tenant::id)s,
/// from one process to another.
///
/// ```
/// use tower_admission::{Descriptor, Tenant};
///
/// assert_eq!(Tenant::new("acme"), Tenant::from("acme"));
/// assert_eq!(Tenant::new("acme"), Tenant::from(String::from("acme")));
/// assert_ne!(Tenant::new("acme"), Tenant::new("globex"));
/// // A descriptor takes the tenant or its name.
/// assert_eq!(
///     Descriptor::new().with_tenant("acme"),
///     Descriptor::new().with_tenant(Tenant::new("acme")),
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(u64);

impl Tenant {
    /// The tenant named `name`.
    pub fn new(name: &str) -> Tenant {
        static KEY: OnceLock<RandomState> = OnceLock::new();
        Tenant(KEY.get_or_init(RandomState::new).hash_one(name))
    }

    /// A tenant known by a number of your own rather than by name.
    pub const fn from_id(id: u64) -> Tenant {
        Tenant(id)
    }

    /// The tenant's number.
    pub const fn id(&self) -> u64 {
        self.0
    }
}

impl From<String> for Tenant {
    fn from(name: String) -> Tenant {
        Tenant::new(&name)
    }
}

impl From<&String> for Tenant {
    fn from(name: &String) -> Tenant {
        Tenant::new(name)
    }
}

impl From<&str> for Tenant {
    fn from(name: &str) -> Tenant {
        Tenant::new(name)
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
    /// Of the rank-scoped rejections, those for a deadline
    /// ([`RejectionReason::Deadline`]).
    pub expired_rank: u64,
    /// Of the worker-scoped rejections, those for a deadline.
    pub expired_worker: u64,
    /// Of the rank-scoped rejections, queued requests displaced by an
    /// arrival of higher priority ([`RejectionReason::Displaced`]).
    pub displaced_rank: u64,
    /// Of the worker-scoped rejections, displaced requests.
    pub displaced_worker: u64,
    /// Of the worker-scoped rejections, queued requests shed by controlled
    /// delay ([`RejectionReason::QueueDelay`]; always worker-scoped).
    pub shed_worker: u64,
    /// Of the worker-scoped rejections, requests turned away while the
    /// server shut down ([`RejectionReason::Shutdown`]).
    pub shutdown_worker: u64,
    /// Of the worker-scoped rejections, requests turned away while too
    /// many bodies were being read ([`RejectionReason::BodyReads`]).
    pub body_reads_worker: u64,
    /// Requests refused because their tenant was over its limit
    /// ([`RejectionScope::Tenant`], [`RejectionReason::TenantLimit`]).
    pub rejected_tenant: u64,
    /// Requests cancelled while queued (including a cancellation that won a
    /// race against an admission offer).
    pub cancelled: u64,
}

impl Tally {
    /// All admissions, from both sources.
    pub fn admitted(&self) -> u64 {
        self.admitted_direct + self.admitted_queue
    }

    /// All rejections, of every scope and reason.
    pub fn rejected(&self) -> u64 {
        self.rejected_rank + self.rejected_worker + self.rejected_tenant
    }

    /// Rejections for a deadline, of both scopes.
    pub fn expired(&self) -> u64 {
        self.expired_rank + self.expired_worker
    }

    /// Queued requests displaced by arrivals of higher priority, of both
    /// scopes.
    pub fn displaced(&self) -> u64 {
        self.displaced_rank + self.displaced_worker
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
            expired_rank: self.expired_rank.saturating_sub(earlier.expired_rank),
            expired_worker: self.expired_worker.saturating_sub(earlier.expired_worker),
            displaced_rank: self.displaced_rank.saturating_sub(earlier.displaced_rank),
            displaced_worker: self
                .displaced_worker
                .saturating_sub(earlier.displaced_worker),
            shed_worker: self.shed_worker.saturating_sub(earlier.shed_worker),
            shutdown_worker: self.shutdown_worker.saturating_sub(earlier.shutdown_worker),
            body_reads_worker: self
                .body_reads_worker
                .saturating_sub(earlier.body_reads_worker),
            rejected_tenant: self.rejected_tenant.saturating_sub(earlier.rejected_tenant),
            cancelled: self.cancelled.saturating_sub(earlier.cancelled),
        }
    }

    pub(crate) fn add(&mut self, other: &Tally) {
        add_fields!(self, other; received, admitted_direct, admitted_queue,
            rejected_rank, rejected_worker, expired_rank, expired_worker,
            displaced_rank, displaced_worker, shed_worker, shutdown_worker,
            body_reads_worker, rejected_tenant, cancelled);
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

/// How the requests of one configured priority band (behaviour §8) of one
/// bucket have ended; kept only when
/// [`AdmissionConfig::priority_bands`](crate::AdmissionConfig::priority_bands)
/// are configured. A request counts under the band it arrived in, however
/// far it aged while it waited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BandTally {
    /// Admitted, on arrival or from the queue.
    pub(crate) admitted: u64,
    /// Rejected, for any reason and of either scope.
    pub(crate) rejected: u64,
}
