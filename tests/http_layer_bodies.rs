//! The admission layer's response bodies against a mock inner service:
//! when each piece of engine capacity comes back as the body streams,
//! ends, fails or is dropped, what the detectors and `FirstToken` decide,
//! and the answers a rejected request receives (the rest of
//! `tests/http_layer.rs`).
#![cfg(feature = "http")]
#![allow(dead_code)] // each of the two files uses part of support/layer_rig.rs

use std::convert::Infallible;
use std::pin::Pin;
use std::task::Poll;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::{Body as _, Frame};
use http_body_util::{BodyExt, Empty, StreamBody, combinators::UnsyncBoxBody};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_test::{assert_pending, assert_ready, assert_ready_ok, task};
use tower::{BoxError, Layer};
use tower_admission::FirstTokenDetector;
use tower_admission::http::{
    Admission, BypassPaths, FirstToken, Priority, QosHeaders, ResponseBody,
};
use tower_admission::{
    AdmissionConfig, AdmissionLayer, AdmitSource, Admitted, Descriptor, EngineCapacity, Gate,
    RankHeader, Tenant,
};
use tower_test::mock;

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::counts;

type Body = UnsyncBoxBody<Bytes, BoxError>;
type Frames = mpsc::UnboundedSender<Result<Frame<Bytes>, BoxError>>;

// The rig: gate, mock service, requests, bodies.
include!("support/layer_rig.rs");

#[tokio::test]
async fn the_inner_service_learns_the_rank_and_source_of_its_admission() {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .engine_request_waiting_limit(1)
            .request_queue_limit(1)
            .capacity(EngineCapacity::new(1, 2)),
    );
    let (inner, mut handle) = mock::pair();
    let mut service = mock::Spawn::new(
        AdmissionLayer::new(gate.clone())
            .rank(RankHeader::default())
            .layer(inner),
    );
    handle.allow(10);

    let mut direct = call(&mut service, ranked("/direct", "1"));
    let mut queued = call(&mut service, ranked("/queued", "1"));
    let (req, respond) = next_request(&mut handle);
    let admitted = req.extensions().get::<Admitted>().unwrap();
    assert_eq!(
        (admitted.rank, admitted.source),
        (Some(1), AdmitSource::Direct)
    );
    respond.send_response(Response::new(empty_body()));
    drop(assert_ready_ok!(direct.poll()));

    assert_pending!(queued.poll());
    let (req, _respond) = next_request(&mut handle);
    let admitted = req.extensions().get::<Admitted>().unwrap();
    assert_eq!(
        (admitted.rank, admitted.source),
        (Some(1), AdmitSource::Queue)
    );

    // A rank the engine has not reported is counted, and announced, as unranked.
    let mut unranked = call(&mut service, ranked("/unranked", "7"));
    let (req, _respond) = next_request(&mut handle);
    assert_eq!(req.extensions().get::<Admitted>().unwrap().rank, None);
    assert_pending!(unranked.poll());
}

#[tokio::test]
async fn the_default_detector_reads_event_streams_as_openai_events() {
    let gate = gate(1, 0);
    let (mut service, mut handle) = service(&gate);
    handle.allow(1);
    let (frames, response, _) = sse_response(&mut service, &mut handle).await;
    let mut body = response.into_body();
    frames
        .send(data(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
        ))
        .unwrap();
    assert_ready!(poll_frame(&mut body));
    assert_eq!(
        gate.snapshot().total,
        counts(1, 1, 0),
        "a role chunk is no token"
    );
    frames
        .send(data(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n",
        ))
        .unwrap();
    assert_ready!(poll_frame(&mut body));
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));
}

