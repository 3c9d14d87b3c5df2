//! The sans-IO admission state machine (behaviour §2, §3, §5 capacity changes,
//! §7 token budgets).
//!
//! `State` knows nothing of futures, locks, clocks or HTTP. It takes events —
//! an arrival, a first token, the end of a response, a cancellation, a
//! capacity report — and answers with decisions: admitted, queued under a
//! [`Ticket`], or rejected with a [`RejectionScope`](crate::RejectionScope). Queued requests that
//! become admitted are *offered*: they hold their engine capacity from that
//! moment, and the driver (the [`Gate`](crate::Gate)) learns of them through
//! [`State::drain_offered`] and wakes whoever waits on them.
//!
//! Time is an argument, not a stored present: every event that may read
//! time takes `now: Option<Instant>`, the time the driver read for it once
//! (`None` when the gate keeps no time); see [`budget`].
//!
//! # Accounting
//!
//! Capacity is counted in *buckets*: one per data-parallel rank and one for
//! unranked requests. The combined capacity of the worker is `ranks ×` each
//! per-rank limit, and `total` is always the sum of the active buckets.
//!
//! A ranked request must fit its rank's limits **and** the combined capacity;
//! an unranked request only the combined capacity. Queue space follows the
//! same two rules.
//!
//! # Where each part lives
//!
//! This file holds the events (arrive, poll, expire, cancel, first token,
//! finish, capacity report) and the queue's service (enqueue, dequeue,
//! offer). The rest is carved by what it owns, each file with its own
//! invariants: [`buckets`] (which bucket a request, ticket or grant is
//! counted in; retiring a vanished rank), [`accounting`] (what a request
//! needs, whether it fits, charging and releasing), [`budget`] (time,
//! queue-wait budgets, drain-rate prediction) and [`view`] (plain values
//! for observers); [`queue`] orders each bucket's waiting requests.
//!
//! # Invariants (checked by the model test below)
//!
//! * `total` equals the sum of every active bucket's counts.
//! * After every event, no queue head fits the engine: whatever capacity is
//!   free has been offered to the first queued request in service order
//!   that fits (by default the oldest). Hence a newcomer can never take
//!   capacity a waiter could use, and "direct admission only when the
//!   queue is empty" is the FIFO rule.
//! * Counts only exceed a limit after the limit shrank (a capacity report
//!   never revokes held capacity).
//!
//! # Extension points
//!
//! Every request costs one engine request slot and one waiting slot, and
//! its tokens where token limits are set ([`Demand`]); a token budget that
//! holds nothing takes any request, so a request larger than a whole budget
//! runs alone. Each bucket's [`Queue`](queue::Queue) orders its requests by class of
//! service (behaviour §8: bands, tenants' fair shares, aging); with the default
//! class — one band, no tenant — it is FIFO by arrival.

use std::collections::HashMap;
use std::time::Instant;

use slab::Slab;

use self::queue::{Ladder, Node, Nodes};
use super::types::{AdmitSource, Counts, Descriptor, Overloaded, RejectionReason, Tenant};
use crate::config::{AdmissionConfig, EngineCapacity, Limits};

mod accounting;
mod adaptive;
mod buckets;
mod budget;
mod codel;
mod decision;
mod outside;
mod queue;
mod saturation;
mod tenants;
mod view;

pub(crate) use self::accounting::Demand;
use self::buckets::{Bucket, BucketKey, Buckets};
pub(crate) use self::decision::{Arrival, Expiry, Grant, Polled, Ticket};
pub(crate) use self::outside::Slots;
use self::tenants::Tenants;

/// A position in the entry slab; queues link entries by slot.
type Slot = usize;

/// A request's class of service (behaviour §8): its priority and tenant; the
/// unit tests' shorthand (the state itself reads both from the request's
/// [`Descriptor`]).
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Class {
    pub(crate) priority: i32,
    pub(crate) tenant: Option<Tenant>,
}

