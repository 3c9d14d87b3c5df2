//! Per-tenant limits (opt-in): what each limited tenant holds, whether a
//! request of it fits, and the refusal of a tenant over its queue limit.
//!
//! A tenant at its engine limit (requests or tokens) is not refused: its
//! requests queue in its own flow, and the queue *parks* that flow
//! ([`Queue::park`](super::queue::Queue::park)) so the fair queue passes
//! over it, without holding up other tenants, until one of its requests
//! ends and the flow is unparked. A newcomer of a tenant with requests
//! queued never goes before them (a flow keeps its FIFO), parked or not.
//!
//! # Invariants
//!
//! * Nothing here exists unless some tenant is limited: `State::tenants`
//!   is `None` and every check is one branch.
//! * `held` keeps a record exactly while its tenant holds an engine
//!   request or a queue place (both counted worker-wide): memory stays
//!   O(requests held or queued) whatever the number of tenants.
//! * A flow is parked only while its tenant's record says `parked`; the
//!   record is unparked (every flow of the tenant, in every queue) whenever
//!   the tenant releases engine capacity or the limits in force change, and
//!   a dequeue follows, which parks again whatever still does not fit.
//! * A tenant's limits are per rank, its counts worker-wide: it may hold
//!   `ranks ×` each limit.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::accounting::{Demand, tokens_fit};
use super::buckets::BucketKey;
use super::budget::moving_average;
use super::{Slot, State};
use crate::config::{AdmissionConfig, TenantLimits};
use crate::gate::types::{Overloaded, RejectionReason, Tenant};

/// The longest tenant `Retry-After`, unless the drain-rate estimate sets
/// its own maximum.
const MAX_TENANT_RETRY_AFTER: Duration = Duration::from_secs(60);

/// What one limited tenant holds now, worker-wide.
#[derive(Debug, Default)]
struct Holding {
    /// Admitted requests whose response has not ended.
    requests: usize,
    /// Their engine tokens.
    tokens: usize,
    /// Requests in a queue.
    queued: usize,
    /// Whether some flow of the tenant is parked.
    parked: bool,
    /// The last queue admission of the tenant, or when its first request
    /// queued: the start of the interval the next one ends.
    drain_mark: Option<Instant>,
    /// Mean time between the tenant's queue admissions while it has
    /// requests queued (seconds, a moving average).
    drain_interval: Option<f64>,
}

impl Holding {
    fn is_empty(&self) -> bool {
        self.requests == 0 && self.queued == 0
    }
}

/// The per-tenant limits in force and what each limited tenant holds.
#[derive(Debug)]
pub(super) struct Tenants {
    /// Every tenant's limits, unless named.
    default: TenantLimits,
    /// The limits of tenants named in the configuration, the default
    /// filled in.
    named: HashMap<Tenant, TenantLimits>,
    held: HashMap<Tenant, Holding>,
}

impl Tenants {
    /// The per-tenant limits of `config`, if any tenant is limited.
    pub(super) fn of(config: &AdmissionConfig) -> Option<Box<Tenants>> {
        if !config.tenant_limits.is_on() {
            return None;
        }
        let settings = &config.tenant_limits;
        let named = settings
            .by_name
            .keys()
            .map(|name| (Tenant::new(name), settings.of(name)))
            .collect();
        Some(Box::new(Tenants {
            default: settings.default,
            named,
            held: HashMap::new(),
        }))
    }

    fn limits(&self, tenant: Tenant) -> &TenantLimits {
        self.named.get(&tenant).unwrap_or(&self.default)
    }

    /// The tenant of a request, if it is limited.
    fn limited(&self, tenant: Option<Tenant>) -> Option<Tenant> {
        tenant.filter(|&tenant| self.limits(tenant).is_set())
    }

    /// Tenants held now, and the room kept for them (for tests of
    /// bounded state).
    #[cfg(test)]
    pub(super) fn held_len(&self) -> (usize, usize) {
        (self.held.len(), self.held.capacity())
    }

