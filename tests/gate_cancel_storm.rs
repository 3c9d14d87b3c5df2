//! Cancel storms (behaviour §2.6): a hundred thousand queued requests are
//! cancelled in random order while admission goes on — permits are
//! released, the oldest waiters are admitted and polled, some of them
//! cancelled after their admission was offered. Afterwards the gate is
//! empty, every request is accounted for exactly once, every waker the gate
//! kept is dropped, and the memory the queue took is given back.
//!
//! Memory is measured by a counting global allocator: live heap bytes of
//! this test binary, exact and deterministic. Everything the test itself
//! needs (the futures, the wakers, the lists) is allocated before the
//! baseline and freed after the last measurement, so the difference is the
//! gate's own. One test measures at a time (`MEASURING`).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use tower_admission::{Acquire, AdmissionConfig, Descriptor, EngineCapacity, Gate, Permit, Tenant};

#[path = "support/gate.rs"]
mod gate_support;
use rng::Rng;
use tower_admission_testkit::rng;

// ---- a counting allocator ----

#[path = "support/alloc.rs"]
mod alloc;
use alloc::{Counting, live_bytes, measuring};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What an emptied queue may keep: the gate keeps a few dozen entries'
/// worth of slab for the next burst (64 entries of well under 256 bytes).
const KEPT_FOR_REUSE: usize = 16 * 1024;

// ---- the storm ----

const STORM: usize = 100_000;

fn seed() -> u64 {
    let seed = std::env::var("STORM_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(0x5EED_CA4C_E15D);
    println!("STORM_SEED={seed}");
    seed
}

/// Records, on wake, which request was woken: the gate offered it an
/// admission (or, spuriously, did not — polling tells).
struct Woken {
    index: usize,
    list: Arc<Mutex<Vec<usize>>>,
}

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Preallocated: waking does not allocate.
        self.list.lock().unwrap().push(self.index);
    }
}

/// The storm's bookkeeping, all allocated up front.
struct Storm {
    acquires: Vec<Option<Acquire>>,
    wakers: Vec<Arc<Woken>>,
    woken: Arc<Mutex<Vec<usize>>>,
    /// Permits held, as if by requests in the engine.
    held: Vec<Permit>,
    order: Vec<usize>,
    admitted_from_queue: usize,
}

impl Storm {
    fn new(rng: &mut Rng) -> Storm {
        let woken = Arc::new(Mutex::new(Vec::with_capacity(4 * STORM)));
        let wakers = (0..STORM)
            .map(|index| {
                Arc::new(Woken {
                    index,
                    list: woken.clone(),
                })
            })
            .collect();
        let mut order: Vec<usize> = (0..STORM).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.index(i + 1));
        }
        Storm {
            acquires: (0..STORM).map(|_| None).collect(),
            wakers,
            woken,
            held: Vec::with_capacity(STORM + 64),
            order,
            admitted_from_queue: 0,
        }
    }

    /// Polls request `index`; takes its permit if it was admitted.
    fn poll(&mut self, index: usize) {
        let Some(acquire) = self.acquires[index].as_mut() else {
            return; // already admitted or cancelled
        };
        let waker = Waker::from(self.wakers[index].clone());
        match Pin::new(acquire).poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(Ok(permit)) => {
                self.acquires[index] = None;
                self.held.push(permit);
                self.admitted_from_queue += 1;
            }
            Poll::Ready(Err(overloaded)) => panic!("queued request {index} rejected: {overloaded}"),
            Poll::Pending => {}
        }
    }

    /// Polls every request woken since the last look (the gate offered each
    /// an admission). Some of them get cancelled instead, as if their client
    /// went away just as their turn came.
    fn poll_woken(&mut self, rng: &mut Rng) {
        let woken: Vec<usize> = {
            let mut list = self.woken.lock().unwrap();
            // At most a handful at a time: no allocation worth counting.
            list.drain(..).collect()
        };
        for index in woken {
            if rng.index(8) == 0 {
                self.acquires[index] = None; // cancelled after the offer
            } else {
                self.poll(index);
            }
        }
    }

    fn release_one(&mut self, rng: &mut Rng) {
        if self.held.is_empty() {
            return;
        }
        let at = rng.index(self.held.len());
        let mut permit = self.held.swap_remove(at);
        if rng.index(2) == 0 {
            permit.first_token(); // waiting ends first, the request later
        }
        drop(permit);
    }
}

