//! The admission layer against a mock inner service, step by step: what
//! reaches the inner service, in which order, what a rejected request
//! receives, and when each piece of engine capacity comes back.
#![cfg(feature = "http")]

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
use tower_admission::http::{
    Admission, BypassPaths, FirstToken, Priority, Qos, QosHeaders, QosLayer, ResponseBody,
};
use tower_admission::{
    AdmissionConfig, AdmissionLayer, AdmitSource, Admitted, Counts, DataParallelRank,
    EngineCapacity, Gate, RankExtension, RankHeader, Tenant,
};
use tower_test::mock;

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::counts;

type Body = UnsyncBoxBody<Bytes, BoxError>;
type Frames = mpsc::UnboundedSender<Result<Frame<Bytes>, BoxError>>;

/// A response body whose frames the test sends one by one; closing the
/// sender ends it.
fn streaming_body() -> (Frames, Body) {
    let (frames, rx) = mpsc::unbounded_channel();
    (
        frames,
        StreamBody::new(UnboundedReceiverStream::new(rx)).boxed_unsync(),
    )
}

fn empty_body() -> Body {
    Empty::new()
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

fn data(bytes: &'static str) -> Result<Frame<Bytes>, BoxError> {
    Ok(Frame::data(Bytes::from_static(bytes.as_bytes())))
}

/// One rank: `engine` requests at once, all of them may wait, `queue` more queued.
fn gate(engine: usize, queue: usize) -> Gate {
    gate_support::gate(engine, engine, queue)
}

fn request(path: &str) -> Request<()> {
    Request::builder().uri(path).body(()).unwrap()
}

type Service = mock::Spawn<Admission<mock::Mock<Request<()>, Response<Body>>>>;
type Handle = mock::Handle<Request<()>, Response<Body>>;
type Respond = mock::SendResponse<Response<Body>>;

fn service(gate: &Gate) -> (Service, Handle) {
    let (inner, handle) = mock::pair();
    (
        mock::Spawn::new(AdmissionLayer::new(gate.clone()).layer(inner)),
        handle,
    )
}

/// A called request's response future, polled once as soon as it was made,
/// the way a server polls it: an admitted request reaches the inner service
/// on that first poll.
struct Call<F: std::future::Future> {
    task: task::Spawn<F>,
    /// What the first poll returned, if it was ready.
    early: Option<F::Output>,
}

impl<F: std::future::Future> Call<F> {
    fn poll(&mut self) -> Poll<F::Output> {
        match self.early.take() {
            Some(output) => Poll::Ready(output),
            None => self.task.poll(),
        }
    }

    fn is_woken(&self) -> bool {
        self.task.is_woken()
    }
}

/// Calls `service` with `req` after driving it to readiness, and polls the
/// response future once.
fn call<S, B>(service: &mut mock::Spawn<S>, req: Request<B>) -> Call<S::Future>
where
    S: tower::Service<Request<B>>,
    S::Error: std::fmt::Debug,
{
    assert_ready_ok!(service.poll_ready());
    let mut task = task::spawn(service.call(req));
    let early = match task.poll() {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    };
    Call { task, early }
}

/// The next request the inner service received, with the means to answer it.
fn next_request(handle: &mut Handle) -> (Request<()>, Respond) {
    match handle.poll_request() {
        Poll::Ready(Some(request)) => request,
        _ => panic!("the inner service received no request"),
    }
}

fn no_request(handle: &mut Handle) {
    assert!(
        handle.poll_request().is_pending(),
        "the inner service received a request"
    );
}

type Polled = Poll<Option<Result<Frame<Bytes>, BoxError>>>;

/// Polls the next frame of `body`.
fn poll_frame<D: FirstTokenDetector + Unpin>(body: &mut ResponseBody<Body, D>) -> Polled {
    task::spawn(()).enter(|cx, _| Pin::new(&mut *body).poll_frame(cx))
}

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

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|value| value.to_str().unwrap())
}

async fn body_json(body: ResponseBody<Body>) -> serde_json::Value {
    let bytes = body.collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
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

fn ranked_gate() -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .engine_request_waiting_limit(1)
            .request_queue_limit(0)
            .capacity(EngineCapacity::new(1, 2)),
    )
}