    fn holding(&mut self, tenant: Tenant) -> &mut Holding {
        self.held.entry(tenant).or_default()
    }

    /// Forgets `tenant`'s record once it holds nothing, and gives back the
    /// map's room after a flood of tenants.
    fn forget_if_empty(&mut self, tenant: Tenant) {
        if self.held.get(&tenant).is_some_and(Holding::is_empty) {
            self.held.remove(&tenant);
            const SLACK: usize = 64;
            if self.held.capacity() > 4 * self.held.len() + SLACK {
                self.held.shrink_to(2 * self.held.len() + SLACK);
            }
        }
    }
}

impl<T> State<T> {
    /// Whether a request of `tenant` needing `demand` fits its tenant's
    /// engine limits (always, when it is not limited).
    #[inline]
    pub(super) fn tenant_engine_fits(&self, tenant: Option<Tenant>, demand: Demand) -> bool {
        let Some(tenants) = &self.tenants else {
            return true;
        };
        let Some(tenant) = tenants.limited(tenant) else {
            return true;
        };
        let limits = tenants.limits(tenant);
        let ranks = self.active_ranks;
        let (requests, tokens) = tenants
            .held
            .get(&tenant)
            .map_or((0, 0), |held| (held.requests, held.tokens));
        limits
            .engine_requests()
            .is_none_or(|limit| requests < limit.saturating_mul(ranks))
            && tokens_fit(
                tokens,
                demand.engine_tokens,
                limits
                    .engine_tokens()
                    .map(|limit| limit.saturating_mul(ranks)),
            )
    }

    /// Whether a request of `tenant` may queue under its tenant's queue
    /// limit (always, when it is not limited).
    #[inline]
    pub(super) fn tenant_queue_fits(&self, tenant: Option<Tenant>) -> bool {
        let Some(tenants) = &self.tenants else {
            return true;
        };
        let Some(tenant) = tenants.limited(tenant) else {
            return true;
        };
        let queued = tenants.held.get(&tenant).map_or(0, |held| held.queued);
        tenants
            .limits(tenant)
            .queued_requests()
            .is_none_or(|limit| queued < limit.saturating_mul(self.active_ranks))
    }

    /// Counts an admission of `demand` for `tenant`; the tenant the grant
    /// must release it for (`None` when not limited).
    pub(super) fn tenant_charge(
        &mut self,
        tenant: Option<Tenant>,
        demand: Demand,
    ) -> Option<Tenant> {
        let tenants = self.tenants.as_mut()?;
        let tenant = tenants.limited(tenant)?;
        let held = tenants.holding(tenant);
        held.requests += 1;
        held.tokens = held.tokens.saturating_add(demand.engine_tokens);
        Some(tenant)
    }

    /// A request of `tenant` holding `demand` ended: the tenant's flows
    /// are unparked (the dequeue that follows every release parks again
    /// whatever still does not fit).
    pub(super) fn tenant_release(&mut self, tenant: Tenant, demand: Demand) {
        let Some(tenants) = self.tenants.as_mut() else {
            return;
        };
        let Some(held) = tenants.held.get_mut(&tenant) else {
            return;
        };
        held.requests -= 1;
        held.tokens = held.tokens.saturating_sub(demand.engine_tokens);
        let parked = std::mem::take(&mut held.parked);
        tenants.forget_if_empty(tenant);
        if parked {
            self.unpark(Some(tenant));
        }
    }

    /// A request of `tenant` joins a queue at `now` (the gate's time).
    pub(super) fn tenant_enqueue(&mut self, tenant: Option<Tenant>, now: Option<Instant>) {
        let Some(tenants) = self.tenants.as_mut() else {
            return;
        };
        let Some(tenant) = tenants.limited(tenant) else {
            return;
        };
        let held = tenants.holding(tenant);
        if held.queued == 0 {
            // Its queue starts to drain now, not at its last admission.
            held.drain_mark = now;
        }
        held.queued += 1;
    }

