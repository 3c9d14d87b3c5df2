//! The gate's cost, side by side with the alternatives (see BENCHMARKS.md).
//!
//! * `uncontended`: one request's whole life — acquire, first token, release —
//!   through `Gate`, against `tokio::sync::Semaphore` acquire/release and
//!   `tower::limit::ConcurrencyLimit` around an always-ready service.
//! * `queue_depth`: admitting the head of the queue, and cancelling a queued
//!   request, with 10 and with 100,000 requests queued; in the interleaved
//!   table also with QoS on (three priority bands, a thousand tenants).
//!
//! Run: `cargo bench --bench gate` (the gate with its default features,
//! metrics compiled in, no recorder installed) and
//! `cargo bench --bench gate --no-default-features` (the gate alone).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::{Ready, ready};
use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Poll};

use criterion::{BenchmarkId, Criterion, criterion_group};
use futures::FutureExt;
use futures::task::noop_waker_ref;
use tower::{Service, limit::ConcurrencyLimit};
use tower_admission::{Acquire, AdmissionConfig, Descriptor, Gate, Tenant};

fn uncontended(c: &mut Criterion) {
    let mut group = c.benchmark_group("uncontended");

    let gate = Gate::new(AdmissionConfig::new());
    group.bench_function("gate acquire/first_token/release", |b| {
        b.iter(|| {
            let mut permit = gate
                .acquire(black_box(None))
                .now_or_never()
                .unwrap()
                .unwrap();
            permit.first_token();
            drop(black_box(permit));
        })
    });

    let semaphore = Arc::new(tokio::sync::Semaphore::new(10_000));
    group.bench_function("tokio Semaphore acquire/release", |b| {
        b.iter(|| {
            let permit = semaphore.acquire().now_or_never().unwrap().unwrap();
            drop(black_box(permit));
        })
    });

    // The gate's `Permit` owns a handle to its gate (it moves into the
    // response body), so the like-for-like semaphore permit is the owned one.
    group.bench_function("tokio Semaphore acquire_owned/release", |b| {
        b.iter(|| {
            let permit = semaphore
                .clone()
                .acquire_owned()
                .now_or_never()
                .unwrap()
                .unwrap();
            drop(black_box(permit));
        })
    });

    #[derive(Clone)]
    struct AlwaysReady;
    impl Service<u32> for AlwaysReady {
        type Response = u32;
        type Error = Infallible;
        type Future = Ready<Result<u32, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, request: u32) -> Self::Future {
            ready(Ok(request))
        }
    }
    let mut limited = ConcurrencyLimit::new(AlwaysReady, 10_000);
    let mut cx = Context::from_waker(noop_waker_ref());
    group.bench_function("tower ConcurrencyLimit ready/call/response", |b| {
        b.iter(|| {
            assert!(limited.poll_ready(&mut cx).is_ready());
            let response = limited.call(black_box(1)).now_or_never().unwrap();
            black_box(response)
        })
    });
    group.finish();
}

/// A gate with one request in the engine and `depth` queued behind it.
fn queued_gate(depth: usize) -> (Gate, tower_admission::Permit, VecDeque<Acquire>) {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(depth + 1),
    );
    let holder = gate.acquire(None).now_or_never().unwrap().unwrap();
    let waiters = (0..depth).map(|_| gate.acquire(None)).collect();
    (gate, holder, waiters)
}

/// The `n`th request of the QoS queue: one of three priorities and of a
/// thousand tenants, the first tenant weighted 3.
fn qos_request(n: usize) -> Descriptor {
    Descriptor::new()
        .with_priority((n % 3) as i32)
        .with_tenant(Tenant::from_id((n % 1000) as u64))
}

/// [`queued_gate`] with QoS on: three bands, tenants, weights.
fn qos_queued_gate(depth: usize) -> (Gate, tower_admission::Permit, VecDeque<Acquire>) {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(depth + 1)
            .priority_bands([0, 1, 2])
            .tenant_weight("0", 3),
    );
    let holder = gate.acquire(None).now_or_never().unwrap().unwrap();
    let waiters = (0..depth)
        .map(|n| gate.acquire_with(qos_request(n)))
        .collect();
    (gate, holder, waiters)
}

