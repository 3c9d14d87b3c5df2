//! The queue discipline of behaviour §8: examples of each rule (the reference
//! model is in `qos_model_tests.rs`).

use std::time::Duration;

use super::tests::{busy, busy_at};
use super::*;
use crate::gate::types::{Cost, RejectionScope};

pub(super) fn tenant_a() -> Tenant {
    Tenant::new("a")
}

pub(super) fn tenant_b() -> Tenant {
    Tenant::new("b")
}

pub(super) fn class(priority: i32, tenant: Option<Tenant>) -> Class {
    Class { priority, tenant }
}

pub(super) fn arrive(
    state: &mut State<&'static str>,
    name: &'static str,
    class: Class,
    now: Option<Instant>,
) -> Arrival {
    state.arrive_as(None, Demand::default(), None, class, name, now)
}

pub(super) fn queue(
    state: &mut State<&'static str>,
    name: &'static str,
    class: Class,
    now: Option<Instant>,
) -> Ticket {
    match arrive(state, name, class, now) {
        Arrival::Queued(ticket, _) => ticket,
        other => panic!("{name}: expected queued, got {other:?}"),
    }
}

#[test]
fn higher_bands_are_served_first_and_fifo_within_a_band() {
    let (mut state, running) = busy(AdmissionConfig::new(), 10);
    let mut tickets = Vec::new();
    for name in ["L1", "L2", "L3"] {
        tickets.push(queue(&mut state, name, class(0, None), None));
    }
    for name in ["H1", "H2"] {
        tickets.push(queue(&mut state, name, class(5, None), None));
    }
    assert_eq!(
        serve_all(&mut state, running, tickets),
        ["H1", "H2", "L1", "L2", "L3"]
    );
}

#[test]
fn tenants_share_a_band_in_turn_ties_by_arrival() {
    let (mut state, running) = busy(AdmissionConfig::new(), 10);
    let mut tickets = Vec::new();
    for name in ["X1", "X2", "X3", "X4"] {
        tickets.push(queue(&mut state, name, class(0, Some(tenant_a())), None));
    }
    for name in ["Y1", "Y2"] {
        tickets.push(queue(&mut state, name, class(0, Some(tenant_b())), None));
    }
    assert_eq!(
        serve_all(&mut state, running, tickets),
        ["X1", "Y1", "X2", "Y2", "X3", "X4"]
    );
}

#[test]
fn a_fresh_tenant_per_request_does_not_starve_a_backlogged_tenant() {
    // One engine slot; a steady tenant keeps 5 queued, a client keeps 5
    // queued under a tenant name never used before each time: six flows
    // backlogged, so the steady tenant's fair share is about 1/6.
    let (mut state, mut running) = busy(AdmissionConfig::new(), 10);
    let steady = Tenant::new("steady");
    let mut fresh = 0u64;
    let mut fresh_tenant = || {
        fresh += 1;
        Tenant::new(&format!("fresh-{fresh}"))
    };
    let mut waiting = Vec::new();
    for _ in 0..5 {
        waiting.push(queue(&mut state, "steady", class(0, Some(steady)), None));
        waiting.push(queue(
            &mut state,
            "fresh",
            class(0, Some(fresh_tenant())),
            None,
        ));
    }
    let admissions = 10_000;
    let mut steady_served = 0;
    for _ in 0..admissions {
        let name = serve_next(&mut state, &mut running, &mut waiting, None)
            .expect("a slot freed with ten waiting");
        let tenant = if name == "steady" {
            steady_served += 1;
            steady
        } else {
            fresh_tenant()
        };
        waiting.push(queue(&mut state, name, class(0, Some(tenant)), None));
        let queue = &state.buckets.unranked.queue;
        assert!(queue.flow_count() <= 10, "{} flows", queue.flow_count());
    }
    assert!(
        steady_served * 8 >= admissions,
        "the steady tenant got {steady_served} of {admissions} admissions"
    );
    state.finish(&mut running, None);
}

