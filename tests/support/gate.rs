//! Helpers for tests of the gate through its public API: counts in one
//! call, gates with given limits, and "has everything settled".

#![allow(dead_code)] // each test binary uses part of it

use futures::FutureExt;
use tokio_test::task::{Spawn, spawn};
use tokio_test::{assert_pending, assert_ready};
use tower_admission::{
    Acquire, AdmissionConfig, AdmitSource, Counts, Descriptor, Gate, Permit, RejectionScope,
    Snapshot,
};

/// Counts of `engine_requests` admitted, `engine_waiting` of them without a
/// first token, and `queued` requests.
pub fn counts(engine_requests: usize, engine_waiting: usize, queued: usize) -> Counts {
    Counts::new(engine_requests, engine_waiting, queued)
}

/// A gate with explicit per-rank limits and no capacity report.
pub fn gate(requests: usize, waiting: usize, queue: usize) -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(requests)
            .engine_request_waiting_limit(waiting)
            .request_queue_limit(queue),
    )
}

/// Asserts that nothing is admitted or queued anywhere and that every
/// request received has ended in exactly one way.
pub fn assert_idle(snapshot: &Snapshot) {
    assert_eq!(
        snapshot.total,
        Counts::default(),
        "total counts: {snapshot:?}"
    );
    assert_eq!(
        snapshot.unranked,
        Counts::default(),
        "unranked: {snapshot:?}"
    );
    for (rank, counts) in snapshot.ranks.iter().enumerate() {
        assert_eq!(*counts, Counts::default(), "rank {rank}: {snapshot:?}");
    }
    let tally = snapshot.tally;
    assert_eq!(tally.received, tally.settled(), "tally: {tally:?}");
}

/// A request that must be admitted on arrival.
#[track_caller]
pub fn admitted_with(gate: &Gate, request: Descriptor) -> Permit {
    let permit = gate
        .acquire_with(request)
        .now_or_never()
        .expect("decided on arrival")
        .expect("admitted");
    assert_eq!(permit.source(), AdmitSource::Direct);
    permit
}

/// A request that must be queued on arrival.
#[track_caller]
pub fn queued_with(gate: &Gate, request: Descriptor) -> Spawn<Acquire> {
    let mut acquire = spawn(gate.acquire_with(request));
    assert!(acquire.is_queued(), "expected the request to be queued");
    assert_pending!(acquire.poll());
    acquire
}

/// A request that must be rejected on arrival; returns the scope.
#[track_caller]
pub fn rejected_with(gate: &Gate, request: Descriptor) -> RejectionScope {
    gate.acquire_with(request)
        .now_or_never()
        .expect("decided on arrival")
        .expect_err("rejected")
        .scope()
}

/// A queued request that must have been admitted and woken.
#[track_caller]
pub fn admitted_from_queue(acquire: &mut Spawn<Acquire>) -> Permit {
    assert!(acquire.is_woken(), "an admitted waiter is woken");
    let permit = assert_ready!(acquire.poll()).expect("admitted");
    assert_eq!(permit.source(), AdmitSource::Queue);
    permit
}