#[tokio::test]
async fn every_admitted_request_carries_a_first_token_that_ends_waiting_before_the_body_is_polled()
{
    let gate = gate(1, 0);
    let (mut service, mut handle) = service(&gate);
    handle.allow(1);
    let mut future = call(&mut service, request("/v1/completions"));
    let (req, respond) = next_request(&mut handle);
    let first_token = req.extensions().get::<FirstToken>().unwrap().clone();
    assert!(!first_token.is_marked());
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));

    // The handler marks it before it has even answered.
    first_token.mark();
    assert!(first_token.is_marked());
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));
    first_token.clone().mark();
    assert_eq!(gate.snapshot().total, counts(1, 0, 0), "mark is idempotent");

    let (frames, body) = streaming_body();
    respond.send_response(Response::new(body));
    let mut body = assert_ready_ok!(future.poll()).into_body();
    frames.send(data("{\"whole\":\"answer\"}")).unwrap();
    assert_ready!(poll_frame(&mut body));
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));
    drop(frames);
    assert!(matches!(poll_frame(&mut body), Poll::Ready(None)));
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));

    // After the response ended a kept clone holds nothing and does nothing.
    first_token.mark();
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
    drop(body);
    drop(first_token);
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[tokio::test]
async fn a_first_token_kept_by_the_handler_does_not_keep_the_request() {
    let gate = gate(1, 0);
    let (mut service, mut handle) = service(&gate);
    handle.allow(1);
    let mut future = call(&mut service, request("/"));
    let (req, respond) = next_request(&mut handle);
    let kept = req.extensions().get::<FirstToken>().unwrap().clone();
    let (frames, body) = streaming_body();
    respond.send_response(Response::new(body));
    let body = assert_ready_ok!(future.poll()).into_body();
    drop(frames);
    // The client went away: everything is released though `kept` lives on.
    drop(body);
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
    assert!(kept.is_marked());
    kept.mark();
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[tokio::test]
async fn marking_after_the_detector_ended_waiting_changes_nothing() {
    let gate = gate(1, 0);
    let (mut service, mut handle) = service(&gate);
    handle.allow(1);
    let (frames, response, first_token) = sse_response(&mut service, &mut handle).await;
    let mut body = response.into_body();
    frames.send(data("data: [DONE]\n\n")).unwrap();
    assert_ready!(poll_frame(&mut body));
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));
    assert!(first_token.is_marked());
    first_token.mark();
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));
    drop(frames);
    assert!(matches!(poll_frame(&mut body), Poll::Ready(None)));
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[tokio::test]
async fn retry_after_is_configurable_or_absent() {
    for (setting, expected) in [(Some(7), Some("7")), (None, None)] {
        let gate = gate(1, 0);
        let (inner, mut handle) = mock::pair::<Request<()>, Response<Body>>();
        let mut service = mock::Spawn::new(
            AdmissionLayer::new(gate.clone())
                .retry_after(setting)
                .layer(inner),
        );
        handle.allow(1);
        let _admitted = call(&mut service, request("/"));
        let response = assert_ready_ok!(call(&mut service, request("/")).poll());
        assert_eq!(header(response.headers(), "retry-after"), expected);
        let grpc = Request::builder()
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let response = assert_ready_ok!(call(&mut service, grpc).poll());
        let pushback = expected.map(|seconds| format!("{seconds}000"));
        assert_eq!(
            header(response.headers(), "grpc-retry-pushback-ms"),
            pushback.as_deref()
        );
    }
}

#[tokio::test]
async fn a_closure_can_build_the_whole_overload_response() {
    let gate = gate(1, 0);
    let (inner, mut handle) = mock::pair::<Request<()>, Response<Body>>();
    let mut service = mock::Spawn::new(
        AdmissionLayer::new(gate.clone())
            .overload_response(
                |overloaded: &tower_admission::Overloaded, head: &http::request::Parts| {
                    Response::builder()
                        .status(503)
                        .header("x-path", head.uri.path())
                        .body(Bytes::from(format!("busy: {:?}", overloaded.scope())))
                        .unwrap()
                },
            )
            .layer(inner),
    );
    handle.allow(1);
    let _admitted = call(&mut service, request("/"));
    let response = assert_ready_ok!(call(&mut service, request("/mine")).poll());
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(header(response.headers(), "x-path"), Some("/mine"));
    assert_eq!(header(response.headers(), "retry-after"), None);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(bytes, "busy: Worker");
}

#[tokio::test]
async fn grpc_web_requests_get_their_own_content_type_back() {
    let gate = gate(1, 0);
    let (mut service, mut handle) = service(&gate);
    handle.allow(1);
    let _admitted = call(&mut service, request("/"));
    for content_type in ["application/grpc-web", "application/grpc-web-text+proto"] {
        let grpc_web = Request::builder()
            .header("content-type", content_type)
            .body(())
            .unwrap();
        let response = assert_ready_ok!(call(&mut service, grpc_web).poll());
        assert_eq!(
            header(response.headers(), "content-type"),
            Some(content_type)
        );
        assert_eq!(header(response.headers(), "grpc-status"), Some("14"));
    }
}

