//! The gate's lock-free lane (plain unranked requests while nothing is
//! queued) changes no decision: random sequences of plain and costed
//! arrivals, first tokens, completions and cancellations, through the
//! public API, agree step by step with a reference model of behaviour §2 (two
//! engine limits, a bounded FIFO queue, direct admission only while
//! nothing waits). Plain requests take the lane whenever it is open,
//! costed ones always the lock, so every interleaving of the two paths is
//! drawn.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use proptest::prelude::*;
use tower_admission::{
    Acquire, AdmissionConfig, AdmitSource, Cost, Descriptor, Gate, Permit, RejectionScope,
};

#[derive(Debug, Clone)]
enum Op {
    /// A request arrives: plain (the lane may take it) or with a cost (it
    /// goes through the lock).
    Arrive { costed: bool },
    /// The admitted request at this index (modulo) sees its first token.
    FirstToken(usize),
    /// The admitted request at this index ends.
    Finish(usize),
    /// The queued request at this index is cancelled.
    Cancel(usize),
    /// A snapshot is taken (folding the lane into the state mid-run).
    Snapshot,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<bool>().prop_map(|costed| Op::Arrive { costed }),
        2 => any::<usize>().prop_map(Op::FirstToken),
        3 => any::<usize>().prop_map(Op::Finish),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => Just(Op::Snapshot),
    ]
}

/// behaviour §2 (and §7's waiting token budget) for unranked requests: what
/// the gate must decide.
#[derive(Debug, Default)]
struct Model {
    requests: usize,
    waiting: usize,
    waiting_tokens: Option<usize>,
    queue_limit: usize,
    /// Admitted requests, oldest first: whether each is still waiting, and
    /// its prompt tokens.
    admitted: Vec<(bool, usize)>,
    /// Queued requests, by id, oldest first, with their prompt tokens.
    queued: VecDeque<(u64, usize)>,
    received: u64,
    admitted_direct: u64,
    admitted_queue: u64,
    rejected: u64,
    cancelled: u64,
}

impl Model {
    fn waiting_now(&self) -> (usize, usize) {
        let waiting = self.admitted.iter().filter(|(waiting, _)| *waiting);
        (
            waiting.clone().count(),
            waiting.map(|(_, prompt)| prompt).sum(),
        )
    }

    /// Whether a request of `prompt` tokens fits the engine now; a budget
    /// holding nothing takes any request, and one of no tokens never waits
    /// for the budget.
    fn fits(&self, prompt: usize) -> bool {
        let (waiting, tokens) = self.waiting_now();
        self.admitted.len() < self.requests
            && waiting < self.waiting
            && self
                .waiting_tokens
                .is_none_or(|limit| prompt == 0 || tokens == 0 || tokens + prompt <= limit)
    }

    /// An arrival: admitted, queued, or rejected.
    fn arrive(&mut self, id: u64, prompt: usize) -> Decision {
        self.received += 1;
        if self.queued.is_empty() && self.fits(prompt) {
            self.admitted_direct += 1;
            self.admitted.push((true, prompt));
            Decision::Admitted
        } else if self.queued.len() < self.queue_limit {
            self.queued.push_back((id, prompt));
            Decision::Queued
        } else {
            self.rejected += 1;
            Decision::Rejected
        }
    }

