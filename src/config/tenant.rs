//! Per-tenant limits (opt-in): the engine requests, the engine tokens and
//! the queued requests one tenant may hold, per rank like every limit, with
//! a default for every tenant and overrides by name.
//!
//! A tenant's counts are worker-wide and its limits are per rank: a tenant
//! may hold `ranks ×` each limit over the whole worker (the combined rule
//! of behaviour §3; its requests on one rank are bounded by that rank's own
//! limits already). Requests without a tenant are not limited by tenant.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;

use super::AdmissionConfig;
use super::setters::LimitValue;

/// The limits of one tenant, per rank: what
/// [`AdmissionConfig::tenant_limits`] sets for a tenant named there. A limit
/// left unset falls back to the default for every tenant
/// ([`tenant_request_limit`](AdmissionConfig::tenant_request_limit) and its
/// siblings), and is off when that is unset too.
///
/// ```
/// use tower_admission::{AdmissionConfig, TenantLimits};
///
/// let config = AdmissionConfig::new()
///     .tenant_request_limit(4) // every tenant: 4 engine requests per rank
///     .tenant_limits("batch", TenantLimits::new().requests(1).queued(8));
/// let explicit = config.explicit();
/// assert_eq!(explicit.tenant_limits, TenantLimits::new().requests(4));
/// assert_eq!(
///     explicit.named_tenant_limits["batch"],
///     TenantLimits::new().requests(1).queued(8),
/// );
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TenantLimits {
    pub(crate) requests: Option<NonZeroUsize>,
    pub(crate) tokens: Option<NonZeroUsize>,
    pub(crate) queued: Option<usize>,
}

impl TenantLimits {
    /// No limit set: each falls back to the default for every tenant.
    pub fn new() -> TenantLimits {
        TenantLimits::default()
    }

    /// Admitted requests of the tenant whose response has not ended, per
    /// rank.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    #[track_caller]
    pub fn requests(mut self, n: usize) -> TenantLimits {
        self.requests = Some(LimitValue::checked("tenant request limit", n));
        self
    }

    /// Engine tokens (prompt plus maximum output, the engine token
    /// measure) of the tenant's admitted requests, per rank. A request
    /// larger than the whole limit runs when the tenant holds no tokens.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    #[track_caller]
    pub fn tokens(mut self, n: usize) -> TenantLimits {
        self.tokens = Some(LimitValue::checked("tenant token limit", n));
        self
    }

    /// Requests of the tenant waiting in the gate's queue, per rank; `0`:
    /// the tenant never queues.
    pub fn queued(mut self, n: usize) -> TenantLimits {
        self.queued = Some(n);
        self
    }

    /// The engine request limit, if set.
    pub fn engine_requests(&self) -> Option<usize> {
        self.requests.map(NonZeroUsize::get)
    }

    /// The engine token limit, if set.
    pub fn engine_tokens(&self) -> Option<usize> {
        self.tokens.map(NonZeroUsize::get)
    }

    /// The queue limit, if set.
    pub fn queued_requests(&self) -> Option<usize> {
        self.queued
    }

    /// Whether any limit is set.
    pub(crate) fn is_set(&self) -> bool {
        self.requests.is_some() || self.tokens.is_some() || self.queued.is_some()
    }

    /// These limits, each unset one taken from `default`.
    pub(crate) fn or(self, default: TenantLimits) -> TenantLimits {
        TenantLimits {
            requests: self.requests.or(default.requests),
            tokens: self.tokens.or(default.tokens),
            queued: self.queued.or(default.queued),
        }
    }
}

/// The per-tenant limits of a configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TenantLimitSettings {
    pub(crate) default: TenantLimits,
    pub(crate) by_name: BTreeMap<String, TenantLimits>,
}

impl TenantLimitSettings {
    /// Whether any tenant is limited.
    pub(crate) fn is_on(&self) -> bool {
        self.default.is_set() || self.by_name.values().any(TenantLimits::is_set)
    }

    /// The limits in force for the tenant named `tenant`: its own, each
    /// unset one from the default.
    pub(crate) fn of(&self, tenant: &str) -> TenantLimits {
        self.by_name
            .get(tenant)
            .map_or(self.default, |own| own.or(self.default))
    }
}

impl AdmissionConfig {
    /// Sets the engine request limit of every tenant, per rank (behaviour
    /// §8, per-tenant limits): a tenant holding this many admitted requests
    /// waits in its own flow of the queue, passed over by the fair queue
    /// until one of them ends; other tenants are not held up. Off unless
    /// set.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    #[track_caller]
    pub fn tenant_request_limit(mut self, n: usize) -> Self {
        self.tenant_limits.default = self.tenant_limits.default.requests(n);
        self
    }

    /// Sets the engine token limit of every tenant, per rank: the engine
    /// tokens (prompt plus maximum output) of its admitted requests. A
    /// tenant at its limit waits as at its request limit. Off unless set.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    #[track_caller]
    pub fn tenant_token_limit(mut self, n: usize) -> Self {
        self.tenant_limits.default = self.tenant_limits.default.tokens(n);
        self
    }

    /// Sets the queue limit of every tenant, per rank: a request of a tenant
    /// with this many requests queued is refused at once, with reason
    /// [`TenantLimit`](crate::RejectionReason::TenantLimit) and scope
    /// [`Tenant`](crate::RejectionScope::Tenant). Off unless set.
    pub fn tenant_queue_limit(mut self, n: usize) -> Self {
        self.tenant_limits.default = self.tenant_limits.default.queued(n);
        self
    }

    /// Sets the limits of the tenant named `tenant`; those left unset fall
    /// back to the default for every tenant. Setting a tenant again
    /// replaces its limits.
    pub fn tenant_limits(mut self, tenant: impl Into<String>, limits: TenantLimits) -> Self {
        self.tenant_limits.by_name.insert(tenant.into(), limits);
        self
    }
}