#[derive(Debug)]
enum Status {
    /// Waiting in its bucket's queue.
    Queued,
    /// Admitted from the queue; the waiter has not taken the grant yet.
    Offered(Grant),
    /// Displaced from a full queue, or shed from a standing one
    /// (controlled delay); the waiter has not heard yet.
    Displaced(Overloaded),
}

#[derive(Debug)]
struct Entry<T> {
    /// Its place in the queue; `node.seq` orders arrivals across all
    /// queues (lower is older) and is the ticket's generation.
    node: Node,
    bucket: BucketKey,
    demand: Demand,
    /// Whether its queue wait budget is the client's own deadline.
    client_deadline: bool,
    status: Status,
    payload: T,
}

impl<T> Nodes for Slab<Entry<T>> {
    fn node(&self, slot: Slot) -> &Node {
        &self[slot].node
    }

    fn node_mut(&mut self, slot: Slot) -> &mut Node {
        &mut self[slot].node
    }
}

/// The admission state of one worker. `T` is what the driver keeps with each
/// queued request (the `Gate` keeps a waker).
#[derive(Debug)]
pub(crate) struct State<T> {
    config: AdmissionConfig,
    /// Whether the configuration keeps time
    /// ([`AdmissionConfig::keeps_time`]), decided once: a setting, not a
    /// present ([`State::gate_time`]).
    keeps_time: bool,
    capacity: Option<EngineCapacity>,
    limits: Limits,
    /// Ranks currently recognised; 1 (and nothing recognised) until reported.
    active_ranks: usize,
    /// Every rank ever reported (`buckets.ranks[active_ranks..]` are
    /// vanished, kept for their generation counter), and the unranked one.
    buckets: Buckets,
    total: Counts,
    entries: Slab<Entry<T>>,
    next_seq: u64,
    /// Slots offered since the driver last looked.
    offered: Vec<Slot>,
    /// Events so far, to order observations.
    events: u64,
    /// Mean engine waiting time (admission to first token or completion),
    /// seconds, a moving average.
    mean_wait: Option<f64>,
    /// Priority bands and aging.
    ladder: Ladder,
    /// Tenant weights other than 1.
    weights: HashMap<Tenant, u32>,
    /// Controlled delay's settings, when a queue delay target is set.
    codel: Option<codel::Settings>,
    /// Whether controlled delay shed a request since the driver last
    /// asked ([`State::take_shed`]).
    shed: bool,
    /// Whether some queue is shedding (controlled delay).
    codel_shedding: bool,
    /// The adaptive waiting limit, when it is on: it sets
    /// `limits.engine_request_waiting_limit`.
    adaptive: Option<adaptive::Adaptive>,
    /// What the driver's lock-free lane held when last folded in (counted
    /// in `total` and the unranked bucket); see [`outside`].
    outside: Slots,
    /// Whether the configuration lets the lane admit ([`outside`]),
    /// decided once (and never again once shut down).
    lane_allowed: bool,
    /// Shut down: every arrival is rejected ([`State::shut_down`]).
    closed: bool,
    /// Per-tenant limits and what limited tenants hold; `None` unless
    /// some tenant is limited.
    tenants: Option<Box<Tenants>>,
}

