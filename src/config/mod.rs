//! Configuration of a gate: the per-rank request limits, the optional token
//! limits, and the engine capacity the request limits' defaults follow.
//!
//! Every setting is independent. An explicit setting (from the builder, the
//! environment or the command line) is fixed for the life of the gate; a
//! setting left unset follows the engine's reported capacity and changes when
//! the engine reports again.

mod adaptive;
#[cfg(feature = "clap")]
mod cli;
mod clock;
mod env;
mod explicit;
mod limits;
mod qos;
mod setters;
mod tenant;

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use self::adaptive::AdaptiveWaitingLimit;
#[cfg(feature = "clap")]
pub use self::cli::AdmissionArgs;
pub(crate) use self::clock::Clock;
pub use self::explicit::ExplicitSettings;
pub use self::limits::{
    EngineCapacity, LimitSource, LimitSources, Limits, LimitsInForce, MAX_DP_RANKS,
};
use self::setters::{LimitValue, duration_setters, limit_setters};
pub(crate) use self::tenant::TenantLimitSettings;
pub use self::tenant::TenantLimits;
use crate::builder::setters;

/// Per-rank default for both engine limits until the engine reports its capacity.
pub const DEFAULT_ENGINE_LIMIT: usize = 10_000;

/// The configuration of a [`Gate`](crate::Gate).
///
/// `AdmissionConfig::default()` (or [`new`](Self::new)) leaves every setting
/// to follow the engine. Settings given here are explicit and never change
/// when the engine reports a new capacity.
///
/// ```
/// use tower_admission::{AdmissionConfig, EngineCapacity, Gate};
///
/// let config = AdmissionConfig::new()
///     .engine_request_waiting_limit(12) // sized with Little's law
///     .capacity(EngineCapacity::new(256, 2));
/// let gate = Gate::new(config);
/// assert_eq!(gate.limits_in_force().per_rank.engine_request_limit, 256); // follows the engine
/// assert_eq!(gate.limits_in_force().per_rank.engine_request_waiting_limit, 12); // explicit
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdmissionConfig {
    pub(crate) engine_request_limit: Option<NonZeroUsize>,
    pub(crate) engine_request_waiting_limit: Option<NonZeroUsize>,
    pub(crate) request_queue_limit: Option<usize>,
    pub(crate) engine_waiting_token_limit: Option<NonZeroUsize>,
    pub(crate) engine_token_limit: Option<NonZeroUsize>,
    pub(crate) request_queue_token_limit: Option<NonZeroUsize>,
    pub(crate) request_queue_wait_limit: Option<Duration>,
    pub(crate) ttft_objective: Option<Duration>,
    pub(crate) inter_token_objective: Option<Duration>,
    pub(crate) queue_delay_target: Option<Duration>,
    pub(crate) queue_delay_interval: Option<Duration>,
    pub(crate) retry_after_from_drain_rate: Option<Duration>,
    pub(crate) saturation_metric: bool,
    pub(crate) request_deadlines: bool,
    pub(crate) aging_interval: Option<Duration>,
    pub(crate) priority_bands: Vec<i32>,
    pub(crate) tenant_weights: BTreeMap<String, u32>,
    pub(crate) tenant_limits: TenantLimitSettings,
    pub(crate) clock: Clock,
    pub(crate) capacity: Option<EngineCapacity>,
    /// The adaptive engine request waiting limit, when it is on.
    pub(crate) adaptive_waiting_limit: Option<AdaptiveWaitingLimit>,
    /// Where each request and token limit was set.
    pub(crate) sources: LimitSources,
    #[cfg(feature = "metrics")]
    pub(crate) metrics_prefix: Option<String>,
}

/// How long a queue's wait must stay above the queue delay target before
/// it sheds, unless set.
pub(crate) const DEFAULT_QUEUE_DELAY_INTERVAL: Duration = Duration::from_millis(100);

impl AdmissionConfig {
    /// A configuration where every setting follows the engine.
    pub fn new() -> Self {
        Self::default()
    }

