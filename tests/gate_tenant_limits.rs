//! Per-tenant limits across the gate's public API: a tenant at its engine
//! limit waits in its own flow without holding up other tenants and without
//! being overtaken inside itself; a tenant over its queue limit is refused
//! at once, tenant-scoped; state stays bounded whatever the number of
//! tenants; and without tenant limits nothing changes.

use tokio_test::assert_pending;
use tower_admission::{
    AdmissionConfig, Cost, Descriptor, EngineCapacity, Gate, RejectionReason, RejectionScope,
    TenantLimits,
};

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::{admitted_from_queue, admitted_with, assert_idle, queued_with};

fn of(name: &str) -> Descriptor {
    Descriptor::new().with_tenant(name)
}

fn costing(name: &str, prompt: usize, output: usize) -> Descriptor {
    let mut descriptor = of(name);
    descriptor.cost = Cost::new(prompt, Some(output));
    descriptor
}

/// A gate of `requests` engine slots (and as many waiting slots), a queue of
/// 100, and the tenant limits of `config`.
fn gate(requests: usize, config: AdmissionConfig) -> Gate {
    Gate::new(
        config
            .engine_request_limit(requests)
            .engine_request_waiting_limit(requests)
            .request_queue_limit(100),
    )
}

fn refused(gate: &Gate, request: Descriptor) -> tower_admission::Overloaded {
    use futures::FutureExt;
    gate.acquire_with(request)
        .now_or_never()
        .expect("decided on arrival")
        .expect_err("refused")
}

#[test]
fn a_tenant_at_its_request_limit_waits_while_others_enter() {
    let gate = gate(4, AdmissionConfig::new().tenant_request_limit(1));
    let a1 = admitted_with(&gate, of("a"));
    let mut a2 = queued_with(&gate, of("a"));
    // The engine has room: another tenant is neither queued behind `a` nor
    // held back by it.
    let b1 = admitted_with(&gate, of("b"));
    let c1 = admitted_with(&gate, of("c"));
    assert_pending!(a2.poll());
    assert_eq!(gate.snapshot().total.queued, 1);
    drop(a1);
    let a2 = admitted_from_queue(&mut a2);
    drop((a2, b1, c1));
    assert_idle(&gate.snapshot());
}

#[test]
fn a_tenant_at_its_limit_does_not_block_the_queue_behind_it() {
    // One engine slot taken by someone else: `a` (at its limit) and `b`
    // both queue; when the slot frees, `b` goes past `a`'s parked flow.
    let gate = gate(2, AdmissionConfig::new().tenant_request_limit(1));
    let a1 = admitted_with(&gate, of("a"));
    let other = admitted_with(&gate, of("z"));
    let mut a2 = queued_with(&gate, of("a"));
    let mut b1 = queued_with(&gate, of("b"));
    drop(other);
    assert!(!a2.is_woken(), "a is at its limit");
    let b1 = admitted_from_queue(&mut b1);
    // `a`'s own request ends: its flow is served again.
    drop(a1);
    let a2 = admitted_from_queue(&mut a2);
    drop((a2, b1));
    assert_idle(&gate.snapshot());
}

#[test]
fn a_tenant_at_its_limit_is_never_overtaken_by_its_own_newcomers() {
    let gate = gate(8, AdmissionConfig::new().tenant_request_limit(2));
    let a1 = admitted_with(&gate, of("a"));
    let a2 = admitted_with(&gate, of("a"));
    let mut a3 = queued_with(&gate, of("a"));
    let mut a4 = queued_with(&gate, of("a"));
    drop(a1);
    let a3 = admitted_from_queue(&mut a3);
    assert!(!a4.is_woken(), "a holds two again");
    // A newcomer of `a` queues behind a4, even once `a` has room.
    let mut a5 = queued_with(&gate, of("a"));
    drop(a2);
    let a4 = admitted_from_queue(&mut a4);
    assert!(!a5.is_woken());
    drop(a3);
    let a5 = admitted_from_queue(&mut a5);
    drop((a4, a5));
    assert_idle(&gate.snapshot());
}

