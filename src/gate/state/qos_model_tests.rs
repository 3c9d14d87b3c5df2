//! The queue discipline of behaviour §8 against a reference model: random
//! event sequences (arrivals of every band and tenant, releases,
//! cancellations, time passing) run through the state and through a model
//! that finds the next request to serve by scanning every queued request;
//! after every event the offers, displacements and counts must agree.

use std::collections::BTreeMap;

use proptest::prelude::*;

use std::time::Duration;

use super::qos_tests::{class, tenant_a, tenant_b};
use super::*;
use crate::gate::types::Cost;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    Admitted { waiting: bool },
    Done,
}

#[derive(Debug, Clone)]
struct Req {
    seq: u64,
    rung: i64,
    tenant: Option<Tenant>,
    step: u128,
    prompt: usize,
    queued_at: Instant,
    phase: Phase,
}

#[derive(Debug, Clone, Default)]
struct ModelBand {
    virtual_time: u128,
    /// Per backlogged tenant: the start tag of its head.
    flows: BTreeMap<Option<Tenant>, u128>,
}

#[derive(Debug, Clone)]
struct Model {
    engine_limit: usize,
    queue_limit: usize,
    token_limit: Option<usize>,
    aging: Option<Duration>,
    weights: Vec<(Tenant, u32)>,
    reqs: Vec<Req>,
    bands: BTreeMap<i64, ModelBand>,
    now: Instant,
    /// The start of the run: no request is older.
    start: Instant,
    displaced: u64,
}

const SCALE: u128 = 720_720 * (1 << 32);

impl Model {
    fn queued(&self) -> impl Iterator<Item = (usize, &Req)> {
        self.reqs
            .iter()
            .enumerate()
            .filter(|(_, req)| req.phase == Phase::Queued)
    }

    fn engine_fits(&self, prompt: usize) -> bool {
        let running = self
            .reqs
            .iter()
            .filter(|req| matches!(req.phase, Phase::Admitted { .. }))
            .count();
        let waiting_tokens: usize = self
            .reqs
            .iter()
            .filter(|req| req.phase == (Phase::Admitted { waiting: true }))
            .map(|req| req.prompt)
            .sum();
        running < self.engine_limit
            && match self.token_limit {
                None => true,
                Some(limit) => {
                    prompt == 0 || waiting_tokens == 0 || waiting_tokens + prompt <= limit
                }
            }
    }

    fn weight_of(&self, tenant: Option<Tenant>) -> u32 {
        self.weights
            .iter()
            .find(|(t, _)| Some(*t) == tenant)
            .map_or(1, |(_, w)| *w)
    }

    /// How far a band stands, its oldest request queued at `at`: its rung
    /// plus the intervals waited, counted in nanoseconds of the interval
    /// (higher goes first). The same at any time for any two bands.
    fn risen_nanos(&self, rung: i64, at: Instant) -> i128 {
        match self.aging {
            Some(interval) => {
                // How far it will have risen by any common time, less the
                // same constant for every band: the time queued after the
                // run's start counts against it.
                let queued_late = at.duration_since(self.start).as_nanos() as i128;
                i128::from(rung) * interval.as_nanos() as i128 - queued_late
            }
            None => i128::from(rung),
        }
    }

    /// The next request to serve: the band standing highest (ties: the
    /// band with the oldest request), then the flow head of the smallest
    /// start tag (ties: the older).
    fn head(&self) -> Option<usize> {
        let mut best: Option<(i128, u64, i64)> = None; // (standing, oldest seq, rung)
        for &rung in self.bands.keys() {
            let oldest = self
                .queued()
                .filter(|(_, req)| req.rung == rung)
                .min_by_key(|(_, req)| req.seq)?;
            let risen = self.risen_nanos(rung, oldest.1.queued_at);
            if best.is_none_or(|(r, s, _)| {
                (risen, std::cmp::Reverse(oldest.1.seq)) > (r, std::cmp::Reverse(s))
            }) {
                best = Some((risen, oldest.1.seq, rung));
            }
        }
        let (_, _, rung) = best?;
        let band = &self.bands[&rung];
        self.queued()
            .filter(|(_, req)| req.rung == rung)
            .filter(|(_, req)| {
                // Only the oldest of each tenant is its flow's head.
                !self.queued().any(|(_, other)| {
                    other.rung == rung && other.tenant == req.tenant && other.seq < req.seq
                })
            })
            .min_by_key(|(_, req)| (band.flows[&req.tenant], req.seq))
            .map(|(i, _)| i)
    }

    fn push(&mut self, i: usize) {
        let (rung, tenant) = (self.reqs[i].rung, self.reqs[i].tenant);
        let band = self.bands.entry(rung).or_default();
        let vt = band.virtual_time;
        // A tenant new to the band, or back after it emptied, starts at the
        // band's clock.
        band.flows.entry(tenant).or_insert(vt);
    }

