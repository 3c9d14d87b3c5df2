//! Retry amplification under sustained overload: a frontend built as
//! `examples/frontend.rs` builds it (`route::Worker`s under tower's p2c
//! balancer, a `Buffer`, `Retry` with `route::OverloadRetry`) over three
//! workers behind real gates (`AdmissionLayer`, 4 running and 4 queued
//! each, one second of work a request: 12 requests a second in all),
//! offered three times that, 36 a second, for two virtual minutes.
//!
//! With the retry budget, the workers receive at most 1.1 sends per client
//! request; without it (the same policy, an unlimited budget) every
//! rejected request is sent up to four times. Virtual time: the figures do
//! not depend on the machine.
//!
//! ```text
//! cargo test --release --features route --test route_amplification -- --nocapture
//! ```
#![cfg(feature = "route")]

#[path = "support/rng.rs"]
mod rng;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tokio::time::{Instant, sleep};
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::ServiceList;
use tower::retry::Retry;
use tower::retry::budget::TpsBudget;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_admission::route::{Deadline, OverloadRetry, Worker, WorkerHandle};
use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};

const WORKERS: usize = 3;
const RUNNING: usize = 4;
const QUEUED: usize = 4;
const WORK: Duration = Duration::from_secs(1);
const OVERLOAD: f64 = 3.0;
const RUN: Duration = Duration::from_secs(120);
const SEED: u64 = 0x5eed_0012;

#[derive(Debug)]
struct Outcome {
    requests: usize,
    sends: u64,
    ok: usize,
    overloaded: usize,
}

impl Outcome {
    fn amplification(&self) -> f64 {
        self.sends as f64 / self.requests as f64
    }
}

/// The handler behind each gate: `WORK` per request.
async fn work(_: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    sleep(WORK).await;
    Ok(Response::new(Full::new(Bytes::from_static(b"done"))))
}

fn gate() -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(RUNNING)
            .engine_request_waiting_limit(RUNNING)
            .request_queue_limit(QUEUED),
    )
}

/// The routed call as a named `Send` future: written inline in the task,
/// the compiler cannot prove its future `Send` (the balancer's error
/// conversions are checked for every lifetime).
fn routed<S, R>(
    service: S,
    request: R,
) -> impl Future<Output = Result<S::Response, S::Error>> + Send
where
    S: Service<R> + Send,
    S::Future: Send,
    R: Send,
{
    service.oneshot(request)
}

/// Offers `OVERLOAD` times the workers' capacity for `RUN`, Poisson
/// arrivals, each request with a ten-second deadline.
async fn offer(policy: OverloadRetry) -> Outcome {
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| Worker::new(AdmissionLayer::new(gate()).layer(service_fn(work))))
        .collect();
    let handles: Vec<WorkerHandle> = workers.iter().map(Worker::handle).collect();
    let balance = Balance::new(ServiceList::new(workers));
    let frontend = Retry::new(policy, Buffer::new(balance, 1024));

    let capacity = (WORKERS * RUNNING) as f64 / WORK.as_secs_f64();
    let rate = OVERLOAD * capacity;
    let mut rng = rng::Rng::new(SEED);
    let end = Instant::now() + RUN;
    let mut calls = Vec::new();
    while Instant::now() < end {
        // Exponential gaps: u in (0, 1].
        let u = ((rng.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        sleep(Duration::from_secs_f64(-u.ln() / rate)).await;
        let mut request = Request::post("/v1/completions")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        request
            .extensions_mut()
            .insert(Deadline::after(Duration::from_secs(10)));
        let frontend = frontend.clone();
        calls.push(tokio::spawn(async move {
            let response = routed(frontend, request).await.expect("routed");
            let status = response.status().as_u16();
            response.into_body().collect().await.ok();
            status
        }));
    }
    let requests = calls.len();
    let (mut ok, mut overloaded) = (0, 0);
    for call in calls {
        match call.await.unwrap() {
            200 => ok += 1,
            529 => overloaded += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    Outcome {
        requests,
        sends: handles.iter().map(|handle| handle.stats().requests).sum(),
        ok,
        overloaded,
    }
}

#[tokio::test(start_paused = true)]
async fn retry_amplification_under_sustained_triple_overload_stays_within_the_budget() {
    let budgeted = offer(OverloadRetry::new(
        Arc::new(OverloadRetry::default_budget()),
    ))
    .await;
    let unlimited = offer(OverloadRetry::new(Arc::new(TpsBudget::new(
        Duration::from_secs(10),
        1_000_000,
        1000.0,
    ))))
    .await;
    let none = offer(OverloadRetry::new(Arc::new(TpsBudget::new(
        Duration::from_secs(10),
        0,
        0.0,
    ))))
    .await;

    println!(
        "{WORKERS} workers x {RUNNING} running + {QUEUED} queued, {WORK:?} a request; offered \
         {OVERLOAD}x capacity for {RUN:?} (virtual)"
    );
    println!("| retries | client requests | sends to workers | sends per request | 200 | 529 |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, outcome) in [
        ("default budget (5% + 1/s)", &budgeted),
        ("unlimited budget (max 3 per request)", &unlimited),
        ("none", &none),
    ] {
        println!(
            "| {name} | {} | {} | {:.3} | {} | {} |",
            outcome.requests,
            outcome.sends,
            outcome.amplification(),
            outcome.ok,
            outcome.overloaded
        );
    }

    assert!(
        budgeted.amplification() <= 1.1,
        "the budget let {:.3} sends per request through",
        budgeted.amplification()
    );
    assert!(budgeted.sends > budgeted.requests as u64, "no retry at all");
    assert_eq!(none.sends, none.requests as u64);
    assert!(
        unlimited.amplification() > 1.5,
        "without a budget the overload should have been amplified: {:.3}",
        unlimited.amplification()
    );
    // Retries do not make the overloaded fleet do more work.
    let served = |outcome: &Outcome| outcome.ok as f64 / RUN.as_secs_f64();
    assert!(served(&budgeted) <= 1.05 * (WORKERS * RUNNING) as f64 / WORK.as_secs_f64() + 1.0);
}