#[test]
fn a_tenant_over_its_queue_limit_is_refused_tenant_scoped() {
    let gate = gate(
        1,
        AdmissionConfig::new()
            .tenant_request_limit(1)
            .tenant_queue_limit(2),
    );
    let a1 = admitted_with(&gate, of("a"));
    let mut a2 = queued_with(&gate, of("a"));
    let mut a3 = queued_with(&gate, of("a"));
    let overloaded = refused(&gate, of("a"));
    assert_eq!(overloaded.scope(), RejectionScope::Tenant);
    assert_eq!(overloaded.scope().as_str(), "tenant");
    assert_eq!(overloaded.reason(), RejectionReason::TenantLimit);
    assert_eq!(overloaded.reason().as_str(), "tenant_limit");
    assert!(overloaded.to_string().contains("tenant"), "{overloaded}");
    // Another tenant still queues: the worker has room.
    let mut b1 = queued_with(&gate, of("b"));
    let tally = gate.snapshot().tally;
    assert_eq!((tally.rejected_tenant, tally.rejected()), (1, 1));
    assert_eq!((tally.rejected_rank, tally.rejected_worker), (0, 0));
    drop(a1);
    let a2 = admitted_from_queue(&mut a2);
    drop(a2);
    let b1 = admitted_from_queue(&mut b1);
    drop(b1);
    drop(admitted_from_queue(&mut a3));
    assert_idle(&gate.snapshot());
}

#[test]
fn a_queue_limit_of_zero_refuses_whatever_cannot_enter_at_once() {
    let gate = gate(
        4,
        AdmissionConfig::new()
            .tenant_request_limit(1)
            .tenant_queue_limit(0),
    );
    let a1 = admitted_with(&gate, of("a"));
    assert_eq!(refused(&gate, of("a")).scope(), RejectionScope::Tenant);
    let b1 = admitted_with(&gate, of("b"));
    drop((a1, b1));
    assert_idle(&gate.snapshot());
}

#[test]
fn a_tenant_at_its_token_limit_waits_and_a_large_request_runs_alone() {
    let gate = gate(8, AdmissionConfig::new().tenant_token_limit(1_000));
    let a1 = admitted_with(&gate, costing("a", 600, 100));
    let mut a2 = queued_with(&gate, costing("a", 300, 100));
    let b1 = admitted_with(&gate, costing("b", 600, 100));
    drop(a1);
    let a2 = admitted_from_queue(&mut a2);
    drop(a2);
    // Larger than the whole limit: admitted while the tenant holds nothing.
    let huge = admitted_with(&gate, costing("a", 5_000, 100));
    let mut small = queued_with(&gate, costing("a", 10, 10));
    drop(huge);
    drop(admitted_from_queue(&mut small));
    drop(b1);
    assert_idle(&gate.snapshot());
}

#[test]
fn named_tenants_have_their_own_limits_and_the_rest_the_default() {
    let gate = gate(
        8,
        AdmissionConfig::new()
            .tenant_request_limit(1)
            .tenant_limits("batch", TenantLimits::new().requests(3).queued(0)),
    );
    let batch: Vec<_> = (0..3).map(|_| admitted_with(&gate, of("batch"))).collect();
    assert_eq!(refused(&gate, of("batch")).scope(), RejectionScope::Tenant);
    let chat = admitted_with(&gate, of("chat"));
    let mut chat2 = queued_with(&gate, of("chat"));
    drop(chat);
    drop(admitted_from_queue(&mut chat2));
    drop(batch);
    assert_idle(&gate.snapshot());
}

#[test]
fn requests_without_a_tenant_are_not_limited_by_tenant() {
    let gate = gate(3, AdmissionConfig::new().tenant_request_limit(1));
    let held: Vec<_> = (0..3)
        .map(|_| admitted_with(&gate, Descriptor::new()))
        .collect();
    drop(held);
    assert_idle(&gate.snapshot());
}

#[test]
fn tenant_limits_are_per_rank_like_every_limit() {
    // Two ranks: a tenant limit of 1 per rank lets a tenant hold 2.
    let gate = Gate::new(
        AdmissionConfig::new()
            .tenant_request_limit(1)
            .capacity(EngineCapacity::new(4, 2)),
    );
    let first = admitted_with(&gate, of("a").with_rank(Some(0)));
    let second = admitted_with(&gate, of("a").with_rank(Some(1)));
    let mut third = queued_with(&gate, of("a"));
    drop(first);
    let third = admitted_from_queue(&mut third);
    drop((second, third));
    assert_idle(&gate.snapshot());
}

#[test]
fn the_largest_limits_limit_nothing() {
    let gate = gate(
        2,
        AdmissionConfig::new()
            .tenant_request_limit(usize::MAX)
            .tenant_token_limit(usize::MAX)
            .tenant_queue_limit(usize::MAX),
    );
    let a1 = admitted_with(&gate, costing("a", usize::MAX, usize::MAX));
    let a2 = admitted_with(&gate, costing("a", usize::MAX, usize::MAX));
    let mut a3 = queued_with(&gate, of("a"));
    drop(a1);
    drop(admitted_from_queue(&mut a3));
    drop(a2);
    assert_idle(&gate.snapshot());
}

