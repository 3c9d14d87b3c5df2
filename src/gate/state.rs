//! The sans-IO admission state machine (SPEC §2, §3, §5 capacity changes,
//! §7 token budgets).
//!
//! `State` knows nothing of futures, locks, clocks or HTTP. It takes events —
//! an arrival, a first token, the end of a response, a cancellation, a
//! capacity report — and answers with decisions: admitted, queued under a
//! [`Ticket`], or rejected with a [`RejectionScope`]. Queued requests that
//! become admitted are *offered*: they hold their engine capacity from that
//! moment, and the driver (the [`Gate`](crate::Gate)) learns of them through
//! [`State::drain_offered`] and wakes whoever waits on them.
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
//! runs alone. Each bucket's [`Queue`] orders its requests by class of
//! service (SPEC §8: bands, tenants' fair shares, aging); with the default
//! class — one band, no tenant — it is FIFO by arrival.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use slab::Slab;

use self::queue::{Ladder, Node, Nodes, Queue};
use super::observe::{BandView, BucketView};
use super::types::{
    AdmitSource, BandTally, Cost, Counts, Overloaded, RejectionReason, RejectionScope, Tally,
    Tenant,
};
use crate::config::{AdmissionConfig, EngineCapacity, Limits, LimitsInForce};

mod queue;

/// Identifies a queued request while it waits: its slot in the entry slab
/// and its arrival number. The arrival number is the slot's generation: a
/// stale ticket (one whose request already left) never matches the request
/// that reuses its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    slot: usize,
    seq: u64,
}

/// Which capacity a request is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BucketKey {
    Unranked,
    Rank(u32),
}

/// Where a grant's capacity is counted. The generation tells a grant made on
/// a rank that has since vanished (its counts moved to the unranked bucket)
/// from one made on the same rank number after it reappeared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    bucket: BucketKey,
    generation: u32,
}

/// What one request needs: one engine request slot and one waiting slot
/// always, and its tokens where token limits are set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Demand {
    /// Prompt tokens: held in the queue and, once admitted, until waiting
    /// ends.
    prompt_tokens: usize,
    /// Prompt plus maximum output tokens: held from admission until the
    /// response ends.
    engine_tokens: usize,
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

/// A moving average that weighs the latest sample by a fifth.
fn moving_average(average: Option<f64>, sample: f64) -> f64 {
    const WEIGHT: f64 = 0.2;
    match average {
        Some(average) => average + WEIGHT * (sample - average),
        None => sample,
    }
}

/// Whether `cost` more tokens fit a budget of which `used` are taken. An
/// empty budget takes anything: a request larger than the whole budget runs
/// alone rather than never. A request of no tokens does not draw on the
/// budget, so it is never held back by it.
fn tokens_fit(used: usize, cost: usize, limit: Option<usize>) -> bool {
    match limit {
        None => true,
        Some(limit) => cost == 0 || used == 0 || used.saturating_add(cost) <= limit,
    }
}

/// Capacity held by one admitted request. Dropping a `Grant` without
/// passing it to [`State::finish`] leaks its capacity: the driver wraps it in
/// an RAII type.
#[derive(Debug)]
pub(crate) struct Grant {
    held: Held,
    demand: Demand,
    /// When it was admitted, if the gate keeps time.
    admitted_at: Option<Instant>,
    rank: Option<u32>,
    source: AdmitSource,
    holds_request: bool,
    holds_waiting: bool,
}

impl Grant {
    /// The rank the request was admitted on (`None` when unranked).
    pub(crate) fn rank(&self) -> Option<u32> {
        self.rank
    }

    pub(crate) fn source(&self) -> AdmitSource {
        self.source
    }

    /// Whether the grant still holds waiting capacity.
    pub(crate) fn is_waiting(&self) -> bool {
        self.holds_waiting
    }

    /// Whether the grant still holds anything.
    pub(crate) fn is_released(&self) -> bool {
        !self.holds_request && !self.holds_waiting
    }
}