fn ranked(path: &str, rank: &str) -> Request<()> {
    Request::builder()
        .uri(path)
        .header("x-data-parallel-rank", rank)
        .body(())
        .unwrap()
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
    let mut service = mock::Spawn::new(
        AdmissionLayer::new(gate.clone())
            .rank(RankExtension)
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

/// An admitted request whose inner service answered with a body the test
/// controls.
async fn streaming_response(gate: &Gate) -> (Frames, ResponseBody<Body>) {
    let (mut service, mut handle) = service(gate);
    handle.allow(1);
    let mut future = call(&mut service, request("/"));
    let (_, respond) = next_request(&mut handle);
    let (frames, body) = streaming_body();
    respond.send_response(Response::new(body));
    (frames, assert_ready_ok!(future.poll()).into_body())
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

/// Answers with a body of a fixed kind, to see how its end is recognised.
async fn respond_with(gate: &Gate, body: Body) -> ResponseBody<Body> {
    let (mut service, mut handle) = service(gate);
    handle.allow(1);
    let mut future = call(&mut service, request("/"));
    let (_, respond) = next_request(&mut handle);
    respond.send_response(Response::new(body));
    assert_ready_ok!(future.poll()).into_body()
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

/// A request to `service` answered by an SSE body the test controls.
async fn sse_response<S>(
    service: &mut mock::Spawn<S>,
    handle: &mut Handle,
) -> (Frames, S::Response, FirstToken)
where
    S: tower::Service<Request<()>>,
    S::Error: std::fmt::Debug,
{
    let mut future = call(service, request("/v1/chat/completions"));
    let (req, respond) = next_request(handle);
    let first_token = req.extensions().get::<FirstToken>().unwrap().clone();
    let (frames, body) = streaming_body();
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    respond.send_response(response);
    (frames, assert_ready_ok!(future.poll()), first_token)
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

// ---- quality of service: priority and tenant (SPEC §8) ----

fn with_headers(path: &str, headers: &[(&str, &str)]) -> Request<()> {
    let mut req = request(path);
    for (name, value) in headers {
        req.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_str(value).unwrap(),
        );
    }
    req
}

/// Calls `layer` around an inner service that records the path of each
/// request it receives (and answers it with an empty body), with one
/// request already running: each request is decided (queued) as it is
/// called, in order. The running request then ends, and the queue drains
/// one request at a time. Returns the paths in the order they reached the
/// inner service, and each request's status.
async fn served<L>(gate: &Gate, layer: L, requests: Vec<Request<()>>) -> (Vec<String>, Vec<u16>)
where
    L: Layer<tower::util::BoxCloneService<Request<()>, Response<Body>, Infallible>>,
    L::Service:
        tower::Service<Request<()>, Response = Response<ResponseBody<Body>>, Error = Infallible>,
{
    use futures::FutureExt as _;
    use tower::Service as _;
    let reached = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = reached.clone();
    let inner = tower::util::BoxCloneService::new(tower::service_fn(move |req: Request<()>| {
        record.lock().unwrap().push(req.uri().path().to_owned());
        std::future::ready(Ok::<_, Infallible>(Response::new(empty_body())))
    }));
    let mut service = layer.layer(inner);
    let running = gate.acquire(None).now_or_never().unwrap().unwrap();
    let mut answers = Vec::new();
    for req in requests {
        tower::ServiceExt::ready(&mut service).await.unwrap();
        let response = service.call(req);
        answers.push(async move {
            let response = response.await.unwrap();
            let status = response.status().as_u16();
            let _ = response.into_body().collect().await.unwrap();
            status
        });
    }
    drop(running);
    let statuses = futures::future::join_all(answers).await;
    let reached = reached.lock().unwrap().clone();
    (reached, statuses)
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
    // A closure decides from the path, as a router might.
    let qos = QosLayer::new(|req: &Request<()>| match req.uri().path() {
        "/batch" => Qos::new()
            .with_priority(-1)
            .with_tenant(Tenant::new("batch")),
        "/chat" => Qos::new().with_priority(3),
        _ => Qos::new(),
    });
    let admission = AdmissionLayer::new(gate.clone());
    let layer = tower::layer::layer_fn(move |inner| qos.layer(admission.layer(inner)));
    let requests = ["/batch", "/plain", "/chat"].map(request).into();
    let (order, _) = served(&gate, layer, requests).await;
    assert_eq!(order, ["/chat", "/plain", "/batch"]);
}

#[tokio::test]
async fn a_qos_layer_of_headers_in_front_of_admission_orders_the_queue_too() {
    let gate = gate(1, 10);
    let qos = QosLayer::new(QosHeaders::default().priority_header("x-prio"));
    let admission = AdmissionLayer::new(gate.clone());
    let layer = tower::layer::layer_fn(move |inner| qos.layer(admission.layer(inner)));
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