#[tokio::test]
async fn bypassed_requests_skip_the_gate() {
    let gate = gate(1, 0);
    let (inner, mut handle) = mock::pair::<Request<()>, Response<Body>>();
    let mut service = mock::Spawn::new(
        AdmissionLayer::new(gate.clone())
            .bypass(BypassPaths::grpc_health_and_reflection())
            .layer(inner),
    );
    handle.allow(3);
    let _admitted = call(&mut service, request("/llm.Generator/Generate"));
    let _ = next_request(&mut handle);
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));

    // The worker is full, yet health checks reach the inner service,
    // uncounted, without extensions.
    let mut health = call(&mut service, request("/grpc.health.v1.Health/Check"));
    let (req, respond) = next_request(&mut handle);
    assert_eq!(req.uri(), "/grpc.health.v1.Health/Check");
    assert!(req.extensions().get::<FirstToken>().is_none());
    respond.send_response(Response::new(empty_body()));
    let _ = assert_ready_ok!(health.poll());
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    assert_eq!(gate.snapshot().tally.received, 1);

    let rejected = assert_ready_ok!(call(&mut service, request("/llm.Generator/Generate")).poll());
    assert_eq!(rejected.status().as_u16(), 529);
}

#[tokio::test]
async fn the_priority_header_orders_the_queue_through_the_layer() {
    let gate = gate(1, 10);
    let requests = [
        ("/low", "0"),
        ("/malformed", "urgent"),
        ("/high", "5"),
        ("/sheddable", "-1"),
    ]
    .into_iter()
    .map(|(path, priority)| with_headers(path, &[("x-admission-priority", priority)]))
    .collect();
    let layer = AdmissionLayer::new(gate.clone()).qos_headers(QosHeaders::default());
    let (order, statuses) = served(&gate, layer, requests).await;
    assert_eq!(order, ["/high", "/low", "/malformed", "/sheddable"]);
    assert_eq!(statuses, [200; 4]);
}

#[tokio::test]
async fn the_tenant_header_shares_a_band_between_tenants_through_the_layer() {
    let gate = gate(1, 10);
    let requests = [("/x1", "x"), ("/x2", "x"), ("/x3", "x"), ("/y1", "y")]
        .into_iter()
        .map(|(path, tenant)| with_headers(path, &[("x-admission-tenant", tenant)]))
        .collect();
    let layer =
        AdmissionLayer::new(gate.clone()).qos_headers(QosHeaders::default().tenant_header("x-org"));
    let (order, _) = served(&gate, layer.clone(), requests).await;
    assert_eq!(
        order,
        ["/x1", "/x2", "/x3", "/y1"],
        "another header is read"
    );

    let requests = [("/x1", "x"), ("/x2", "x"), ("/x3", "x"), ("/y1", "y")]
        .into_iter()
        .map(|(path, tenant)| with_headers(path, &[("x-org", tenant)]))
        .collect();
    let (order, _) = served(&gate, layer, requests).await;
    assert_eq!(order, ["/x1", "/y1", "/x2", "/x3"]);
}

#[tokio::test]
async fn without_qos_headers_configured_the_headers_are_ignored() {
    let gate = gate(1, 10);
    let requests = [("/1", "0"), ("/2", "9")]
        .into_iter()
        .map(|(path, priority)| with_headers(path, &[("x-admission-priority", priority)]))
        .collect();
    let (order, _) = served(&gate, AdmissionLayer::new(gate.clone()), requests).await;
    assert_eq!(order, ["/1", "/2"], "first come, first served");
}