impl<T> State<T> {
    pub(crate) fn new(config: AdmissionConfig) -> Self {
        let capacity = config.capacity;
        let ladder = Ladder::new(config.priority_bands.clone(), config.aging_interval);
        let weights = config
            .tenant_weights()
            .map(|(tenant, weight)| (Tenant::new(tenant), weight))
            .collect();
        let mut state = State {
            limits: config.limits_for(capacity),
            keeps_time: config.keeps_time(),
            config,
            capacity: None,
            active_ranks: 1,
            buckets: Buckets::default(),
            total: Counts::default(),
            entries: Slab::new(),
            next_seq: 0,
            offered: Vec::new(),
            events: 0,
            mean_wait: None,
            ladder,
            weights,
            codel: None,
            shed: false,
            codel_shedding: false,
            adaptive: None,
            outside: Slots::default(),
            lane_allowed: false,
            closed: false,
            tenants: None,
        };
        state.tenants = Tenants::of(&state.config);
        state.codel = state
            .config
            .queue_delay_target
            .map(|target| codel::Settings {
                target,
                interval: state.config.queue_delay_interval_in_force(),
            });
        if let Some(params) = state.config.adaptive_waiting_limit {
            let adaptive =
                adaptive::Adaptive::new(params, state.limits.engine_request_waiting_limit);
            state.limits.engine_request_waiting_limit = adaptive.limit();
            state.adaptive = Some(adaptive);
        }
        state.lane_allowed = state.allows_lane();
        if let Some(capacity) = capacity {
            state.report_capacity(capacity, None);
        }
        state
    }

    // ----- events -------------------------------------------------------

    /// A request arrives, as `descriptor` describes it, at `now` (the time
    /// of the event, when the driver read one): admitted at once only if the
    /// limits have room and nothing queued goes before it in service order;
    /// into a full queue it may displace the newest requests of lower
    /// bands. Returns the decision and the rank the request is counted
    /// under (`None`: unranked, also for a rank this worker does not
    /// recognise).
    pub(crate) fn receive(
        &mut self,
        descriptor: &Descriptor,
        now: Option<Instant>,
        payload: T,
    ) -> (Arrival, Option<u32>) {
        let bucket = self.recognise(descriptor.rank);
        let demand = Demand::of(descriptor.cost);
        let arrival = self.arrive_in(bucket, descriptor, demand, payload, now);
        (arrival, bucket.rank())
    }

    /// The arrival of [`receive`](Self::receive), in the bucket it was
    /// recognised in, needing `demand`, at `at` (the arrival's time, as
    /// [`receive`](Self::receive) takes it).
    fn arrive_in(
        &mut self,
        bucket: BucketKey,
        descriptor: &Descriptor,
        demand: Demand,
        payload: T,
        at: Option<Instant>,
    ) -> Arrival {
        let now = self.gate_time(at);
        if self.codel.is_some() {
            // A standing queue sheds before the newcomer joins it.
            self.dequeue(now);
        }
        self.bucket_mut(bucket).tally.received += 1;
        let rung = self.ladder.rung(descriptor.priority);
        if self.closed {
            return Arrival::Rejected(self.reject(bucket, rung, RejectionReason::Shutdown, false));
        }
        let tenant = descriptor.tenant;
        // Whether it fits first: when it does not (the engine is full, the
        // usual case while requests queue), where it would stand in service
        // order does not matter and is not looked for.
        let fits = self.engine_fits(bucket, demand) && self.tenant_engine_fits(tenant, demand);
        let queue = &mut self.buckets.get_mut(bucket).queue;
        if fits && (queue.is_empty() || queue.would_lead(&self.ladder, now, rung, tenant)) {
            let mut grant = self.charge(bucket, demand, AdmitSource::Direct, now);
            grant.tenant = self.tenant_charge(tenant, demand);
            self.bucket_mut(bucket).tally.admitted_direct += 1;
            self.count_band(bucket, rung, |band| band.admitted += 1);
            return Arrival::Admitted(grant);
        }
        if !self.tenant_queue_fits(tenant) {
            return Arrival::Rejected(self.reject_tenant(bucket, rung, tenant));
        }
        let victims = if self.queue_fits(bucket, demand) {
            Vec::new()
        } else {
            match self.victims(bucket, demand, rung) {
                Some(victims) => victims,
                None => {
                    return Arrival::Rejected(self.reject(
                        bucket,
                        rung,
                        RejectionReason::QueueFull,
                        false,
                    ));
                }
            }
        };
        let budget = self.budget(descriptor.deadline, at);
        if let Some((budget, client)) = budget {
            if self
                .bucket(bucket)
                .predicted_wait(rung)
                .is_some_and(|wait| wait > budget)
            {
                return Arrival::Rejected(self.reject(
                    bucket,
                    rung,
                    RejectionReason::Deadline,
                    client,
                ));
            }
        }
        let displaced = !victims.is_empty();
        for victim in victims {
            self.turn_away(victim, RejectionReason::Displaced);
        }
        let expires_at = budget.and_then(|(budget, _)| at?.checked_add(budget));
        let client = budget.is_some_and(|(_, client)| client);
        let ticket = self.enqueue(bucket, demand, client, (rung, tenant), payload, now);
        if displaced || self.ladder.ages() || self.tenants.is_some() {
            // A displaced head uncovers the next, aging reorders heads, and
            // a newcomer whose tenant is at its engine limit is parked at
            // once, not left to hold up the tenants behind it.
            self.dequeue(now);
        }
        Arrival::Queued(ticket, expires_at)
    }

