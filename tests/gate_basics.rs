//! The gate's behaviour across its public API: behaviour §2 (two engine limits and
//! a bounded FIFO queue), §3 (data-parallel ranks) and §5 (capacity reports).

use std::future::Future;

use futures::FutureExt;
use tokio_test::task::{Spawn, spawn};
use tokio_test::{assert_pending, assert_ready};
use tower_admission::{
    Acquire, AdmissionConfig, Descriptor, EngineCapacity, Gate, Permit, RejectionScope,
};

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::{admitted_from_queue, admitted_with, counts, gate, queued_with, rejected_with};

fn ranked(rank: Option<u32>) -> Descriptor {
    Descriptor::new().with_rank(rank)
}

/// A request that must be admitted on arrival.
#[track_caller]
fn admitted(gate: &Gate, rank: Option<u32>) -> Permit {
    admitted_with(gate, ranked(rank))
}

/// A request that must be queued on arrival.
#[track_caller]
fn queued(gate: &Gate, rank: Option<u32>) -> Spawn<Acquire> {
    queued_with(gate, ranked(rank))
}

/// A request that must be rejected on arrival; returns the scope.
#[track_caller]
fn rejected(gate: &Gate, rank: Option<u32>) -> RejectionScope {
    rejected_with(gate, ranked(rank))
}

#[test]
fn the_seed_burst_admits_twelve_queues_eight_and_rejects_fifteen() {
    let gate = gate(12, 12, 8);
    let mut permits = Vec::new();
    let mut waiters = Vec::new();
    let mut rejections = 0;
    for _ in 0..35 {
        let mut acquire = spawn(gate.acquire(None));
        if acquire.is_queued() {
            assert_pending!(acquire.poll());
            waiters.push(acquire);
        } else {
            match assert_ready!(acquire.poll()) {
                Ok(permit) => permits.push(permit),
                Err(_) => rejections += 1,
            }
        }
    }
    assert_eq!((permits.len(), waiters.len(), rejections), (12, 8, 15));
    assert_eq!(gate.snapshot().total, counts(12, 12, 8));

    // As the twelve finish, the eight enter in arrival order.
    for finished in 0..8 {
        drop(permits.remove(0));
        for (i, waiter) in waiters.iter_mut().enumerate() {
            if i == finished {
                permits.push(admitted_from_queue(waiter));
            } else if i > finished {
                assert!(
                    !waiter.is_woken(),
                    "waiter {i} woke before waiter {finished}"
                );
                assert_pending!(waiter.poll());
            }
        }
    }
    assert_eq!(gate.snapshot().total, counts(12, 12, 0));
    let tally = gate.snapshot().tally;
    assert_eq!(tally.received, 35);
    assert_eq!(tally.admitted_direct, 12);
    assert_eq!(tally.admitted_queue, 8);
    assert_eq!(tally.rejected(), 15);
}

#[test]
fn the_request_limit_holds_work_back_on_its_own() {
    let gate = gate(2, 10, 4);
    let mut first = admitted(&gate, None);
    let mut second = admitted(&gate, None);
    first.first_token();
    second.first_token();
    // Nobody waits for a first token, but two responses are still streaming.
    let mut third = queued(&gate, None);
    assert_eq!(gate.snapshot().total, counts(2, 0, 1));
    drop(first);
    admitted_from_queue(&mut third);
}

#[test]
fn the_waiting_limit_holds_work_back_on_its_own() {
    let gate = gate(10, 2, 4);
    let _first = admitted(&gate, None);
    let _second = admitted(&gate, None);
    let third = queued(&gate, None);
    assert_eq!(gate.snapshot().total, counts(2, 2, 1));
    drop(third);
}