/// Fills the engine, queues `STORM` requests, and cancels them in a random
/// order while permits are released and admitted waiters polled. Returns
/// the live bytes at the baseline, with the whole queue, and after.
fn run_storm(gate: &Gate, ranks: u32, rng: &mut Rng, storm: &mut Storm) -> (usize, usize, usize) {
    run_storm_of(gate, ranks, rng, storm, |_| Descriptor::new())
}

/// [`run_storm`] with requests described by `describe` (a rank is added).
fn run_storm_of(
    gate: &Gate,
    ranks: u32,
    rng: &mut Rng,
    storm: &mut Storm,
    describe: impl Fn(&mut Rng) -> Descriptor,
) -> (usize, usize, usize) {
    let rank_of = |rng: &mut Rng| match rng.index(ranks as usize + 1) {
        0 => None,
        rank => Some(rank as u32 - 1),
    };
    // The engine is full: every new request queues.
    for rank in 0..ranks {
        for _ in 0..gate.limits_in_force().per_rank.engine_request_limit {
            let permit = gate.acquire(Some(rank));
            let permit = futures::executor::block_on(permit).expect("room in the engine");
            storm.held.push(permit);
        }
    }
    let baseline = live_bytes();

    for index in 0..STORM {
        let rank = rank_of(rng);
        let acquire = gate.acquire_with(describe(rng).with_rank(rank));
        assert!(acquire.is_queued(), "request {index} was not queued");
        storm.acquires[index] = Some(acquire);
        storm.poll(index); // registers its waker in the gate
    }
    assert_eq!(gate.snapshot().total.queued, STORM);
    let full = live_bytes();

    for step in 0..STORM {
        let index = storm.order[step];
        storm.acquires[index] = None; // cancels it, unless admitted already
        if rng.index(3) == 0 {
            storm.release_one(rng);
        }
        storm.poll_woken(rng);
    }
    assert_eq!(gate.snapshot().total.queued, 0);
    while !storm.held.is_empty() {
        storm.release_one(rng);
        storm.poll_woken(rng);
    }
    (baseline, full, live_bytes())
}

fn assert_settled(gate: &Gate, storm: &Storm, direct: usize) {
    let snapshot = gate.snapshot();
    gate_support::assert_idle(&snapshot);
    let tally = snapshot.tally;
    assert_eq!(tally.received, (STORM + direct) as u64);
    assert_eq!(tally.admitted_direct, direct as u64);
    assert_eq!(tally.admitted_queue, storm.admitted_from_queue as u64);
    assert_eq!(tally.rejected(), 0);
    assert_eq!(
        tally.received,
        tally.admitted_direct + tally.admitted_queue + tally.rejected() + tally.cancelled
    );
    // The gate kept a clone of each waiter's waker while it waited, and
    // no more once the request left the queue.
    for waker in &storm.wakers {
        assert_eq!(Arc::strong_count(waker), 1, "the gate kept a waker");
    }
}

fn report(what: &str, baseline: usize, full: usize, after: usize, storm: &Storm, gate: &Gate) {
    let tally = gate.snapshot().tally;
    println!(
        "{what}: {STORM} queued then cancelled in random order; admitted from the queue meanwhile {} \
         (tally: received {}, admitted direct {}, admitted from queue {}, cancelled {}); \
         live heap bytes: baseline {baseline}, with the full queue {full} (+{} B, {:.1} B per request), \
         after {after} ({:+} B)",
        storm.admitted_from_queue,
        tally.received,
        tally.admitted_direct,
        tally.admitted_queue,
        tally.cancelled,
        full - baseline,
        (full - baseline) as f64 / STORM as f64,
        after as i64 - baseline as i64,
    );
}