#[test]
fn a_fresh_tenant_per_request_keeps_state_bounded_and_fair() {
    // Every request under a name never seen before: each is a tenant at
    // none of its limits, so all are served in turn and nothing piles up.
    let gate = gate(
        1,
        AdmissionConfig::new()
            .tenant_request_limit(1)
            .tenant_queue_limit(1),
    );
    let mut running = admitted_with(&gate, of("first"));
    for round in 0..2_000 {
        let mut next = queued_with(&gate, of(&format!("tenant-{round}")));
        drop(running);
        running = admitted_from_queue(&mut next);
    }
    drop(running);
    assert_idle(&gate.snapshot());
}

#[test]
fn a_flood_of_one_tenant_leaves_the_others_their_share() {
    // `flood` queues as much as its queue limit lets it and is refused
    // past it; a steady tenant arriving later is admitted as soon as a slot
    // frees, since `flood` is at its request limit.
    let gate = gate(
        4,
        AdmissionConfig::new()
            .tenant_request_limit(2)
            .tenant_queue_limit(10),
    );
    let flood_running: Vec<_> = (0..2).map(|_| admitted_with(&gate, of("flood"))).collect();
    let mut flood_waiting: Vec<_> = (0..10).map(|_| queued_with(&gate, of("flood"))).collect();
    for _ in 0..50 {
        assert_eq!(refused(&gate, of("flood")).scope(), RejectionScope::Tenant);
    }
    let steady: Vec<_> = (0..2).map(|_| admitted_with(&gate, of("steady"))).collect();
    assert_eq!(gate.snapshot().tally.rejected_tenant, 50);
    drop(steady);
    drop(flood_running);
    while !flood_waiting.is_empty() {
        let at = flood_waiting
            .iter()
            .position(|acquire| acquire.is_woken())
            .expect("a flood request is admitted as one ends");
        let mut acquire = flood_waiting.remove(at);
        drop(admitted_from_queue(&mut acquire));
    }
    assert_idle(&gate.snapshot());
}

#[test]
fn cancelling_a_parked_waiter_frees_its_place_and_keeps_the_order() {
    let gate = gate(
        4,
        AdmissionConfig::new()
            .tenant_request_limit(1)
            .tenant_queue_limit(2),
    );
    let a1 = admitted_with(&gate, of("a"));
    let a2 = queued_with(&gate, of("a"));
    let mut a3 = queued_with(&gate, of("a"));
    drop(a2);
    let mut a4 = queued_with(&gate, of("a"));
    drop(a1);
    let a3 = admitted_from_queue(&mut a3);
    assert!(!a4.is_woken());
    drop(a3);
    drop(admitted_from_queue(&mut a4));
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.tally.cancelled, 1);
    assert_idle(&snapshot);
}

#[test]
fn without_tenant_limits_a_tenant_may_take_every_slot() {
    let gate = gate(2, AdmissionConfig::new());
    let a1 = admitted_with(&gate, of("a"));
    let a2 = admitted_with(&gate, of("a"));
    let mut b1 = queued_with(&gate, of("b"));
    drop(a1);
    drop(admitted_from_queue(&mut b1));
    drop(a2);
    assert_idle(&gate.snapshot());
}

#[test]
#[should_panic(expected = "invalid tenant request limit: 0")]
fn a_zero_tenant_request_limit_panics() {
    let _ = AdmissionConfig::new().tenant_request_limit(0);
}

#[test]
#[should_panic(expected = "invalid tenant token limit: 0")]
fn a_zero_tenant_token_limit_panics() {
    let _ = TenantLimits::new().tokens(0);
}

#[test]
fn a_named_tenant_falls_back_to_the_default_for_what_it_leaves_unset() {
    let config = AdmissionConfig::new()
        .tenant_request_limit(2)
        .tenant_queue_limit(5)
        .tenant_limits("batch", TenantLimits::new().queued(0));
    let explicit = config.explicit();
    assert_eq!(
        explicit.named_tenant_limits["batch"],
        TenantLimits::new().queued(0),
        "read back as set, without the defaults"
    );
    let gate = gate(8, config);
    // `batch` takes the default request limit (2) and its own queue limit
    // (0): its third request is refused at once.
    let b1 = admitted_with(&gate, of("batch"));
    let b2 = admitted_with(&gate, of("batch"));
    let overloaded = refused(&gate, of("batch"));
    assert_eq!(overloaded.reason(), RejectionReason::TenantLimit);
    assert_eq!(overloaded.scope(), RejectionScope::Tenant);
    // Any other tenant takes both defaults: it queues at its request limit.
    let o1 = admitted_with(&gate, of("other"));
    let o2 = admitted_with(&gate, of("other"));
    let mut o3 = queued_with(&gate, of("other"));
    drop(o1);
    let o3 = admitted_from_queue(&mut o3);
    drop((b1, b2, o2, o3));
    assert_idle(&gate.snapshot());
}
