//! The admission layer against a mock inner service, step by step: what
//! reaches the inner service, in which order, what a rejected request
//! receives, and when each piece of engine capacity comes back.
#![cfg(feature = "http")]
#![allow(dead_code)] // each of the two files uses part of support/layer_rig.rs

use std::convert::Infallible;
use std::pin::Pin;
use std::task::Poll;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body as _, Frame};
use http_body_util::{BodyExt, Empty, Full, StreamBody, combinators::UnsyncBoxBody};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_test::{assert_pending, assert_ready, assert_ready_err, assert_ready_ok, task};
use tower::{BoxError, Layer};
use tower_admission::FirstTokenDetector;
use tower_admission::detect::OpenAiSse;
use tower_admission::http::{Admission, FirstToken, ResponseBody};
use tower_admission::{
    AdmissionConfig, AdmissionLayer, Counts, Descriptor, EngineCapacity, Gate, RankHeader,
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
async fn admission_is_always_ready_and_an_admitted_request_waits_for_the_inner_service() {
    let gate = gate(1, 1);
    let (mut service, mut handle) = service(&gate);

    // The inner service is not ready: admission still is, and decides.
    handle.allow(0);
    assert_ready_ok!(service.poll_ready());
    assert_eq!(gate.snapshot().tally.received, 0);
    let mut admitted = call(&mut service, request("/1"));
    let mut queued = call(&mut service, request("/2"));
    let mut rejected = call(&mut service, request("/3"));
    assert_eq!(gate.snapshot().total, counts(1, 1, 1));
    let response = assert_ready_ok!(rejected.poll());
    assert_eq!(response.status().as_u16(), 529);
    no_request(&mut handle);

    // Only the admitted request waits for the inner service, counted as
    // admitted while it does.
    handle.allow(1);
    assert!(admitted.is_woken());
    assert_pending!(admitted.poll());
    let (req, _respond) = next_request(&mut handle);
    assert_eq!(req.uri(), "/1");
    assert_pending!(queued.poll());
    no_request(&mut handle);
}

#[tokio::test]
async fn readiness_errors_come_out_of_the_response_future_and_release_the_permit() {
    let gate = gate(1, 0);
    let (mut service, mut handle) = service(&gate);
    handle.allow(0);
    let mut future = call(&mut service, request("/"));
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    handle.send_error("inner service is gone");
    let err = assert_ready_err!(future.poll());
    assert_eq!(err.to_string(), "inner service is gone");
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[tokio::test]
async fn queued_requests_reach_the_inner_service_in_call_order() {
    let gate = gate(1, 3);
    let (mut service, mut handle) = service(&gate);
    handle.allow(10);

    let mut first = call(&mut service, request("/1"));
    let mut second = call(&mut service, request("/2"));
    let mut third = call(&mut service, request("/3"));
    assert_eq!(gate.snapshot().total, counts(1, 1, 2));

    let (req, respond) = next_request(&mut handle);
    assert_eq!(req.uri(), "/1");
    no_request(&mut handle);
    assert_pending!(second.poll());
    assert_pending!(third.poll());

    let (frames, body) = streaming_body();
    respond.send_response(Response::new(body));
    let response = assert_ready_ok!(first.poll());
    // The first request ends; its capacity passes to the oldest waiter at
    // once, before a newcomer can take it.
    drop(frames);
    let mut body = response.into_body();
    assert!(matches!(poll_frame(&mut body), Poll::Ready(None)));
    assert!(second.is_woken());
    assert!(!third.is_woken());
    let mut fourth = call(&mut service, request("/4"));
    assert_eq!(gate.snapshot().total, counts(1, 1, 2));

    assert_pending!(second.poll());
    let (req, respond) = next_request(&mut handle);
    assert_eq!(req.uri(), "/2");
    no_request(&mut handle);
    respond.send_response(Response::new(empty_body()));
    let _ = assert_ready_ok!(second.poll());

    assert!(third.is_woken());
    assert_pending!(third.poll());
    assert_pending!(fourth.poll());
    let (req, _respond) = next_request(&mut handle);
    assert_eq!(req.uri(), "/3");
    no_request(&mut handle);
}

#[tokio::test]
async fn a_full_worker_answers_529_with_worker_scope() {
    let gate = gate(1, 0);
    let (mut service, mut handle) = service(&gate);
    handle.allow(2);

    let _admitted = call(&mut service, request("/1"));
    let mut rejected = call(&mut service, request("/2"));
    let response = assert_ready_ok!(rejected.poll());

    // The inner service saw only the admitted request.
    let (req, _) = next_request(&mut handle);
    assert_eq!(req.uri(), "/1");
    no_request(&mut handle);

    assert_eq!(response.status().as_u16(), 529);
    let headers = response.headers();
    assert_eq!(header(headers, "content-type"), Some("application/json"));
    assert_eq!(
        header(headers, "x-admission-rejection-scope"),
        Some("worker")
    );
    assert_eq!(header(headers, "x-admission-rank"), None);
    assert_eq!(
        header(headers, "x-admission-rejection-reason"),
        Some("queue_full")
    );
    assert_eq!(header(headers, "retry-after"), Some("1"));
    // With feature `hyper`, HTTP/1 clients read "529 Site is overloaded".
    let reason = response.extensions().get::<hyper::ext::ReasonPhrase>();
    if cfg!(feature = "hyper") {
        assert_eq!(reason.unwrap().as_bytes(), b"Site is overloaded");
    } else {
        assert!(reason.is_none());
    }
    let size = response.body().size_hint().exact();
    let json = body_json(response.into_body()).await;
    assert_eq!(
        size,
        Some(serde_json::to_vec(&json).unwrap().len() as u64),
        "the body is exactly as long as announced"
    );
    assert_eq!(json["error"]["type"], "overloaded");
    assert_eq!(json["error"]["code"], 529);
    assert_eq!(json["error"]["scope"], "worker");
    assert_eq!(json["error"]["rank"], serde_json::Value::Null);
    // The OpenAI error object, `param` included, with scope, rank and
    // reason as extra members and nothing else.
    let members: Vec<&str> = json["error"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut sorted = members.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [
            "code", "message", "param", "rank", "reason", "scope", "type"
        ]
    );
    assert_eq!(json["error"]["reason"], "queue_full");
    assert!(json["error"]["param"].is_null());
    assert_eq!(json.as_object().unwrap().len(), 1, "{json}");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("overloaded")
    );

    let tally = gate.snapshot().tally;
    assert_eq!((tally.received, tally.rejected_worker), (2, 1));
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
}

#[tokio::test]
async fn a_full_rank_answers_with_rank_scope_while_the_worker_has_room() {
    let gate = ranked_gate();
    let (inner, mut handle) = mock::pair::<Request<()>, Response<Body>>();
    let mut service = mock::Spawn::new(
        AdmissionLayer::new(gate.clone())
            .rank(RankHeader::default())
            .overload_status(StatusCode::SERVICE_UNAVAILABLE)
            .layer(inner),
    );
    handle.allow(3);

    let _admitted = call(&mut service, ranked("/a", "1"));
    assert_eq!(gate.snapshot().ranks[1], counts(1, 1, 0));

    let mut rejected = call(&mut service, ranked("/b", "1"));
    let response = assert_ready_ok!(rejected.poll());
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let headers = response.headers();
    assert_eq!(header(headers, "x-admission-rejection-scope"), Some("rank"));
    assert_eq!(header(headers, "x-admission-rank"), Some("1"));
    assert_eq!(
        header(headers, "retry-after"),
        None,
        "rank 0 still has room"
    );
    assert!(
        response
            .extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .is_none(),
        "503 keeps its canonical reason"
    );
    let json = body_json(response.into_body()).await;
    assert_eq!(json["error"]["code"], 503);
    assert_eq!(json["error"]["scope"], "rank");
    assert_eq!(json["error"]["rank"], 1);

    // Rank 0 is unaffected by rank 1 being full.
    let mut other = call(&mut service, ranked("/c", "0"));
    assert_pending!(other.poll());
    assert_eq!(gate.snapshot().ranks[0], counts(1, 1, 0));
}

#[tokio::test]
async fn hostile_rank_headers_make_requests_unranked() {
    let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(4, 2)));
    let (inner, mut handle) = mock::pair::<Request<()>, Response<Body>>();
    let mut service = mock::Spawn::new(
        AdmissionLayer::new(gate.clone())
            .rank(RankHeader::default())
            .layer(inner),
    );
    handle.allow(10);

    let mut futures = Vec::new();
    for value in ["-1", "4294967296", "1e3", "٣", "2", " 1", ""] {
        futures.push(call(&mut service, ranked("/", value)));
    }
    let mut repeated = Request::new(());
    repeated
        .headers_mut()
        .append("x-data-parallel-rank", "0".parse().unwrap());
    repeated
        .headers_mut()
        .append("x-data-parallel-rank", "0".parse().unwrap());
    futures.push(call(&mut service, repeated));

    // "2" names a rank the engine does not have: unranked too.
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.unranked.engine_requests, 8);
    assert_eq!(snapshot.ranks, vec![Counts::default(); 2]);
}

