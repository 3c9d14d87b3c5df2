//! Queue wait budgets, on tokio's paused clock: a queued request leaves the
//! queue when its budget ends and not before; expiry racing an admission or
//! a cancellation has exactly one outcome; a request predicted to wait past
//! its budget is rejected at once, but only once a drain rate is measured;
//! the budget of a time-to-first-token objective follows the engine's
//! measured waiting time; the HTTP layer answers an expired request at
//! once, gRPC ones `DEADLINE_EXCEEDED` for the client's own deadline.
#![cfg(feature = "http")] // the gate's timer is tokio's, with the layer

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use http::{Request, Response};
use http_body_util::Empty;
use tokio::sync::Notify;
use tokio::time::{Instant, advance};
use tower::{Layer, ServiceExt, service_fn};
use tower_admission::{
    Acquire, AdmissionConfig, AdmissionLayer, Descriptor, Gate, Overloaded, Permit,
    RejectionReason, RejectionScope,
};

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::{assert_idle, counts};

/// A gate of one engine slot and `queue` queue places, on tokio's clock.
fn timed(queue: usize, config: AdmissionConfig) -> Gate {
    Gate::new(
        config
            .engine_request_limit(1)
            .request_queue_limit(queue)
            .clock(|| Instant::now().into_std()),
    )
}

/// Awaits an Acquire the way its owner must: with a timer for its budget.
async fn wait(mut acquire: Acquire) -> Result<Permit, Overloaded> {
    let Some(at) = acquire.expires_at() else {
        return acquire.await;
    };
    tokio::select! {
        biased;
        result = &mut acquire => result,
        () = tokio::time::sleep_until(Instant::from_std(at)) => {
            acquire.expire();
            acquire.await
        }
    }
}

