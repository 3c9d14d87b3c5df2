//! Rejections that are not the queue's doing: the server shutting down
//! ([`State::shut_down`]) and requests turned away in front of the gate
//! ([`State::reject_unseen`]). Each is a rejection like the others: in the
//! tallies, worker-scoped, and `received` still sums every end.

use super::tests::busy;
use super::*;
use crate::gate::types::RejectionScope;

fn rejected_for(reason: RejectionReason) -> impl Fn(&Overloaded) -> bool {
    move |overloaded| overloaded.reason() == reason && overloaded.scope() == RejectionScope::Worker
}

#[test]
fn shutting_down_rejects_the_queued_and_the_arriving_but_not_the_running() {
    let (mut state, mut running) = busy(AdmissionConfig::new(), 2);
    let Arrival::Queued(first, _) = state.arrive(None, Demand::default(), None, "first", None)
    else {
        panic!("queued")
    };
    let Arrival::Queued(second, _) = state.arrive(None, Demand::default(), None, "second", None)
    else {
        panic!("queued")
    };

    state.shut_down();
    let mut told = Vec::new();
    state.drain_offered(|_, name| told.push(*name));
    assert_eq!(told, ["first", "second"], "each waiter hears, oldest first");
    for ticket in [first, second] {
        let Polled::Rejected(overloaded, _) = state.poll(ticket) else {
            panic!("rejected")
        };
        assert!(rejected_for(RejectionReason::Shutdown)(&overloaded));
    }
    assert_eq!(state.view().snapshot().total.queued, 0);

    // Arrivals are rejected, even with room in the engine.
    state.finish(&mut running, None);
    let Arrival::Rejected(late) = state.arrive(None, Demand::default(), None, "late", None) else {
        panic!("rejected")
    };
    assert!(rejected_for(RejectionReason::Shutdown)(&late));
    assert_eq!(state.outside_room(), None, "the lane stays shut");

    let snapshot = state.view().snapshot();
    assert!(snapshot.is_idle());
    let tally = snapshot.tally;
    assert_eq!(
        (tally.received, tally.admitted(), tally.cancelled),
        (4, 1, 0)
    );
    assert_eq!((tally.rejected_worker, tally.shutdown_worker), (3, 3));
}

#[test]
fn a_ranked_request_queued_at_shutdown_is_rejected_worker_scoped_under_its_rank() {
    let mut state: State<&str> = State::new(
        AdmissionConfig::new()
            .capacity(EngineCapacity::new(1, 2))
            .request_queue_limit(1),
    );
    let Arrival::Admitted(_running) = state.arrive(Some(1), Demand::default(), None, "a", None)
    else {
        panic!("admitted")
    };
    let Arrival::Queued(queued, _) = state.arrive(Some(1), Demand::default(), None, "b", None)
    else {
        panic!("queued")
    };
    state.shut_down();
    state.drain_offered(|rank, _| assert_eq!(rank, Some(1)));
    let Polled::Rejected(overloaded, _) = state.poll(queued) else {
        panic!("rejected")
    };
    assert!(rejected_for(RejectionReason::Shutdown)(&overloaded));
    let tally = state.view().snapshot().rank_tallies[1];
    assert_eq!((tally.rejected_worker, tally.shutdown_worker), (1, 1));
    assert_eq!(tally.rejected_rank, 0);
}

#[test]
fn a_request_turned_away_in_front_of_the_gate_is_an_unranked_arrival_rejected_at_once() {
    let (mut state, _running) = busy(AdmissionConfig::new(), 1);
    let before = state.view().snapshot().tally;
    let overloaded = state.reject_unseen(RejectionReason::BodyReads);
    assert!(rejected_for(RejectionReason::BodyReads)(&overloaded));
    assert_eq!(overloaded.retry_after(), None);
    let snapshot = state.view().snapshot();
    let tally = snapshot.unranked_tally.since(&before);
    assert_eq!(
        (
            tally.received,
            tally.rejected_worker,
            tally.body_reads_worker
        ),
        (1, 1, 1)
    );
    assert_eq!(tally.shutdown_worker, 0);
    // Nothing else moved: the queue still takes a request.
    assert_eq!(snapshot.total, Counts::new(1, 1, 0));
    assert!(matches!(
        state.arrive(None, Demand::default(), None, "next", None),
        Arrival::Queued(..)
    ));
}
