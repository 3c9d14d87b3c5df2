//! The gate's cost, side by side with the alternatives (see BENCHMARKS.md).
//!
//! * `uncontended`: one request's whole life — acquire, first token, release —
//!   through `Gate`, against `tokio::sync::Semaphore` acquire/release and
//!   `tower::limit::ConcurrencyLimit` around an always-ready service.
//! * `queue_depth`: admitting the head of the queue, and cancelling a queued
//!   request, with 10 and with 100,000 requests queued; in the interleaved
//!   table also with QoS on (three priority bands, a thousand tenants).
//!
//! * `hostile_qos`: the tenant flood (a queue whose newcomers come from a
//!   thousand tenants against one where they come from a million, each new
//!   to the queue) and the priority flood (ten thousand distinct priorities
//!   with aging against three), per admission and per cancel + arrival.
//!
//! After criterion, interleaved tables (see `support`) give the ratios:
//! the uncontended life against the Semaphore; the gate with a Prometheus
//! recorder against the same gate without one (and the recorder's own
//! writes alone, as a floor); 2, 4 and 8 threads contending on one gate
//! against as many on one Semaphore; the queue depths; the floods.
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

/// A gate with one engine slot and `depth` queued, whose newcomers are the
/// `n`th request of `request`.
struct Flood {
    gate: Gate,
    holder: Option<tower_admission::Permit>,
    waiters: VecDeque<Acquire>,
    request: fn(usize) -> Descriptor,
    n: usize,
}

impl Flood {
    fn new(config: AdmissionConfig, depth: usize, request: fn(usize) -> Descriptor) -> Flood {
        let gate = Gate::new(
            config
                .engine_request_limit(1)
                .engine_request_waiting_limit(1)
                .request_queue_limit(depth + 1),
        );
        let holder = Some(gate.acquire(None).now_or_never().unwrap().unwrap());
        let waiters = (0..depth).map(|n| gate.acquire_with(request(n))).collect();
        Flood {
            gate,
            holder,
            waiters,
            request,
            n: depth,
        }
    }

    fn arrive(&mut self) {
        let request = (self.request)(self.n);
        self.n += 1;
        self.waiters.push_back(self.gate.acquire_with(request));
    }

    /// The engine frees its slot: the waiter first in fair order is
    /// admitted (found by polling each), and a newcomer joins.
    fn admit(&mut self) {
        drop(self.holder.take());
        let mut cx = Context::from_waker(noop_waker_ref());
        let (at, permit) = self
            .waiters
            .iter_mut()
            .enumerate()
            .find_map(
                |(at, acquire)| match std::pin::Pin::new(acquire).poll(&mut cx) {
                    Poll::Ready(admitted) => Some((at, admitted.unwrap())),
                    Poll::Pending => None,
                },
            )
            .expect("one waiter is admitted");
        drop(self.waiters.remove(at));
        self.holder = Some(permit);
        self.arrive();
    }

    /// The oldest waiter gives up; a newcomer joins.
    fn cancel(&mut self) {
        drop(self.waiters.pop_front());
        self.arrive();
    }
}

fn thousand_tenants(n: usize) -> Descriptor {
    Descriptor::new().with_tenant(Tenant::from_id((n % 1_000) as u64))
}

fn million_tenants(n: usize) -> Descriptor {
    Descriptor::new().with_tenant(Tenant::from_id((n % 1_000_000) as u64))
}

fn three_priorities(n: usize) -> Descriptor {
    Descriptor::new().with_priority((n % 3) as i32)
}

fn ten_thousand_priorities(n: usize) -> Descriptor {
    Descriptor::new().with_priority((n % 10_000) as i32)
}

fn aging() -> AdmissionConfig {
    AdmissionConfig::new().aging_interval(std::time::Duration::from_secs(60))
}