    /// A request of `tenant` leaves a queue; `served_at`: admitted then
    /// (a sample of the tenant's drain rate), rather than cancelled,
    /// expired or displaced.
    pub(super) fn tenant_unqueue(&mut self, tenant: Option<Tenant>, served_at: Option<Instant>) {
        let Some(tenants) = self.tenants.as_mut() else {
            return;
        };
        let Some(tenant) = tenants.limited(tenant) else {
            return;
        };
        let Some(held) = tenants.held.get_mut(&tenant) else {
            return;
        };
        held.queued -= 1;
        if let Some(now) = served_at {
            if let Some(mark) = held.drain_mark {
                let interval = now.saturating_duration_since(mark).as_secs_f64();
                held.drain_interval = Some(moving_average(held.drain_interval, interval));
            }
            held.drain_mark = Some(now);
        }
        if held.queued == 0 {
            held.parked = false;
        }
        tenants.forget_if_empty(tenant);
    }

    /// The head at `slot` of `key`'s queue does not fit its tenant's
    /// engine limits: its flow is parked.
    pub(super) fn park(&mut self, key: BucketKey, slot: Slot) {
        let tenant = self.entries[slot].node.tenant;
        if let Some(tenant) = tenant {
            if let Some(held) = self.tenants.as_mut().and_then(|t| t.held.get_mut(&tenant)) {
                held.parked = true;
            }
        }
        let (queue, entries) = self.queue_and_entries(key);
        queue.park(entries, slot);
    }

    /// Unparks the flows of `tenant` in every queue.
    fn unpark(&mut self, tenant: Option<Tenant>) {
        self.buckets.unranked.queue.unpark(tenant);
        let active = self.recognised_ranks();
        for bucket in self.buckets.ranks.iter_mut().take(active) {
            bucket.queue.unpark(tenant);
        }
    }

    /// The limits in force changed (a capacity report): every parked flow
    /// is unparked, and the dequeue that follows parks again whatever
    /// still does not fit.
    pub(super) fn unpark_all(&mut self) {
        let Some(tenants) = self.tenants.as_mut() else {
            return;
        };
        let parked: Vec<Tenant> = tenants
            .held
            .iter_mut()
            .filter_map(|(&tenant, held)| std::mem::take(&mut held.parked).then_some(tenant))
            .collect();
        for tenant in parked {
            self.unpark(Some(tenant));
        }
    }

    /// Refuses a request of `tenant` (over its queue limit), that arrived
    /// in band `rung` of `bucket`: tenant-scoped, with a `Retry-After` from
    /// the tenant's own drain.
    pub(super) fn reject_tenant(
        &mut self,
        bucket: BucketKey,
        rung: i64,
        tenant: Option<Tenant>,
    ) -> Overloaded {
        let mut overloaded = self.reject(bucket, rung, RejectionReason::TenantLimit, false);
        overloaded.retry_after = self.tenant_drain_estimate(tenant);
        overloaded
    }

    /// When `tenant` should have room in its queue: its queued requests
    /// over the rate its own requests left the queue at, in whole seconds
    /// rounded up, within `[1 s, max]`. `None` before a rate was measured.
    fn tenant_drain_estimate(&self, tenant: Option<Tenant>) -> Option<Duration> {
        let held = self.tenants.as_ref()?.held.get(&tenant?)?;
        let interval = held.drain_interval.filter(|interval| *interval > 0.0)?;
        let seconds = (held.queued as f64 * interval).ceil();
        let max = self
            .config
            .retry_after_from_drain_rate
            .unwrap_or(MAX_TENANT_RETRY_AFTER)
            .as_secs()
            .max(1);
        // `as` saturates: a huge estimate is the maximum.
        Some(Duration::from_secs((seconds as u64).clamp(1, max)))
    }

    /// Tenants with a record now.
    #[cfg(test)]
    pub(super) fn tenants_held(&self) -> usize {
        self.tenants
            .as_ref()
            .map_or(0, |tenants| tenants.held_len().0)
    }
}
