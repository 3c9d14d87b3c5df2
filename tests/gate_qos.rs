//! Quality of service across the gate's public API (behaviour §8): priority
//! bands, tenants, displacement, and the default that stays FIFO.

use tokio_test::{assert_pending, assert_ready};
use tower_admission::{
    AdmissionConfig, Descriptor, EngineCapacity, Gate, RejectionReason, RejectionScope, Tenant,
};

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::{admitted_from_queue, admitted_with, assert_idle, gate, queued_with};

fn priority(priority: i32) -> Descriptor {
    Descriptor::new().with_priority(priority)
}

fn tenant(name: &str) -> Descriptor {
    Descriptor::new().with_tenant(Tenant::new(name))
}

#[test]
fn higher_priority_waiters_are_admitted_first() {
    let gate = gate(1, 1, 10);
    let running = admitted_with(&gate, Descriptor::new());
    let mut low = queued_with(&gate, priority(0));
    let mut high = queued_with(&gate, priority(5));
    drop(running);
    assert!(!low.is_woken(), "the older, lower request still waits");
    let high = admitted_from_queue(&mut high);
    assert_pending!(low.poll());
    drop(high);
    drop(admitted_from_queue(&mut low));
    assert_idle(&gate.snapshot());
}

#[test]
fn tenants_take_turns_within_a_band() {
    let gate = gate(1, 1, 10);
    let mut running = admitted_with(&gate, Descriptor::new());
    let mut waiting = Vec::new();
    for name in ["X1", "X2", "X3"] {
        waiting.push((name, queued_with(&gate, tenant("x"))));
    }
    for name in ["Y1", "Y2"] {
        waiting.push((name, queued_with(&gate, tenant("y"))));
    }
    let mut order = Vec::new();
    while !waiting.is_empty() {
        drop(running);
        let at = waiting
            .iter()
            .position(|(_, acquire)| acquire.is_woken())
            .expect("one waiter is woken");
        let (name, mut acquire) = waiting.remove(at);
        running = admitted_from_queue(&mut acquire);
        order.push(name);
    }
    drop(running);
    assert_eq!(order, ["X1", "Y1", "X2", "Y2", "X3"]);
    assert_idle(&gate.snapshot());
}

#[test]
fn a_displaced_waiter_is_woken_with_its_overload_answer_at_once() {
    let gate = gate(1, 1, 2);
    let running = admitted_with(&gate, Descriptor::new());
    let mut older = queued_with(&gate, priority(0));
    let mut newer = queued_with(&gate, priority(0));
    let mut urgent = queued_with(&gate, priority(5));
    assert!(newer.is_woken(), "the displaced waiter hears at once");
    let overloaded = assert_ready!(newer.poll()).expect_err("displaced");
    assert_eq!(overloaded.reason(), RejectionReason::Displaced);
    assert_eq!(overloaded.reason().as_str(), "displaced");
    assert_eq!(overloaded.scope(), RejectionScope::Worker);
    assert_eq!(gate.snapshot().tally.displaced(), 1);
    drop(running);
    let urgent = admitted_from_queue(&mut urgent);
    drop(urgent);
    drop(admitted_from_queue(&mut older));
    assert_idle(&gate.snapshot());
}

#[test]
fn a_displaced_waiter_dropped_before_it_hears_leaks_nothing() {
    let gate = gate(1, 1, 1);
    let running = admitted_with(&gate, Descriptor::new());
    let low = queued_with(&gate, priority(-1));
    let mut high = queued_with(&gate, priority(0));
    drop(low);
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.tally.cancelled, 0, "counted once, as displaced");
    assert_eq!(snapshot.tally.displaced(), 1);
    drop(running);
    drop(admitted_from_queue(&mut high));
    assert_idle(&gate.snapshot());
}