    limit_setters! {
        /// Sets the engine request limit per rank: admitted requests whose
        /// response has not ended.
        ///
        /// # Panics
        ///
        /// If `n` is 0: a gate that can admit nothing is a configuration error.
        engine_request_limit;

        /// Sets the engine request waiting limit per rank: admitted requests that
        /// have produced neither a first token nor a completion.
        ///
        /// # Panics
        ///
        /// If `n` is 0.
        engine_request_waiting_limit;

        /// Sets the request queue limit per rank. `0` disables queueing: a request
        /// that cannot enter the engine at once is rejected.
        request_queue_limit;

        /// Sets the engine waiting token limit per rank: prompt tokens of
        /// admitted requests that have produced neither a first token nor a
        /// completion. Off unless set. Size it as time-to-first-token objective
        /// × prefill tokens per second ([`sizing::token_budget`](crate::sizing::token_budget)).
        ///
        /// A request whose prompt alone exceeds the limit is admitted when no
        /// other waiting request holds prompt tokens: it runs alone rather than
        /// being refused for its size.
        ///
        /// # Panics
        ///
        /// If `n` is 0.
        engine_waiting_token_limit;

        /// Sets the engine token limit per rank: prompt plus maximum output
        /// tokens of admitted requests whose response has not ended (a stand-in
        /// for the KV cache they may occupy). Off unless set.
        ///
        /// # Panics
        ///
        /// If `n` is 0.
        engine_token_limit;

        /// Sets the request queue token limit per rank: prompt tokens of
        /// requests waiting in the gate's queue. Off unless set.
        ///
        /// # Panics
        ///
        /// If `n` is 0.
        request_queue_token_limit;
    }

    duration_setters! {
        /// Sets the request queue wait limit: no request waits in the queue
        /// longer; one whose wait would end later leaves the queue when it does
        /// and is rejected with [`RejectionReason::Deadline`](crate::RejectionReason::Deadline),
        /// and one that is predicted not to be admitted in time (from the rate
        /// its queue drains at) is rejected on arrival. Off unless set: by
        /// default a queued request waits as long as the queue takes.
        ///
        /// # Panics
        ///
        /// If `limit` is zero (use a queue limit of 0 to have no queue).
        request_queue_wait_limit(limit);

        /// Sets the time-to-first-token objective: each request's queue wait
        /// budget becomes the objective minus the measured mean engine waiting
        /// time (admission to first token), never below zero, so that admitted
        /// requests can still meet it. The one number to tune instead of a
        /// queue length. Off unless set.
        ///
        /// # Panics
        ///
        /// If `objective` is zero.
        ttft_objective(objective);

        /// Sets the inter-token objective: the mean gap between successive
        /// content chunks of a streamed response that still counts as good
        /// service. It changes no admission decision: it is one of the
        /// objectives a finished request must meet to count in
        /// `goodput_requests_total` (feature `metrics`, behaviour §6), with
        /// the [time-to-first-token objective](Self::ttft_objective) and the
        /// request's own deadline. A request meets it when the time from its
        /// first token to its last content chunk, over the gaps between them,
        /// is at most `objective`: the per-request inter-token latency of
        /// benchmark clients (aiperf), or time per output token (vLLM's
        /// benchmarks), where each chunk is one token. Every gap is still
        /// recorded in `client_inter_token_latency_seconds`, so stalls show
        /// there. Off unless set (then every request meets it).
        ///
        /// ```
        /// use std::time::Duration;
        /// use tower_admission::AdmissionConfig;
        ///
        /// let config = AdmissionConfig::new().inter_token_objective(Duration::from_millis(50));
        /// assert_eq!(config.explicit().inter_token_objective, Some(Duration::from_millis(50)));
        /// ```
        ///
        /// # Panics
        ///
        /// If `objective` is zero.
        inter_token_objective(objective);
    }

