//! Hostile bodies through the real layer: inner services whose bodies fail
//! at once, carry nothing but trailers, or trickle a million tiny frames,
//! through the service and over a real socket. The capacity is given back
//! as documented and the gate ends empty.

#![cfg(feature = "http")]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body as AxumBody;
use axum::routing::post;
use bytes::Bytes;
use futures::stream;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::net::TcpListener;
use tokio::time::timeout;
use tower::{BoxError, Layer, Service, ServiceExt, service_fn};
use tower_admission::detect::OpenAiSse;
use tower_admission::{AdmissionLayer, Descriptor, Gate};

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::{admitted_with, assert_idle, counts};

#[path = "support/hostile_http.rs"]
mod hostile_http;
use hostile_http::PATIENCE;

// ---- hostile bodies through the layer ----

type BoxBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// One request at a time, `queue` more waiting.
fn one_at_a_time(queue: usize) -> Gate {
    gate_support::gate(1, 1, queue)
}

/// A body that fails on its first poll.
struct FailsAtOnce;

impl Body for FailsAtOnce {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(Some(Err("the engine failed before any token".into())))
    }
}

/// The response body of a service that answers every request with `body()`.
async fn answer_with<B>(gate: &Gate, body: fn() -> B) -> tower_admission::http::ResponseBody<B>
where
    B: Body<Data = Bytes> + Send + 'static,
{
    let mut service = AdmissionLayer::new(gate.clone()).layer(service_fn(move |_: Request<()>| {
        std::future::ready(Ok::<_, Infallible>(Response::new(body())))
    }));
    service.ready().await.unwrap();
    service.call(Request::new(())).await.unwrap().into_body()
}

#[tokio::test]
async fn a_body_that_fails_on_its_first_poll_releases_the_capacity_at_once() {
    let gate = one_at_a_time(0);
    let mut body = answer_with(&gate, || FailsAtOnce).await;
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    let frame = body.frame().await.expect("an error frame");
    assert!(frame.is_err());
    // Released when the error surfaced, before the body is dropped.
    assert_idle(&gate.snapshot());
    drop(body);
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.tally.admitted_direct, 1);
    assert_idle(&snapshot);
}

#[tokio::test]
async fn a_body_of_trailers_only_ends_the_response_without_a_token() {
    fn trailers_only() -> BoxBody {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("13"));
        http_body_util::StreamBody::new(stream::iter([Ok::<_, BoxError>(Frame::trailers(
            trailers,
        ))]))
        .boxed_unsync()
    }
    let gate = one_at_a_time(0);
    let mut body = answer_with(&gate, trailers_only).await;
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.trailers_ref().unwrap()["grpc-status"], "13");
    assert_idle(&gate.snapshot());
    assert!(body.frame().await.is_none());
}

#[tokio::test]
async fn an_inner_error_of_a_queued_request_releases_what_it_was_given() {
    let gate = one_at_a_time(1);
    let mut service = AdmissionLayer::new(gate.clone()).layer(service_fn(|_: Request<()>| {
        std::future::ready(Err::<Response<BoxBody>, BoxError>("engine refused".into()))
    }));
    let holder = gate.acquire(None).await.unwrap();
    service.ready().await.unwrap();
    let queued = service.call(Request::new(()));
    assert_eq!(gate.snapshot().total, counts(1, 1, 1));
    drop(holder);
    let error = queued.await.expect_err("the inner service failed");
    assert_eq!(error.to_string(), "engine refused");
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.tally.admitted_queue, 1);
    assert_idle(&snapshot);
    admitted_with(&gate, Descriptor::new());
}

/// `bytes` one byte per frame, each first preceded by `empty` empty frames.
struct Trickle {
    bytes: Bytes,
    empty: usize,
    sent: usize,
}

impl Body for Trickle {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if this.empty > 0 {
            this.empty -= 1;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::new()))));
        }
        if this.sent == this.bytes.len() {
            return Poll::Ready(None);
        }
        this.sent += 1;
        Poll::Ready(Some(Ok(Frame::data(
            this.bytes.slice(this.sent - 1..this.sent),
        ))))
    }
}

const ROLE_EVENT: &[u8] =
    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
const TOKEN_EVENT: &[u8] =
    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";

