//! Shutting the gate down and rejections made in front of it, over the
//! public API: requests queued when a server begins to drain, and those
//! arriving after, are rejected with reason `shutdown` (worker scope),
//! answered `503` by the layer whatever its overload status, and counted in
//! the tallies and in `rejection_total{reason="shutdown"}`; a rejection made
//! in front of the gate (`Gate::reject`) is counted the same way.
#![cfg(all(feature = "http", feature = "metrics"))]

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower::{Layer, ServiceExt, service_fn};
use tower_admission::{AdmissionConfig, AdmissionLayer, Gate, RejectionReason, RejectionScope};

/// `rejection_total` of the unranked requests, worker scope, of `reason`
/// (`None`: the series without a reason label); `None` if there is no such
/// series.
fn worker_rejections(snapshotter: &Snapshotter, reason: Option<&str>) -> Option<u64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(key, _, _, value)| {
            let key = key.key();
            let label = |name: &str| {
                key.labels()
                    .find(|label| label.key() == name)
                    .map(|label| label.value().to_owned())
            };
            let matches = key.name() == "admission_rejection_total"
                && label("dp_rank").as_deref() == Some("unspecified")
                && label("scope").as_deref() == Some("worker")
                && label("reason").as_deref() == reason;
            match (matches, value) {
                (true, DebugValue::Counter(count)) => Some(count),
                _ => None,
            }
        })
}

fn request(content_type: &str) -> Request<Empty<Bytes>> {
    Request::post("/v1/completions")
        .header("content-type", content_type)
        .body(Empty::new())
        .unwrap()
}

#[tokio::test]
async fn requests_queued_or_arriving_at_shutdown_are_answered_503_and_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(4),
    );
    // Overloads are 429 here; a shutdown is not an overload.
    let service = AdmissionLayer::new(gate.clone())
        .overload_status(StatusCode::TOO_MANY_REQUESTS)
        .layer(service_fn(|_: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }));
    let running = gate.acquire(None).await.expect("admitted");
    let queued = tokio::spawn(service.clone().oneshot(request("application/json")));
    while gate.snapshot().total.queued == 0 {
        tokio::task::yield_now().await;
    }

    gate.shut_down();
    let answer = queued.await.unwrap().unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    let headers = answer.headers();
    assert_eq!(headers["x-admission-rejection-reason"], "shutdown");
    assert_eq!(headers["x-admission-rejection-scope"], "worker");
    assert_eq!(headers["retry-after"], "1");
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"]["type"], "overloaded");
    assert_eq!(json["error"]["code"], 503);
    assert_eq!(json["error"]["scope"], "worker");
    assert_eq!(json["error"]["reason"], "shutdown");

    // Arrivals are turned away too, in their own protocol.
    let late = service
        .clone()
        .oneshot(request("application/json"))
        .await
        .unwrap();
    assert_eq!(late.status(), StatusCode::SERVICE_UNAVAILABLE);
    let grpc = service.oneshot(request("application/grpc")).await.unwrap();
    assert_eq!(grpc.headers()["grpc-status"], "14");
    assert_eq!(grpc.headers()["x-admission-rejection-reason"], "shutdown");

    // The running request was never touched, and runs to its end.
    drop(running);
    let snapshot = gate.snapshot();
    assert!(snapshot.is_idle());
    let tally = snapshot.tally;
    assert_eq!(
        (tally.received, tally.admitted(), tally.cancelled),
        (4, 1, 0)
    );
    assert_eq!((tally.rejected_worker, tally.shutdown_worker), (3, 3));
    assert_eq!(worker_rejections(&snapshotter, Some("shutdown")), Some(3));
    // Not counted twice: the series without a reason counts the rest.
    assert_eq!(worker_rejections(&snapshotter, None), Some(0));
}

#[tokio::test]
async fn a_rejection_in_front_of_the_gate_is_counted_like_the_gate_s_own() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let gate = Gate::new(AdmissionConfig::new());
    assert_eq!(
        worker_rejections(&snapshotter, Some("body_reads")),
        None,
        "no series before the first such rejection"
    );

    let overloaded = gate.reject(RejectionReason::BodyReads);
    assert_eq!(overloaded.scope(), RejectionScope::Worker);
    assert_eq!(overloaded.reason(), RejectionReason::BodyReads);
    assert_eq!(
        overloaded.to_string(),
        "overloaded: the worker is reading too many request bodies at once"
    );
    let tally = gate.snapshot().tally;
    assert_eq!(
        (tally.received, tally.rejected(), tally.body_reads_worker),
        (1, 1, 1)
    );
    assert_eq!(worker_rejections(&snapshotter, Some("body_reads")), Some(1));
    // The gate still admits: a rejection in front of it takes nothing.
    assert!(gate.acquire(None).await.is_ok());
    gate.refresh_metrics();
    assert_eq!(worker_rejections(&snapshotter, Some("body_reads")), Some(1));
}
