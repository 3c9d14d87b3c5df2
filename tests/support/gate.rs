//! Helpers for tests of the gate through its public API: counts in one
//! call, gates with given limits, and "has everything settled".

#![allow(dead_code)] // each test binary uses part of it

use tower_admission::{AdmissionConfig, Counts, Gate, Snapshot};

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