/// The gate's answer to an arrival.
#[derive(Debug)]
pub(crate) enum Arrival {
    /// Admitted at once; the grant holds its capacity.
    Admitted(Grant),
    /// Waiting in a queue, until the instant its queue wait budget ends, if
    /// it has one. Poll it with [`State::poll`], cancel it with
    /// [`State::cancel`], expire it with [`State::expire`].
    Queued(Ticket, Option<Instant>),
    /// Rejected: its queue was full, or it could not be admitted within its
    /// queue wait budget.
    Rejected(Overloaded),
}

/// What became of a request whose queue wait budget ran out.
#[derive(Debug)]
pub(crate) enum Expiry {
    /// It left the queue, rejected for its deadline; counted under this
    /// rank (`None`: unranked).
    Rejected(Overloaded, Option<u32>),
    /// It had been offered an admission, or displaced, already: that
    /// decision stands.
    Decided,
    /// The ticket is stale.
    Stale,
}

/// The state of a queued request, as seen by its waiter.
#[derive(Debug)]
pub(crate) enum Polled<'a, T> {
    /// Admitted from the queue; the ticket is spent and its payload given
    /// back.
    Admitted(Grant, T),
    /// Displaced from its queue (counted as rejected already); the ticket is
    /// spent and its payload given back.
    Rejected(Overloaded, T),
    /// Still queued (or offered, when the offer has not been drained yet).
    Waiting(&'a mut T),
    /// The ticket is stale: its request already left the queue.
    Stale,
}

/// A position in the entry slab; queues link entries by slot.
type Slot = usize;

/// A request's class of service (SPEC §8): its priority and tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Class {
    pub(crate) priority: i32,
    pub(crate) tenant: Option<Tenant>,
}

#[derive(Debug, Default)]
struct Bucket {
    counts: Counts,
    queue: Queue,
    tally: Tally,
    /// Tallies per configured priority band, by rung; empty (and never
    /// allocated) unless bands are configured.
    bands: Vec<BandTally>,
    generation: u32,
    /// The last queue admission, or when the queue last became non-empty:
    /// the start of the interval the next queue admission ends.
    drain_mark: Option<Instant>,
    /// Mean time between queue admissions while the queue is not empty
    /// (seconds, a moving average): how fast it drains.
    drain_interval: Option<f64>,
}