#[test]
fn a_first_token_admits_a_queued_request_only_when_the_request_limit_has_room() {
    // Request limit full: a first token frees waiting capacity, but the
    // queued request still has no request slot.
    let gate = gate(2, 2, 4);
    let mut first = admitted(&gate, None);
    let _second = admitted(&gate, None);
    let mut third = queued(&gate, None);
    first.first_token();
    assert!(!third.is_woken());
    assert_pending!(third.poll());
    drop(first);
    admitted_from_queue(&mut third);

    // Request limit with room: the first token is what lets it in.
    let gate = self::gate(3, 2, 4);
    let mut first = admitted(&gate, None);
    let _second = admitted(&gate, None);
    let mut third = queued(&gate, None);
    first.first_token();
    admitted_from_queue(&mut third);
}

#[test]
fn a_completion_admits_a_queued_request_only_when_the_waiting_limit_has_room() {
    // The waiting limit stays full after a completion of a request that had
    // already produced its first token.
    let gate = gate(3, 2, 4);
    let mut streaming = admitted(&gate, None);
    streaming.first_token();
    let _waiting_a = admitted(&gate, None);
    let waiting_b = admitted(&gate, None);
    let mut queued_request = queued(&gate, None);
    drop(streaming);
    assert!(!queued_request.is_woken());
    assert_pending!(queued_request.poll());
    // A completion without a first token frees both.
    drop(waiting_b);
    admitted_from_queue(&mut queued_request);
}

#[test]
fn a_queue_limit_of_zero_rejects_at_once_and_admits_again_after_a_release() {
    let gate = gate(1, 1, 0);
    let permit = admitted(&gate, None);
    assert_eq!(rejected(&gate, None), RejectionScope::Worker);
    drop(permit);
    let _again = admitted(&gate, None);
}

#[test]
fn waiters_are_admitted_in_fifo_order() {
    let gate = gate(1, 1, 100);
    let mut holder = admitted(&gate, None);
    let mut waiters: Vec<_> = (0..100).map(|_| queued(&gate, None)).collect();
    for next in 0..100 {
        drop(holder);
        holder = admitted_from_queue(&mut waiters[next]);
        for later in &mut waiters[next + 1..] {
            assert!(!later.is_woken());
        }
    }
    drop(holder);
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[test]
fn a_new_request_never_bypasses_an_older_waiter() {
    let gate = gate(1, 1, 4);
    let holder = admitted(&gate, None);
    let mut older = queued(&gate, None);
    drop(holder);
    // The freed slot is already the older waiter's, even before it polls.
    let mut newcomer = spawn(gate.acquire(None));
    assert!(newcomer.is_queued());
    assert_pending!(newcomer.poll());
    let older_permit = admitted_from_queue(&mut older);
    assert!(!newcomer.is_woken());
    drop(older_permit);
    admitted_from_queue(&mut newcomer);
}

#[test]
fn capacity_is_released_exactly_once_however_the_permit_ends() {
    let gate = gate(2, 2, 0);

    // First token twice, then drop.
    let mut permit = admitted(&gate, None);
    permit.first_token();
    permit.first_token();
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));
    drop(permit);
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));

    // End without a token.
    let permit = admitted(&gate, None);
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    drop(permit);
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));

    // Dropped before and after the first token, side by side.
    let before = admitted(&gate, None);
    let mut after = admitted(&gate, None);
    after.first_token();
    assert_eq!(gate.snapshot().total, counts(2, 1, 0));
    drop(before);
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));
    drop(after);
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[test]
fn a_permit_held_by_a_panicking_task_is_released() {
    let gate = gate(1, 1, 0);
    let permit = admitted(&gate, None);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _held = permit;
        panic!("handler failed");
    }));
    assert!(result.is_err());
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
    let _again = admitted(&gate, None);
}

#[test]
fn a_request_cancelled_while_queued_frees_its_place() {
    let gate = gate(1, 1, 1);
    let holder = admitted(&gate, None);
    let waiter = queued(&gate, None);
    assert_eq!(rejected(&gate, None), RejectionScope::Worker);
    drop(waiter);
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    let mut replacement = queued(&gate, None);
    drop(holder);
    admitted_from_queue(&mut replacement);
    assert_eq!(gate.snapshot().tally.cancelled, 1);
}

