//! Token and request accounting: what a request needs ([`Demand`]), whether
//! it fits the engine or the queue, and charging and releasing the
//! capacity a grant holds.
//!
//! # Invariants
//!
//! * `total` equals the sum of every active bucket's counts: every change
//!   goes through [`State::total_and`], which changes both alike.
//! * A ranked request must fit its rank's limits **and** the combined
//!   capacity (`ranks ×` each per-rank limit); an unranked one only the
//!   combined capacity. Queue space follows the same two rules.
//! * A grant releases its waiting capacity and its request capacity at
//!   most once each ([`State::release`] takes its flags), and every
//!   release is followed by a dequeue, so freed capacity goes to the queue
//!   inside the same event.
//! * A token budget that holds nothing takes any request ([`tokens_fit`]):
//!   a request larger than a whole budget runs alone rather than never.
//! * Counts only exceed a limit after the limit shrank: a capacity report
//!   never revokes held capacity.

use std::time::Instant;

use super::buckets::{BucketKey, Held};
use super::budget::moving_average;
use super::{Grant, State};
use crate::gate::types::{
    AdmitSource, BandTally, Cost, Counts, Overloaded, RejectionReason, RejectionScope, Tenant,
};

/// What one request needs: one engine request slot and one waiting slot
/// always, and its tokens where token limits are set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Demand {
    /// Prompt tokens: held in the queue and, once admitted, until waiting
    /// ends.
    pub(super) prompt_tokens: usize,
    /// Prompt plus maximum output tokens: held from admission until the
    /// response ends.
    pub(super) engine_tokens: usize,
}

impl Demand {
    /// Tokens past this are counted as this: no engine has a context of
    /// 2^32 tokens, and sums of clamped costs cannot overflow.
    const MAX_TOKENS: usize = 1 << 32;

    pub(crate) fn of(cost: Cost) -> Demand {
        Demand {
            prompt_tokens: cost.prompt_tokens.min(Demand::MAX_TOKENS),
            engine_tokens: cost.engine_tokens().min(Demand::MAX_TOKENS),
        }
    }
}

/// Whether `cost` more tokens fit a budget of which `used` are taken. An
/// empty budget takes anything: a request larger than the whole budget runs
/// alone rather than never. A request of no tokens does not draw on the
/// budget, so it is never held back by it.
pub(super) fn tokens_fit(used: usize, cost: usize, limit: Option<usize>) -> bool {
    match limit {
        None => true,
        Some(limit) => cost == 0 || used == 0 || used.saturating_add(cost) <= limit,
    }
}

impl<T> State<T> {
    /// Whether `demand` fits the engine limits of `key`'s rank (if ranked)
    /// and the combined ones.
    pub(super) fn engine_fits(&self, key: BucketKey, demand: Demand) -> bool {
        let limits = self.limits;
        let fits = |counts: &Counts, ranks: usize| {
            let combined = |per_rank: usize| per_rank.saturating_mul(ranks);
            let tokens = |per_rank: Option<usize>| per_rank.map(combined);
            counts.engine_requests < combined(limits.engine_request_limit)
                && counts.engine_waiting < combined(limits.engine_request_waiting_limit)
                && tokens_fit(
                    counts.engine_waiting_tokens,
                    demand.prompt_tokens,
                    tokens(limits.engine_waiting_token_limit),
                )
                && tokens_fit(
                    counts.engine_tokens,
                    demand.engine_tokens,
                    tokens(limits.engine_token_limit),
                )
        };
        fits(&self.total, self.active_ranks)
            && match key {
                BucketKey::Unranked => true,
                BucketKey::Rank(_) => fits(&self.bucket(key).counts, 1),
            }
    }

    /// Whether the engine's combined request or waiting slots are all
    /// taken: then no request fits ([`State::engine_fits`]), whatever its
    /// demand or rank.
    pub(super) fn engine_full(&self) -> bool {
        let combined = |per_rank: usize| per_rank.saturating_mul(self.active_ranks);
        self.total.engine_requests >= combined(self.limits.engine_request_limit)
            || self.total.engine_waiting >= combined(self.limits.engine_request_waiting_limit)
    }

    /// Whether `demand` fits the queue limits of `key`'s rank (if ranked)
    /// and the combined ones.
    pub(super) fn queue_fits(&self, key: BucketKey, demand: Demand) -> bool {
        self.queue_fits_after(key, demand, &Counts::default())
    }

