//! The state machine against a deliberately simple reference model.
//!
//! The model keeps a flat list of requests and recomputes every count by
//! scanning it; "the oldest queued request that fits" is found by trying
//! every queued request in arrival order. Random event sequences run through
//! both, and after every event the decisions, the counts of every bucket,
//! the tallies and the offers must agree.

use proptest::prelude::*;

use std::time::{Duration, Instant};

use super::*;
use crate::gate::types::{Cost, RejectionScope, Tally};

/// A state with one engine slot, taken by a request (of priority 0) that
/// holds it until `finish`ed; `queue` places behind it. Shared by the unit
/// tests of the queue discipline and of observation.
pub(super) fn busy(config: AdmissionConfig, queue: usize) -> (State<&'static str>, Grant) {
    busy_at(config, queue, None)
}

/// [`busy`], the slot taken at `now`.
pub(super) fn busy_at(
    config: AdmissionConfig,
    queue: usize,
    now: Option<Instant>,
) -> (State<&'static str>, Grant) {
    let mut state = State::new(config.engine_request_limit(1).request_queue_limit(queue));
    let Arrival::Admitted(holder) = state.arrive(None, Demand::default(), None, "running", now)
    else {
        panic!("the first request is admitted")
    };
    (state, holder)
}

// The unit tests speak in demands and classes; the driver describes a
// request with a `Descriptor` (`State::receive`).
impl<T> State<T> {
    /// A request arrives at `now`, asking for `rank`, needing `demand`,
    /// with the client's own `deadline` (from arrival), if any; for the
    /// unit tests, which speak in demands.
    pub(super) fn arrive(
        &mut self,
        rank: Option<u32>,
        demand: Demand,
        deadline: Option<Duration>,
        payload: T,
        now: Option<Instant>,
    ) -> Arrival {
        self.arrive_as(rank, demand, deadline, Class::default(), payload, now)
    }

