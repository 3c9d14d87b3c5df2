//! The overloaded fleet of the retry amplification tests
//! (`tests/route_amplification.rs`, `tests/retry_after_amplification.rs`):
//! a frontend built as `examples/frontend.rs` builds it (`route::Worker`s
//! under tower's p2c balancer, a `Buffer`, `Retry` with
//! `route::OverloadRetry`) over `WORKERS` workers behind real gates
//! (`AdmissionLayer`, `RUNNING` running each, `WORK` a request), offered
//! `OVERLOAD` times their capacity for `RUN` by Poisson arrivals, each
//! request with a `DEADLINE`. Virtual time (`start_paused`).

use tower_admission_testkit::rng;

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
use tower_admission::{AdmissionLayer, Gate};
use tower_admission_route::{Deadline, OverloadRetry, WorkerHandle, WorkerLayer};

pub const WORKERS: usize = 3;
pub const RUNNING: usize = 4;
pub const WORK: Duration = Duration::from_secs(1);
pub const OVERLOAD: f64 = 3.0;
pub const RUN: Duration = Duration::from_secs(120);
pub const DEADLINE: Duration = Duration::from_secs(10);

/// What one run saw: each client request's final status and how long it
/// took, in the order they were sent, and the sends the workers received.
#[derive(Debug)]
pub struct Offered {
    pub answers: Vec<(u16, Duration)>,
    pub sends: u64,
}

/// A budget that never holds a retry back: clients that retry every
/// rejection (up to `OverloadRetry`'s three times).
pub fn unlimited_budget() -> Arc<TpsBudget> {
    Arc::new(TpsBudget::new(Duration::from_secs(10), 1_000_000, 1000.0))
}

/// The handler behind each gate: `WORK` per request.
async fn work(_: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    sleep(WORK).await;
    Ok(Response::new(Full::new(Bytes::from_static(b"done"))))
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
/// arrivals drawn from `seed`, each request with a `DEADLINE`: `WORKERS`
/// workers wrapped by `workers`, each behind its own `gate()`, under
/// `Retry` with `policy`.
pub async fn offer(
    workers: WorkerLayer,
    gate: impl Fn() -> Gate,
    policy: OverloadRetry,
    seed: u64,
) -> Offered {
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| workers.layer(AdmissionLayer::new(gate()).layer(service_fn(work))))
        .collect();
    let handles: Vec<WorkerHandle> = workers.iter().map(|worker| worker.handle()).collect();
    let balance = Balance::new(ServiceList::new(workers));
    let frontend = Retry::new(policy, Buffer::new(balance, 1024));

    let capacity = (WORKERS * RUNNING) as f64 / WORK.as_secs_f64();
    let rate = OVERLOAD * capacity;
    let mut rng = rng::Rng::new(seed);
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
    let mut answers = Vec::with_capacity(calls.len());
    for call in calls {
        answers.push(call.await.unwrap());
    }
    Offered {
        answers,
        sends: handles.iter().map(|handle| handle.stats().requests).sum(),
    }
}