#[derive(Debug)]
enum Status {
    /// Waiting in its bucket's queue.
    Queued,
    /// Admitted from the queue; the waiter has not taken the grant yet.
    Offered(Grant),
    /// Displaced from a full queue; the waiter has not heard yet.
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
    capacity: Option<EngineCapacity>,
    limits: Limits,
    /// Ranks currently recognised; 1 (and nothing recognised) until reported.
    active_ranks: usize,
    /// Every rank ever reported; `ranks[active_ranks..]` are vanished, kept
    /// for their generation counter.
    ranks: Vec<Bucket>,
    unranked: Bucket,
    total: Counts,
    entries: Slab<Entry<T>>,
    next_seq: u64,
    /// Slots offered since the driver last looked.
    offered: Vec<Slot>,
    /// Events so far, to order observations.
    events: u64,
    /// Whether the gate keeps time (deadlines are on); then `now` is the
    /// time of the event being applied.
    timed: bool,
    now: Option<Instant>,
    /// Mean engine waiting time (admission to first token or completion),
    /// seconds, a moving average.
    mean_wait: Option<f64>,
    /// Priority bands and aging.
    ladder: Ladder,
    /// Tenant weights other than 1.
    weights: HashMap<Tenant, u32>,
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
            config,
            capacity: None,
            active_ranks: 1,
            ranks: Vec::new(),
            unranked: Bucket::default(),
            total: Counts::default(),
            entries: Slab::new(),
            next_seq: 0,
            offered: Vec::new(),
            events: 0,
            timed: false,
            now: None,
            mean_wait: None,
            ladder,
            weights,
        };
        state.timed = state.config.deadlines_enabled();
        if let Some(capacity) = capacity {
            state.report_capacity(capacity);
        }
        state
    }

    // ----- events -------------------------------------------------------

    /// The time of the events that follow, for a gate that keeps time.
    pub(crate) fn advance(&mut self, now: Instant) {
        self.now = Some(now);
    }

    /// The time the last [`advance`](Self::advance) gave, when the gate
    /// keeps time: the time of the event just applied, if the driver
    /// advanced for it.
    pub(crate) fn event_time(&self) -> Option<Instant> {
        self.now.filter(|_| self.timed)
    }

    /// A request arrives, asking for `rank` (`None`, or a rank this worker
    /// does not recognise, makes it unranked), needing `demand`, with the
    /// client's own `deadline` (from arrival), if any.
    #[cfg(test)]
    pub(crate) fn arrive(
        &mut self,
        rank: Option<u32>,
        demand: Demand,
        deadline: Option<Duration>,
        payload: T,
    ) -> Arrival {
        self.arrive_as(rank, demand, deadline, Class::default(), payload)
    }

    /// [`arrive`](Self::arrive) for a request of a class of service: it is
    /// admitted at once only if the limits have room and nothing queued
    /// goes before it in service order; into a full queue it may displace
    /// the newest requests of lower bands.
    pub(crate) fn arrive_as(
        &mut self,
        rank: Option<u32>,
        demand: Demand,
        deadline: Option<Duration>,
        class: Class,
        payload: T,
    ) -> Arrival {
        let bucket = self.recognise(rank);
        self.bucket_mut(bucket).tally.received += 1;
        let rung = self.ladder.rung(class.priority);
        let now = self.now;
        let queue = match bucket {
            BucketKey::Unranked => &mut self.unranked.queue,
            BucketKey::Rank(rank) => &mut self.ranks[rank as usize].queue,
        };
        let leads = queue.is_empty()
            || queue.would_lead(&self.entries, &self.ladder, now, rung, class.tenant);
        if leads && self.engine_fits(bucket, demand) {
            let grant = self.charge(bucket, demand, AdmitSource::Direct);
            self.bucket_mut(bucket).tally.admitted_direct += 1;
            self.count_band(bucket, rung, |band| band.admitted += 1);
            return Arrival::Admitted(grant);
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
        let budget = self.budget(deadline);
        if let Some((budget, client)) = budget {
            if self
                .predicted_wait(bucket, rung)
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
            self.displace(victim);
        }
        let expires_at = budget.and_then(|(budget, _)| self.now?.checked_add(budget));
        let client = budget.is_some_and(|(_, client)| client);
        let ticket = self.enqueue(bucket, demand, client, class, rung, payload);
        if displaced || self.ladder_ages() {
            // A displaced head uncovers the next, and aging reorders heads.
            self.dequeue();
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
    /// as displaced; its waiter hears of it when the driver drains.
    fn displace(&mut self, slot: Slot) {
        let key = self.entries[slot].bucket;
        let demand = self.entries[slot].demand;
        let rung = self.entries[slot].node.rung;
        let (queue, entries) = self.queue_and_entries(key);
        queue.remove(entries, slot, false);
        self.unqueue(key, demand);
        let overloaded = self.reject(key, rung, RejectionReason::Displaced, false);
        self.entries[slot].status = Status::Displaced(overloaded);
        self.offered.push(slot);
    }

    /// Counts into the tally of band `rung` of `key`'s bucket, when bands
    /// are configured (otherwise there are no band tallies: priorities are
    /// unbounded, and so would be the tallies).
    #[inline]
    fn count_band(&mut self, key: BucketKey, rung: i64, count: impl FnOnce(&mut BandTally)) {
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

    /// Whether waiting requests' bands rise with time.
    fn ladder_ages(&self) -> bool {
        self.ladder.ages()
    }

    /// Counts a rejection of a request of `bucket` that arrived in band
    /// `rung`, and says whom it concerns.
    fn reject(
        &mut self,
        bucket: BucketKey,
        rung: i64,
        reason: RejectionReason,
        client: bool,
    ) -> Overloaded {
        self.count_band(bucket, rung, |band| band.rejected += 1);
        let scope = self.rejection_scope(bucket);
        let expired = u64::from(reason == RejectionReason::Deadline);
        let displaced = u64::from(reason == RejectionReason::Displaced);
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
            }
        }
        Overloaded {
            scope,
            reason,
            client_deadline: client,
        }
    }

    /// A request's queue wait budget, the smallest of the client's own
    /// deadline, the queue wait limit, and the time-to-first-token objective
    /// less the mean engine waiting time; and whether the client's deadline
    /// is the smallest. A gate that keeps no time honours the client's
    /// deadline alone (the driver then gives the arrival its time).
    fn budget(&self, deadline: Option<Duration>) -> Option<(Duration, bool)> {
        let mut budget = deadline.map(|deadline| (deadline, true));
        if !self.timed {
            // Only the client's deadline, timed from this arrival.
            return budget.filter(|_| self.now.is_some());
        }
        let mut consider = |server: Duration| {
            if budget.is_none_or(|(smallest, _)| server < smallest) {
                budget = Some((server, false));
            }
        };
        if let Some(limit) = self.config.request_queue_wait_limit {
            consider(limit);
        }
        if let Some(objective) = self.config.ttft_objective {
            let waiting = Duration::from_secs_f64(self.mean_wait.unwrap_or(0.0));
            consider(objective.saturating_sub(waiting));
        }
        budget
    }

    /// How long a request joining `bucket`'s queue at `rung` now would
    /// wait: the requests ahead of it (those of its band and higher ones;
    /// lower bands wait behind it) and itself, at the rate the queue has
    /// drained. `None` before a rate has been measured.
    fn predicted_wait(&self, bucket: BucketKey, rung: i64) -> Option<Duration> {
        let bucket = self.bucket(bucket);
        let interval = bucket.drain_interval?;
        let ahead = bucket.queue.at_or_above(rung) as f64;
        Some(Duration::from_secs_f64((ahead + 1.0) * interval))
    }

    /// The queue wait budget of the request of `ticket` ran out. Still
    /// queued, it leaves its queue and is rejected for its deadline; already
    /// offered an admission, the admission stands (its capacity is held,
    /// and the client still waits for it).
    pub(crate) fn expire(&mut self, ticket: Ticket) -> Expiry {
        let Some(entry) = self.live(ticket) else {
            return Expiry::Stale;
        };
        if !matches!(entry.status, Status::Queued) {
            return Expiry::Decided;
        }
        let (bucket, demand, client) = (entry.bucket, entry.demand, entry.client_deadline);
        let rung = entry.node.rung;
        let (queue, entries) = self.queue_and_entries(bucket);
        queue.remove(entries, ticket.slot, false);
        self.entries.remove(ticket.slot);
        self.unqueue(bucket, demand);
        self.shrink_if_idle();
        let overloaded = self.reject(bucket, rung, RejectionReason::Deadline, client);
        // A head that leaves uncovers the next, which may fit.
        self.dequeue();
        Expiry::Rejected(overloaded, self.label(bucket))
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

    /// The request of `ticket` is cancelled. Still queued, it leaves its
    /// queue; already offered, the cancellation wins: the offered capacity
    /// is released and passes on to the next waiter. Either way the request
    /// counts as cancelled. Returns the rank the request was counted under
    /// (`None` when unranked), or `Err(())` for a stale ticket, which
    /// changes nothing.
    pub(crate) fn cancel(&mut self, ticket: Ticket) -> Result<Option<u32>, ()> {
        if self.live(ticket).is_none() {
            return Err(());
        }
        let rank = self.ticket_rank(ticket);
        if matches!(self.entries[ticket.slot].status, Status::Queued) {
            let bucket = self.entries[ticket.slot].bucket;
            let (queue, entries) = self.queue_and_entries(bucket);
            queue.remove(entries, ticket.slot, false);
        }
        let entry = self.entries.remove(ticket.slot);
        match entry.status {
            Status::Queued => {
                self.unqueue(entry.bucket, entry.demand);
                self.bucket_mut(entry.bucket).tally.cancelled += 1;
                // A queue head that leaves uncovers the next, which may be
                // smaller and fit where the head did not.
                self.dequeue();
            }
            Status::Offered(mut grant) => {
                self.bucket_of_held_mut(grant.held).tally.cancelled += 1;
                self.release(&mut grant, true);
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
    pub(crate) fn first_token(&mut self, grant: &mut Grant) {
        self.release(grant, false);
    }

    /// The request's response ended (normally, with an error, or dropped):
    /// whatever the grant still holds is released.
    pub(crate) fn finish(&mut self, grant: &mut Grant) {
        self.release(grant, true);
    }

    /// The engine reports its capacity. Defaults follow it; explicit
    /// settings do not. Growth admits queued requests at once; shrinking
    /// revokes nothing. Queued requests of a vanished rank become unranked in
    /// age order, and capacity held on it moves to the unranked bucket.
    ///
    /// Returns `false` (and changes nothing) for a report of zero ranks or
    /// zero sequences.
    pub(crate) fn report_capacity(&mut self, capacity: EngineCapacity) -> bool {
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
        if ranks > self.ranks.len() {
            self.ranks.resize_with(ranks, Bucket::default);
        }
        for rank in ranks..previously {
            self.retire_rank(rank as u32);
        }
        self.active_ranks = ranks;
        self.dequeue();
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
            let rank = self.label(self.held_bucket_of(slot));
            visit(rank, &mut self.entries[slot].payload);
        }
        // A capacity jump can offer a whole queue at once; don't keep that
        // peak for ever.
        const KEEP: usize = 64;
        offered.shrink_to(KEEP);
        self.offered = offered;
    }

    /// Whether any request was offered an admission since the last drain.
    #[inline]
    pub(crate) fn has_offers(&self) -> bool {
        !self.offered.is_empty()
    }

    /// The rank a live ticket's request is counted under (`None` when
    /// unranked, or once its rank vanished).
    fn ticket_rank(&self, ticket: Ticket) -> Option<u32> {
        self.label(self.held_bucket_of(ticket.slot))
    }

    /// The rank a grant's capacity is counted under now (`None` once its
    /// rank vanished, or when unranked).
    pub(crate) fn grant_rank(&self, grant: &Grant) -> Option<u32> {
        self.label(self.current_bucket(grant.held))
    }

    /// The rank requests for `rank` are counted under right now.
    pub(crate) fn recognised(&self, rank: Option<u32>) -> Option<u32> {
        self.label(self.recognise(rank))
    }

    /// Counts and tally of the bucket of a recognised rank (`None`: the
    /// unranked requests), for observers.
    ///
    /// The age of its oldest queued request is left out (`None`): the
    /// state keeps no clock. The driver measures it from
    /// [`oldest_queued`](Self::oldest_queued) once it has left its lock.
    #[inline]
    pub(crate) fn view(&self, rank: Option<u32>) -> BucketView {
        let bucket = match rank {
            Some(rank) => &self.ranks[rank as usize],
            None => &self.unranked,
        };
        BucketView {
            rank,
            counts: bucket.counts,
            tally: bucket.tally,
            bands: self.band_views(bucket),
            oldest_wait: None,
        }
    }

    /// Every rank ever recognised, vanished ones included (they keep their
    /// tallies): observers see `0..known_ranks()`.
    pub(crate) fn known_ranks(&self) -> usize {
        self.ranks.len()
    }

    /// Each configured band of `bucket`, lowest first: its queued requests
    /// and its tally. `None` without configured bands.
    #[inline]
    fn band_views(&self, bucket: &Bucket) -> Option<Box<[BandView]>> {
        let configured = self.ladder.configured_bands();
        if configured == 0 {
            return None;
        }
        Some(self.configured_band_views(bucket, configured))
    }

    fn configured_band_views(&self, bucket: &Bucket, configured: usize) -> Box<[BandView]> {
        let mut bands = vec![BandView::default(); configured];
        for (band, tally) in bands.iter_mut().zip(&bucket.bands) {
            band.tally = *tally;
        }
        // With bands configured, a rung is the index of its band.
        for (rung, queued) in bucket.queue.band_lengths() {
            bands[rung as usize].queued = queued;
        }
        bands.into_boxed_slice()
    }

    /// The request that has waited longest in the queue of a recognised
    /// rank's bucket (`None`: the unranked requests), if any is queued:
    /// when it was queued, if the gate keeps time, and its payload (where
    /// a driver that does not keep time may have noted its arrival).
    #[inline]
    pub(crate) fn oldest_queued(&self, rank: Option<u32>) -> Option<(Option<Instant>, &T)> {
        let bucket = match rank {
            Some(rank) => &self.ranks[rank as usize],
            None => &self.unranked,
        };
        if bucket.queue.is_empty() {
            return None;
        }
        let slot = bucket.queue.oldest(&self.entries)?;
        let entry = &self.entries[slot];
        Some((entry.node.queued_at, &entry.payload))
    }

    /// Numbers the event just applied, for observers: later events get
    /// higher numbers.
    pub(crate) fn next_event(&mut self) -> u64 {
        self.events += 1;
        self.events
    }

    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    pub(crate) fn capacity(&self) -> Option<EngineCapacity> {
        self.capacity
    }

    /// The limits in force, per rank and combined, with their sources.
    pub(crate) fn limits_in_force(&self) -> LimitsInForce {
        LimitsInForce {
            per_rank: self.limits,
            ranks: self.recognised_ranks().max(1),
            capacity: self.capacity,
            sources: self.config.sources,
        }
    }

    /// The ranks currently recognised (0 before the first report).
    pub(crate) fn recognised_ranks(&self) -> usize {
        if self.capacity.is_some() {
            self.active_ranks
        } else {
            0
        }
    }

    pub(crate) fn total(&self) -> Counts {
        self.total
    }

    pub(crate) fn unranked_counts(&self) -> Counts {
        self.unranked.counts
    }

    pub(crate) fn rank_counts(&self) -> impl Iterator<Item = Counts> + '_ {
        self.active_buckets().map(|bucket| bucket.counts)
    }

    pub(crate) fn unranked_tally(&self) -> Tally {
        self.unranked.tally
    }

    /// Tallies of every rank ever recognised, active or vanished.
    pub(crate) fn rank_tallies(&self) -> impl Iterator<Item = Tally> + '_ {
        self.ranks.iter().map(|bucket| bucket.tally)
    }

    pub(crate) fn tally(&self) -> Tally {
        let mut tally = self.unranked.tally;
        for bucket in &self.ranks {
            tally.add(&bucket.tally);
        }
        tally
    }

    /// Queued requests plus offers not yet handed over.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.entries.len()
    }

    // ----- internals ----------------------------------------------------

    /// The entry of a ticket, unless the ticket is stale.
    fn live(&self, ticket: Ticket) -> Option<&Entry<T>> {
        self.entries
            .get(ticket.slot)
            .filter(|entry| entry.node.seq == ticket.seq)
    }

    fn label(&self, key: BucketKey) -> Option<u32> {
        match key {
            BucketKey::Unranked => None,
            BucketKey::Rank(rank) => Some(rank),
        }
    }

    /// The bucket a live entry is counted in: its queue's, or, once
    /// offered, its grant's.
    fn held_bucket_of(&self, slot: Slot) -> BucketKey {
        let entry = &self.entries[slot];
        match &entry.status {
            Status::Queued | Status::Displaced(_) => entry.bucket,
            Status::Offered(grant) => self.current_bucket(grant.held),
        }
    }

    fn recognise(&self, rank: Option<u32>) -> BucketKey {
        match rank {
            Some(rank) if self.capacity.is_some() && (rank as usize) < self.active_ranks => {
                BucketKey::Rank(rank)
            }
            _ => BucketKey::Unranked,
        }
    }

    fn bucket(&self, key: BucketKey) -> &Bucket {
        match key {
            BucketKey::Unranked => &self.unranked,
            BucketKey::Rank(rank) => &self.ranks[rank as usize],
        }
    }

    fn bucket_mut(&mut self, key: BucketKey) -> &mut Bucket {
        match key {
            BucketKey::Unranked => &mut self.unranked,
            BucketKey::Rank(rank) => &mut self.ranks[rank as usize],
        }
    }

    /// The worker's total and a bucket's counts, to change both alike.
    fn total_and(&mut self, key: BucketKey) -> [&mut Counts; 2] {
        let bucket = match key {
            BucketKey::Unranked => &mut self.unranked,
            BucketKey::Rank(rank) => &mut self.ranks[rank as usize],
        };
        [&mut self.total, &mut bucket.counts]
    }

    fn active_buckets(&self) -> impl Iterator<Item = &Bucket> + '_ {
        self.ranks.iter().take(if self.capacity.is_some() {
            self.active_ranks
        } else {
            0
        })
    }

    /// The bucket a grant's capacity is counted in now: its own rank's, or
    /// the unranked one if that rank vanished since.
    fn current_bucket(&self, held: Held) -> BucketKey {
        match held.bucket {
            BucketKey::Rank(rank)
                if (rank as usize) < self.active_ranks
                    && self.ranks[rank as usize].generation == held.generation =>
            {
                held.bucket
            }
            _ => BucketKey::Unranked,
        }
    }

    fn bucket_of_held_mut(&mut self, held: Held) -> &mut Bucket {
        let key = self.current_bucket(held);
        self.bucket_mut(key)
    }

    /// Whether `demand` fits the engine limits of `key`'s rank (if ranked)
    /// and the combined ones.
    fn engine_fits(&self, key: BucketKey, demand: Demand) -> bool {
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

    /// Whether `demand` fits the queue limits of `key`'s rank (if ranked)
    /// and the combined ones.
    fn queue_fits(&self, key: BucketKey, demand: Demand) -> bool {
        self.queue_fits_after(key, demand, &Counts::default())
    }

    /// Whether `demand` would fit the queue limits of `key`'s rank (if
    /// ranked) and the combined ones once the `freed` queued requests of
    /// `key` left.
    fn queue_fits_after(&self, key: BucketKey, demand: Demand, freed: &Counts) -> bool {
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
    fn accepts(&self, key: BucketKey) -> bool {
        let plain = Demand::default();
        (self.bucket(key).queue.is_empty() && self.engine_fits(key, plain))
            || self.queue_fits(key, plain)
    }

    /// A rejection names the rank while the worker could still admit or
    /// queue some other request; otherwise the whole worker is overloaded.
    /// Unranked rejections are always worker-scoped.
    fn rejection_scope(&self, rejected: BucketKey) -> RejectionScope {
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

    /// Counts `demand` against `key` and returns the grant holding it.
    fn charge(&mut self, key: BucketKey, demand: Demand, source: AdmitSource) -> Grant {
        for counts in self.total_and(key) {
            counts.engine_requests += 1;
            counts.engine_waiting += 1;
            counts.engine_tokens = counts.engine_tokens.saturating_add(demand.engine_tokens);
            counts.engine_waiting_tokens = counts
                .engine_waiting_tokens
                .saturating_add(demand.prompt_tokens);
        }
        let (rank, generation) = match key {
            BucketKey::Unranked => (None, 0),
            BucketKey::Rank(rank) => (Some(rank), self.ranks[rank as usize].generation),
        };
        Grant {
            held: Held {
                bucket: key,
                generation,
            },
            demand,
            admitted_at: if self.timed { self.now } else { None },
            rank,
            source,
            holds_request: true,
            holds_waiting: true,
        }
    }

    /// Releases the waiting capacity of `grant`, and with `finished` its
    /// request capacity too; whatever was already released is not released
    /// again. Freed capacity goes to the queue at once.
    fn release(&mut self, grant: &mut Grant, finished: bool) {
        let waiting = std::mem::take(&mut grant.holds_waiting);
        let request = finished && std::mem::take(&mut grant.holds_request);
        if !waiting && !request {
            return;
        }
        if waiting {
            if let (Some(admitted_at), Some(now)) = (grant.admitted_at, self.now) {
                let waited = now.saturating_duration_since(admitted_at).as_secs_f64();
                self.mean_wait = Some(moving_average(self.mean_wait, waited));
            }
        }
        let key = self.current_bucket(grant.held);
        let demand = grant.demand;
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
        self.dequeue();
    }

    /// Takes a request of `demand` off `key`'s queue counts.
    fn unqueue(&mut self, key: BucketKey, demand: Demand) {
        for counts in self.total_and(key) {
            counts.queued -= 1;
            counts.queued_tokens = counts.queued_tokens.saturating_sub(demand.prompt_tokens);
        }
    }

    fn enqueue(
        &mut self,
        key: BucketKey,
        demand: Demand,
        client_deadline: bool,
        class: Class,
        rung: i64,
        payload: T,
    ) -> Ticket {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.bucket(key).queue.is_empty() && self.timed {
            // The queue starts to drain now, not at its last admission.
            self.bucket_mut(key).drain_mark = self.now;
        }
        let weight = class
            .tenant
            .and_then(|tenant| self.weights.get(&tenant).copied())
            .unwrap_or(1);
        // Fair shares are by tokens when the cost is known, else by requests.
        let service = demand.engine_tokens.max(1) as u64;
        let queued_at = if self.timed { self.now } else { None };
        let node = Node::new(
            seq,
            rung,
            class.tenant,
            service,
            weight,
            queued_at,
            &self.ladder,
        );
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
        for counts in self.total_and(key) {
            counts.queued += 1;
            counts.queued_tokens = counts.queued_tokens.saturating_add(demand.prompt_tokens);
        }
        Ticket { slot, seq }
    }

    /// A bucket's queue and the entries it links, to change both.
    fn queue_and_entries(&mut self, key: BucketKey) -> (&mut Queue, &mut Slab<Entry<T>>) {
        let bucket = match key {
            BucketKey::Unranked => &mut self.unranked,
            BucketKey::Rank(rank) => &mut self.ranks[rank as usize],
        };
        (&mut bucket.queue, &mut self.entries)
    }

    /// Admits the first queue head in service order that fits, while one
    /// does (by default the oldest). Only heads are admitted: a small
    /// request never overtakes a large one queued before it in the same
    /// queue, so long prompts are never starved.
    #[inline]
    fn dequeue(&mut self) {
        if self.total.queued > 0 {
            self.dequeue_slow();
        }
    }

    fn dequeue_slow(&mut self) {
        let now = self.now;
        while self.total.queued > 0 {
            let mut first: Option<queue::Head> = None;
            let keys = std::iter::once(BucketKey::Unranked)
                .chain((0..self.recognised_ranks() as u32).map(BucketKey::Rank));
            for key in keys {
                let bucket = match key {
                    BucketKey::Unranked => &mut self.unranked,
                    BucketKey::Rank(rank) => &mut self.ranks[rank as usize],
                };
                let Some(head) = bucket.queue.head(&self.entries, &self.ladder, now) else {
                    continue;
                };
                if first.is_none_or(|first| head.before(&first))
                    && self.engine_fits(key, self.entries[head.slot].demand)
                {
                    first = Some(head);
                }
            }
            let Some(first) = first else { break };
            self.offer(first.slot);
        }
    }

    fn offer(&mut self, slot: Slot) {
        let key = self.entries[slot].bucket;
        let (queue, entries) = self.queue_and_entries(key);
        queue.remove(entries, slot, true);
        let demand = self.entries[slot].demand;
        self.unqueue(key, demand);
        if let Some(now) = self.now.filter(|_| self.timed) {
            let bucket = self.bucket_mut(key);
            if let Some(mark) = bucket.drain_mark {
                let interval = now.saturating_duration_since(mark).as_secs_f64();
                bucket.drain_interval = Some(moving_average(bucket.drain_interval, interval));
            }
            bucket.drain_mark = Some(now);
        }
        let grant = self.charge(key, demand, AdmitSource::Queue);
        self.entries[slot].status = Status::Offered(grant);
        self.offered.push(slot);
    }

    /// A rank vanished: capacity held on it and its queue move to the
    /// unranked bucket; the queue merges into the unranked queue by age.
    fn retire_rank(&mut self, rank: u32) {
        let bucket = &mut self.ranks[rank as usize];
        let counts = std::mem::take(&mut bucket.counts);
        let mut queue = std::mem::take(&mut bucket.queue);
        bucket.generation = bucket.generation.wrapping_add(1);
        self.unranked.counts.add(&counts);

        let mut moved = queue.take_all(&self.entries);
        if moved.is_empty() {
            return;
        }
        // Requeue both queues together in arrival order; fair shares start
        // afresh.
        moved.append(&mut self.unranked.queue.take_all(&self.entries));
        moved.sort_by_key(|&slot| self.entries[slot].node.seq);
        for slot in moved {
            self.entries[slot].bucket = BucketKey::Unranked;
            self.unranked.queue.push(&mut self.entries, slot);
        }
    }

    /// Gives back the slab's memory once nothing waits, so a burst of queued
    /// (or cancelled) requests does not pin its peak size for ever.
    fn shrink_if_idle(&mut self) {
        const KEEP: usize = 64;
        if self.entries.is_empty() && self.entries.capacity() > KEEP {
            self.entries = Slab::with_capacity(KEEP);
        }
    }
}

#[cfg(test)]
mod observe_tests;
#[cfg(test)]
mod qos_tests;
#[cfg(test)]
mod tests;