fn admitted_now(gate: &Gate) -> Permit {
    gate.acquire(None).now_or_never().unwrap().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_expires_at_its_budget_and_not_before() {
    let gate = timed(
        10,
        AdmissionConfig::new().request_queue_wait_limit(Duration::from_millis(100)),
    );
    let _running = admitted_now(&gate);
    let arrival = Instant::now();
    let queued = gate.acquire(None);
    assert_eq!(
        queued.expires_at(),
        Some((arrival + Duration::from_millis(100)).into_std())
    );
    let waiter = tokio::spawn(wait(queued));
    advance(Duration::from_millis(99)).await;
    assert!(!waiter.is_finished());
    assert_eq!(gate.snapshot().total, counts(1, 1, 1));
    advance(Duration::from_millis(1)).await;
    let overloaded = waiter.await.unwrap().unwrap_err();
    assert_eq!(overloaded.reason(), RejectionReason::Deadline);
    assert_eq!(overloaded.scope(), RejectionScope::Worker);
    assert!(!overloaded.client_deadline_passed());
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.total, counts(1, 1, 0), "it left the queue");
    assert_eq!(snapshot.tally.expired(), 1);
    assert_eq!(snapshot.tally.rejected(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_expiry_racing_an_admission_leaves_the_admission_standing() {
    let gate = timed(
        10,
        AdmissionConfig::new().request_queue_wait_limit(Duration::from_millis(100)),
    );
    let running = admitted_now(&gate);
    let mut queued = gate.acquire(None);
    // The engine frees its slot: the waiter is offered the admission...
    drop(running);
    // ...and its budget ends before it looks.
    advance(Duration::from_millis(100)).await;
    queued.expire();
    let permit = queued.await.expect("the admission stands");
    drop(permit);
    let snapshot = gate.snapshot();
    assert_idle(&snapshot);
    assert_eq!(snapshot.tally.admitted_queue, 1);
    assert_eq!(snapshot.tally.expired(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_expired_request_dropped_afterwards_is_not_also_cancelled() {
    let gate = timed(
        10,
        AdmissionConfig::new().request_queue_wait_limit(Duration::from_millis(100)),
    );
    let _running = admitted_now(&gate);
    let mut queued = gate.acquire(None);
    advance(Duration::from_millis(100)).await;
    queued.expire();
    queued.expire(); // a second expiry changes nothing
    drop(queued);
    let tally = gate.snapshot().tally;
    assert_eq!((tally.expired(), tally.cancelled), (1, 0));
    assert_eq!(
        tally.received,
        tally.settled(),
        "admitted, or rejected once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_predicted_to_miss_its_budget_is_rejected_only_once_a_rate_exists() {
    let gate = timed(
        100,
        AdmissionConfig::new().request_queue_wait_limit(Duration::from_secs(1)),
    );
    let mut running = admitted_now(&gate);
    // No rate measured yet: ten requests queue, whatever is ahead of them.
    let mut queued: Vec<Acquire> = (0..10).map(|_| gate.acquire(None)).collect();
    assert!(queued.iter().all(Acquire::is_queued));
    // The engine finishes one request every 200 ms, four times.
    for _ in 0..4 {
        advance(Duration::from_millis(200)).await;
        drop(running);
        running = queued.remove(0).now_or_never().unwrap().unwrap();
    }
    // Six wait, draining at one per 200 ms: a newcomer would wait about
    // 1.4 s against a budget of 1 s. It is rejected at once.
    let rejected = gate
        .acquire(None)
        .now_or_never()
        .expect("decided on arrival");
    let overloaded = rejected.unwrap_err();
    assert_eq!(overloaded.reason(), RejectionReason::Deadline);
    assert_eq!(gate.snapshot().total.queued, 6);
    // With two waiting, a newcomer would wait about 0.6 s: it queues.
    queued.truncate(2);
    assert_eq!(gate.snapshot().total.queued, 2);
    assert!(gate.acquire(None).is_queued());
    drop(running);
}

/// `times` requests each wait `wait` for their first token.
async fn engine_waits(gate: &Gate, wait: Duration, times: usize) {
    for _ in 0..times {
        let mut permit = admitted_now(gate);
        advance(wait).await;
        permit.first_token();
    }
}

#[tokio::test(start_paused = true)]
async fn the_budget_of_an_objective_is_what_the_engine_waiting_time_leaves() {
    let gate = timed(
        10,
        AdmissionConfig::new().ttft_objective(Duration::from_secs(1)),
    );
    let budget = |gate: &Gate| {
        let holder = admitted_now(gate);
        let queued = gate.acquire(None);
        let budget = queued.expires_at().unwrap() - Instant::now().into_std();
        drop((queued, holder));
        budget
    };
    // Nothing measured yet: the whole objective.
    assert_eq!(budget(&gate), Duration::from_secs(1));
    engine_waits(&gate, Duration::from_millis(300), 30).await;
    let left = budget(&gate);
    assert!(
        left.abs_diff(Duration::from_millis(700)) < Duration::from_millis(5),
        "{left:?}"
    );
    // The engine slows down: the budget shrinks with it.
    engine_waits(&gate, Duration::from_millis(900), 30).await;
    let left = budget(&gate);
    assert!(
        left.abs_diff(Duration::from_millis(100)) < Duration::from_millis(5),
        "{left:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_clients_own_deadline_is_honoured_without_any_gate_setting() {
    let gate = timed(10, AdmissionConfig::new());
    let _running = admitted_now(&gate);
    let mut plain = gate.acquire(None);
    assert_eq!(plain.expires_at(), None, "no budget by default");
    let with_deadline =
        gate.acquire_with(Descriptor::new().with_deadline(Duration::from_millis(50)));
    let outcome = tokio::spawn(wait(with_deadline));
    advance(Duration::from_millis(50)).await;
    let overloaded = outcome.await.unwrap().unwrap_err();
    assert!(overloaded.client_deadline_passed());
    assert!(
        (&mut plain).now_or_never().is_none(),
        "the plain one still waits"
    );
}

type Body = Empty<Bytes>;

/// A layer over a handler that answers only when told to.
fn held_service(
    gate: Gate,
    layer: impl Fn(AdmissionLayer) -> AdmissionLayer,
) -> (
    impl tower::Service<
        Request<Body>,
        Response = Response<tower_admission::http::ResponseBody<Body>>,
        Error = Infallible,
        Future = impl Send,
    > + Clone,
    Arc<Notify>,
) {
    let release = Arc::new(Notify::new());
    let handler_release = release.clone();
    let handler = service_fn(move |_: Request<Body>| {
        let release = handler_release.clone();
        async move {
            release.notified().await;
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }
    });
    (layer(AdmissionLayer::new(gate)).layer(handler), release)
}

fn grpc(timeout: &str) -> Request<Body> {
    Request::builder()
        .uri("/pkg.Service/Method")
        .header("content-type", "application/grpc")
        .header("grpc-timeout", timeout)
        .body(Empty::new())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_layer_answers_a_grpc_request_whose_timeout_passes_in_the_queue_with_deadline_exceeded()
{
    let gate = timed(10, AdmissionConfig::new());
    let (service, release) = held_service(gate.clone(), |layer| layer.grpc_timeout());
    let running = tokio::spawn(service.clone().oneshot(Request::new(Empty::new())));
    tokio::task::yield_now().await;
    assert_eq!(gate.snapshot().total.engine_requests, 1);
    let queued = tokio::spawn(service.clone().oneshot(grpc("100m")));
    tokio::task::yield_now().await;
    assert_eq!(gate.snapshot().total.queued, 1);
    advance(Duration::from_millis(99)).await;
    assert!(!queued.is_finished());
    advance(Duration::from_millis(1)).await;
    let response = queued.await.unwrap().unwrap();
    assert_eq!(response.headers()["grpc-status"], "4");
    assert_eq!(
        response.headers()["x-admission-rejection-reason"],
        "deadline"
    );
    assert_eq!(gate.snapshot().total.queued, 0);
    release.notify_one();
    drop(running.await.unwrap().unwrap());
    assert_idle(&gate.snapshot());
}

#[tokio::test(start_paused = true)]
async fn the_layer_answers_529_with_reason_deadline_when_a_header_deadline_passes() {
    let gate = timed(10, AdmissionConfig::new());
    let (service, release) = held_service(gate.clone(), |layer| {
        layer.deadline_header("x-request-timeout-ms")
    });
    let _running = tokio::spawn(service.clone().oneshot(Request::new(Empty::new())));
    tokio::task::yield_now().await;
    let request = Request::builder()
        .header("x-request-timeout-ms", "50")
        .body(Empty::new())
        .unwrap();
    let queued = tokio::spawn(service.clone().oneshot(request));
    // A gRPC timeout is not honoured unless asked for: this one waits on.
    let grpc_waits = tokio::spawn(service.clone().oneshot(grpc("10m")));
    advance(Duration::from_millis(50)).await;
    let response = queued.await.unwrap().unwrap();
    assert_eq!(response.status().as_u16(), 529);
    assert_eq!(
        response.headers()["x-admission-rejection-reason"],
        "deadline"
    );
    assert!(!grpc_waits.is_finished());
    assert_eq!(gate.snapshot().total.queued, 1);
    release.notify_waiters();
    drop(grpc_waits);
}