#[test]
fn a_huge_weight_is_a_share_not_strict_priority() {
    // Steps of 1 × scale / weight: with weights past the old scale of
    // 720,720 they rounded to 0 and every tag tied.
    let ladder = Ladder::default();
    for weight in [720_721, 1_000_000, u32::MAX] {
        assert!(Node::new(0, 0, None, 1, weight, None, &ladder).step > 0);
    }
    let config = AdmissionConfig::new()
        .tenant_weight("heavy", 2_000_000)
        .tenant_weight("light", 1_000_000);
    let (mut state, running) = busy(config, 100);
    let mut tickets = Vec::new();
    for tenant in ["light", "heavy"] {
        let class = class(0, Some(Tenant::new(tenant)));
        for _ in 0..30 {
            tickets.push(queue(&mut state, tenant, class, None));
        }
    }
    let order = serve_all(&mut state, running, tickets);
    let heavy = order[..30].iter().filter(|&&name| name == "heavy").count();
    assert!(
        (19..=21).contains(&heavy),
        "{heavy} of the first 30: {order:?}"
    );
}

#[test]
fn weights_share_a_band_in_proportion() {
    let config = AdmissionConfig::new().tenant_weight("a", 3);
    let (mut state, running) = busy(config, 100);
    let mut tickets = Vec::new();
    for _ in 0..40 {
        tickets.push(queue(&mut state, "a", class(0, Some(tenant_a())), None));
        tickets.push(queue(&mut state, "b", class(0, Some(tenant_b())), None));
    }
    let order = serve_all(&mut state, running, tickets);
    let first: Vec<_> = order.iter().take(40).collect();
    let a = first.iter().filter(|&&&name| name == "a").count();
    assert_eq!(a, 30, "3:1 while both wait: {order:?}");
}

#[test]
fn a_full_queue_gives_the_newest_lowest_request_up_to_a_higher_arrival() {
    let (mut state, running) = busy(AdmissionConfig::new(), 3);
    let l1 = queue(&mut state, "L1", class(0, None), None);
    let l2 = queue(&mut state, "L2", class(-1, None), None);
    let l3 = queue(&mut state, "L3", class(-1, None), None);
    let h = queue(&mut state, "H", class(5, None), None);
    let mut displaced = Vec::new();
    state.drain_offered(|_, name| displaced.push(*name));
    assert_eq!(displaced, ["L3"], "the newest of the lowest band");
    let Polled::Rejected(overloaded, "L3") = state.poll(l3) else {
        panic!("L3 hears it was displaced")
    };
    assert_eq!(overloaded.reason(), RejectionReason::Displaced);
    assert_eq!(overloaded.scope(), RejectionScope::Worker);
    assert_eq!(state.view().tally().displaced(), 1);
    assert_eq!(state.view().tally().rejected(), 1);
    assert_eq!(state.view().total().queued, 3);
    assert_eq!(
        serve_all(&mut state, running, vec![l1, l2, h]),
        ["H", "L1", "L2"]
    );
}

#[test]
fn an_arrival_of_no_higher_priority_than_the_lowest_band_is_rejected() {
    let (mut state, _running) = busy(AdmissionConfig::new(), 2);
    queue(&mut state, "L1", class(1, None), None);
    queue(&mut state, "L2", class(1, None), None);
    let Arrival::Rejected(overloaded) = arrive(&mut state, "L3", class(1, None), None) else {
        panic!("no lower band to displace")
    };
    assert_eq!(overloaded.reason(), RejectionReason::QueueFull);
    assert_eq!(state.view().tally().displaced(), 0);
}

