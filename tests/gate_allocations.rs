//! The gate's hot paths allocate nothing once warmed up (issue 23): one
//! request's uncontended life (acquire, first token, release), and a
//! queued request's cancellation followed by a newcomer joining the queue,
//! each without and with priority bands and tenants, and with the
//! `metrics` feature compiled in both without a recorder and with one
//! installed (whose handles allocate nothing themselves, so that what is
//! counted is the gate's own work).
//!
//! Allocations are counted per thread by a counting global allocator, so
//! the tests of this binary may run in parallel.

use std::collections::VecDeque;

use futures::FutureExt;
use tower_admission::{Acquire, AdmissionConfig, Descriptor, Gate, Tenant};

#[path = "support/alloc.rs"]
mod alloc;
use alloc::{Counting, thread_allocations};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const WARM_UP: usize = 1_000;
const MEASURED: usize = 10_000;

/// Allocations made by `step` over `MEASURED` calls, after `WARM_UP` calls.
fn allocations_of(mut step: impl FnMut(usize)) -> usize {
    for n in 0..WARM_UP {
        step(n);
    }
    let before = thread_allocations();
    for n in WARM_UP..WARM_UP + MEASURED {
        step(n);
    }
    thread_allocations() - before
}

/// QoS on: three bands, tenant weights.
fn qos(config: AdmissionConfig) -> AdmissionConfig {
    config.priority_bands([0, 1, 2]).tenant_weight("0", 3)
}

/// The `n`th request: plain, or of one of three priorities and a thousand
/// tenants.
fn request(qos: bool, n: usize) -> Descriptor {
    if qos {
        Descriptor::new()
            .with_priority((n % 3) as i32)
            .with_tenant(Tenant::from_id((n % 1_000) as u64))
    } else {
        Descriptor::new()
    }
}

fn uncontended(gate: &Gate, qos: bool) -> usize {
    allocations_of(|n| {
        let mut permit = gate
            .acquire_with(request(qos, n))
            .now_or_never()
            .unwrap()
            .unwrap();
        permit.first_token();
        drop(permit);
    })
}

/// Cancels the oldest of ten queued requests and queues a newcomer, over
/// and over.
fn cancel_and_newcomer(gate: &Gate, qos: bool) -> usize {
    let _holder = gate.acquire(None).now_or_never().unwrap().unwrap();
    let mut queued: VecDeque<Acquire> = VecDeque::with_capacity(16);
    for n in 0..10 {
        queued.push_back(gate.acquire_with(request(qos, n)));
    }
    assert!(queued.iter().all(Acquire::is_queued));
    let allocations = allocations_of(|n| {
        drop(queued.pop_front());
        let newcomer = gate.acquire_with(request(qos, n));
        assert!(newcomer.is_queued());
        queued.push_back(newcomer);
    });
    drop(queued);
    allocations
}

fn config(qos_on: bool) -> AdmissionConfig {
    let config = AdmissionConfig::new()
        .engine_request_limit(1)
        .request_queue_limit(16);
    if qos_on { qos(config) } else { config }
}

#[test]
fn an_uncontended_request_allocates_nothing() {
    for qos_on in [false, true] {
        let gate = Gate::new(config(qos_on));
        assert_eq!(uncontended(&gate, qos_on), 0, "qos: {qos_on}");
    }
}

#[test]
fn a_queued_cancel_and_a_newcomer_allocate_nothing() {
    for qos_on in [false, true] {
        let gate = Gate::new(config(qos_on));
        assert_eq!(cancel_and_newcomer(&gate, qos_on), 0, "qos: {qos_on}");
    }
}

/// A recorder whose handles are atomics: registering allocates, recording
/// does not.
#[cfg(feature = "metrics")]
mod recorder {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use metrics::{
        Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString,
        Unit,
    };

    #[derive(Default)]
    struct Sum(AtomicU64);

    impl HistogramFn for Sum {
        fn record(&self, value: f64) {
            self.0.fetch_add(value.to_bits() & 1, Ordering::Relaxed);
        }
    }

    /// Counts every handle it registers (so it is not zero-sized, and
    /// taken for an installed recorder).
    #[derive(Default)]
    pub struct Atomics {
        registered: AtomicU64,
    }

    impl Atomics {
        pub fn registered(&self) -> u64 {
            self.registered.load(Ordering::Relaxed)
        }

        fn count(&self) {
            self.registered.fetch_add(1, Ordering::Relaxed);
        }
    }

    impl Recorder for Atomics {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            self.count();
            Counter::from_arc(Arc::new(AtomicU64::new(0)))
        }

        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            self.count();
            Gauge::from_arc(Arc::new(AtomicU64::new(0)))
        }

        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            self.count();
            Histogram::from_arc(Arc::new(Sum::default()))
        }
    }
}

#[cfg(feature = "metrics")]
#[test]
fn with_a_recorder_the_hot_paths_allocate_nothing_either() {
    for qos_on in [false, true] {
        let recorder = recorder::Atomics::default();
        let gate = metrics::with_local_recorder(&recorder, || Gate::new(config(qos_on)));
        assert!(recorder.registered() > 0, "the gate registered its series");
        assert_eq!(uncontended(&gate, qos_on), 0, "uncontended, qos: {qos_on}");
        assert_eq!(
            cancel_and_newcomer(&gate, qos_on),
            0,
            "cancel + newcomer, qos: {qos_on}"
        );
    }
}
