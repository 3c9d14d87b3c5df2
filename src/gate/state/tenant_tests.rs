//! Per-tenant limits in the state machine: examples of each rule, and a
//! property test of random traffic against a model of what each tenant
//! holds (no tenant over its limits, no head-of-line blocking by a tenant
//! at its limit, FIFO inside a tenant, bounded state).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use proptest::prelude::*;

use super::qos_tests::class;
use super::*;
use crate::gate::types::{Cost, RejectionScope};

fn tenant(n: u64) -> Option<Tenant> {
    Some(Tenant::from_id(n))
}

fn arrive(
    state: &mut State<u64>,
    id: u64,
    who: Option<Tenant>,
    demand: Demand,
    now: Option<Instant>,
) -> Arrival {
    state.arrive_as(None, demand, None, class(0, who), id, now)
}

fn offered(state: &mut State<u64>) -> Vec<u64> {
    let mut ids = Vec::new();
    state.drain_offered(|_, id| ids.push(*id));
    ids
}

#[test]
fn without_tenant_limits_nothing_is_kept_per_tenant() {
    let mut state = State::<u64>::new(AdmissionConfig::new().engine_request_limit(1));
    assert!(state.tenants.is_none());
    let Arrival::Admitted(mut grant) = arrive(&mut state, 0, tenant(1), Demand::default(), None)
    else {
        panic!("admitted")
    };
    assert_eq!(grant.tenant, None);
    state.finish(&mut grant, None);
}

#[test]
fn a_parked_flow_is_passed_over_and_served_when_its_tenant_has_room() {
    let config = AdmissionConfig::new()
        .engine_request_limit(2)
        .tenant_request_limit(1);
    let mut state = State::<u64>::new(config);
    let Arrival::Admitted(mut a1) = arrive(&mut state, 1, tenant(1), Demand::default(), None)
    else {
        panic!("a1 admitted")
    };
    let Arrival::Admitted(mut z) = arrive(&mut state, 9, tenant(9), Demand::default(), None) else {
        panic!("z admitted")
    };
    let Arrival::Queued(a2, _) = arrive(&mut state, 2, tenant(1), Demand::default(), None) else {
        panic!("a2 queued")
    };
    let Arrival::Queued(b1, _) = arrive(&mut state, 3, tenant(2), Demand::default(), None) else {
        panic!("b1 queued")
    };
    state.finish(&mut z, None);
    assert_eq!(offered(&mut state), [3], "b1 goes past a's parked flow");
    let Polled::Admitted(mut b1, _) = state.poll(b1) else {
        panic!("b1 admitted")
    };
    state.finish(&mut a1, None);
    assert_eq!(offered(&mut state), [2]);
    let Polled::Admitted(mut a2, _) = state.poll(a2) else {
        panic!("a2 admitted")
    };
    state.finish(&mut a2, None);
    state.finish(&mut b1, None);
    assert_eq!(state.tenants_held(), 0, "an idle gate keeps no tenant");
    assert_eq!(state.total, Counts::default());
}

#[test]
fn a_newcomer_leads_past_a_band_whose_flows_are_all_parked() {
    // `a` (priority 5) is parked; a newcomer of priority 0 enters at once.
    let config = AdmissionConfig::new()
        .engine_request_limit(4)
        .tenant_request_limit(1);
    let mut state = State::<u64>::new(config);
    let Arrival::Admitted(mut a1) =
        state.arrive_as(None, Demand::default(), None, class(5, tenant(1)), 1, None)
    else {
        panic!("a1 admitted")
    };
    let Arrival::Queued(a2, _) =
        state.arrive_as(None, Demand::default(), None, class(5, tenant(1)), 2, None)
    else {
        panic!("a2 queued")
    };
    let Arrival::Admitted(mut low) =
        state.arrive_as(None, Demand::default(), None, class(0, tenant(2)), 3, None)
    else {
        panic!("a low band of another tenant is not held up by a parked band")
    };
    state.finish(&mut a1, None);
    assert_eq!(offered(&mut state), [2]);
    let Polled::Admitted(mut a2, _) = state.poll(a2) else {
        panic!()
    };
    state.finish(&mut a2, None);
    state.finish(&mut low, None);
    assert_eq!(state.tenants_held(), 0);
}