#[tokio::test]
async fn ranks_can_come_from_a_request_extension() {
    let gate = ranked_gate();
    let (inner, mut handle) = mock::pair::<Request<()>, Response<Body>>();
    let from_extension = |req: &Request<()>, descriptor: &mut Descriptor| {
        descriptor.rank = req
            .extensions()
            .get::<DataParallelRank>()
            .map(|rank| rank.0);
    };
    let mut service = mock::Spawn::new(
        AdmissionLayer::new(gate.clone())
            .rank(from_extension)
            .layer(inner),
    );
    handle.allow(1);
    let mut req = request("/");
    req.extensions_mut().insert(DataParallelRank(0));
    let _admitted = call(&mut service, req);
    assert_eq!(gate.snapshot().ranks[0], counts(1, 1, 0));
}

#[tokio::test]
async fn grpc_requests_get_a_trailers_only_unavailable() {
    let gate = gate(1, 0);
    let (mut service, mut handle) = service(&gate);
    handle.allow(2);

    let _admitted = call(&mut service, request("/"));
    let grpc = Request::builder()
        .uri("/llm.Generate/Stream")
        .header("content-type", "application/grpc+proto")
        .body(())
        .unwrap();
    let mut rejected = call(&mut service, grpc);
    let response = assert_ready_ok!(rejected.poll());

    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers();
    assert_eq!(header(headers, "content-type"), Some("application/grpc"));
    assert_eq!(header(headers, "grpc-status"), Some("14"));
    let message = header(headers, "grpc-message").unwrap();
    assert!(message.contains("overloaded"), "{message}");
    assert!(message.bytes().all(|b| (0x20..0x7f).contains(&b)));
    assert_eq!(header(headers, "grpc-retry-pushback-ms"), Some("1000"));
    assert_eq!(
        header(headers, "x-admission-rejection-scope"),
        Some("worker")
    );
    assert_eq!(header(headers, "retry-after"), None);

    // Trailers-only: the body is empty and already at its end, so the
    // status travels in the one HEADERS frame.
    let mut body = response.into_body();
    assert!(body.is_end_stream());
    assert!(matches!(poll_frame(&mut body), Poll::Ready(None)));
}