    setters! {
        /// Honours the clients' own deadlines ([`Descriptor::deadline`](crate::Descriptor::deadline),
        /// from a gRPC `grpc-timeout` or a header the layer reads): a request
        /// waits in the queue no longer than its deadline. Off unless set, or
        /// unless a queue wait limit or objective is set.
        fn request_deadlines(honour: bool) => request_deadlines = honour;

        /// The clock the gate measures queue waits, drain rates and waiting
        /// times with; `std::time::Instant::now` unless set. Only read when
        /// deadlines are on, and by the HTTP layer for the client's view
        /// (behaviour §6) while metrics are recorded. A test on tokio's
        /// paused time passes `|| tokio::time::Instant::now().into_std()`.
        fn clock(now: impl Fn() -> Instant + Send + Sync + 'static) =>
            clock = Clock(Some(Arc::new(now)));
    }

    /// Whether the gate keeps time: a queue wait limit, a time-to-first-token
    /// objective, or the clients' deadlines are honoured, or queued
    /// requests age.
    pub fn deadlines_enabled(&self) -> bool {
        self.request_queue_wait_limit.is_some()
            || self.ttft_objective.is_some()
            || self.request_deadlines
            || self.aging_interval.is_some()
            || self.queue_delay_target.is_some()
            || self.retry_after_from_drain_rate.is_some()
    }

    duration_setters! {
        /// Sets the queue delay target: controlled delay (CoDel) for the
        /// request queue. A burst may queue, a standing queue may not: when the
        /// wait of every request in a queue has stayed above `target` for a
        /// whole [interval](Self::queue_delay_interval) (100 ms unless set),
        /// the queue's requests older than `target` are answered as overload
        /// (worker scope, reason
        /// [`QueueDelay`](crate::RejectionReason::QueueDelay)), and so is
        /// every request that waits longer than `target`, until the standing
        /// queue has drained (stayed empty for an interval). A burst the queue absorbs within
        /// `target + interval` is never shed. Off unless set.
        ///
        /// The rule is CoDel's, per queue (each rank's and the unranked one),
        /// checked at each of the gate's events, on the gate's clock: the queue
        /// is *above* from the moment its oldest request's wait passed
        /// `target`, and stays above while its oldest request is older than
        /// `target`; once it has been above for `interval` it *sheds* (every
        /// request older than `target` is answered at once) until it has
        /// stayed empty for `interval`.
        /// Under a sustained overload the queue then holds about `target` of
        /// work and no more; admitted requests have waited about `target` at
        /// most.
        ///
        /// ```
        /// use std::time::Duration;
        /// use tower_admission::AdmissionConfig;
        ///
        /// let config = AdmissionConfig::new().queue_delay_target(Duration::from_millis(50));
        /// assert_eq!(config.explicit().queue_delay_target, Some(Duration::from_millis(50)));
        /// ```
        ///
        /// # Panics
        ///
        /// If `target` is zero (use a queue limit of 0 to have no queue).
        queue_delay_target(target);

        /// Sets how long a queue's wait must stay above the
        /// [queue delay target](Self::queue_delay_target) before its old
        /// requests are shed; 100 ms unless set. Without a target it does
        /// nothing.
        ///
        /// # Panics
        ///
        /// If `interval` is zero.
        queue_delay_interval(interval);
    }

    /// The queue delay interval in force: the one set, or 100 ms.
    pub(crate) fn queue_delay_interval_in_force(&self) -> Duration {
        self.queue_delay_interval
            .unwrap_or(DEFAULT_QUEUE_DELAY_INTERVAL)
    }

    /// Estimates, for every worker-scoped rejection, when the worker will
    /// have room: the requests in its queue divided by the rate its queue
    /// has drained at, rounded up to whole seconds and clamped to
    /// `[1 s, max]` ([`Overloaded::retry_after`](crate::Overloaded::retry_after)).
    /// The HTTP layer then sends it as `Retry-After` (gRPC:
    /// `grpc-retry-pushback-ms`) instead of its fixed value, and a frontend
    /// (`route`) waits that long, up to its own caps. Before the queue has
    /// drained at a measured rate (or with no queue) there is no estimate,
    /// and the layer sends its fixed value. Off unless set: by default
    /// `Retry-After` is a fixed `1`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_admission::AdmissionConfig;
    ///
    /// let config = AdmissionConfig::new().retry_after_from_drain_rate(Duration::from_secs(30));
    /// assert_eq!(config.explicit().retry_after_from_drain_rate, Some(Duration::from_secs(30)));
    /// ```
    ///
    /// # Panics
    ///
    /// If `max` is shorter than one second: the estimate is in whole
    /// seconds, at least one.
    #[track_caller]
    pub fn retry_after_from_drain_rate(mut self, max: Duration) -> Self {
        assert!(
            max >= Duration::from_secs(1),
            "invalid retry_after_from_drain_rate: {max:?} (the maximum must be at least 1 s)"
        );
        self.retry_after_from_drain_rate = Some(max);
        self
    }

    setters! {
        /// Records the gauge `<prefix>_saturation{dp_rank}` (feature
        /// `metrics`): how saturated each rank is, and under
        /// `dp_rank="unspecified"` the whole worker, from 0 (idle) to 1 (the
        /// next request would be rejected); see [`Gate::saturation`](crate::Gate::saturation)
        /// for the formula. The one series a router or an autoscaler needs.
        /// Off unless set, so that the default series stay those of behaviour §6;
        /// [`Gate::saturation`](crate::Gate::saturation) is always there.
        fn saturation_metric(record: bool) => saturation_metric = record;
    }

    /// Whether the saturation gauge is recorded.
    pub(crate) fn explicit_saturation_metric(&self) -> bool {
        self.saturation_metric
    }

    /// Whether the gate reads its clock: deadlines are on, the waiting
    /// limit adapts (it measures engine waiting times), or tenants are
    /// limited (a tenant's refusal says when its own queue drains).
    pub(crate) fn keeps_time(&self) -> bool {
        self.deadlines_enabled()
            || self.adaptive_waiting_limit.is_some()
            || self.tenant_limits.is_on()
    }

    setters! {
        /// Turns the adaptive engine request waiting limit on (with the
        /// defaults of [`AdaptiveWaitingLimit`]) or off: the gate then moves
        /// the per-rank waiting limit between 1 and the configured or reported
        /// waiting limit by the engine waiting times it measures, instead of
        /// keeping it fixed. Off unless set (`--adaptive-waiting-limit`,
        /// `DYN_BACKEND_ADMISSION_ADAPTIVE_WAITING_LIMIT`). The gate keeps time
        /// while it is on, on its [`clock`](Self::clock).
        ///
        /// ```
        /// use tower_admission::{AdmissionConfig, EngineCapacity, Gate};
        ///
        /// let gate = Gate::new(
        ///     AdmissionConfig::new()
        ///         .adaptive_waiting_limit(true)
        ///         .capacity(EngineCapacity::new(256, 1)),
        /// );
        /// // It starts at its floor and grows as the engine shows it can take more.
        /// assert_eq!(gate.limits_in_force().per_rank.engine_request_waiting_limit, 1);
        /// ```
        fn adaptive_waiting_limit(on: bool) =>
            adaptive_waiting_limit = on.then(AdaptiveWaitingLimit::default);

        /// Turns the adaptive engine request waiting limit on with `params`.
        fn adaptive_waiting_limit_with(params: AdaptiveWaitingLimit) =>
            adaptive_waiting_limit = Some(params);
    }

    /// The engine's capacity, if it is known when the gate is built. Without
    /// it the gate assumes one rank of 10000 sequences and treats every
    /// request as unranked until [`Gate::report_capacity`](crate::Gate::report_capacity).
    ///
    /// A report of zero ranks or zero sequences is ignored with a warning,
    /// as it is when reported later.
    pub fn capacity(mut self, capacity: EngineCapacity) -> Self {
        match capacity.invalid_reason() {
            Some(reason) => tracing::warn!(?capacity, "ignoring engine capacity report: {reason}"),
            None => self.capacity = Some(capacity),
        }
        self
    }

    setters! {
        /// The prefix of every metric name (`<prefix>_<suffix>`); default
        /// `admission`. `dynamo_backend_admission` gives the names of the source
        /// system.
        #[cfg(feature = "metrics")]
        fn metrics_prefix(prefix: impl Into<String>) => metrics_prefix = Some(prefix.into());
    }

    /// The explicit engine request limit, if one was set.
    pub(crate) fn explicit_engine_request_limit(&self) -> Option<usize> {
        self.engine_request_limit.map(NonZeroUsize::get)
    }

    /// The explicit engine request waiting limit, if one was set.
    pub(crate) fn explicit_engine_request_waiting_limit(&self) -> Option<usize> {
        self.engine_request_waiting_limit.map(NonZeroUsize::get)
    }

    /// The engine waiting token limit, if one was set.
    pub(crate) fn explicit_engine_waiting_token_limit(&self) -> Option<usize> {
        self.engine_waiting_token_limit.map(NonZeroUsize::get)
    }

    /// The engine token limit, if one was set.
    pub(crate) fn explicit_engine_token_limit(&self) -> Option<usize> {
        self.engine_token_limit.map(NonZeroUsize::get)
    }

    /// The request queue token limit, if one was set.
    pub(crate) fn explicit_request_queue_token_limit(&self) -> Option<usize> {
        self.request_queue_token_limit.map(NonZeroUsize::get)
    }

    /// The per-rank limits this configuration gives for an engine capacity
    /// (or, with `None`, before the engine has reported).
    pub fn limits_for(&self, capacity: Option<EngineCapacity>) -> Limits {
        let seqs = capacity.map_or(DEFAULT_ENGINE_LIMIT, |c| c.max_num_seqs);
        Limits {
            engine_request_limit: self.explicit_engine_request_limit().unwrap_or(seqs),
            engine_request_waiting_limit: self
                .explicit_engine_request_waiting_limit()
                .unwrap_or(seqs),
            request_queue_limit: self
                .request_queue_limit
                .unwrap_or_else(|| seqs.saturating_mul(2)),
            engine_waiting_token_limit: self.explicit_engine_waiting_token_limit(),
            engine_token_limit: self.explicit_engine_token_limit(),
            request_queue_token_limit: self.explicit_request_queue_token_limit(),
        }
    }
}

#[cfg(test)]
mod tests;