    /// Request `i` leaves the queue (already re-phased); `served` charges
    /// its flow and advances the band's clock.
    fn leave(&mut self, i: usize, served: bool) {
        let req = self.reqs[i].clone();
        if !self.queued().any(|(_, other)| other.rung == req.rung) {
            self.bands.remove(&req.rung);
            return;
        }
        let was_head = !self.queued().any(|(_, other)| {
            other.rung == req.rung && other.tenant == req.tenant && other.seq < req.seq
        });
        // The weight of the band's backlogged tenants, this one included.
        let mut backlogged: Vec<Option<Tenant>> = self
            .queued()
            .filter(|(_, other)| other.rung == req.rung)
            .map(|(_, other)| other.tenant)
            .collect();
        backlogged.push(req.tenant);
        backlogged.sort();
        backlogged.dedup();
        let total_weight: u128 = backlogged
            .iter()
            .map(|&tenant| u128::from(self.weight_of(tenant)))
            .sum();
        let weight = u128::from(self.weight_of(req.tenant));
        let still_queued = self
            .queued()
            .any(|(_, other)| other.rung == req.rung && other.tenant == req.tenant);
        let band = self.bands.get_mut(&req.rung).unwrap();
        if was_head && served {
            let start = band.flows[&req.tenant];
            band.virtual_time = (band.virtual_time + req.step * weight / total_weight).max(start);
            // Its next request starts where this one finished.
            band.flows.insert(req.tenant, start + req.step);
        }
        if !still_queued {
            band.flows.remove(&req.tenant);
        }
    }

    fn dequeue(&mut self) -> Vec<usize> {
        let mut offered = Vec::new();
        while let Some(head) = self.head() {
            if !self.engine_fits(self.reqs[head].prompt) {
                break;
            }
            self.reqs[head].phase = Phase::Admitted { waiting: true };
            self.leave(head, true);
            offered.push(head);
        }
        offered
    }
}

#[derive(Debug, Clone)]
enum Op {
    Arrive {
        priority: i32,
        tenant: u8,
        prompt: usize,
    },
    FirstToken(usize),
    Finish(usize),
    Cancel(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (-1i32..3, 0u8..3, prop_oneof![Just(0usize), 1usize..8]).prop_map(|(priority, tenant, prompt)| Op::Arrive { priority, tenant, prompt: prompt * 100 }),
        2 => any::<usize>().prop_map(Op::FirstToken),
        2 => any::<usize>().prop_map(Op::Finish),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => (1u64..1500).prop_map(Op::Advance),
    ]
}

fn tenant_of(code: u8) -> Option<Tenant> {
    match code {
        0 => None,
        1 => Some(tenant_a()),
        _ => Some(tenant_b()),
    }
}

/// What the state says, per request of the model.
enum Held {
    Queued(Ticket),
    Granted(Grant),
    Gone,
}