#[tokio::test]
async fn the_grpc_overload_code_is_configurable() {
    let gate = ranked_gate();
    let (inner, mut handle) = mock::pair::<Request<()>, Response<Body>>();
    let mut service = mock::Spawn::new(
        AdmissionLayer::new(gate.clone())
            .rank(RankHeader::default())
            .grpc_overload_code(8)
            .layer(inner),
    );
    handle.allow(2);
    let _admitted = call(&mut service, ranked("/", "0"));
    let mut grpc = ranked("/", "0");
    grpc.headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    let response = assert_ready_ok!(call(&mut service, grpc).poll());
    let headers = response.headers();
    assert_eq!(header(headers, "grpc-status"), Some("8"));
    assert_eq!(header(headers, "x-admission-rank"), Some("0"));
    assert_eq!(header(headers, "grpc-retry-pushback-ms"), None);
}

#[test]
#[should_panic(expected = "gRPC error code")]
fn grpc_ok_is_not_an_overload_code() {
    let _ = AdmissionLayer::new(gate(1, 0)).grpc_overload_code(0);
}

#[test]
#[should_panic(expected = "4xx or 5xx")]
fn success_is_not_an_overload_status() {
    let _ = AdmissionLayer::new(gate(1, 0)).overload_status(StatusCode::OK);
}

#[tokio::test]
async fn an_inner_error_releases_everything() {
    let gate = gate(1, 0);
    let (mut service, mut handle) = service(&gate);
    handle.allow(1);

    let mut future = call(&mut service, request("/"));
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    let (_, respond) = next_request(&mut handle);
    respond.send_error("engine crashed");
    let err = assert_ready_err!(future.poll());
    assert_eq!(err.to_string(), "engine crashed");
    // Released as the error surfaced, not when the future is dropped.
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
    drop(future);
    assert_eq!(gate.snapshot().tally.admitted_direct, 1);
}