    /// The queued requests of `bucket` an arrival at `rung` needing `demand`
    /// would displace to fit its queue: the newest of the lowest band
    /// first, as few as fit it. `None` if displacing every lower request
    /// would not make room (then none is displaced).
    fn victims(&self, bucket: BucketKey, demand: Demand, rung: i64) -> Option<Vec<Slot>> {
        let queue = &self.bucket(bucket).queue;
        let mut freed = Counts::default();
        let mut victims = Vec::new();
        for slot in queue.displaceable(&self.entries, rung) {
            victims.push(slot);
            freed.queued += 1;
            freed.queued_tokens = freed
                .queued_tokens
                .saturating_add(self.entries[slot].demand.prompt_tokens);
            if self.queue_fits_after(bucket, demand, &freed) {
                return Some(victims);
            }
        }
        None
    }

    /// Takes the queued request at `slot` out of its queue and rejects it
    /// for `reason` (displaced, or shed for its queue delay); its waiter
    /// hears of it when the driver drains.
    fn turn_away(&mut self, slot: Slot, reason: RejectionReason) {
        let key = self.entries[slot].bucket;
        let demand = self.entries[slot].demand;
        let rung = self.entries[slot].node.rung;
        let tenant = self.entries[slot].node.tenant;
        let (queue, entries) = self.queue_and_entries(key);
        queue.remove(entries, slot, false);
        self.unqueue(key, demand, tenant, None);
        let overloaded = self.reject(key, rung, reason, false);
        self.entries[slot].status = Status::Displaced(overloaded);
        self.offered.push(slot);
    }

    /// The queue wait budget of the request of `ticket` ran out. Still
    /// queued, it leaves its queue and is rejected for its deadline; already
    /// offered an admission, the admission stands (its capacity is held,
    /// and the client still waits for it).
    pub(crate) fn expire(&mut self, ticket: Ticket, now: Option<Instant>) -> Expiry {
        let now = self.gate_time(now);
        let Some(entry) = self.live(ticket) else {
            return Expiry::Stale;
        };
        if !matches!(entry.status, Status::Queued) {
            return Expiry::Decided;
        }
        let (bucket, demand, client) = (entry.bucket, entry.demand, entry.client_deadline);
        let (rung, tenant) = (entry.node.rung, entry.node.tenant);
        let (queue, entries) = self.queue_and_entries(bucket);
        queue.remove(entries, ticket.slot, false);
        self.entries.remove(ticket.slot);
        self.unqueue(bucket, demand, tenant, None);
        self.shrink_if_idle();
        let overloaded = self.reject(bucket, rung, RejectionReason::Deadline, client);
        // A head that leaves uncovers the next, which may fit.
        self.dequeue(now);
        Expiry::Rejected(overloaded, bucket.rank())
    }