    /// [`arrive`](Self::arrive) for a request of a class of service.
    pub(super) fn arrive_as(
        &mut self,
        rank: Option<u32>,
        demand: Demand,
        deadline: Option<Duration>,
        class: Class,
        payload: T,
        now: Option<Instant>,
    ) -> Arrival {
        let mut descriptor = Descriptor::new()
            .with_rank(rank)
            .with_priority(class.priority);
        descriptor.tenant = class.tenant;
        descriptor.deadline = deadline;
        let bucket = self.recognise(rank);
        self.arrive_in(bucket, &descriptor, demand, payload, now)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    /// Holding capacity; `waiting` until the first token.
    Admitted {
        waiting: bool,
    },
    Done,
}

#[derive(Debug, Clone)]
struct ModelRequest {
    seq: u64,
    /// Counted under this rank, `None` when unranked.
    bucket: Option<u32>,
    cost: Cost,
    phase: Phase,
}

#[derive(Debug)]
struct Model {
    config: AdmissionConfig,
    capacity: Option<EngineCapacity>,
    requests: Vec<ModelRequest>,
    tally: Tally,
}

/// The token fit rule, written out again for the model: a request of no
/// tokens, or one facing an empty budget, always fits.
fn model_tokens_fit(used: usize, cost: usize, limit: Option<usize>) -> bool {
    match limit {
        None => true,
        Some(limit) => cost == 0 || used == 0 || used + cost <= limit,
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Admitted,
    Queued,
    Rejected(RejectionScope),
}

impl Model {
    fn new(config: AdmissionConfig) -> Self {
        Model {
            capacity: config.capacity,
            config,
            requests: Vec::new(),
            tally: Tally::default(),
        }
    }

    fn ranks(&self) -> u32 {
        self.capacity.map_or(0, |c| c.dp_ranks as u32)
    }

    fn combined_ranks(&self) -> usize {
        self.capacity.map_or(1, |c| c.dp_ranks)
    }

    fn limits(&self) -> Limits {
        self.config.limits_for(self.capacity)
    }

    /// Counts over every request (`None`) or over one bucket.
    fn counts(&self, bucket: Option<Option<u32>>) -> Counts {
        let mut counts = Counts::default();
        for request in &self.requests {
            if bucket.is_some_and(|bucket| bucket != request.bucket) {
                continue;
            }
            let (prompt, engine) = (request.cost.prompt_tokens, request.cost.engine_tokens());
            match request.phase {
                Phase::Queued => {
                    counts.queued += 1;
                    counts.queued_tokens += prompt;
                }
                Phase::Admitted { waiting } => {
                    counts.engine_requests += 1;
                    counts.engine_tokens += engine;
                    if waiting {
                        counts.engine_waiting += 1;
                        counts.engine_waiting_tokens += prompt;
                    }
                }
                Phase::Done => {}
            }
        }
        counts
    }

    fn engine_fits(&self, bucket: Option<u32>, cost: Cost) -> bool {
        let limits = self.limits();
        let fits = |counts: Counts, n: usize| {
            counts.engine_requests < n * limits.engine_request_limit
                && counts.engine_waiting < n * limits.engine_request_waiting_limit
                && model_tokens_fit(
                    counts.engine_waiting_tokens,
                    cost.prompt_tokens,
                    limits.engine_waiting_token_limit.map(|l| n * l),
                )
                && model_tokens_fit(
                    counts.engine_tokens,
                    cost.engine_tokens(),
                    limits.engine_token_limit.map(|l| n * l),
                )
        };
        fits(self.counts(None), self.combined_ranks())
            && (bucket.is_none() || fits(self.counts(Some(bucket)), 1))
    }

    fn queue_fits(&self, bucket: Option<u32>, cost: Cost) -> bool {
        let limits = self.limits();
        let fits = |counts: Counts, n: usize| {
            counts.queued < n * limits.request_queue_limit
                && model_tokens_fit(
                    counts.queued_tokens,
                    cost.prompt_tokens,
                    limits.request_queue_token_limit.map(|l| n * l),
                )
        };
        fits(self.counts(None), self.combined_ranks())
            && (bucket.is_none() || fits(self.counts(Some(bucket)), 1))
    }

    /// Whether `id` is queued with nobody older queued in its bucket.
    fn is_head(&self, id: usize) -> bool {
        let request = &self.requests[id];
        request.phase == Phase::Queued
            && !self.requests.iter().any(|other| {
                other.phase == Phase::Queued
                    && other.bucket == request.bucket
                    && other.seq < request.seq
            })
    }

    fn queue_empty(&self, bucket: Option<u32>) -> bool {
        self.counts(Some(bucket)).queued == 0
    }

    fn accepts(&self, bucket: Option<u32>) -> bool {
        let plain = Cost::default();
        (self.queue_empty(bucket) && self.engine_fits(bucket, plain))
            || self.queue_fits(bucket, plain)
    }

    fn arrive(&mut self, rank: Option<u32>, cost: Cost) -> (usize, Decision) {
        let bucket = rank.filter(|&rank| rank < self.ranks());
        self.tally.received += 1;
        let seq = self.requests.len() as u64;
        let decision = if self.queue_empty(bucket) && self.engine_fits(bucket, cost) {
            self.tally.admitted_direct += 1;
            Decision::Admitted
        } else if self.queue_fits(bucket, cost) {
            Decision::Queued
        } else {
            self.reject(bucket, false)
        };
        let phase = match decision {
            Decision::Admitted => Phase::Admitted { waiting: true },
            Decision::Queued => Phase::Queued,
            Decision::Rejected(_) => Phase::Done,
        };
        self.requests.push(ModelRequest {
            seq,
            bucket,
            cost,
            phase,
        });
        (self.requests.len() - 1, decision)
    }

    /// Counts a rejection of a request of `bucket` (for its deadline when
    /// `expired`) and decides its scope.
    fn reject(&mut self, bucket: Option<u32>, expired: bool) -> Decision {
        let others = self.accepts(None)
            || (0..self.ranks())
                .filter(|&other| Some(other) != bucket)
                .any(|other| self.accepts(Some(other)));
        let scope = match bucket {
            Some(rank) if others => RejectionScope::Rank(rank),
            _ => RejectionScope::Worker,
        };
        match scope {
            RejectionScope::Rank(_) => {
                self.tally.rejected_rank += 1;
                self.tally.expired_rank += u64::from(expired);
            }
            RejectionScope::Worker => {
                self.tally.rejected_worker += 1;
                self.tally.expired_worker += u64::from(expired);
            }
            RejectionScope::Tenant => unreachable!("the model limits no tenant"),
        }
        Decision::Rejected(scope)
    }

    /// Admits the oldest queue head that fits, while one does; returns who
    /// was admitted, in order.
    fn dequeue(&mut self) -> Vec<usize> {
        let mut admitted = Vec::new();
        loop {
            let next = (0..self.requests.len())
                .filter(|&id| self.is_head(id))
                .filter(|&id| {
                    let request = &self.requests[id];
                    self.engine_fits(request.bucket, request.cost)
                })
                .min_by_key(|&id| self.requests[id].seq);
            let Some(id) = next else { break };
            self.requests[id].phase = Phase::Admitted { waiting: true };
            admitted.push(id);
        }
        admitted
    }

    fn first_token(&mut self, id: usize) {
        if let Phase::Admitted { .. } = self.requests[id].phase {
            self.requests[id].phase = Phase::Admitted { waiting: false };
        }
    }

    fn finish(&mut self, id: usize) {
        self.requests[id].phase = Phase::Done;
    }

    fn report(&mut self, capacity: EngineCapacity) {
        if capacity.dp_ranks == 0 || capacity.max_num_seqs == 0 {
            return;
        }
        self.capacity = Some(capacity);
        let ranks = self.ranks();
        for request in &mut self.requests {
            if request.bucket.is_some_and(|rank| rank >= ranks) {
                request.bucket = None;
            }
        }
    }

    /// Whether a limit is exceeded beyond what the rules allow: a token
    /// budget may be exceeded only by one request alone.
    fn over_limits(&self) -> bool {
        let limits = self.limits();
        let over =
            |bucket: Option<Option<u32>>, scale: usize| {
                let counts = self.counts(bucket);
                let holders = |tokens: fn(&ModelRequest) -> usize| {
                    self.requests
                        .iter()
                        .filter(|request| bucket.is_none_or(|bucket| bucket == request.bucket))
                        .filter(|request| tokens(request) > 0)
                        .count()
                };
                let tokens_over = |used: usize, limit: Option<usize>, tokens| {
                    limit.is_some_and(|limit| used > scale * limit && holders(tokens) > 1)
                };
                counts.engine_requests > scale * limits.engine_request_limit
                    || counts.engine_waiting > scale * limits.engine_request_waiting_limit
                    || counts.queued > scale * limits.request_queue_limit
                    || tokens_over(
                        counts.engine_waiting_tokens,
                        limits.engine_waiting_token_limit,
                        |r| match r.phase {
                            Phase::Admitted { waiting: true } => r.cost.prompt_tokens,
                            _ => 0,
                        },
                    )
                    || tokens_over(counts.engine_tokens, limits.engine_token_limit, |r| match r
                        .phase
                    {
                        Phase::Admitted { .. } => r.cost.engine_tokens(),
                        _ => 0,
                    })
                    || tokens_over(
                        counts.queued_tokens,
                        limits.request_queue_token_limit,
                        |r| match r.phase {
                            Phase::Queued => r.cost.prompt_tokens,
                            _ => 0,
                        },
                    )
            };
        over(None, self.combined_ranks()) || (0..self.ranks()).any(|rank| over(Some(Some(rank)), 1))
    }
}

#[derive(Debug, Clone)]
enum Op {
    Arrive(Option<u32>, Cost),
    /// The `n`th admitted request (modulo their number) sees a first token.
    FirstToken(usize),
    /// The `n`th admitted request's response ends.
    Finish(usize),
    /// The `n`th queued request is cancelled.
    Cancel(usize),
    /// The `n`th queued request's wait budget runs out.
    Expire(usize),
    Report(EngineCapacity),
    /// The next offer is cancelled before its waiter polls.
    CancelNextOffer,
}

fn op() -> impl Strategy<Value = Op> {
    let rank = prop_oneof![Just(None), (0u32..4).prop_map(Some), Just(Some(7))];
    let cost = prop_oneof![
        2 => Just(Cost::default()),
        3 => (0usize..12, proptest::option::of(0usize..8))
            .prop_map(|(prompt, output)| Cost::new(prompt, output)),
    ];
    prop_oneof![
        6 => (rank, cost).prop_map(|(rank, cost)| Op::Arrive(rank, cost)),
        3 => any::<usize>().prop_map(Op::FirstToken),
        3 => any::<usize>().prop_map(Op::Finish),
        2 => any::<usize>().prop_map(Op::Cancel),
        1 => any::<usize>().prop_map(Op::Expire),
        1 => (0usize..4, 0usize..4)
            .prop_map(|(seqs, ranks)| Op::Report(EngineCapacity::new(seqs, ranks))),
        1 => Just(Op::CancelNextOffer),
    ]
}

/// An `AdmissionConfig` builder method that sets one limit.
type Limit = fn(AdmissionConfig, usize) -> AdmissionConfig;

fn config() -> impl Strategy<Value = AdmissionConfig> {
    (
        proptest::option::of(1usize..4),
        proptest::option::of(1usize..4),
        proptest::option::of(0usize..4),
        proptest::option::of((1usize..4, 1usize..4)),
        (
            proptest::option::of(1usize..16),
            proptest::option::of(1usize..24),
            proptest::option::of(1usize..16),
        ),
    )
        .prop_map(|(requests, waiting, queue, capacity, tokens)| {
            let (waiting_tokens, engine_tokens, queued_tokens) = tokens;
            let limits: [(Option<usize>, Limit); 6] = [
                (requests, AdmissionConfig::engine_request_limit),
                (waiting, AdmissionConfig::engine_request_waiting_limit),
                (queue, AdmissionConfig::request_queue_limit),
                (waiting_tokens, AdmissionConfig::engine_waiting_token_limit),
                (engine_tokens, AdmissionConfig::engine_token_limit),
                (queued_tokens, AdmissionConfig::request_queue_token_limit),
            ];
            let mut config = AdmissionConfig::new();
            if let Some((seqs, ranks)) = capacity {
                config = config.capacity(EngineCapacity::new(seqs, ranks));
            }
            limits
                .into_iter()
                .fold(config, |config, (limit, set)| match limit {
                    Some(n) => set(config, n),
                    None => config,
                })
        })
}

/// The state under test, driven like the gate drives it, beside the model.
struct Harness {
    state: State<usize>,
    model: Model,
    tickets: Vec<Option<Ticket>>,
    grants: Vec<Option<Grant>>,
    cancel_next_offer: bool,
    /// A shrinking report may leave counts above the new limits.
    shrunk: bool,
}

impl Harness {
    fn new(config: AdmissionConfig) -> Self {
        Harness {
            state: State::new(config.clone()),
            model: Model::new(config),
            tickets: Vec::new(),
            grants: Vec::new(),
            cancel_next_offer: false,
            shrunk: false,
        }
    }

    fn ids(&self, phase: impl Fn(Phase) -> bool) -> Vec<usize> {
        (0..self.model.requests.len())
            .filter(|&id| phase(self.model.requests[id].phase))
            .collect()
    }

    /// Hands offers over to their waiters (or cancels them, as told), in
    /// both the state and the model, until nothing more is admitted.
    fn settle(&mut self) {
        loop {
            let expected = self.model.dequeue();
            let mut offered = Vec::new();
            self.state.drain_offered(|_, &mut id| offered.push(id));
            assert_eq!(offered, expected, "offers differ");
            if offered.is_empty() {
                return;
            }
            for id in offered {
                let ticket = self.tickets[id].take().expect("offered while queued");
                if std::mem::take(&mut self.cancel_next_offer) {
                    self.state.cancel(ticket, None).expect("a live ticket");
                    self.model.finish(id);
                    self.model.tally.cancelled += 1;
                } else {
                    let Polled::Admitted(grant, _) = self.state.poll(ticket) else {
                        panic!("an offered ticket polls as admitted");
                    };
                    self.model.tally.admitted_queue += 1;
                    self.grants[id] = Some(grant);
                }
            }
        }
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Arrive(rank, cost) => {
                let (id, expected) = self.model.arrive(rank, cost);
                let arrival = self.state.arrive(rank, Demand::of(cost), None, id, None);
                self.tickets.push(None);
                self.grants.push(None);
                let decision = match arrival {
                    Arrival::Admitted(grant) => {
                        assert_eq!(grant.rank(), self.model.requests[id].bucket);
                        self.grants[id] = Some(grant);
                        Decision::Admitted
                    }
                    Arrival::Queued(ticket, _) => {
                        assert!(matches!(self.state.poll(ticket), Polled::Waiting(_)));
                        self.tickets[id] = Some(ticket);
                        Decision::Queued
                    }
                    Arrival::Rejected(overloaded) => {
                        assert_eq!(overloaded.reason(), RejectionReason::QueueFull);
                        Decision::Rejected(overloaded.scope())
                    }
                };
                assert_eq!(
                    decision, expected,
                    "decision for a request of rank {rank:?}"
                );
            }
            Op::FirstToken(n) => {
                let admitted = self.ids(|phase| matches!(phase, Phase::Admitted { .. }));
                if let Some(&id) = admitted.get(n % admitted.len().max(1)) {
                    let grant = self.grants[id].as_mut().unwrap();
                    self.state.first_token(grant, None);
                    assert!(!grant.is_waiting());
                    self.model.first_token(id);
                }
            }
            Op::Finish(n) => {
                let admitted = self.ids(|phase| matches!(phase, Phase::Admitted { .. }));
                if let Some(&id) = admitted.get(n % admitted.len().max(1)) {
                    let mut grant = self.grants[id].take().unwrap();
                    self.state.finish(&mut grant, None);
                    assert!(grant.is_released());
                    self.state.finish(&mut grant, None); // a second end releases nothing
                    self.state.first_token(&mut grant, None); // nor does a late token
                    self.model.finish(id);
                }
            }
            Op::Cancel(n) => {
                let queued = self.ids(|phase| phase == Phase::Queued);
                if let Some(&id) = queued.get(n % queued.len().max(1)) {
                    let ticket = self.tickets[id].take().unwrap();
                    let rank = self.state.cancel(ticket, None).expect("a live ticket");
                    assert_eq!(rank, self.model.requests[id].bucket);
                    self.model.finish(id);
                    self.model.tally.cancelled += 1;
                }
            }
            Op::Expire(n) => {
                let queued = self.ids(|phase| phase == Phase::Queued);
                if let Some(&id) = queued.get(n % queued.len().max(1)) {
                    let ticket = self.tickets[id].take().unwrap();
                    let bucket = self.model.requests[id].bucket;
                    self.model.finish(id);
                    let expected = self.model.reject(bucket, true);
                    let Expiry::Rejected(overloaded, rank) = self.state.expire(ticket, None) else {
                        panic!("a queued request expires");
                    };
                    assert_eq!(rank, bucket);
                    assert_eq!(overloaded.reason(), RejectionReason::Deadline);
                    assert_eq!(Decision::Rejected(overloaded.scope()), expected);
                    assert!(matches!(self.state.expire(ticket, None), Expiry::Stale));
                }
            }
            Op::Report(capacity) => {
                let before = self.model.limits();
                let ranks_before = self.model.ranks();
                self.state.report_capacity(capacity, None);
                self.model.report(capacity);
                let after = self.model.limits();
                if after.engine_request_limit < before.engine_request_limit
                    || after.engine_request_waiting_limit < before.engine_request_waiting_limit
                    || after.request_queue_limit < before.request_queue_limit
                    || self.model.ranks() < ranks_before
                {
                    self.shrunk = true;
                }
            }
            Op::CancelNextOffer => self.cancel_next_offer = true,
        }
        self.settle();
        self.check();
    }

    fn check(&mut self) {
        let model = &self.model;
        assert_eq!(
            self.state.view().total(),
            model.counts(None),
            "total counts"
        );
        assert_eq!(
            self.state.view().unranked_counts(),
            model.counts(Some(None)),
            "unranked counts"
        );
        let ranks: Vec<Counts> = self.state.view().rank_counts().collect();
        let expected: Vec<Counts> = (0..model.ranks())
            .map(|rank| model.counts(Some(Some(rank))))
            .collect();
        assert_eq!(ranks, expected, "rank counts");
        assert_eq!(self.state.view().tally(), model.tally, "tallies");
        if model.over_limits() {
            assert!(
                self.shrunk,
                "a limit was exceeded without a shrinking report"
            );
        } else {
            self.shrunk = false;
        }
        for (id, request) in model.requests.iter().enumerate() {
            if model.is_head(id) {
                assert!(
                    !model.engine_fits(request.bucket, request.cost),
                    "a queue head fits"
                );
            }
        }
    }

    /// Ends every admitted request, letting the queue drain into the engine.
    fn finish_everything(&mut self) {
        while !self
            .ids(|phase| matches!(phase, Phase::Admitted { .. }))
            .is_empty()
        {
            self.step(Op::Finish(0));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_state_machine_agrees_with_the_reference_model(
        config in config(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let mut harness = Harness::new(config);
        for op in ops {
            harness.step(op);
        }
        harness.finish_everything();
        prop_assert_eq!(harness.state.view().total(), Counts::default());
        prop_assert_eq!(harness.state.view().pending(), 0);
        let tally = harness.state.view().tally();
        prop_assert_eq!(tally.received, tally.settled());
        prop_assert_eq!(
            tally.received,
            tally.admitted_direct + tally.admitted_queue + tally.rejected() + tally.cancelled
        );
    }
}