#[test]
fn a_cancellation_racing_an_admission_wins_and_the_capacity_passes_on() {
    let gate = gate(1, 1, 4);
    let holder = admitted(&gate, None);
    let first = queued(&gate, None);
    let mut second = queued(&gate, None);
    drop(holder); // offered to `first`, which has not polled yet
    assert!(first.is_woken());
    drop(first); // cancelled: the offer passes on
    admitted_from_queue(&mut second);
    let tally = gate.snapshot().tally;
    assert_eq!(
        (tally.admitted_direct, tally.admitted_queue, tally.cancelled),
        (1, 1, 1)
    );
}

fn ranked_gate(requests: usize, queue: usize, ranks: usize) -> Gate {
    gate(requests, requests, queue).tap_report(EngineCapacity::new(64, ranks))
}

trait TapReport {
    fn tap_report(self, capacity: EngineCapacity) -> Self;
}

impl TapReport for Gate {
    fn tap_report(self, capacity: EngineCapacity) -> Self {
        self.report_capacity(capacity);
        self
    }
}

#[test]
fn a_busy_rank_does_not_block_another() {
    let gate = ranked_gate(1, 1, 2);
    let _rank0 = admitted(&gate, Some(0));
    let _rank0_waiter = queued(&gate, Some(0));
    let rank1 = admitted(&gate, Some(1));
    assert_eq!(rank1.rank(), Some(1));
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.ranks, vec![counts(1, 1, 1), counts(1, 1, 0)]);
}

#[test]
fn unranked_requests_use_combined_capacity() {
    let gate = ranked_gate(2, 0, 2);
    let permits: Vec<_> = (0..4).map(|_| admitted(&gate, None)).collect();
    assert!(permits.iter().all(|permit| permit.rank().is_none()));
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.unranked, counts(4, 4, 0));
    assert_eq!(snapshot.ranks, vec![counts(0, 0, 0); 2]);
    assert_eq!(rejected(&gate, None), RejectionScope::Worker);
}

#[test]
fn ranked_requests_can_hold_unranked_ones_back() {
    let gate = ranked_gate(2, 1, 2);
    let _a = admitted(&gate, Some(0));
    let _b = admitted(&gate, Some(0));
    let _c = admitted(&gate, Some(1));
    let d = admitted(&gate, Some(1));
    // Combined engine capacity (4) is full: an unranked request queues.
    let mut unranked = queued(&gate, None);
    drop(d);
    admitted_from_queue(&mut unranked);
}

#[test]
fn unranked_requests_can_hold_ranked_ones_back() {
    let gate = ranked_gate(2, 1, 2);
    let _unranked: Vec<_> = (0..4).map(|_| admitted(&gate, None)).collect();
    // Rank 0 has room of its own, but the combined capacity is used up.
    assert_eq!(gate.snapshot().ranks[0], counts(0, 0, 0));
    let rank0 = queued(&gate, Some(0));
    // Combined queue space is 2; one unranked and one rank-0 request fill it.
    let _unranked_waiter = queued(&gate, None);
    assert_eq!(rejected(&gate, Some(1)), RejectionScope::Worker);
    drop(rank0);
}

#[test]
fn an_unrecognised_rank_is_unranked() {
    let gate = ranked_gate(1, 0, 2);
    let permit = admitted(&gate, Some(2));
    assert_eq!(permit.rank(), None);
    assert_eq!(gate.snapshot().unranked, counts(1, 1, 0));
    let permit = admitted(&gate, Some(u32::MAX));
    assert_eq!(permit.rank(), None);
}