#[test]
fn a_refusal_over_the_queue_limit_is_tenant_scoped_with_the_tenants_drain() {
    let start = Instant::now();
    let at = |ms: u64| Some(start + Duration::from_millis(ms));
    let config = AdmissionConfig::new()
        .engine_request_limit(1)
        .tenant_queue_limit(2);
    let mut state = State::<u64>::new(config);
    let Arrival::Admitted(mut running) = arrive(&mut state, 0, tenant(1), Demand::default(), at(0))
    else {
        panic!()
    };
    let mut tickets = VecDeque::new();
    for id in 1..=2 {
        let Arrival::Queued(ticket, _) =
            arrive(&mut state, id, tenant(1), Demand::default(), at(0))
        else {
            panic!()
        };
        tickets.push_back((id, ticket));
    }
    let Arrival::Rejected(overloaded) = arrive(&mut state, 3, tenant(1), Demand::default(), at(0))
    else {
        panic!("over the queue limit")
    };
    assert_eq!(overloaded.scope(), RejectionScope::Tenant);
    assert_eq!(overloaded.reason(), RejectionReason::TenantLimit);
    assert_eq!(overloaded.retry_after(), None, "no drain measured yet");
    // One request leaves the tenant's queue 4 s after it began to fill:
    // with two queued again, the tenant drains in 8 s.
    state.finish(&mut running, at(4_000));
    offered(&mut state);
    let Polled::Admitted(mut running, _) = state.poll(tickets.pop_front().unwrap().1) else {
        panic!()
    };
    let Arrival::Queued(ticket, _) = arrive(&mut state, 4, tenant(1), Demand::default(), at(4_000))
    else {
        panic!()
    };
    tickets.push_back((4, ticket));
    let Arrival::Rejected(overloaded) =
        arrive(&mut state, 5, tenant(1), Demand::default(), at(4_000))
    else {
        panic!()
    };
    assert_eq!(overloaded.retry_after(), Some(Duration::from_secs(8)));
    // Another tenant still queues.
    let Arrival::Queued(other, _) = arrive(&mut state, 6, tenant(2), Demand::default(), at(4_000))
    else {
        panic!()
    };
    tickets.push_back((6, other));
    let tally = state.view().tally();
    assert_eq!((tally.rejected_tenant, tally.rejected()), (2, 2));
    while !tickets.is_empty() {
        state.finish(&mut running, at(5_000));
        let [id] = offered(&mut state)[..] else {
            panic!("one slot, one admission")
        };
        let at = tickets.iter().position(|(known, _)| *known == id).unwrap();
        let (_, ticket) = tickets.remove(at).unwrap();
        let Polled::Admitted(next, _) = state.poll(ticket) else {
            panic!()
        };
        running = next;
    }
    state.finish(&mut running, at(6_000));
    assert_eq!(state.tenants_held(), 0);
}

#[test]
fn a_fresh_tenant_per_request_keeps_no_state_behind() {
    let config = AdmissionConfig::new()
        .engine_request_limit(1)
        .tenant_request_limit(1)
        .tenant_queue_limit(1);
    let mut state = State::<u64>::new(config);
    let Arrival::Admitted(mut running) = arrive(&mut state, 0, tenant(0), Demand::default(), None)
    else {
        panic!()
    };
    for id in 1..5_000 {
        let Arrival::Queued(ticket, _) =
            arrive(&mut state, id, tenant(id), Demand::default(), None)
        else {
            panic!()
        };
        state.finish(&mut running, None);
        offered(&mut state);
        let Polled::Admitted(next, _) = state.poll(ticket) else {
            panic!()
        };
        running = next;
        assert!(state.tenants_held() <= 2);
    }
    state.finish(&mut running, None);
    assert_eq!(state.tenants_held(), 0);
    let tenants = state.tenants.as_ref().unwrap();
    assert!(tenants.held_len().1 <= 128, "the map gave its room back");
}

#[test]
fn a_capacity_report_unparks_a_tenant_its_new_limit_lets_in() {
    // One rank: `a` may hold 1; two ranks: 2.
    let config = AdmissionConfig::new()
        .tenant_request_limit(1)
        .capacity(EngineCapacity::new(8, 1));
    let mut state = State::<u64>::new(config);
    let Arrival::Admitted(mut a1) = arrive(&mut state, 1, tenant(1), Demand::default(), None)
    else {
        panic!()
    };
    let Arrival::Queued(a2, _) = arrive(&mut state, 2, tenant(1), Demand::default(), None) else {
        panic!()
    };
    state.report_capacity(EngineCapacity::new(8, 2), None);
    assert_eq!(offered(&mut state), [2]);
    let Polled::Admitted(mut a2, _) = state.poll(a2) else {
        panic!()
    };
    state.finish(&mut a1, None);
    state.finish(&mut a2, None);
    assert_eq!(state.tenants_held(), 0);
}