#[tokio::test]
async fn dropping_the_response_future_releases_or_cancels() {
    let gate = gate(1, 1);
    let (mut service, mut handle) = service(&gate);
    handle.allow(2);

    let admitted = call(&mut service, request("/1"));
    let queued = call(&mut service, request("/2"));
    assert_eq!(gate.snapshot().total, counts(1, 1, 1));

    drop(queued);
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    assert_eq!(gate.snapshot().tally.cancelled, 1);

    drop(admitted);
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[tokio::test]
async fn a_body_dropped_before_its_first_token_releases_everything() {
    let gate = gate(1, 0);
    let (_frames, body) = streaming_response(&gate).await;
    // Headers are not a token.
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    drop(body);
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[tokio::test]
async fn the_first_token_ends_waiting_and_the_drop_ends_the_request() {
    let gate = gate(1, 0);
    let (frames, mut body) = streaming_response(&gate).await;

    frames.send(data("")).unwrap();
    assert_ready!(poll_frame(&mut body));
    assert_eq!(
        gate.snapshot().total,
        counts(1, 1, 0),
        "an empty frame is not a token"
    );

    frames.send(data("Hello")).unwrap();
    let frame = assert_ready!(poll_frame(&mut body)).unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "Hello");
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));

    frames.send(data(" world")).unwrap();
    assert_ready!(poll_frame(&mut body));
    assert_pending!(poll_frame(&mut body));
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));

    // The client went away mid-stream.
    drop(body);
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
    let tally = gate.snapshot().tally;
    assert_eq!((tally.received, tally.admitted_direct), (1, 1));
}

#[tokio::test]
async fn a_response_can_complete_without_a_token() {
    let gate = gate(1, 0);
    let (frames, mut body) = streaming_response(&gate).await;
    drop(frames);
    assert!(matches!(poll_frame(&mut body), Poll::Ready(None)));
    // Released at the end of the stream, while the body is still alive.
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[tokio::test]
async fn trailers_and_errors_end_the_response() {
    let gate = gate(1, 0);
    let (frames, mut body) = streaming_response(&gate).await;
    frames.send(data("token")).unwrap();
    assert_ready!(poll_frame(&mut body));
    frames.send(Ok(Frame::trailers(HeaderMap::new()))).unwrap();
    assert!(
        assert_ready!(poll_frame(&mut body))
            .unwrap()
            .unwrap()
            .is_trailers()
    );
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
    drop(body);

    let (frames, mut body) = streaming_response(&gate).await;
    frames.send(Err("engine fell over".into())).unwrap();
    assert!(assert_ready!(poll_frame(&mut body)).unwrap().is_err());
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
    drop(body);
    assert_eq!(gate.snapshot().tally.admitted_direct, 2);
}

#[tokio::test]
async fn a_body_that_is_already_at_its_end_releases_at_once() {
    let gate = gate(1, 0);
    let body = respond_with(&gate, empty_body()).await;
    assert!(body.is_end_stream());
    assert_eq!(body.size_hint().exact(), Some(0));
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[tokio::test]
async fn a_body_that_ends_with_its_last_data_frame_releases_then() {
    let gate = gate(1, 0);
    let full = Full::new(Bytes::from_static(b"{\"choices\":[]}"))
        .map_err(|never: Infallible| match never {})
        .boxed_unsync();
    let mut body = respond_with(&gate, full).await;
    assert_eq!(
        body.size_hint().exact(),
        Some(14),
        "size hints pass through"
    );
    assert!(!body.is_end_stream());
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));

    assert_ready!(poll_frame(&mut body));
    assert!(body.is_end_stream());
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[tokio::test]
async fn a_role_only_sse_chunk_does_not_end_waiting() {
    let gate = gate(1, 0);
    let (inner, mut handle) = mock::pair::<Request<()>, Response<Body>>();
    let mut service = mock::Spawn::new(
        AdmissionLayer::new(gate.clone())
            .detector(OpenAiSse::default())
            .layer(inner),
    );
    handle.allow(1);
    let mut future = call(&mut service, request("/v1/chat/completions"));
    let (_, respond) = next_request(&mut handle);
    let (frames, body) = streaming_body();
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    respond.send_response(response);
    let mut body = assert_ready_ok!(future.poll()).into_body();

    for interim in [
        ": keep-alive\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"}}]}\n\n",
    ] {
        frames.send(data(interim)).unwrap();
        assert_ready!(poll_frame(&mut body));
        assert_eq!(gate.snapshot().total, counts(1, 1, 0), "{interim:?}");
    }

    // A token split across two frames ends waiting with the frame that
    // completes its event.
    frames
        .send(data(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n",
        ))
        .unwrap();
    assert_ready!(poll_frame(&mut body));
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    frames.send(data("\n")).unwrap();
    assert_ready!(poll_frame(&mut body));
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));

    drop(frames);
    assert!(matches!(poll_frame(&mut body), Poll::Ready(None)));
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}