#[tokio::test]
async fn a_million_one_byte_frames_end_waiting_on_the_right_byte_and_release_at_the_end() {
    const FRAMES: usize = 1_000_000;
    // Interim events, the first token at a known offset, then filler.
    let mut stream = ROLE_EVENT.repeat(1000);
    let first_token_ends = stream.len() + TOKEN_EVENT.len();
    while stream.len() < FRAMES {
        stream.extend_from_slice(TOKEN_EVENT);
    }
    let stream = Bytes::from(stream);
    let len = stream.len();

    let gate = one_at_a_time(0);
    let mut service = AdmissionLayer::new(gate.clone())
        .detector(OpenAiSse::default())
        .layer(service_fn(move |_: Request<()>| {
            let mut response = Response::new(Trickle {
                bytes: stream.clone(),
                empty: 0,
                sent: 0,
            });
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            std::future::ready(Ok::<_, Infallible>(response))
        }));
    service.ready().await.unwrap();
    let mut body = service.call(Request::new(())).await.unwrap().into_body();

    let mut read = 0;
    while let Some(frame) = body.frame().await {
        read += frame.unwrap().into_data().unwrap().len();
        // Waiting ends on the token event's last byte; the request, when
        // the body says it has ended.
        let expected = if read < first_token_ends {
            counts(1, 1, 0)
        } else {
            counts(1, 0, 0)
        };
        assert_eq!(gate.snapshot().total, expected, "after {read} bytes");
    }
    assert_eq!(read, len);
    assert_idle(&gate.snapshot());
}

#[tokio::test]
async fn a_million_empty_frames_keep_waiting_until_the_first_byte() {
    const EMPTY: usize = 1_000_000;
    let gate = one_at_a_time(0);
    let mut body = answer_with(&gate, || Trickle {
        bytes: Bytes::from_static(b"tok"),
        empty: EMPTY,
        sent: 0,
    })
    .await;
    for _ in 0..EMPTY {
        let frame = body.frame().await.unwrap().unwrap();
        assert!(frame.data_ref().unwrap().is_empty());
    }
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    body.frame().await.unwrap().unwrap();
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));
    while body.frame().await.is_some() {}
    assert_idle(&gate.snapshot());
}

// ---- hostile bodies over a real socket ----

/// A worker of one request at a time (eight may queue): `/fails` answers a
/// body that fails on its first poll, `/trickle` 20,000 one-byte frames,
/// `/trailers` a chunk and trailers, `/ok` a short answer.
async fn body_server(gate: &Gate) -> SocketAddr {
    const TRICKLE: usize = 20_000;
    let app = Router::new()
        .route(
            "/fails",
            post(|| async {
                AxumBody::from_stream(stream::iter([Err::<Bytes, BoxError>(
                    "the engine failed before any token".into(),
                )]))
            }),
        )
        .route(
            "/trickle",
            post(|| async {
                AxumBody::from_stream(stream::iter(
                    (0..TRICKLE).map(|_| Ok::<_, Infallible>(Bytes::from_static(b"x"))),
                ))
            }),
        )
        .route(
            "/trailers",
            post(|| async {
                let mut trailers = HeaderMap::new();
                trailers.insert("x-finish", HeaderValue::from_static("stop"));
                AxumBody::new(http_body_util::StreamBody::new(stream::iter([
                    Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"tok"))),
                    Ok(Frame::trailers(trailers)),
                ])))
            }),
        )
        .route("/ok", post(|| async { "done" }))
        .layer(AdmissionLayer::new(gate.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn post_to(client: &reqwest::Client, addr: SocketAddr, path: &str) -> reqwest::Result<Bytes> {
    let request = async {
        client
            .post(format!("http://{addr}{path}"))
            .send()
            .await?
            .bytes()
            .await
    };
    timeout(PATIENCE, request)
        .await
        .unwrap_or_else(|_| panic!("{path} hangs"))
}

#[tokio::test]
async fn hostile_bodies_over_a_real_socket_give_their_capacity_back() {
    let gate = one_at_a_time(8);
    let addr = body_server(&gate).await;
    let client = reqwest::Client::new();

    // The failed body cuts the connection; the next request is admitted
    // only if its capacity came back (it would wait in the queue for ever).
    assert!(post_to(&client, addr, "/fails").await.is_err());
    assert_eq!(post_to(&client, addr, "/ok").await.unwrap(), "done");

    let trickled = post_to(&client, addr, "/trickle").await.unwrap();
    assert_eq!(trickled.len(), 20_000);
    assert!(trickled.iter().all(|&byte| byte == b'x'));

    assert_eq!(post_to(&client, addr, "/trailers").await.unwrap(), "tok");
    assert_eq!(post_to(&client, addr, "/ok").await.unwrap(), "done");

    let snapshot = gate.snapshot();
    assert_eq!(snapshot.tally.received, 5);
    assert_eq!(snapshot.tally.rejected(), 0);
    assert_idle(&snapshot);
}