#[tokio::test]
async fn priority_and_tenant_extensions_set_by_an_earlier_layer_are_honoured() {
    let gate = gate(1, 10);
    // A middleware in front decides from the path, as a router might.
    let qos = tower::util::MapRequestLayer::new(|mut req: Request<()>| {
        let path = req.uri().path().to_owned();
        let extensions = req.extensions_mut();
        match path.as_str() {
            "/batch" => {
                extensions.insert(Priority(-1));
                extensions.insert(Tenant::new("batch"));
            }
            "/chat" => {
                extensions.insert(Priority(3));
            }
            _ => {}
        }
        req
    });
    let admission = AdmissionLayer::new(gate.clone());
    let layer = tower::layer::layer_fn(move |inner| qos.layer(admission.layer(inner)));
    let requests = ["/batch", "/plain", "/chat"].map(request).into();
    let (order, _) = served(&gate, layer, requests).await;
    assert_eq!(order, ["/chat", "/plain", "/batch"]);
}

#[tokio::test]
async fn a_describer_decides_priority_and_tenant_from_the_path() {
    let gate = gate(1, 10);
    let layer = AdmissionLayer::new(gate.clone()).describe(
        |req: &Request<()>, descriptor: &mut Descriptor| match req.uri().path() {
            "/batch" => {
                descriptor.priority = -1;
                descriptor.tenant = Some(Tenant::new("batch"));
            }
            "/chat" => descriptor.priority = 3,
            _ => {}
        },
    );
    let requests = ["/batch", "/plain", "/chat"].map(request).into();
    let (order, _) = served(&gate, layer, requests).await;
    assert_eq!(order, ["/chat", "/plain", "/batch"]);
}

#[tokio::test]
async fn qos_headers_of_names_of_your_own_order_the_queue_too() {
    let gate = gate(1, 10);
    let layer = AdmissionLayer::new(gate.clone())
        .qos_headers(QosHeaders::default().priority_header("x-prio"));
    let requests = [("/low", "-2"), ("/plain", ""), ("/high", "2")]
        .into_iter()
        .map(|(path, priority)| with_headers(path, &[("x-prio", priority)]))
        .collect();
    let (order, _) = served(&gate, layer, requests).await;
    assert_eq!(order, ["/high", "/plain", "/low"]);
}

#[tokio::test]
async fn the_inner_service_sees_the_priority_and_tenant_it_was_admitted_with() {
    let gate = gate(1, 0);
    let (inner, mut handle) = mock::pair::<Request<()>, Response<Body>>();
    let mut service = mock::Spawn::new(
        AdmissionLayer::new(gate.clone())
            .qos_headers(QosHeaders::default())
            .layer(inner),
    );
    handle.allow(1);
    let req = with_headers(
        "/",
        &[
            ("x-admission-priority", "-3"),
            ("x-admission-tenant", "acme"),
        ],
    );
    let _admitted = call(&mut service, req);
    let (req, _respond) = next_request(&mut handle);
    assert_eq!(req.extensions().get::<Priority>(), Some(&Priority(-3)));
    assert_eq!(req.extensions().get::<Tenant>(), Some(&Tenant::new("acme")));
}

#[tokio::test]
async fn a_displaced_request_is_answered_at_once_with_reason_displaced() {
    let gate = gate(1, 1);
    let (inner, mut handle) = mock::pair::<Request<()>, Response<Body>>();
    let mut service = mock::Spawn::new(
        AdmissionLayer::new(gate.clone())
            .qos_headers(QosHeaders::default())
            .layer(inner),
    );
    handle.allow(10);
    let _running = call(&mut service, request("/running"));
    let mut low = call(&mut service, request("/low"));
    assert_pending!(low.poll());
    let mut high = call(
        &mut service,
        with_headers("/high", &[("x-admission-priority", "1")]),
    );
    assert!(low.is_woken(), "the displaced request hears at once");
    let response = assert_ready_ok!(low.poll());
    assert_eq!(response.status().as_u16(), 529);
    assert_eq!(
        header(response.headers(), "x-admission-rejection-reason"),
        Some("displaced")
    );
    assert_eq!(
        header(response.headers(), "x-admission-rejection-scope"),
        Some("worker")
    );
    let error = &body_json(response.into_body()).await["error"];
    assert_eq!(error["reason"], "displaced");
    assert_eq!(error["type"], "overloaded");
    assert_pending!(high.poll());
    assert_eq!(
        gate.snapshot().total,
        counts(1, 1, 1),
        "the arrival waits in its place"
    );
    assert_eq!(gate.snapshot().tally.displaced(), 1);
}
