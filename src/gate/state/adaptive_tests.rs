//! The adaptive waiting limit inside the state machine: random arrivals,
//! first tokens, ends and capacity reports, with time moving on. The limit
//! in force never leaves `[floor, ceiling]`, and no admitted request ever
//! loses what it holds when the limit shrinks.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::config::{AdaptiveWaitingLimit, LimitSource};

#[derive(Debug, Clone)]
enum Event {
    Arrive { rank: Option<u32> },
    FirstToken(usize),
    Finish(usize),
    Poll,
    Report { seqs: usize },
    Wait { ms: u64 },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => prop_oneof![Just(None), (0u32..2).prop_map(Some)].prop_map(|rank| Event::Arrive { rank }),
        3 => any::<usize>().prop_map(Event::FirstToken),
        2 => any::<usize>().prop_map(Event::Finish),
        2 => Just(Event::Poll),
        1 => (1usize..40).prop_map(|seqs| Event::Report { seqs }),
        4 => (0u64..300).prop_map(|ms| Event::Wait { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_limit_stays_in_bounds_and_admitted_work_is_never_revoked(
        floor in 1usize..4,
        events in proptest::collection::vec(event(), 1..300),
    ) {
        let params = AdaptiveWaitingLimit::default()
            .floor(floor)
            .interval(Duration::from_millis(50))
            .probe_interval(Duration::from_millis(700))
            .probe_samples(2);
        let config = AdmissionConfig::new()
            .adaptive_waiting_limit_with(params)
            .request_queue_limit(64)
            .capacity(EngineCapacity::new(16, 2));
        let mut state: State<()> = State::new(config);
        let mut now = Instant::now();
        let mut grants: Vec<Grant> = Vec::new();
        let mut tickets: Vec<Ticket> = Vec::new();
        for event in events {
            match event {
                Event::Arrive { rank } => match state.arrive(rank, Demand::default(), None, (), Some(now)) {
                    Arrival::Admitted(grant) => grants.push(grant),
                    Arrival::Queued(ticket, _) => tickets.push(ticket),
                    Arrival::Rejected(_) => {}
                },
                Event::FirstToken(i) if !grants.is_empty() => {
                    let i = i % grants.len();
                    state.first_token(&mut grants[i], Some(now));
                }
                Event::Finish(i) if !grants.is_empty() => {
                    let i = i % grants.len();
                    let mut grant = grants.swap_remove(i);
                    state.finish(&mut grant, Some(now));
                }
                Event::FirstToken(_) | Event::Finish(_) => {}
                Event::Poll => {
                    state.drain_offered(|_, _| {});
                    let mut still = Vec::new();
                    for ticket in tickets.drain(..) {
                        match state.poll(ticket) {
                            Polled::Admitted(grant, ()) => grants.push(grant),
                            Polled::Waiting(_) => still.push(ticket),
                            Polled::Rejected(..) | Polled::Stale => {}
                        }
                    }
                    tickets = still;
                }
                Event::Report { seqs } => {
                    state.report_capacity(EngineCapacity::new(seqs, 2), Some(now));
                }
                Event::Wait { ms } => {
                    now += Duration::from_millis(ms);
                }
            }
            // In bounds: between the floor and the reported waiting limit.
            let in_force = state.view().limits_in_force();
            let limit = in_force.per_rank.engine_request_waiting_limit;
            let seqs = state.view().capacity().map_or(16, |c| c.max_num_seqs);
            prop_assert!(limit >= floor && limit <= seqs.max(floor), "{limit} not in [{floor}, {seqs}]");
            prop_assert_eq!(
                in_force.sources.engine_request_waiting_limit,
                LimitSource::Adaptive { floor, ceiling: seqs.max(floor) }
            );
            // Never revoked: every grant the test holds is still counted,
            // whatever the limit did.
            let waiting = grants.iter().filter(|grant| grant.is_waiting()).count();
            // Offered but not yet polled: held, not yet handed over.
            let offered = tickets
                .iter()
                .filter(|ticket| {
                    matches!(state.live(**ticket).map(|entry| &entry.status), Some(Status::Offered(_)))
                })
                .count();
            prop_assert!(state.view().total().engine_requests >= grants.len());
            prop_assert_eq!(state.view().total().engine_requests, grants.len() + offered);
            prop_assert!(state.view().total().engine_waiting >= waiting);
            prop_assert_eq!(state.view().total().engine_waiting, waiting + offered);
        }
    }
}
