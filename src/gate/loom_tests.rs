//! Model checking of the gate with loom: every interleaving of a few
//! threads acquiring, cancelling, seeing first tokens and releasing.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release --lib --no-default-features gate::loom_tests`.

use ::loom::future::block_on;
use ::loom::thread;

use crate::{
    Acquire, AdmissionConfig, AdmitSource, Cost, Counts, Descriptor, EngineCapacity, Gate, Permit,
};

fn gate(requests: usize, waiting: usize, queue: usize) -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(requests)
            .engine_request_waiting_limit(waiting)
            .request_queue_limit(queue),
    )
}

fn assert_empty(gate: &Gate) {
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.total, Counts::default());
    let tally = snapshot.tally;
    assert_eq!(tally.received, tally.settled());
}

/// A request admitted on `gate` (a plain one: by the lane when it is open)
/// and one queued behind it.
fn hold_one_queue_one(gate: &Gate) -> (Permit, Acquire) {
    let holder = block_on(gate.acquire(None)).unwrap();
    let waiter = gate.acquire(None);
    assert!(waiter.is_queued());
    (holder, waiter)
}

/// Marks `holder`'s first token `times` times on another thread, which
/// hands the permit back.
fn first_token_elsewhere(mut holder: Permit, times: usize) -> thread::JoinHandle<Permit> {
    thread::spawn(move || {
        for _ in 0..times {
            holder.first_token();
        }
        holder
    })
}

#[test]
fn a_release_on_another_thread_always_wakes_the_waiter() {
    ::loom::model(|| {
        let gate = gate(1, 1, 1);
        let (holder, waiter) = hold_one_queue_one(&gate);
        let releaser = thread::spawn(move || drop(holder));
        // Must complete: a lost wake-up would hang the model.
        let permit = block_on(waiter).unwrap();
        assert_eq!(permit.source(), AdmitSource::Queue);
        releaser.join().unwrap();
        drop(permit);
        assert_empty(&gate);
    });
}

#[test]
fn a_first_token_on_another_thread_admits_the_waiter() {
    ::loom::model(|| {
        let gate = gate(2, 1, 1);
        let (holder, waiter) = hold_one_queue_one(&gate);
        let streamer = first_token_elsewhere(holder, 2);
        let permit = block_on(waiter).unwrap();
        let holder = streamer.join().unwrap();
        // Never past a limit: two requests, at most one waiting.
        assert!(gate.snapshot().total.engine_waiting <= 1);
        drop((permit, holder));
        assert_empty(&gate);
    });
}

#[test]
fn a_cancel_racing_a_release_passes_the_capacity_on() {
    ::loom::model(|| {
        let gate = gate(1, 1, 2);
        let holder = block_on(gate.acquire(None)).unwrap();
        let cancelled = gate.acquire(None);
        let next = gate.acquire(None);
        assert!(cancelled.is_queued() && next.is_queued());
        let releaser = thread::spawn(move || drop(holder));
        let canceller = thread::spawn(move || drop(cancelled));
        // Whichever comes first, the capacity reaches `next`.
        let permit = block_on(next).unwrap();
        releaser.join().unwrap();
        canceller.join().unwrap();
        assert_eq!(gate.snapshot().total.engine_requests, 1);
        drop(permit);
        assert_empty(&gate);
        assert_eq!(gate.snapshot().tally.cancelled, 1);
    });
}

#[test]
fn concurrent_arrivals_never_exceed_the_limits() {
    ::loom::model(|| {
        let gate = gate(1, 1, 0);
        let other = gate.clone();
        let contender =
            thread::spawn(move || block_on(other.acquire(None)).ok().map(drop).is_some());
        let mine = block_on(gate.acquire(None)).ok();
        let admitted_here = mine.is_some();
        if admitted_here {
            assert_eq!(gate.snapshot().total.engine_requests, 1);
        }
        drop(mine);
        let admitted_there = contender.join().unwrap();
        assert!(admitted_here || admitted_there);
        assert_empty(&gate);
    });
}