#[test]
fn before_the_first_capacity_report_every_request_is_unranked() {
    let gate = gate(2, 2, 0);
    let permit = admitted(&gate, Some(0));
    assert_eq!(permit.rank(), None);
    let snapshot = gate.snapshot();
    assert!(snapshot.ranks.is_empty());
    assert_eq!(snapshot.unranked, counts(1, 1, 0));
    assert_eq!(snapshot.capacity, None);
}

#[test]
fn a_rejection_names_the_rank_while_the_worker_can_take_other_work() {
    let gate = ranked_gate(1, 0, 2);
    let _rank0 = admitted(&gate, Some(0));
    assert_eq!(rejected(&gate, Some(0)), RejectionScope::Rank(0));
    let _rank1 = admitted(&gate, Some(1));
    // Now the worker can neither admit nor queue anything.
    assert_eq!(rejected(&gate, Some(0)), RejectionScope::Worker);
    assert_eq!(rejected(&gate, Some(1)), RejectionScope::Worker);
}

#[test]
fn a_full_rank_queue_is_rank_scoped_while_another_rank_can_queue() {
    let gate = ranked_gate(1, 1, 2);
    let _rank0 = admitted(&gate, Some(0));
    let _rank0_waiter = queued(&gate, Some(0));
    let _rank1 = admitted(&gate, Some(1));
    assert_eq!(rejected(&gate, Some(0)), RejectionScope::Rank(0));
    let _rank1_waiter = queued(&gate, Some(1));
    assert_eq!(rejected(&gate, Some(0)), RejectionScope::Worker);
}

#[test]
fn unranked_rejections_are_always_worker_scoped() {
    // Rank 1 has plenty of room, but the unranked request does not fit the
    // combined queue space... which it cannot lack while rank 1 has room, so
    // use a queue limit of zero and a full combined engine.
    let gate = ranked_gate(1, 0, 2);
    let _a = admitted(&gate, None);
    let _b = admitted(&gate, None);
    assert_eq!(rejected(&gate, None), RejectionScope::Worker);
    let stats = gate.snapshot().tally;
    assert_eq!((stats.rejected_worker, stats.rejected_rank), (1, 0));
}

#[test]
fn capacity_growth_wakes_waiters_at_once() {
    let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(1, 1)));
    let _holder = admitted(&gate, None);
    let mut waiters: Vec<_> = (0..2).map(|_| queued(&gate, None)).collect();
    gate.report_capacity(EngineCapacity::new(3, 1));
    for waiter in &mut waiters {
        admitted_from_queue(waiter);
    }
    assert_eq!(gate.snapshot().limits.engine_request_limit, 3);
}

#[test]
fn capacity_shrink_never_revokes_held_capacity() {
    let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(4, 1)));
    let permits: Vec<_> = (0..4).map(|_| admitted(&gate, None)).collect();
    gate.report_capacity(EngineCapacity::new(2, 1));
    assert_eq!(gate.snapshot().total, counts(4, 4, 0));
    let mut waiter = queued(&gate, None);
    let mut permits = permits.into_iter();
    drop(permits.next());
    drop(permits.next());
    assert!(!waiter.is_woken(), "still above the new limit");
    drop(permits.next());
    admitted_from_queue(&mut waiter);
}

#[test]
fn explicit_settings_ignore_capacity_reports() {
    let gate = gate(2, 3, 5);
    gate.report_capacity(EngineCapacity::new(100, 1));
    let limits = gate.snapshot().limits;
    assert_eq!(
        (
            limits.engine_request_limit,
            limits.engine_request_waiting_limit,
            limits.request_queue_limit
        ),
        (2, 3, 5)
    );
}

#[test]
fn defaults_follow_each_report() {
    let gate = Gate::new(AdmissionConfig::new());
    assert_eq!(gate.limits_in_force().per_rank.engine_request_limit, 10_000);
    assert_eq!(gate.limits_in_force().per_rank.request_queue_limit, 20_000);
    gate.report_capacity(EngineCapacity::new(48, 2));
    let limits = gate.limits_in_force().per_rank;
    assert_eq!(
        (
            limits.engine_request_limit,
            limits.engine_request_waiting_limit,
            limits.request_queue_limit
        ),
        (48, 48, 96)
    );
}