#[test]
fn a_ranked_displacement_is_rank_scoped_while_other_ranks_have_room() {
    let gate = Gate::new(
        AdmissionConfig::new()
            .request_queue_limit(1)
            .capacity(EngineCapacity::new(1, 2)),
    );
    let on = |rank| Descriptor::new().with_rank(Some(rank));
    let _running = admitted_with(&gate, on(0));
    let mut low = queued_with(&gate, on(0).with_priority(0));
    let _high = queued_with(&gate, on(0).with_priority(3));
    let overloaded = assert_ready!(low.poll()).expect_err("displaced");
    assert_eq!(overloaded.scope(), RejectionScope::Rank(0));
    assert_eq!(overloaded.reason(), RejectionReason::Displaced);
}

#[test]
fn without_priority_or_tenant_the_queue_is_fifo() {
    let gate = gate(1, 1, 10);
    let mut running = admitted_with(&gate, Descriptor::new());
    let mut waiting: Vec<_> = (0..6)
        .map(|_| queued_with(&gate, Descriptor::new()))
        .collect();
    for _ in 0..6 {
        drop(running);
        let mut first = waiting.remove(0);
        assert!(waiting.iter().all(|acquire| !acquire.is_woken()));
        running = admitted_from_queue(&mut first);
    }
    drop(running);
    assert_idle(&gate.snapshot());
}

#[test]
fn a_higher_priority_ranked_waiter_goes_before_an_older_unranked_one() {
    // Two ranks of one request each: each rank is full, and so is the
    // worker's combined capacity.
    let gate = Gate::new(
        AdmissionConfig::new()
            .request_queue_limit(4)
            .capacity(EngineCapacity::new(1, 2)),
    );
    let on = |rank| Descriptor::new().with_rank(Some(rank));
    let on_rank0 = admitted_with(&gate, on(0));
    let on_rank1 = admitted_with(&gate, on(1));
    let mut unranked_low = queued_with(&gate, priority(0));
    let mut rank0_high = queued_with(&gate, on(0).with_priority(2));
    // Rank 0 frees its place: both waiters fit, the higher band goes first
    // although the unranked one is older.
    drop(on_rank0);
    assert!(!unranked_low.is_woken());
    let high = admitted_from_queue(&mut rank0_high);
    assert_pending!(unranked_low.poll());
    // Rank 1 frees its place: the unranked waiter fits the combined capacity.
    drop(on_rank1);
    let low = admitted_from_queue(&mut unranked_low);
    drop((high, low));
    assert_idle(&gate.snapshot());
}

/// One engine slot and ten queue places; a waiting band rises a band a
/// second, on tokio's clock.
fn aging_gate() -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(10)
            .aging_interval(std::time::Duration::from_secs(1))
            .clock(|| tokio::time::Instant::now().into_std()),
    )
}

#[tokio::test(start_paused = true)]
async fn an_aged_waiter_goes_before_newer_higher_priority_work() {
    let gate = aging_gate();
    let running = admitted_with(&gate, Descriptor::new());
    let mut low = queued_with(&gate, priority(0));
    // After one interval the low band is level with band 1, and older.
    tokio::time::advance(std::time::Duration::from_millis(1_500)).await;
    let mut high = queued_with(&gate, priority(1));
    drop(running);
    assert!(!high.is_woken());
    let low_permit = admitted_from_queue(&mut low);
    assert_pending!(high.poll());
    drop(low_permit);
    drop(admitted_from_queue(&mut high));
    assert_idle(&gate.snapshot());
}

#[tokio::test(start_paused = true)]
async fn before_an_aging_interval_passes_the_higher_band_still_goes_first() {
    let gate = aging_gate();
    let running = admitted_with(&gate, Descriptor::new());
    let mut low = queued_with(&gate, priority(0));
    tokio::time::advance(std::time::Duration::from_millis(900)).await;
    let mut high = queued_with(&gate, priority(1));
    drop(running);
    assert!(!low.is_woken());
    drop(admitted_from_queue(&mut high));
    drop(admitted_from_queue(&mut low));
    assert_idle(&gate.snapshot());
}