#[test]
fn a_capacity_report_racing_a_release_and_a_cancel_loses_nothing() {
    ::loom::model(|| {
        // Limits follow the engine: one sequence, so one admitted, two queued.
        let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(1, 1)));
        let holder = block_on(gate.acquire(None)).unwrap();
        let cancelled = gate.acquire(None);
        let next = gate.acquire(None);
        assert!(cancelled.is_queued() && next.is_queued());
        let releaser = thread::spawn(move || drop(holder));
        let reporter = {
            let gate = gate.clone();
            thread::spawn(move || gate.report_capacity(EngineCapacity::new(2, 1)))
        };
        drop(cancelled);
        // Whatever the order, `next` gets in: by the release or the growth.
        let permit = block_on(next).unwrap();
        releaser.join().unwrap();
        reporter.join().unwrap();
        assert!(gate.snapshot().total.engine_requests <= 2);
        drop(permit);
        assert_empty(&gate);
        assert_eq!(gate.snapshot().tally.cancelled, 1);
        assert_eq!(gate.limits_in_force().per_rank.engine_request_limit, 2);
    });
}

#[test]
fn a_token_budget_freed_on_another_thread_admits_the_next_long_prompt() {
    ::loom::model(|| {
        let gate = Gate::new(AdmissionConfig::new().engine_waiting_token_limit(1000));
        let long = Descriptor::new().with_cost(Cost::prompt(800));
        let holder = block_on(gate.acquire_with(long)).unwrap();
        let waiter = gate.acquire_with(long);
        assert!(waiter.is_queued());
        let streamer = first_token_elsewhere(holder, 1);
        // Must complete: the first token frees the budget.
        let permit = block_on(waiter).unwrap();
        assert!(gate.snapshot().total.engine_waiting_tokens <= 800);
        let holder = streamer.join().unwrap();
        drop((permit, holder));
        assert_empty(&gate);
    });
}

// The lock-free lane (`lane.rs`): plain unranked requests while nothing is
// queued take one atomic operation per event; everything else the lock.

#[test]
fn a_lane_release_racing_an_arrival_that_queues_reaches_the_arrival() {
    ::loom::model(|| {
        let gate = gate(1, 1, 1);
        let holder = block_on(gate.acquire(None)).unwrap();
        let releaser = thread::spawn(move || drop(holder));
        // Admitted by the lane after the release, or queued before it and
        // handed the capacity: either way it must complete.
        let permit = block_on(gate.acquire(None)).unwrap();
        releaser.join().unwrap();
        assert_eq!(gate.snapshot().total.engine_requests, 1);
        drop(permit);
        assert_empty(&gate);
        assert_eq!(gate.snapshot().tally.admitted(), 2);
    });
}

#[test]
fn a_lane_arrival_racing_a_locked_arrival_never_passes_the_limit() {
    ::loom::model(|| {
        let gate = gate(1, 1, 0);
        let other = gate.clone();
        // A rank (unrecognised: no report yet) sends it through the lock.
        let locked = thread::spawn(move || block_on(other.acquire(Some(0))));
        let plain = block_on(gate.acquire(None));
        let locked = locked.join().unwrap();
        assert!(
            plain.is_ok() != locked.is_ok(),
            "one admitted, one rejected"
        );
        assert_eq!(gate.snapshot().total.engine_requests, 1);
        drop((plain, locked));
        assert_empty(&gate);
        assert_eq!(gate.snapshot().tally.received, 2);
    });
}

#[test]
fn a_lane_first_token_racing_a_locked_arrival_frees_the_waiting_place() {
    ::loom::model(|| {
        let gate = gate(2, 1, 1);
        let holder = block_on(gate.acquire(None)).unwrap();
        let streamer = first_token_elsewhere(holder, 1);
        // Waiting is full until the first token: admitted after it, or
        // queued before it and admitted by it.
        let permit = block_on(gate.acquire(Some(0))).unwrap();
        assert!(gate.snapshot().total.engine_waiting <= 1);
        let holder = streamer.join().unwrap();
        drop((permit, holder));
        assert_empty(&gate);
    });
}