    /// The waiter of `ticket` looks at its request. An offered admission is
    /// handed over (and counted as admitted) exactly once, with the payload;
    /// a request still waiting lends its payload (to store a waker).
    pub(crate) fn poll(&mut self, ticket: Ticket) -> Polled<'_, T> {
        let Some(entry) = self.live(ticket) else {
            return Polled::Stale;
        };
        if matches!(entry.status, Status::Queued) {
            return Polled::Waiting(&mut self.entries[ticket.slot].payload);
        }
        let entry = self.entries.remove(ticket.slot);
        self.shrink_if_idle();
        match entry.status {
            Status::Offered(grant) => {
                let key = self.current_bucket(grant.held);
                self.bucket_mut(key).tally.admitted_queue += 1;
                self.count_band(key, entry.node.rung, |band| band.admitted += 1);
                Polled::Admitted(grant, entry.payload)
            }
            Status::Displaced(overloaded) => Polled::Rejected(overloaded, entry.payload),
            Status::Queued => unreachable!("checked above"),
        }
    }

    /// The payload of the request of `ticket`, whatever became of it,
    /// unless the ticket is stale.
    pub(crate) fn payload_mut(&mut self, ticket: Ticket) -> Option<&mut T> {
        self.live(ticket)?;
        Some(&mut self.entries[ticket.slot].payload)
    }

    /// The request of `ticket` is cancelled. Still queued, it leaves its
    /// queue; already offered, the cancellation wins: the offered capacity
    /// is released and passes on to the next waiter. Either way the request
    /// counts as cancelled. Returns the rank the request was counted under
    /// (`None` when unranked), or `Err(())` for a stale ticket, which
    /// changes nothing.
    pub(crate) fn cancel(
        &mut self,
        ticket: Ticket,
        now: Option<Instant>,
    ) -> Result<Option<u32>, ()> {
        let now = self.gate_time(now);
        if self.live(ticket).is_none() {
            return Err(());
        }
        // The rank a live ticket's request is counted under (`None` when
        // unranked, or once its rank vanished).
        let rank = self.held_bucket_of(ticket.slot).rank();
        if matches!(self.entries[ticket.slot].status, Status::Queued) {
            let bucket = self.entries[ticket.slot].bucket;
            let (queue, entries) = self.queue_and_entries(bucket);
            queue.remove(entries, ticket.slot, false);
        }
        let entry = self.entries.remove(ticket.slot);
        match entry.status {
            Status::Queued => {
                self.unqueue(entry.bucket, entry.demand, entry.node.tenant, None);
                self.bucket_mut(entry.bucket).tally.cancelled += 1;
                // A queue head that leaves uncovers the next, which may be
                // smaller and fit where the head did not.
                self.dequeue(now);
            }
            Status::Offered(mut grant) => {
                let key = self.current_bucket(grant.held);
                self.bucket_mut(key).tally.cancelled += 1;
                self.release(&mut grant, true, now);
            }
            // Already counted as rejected; the waiter gave up before
            // hearing it.
            Status::Displaced(_) => {}
        }
        self.shrink_if_idle();
        Ok(rank)
    }

    /// The request produced its first generated token: its waiting capacity
    /// is released (once; later calls do nothing).
    pub(crate) fn first_token(&mut self, grant: &mut Grant, now: Option<Instant>) {
        let now = self.gate_time(now);
        self.release(grant, false, now);
    }

    /// The request's response ended (normally, with an error, or dropped):
    /// whatever the grant still holds is released.
    pub(crate) fn finish(&mut self, grant: &mut Grant, now: Option<Instant>) {
        let now = self.gate_time(now);
        self.release(grant, true, now);
    }

    /// The engine reports its capacity. Defaults follow it; explicit
    /// settings do not. Growth admits queued requests at once; shrinking
    /// revokes nothing. Queued requests of a vanished rank become unranked in
    /// age order, and capacity held on it moves to the unranked bucket.
    ///
    /// Returns `false` (and changes nothing) for a report of zero ranks or
    /// zero sequences.
    pub(crate) fn report_capacity(
        &mut self,
        capacity: EngineCapacity,
        now: Option<Instant>,
    ) -> bool {
        let now = self.gate_time(now);
        if let Some(reason) = capacity.invalid_reason() {
            tracing::warn!(?capacity, "ignoring engine capacity report: {reason}");
            return false;
        }
        let ranks = capacity.dp_ranks.min(u32::MAX as usize);
        let previously = if self.capacity.is_some() {
            self.active_ranks
        } else {
            0
        };
        self.capacity = Some(capacity);
        self.limits = self.config.limits_for(Some(capacity));
        if let Some(adaptive) = &mut self.adaptive {
            // The reported limit is the ceiling; the controller sets the
            // limit in force.
            adaptive.set_limit(self.limits.engine_request_waiting_limit);
            self.limits.engine_request_waiting_limit = adaptive.limit();
        }
        if ranks > self.buckets.ranks.len() {
            self.buckets.ranks.resize_with(ranks, Bucket::default);
        }
        for rank in ranks..previously {
            self.retire_rank(rank as u32);
        }
        self.active_ranks = ranks;
        self.unpark_all();
        self.dequeue(now);
        true
    }

    // ----- observation --------------------------------------------------

    /// Visits the payload of every request offered an admission since the
    /// last call, with the rank it is counted under, so the driver can wake
    /// its waiter.
    pub(crate) fn drain_offered(&mut self, mut visit: impl FnMut(Option<u32>, &mut T)) {
        if self.offered.is_empty() {
            return;
        }
        let mut offered = std::mem::take(&mut self.offered);
        for slot in offered.drain(..) {
            // An offered entry stays in the slab until polled or cancelled,
            // and neither can happen before the driver drains.
            let rank = self.held_bucket_of(slot).rank();
            visit(rank, &mut self.entries[slot].payload);
        }
        // A capacity jump can offer a whole queue at once; don't keep that
        // peak for ever.
        const KEEP: usize = 64;
        offered.shrink_to(KEEP);
        self.offered = offered;
    }

    /// Whether controlled delay shed a queued request since the last call:
    /// the tallies of the buckets of the offers changed.
    pub(crate) fn take_shed(&mut self) -> bool {
        std::mem::take(&mut self.shed)
    }

    /// Whether any request was offered an admission since the last drain.
    #[inline]
    pub(crate) fn has_offers(&self) -> bool {
        !self.offered.is_empty()
    }

    // ----- internals ----------------------------------------------------

    /// The entry of a ticket, unless the ticket is stale.
    fn live(&self, ticket: Ticket) -> Option<&Entry<T>> {
        self.entries
            .get(ticket.slot)
            .filter(|entry| entry.node.seq == ticket.seq)
    }

    /// Queues a request of `demand` in `key`'s queue at `(rung, tenant)`,
    /// at the gate's time `now`.
    fn enqueue(
        &mut self,
        key: BucketKey,
        demand: Demand,
        client_deadline: bool,
        (rung, tenant): (i64, Option<Tenant>),
        payload: T,
        now: Option<Instant>,
    ) -> Ticket {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.bucket(key).queue.is_empty() && self.keeps_time {
            // The queue starts to drain now, not at its last admission.
            self.bucket_mut(key).drain_mark = now;
        }
        let weight = tenant
            .and_then(|tenant| self.weights.get(&tenant).copied())
            .unwrap_or(1);
        // Fair shares are by tokens when the cost is known, else by requests.
        let service = demand.engine_tokens.max(1) as u64;
        let queued_at = now;
        let node = Node::new(seq, rung, tenant, service, weight, queued_at, &self.ladder);
        let slot = self.entries.insert(Entry {
            node,
            bucket: key,
            demand,
            client_deadline,
            status: Status::Queued,
            payload,
        });
        let (queue, entries) = self.queue_and_entries(key);
        queue.push(entries, slot);
        self.tenant_enqueue(tenant, now);
        for counts in self.total_and(key) {
            counts.queued += 1;
            counts.queued_tokens = counts.queued_tokens.saturating_add(demand.prompt_tokens);
        }
        Ticket { slot, seq }
    }

    /// Admits the first queue head in service order that fits, while one
    /// does (by default the oldest). Only heads are admitted: a small
    /// request never overtakes a large one queued before it in the same
    /// queue, so long prompts are never starved.
    #[inline]
    fn dequeue(&mut self, now: Option<Instant>) {
        // Controlled delay first: a request that waited too long in a
        // standing queue is shed, not admitted late.
        self.control_delay(now);
        if self.total.queued > 0 {
            self.dequeue_slow(now);
        }
    }

    fn dequeue_slow(&mut self, now: Option<Instant>) {
        // While every engine slot is taken no head fits, whatever its
        // demand: the heads are not looked for.
        while self.total.queued > 0 && !self.engine_full() {
            let mut first: Option<queue::Head> = None;
            let keys = std::iter::once(BucketKey::Unranked)
                .chain((0..self.recognised_ranks() as u32).map(BucketKey::Rank));
            for key in keys {
                let Some(head) = self.eligible_head(key, now) else {
                    continue;
                };
                if first.is_none_or(|first| head.before(&first))
                    && self.engine_fits(key, self.entries[head.slot].demand)
                {
                    first = Some(head);
                }
            }
            let Some(first) = first else { break };
            self.offer(first.slot, now);
        }
    }

    /// The first request of `key`'s queue in service order whose tenant
    /// has room: the flows of tenants at their engine limits are parked on
    /// the way (without tenant limits, the queue's head).
    #[inline]
    fn eligible_head(&mut self, key: BucketKey, now: Option<Instant>) -> Option<queue::Head> {
        loop {
            let bucket = self.buckets.get_mut(key);
            let head = bucket.queue.head(&self.entries, &self.ladder, now)?;
            if self.tenants.is_none() {
                return Some(head);
            }
            let entry = &self.entries[head.slot];
            if self.tenant_engine_fits(entry.node.tenant, entry.demand) {
                return Some(head);
            }
            self.park(key, head.slot);
        }
    }

    fn offer(&mut self, slot: Slot, now: Option<Instant>) {
        let key = self.entries[slot].bucket;
        let (queue, entries) = self.queue_and_entries(key);
        queue.remove(entries, slot, true);
        let demand = self.entries[slot].demand;
        let tenant = self.entries[slot].node.tenant;
        self.unqueue(key, demand, tenant, now);
        if let Some(now) = now {
            self.bucket_mut(key).drained_at(now);
        }
        let mut grant = self.charge(key, demand, AdmitSource::Queue, now);
        grant.tenant = self.tenant_charge(tenant, demand);
        self.entries[slot].status = Status::Offered(grant);
        self.offered.push(slot);
    }

    /// Gives back the slab's memory once nothing waits, so a burst of queued
    /// (or cancelled) requests does not pin its peak size for ever.
    fn shrink_if_idle(&mut self) {
        // Room for reuse is kept by size, not by count: 14 KiB, about 60
        // entries.
        const KEEP_BYTES: usize = 14 * 1024;
        let keep = KEEP_BYTES / std::mem::size_of::<Entry<T>>().max(1);
        if self.entries.is_empty() && self.entries.capacity() > keep {
            self.entries = Slab::with_capacity(keep);
        }
    }
}

#[cfg(test)]
mod adaptive_tests;
#[cfg(test)]
mod observe_tests;
#[cfg(test)]
mod qos_model_tests;
#[cfg(test)]
mod qos_tests;
#[cfg(test)]
mod shutdown_tests;
#[cfg(test)]
mod slot_tests;
#[cfg(test)]
mod tenant_tests;
#[cfg(test)]
mod tests;