#[test]
fn an_arrival_ahead_of_every_queued_request_that_fits_is_admitted_at_once() {
    // A long prompt waits for the token budget; a short urgent one fits.
    let mut state = State::new(
        AdmissionConfig::new()
            .engine_request_limit(4)
            .engine_waiting_token_limit(1000),
    );
    let Arrival::Admitted(_first) =
        state.arrive(None, Demand::of(Cost::prompt(600)), None, "a", None)
    else {
        panic!("admitted")
    };
    let Arrival::Queued(..) = state.arrive(None, Demand::of(Cost::prompt(900)), None, "long", None)
    else {
        panic!("the long prompt waits for the budget")
    };
    let mut short_prompt = |priority, name| {
        let class = class(priority, None);
        state.arrive_as(None, Demand::of(Cost::prompt(100)), None, class, name, None)
    };
    assert!(
        matches!(short_prompt(0, "b"), Arrival::Queued(..)),
        "FIFO within a band: it waits behind the long prompt"
    );
    assert!(
        matches!(short_prompt(5, "c"), Arrival::Admitted(_)),
        "nothing queued goes before it and it fits"
    );
}

#[test]
fn a_waiting_band_rises_one_band_per_aging_interval() {
    let start = Instant::now();
    let config = AdmissionConfig::new().aging_interval(Duration::from_secs(1));
    let (mut state, running) = busy_at(config, 10, Some(start));
    let low = queue(&mut state, "low", class(0, None), Some(start));
    let now = Some(start + Duration::from_millis(2500));
    // The low band has risen two bands: it is level with priority 2 and,
    // older, goes first; priority 3 still goes before it.
    let two = queue(&mut state, "two", class(2, None), now);
    let three = queue(&mut state, "three", class(3, None), now);
    assert_eq!(
        serve_all(&mut state, running, vec![low, two, three]),
        ["three", "low", "two"]
    );
}

#[test]
fn configured_bands_group_priorities() {
    let config = AdmissionConfig::new().priority_bands([0, 10]);
    let (mut state, running) = busy(config, 10);
    // 3 and 7 are both in band 0: FIFO between them.
    let tickets = vec![
        queue(&mut state, "three", class(3, None), None),
        queue(&mut state, "seven", class(7, None), None),
        queue(&mut state, "ten", class(10, None), None),
        queue(&mut state, "minus", class(-4, None), None),
    ];
    assert_eq!(
        serve_all(&mut state, running, tickets),
        ["ten", "three", "seven", "minus"]
    );
}

#[test]
fn cancelling_a_tenants_head_keeps_its_turn_for_the_next() {
    let (mut state, running) = busy(AdmissionConfig::new(), 10);
    let x1 = queue(&mut state, "X1", class(0, Some(tenant_a())), None);
    let x2 = queue(&mut state, "X2", class(0, Some(tenant_a())), None);
    let y1 = queue(&mut state, "Y1", class(0, Some(tenant_b())), None);
    state.cancel(x1, None).unwrap();
    assert_eq!(serve_all(&mut state, running, vec![x2, y1]), ["X2", "Y1"]);
}

#[test]
fn a_cancel_storm_across_bands_and_tenants_gives_memory_back() {
    let (mut state, mut running) = busy(AdmissionConfig::new(), 100_000);
    let idle = state.entries.capacity();
    let tickets: Vec<Ticket> = (0..50_000u64)
        .map(|i| {
            let tenant = Tenant::from_id(i % 1000);
            queue(&mut state, "r", class((i % 5) as i32, Some(tenant)), None)
        })
        .collect();
    let mut order: Vec<usize> = (0..tickets.len()).collect();
    order.sort_by_key(|&i| (i * 7919) % tickets.len());
    for i in order {
        state.cancel(tickets[i], None).unwrap();
    }
    assert_eq!(state.view().total().queued, 0);
    assert!(state.buckets.unranked.queue.is_empty());
    assert_eq!(
        state.buckets.unranked.queue.band_lengths().count(),
        0,
        "no band left"
    );
    assert!(state.entries.capacity() <= idle.max(64));
    state.finish(&mut running, None);
}