#[test]
fn token_demand_of_the_tenant_is_released_at_the_end() {
    let config = AdmissionConfig::new()
        .engine_request_limit(8)
        .tenant_token_limit(100);
    let mut state = State::<u64>::new(config);
    let demand = Demand::of(Cost::new(60, Some(20)));
    let Arrival::Admitted(mut first) = arrive(&mut state, 1, tenant(1), demand, None) else {
        panic!()
    };
    let Arrival::Queued(second, _) = arrive(&mut state, 2, tenant(1), demand, None) else {
        panic!("80 + 80 > 100")
    };
    // The first token releases waiting capacity, not the tenant's tokens.
    state.first_token(&mut first, None);
    assert!(offered(&mut state).is_empty());
    state.finish(&mut first, None);
    assert_eq!(offered(&mut state), [2]);
    let Polled::Admitted(mut second, _) = state.poll(second) else {
        panic!()
    };
    state.finish(&mut second, None);
    assert_eq!(state.tenants_held(), 0);
}

/// One step of random traffic.
#[derive(Debug, Clone)]
enum Step {
    /// A request of tenant `0..4` (3: no tenant) and that many tokens.
    Arrive {
        tenant: u64,
        tokens: usize,
        priority: i32,
    },
    /// The `n`-th admitted request (modulo) produces its first token.
    FirstToken(usize),
    /// The `n`-th admitted request (modulo) ends.
    Finish(usize),
    /// The `n`-th queued request (modulo) is cancelled.
    Cancel(usize),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => (0u64..4, 0usize..60, 0i32..2)
            .prop_map(|(tenant, tokens, priority)| Step::Arrive { tenant, tokens, priority }),
        1 => any::<usize>().prop_map(Step::FirstToken),
        3 => any::<usize>().prop_map(Step::Finish),
        1 => any::<usize>().prop_map(Step::Cancel),
    ];
    proptest::collection::vec(step, 1..200)
}

/// One tenant's queued requests of one priority, oldest first.
type Flow = VecDeque<(u64, Ticket)>;

struct Request {
    tenant: Option<Tenant>,
    demand: Demand,
}