fn queue_depth(c: &mut Criterion) {
    let mut group = c.benchmark_group("queue_depth");
    for depth in [10usize, 100_000] {
        // The engine frees a slot: the oldest waiter is admitted and polls
        // its permit; a newcomer joins the tail so the depth stays the same.
        let (gate, holder, mut waiters) = queued_gate(depth);
        let mut holder = Some(holder);
        group.bench_with_input(BenchmarkId::new("admit", depth), &depth, |b, _| {
            b.iter(|| {
                drop(holder.take());
                let mut head = waiters.pop_front().unwrap();
                holder = Some(head.now_or_never_admitted());
                waiters.push_back(gate.acquire(None));
            })
        });
        drop((holder, waiters));

        // The oldest waiter gives up; a newcomer joins the tail.
        let (gate, _holder, mut waiters) = queued_gate(depth);
        group.bench_with_input(BenchmarkId::new("cancel", depth), &depth, |b, _| {
            b.iter(|| {
                drop(waiters.pop_front());
                waiters.push_back(gate.acquire(None));
            })
        });
    }
    group.finish();
}

trait AdmittedNow {
    fn now_or_never_admitted(&mut self) -> tower_admission::Permit;
}

impl AdmittedNow for Acquire {
    fn now_or_never_admitted(&mut self) -> tower_admission::Permit {
        self.now_or_never().unwrap().unwrap()
    }
}

/// The uncontended comparison and the queue-depth costs again, interleaved
/// (see `support`), for ratios a noisy machine cannot skew.
fn interleaved() {
    let gate = Gate::new(AdmissionConfig::new());
    let semaphore = Arc::new(tokio::sync::Semaphore::new(10_000));
    let owned = semaphore.clone();
    support::print_table(
        "uncontended: one request's life",
        &mut [
            ("tokio Semaphore acquire/release", &mut || {
                let permit = semaphore.acquire().now_or_never().unwrap().unwrap();
                drop(black_box(permit));
            }),
            ("tokio Semaphore acquire_owned/release", &mut || {
                let permit = owned
                    .clone()
                    .acquire_owned()
                    .now_or_never()
                    .unwrap()
                    .unwrap();
                drop(black_box(permit));
            }),
            ("gate acquire/first_token/release", &mut || {
                let mut permit = gate
                    .acquire(black_box(None))
                    .now_or_never()
                    .unwrap()
                    .unwrap();
                permit.first_token();
                drop(black_box(permit));
            }),
        ],
    );

    let (shallow_gate, _shallow_holder, mut shallow) = queued_gate(10);
    let (deep_gate, _deep_holder, mut deep) = queued_gate(100_000);
    support::print_table(
        "cancel the oldest waiter, a newcomer joins",
        &mut [
            ("10 queued", &mut || {
                drop(shallow.pop_front());
                shallow.push_back(shallow_gate.acquire(None));
            }),
            ("100,000 queued", &mut || {
                drop(deep.pop_front());
                deep.push_back(deep_gate.acquire(None));
            }),
        ],
    );

    // With QoS the queue is bands of tenants' flows: a newcomer joins its
    // tenant's flow (a heap push when the flow was idle), a cancelled
    // request leaves its lists and, as a flow's head, a stale heap entry.
    let (shallow_gate, _shallow_holder, mut shallow) = qos_queued_gate(10);
    let (deep_gate, _deep_holder, mut deep) = qos_queued_gate(100_000);
    let (mut shallow_n, mut deep_n) = (10, 100_000);
    support::print_table(
        "QoS (3 bands, 1,000 tenants): cancel the oldest waiter, a newcomer joins",
        &mut [
            ("10 queued", &mut || {
                drop(shallow.pop_front());
                shallow.push_back(shallow_gate.acquire_with(qos_request(shallow_n)));
                shallow_n += 1;
            }),
            ("100,000 queued", &mut || {
                drop(deep.pop_front());
                deep.push_back(deep_gate.acquire_with(qos_request(deep_n)));
                deep_n += 1;
            }),
        ],
    );
}

#[path = "support/mod.rs"]
mod support;

criterion_group!(benches, uncontended, queue_depth);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    interleaved();
}