#[test]
fn predictive_rejection_counts_only_the_bands_a_request_waits_behind() {
    let start = Instant::now();
    let config = AdmissionConfig::new().request_queue_wait_limit(Duration::from_millis(2500));
    let (mut state, mut running) = busy_at(config, 100, Some(start));
    // One admission from the queue after a second: the queue drains one
    // request a second.
    let first = queue(&mut state, "first", class(0, None), Some(start));
    let now = Some(start + Duration::from_secs(1));
    state.finish(&mut running, now);
    state.drain_offered(|_, _| {});
    let Polled::Admitted(mut running, _) = state.poll(first) else {
        panic!("first is admitted from the queue")
    };
    // One second of wait each: the second waits two in all.
    queue(&mut state, "low", class(0, None), now);
    queue(&mut state, "low", class(0, None), now);
    // Behind two of its own band, a request would wait three seconds.
    let Arrival::Rejected(overloaded) = arrive(&mut state, "late", class(0, None), now) else {
        panic!("three seconds of queue is over the 2.5-second limit")
    };
    assert_eq!(overloaded.reason(), RejectionReason::Deadline);
    // A higher band waits behind none of them.
    let high = queue(&mut state, "high", class(1, None), now);
    state.finish(&mut running, now);
    state.drain_offered(|_, _| {});
    assert!(matches!(state.poll(high), Polled::Admitted(_, "high")));
}

/// Serves every ticket, one at a time behind `running`, and names them in
/// the order the gate admitted them.
fn serve_all(
    state: &mut State<&'static str>,
    mut running: Grant,
    mut waiting: Vec<Ticket>,
) -> Vec<&'static str> {
    let mut order = Vec::new();
    while let Some(name) = serve_next(state, &mut running, &mut waiting, None) {
        order.push(name);
    }
    assert!(waiting.is_empty(), "a slot freed with requests waiting");
    order
}

/// Ends the `running` request at `now`; the one of `waiting` the gate
/// admits in its place leaves `waiting` and runs next. Its name, or `None`
/// if the gate admitted none of them.
fn serve_next(
    state: &mut State<&'static str>,
    running: &mut Grant,
    waiting: &mut Vec<Ticket>,
    now: Option<Instant>,
) -> Option<&'static str> {
    state.finish(running, now);
    let mut offered = Vec::new();
    state.drain_offered(|_, name| offered.push(*name));
    assert!(offered.len() <= 1, "one slot frees one place: {offered:?}");
    let mut admitted = None;
    waiting.retain(|&ticket| match state.poll(ticket) {
        Polled::Admitted(grant, name) => {
            admitted = Some((grant, name));
            false
        }
        Polled::Waiting(_) => true,
        other => panic!("unexpected {other:?}"),
    });
    let (grant, name) = admitted?;
    *running = grant;
    Some(name)
}

#[test]
fn aging_bounds_the_wait_of_low_priority_work_under_a_steady_high_stream() {
    let interval = Duration::from_secs(1);
    let step = Duration::from_millis(250);
    let start = Instant::now();
    let config = AdmissionConfig::new().aging_interval(interval);
    let (mut state, mut running) = busy_at(config, 100, Some(start));
    let low = queue(&mut state, "low", class(0, None), Some(start));
    let mut waiting = vec![low];
    // Every step a priority-2 request arrives and the running one ends:
    // without aging the low request would wait for ever.
    for k in 1..=40u32 {
        let now = start + step * k;
        waiting.push(queue(&mut state, "high", class(2, None), Some(now)));
        let name = serve_next(&mut state, &mut running, &mut waiting, Some(now))
            .expect("a slot freed with requests waiting");
        if name == "low" {
            let waited = now - start;
            // Two bands below the stream: it rises level with it after two
            // intervals and, older, goes first.
            assert!(waited <= interval * 2 + step, "waited {waited:?}");
            assert!(waited >= interval * 2, "served early, after {waited:?}");
            return;
        }
    }
    panic!("the low-priority request was starved");
}