proptest! {
    #[test]
    fn tenants_stay_within_their_limits_and_never_block_each_other(
        steps in steps(),
        engine in 1usize..6,
        per_tenant in 1usize..4,
        token_limit in prop::option::of(20usize..120),
        queue_limit in prop::option::of(0usize..4),
    ) {
        let mut config = AdmissionConfig::new()
            .engine_request_limit(engine)
            .request_queue_limit(20)
            .tenant_request_limit(per_tenant);
        if let Some(limit) = token_limit {
            config = config.tenant_token_limit(limit);
        }
        if let Some(limit) = queue_limit {
            config = config.tenant_queue_limit(limit);
        }
        let mut state = State::<u64>::new(config);
        let mut requests: HashMap<u64, Request> = HashMap::new();
        let mut admitted: Vec<(u64, Grant)> = Vec::new();
        // Each tenant's queued requests of each priority (its flow in that
        // band), in arrival order.
        let mut queued: HashMap<(Option<Tenant>, i32), Flow> = HashMap::new();
        let mut priorities: HashMap<u64, i32> = HashMap::new();
        for (id, step) in steps.into_iter().enumerate() {
            let id = id as u64;
            match step {
                Step::Arrive { tenant: n, tokens, priority } => {
                    let who = (n < 3).then(|| Tenant::from_id(n));
                    let demand = Demand::of(Cost::new(tokens, Some(tokens / 2)));
                    let queued_before = queued.get(&(who, priority)).map_or(0, VecDeque::len);
                    let tenant_queued: usize = queued
                        .iter()
                        .filter(|((w, _), _)| *w == who)
                        .map(|(_, list)| list.len())
                        .sum();
                    priorities.insert(id, priority);
                    let arrival = state.arrive_as(None, demand, None, class(priority, who), id, None);
                    requests.insert(id, Request { tenant: who, demand });
                    match arrival {
                        Arrival::Admitted(grant) => {
                            prop_assert_eq!(queued_before, 0, "a tenant's newcomer overtook it");
                            admitted.push((id, grant));
                        }
                        Arrival::Queued(ticket, _) => {
                            queued.entry((who, priority)).or_default().push_back((id, ticket));
                        }
                        Arrival::Rejected(overloaded) => {
                            if overloaded.reason() == RejectionReason::TenantLimit {
                                let _ = queued_before;
                                prop_assert_eq!(overloaded.scope(), RejectionScope::Tenant);
                                prop_assert!(who.is_some());
                                prop_assert!(tenant_queued >= queue_limit.unwrap_or(usize::MAX));
                            } else {
                                prop_assert!(overloaded.scope() != RejectionScope::Tenant);
                            }
                        }
                    }
                }
                Step::FirstToken(n) if !admitted.is_empty() => {
                    let at = n % admitted.len();
                    state.first_token(&mut admitted[at].1, None);
                }
                Step::Finish(n) if !admitted.is_empty() => {
                    let at = n % admitted.len();
                    let (_, mut grant) = admitted.swap_remove(at);
                    state.finish(&mut grant, None);
                }
                Step::Cancel(n) => {
                    let all: Vec<_> = queued.iter().flat_map(|(who, list)| {
                        list.iter().enumerate().map(move |(i, _)| (*who, i))
                    }).collect();
                    if !all.is_empty() {
                        let (who, i) = all[n % all.len()];
                        let (_, ticket) = queued.get_mut(&who).unwrap().remove(i).unwrap();
                        prop_assert!(state.cancel(ticket, None).is_ok());
                    }
                }
                _ => {}
            }
            // Admissions from the queue: each the oldest of its tenant.
            for id in offered(&mut state) {
                let who = requests[&id].tenant;
                let list = queued.get_mut(&(who, priorities[&id])).unwrap();
                let at = list.iter().position(|(known, _)| *known == id).unwrap();
                let (_, ticket) = list.remove(at).unwrap();
                match state.poll(ticket) {
                    Polled::Admitted(grant, _) => {
                        prop_assert_eq!(at, 0, "overtaken inside its tenant");
                        admitted.push((id, grant));
                    }
                    // Displaced by an arrival of higher priority.
                    Polled::Rejected(..) => {}
                    other => panic!("an offered request is decided: {other:?}"),
                }
            }
            // No tenant holds more than its limits allow.
            // (requests, tokens, requests of any tokens)
            let mut held: HashMap<Option<Tenant>, (usize, usize, usize)> = HashMap::new();
            for (id, grant) in &admitted {
                if grant.holds_request {
                    let entry = held.entry(requests[id].tenant).or_default();
                    let tokens = requests[id].demand.engine_tokens;
                    entry.0 += 1;
                    entry.1 += tokens;
                    entry.2 += usize::from(tokens > 0);
                }
            }
            for (who, (count, tokens, weighed)) in &held {
                if who.is_some() {
                    prop_assert!(*count <= per_tenant, "{who:?} holds {count}");
                    if let Some(limit) = token_limit {
                        // A request larger than the limit runs alone (of
                        // the requests that weigh anything).
                        prop_assert!(
                            *tokens <= limit || *weighed == 1,
                            "{who:?} holds {tokens} tokens"
                        );
                    }
                }
            }
            // No head-of-line blocking: a queued tenant whose oldest
            // request fits both the engine and its tenant is not left
            // waiting.
            for ((who, _), list) in &queued {
                if let Some((id, _)) = list.front() {
                    let demand = requests[id].demand;
                    let fits = state.engine_fits(BucketKey::Unranked, demand)
                        && state.tenant_engine_fits(*who, demand);
                    prop_assert!(!fits, "{who:?} waits with room for it");
                }
            }
            // Bounded: a record only for tenants holding or queuing.
            let busy = held
                .keys()
                .chain(queued.iter().filter(|(_, l)| !l.is_empty()).map(|((w, _), _)| w))
                .filter(|who| who.is_some())
                .collect::<std::collections::HashSet<_>>()
                .len();
            prop_assert!(state.tenants_held() <= busy);
        }
        // Everything ends: every waiter is served in the end, and nothing
        // is kept.
        loop {
            for (_, mut grant) in admitted.drain(..) {
                state.finish(&mut grant, None);
            }
            let ids = offered(&mut state);
            if ids.is_empty() {
                break;
            }
            for id in ids {
                let who = requests[&id].tenant;
                let list = queued.get_mut(&(who, priorities[&id])).unwrap();
                let (first, ticket) = list.pop_front().unwrap();
                prop_assert_eq!(first, id, "overtaken inside its tenant");
                let Polled::Admitted(grant, _) = state.poll(ticket) else {
                    panic!("nothing is displaced without arrivals")
                };
                admitted.push((id, grant));
            }
        }
        prop_assert_eq!(state.total, Counts::default());
        prop_assert_eq!(state.tenants_held(), 0);
        let tally = state.view().tally();
        prop_assert_eq!(tally.received, tally.settled());
    }
}