fn hostile_qos(c: &mut Criterion) {
    let mut group = c.benchmark_group("hostile_qos");
    for (name, request) in [
        ("1,000 tenants", thousand_tenants as fn(usize) -> Descriptor),
        ("1,000,000 tenants", million_tenants),
    ] {
        let mut flood = Flood::new(AdmissionConfig::new(), 10, request);
        group.bench_function(BenchmarkId::new("admit of 10 queued", name), |b| {
            b.iter(|| flood.admit())
        });
        let mut flood = Flood::new(AdmissionConfig::new(), 1_000, request);
        group.bench_function(BenchmarkId::new("cancel + arrival of 1,000", name), |b| {
            b.iter(|| flood.cancel())
        });
    }
    for (name, request) in [
        ("3 priorities", three_priorities as fn(usize) -> Descriptor),
        ("10,000 priorities", ten_thousand_priorities),
    ] {
        let mut flood = Flood::new(aging(), 10_000, request);
        group.bench_function(
            BenchmarkId::new("aging, cancel + arrival of 10,000", name),
            |b| b.iter(|| flood.cancel()),
        );
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

/// One request's life through `gate`: acquire, first token, release.
fn one_life(gate: &Gate) {
    let mut permit = gate
        .acquire(black_box(None))
        .now_or_never()
        .unwrap()
        .unwrap();
    permit.first_token();
    drop(black_box(permit));
}

/// The gate with a Prometheus recorder (`metrics-exporter-prometheus`)
/// against the same gate with none, interleaved. The recorder is installed
/// locally while the gate registers its series, so the other tables of this
/// run keep "no recorder". Its histograms are drained every 4,096 requests,
/// as a scrape would (`run_upkeep`), so they do not grow for ever.
#[cfg(feature = "metrics")]
fn interleaved_recorder() {
    use metrics_exporter_prometheus::PrometheusBuilder;

    let bare = Gate::new(AdmissionConfig::new());
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let recorded = metrics::with_local_recorder(&recorder, || Gate::new(AdmissionConfig::new()));
    // The floor: the recorder's own cost of the writes one request's life
    // makes through handles registered once (two gauges and two counters
    // at the arrival, a gauge and a histogram sample at the first token, a
    // gauge at the end), with nothing of the gate.
    let (gauges, counters, histogram) = metrics::with_local_recorder(&recorder, || {
        let gauge = |name: &'static str| metrics::gauge!(name, "dp_rank" => "unspecified");
        let counter = |name: &'static str| metrics::counter!(name, "dp_rank" => "unspecified");
        (
            [gauge("floor_requests"), gauge("floor_waiting")],
            [counter("floor_received"), counter("floor_admitted")],
            metrics::histogram!("floor_waiting_seconds", "dp_rank" => "unspecified"),
        )
    });
    let (mut n, mut m, mut k) = (0u32, 0u32, 0u64);
    support::print_table(
        "uncontended with a recorder: one request's life",
        &mut [
            ("gate, no recorder installed", &mut || one_life(&bare)),
            ("gate, Prometheus recorder", &mut || {
                one_life(&recorded);
                n = n.wrapping_add(1);
                if n % 4096 == 0 {
                    handle.run_upkeep();
                }
            }),
            (
                "gate, no recorder + the recorder's writes alone",
                &mut || {
                    one_life(&bare);
                    k += 1;
                    gauges[0].set(1.0);
                    gauges[1].set(1.0);
                    counters[0].absolute(k);
                    counters[1].absolute(k);
                    gauges[1].set(0.0);
                    histogram.record(black_box(0.001));
                    gauges[0].set(0.0);
                    m = m.wrapping_add(1);
                    if m % 4096 == 0 {
                        handle.run_upkeep();
                    }
                },
            ),
        ],
    );
}

#[cfg(not(feature = "metrics"))]
fn interleaved_recorder() {}

/// Wall time per request with `threads` threads each running `per_thread`
/// requests' lives through `life` at once: the inverse of the throughput,
/// from the first thread's start to the last one's end (each thread reads
/// its own clock: a spawning thread may be descheduled for a while).
fn contended_round(threads: usize, per_thread: u32, life: &(dyn Fn() + Sync)) -> f64 {
    let start = std::sync::Barrier::new(threads);
    let spans: Vec<(std::time::Instant, std::time::Instant)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    let began = std::time::Instant::now();
                    for _ in 0..per_thread {
                        life();
                    }
                    (began, std::time::Instant::now())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().unwrap())
            .collect()
    });
    let began = spans.iter().map(|span| span.0).min().unwrap();
    let ended = spans.iter().map(|span| span.1).max().unwrap();
    (ended - began).as_nanos() as f64 / (threads as f64 * f64::from(per_thread))
}

