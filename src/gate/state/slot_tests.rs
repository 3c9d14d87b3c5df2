//! The request slab and the queue links: a cancelled or displaced request
//! gives its memory back, unlinking keeps the order of the rest, and a
//! stale ticket never touches the request that reuses its slot.

use super::*;

/// `waiter` arrives, at no particular time, and is admitted.
fn admit<T>(state: &mut State<T>, waiter: T) -> Grant {
    match state.arrive(None, Demand::default(), None, waiter, None) {
        Arrival::Admitted(grant) => grant,
        other => panic!("expected admitted, got {other:?}"),
    }
}

/// `waiter` arrives, at no particular time, and is queued.
fn queue<T>(state: &mut State<T>, waiter: T) -> Ticket {
    match state.arrive(None, Demand::default(), None, waiter, None) {
        Arrival::Queued(ticket, _) => ticket,
        other => panic!("expected queued, got {other:?}"),
    }
}

#[test]
fn a_cancel_storm_gives_the_queue_memory_back() {
    let mut state = State::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(100_000),
    );
    let mut holder = admit(&mut state, 0);
    let idle = state.entries.capacity();
    let tickets: Vec<Ticket> = (0..100_000).map(|id| queue(&mut state, id)).collect();
    assert!(state.entries.capacity() >= 100_000);
    // Cancel in a scattered order.
    let mut order: Vec<usize> = (0..tickets.len()).collect();
    order.sort_by_key(|&i| (i * 7919) % tickets.len());
    for i in order {
        state.cancel(tickets[i], None).unwrap();
    }
    assert_eq!(state.view().total().queued, 0);
    assert!(state.entries.capacity() <= idle.max(64));
    state.finish(&mut holder, None);
    assert_eq!(state.view().tally().cancelled, 100_000);
}

#[test]
fn unlinking_from_the_middle_keeps_the_queue_order() {
    let mut state = State::new(AdmissionConfig::new().engine_request_limit(1));
    let mut holder = admit(&mut state, 0);
    let tickets: Vec<Ticket> = (1..=5).map(|id| queue(&mut state, id)).collect();
    for i in [2, 4, 0] {
        state.cancel(tickets[i], None).unwrap();
    }
    let mut order = Vec::new();
    let mut remaining = vec![tickets[1], tickets[3]];
    state.finish(&mut holder, None);
    while !remaining.is_empty() {
        state.drain_offered(|_, &mut id| order.push(id));
        let ticket = remaining.remove(0);
        let Polled::Admitted(mut grant, _) = state.poll(ticket) else {
            panic!("offered in order")
        };
        state.finish(&mut grant, None);
    }
    assert_eq!(order, vec![2, 4]);
}

#[test]
fn a_stale_ticket_never_touches_the_request_that_reuses_its_slot() {
    let mut state = State::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(2),
    );
    let mut a = admit(&mut state, "a");
    let b = queue(&mut state, "b");
    state.finish(&mut a, None);
    let Polled::Admitted(mut b_grant, _) = state.poll(b) else {
        panic!("b was offered the freed capacity")
    };
    // c takes the slot b's entry had.
    let c = queue(&mut state, "c");
    assert_eq!(c.slot, b.slot, "the slab reuses the slot");
    assert!(state.cancel(b, None).is_err(), "b's ticket is spent");
    assert!(matches!(state.poll(b), Polled::Stale));
    assert_eq!(state.view().total().queued, 1, "c is still queued");
    state.finish(&mut b_grant, None);
    let Polled::Admitted(mut c_grant, "c") = state.poll(c) else {
        panic!("c is admitted once b ends")
    };
    state.finish(&mut c_grant, None);
    assert_eq!(state.view().tally().cancelled, 0);
}
