//! [`ExplicitSettings`]: a configuration's settings as they were given,
//! read back in one value (for a server's banner, a test of the
//! environment or the command line).

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::time::Duration;

use super::{AdaptiveWaitingLimit, AdmissionConfig, TenantLimits};

/// The settings an [`AdmissionConfig`] was given (by the builder, the
/// environment or the command line), from
/// [`AdmissionConfig::explicit`]: `None` (or off, or empty) for each one
/// left to follow the engine or left off.
///
/// ```
/// use tower_admission::AdmissionConfig;
///
/// let config = AdmissionConfig::new().engine_request_waiting_limit(12);
/// let explicit = config.explicit();
/// assert_eq!(explicit.engine_request_waiting_limit, Some(12));
/// assert_eq!(explicit.engine_request_limit, None); // follows the engine
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExplicitSettings {
    /// The engine request limit per rank.
    pub engine_request_limit: Option<usize>,
    /// The engine request waiting limit per rank.
    pub engine_request_waiting_limit: Option<usize>,
    /// The request queue limit per rank (`Some(0)`: no queue).
    pub request_queue_limit: Option<usize>,
    /// The engine waiting token limit per rank.
    pub engine_waiting_token_limit: Option<usize>,
    /// The engine token limit per rank.
    pub engine_token_limit: Option<usize>,
    /// The request queue token limit per rank.
    pub request_queue_token_limit: Option<usize>,
    /// The request queue wait limit.
    pub request_queue_wait_limit: Option<Duration>,
    /// The time-to-first-token objective.
    pub ttft_objective: Option<Duration>,
    /// The inter-token objective (the mean gap between content chunks a
    /// request may see and still count as goodput).
    pub inter_token_objective: Option<Duration>,
    /// The queue delay target (controlled delay).
    pub queue_delay_target: Option<Duration>,
    /// The queue delay interval (`None`: 100 ms).
    pub queue_delay_interval: Option<Duration>,
    /// The maximum of the drain-rate `Retry-After` estimate, if it is on.
    pub retry_after_from_drain_rate: Option<Duration>,
    /// Whether the saturation gauge is recorded.
    pub saturation_metric: bool,
    /// The adaptive waiting limit's parameters, if it is on.
    pub adaptive_waiting_limit: Option<AdaptiveWaitingLimit>,
    /// The aging interval.
    pub aging_interval: Option<Duration>,
    /// The priority bands, ascending (empty: every priority is a band).
    pub priority_bands: Vec<i32>,
    /// The tenant weights, by tenant name (a tenant not named weighs 1).
    pub tenant_weights: BTreeMap<String, u32>,
    /// The per-tenant limits of every tenant (unset: no default limit).
    pub tenant_limits: TenantLimits,
    /// The per-tenant limits set by name, as set (a limit left unset falls
    /// back to [`tenant_limits`](Self::tenant_limits)).
    pub named_tenant_limits: BTreeMap<String, TenantLimits>,
}

impl AdmissionConfig {
    /// The settings this configuration was given, read back; see
    /// [`ExplicitSettings`].
    pub fn explicit(&self) -> ExplicitSettings {
        ExplicitSettings {
            engine_request_limit: self.engine_request_limit.map(NonZeroUsize::get),
            engine_request_waiting_limit: self.engine_request_waiting_limit.map(NonZeroUsize::get),
            request_queue_limit: self.request_queue_limit,
            engine_waiting_token_limit: self.engine_waiting_token_limit.map(NonZeroUsize::get),
            engine_token_limit: self.engine_token_limit.map(NonZeroUsize::get),
            request_queue_token_limit: self.request_queue_token_limit.map(NonZeroUsize::get),
            request_queue_wait_limit: self.request_queue_wait_limit,
            ttft_objective: self.ttft_objective,
            inter_token_objective: self.inter_token_objective,
            queue_delay_target: self.queue_delay_target,
            queue_delay_interval: self.queue_delay_interval,
            retry_after_from_drain_rate: self.retry_after_from_drain_rate,
            saturation_metric: self.saturation_metric,
            adaptive_waiting_limit: self.adaptive_waiting_limit,
            aging_interval: self.aging_interval,
            priority_bands: self.priority_bands.clone(),
            tenant_weights: self.tenant_weights.clone(),
            tenant_limits: self.tenant_limits.default,
            named_tenant_limits: self.tenant_limits.by_name.clone(),
        }
    }
}