#[test]
fn an_empty_capacity_report_changes_nothing() {
    let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(8, 2)));
    let before = gate.snapshot();
    gate.report_capacity(EngineCapacity::new(0, 2));
    gate.report_capacity(EngineCapacity::new(8, 0));
    assert_eq!(gate.snapshot(), before);
}

#[test]
fn queued_requests_of_a_vanished_rank_become_unranked_in_age_order() {
    let gate = ranked_gate(1, 4, 3);
    let _r0 = admitted(&gate, Some(0));
    let _r1 = admitted(&gate, Some(1));
    let r2 = admitted(&gate, Some(2));
    let mut unranked_old = queued(&gate, None);
    let mut rank2_waiter = queued(&gate, Some(2));
    let mut unranked_new = queued(&gate, None);
    // Rank 2 vanishes; its admitted request keeps its capacity, now counted
    // as unranked, and its queued request joins the unranked queue by age.
    gate.report_capacity(EngineCapacity::new(64, 2));
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.ranks.len(), 2);
    assert_eq!(snapshot.unranked, counts(1, 1, 3));
    assert_eq!(snapshot.total, counts(3, 3, 3));

    drop(r2);
    // Combined capacity is 2 now and 2 are held: nothing fits yet.
    assert!(!unranked_old.is_woken());
    drop(_r0);
    let first = admitted_from_queue(&mut unranked_old);
    assert_eq!(first.rank(), None);
    drop(first);
    let second = admitted_from_queue(&mut rank2_waiter);
    assert_eq!(second.rank(), None);
    assert!(!unranked_new.is_woken());
    drop(second);
    admitted_from_queue(&mut unranked_new);
}

#[test]
fn a_rank_that_reappears_starts_from_its_own_counts() {
    let gate = ranked_gate(2, 0, 2);
    let old = admitted(&gate, Some(1));
    gate.report_capacity(EngineCapacity::new(64, 1));
    gate.report_capacity(EngineCapacity::new(64, 2));
    assert_eq!(gate.snapshot().ranks[1], counts(0, 0, 0));
    let fresh = admitted(&gate, Some(1));
    assert_eq!(gate.snapshot().ranks[1], counts(1, 1, 0));
    drop(old); // counted as unranked since rank 1 vanished
    assert_eq!(gate.snapshot().ranks[1], counts(1, 1, 0));
    assert_eq!(gate.snapshot().unranked, counts(0, 0, 0));
    drop(fresh);
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[test]
fn a_panicking_waker_does_not_keep_the_other_admitted_waiters_asleep() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Wake, Waker};

    struct Panicking;
    impl Wake for Panicking {
        fn wake(self: Arc<Self>) {
            panic!("a waker that panics");
        }
    }
    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(1, 1)));
    let _holder = admitted(&gate, None);
    let mut first = gate.acquire(None);
    let mut second = gate.acquire(None);
    let panicking = Waker::from(Arc::new(Panicking));
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let flagged = Waker::from(flag.clone());
    assert!(
        std::pin::Pin::new(&mut first)
            .poll(&mut Context::from_waker(&panicking))
            .is_pending()
    );
    assert!(
        std::pin::Pin::new(&mut second)
            .poll(&mut Context::from_waker(&flagged))
            .is_pending()
    );

    // Growth admits both at once; waking the first panics.
    let grown = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        gate.report_capacity(EngineCapacity::new(3, 1))
    }));
    assert!(grown.is_err());
    assert!(flag.0.load(Ordering::SeqCst), "the second waiter was woken");
    assert!(second.now_or_never().unwrap().is_ok());
    assert!(first.now_or_never().unwrap().is_ok());
}
