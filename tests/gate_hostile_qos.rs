//! Hostile quality-of-service descriptors (issue 21) through the gate's
//! public API: a fresh tenant name per request, ten thousand distinct
//! priorities with aging, and token costs at `usize::MAX`. The bounds are
//! checked by counting, never by timing: live heap bytes of this test binary
//! (a counting global allocator) and admissions per tenant. Their costs per
//! event are in `benches/gate.rs` (BENCHMARKS.md).

use std::time::Duration;

use tokio_test::task::Spawn;
use tower_admission::{Acquire, AdmissionConfig, Cost, Descriptor, Gate, Permit, Tenant};

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::{admitted_from_queue, admitted_with, assert_idle, gate, queued_with};

// ---- a counting allocator ----

#[path = "support/alloc.rs"]
mod alloc;
use alloc::{Counting, live_bytes, measuring};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

// ---- a fresh tenant per request ----

/// One engine slot, a steady tenant keeping 5 requests queued and a client
/// keeping 5 queued under a tenant name never used before each time.
struct TenantFlood {
    gate: Gate,
    /// The request in the engine's one slot.
    running: Option<Permit>,
    /// (steady?, its acquire), ten at all times.
    waiting: Vec<(bool, Spawn<Acquire>)>,
    fresh: u64,
    steady_admitted: usize,
}

impl TenantFlood {
    fn new() -> TenantFlood {
        let gate = gate(1, 1, 10);
        let running = admitted_with(&gate, Descriptor::new());
        let mut flood = TenantFlood {
            gate,
            running: Some(running),
            waiting: Vec::with_capacity(10),
            fresh: 0,
            steady_admitted: 0,
        };
        for _ in 0..5 {
            flood.queue(true);
            flood.queue(false);
        }
        flood
    }

    fn queue(&mut self, steady: bool) {
        let tenant = if steady {
            Tenant::new("steady")
        } else {
            self.fresh += 1;
            Tenant::new(&format!("fresh-{}", self.fresh))
        };
        let acquire = queued_with(&self.gate, Descriptor::new().with_tenant(tenant));
        self.waiting.push((steady, acquire));
    }

    /// The running request ends; the waiter admitted takes the slot, and
    /// its client queues another of its kind.
    fn admit_one(&mut self) {
        let at = self
            .waiting
            .iter()
            .position(|(_, acquire)| acquire.is_woken())
            .expect("one waiter is woken when the slot frees");
        let (steady, mut acquire) = self.waiting.swap_remove(at);
        self.running = Some(admitted_from_queue(&mut acquire));
        if steady {
            self.steady_admitted += 1;
        }
        self.queue(steady);
    }

    /// The running request ends.
    fn release(&mut self) {
        self.running = None;
    }
}

#[test]
fn a_fresh_tenant_per_request_keeps_the_steady_tenants_share_and_the_gates_memory() {
    let _measuring = measuring();
    let mut flood = TenantFlood::new();
    let mut after_1000 = 0;
    for admission in 1..=40_000 {
        flood.release();
        flood.admit_one();
        if admission == 1_000 {
            after_1000 = live_bytes();
        }
    }
    let after_40000 = live_bytes();
    println!(
        "steady tenant: {} of 40,000 admissions; live bytes {after_1000} after 1,000, {after_40000} after 40,000",
        flood.steady_admitted
    );
    let grown = after_40000.saturating_sub(after_1000);
    assert!(
        grown <= 256 * 1024,
        "live memory grew by {grown} bytes from 1,000 to 40,000 admissions"
    );
    // Six flows backlogged: about 1/6 of the admissions each.
    assert!(
        flood.steady_admitted * 8 >= 40_000,
        "the steady tenant was admitted {} times in 40,000",
        flood.steady_admitted
    );
    let TenantFlood {
        gate,
        running,
        waiting,
        ..
    } = flood;
    drop(waiting);
    drop(running);
    assert_idle(&gate.snapshot());
}

// ---- ten thousand distinct priorities ----

#[test]
fn ten_thousand_distinct_priorities_with_aging_are_served_highest_first_and_give_memory_back() {
    let _measuring = measuring();
    const PRIORITIES: i32 = 10_000;
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .engine_request_waiting_limit(1)
            .request_queue_limit(2 * PRIORITIES as usize)
            .aging_interval(Duration::from_secs(3600)),
    );
    let before = live_bytes();
    let mut running = admitted_with(&gate, Descriptor::new());
    // Ten thousand bands, the lowest first.
    let mut waiting: Vec<(i32, Spawn<Acquire>)> = (0..PRIORITIES)
        .map(|priority| {
            let request = Descriptor::new().with_priority(priority);
            (priority, queued_with(&gate, request))
        })
        .collect();
    // Arrivals and cancels among them, each a band of its own.
    for priority in PRIORITIES..2 * PRIORITIES {
        drop(queued_with(
            &gate,
            Descriptor::new().with_priority(-priority),
        ));
    }
    assert_eq!(gate.snapshot().total.queued, PRIORITIES as usize);
    // Served highest first: an hour's aging interval has not lifted any.
    for expected in (PRIORITIES - 100..PRIORITIES).rev() {
        drop(running);
        let at = waiting
            .iter()
            .position(|(_, acquire)| acquire.is_woken())
            .expect("one waiter is woken");
        let (priority, mut acquire) = waiting.swap_remove(at);
        assert_eq!(priority, expected);
        running = admitted_from_queue(&mut acquire);
    }
    drop(waiting);
    drop(running);
    assert_idle(&gate.snapshot());
    // What an emptied gate keeps for the next burst.
    let kept = live_bytes().saturating_sub(before);
    assert!(kept <= 64 * 1024, "the emptied gate keeps {kept} bytes");
}