    /// Freed capacity goes to the oldest waiters that fit; returns their ids.
    fn dequeue(&mut self) -> Vec<u64> {
        let mut offered = Vec::new();
        while let Some(&(id, prompt)) = self.queued.front() {
            if !self.fits(prompt) {
                break;
            }
            self.queued.pop_front();
            offered.push(id);
            self.admitted.push((true, prompt));
            self.admitted_queue += 1;
        }
        offered
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Admitted,
    Queued,
    Rejected,
}

/// Polls a queued request once.
fn poll(acquire: &mut Acquire) -> Poll<Result<Permit, tower_admission::Overloaded>> {
    Pin::new(acquire).poll(&mut Context::from_waker(Waker::noop()))
}

fn check(gate: &Gate, model: &Model) -> Result<(), TestCaseError> {
    let snapshot = gate.snapshot();
    let (waiting, tokens) = model.waiting_now();
    prop_assert_eq!(snapshot.total.engine_requests, model.admitted.len());
    prop_assert_eq!(snapshot.total.engine_waiting, waiting);
    prop_assert_eq!(snapshot.total.engine_waiting_tokens, tokens);
    prop_assert_eq!(snapshot.total.queued, model.queued.len());
    prop_assert_eq!(snapshot.unranked, snapshot.total);
    let tally = snapshot.tally;
    prop_assert_eq!(tally.received, model.received);
    prop_assert_eq!(tally.admitted_direct, model.admitted_direct);
    prop_assert_eq!(tally.admitted_queue, model.admitted_queue);
    prop_assert_eq!(tally.rejected_worker, model.rejected);
    prop_assert_eq!(tally.cancelled, model.cancelled);
    prop_assert_eq!(snapshot.unranked_tally, tally);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_lane_agrees_with_the_reference_model(
        requests in 1usize..5,
        waiting in 1usize..5,
        queue_limit in 0usize..4,
        waiting_tokens in prop::option::of(5usize..20),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut config = AdmissionConfig::new()
            .engine_request_limit(requests)
            .engine_request_waiting_limit(waiting)
            .request_queue_limit(queue_limit);
        if let Some(limit) = waiting_tokens {
            config = config.engine_waiting_token_limit(limit);
        }
        let gate = Gate::new(config);
        let mut model = Model {
            requests,
            waiting,
            waiting_tokens,
            queue_limit,
            ..Model::default()
        };
        // Admitted permits in the model's order; queued requests by id.
        let mut permits: Vec<Permit> = Vec::new();
        let mut queued: Vec<(u64, Acquire)> = Vec::new();
        let mut next_id = 0;
        for op in ops {
            let mut offered = Vec::new();
            match op {
                Op::Arrive { costed } => {
                    let prompt = if costed { 7 } else { 0 };
                    let descriptor = Descriptor::new().with_cost(Cost::prompt(prompt));
                    let mut acquire = gate.acquire_with(descriptor);
                    let id = next_id;
                    next_id += 1;
                    match model.arrive(id, prompt) {
                        Decision::Admitted => {
                            prop_assert!(!acquire.is_queued());
                            let Poll::Ready(Ok(permit)) = poll(&mut acquire) else {
                                return Err(TestCaseError::fail("the model admits it"));
                            };
                            prop_assert_eq!(permit.source(), AdmitSource::Direct);
                            permits.push(permit);
                        }
                        Decision::Queued => {
                            prop_assert!(acquire.is_queued());
                            queued.push((id, acquire));
                        }
                        Decision::Rejected => {
                            let Poll::Ready(Err(overloaded)) = poll(&mut acquire) else {
                                return Err(TestCaseError::fail("the model rejects it"));
                            };
                            prop_assert_eq!(overloaded.scope(), RejectionScope::Worker);
                        }
                    }
                }
                Op::FirstToken(at) if !permits.is_empty() => {
                    let at = at % permits.len();
                    permits[at].first_token();
                    model.admitted[at].0 = false;
                    offered = model.dequeue();
                }
                Op::Finish(at) if !permits.is_empty() => {
                    let at = at % permits.len();
                    drop(permits.remove(at));
                    model.admitted.remove(at);
                    offered = model.dequeue();
                }
                Op::Cancel(at) if !queued.is_empty() => {
                    let (id, acquire) = queued.remove(at % queued.len());
                    drop(acquire);
                    model.queued.retain(|&(queued, _)| queued != id);
                    model.cancelled += 1;
                    offered = model.dequeue();
                }
                Op::Snapshot => check(&gate, &model)?,
                _ => {}
            }
            // The requests the model admitted from the queue, and only
            // they, are ready, in its order.
            for id in offered {
                let place = queued.iter().position(|(queued, _)| *queued == id).unwrap();
                let (_, mut acquire) = queued.remove(place);
                let Poll::Ready(Ok(permit)) = poll(&mut acquire) else {
                    return Err(TestCaseError::fail(format!("request {id} was offered")));
                };
                prop_assert_eq!(permit.source(), AdmitSource::Queue);
                permits.push(permit);
            }
            for (_, acquire) in &mut queued {
                prop_assert!(poll(acquire).is_pending());
            }
        }
        check(&gate, &model)?;
        drop(queued);
        drop(permits);
        let snapshot = gate.snapshot();
        prop_assert!(snapshot.is_idle(), "{:?}", snapshot);
    }
}
