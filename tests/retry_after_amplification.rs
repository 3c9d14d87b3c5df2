//! `Retry-After` from the drain rate against the fixed `Retry-After: 1`,
//! side by side in one run: a frontend built as `examples/frontend.rs`
//! builds it (`route::Worker`s under tower's p2c balancer, a `Buffer`,
//! `Retry` with `route::OverloadRetry`) over three workers behind real
//! gates (`AdmissionLayer`, 4 running and 16 queued each, one second of
//! work a request: 12 requests a second in all, four seconds of queue),
//! offered three times that for two virtual minutes by clients that retry
//! every rejection (up to three times, no retry budget) after the answer's
//! `Retry-After`, within a ten-second deadline.
//!
//! - **fixed**: the defaults: `Retry-After: 1`.
//! - **drain rate**: the gates with
//!   `AdmissionConfig::retry_after_from_drain_rate(30 s)`, the frontend's
//!   caps raised to match (`WorkerLayer::max_cooldown(30 s)`,
//!   `OverloadRetry::max_retry_after(30 s)`).
//!
//! Each twice: with the clients themselves waiting out `Retry-After`
//! (the workers' cool-downs off, `WorkerLayer::max_cooldown(0)`: the
//! measured rows), and with the frontend's cool-downs on (a cooling worker
//! leaves the rotation, and a retry goes at once to another worker, or
//! waits in the `Buffer` for one: shown for comparison).
//!
//! Retry amplification is sends to the workers per completed request;
//! goodput is requests completed within the deadline, per second. Virtual
//! time: the figures do not depend on the machine.
//!
//! ```text
//! cargo test --release --features route --test retry_after_amplification -- --nocapture
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
use tower_admission::route::{Deadline, OverloadRetry, WorkerHandle, WorkerLayer};
use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};

const WORKERS: usize = 3;
const RUNNING: usize = 4;
const QUEUED: usize = 16;
const WORK: Duration = Duration::from_secs(1);
const OVERLOAD: f64 = 3.0;
const RUN: Duration = Duration::from_secs(120);
const DEADLINE: Duration = Duration::from_secs(10);
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
const SEED: u64 = 0x5eed_0024;

#[derive(Debug)]
struct Outcome {
    requests: usize,
    sends: u64,
    ok: usize,
    good: usize,
    overloaded: usize,
}

impl Outcome {
    /// Sends to the workers per completed request.
    fn amplification(&self) -> f64 {
        self.sends as f64 / self.ok.max(1) as f64
    }

    /// Requests completed within the deadline, per second.
    fn goodput(&self) -> f64 {
        self.good as f64 / RUN.as_secs_f64()
    }
}

/// The handler behind each gate: `WORK` per request.
async fn work(_: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    sleep(WORK).await;
    Ok(Response::new(Full::new(Bytes::from_static(b"done"))))
}

fn gate(drain_rate: bool) -> Gate {
    let config = AdmissionConfig::new()
        .engine_request_limit(RUNNING)
        .engine_request_waiting_limit(RUNNING)
        .request_queue_limit(QUEUED)
        .clock(|| Instant::now().into_std());
    Gate::new(if drain_rate {
        config.retry_after_from_drain_rate(MAX_RETRY_AFTER)
    } else {
        config
    })
}

/// The routed call as a named `Send` future (see `route_amplification.rs`).
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
/// arrivals, each request with a `DEADLINE`.
async fn offer(drain_rate: bool, cooldowns: bool) -> Outcome {
    let workers = match (cooldowns, drain_rate) {
        (false, _) => WorkerLayer::new().max_cooldown(Duration::ZERO),
        (true, true) => WorkerLayer::new().max_cooldown(MAX_RETRY_AFTER),
        (true, false) => WorkerLayer::new(),
    };
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| workers.layer(AdmissionLayer::new(gate(drain_rate)).layer(service_fn(work))))
        .collect();
    let handles: Vec<WorkerHandle> = workers.iter().map(|worker| worker.handle()).collect();
    let balance = Balance::new(ServiceList::new(workers));
    // Clients that retry every rejection: no budget to hold them back.
    let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 1_000_000, 1000.0));
    let policy = OverloadRetry::new(budget);
    let policy = if drain_rate {
        policy.max_retry_after(MAX_RETRY_AFTER)
    } else {
        policy
    };
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
        request.extensions_mut().insert(Deadline::after(DEADLINE));
        let frontend = frontend.clone();
        calls.push(tokio::spawn(async move {
            let sent = Instant::now();
            let response = routed(frontend, request).await.expect("routed");
            let status = response.status().as_u16();
            response.into_body().collect().await.ok();
            (status, sent.elapsed())
        }));
    }
    let requests = calls.len();
    let (mut ok, mut good, mut overloaded) = (0, 0, 0);
    for call in calls {
        match call.await.unwrap() {
            (200, took) => {
                ok += 1;
                good += usize::from(took <= DEADLINE);
            }
            (529, _) => overloaded += 1,
            (other, _) => panic!("unexpected status {other}"),
        }
    }
    Outcome {
        requests,
        sends: handles.iter().map(|handle| handle.stats().requests).sum(),
        ok,
        good,
        overloaded,
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_from_the_drain_rate_sends_less_for_the_same_goodput() {
    let fixed = offer(false, false).await;
    let drain = offer(true, false).await;
    let fixed_cooling = offer(false, true).await;
    let drain_cooling = offer(true, true).await;

    println!(
        "{WORKERS} workers x {RUNNING} running + {QUEUED} queued, {WORK:?} a request; offered \
         {OVERLOAD}x capacity for {RUN:?} (virtual); clients retry every rejection up to 3 \
         times after Retry-After, within {DEADLINE:?}"
    );
    println!(
        "| Retry-After | client requests | sends to workers | sends per completed request | completed | goodput (req/s within {DEADLINE:?}) | 529 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, outcome) in [
        ("fixed 1 s (default), clients wait it out", &fixed),
        ("drain rate (max 30 s), clients wait it out", &drain),
        ("fixed 1 s (default), frontend cool-downs", &fixed_cooling),
        ("drain rate (max 30 s), frontend cool-downs", &drain_cooling),
    ] {
        println!(
            "| {name} | {} | {} | {:.3} | {} | {:.2} | {} |",
            outcome.requests,
            outcome.sends,
            outcome.amplification(),
            outcome.ok,
            outcome.goodput(),
            outcome.overloaded
        );
    }

    assert!(
        drain.amplification() < fixed.amplification(),
        "drain rate {:.3} sends per completed request, fixed {:.3}",
        drain.amplification(),
        fixed.amplification()
    );
    // The retries' jitter is random (tower's HasherRng), so the figures
    // move by a few percent from run to run.
    assert!(
        drain.goodput() >= 0.9 * fixed.goodput(),
        "drain rate {:.2} req/s, fixed {:.2}",
        drain.goodput(),
        fixed.goodput()
    );
}
