//! `Retry-After` from the drain rate (opt-in), on tokio's paused clock: a
//! worker-scoped rejection carries the queue's length over its measured
//! drain rate, rounded up to whole seconds and clamped to `[1 s, max]`, in
//! `Overloaded::retry_after`, `Retry-After` and `grpc-retry-pushback-ms`;
//! rank-scoped rejections carry none; and without the setting everything is
//! as before: no estimate, `Retry-After: 1`.
#![cfg(feature = "http")]

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use http::{Request, Response};
use http_body_util::Empty;
use tokio::time::{Instant, advance};
use tower::{Layer, ServiceExt, service_fn};
use tower_admission::{
    Acquire, AdmissionConfig, AdmissionLayer, EngineCapacity, Gate, Overloaded, Permit,
    RejectionScope,
};

const GAP: Duration = Duration::from_millis(300);

/// A gate of one engine slot per rank and `queue` queue places, on tokio's
/// clock.
fn gate(queue: usize, config: AdmissionConfig) -> Gate {
    Gate::new(
        config
            .engine_request_limit(1)
            .request_queue_limit(queue)
            .clock(|| Instant::now().into_std()),
    )
}

/// Admits `rank`'s queued requests one every [`GAP`], `times` times: the
/// queue drains at one request per `GAP`. Returns the permit running last.
async fn drain(gate: &Gate, rank: Option<u32>, mut running: Permit, times: usize) -> Permit {
    let mut queued: Vec<Acquire> = (0..times).map(|_| gate.acquire(rank)).collect();
    assert!(queued.iter().all(Acquire::is_queued));
    for next in queued.drain(..) {
        advance(GAP).await;
        drop(running);
        running = next.now_or_never().expect("admitted at once").unwrap();
    }
    running
}

/// Fills `rank`'s queue to `queue` and returns the next request's rejection.
fn rejection(gate: &Gate, rank: Option<u32>, queue: usize) -> (Vec<Acquire>, Overloaded) {
    let queued: Vec<Acquire> = (0..queue).map(|_| gate.acquire(rank)).collect();
    assert!(queued.iter().all(Acquire::is_queued));
    let overloaded = gate
        .acquire(rank)
        .now_or_never()
        .expect("decided at once")
        .expect_err("the queue is full");
    (queued, overloaded)
}

#[tokio::test(start_paused = true)]
async fn a_worker_scoped_rejection_says_when_the_queue_will_have_drained() {
    let gate = gate(
        10,
        AdmissionConfig::new().retry_after_from_drain_rate(Duration::from_secs(30)),
    );
    let first = gate.acquire(None).now_or_never().unwrap().unwrap();
    // No rate measured yet: no estimate.
    let (queued, before) = rejection(&gate, None, 10);
    assert_eq!(before.scope(), RejectionScope::Worker);
    assert_eq!(before.retry_after(), None);
    drop(queued);
    let _running = drain(&gate, None, first, 4).await;
    // Ten queued, one admitted every 300 ms: 3 s.
    let (_queued, overloaded) = rejection(&gate, None, 10);
    assert_eq!(overloaded.scope(), RejectionScope::Worker);
    assert_eq!(overloaded.retry_after(), Some(Duration::from_secs(3)));
}

#[tokio::test(start_paused = true)]
async fn the_estimate_rounds_up_and_is_clamped_to_its_maximum() {
    let short = gate(
        3,
        AdmissionConfig::new().retry_after_from_drain_rate(Duration::from_secs(30)),
    );
    let first = short.acquire(None).now_or_never().unwrap().unwrap();
    let _running = drain(&short, None, first, 3).await;
    // 3 × 300 ms = 0.9 s: at least one second.
    let (_queued, overloaded) = rejection(&short, None, 3);
    assert_eq!(overloaded.retry_after(), Some(Duration::from_secs(1)));

    let capped = gate(
        40,
        AdmissionConfig::new().retry_after_from_drain_rate(Duration::from_secs(5)),
    );
    let first = capped.acquire(None).now_or_never().unwrap().unwrap();
    let _running = drain(&capped, None, first, 3).await;
    // 40 × 300 ms = 12 s, capped at 5.
    let (_queued, overloaded) = rejection(&capped, None, 40);
    assert_eq!(overloaded.retry_after(), Some(Duration::from_secs(5)));
}