#[test]
fn a_hundred_thousand_cancellations_give_the_queue_memory_back() {
    let _measuring = measuring();
    let mut rng = Rng(seed());
    // Four ranks of four requests; 25,000 queue places per rank, 100,000
    // combined for unranked requests.
    let gate = Gate::new(
        AdmissionConfig::new()
            .request_queue_limit(STORM / 4)
            .capacity(EngineCapacity::new(4, 4)),
    );
    let mut storm = Storm::new(&mut rng);
    let (baseline, full, after) = run_storm(&gate, 4, &mut rng, &mut storm);
    report("cancel storm", baseline, full, after, &storm, &gate);

    assert!(
        full - baseline >= STORM * 16,
        "the queue should have taken memory"
    );
    assert!(
        after <= baseline + KEPT_FOR_REUSE,
        "the queue kept {} bytes after the storm",
        after - baseline
    );
    assert_settled(&gate, &storm, 16);
    // Both happened at scale: admissions from the queue while it was being
    // cancelled, and cancellations (some after an admission was offered).
    assert!(storm.admitted_from_queue > 10_000, "admission went on");
    assert!(gate.snapshot().tally.cancelled > 50_000);

    // A second storm on the same gate reuses what the first left.
    let mut second = Storm::new(&mut rng);
    let (baseline, full, after) = run_storm(&gate, 4, &mut rng, &mut second);
    report("second storm", baseline, full, after, &second, &gate);
    assert!(after <= baseline + KEPT_FOR_REUSE);
}

#[test]
fn a_storm_across_priority_bands_and_tenants_gives_the_queue_memory_back() {
    let _measuring = measuring();
    let mut rng = Rng(seed() ^ 2);
    let gate = Gate::new(
        AdmissionConfig::new()
            .request_queue_limit(STORM / 4)
            .tenant_weight("7", 3)
            .capacity(EngineCapacity::new(4, 4)),
    );
    let mut storm = Storm::new(&mut rng);
    let describe = |rng: &mut Rng| {
        Descriptor::new()
            .with_priority(rng.index(4) as i32 - 1)
            .with_tenant(Tenant::from_id(rng.index(500) as u64))
    };
    let (baseline, full, after) = run_storm_of(&gate, 4, &mut rng, &mut storm, describe);
    report("QoS cancel storm", baseline, full, after, &storm, &gate);
    assert!(
        after <= baseline + KEPT_FOR_REUSE,
        "the queue kept {} bytes after the storm",
        after - baseline
    );
    assert_settled(&gate, &storm, 16);
    assert!(storm.admitted_from_queue > 10_000, "admission went on");
}

#[test]
fn a_capacity_jump_during_a_storm_gives_the_offer_memory_back() {
    let _measuring = measuring();
    let mut rng = Rng(seed() ^ 1);
    let gate = Gate::new(
        AdmissionConfig::new()
            .request_queue_limit(STORM)
            .capacity(EngineCapacity::new(4, 1)),
    );
    let mut storm = Storm::new(&mut rng);
    for _ in 0..4 {
        let permit = futures::executor::block_on(gate.acquire(None)).unwrap();
        storm.held.push(permit);
    }
    let baseline = live_bytes();
    for index in 0..STORM {
        let acquire = gate.acquire(None);
        assert!(acquire.is_queued());
        storm.acquires[index] = Some(acquire);
        storm.poll(index);
    }
    let full = live_bytes();
    // The engine grows: half the queue is offered an admission at once.
    gate.report_capacity(EngineCapacity::new(STORM / 2, 1));
    assert_eq!(gate.snapshot().total.queued, STORM - (STORM / 2 - 4));
    // Every waiter goes away, offered or not; the cancellations of offered
    // ones pass their capacity on to the rest.
    for step in 0..STORM {
        storm.acquires[storm.order[step]] = None;
    }
    storm.woken.lock().unwrap().clear();
    storm.held.clear();
    let after = live_bytes();
    report("capacity jump", baseline, full, after, &storm, &gate);
    assert_settled(&gate, &storm, 4);
    assert!(
        after <= baseline + KEPT_FOR_REUSE,
        "the gate kept {} bytes after {} offers were cancelled",
        after - baseline,
        STORM
    );
}