fn run(ops: Vec<Op>, aging: bool, tokens: bool) -> Result<(), TestCaseError> {
    let start = Instant::now();
    let mut config = AdmissionConfig::new()
        .engine_request_limit(2)
        .request_queue_limit(4)
        .tenant_weight("a", 3);
    if aging {
        config = config.aging_interval(Duration::from_secs(1));
    }
    if tokens {
        config = config.engine_waiting_token_limit(1000);
    }
    let mut state: State<usize> = State::new(config);
    let mut model = Model {
        engine_limit: 2,
        queue_limit: 4,
        token_limit: tokens.then_some(1000),
        aging: aging.then(|| Duration::from_secs(1)),
        weights: vec![(tenant_a(), 3)],
        reqs: Vec::new(),
        bands: BTreeMap::new(),
        now: start,
        start,
        displaced: 0,
    };
    let mut held: Vec<Held> = Vec::new();
    let mut seq = 0u64;
    for op in ops {
        let mut expected_offers = Vec::new();
        match op {
            Op::Arrive {
                priority,
                tenant,
                prompt,
            } => {
                let tenant = tenant_of(tenant);
                let weight = model.weight_of(tenant);
                let i = model.reqs.len();
                let demand = Demand::of(Cost::prompt(prompt));
                model.reqs.push(Req {
                    seq,
                    rung: i64::from(priority),
                    tenant,
                    step: (demand.engine_tokens.max(1) as u128) * SCALE / u128::from(weight),
                    prompt,
                    queued_at: model.now,
                    phase: Phase::Done,
                });
                // Would it be first if it joined the queue?
                let mut trial = model.clone();
                trial.reqs[i].phase = Phase::Queued;
                trial.push(i);
                let leads = trial.head() == Some(i);
                let queued = model.queued().count();
                let arrival = state.arrive_as(
                    None,
                    demand,
                    None,
                    class(priority, tenant),
                    i,
                    Some(model.now),
                );
                if leads && model.engine_fits(prompt) {
                    model.reqs[i].phase = Phase::Admitted { waiting: true };
                    let Arrival::Admitted(grant) = arrival else {
                        return Err(TestCaseError::fail(format!(
                            "{i}: expected admitted, got {arrival:?}"
                        )));
                    };
                    held.push(Held::Granted(grant));
                    continue;
                }
                let victim = (queued >= model.queue_limit).then(|| {
                    model
                        .queued()
                        .filter(|(_, req)| req.rung < i64::from(priority))
                        .min_by_key(|(_, req)| (req.rung, std::cmp::Reverse(req.seq)))
                        .map(|(j, _)| j)
                });
                match victim {
                    Some(None) => {
                        let Arrival::Rejected(overloaded) = arrival else {
                            return Err(TestCaseError::fail(format!(
                                "{i}: expected rejected, got {arrival:?}"
                            )));
                        };
                        prop_assert_eq!(overloaded.reason(), RejectionReason::QueueFull);
                        held.push(Held::Gone);
                        continue;
                    }
                    Some(Some(victim)) => {
                        model.reqs[victim].phase = Phase::Done;
                        model.leave(victim, false);
                        model.displaced += 1;
                        expected_offers.push(victim);
                    }
                    None => {}
                }
                seq += 1;
                model.reqs[i].seq = seq - 1;
                model.reqs[i].phase = Phase::Queued;
                model.push(i);
                let Arrival::Queued(ticket, _) = arrival else {
                    return Err(TestCaseError::fail(format!(
                        "{i}: expected queued, got {arrival:?}"
                    )));
                };
                held.push(Held::Queued(ticket));
                expected_offers.extend(model.dequeue());
            }
            Op::FirstToken(pick) | Op::Finish(pick) => {
                let granted: Vec<usize> = (0..held.len())
                    .filter(|&i| matches!(held[i], Held::Granted(_)))
                    .collect();
                if granted.is_empty() {
                    continue;
                }
                let i = granted[pick % granted.len()];
                let Held::Granted(grant) = &mut held[i] else {
                    unreachable!()
                };
                // Only an event that releases capacity looks at the queue
                // again: a second first token or finish changes nothing,
                // even where aging has reordered the queue meanwhile.
                let before = model.reqs[i].phase;
                if matches!(op, Op::Finish(_)) {
                    state.finish(grant, Some(model.now));
                    model.reqs[i].phase = Phase::Done;
                } else {
                    state.first_token(grant, Some(model.now));
                    if before == (Phase::Admitted { waiting: true }) {
                        model.reqs[i].phase = Phase::Admitted { waiting: false };
                    }
                }
                if model.reqs[i].phase != before {
                    expected_offers.extend(model.dequeue());
                }
            }
            Op::Cancel(pick) => {
                let queued: Vec<usize> = model.queued().map(|(i, _)| i).collect();
                if queued.is_empty() {
                    continue;
                }
                let i = queued[pick % queued.len()];
                let Held::Queued(ticket) = held[i] else {
                    unreachable!()
                };
                state.cancel(ticket, Some(model.now)).unwrap();
                held[i] = Held::Gone;
                model.reqs[i].phase = Phase::Done;
                model.leave(i, false);
                expected_offers.extend(model.dequeue());
            }
            Op::Advance(ms) => {
                model.now += Duration::from_millis(ms);
            }
        }
        // The offers (admissions and displacements) agree, in order.
        let mut offers = Vec::new();
        state.drain_offered(|_, &mut i| offers.push(i));
        prop_assert_eq!(&offers, &expected_offers);
        for i in offers {
            let Held::Queued(ticket) = held[i] else {
                unreachable!()
            };
            held[i] = match state.poll(ticket) {
                Polled::Admitted(grant, _) => Held::Granted(grant),
                Polled::Rejected(overloaded, _) => {
                    prop_assert_eq!(overloaded.reason(), RejectionReason::Displaced);
                    Held::Gone
                }
                other => return Err(TestCaseError::fail(format!("{i}: {other:?}"))),
            };
        }
        prop_assert_eq!(state.view().total().queued, model.queued().count());
        prop_assert_eq!(state.view().tally().displaced(), model.displaced);
        // The request queued longest, for the oldest-age gauge, with its
        // arrival time when the gate keeps time (with aging).
        let oldest = model.queued().min_by_key(|(_, req)| req.seq);
        prop_assert_eq!(
            state.view().oldest_queued(None).map(|(at, &i)| (at, i)),
            oldest.map(|(i, req)| (aging.then_some(req.queued_at), i))
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_discipline_agrees_with_the_reference_model(
        ops in prop::collection::vec(op(), 1..120),
        aging in any::<bool>(),
        tokens in any::<bool>(),
    ) {
        run(ops, aging, tokens)?;
    }
}