    /// Whether `demand` would fit the queue limits of `key`'s rank (if
    /// ranked) and the combined ones once the `freed` queued requests of
    /// `key` left.
    pub(super) fn queue_fits_after(&self, key: BucketKey, demand: Demand, freed: &Counts) -> bool {
        let limits = self.limits;
        let fits = |counts: &Counts, ranks: usize| {
            let queued = counts.queued - freed.queued;
            let queued_tokens = counts.queued_tokens.saturating_sub(freed.queued_tokens);
            queued < limits.request_queue_limit.saturating_mul(ranks)
                && tokens_fit(
                    queued_tokens,
                    demand.prompt_tokens,
                    limits
                        .request_queue_token_limit
                        .map(|per_rank| per_rank.saturating_mul(ranks)),
                )
        };
        fits(&self.total, self.active_ranks)
            && match key {
                BucketKey::Unranked => true,
                BucketKey::Rank(_) => fits(&self.bucket(key).counts, 1),
            }
    }

    /// Could a request of this bucket (of no known cost) be admitted or
    /// queued right now?
    pub(super) fn accepts(&self, key: BucketKey) -> bool {
        let plain = Demand::default();
        (self.bucket(key).queue.is_empty() && self.engine_fits(key, plain))
            || self.queue_fits(key, plain)
    }

    /// A rejection names the rank while the worker could still admit or
    /// queue some other request; otherwise the whole worker is overloaded.
    /// Unranked rejections are always worker-scoped.
    pub(super) fn rejection_scope(&self, rejected: BucketKey) -> RejectionScope {
        let BucketKey::Rank(rank) = rejected else {
            return RejectionScope::Worker;
        };
        let others_accept = self.accepts(BucketKey::Unranked)
            || (0..self.recognised_ranks() as u32)
                .filter(|&other| other != rank)
                .any(|other| self.accepts(BucketKey::Rank(other)));
        if others_accept {
            RejectionScope::Rank(rank)
        } else {
            RejectionScope::Worker
        }
    }

    /// Counts `demand` against `key` and returns the grant holding it,
    /// admitted at `now` (the gate's time of the event).
    pub(super) fn charge(
        &mut self,
        key: BucketKey,
        demand: Demand,
        source: AdmitSource,
        now: Option<Instant>,
    ) -> Grant {
        for counts in self.total_and(key) {
            counts.engine_requests += 1;
            counts.engine_waiting += 1;
            counts.engine_tokens = counts.engine_tokens.saturating_add(demand.engine_tokens);
            counts.engine_waiting_tokens = counts
                .engine_waiting_tokens
                .saturating_add(demand.prompt_tokens);
        }
        if self.adaptive.is_some() {
            // The admission filled its rank's waiting limit, or the
            // worker's: the limit binds.
            let limit = self.limits.engine_request_waiting_limit;
            let rank_full = match key {
                BucketKey::Unranked => false,
                BucketKey::Rank(_) => self.bucket(key).counts.engine_waiting >= limit,
            };
            let worker_full = self.total.engine_waiting >= limit.saturating_mul(self.active_ranks);
            if let Some(adaptive) = self.adaptive.as_mut().filter(|_| rank_full || worker_full) {
                adaptive.bound();
            }
        }
        let (rank, generation) = match key {
            BucketKey::Unranked => (None, 0),
            BucketKey::Rank(rank) => (Some(rank), self.buckets.ranks[rank as usize].generation),
        };
        Grant {
            held: Held {
                bucket: key,
                generation,
            },
            demand,
            admitted_at: now,
            rank,
            source,
            holds_request: true,
            holds_waiting: true,
            in_lane: false,
            tenant: None,
        }
    }

    /// Releases the waiting capacity of `grant`, and with `finished` its
    /// request capacity too; whatever was already released is not released
    /// again. Freed capacity goes to the queue at once.
    pub(super) fn release(&mut self, grant: &mut Grant, finished: bool, now: Option<Instant>) {
        let waiting = std::mem::take(&mut grant.holds_waiting);
        let request = finished && std::mem::take(&mut grant.holds_request);
        if !waiting && !request {
            return;
        }
        if waiting {
            if let (Some(admitted_at), Some(now)) = (grant.admitted_at, now) {
                let waited = now.saturating_duration_since(admitted_at).as_secs_f64();
                self.mean_wait = Some(moving_average(self.mean_wait, waited));
                if let Some(adaptive) = &mut self.adaptive {
                    if adaptive.sample(admitted_at, now) {
                        // A larger limit admits from the queue at the
                        // dequeue below; a smaller one revokes nothing.
                        self.limits.engine_request_waiting_limit = adaptive.limit();
                    }
                }
            }
        }
        let key = self.current_bucket(grant.held);
        let demand = grant.demand;
        if request {
            if let Some(tenant) = grant.tenant {
                self.tenant_release(tenant, demand);
            }
        }
        for counts in self.total_and(key) {
            if waiting {
                counts.engine_waiting -= 1;
                counts.engine_waiting_tokens = counts
                    .engine_waiting_tokens
                    .saturating_sub(demand.prompt_tokens);
            }
            if request {
                counts.engine_requests -= 1;
                counts.engine_tokens = counts.engine_tokens.saturating_sub(demand.engine_tokens);
            }
        }
        self.dequeue(now);
    }