// ---- token costs at the edge of usize ----

#[test]
fn two_requests_of_the_largest_cost_without_a_token_limit_neither_panic_nor_leak() {
    let _measuring = measuring();
    let gate = gate(2, 2, 2);
    let huge = Descriptor::new().with_cost(Cost::new(usize::MAX, Some(usize::MAX)));
    let first = admitted_with(&gate, huge);
    let second = admitted_with(&gate, huge);
    drop(first);
    drop(second);
    assert_idle(&gate.snapshot());
    // And queued, then admitted.
    let running = admitted_with(&gate, huge);
    let other = admitted_with(&gate, huge);
    let mut queued = [queued_with(&gate, huge), queued_with(&gate, huge)];
    drop(running);
    drop(other);
    let admitted: Vec<Permit> = queued.iter_mut().map(admitted_from_queue).collect();
    drop(admitted);
    assert_idle(&gate.snapshot());
}

// ---- tenant names a client picks ----

/// The 64-bit FNV-1a digest, what a `Tenant` was: anyone could compute it
/// offline and search names for a given one.
fn fnv1a(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[test]
fn a_tenant_is_a_keyed_digest_no_client_can_compute_from_the_name() {
    let _measuring = measuring();
    for name in ["premium", "chat", "batch", "", "a"] {
        assert_eq!(Tenant::new(name), Tenant::new(name), "stable in a process");
        assert_ne!(Tenant::new(name).id(), fnv1a(name), "{name:?}: not FNV-1a");
    }
    // A weighted tenant is found by its name's keyed digest: a client that
    // sends the old digest of "premium" as a number gets no weight from it.
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(100)
            .tenant_weight("premium", 1000),
    );
    let running = admitted_with(&gate, Descriptor::new());
    let forged = Tenant::from_id(fnv1a("premium"));
    let mut waiting: Vec<(&str, Spawn<Acquire>)> = Vec::new();
    for _ in 0..4 {
        waiting.push((
            "forged",
            queued_with(&gate, Descriptor::new().with_tenant(forged)),
        ));
    }
    for _ in 0..4 {
        let other = Descriptor::new().with_tenant("other");
        waiting.push(("other", queued_with(&gate, other)));
    }
    let mut order = Vec::new();
    let mut running = Some(running);
    while !waiting.is_empty() {
        drop(running.take());
        let at = waiting
            .iter()
            .position(|(_, acquire)| acquire.is_woken())
            .expect("one waiter is woken");
        let (name, mut acquire) = waiting.remove(at);
        running = Some(admitted_from_queue(&mut acquire));
        order.push(name);
    }
    drop(running);
    // Equal weights: in turn, not the forged tenant's four first.
    assert_eq!(
        order,
        [
            "forged", "other", "forged", "other", "forged", "other", "forged", "other"
        ]
    );
    assert_idle(&gate.snapshot());
}

#[test]
fn ten_thousand_tenant_ids_alike_in_their_low_bits_are_ten_thousand_flows() {
    let _measuring = measuring();
    // Ids a multiplicative hash would send to one bucket of the flow map.
    let gate = gate(1, 1, 20_000);
    let mut running = Some(admitted_with(&gate, Descriptor::new()));
    let mut waiting: Vec<Spawn<Acquire>> = (0..10_000u64)
        .map(|k| {
            queued_with(
                &gate,
                Descriptor::new().with_tenant(Tenant::from_id(k << 40)),
            )
        })
        .collect();
    // One more of the first tenant waits behind every other tenant's first.
    let second = queued_with(&gate, Descriptor::new().with_tenant(Tenant::from_id(0)));
    for _ in 0..10_000 {
        drop(running.take());
        let at = waiting
            .iter()
            .position(|acquire| acquire.is_woken())
            .expect("a first request of some tenant is woken");
        running = Some(admitted_from_queue(&mut waiting.swap_remove(at)));
    }
    assert!(waiting.is_empty());
    let mut second = second;
    drop(running.take());
    drop(admitted_from_queue(&mut second));
    assert_idle(&gate.snapshot());
}