#[tokio::test(start_paused = true)]
async fn rank_scoped_rejections_carry_no_estimate() {
    let gate = gate(
        2,
        AdmissionConfig::new()
            .retry_after_from_drain_rate(Duration::from_secs(30))
            .capacity(EngineCapacity::new(1, 2)),
    );
    let first = gate.acquire(Some(0)).now_or_never().unwrap().unwrap();
    let _running = drain(&gate, Some(0), first, 2).await;
    let (_queued, overloaded) = rejection(&gate, Some(0), 2);
    assert_eq!(overloaded.scope(), RejectionScope::Rank(0));
    assert_eq!(overloaded.retry_after(), None);
}

#[tokio::test(start_paused = true)]
async fn without_the_setting_there_is_no_estimate() {
    let gate = gate(
        10,
        AdmissionConfig::new().request_queue_wait_limit(Duration::from_secs(60)),
    );
    let first = gate.acquire(None).now_or_never().unwrap().unwrap();
    let _running = drain(&gate, None, first, 4).await;
    let (_queued, overloaded) = rejection(&gate, None, 10);
    assert_eq!(overloaded.scope(), RejectionScope::Worker);
    assert_eq!(overloaded.retry_after(), None);
}

async fn answer(gate: &Gate, layer: AdmissionLayer, content_type: &str) -> Response<Bytes> {
    let _ = gate;
    let service = layer.layer(service_fn(|_: Request<Empty<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    }));
    let request = Request::post("/v1/completions")
        .header("content-type", content_type)
        .body(Empty::new())
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = http_body_util::BodyExt::collect(body)
        .await
        .map(|collected| collected.to_bytes())
        .unwrap_or_default();
    Response::from_parts(parts, body)
}

fn header<'a>(response: &'a Response<Bytes>, name: &str) -> Option<&'a str> {
    response
        .headers()
        .get(name)
        .map(|value| value.to_str().unwrap())
}

#[tokio::test(start_paused = true)]
async fn the_layer_sends_the_estimate_as_retry_after_and_grpc_pushback() {
    let gate = gate(
        10,
        AdmissionConfig::new().retry_after_from_drain_rate(Duration::from_secs(30)),
    );
    let first = gate.acquire(None).now_or_never().unwrap().unwrap();
    let _running = drain(&gate, None, first, 4).await;
    let _queued: Vec<Acquire> = (0..10).map(|_| gate.acquire(None)).collect();

    let http = answer(&gate, AdmissionLayer::new(gate.clone()), "application/json").await;
    assert_eq!(http.status().as_u16(), 529);
    assert_eq!(header(&http, "retry-after"), Some("3"));
    assert_eq!(header(&http, "x-admission-rejection-scope"), Some("worker"));

    let grpc = answer(&gate, AdmissionLayer::new(gate.clone()), "application/grpc").await;
    assert_eq!(header(&grpc, "grpc-retry-pushback-ms"), Some("3000"));

    // A layer that sends no Retry-After still sends none.
    let off = answer(
        &gate,
        AdmissionLayer::new(gate.clone()).retry_after(None),
        "application/json",
    )
    .await;
    assert_eq!(off.status().as_u16(), 529);
    assert_eq!(header(&off, "retry-after"), None);
}

#[tokio::test(start_paused = true)]
async fn by_default_a_worker_scoped_rejection_still_says_retry_after_1() {
    let gate = gate(10, AdmissionConfig::new());
    let first = gate.acquire(None).now_or_never().unwrap().unwrap();
    let _running = drain(&gate, None, first, 4).await;
    let (_queued, overloaded) = rejection(&gate, None, 10);
    assert_eq!(overloaded.retry_after(), None);
    let http = answer(&gate, AdmissionLayer::new(gate.clone()), "application/json").await;
    assert_eq!(header(&http, "retry-after"), Some("1"));
    let grpc = answer(&gate, AdmissionLayer::new(gate.clone()), "application/grpc").await;
    assert_eq!(header(&grpc, "grpc-retry-pushback-ms"), Some("1000"));
}