    /// Takes a request of `demand` and `tenant` off `key`'s queue counts;
    /// `served_at`: it was admitted then.
    pub(super) fn unqueue(
        &mut self,
        key: BucketKey,
        demand: Demand,
        tenant: Option<Tenant>,
        served_at: Option<Instant>,
    ) {
        self.tenant_unqueue(tenant, served_at);
        for counts in self.total_and(key) {
            counts.queued -= 1;
            counts.queued_tokens = counts.queued_tokens.saturating_sub(demand.prompt_tokens);
        }
    }

    /// A request turned away before it reached the gate (the server shuts
    /// down; too many bodies are being read): it counts as an unranked
    /// arrival of priority 0, rejected at once for `reason`, so that every
    /// overload answer is in the tallies and `received` still sums them.
    pub(crate) fn reject_unseen(&mut self, reason: RejectionReason) -> Overloaded {
        let bucket = BucketKey::Unranked;
        self.bucket_mut(bucket).tally.received += 1;
        let rung = self.ladder.rung(0);
        let overloaded = self.reject(bucket, rung, reason, false);
        // The queue's drain rate says nothing of when this one will pass.
        Overloaded {
            retry_after: None,
            ..overloaded
        }
    }

    /// The server shuts down: every queued request is rejected
    /// ([`Shutdown`](RejectionReason::Shutdown); its waiter hears of it
    /// when the driver drains), and so is every arrival from now on. The
    /// lane never opens again. Admitted requests keep their capacity and
    /// release it as usual.
    pub(crate) fn shut_down(&mut self) {
        self.closed = true;
        self.lane_allowed = false;
        let queued: Vec<_> = self
            .entries
            .iter()
            .filter(|(_, entry)| matches!(entry.status, super::Status::Queued))
            .map(|(slot, _)| slot)
            .collect();
        for slot in queued {
            self.turn_away(slot, RejectionReason::Shutdown);
        }
    }

    /// Counts a rejection of a request of `bucket` that arrived in band
    /// `rung`, and says whom it concerns.
    pub(super) fn reject(
        &mut self,
        bucket: BucketKey,
        rung: i64,
        reason: RejectionReason,
        client: bool,
    ) -> Overloaded {
        self.count_band(bucket, rung, |band| band.rejected += 1);
        let scope = match reason {
            // The worker has room for other tenants.
            RejectionReason::TenantLimit => RejectionScope::Tenant,
            // A standing queue, a shutdown, a flood of bodies: the worker's,
            // whatever the rank.
            reason if reason.is_worker_wide() => RejectionScope::Worker,
            _ => self.rejection_scope(bucket),
        };
        let expired = u64::from(reason == RejectionReason::Deadline);
        let displaced = u64::from(reason == RejectionReason::Displaced);
        let shed = u64::from(reason == RejectionReason::QueueDelay);
        let shutdown = u64::from(reason == RejectionReason::Shutdown);
        let body_reads = u64::from(reason == RejectionReason::BodyReads);
        let retry_after = match scope {
            RejectionScope::Worker => self.drain_estimate(),
            // A tenant's own drain: see `reject_tenant`.
            RejectionScope::Rank(_) | RejectionScope::Tenant => None,
        };
        let tally = &mut self.bucket_mut(bucket).tally;
        match scope {
            RejectionScope::Rank(_) => {
                tally.rejected_rank += 1;
                tally.expired_rank += expired;
                tally.displaced_rank += displaced;
            }
            RejectionScope::Worker => {
                tally.rejected_worker += 1;
                tally.expired_worker += expired;
                tally.displaced_worker += displaced;
                tally.shed_worker += shed;
                tally.shutdown_worker += shutdown;
                tally.body_reads_worker += body_reads;
            }
            RejectionScope::Tenant => tally.rejected_tenant += 1,
        }
        Overloaded {
            scope,
            reason,
            client_deadline: client,
            retry_after,
        }
    }

    /// Counts into the tally of band `rung` of `key`'s bucket, when bands
    /// are configured (otherwise there are no band tallies: priorities are
    /// unbounded, and so would be the tallies).
    #[inline]
    pub(super) fn count_band(
        &mut self,
        key: BucketKey,
        rung: i64,
        count: impl FnOnce(&mut BandTally),
    ) {
        let configured = self.ladder.configured_bands();
        if configured == 0 {
            return;
        }
        let tallies = &mut self.bucket_mut(key).bands;
        if tallies.len() < configured {
            tallies.resize(configured, BandTally::default());
        }
        // With bands configured, a rung is the index of its band.
        count(&mut tallies[rung as usize]);
    }
}