/// Threads contending on one gate against threads contending on one
/// Semaphore: rounds alternate between the two, each keeps its fastest.
/// Only under `cargo bench` (like `support::print_table`).
fn interleaved_contended() {
    if !std::env::args().any(|arg| arg == "--bench") {
        return;
    }
    const ROUNDS: usize = 15;
    const PER_THREAD: u32 = 20_000;
    println!(
        "\ncontended: one request's life, ns of wall time per request \
         (all threads), fastest of {ROUNDS} alternating rounds; \
         this machine has {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:<10} {:>14} {:>14} {:>10}",
        "threads", "Semaphore", "gate", "ratio"
    );
    for threads in [2usize, 4, 8] {
        let gate = Gate::new(AdmissionConfig::new());
        let semaphore = tokio::sync::Semaphore::new(10_000);
        let semaphore_life = || {
            let permit = semaphore.acquire().now_or_never().unwrap().unwrap();
            drop(black_box(permit));
        };
        let gate_life = || one_life(&gate);
        let (mut best_semaphore, mut best_gate) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..ROUNDS {
            best_semaphore =
                best_semaphore.min(contended_round(threads, PER_THREAD, &semaphore_life));
            best_gate = best_gate.min(contended_round(threads, PER_THREAD, &gate_life));
        }
        println!(
            "{:<10} {:>14.1} {:>14.1} {:>9.2}x",
            threads,
            best_semaphore,
            best_gate,
            best_gate / best_semaphore
        );
    }
}

/// The floods of `hostile_qos` again, interleaved, for their ratios.
fn interleaved_floods() {
    let mut few = Flood::new(AdmissionConfig::new(), 10, thousand_tenants);
    let mut many = Flood::new(AdmissionConfig::new(), 10, million_tenants);
    support::print_table(
        "tenant flood: admit one of 10 queued, a newcomer joins",
        &mut [
            ("1,000 tenants", &mut || few.admit()),
            ("1,000,000 tenants", &mut || many.admit()),
        ],
    );
    let mut few = Flood::new(AdmissionConfig::new(), 1_000, thousand_tenants);
    let mut many = Flood::new(AdmissionConfig::new(), 1_000, million_tenants);
    support::print_table(
        "tenant flood: cancel the oldest of 1,000 queued, a newcomer joins",
        &mut [
            ("1,000 tenants", &mut || few.cancel()),
            ("1,000,000 tenants", &mut || many.cancel()),
        ],
    );
    let mut few = Flood::new(aging(), 10_000, three_priorities);
    let mut many = Flood::new(aging(), 10_000, ten_thousand_priorities);
    support::print_table(
        "priority flood, aging on: cancel the oldest of 10,000 queued, a newcomer joins",
        &mut [
            ("3 priorities", &mut || few.cancel()),
            ("10,000 priorities", &mut || many.cancel()),
        ],
    );
}

#[path = "support/mod.rs"]
mod support;

criterion_group!(benches, uncontended, queue_depth, hostile_qos);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    interleaved();
    interleaved_recorder();
    interleaved_contended();
    interleaved_floods();
}
