//! A panic anywhere on an admitted request's path — the inner service's
//! `call`, its response future, the response body's `poll_frame`, the
//! first-token detector — unwinds through whatever holds the request's
//! `Permit`, and the capacity comes back: the gate ends empty and admits
//! again. Each panic is caught the way a server catches it: by the task
//! that ran the request (a `JoinError`), or by `catch_unwind` around a
//! synchronous `call`.
#![cfg(feature = "http")]

use std::convert::Infallible;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;

use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty, Full};
use tokio::sync::oneshot;
use tokio::time::timeout;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_admission::{AdmissionLayer, Counts, Descriptor, FirstTokenDetector, Gate};

#[path = "support/panics.rs"]
mod panics_hook;
use panics_hook::quiet_injected_panics;

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::counts;

const PATIENCE: Duration = Duration::from_secs(10);

/// Panics raised on purpose say so; the hook keeps them off stderr.
const INJECTED: &str = "injected panic";

/// One request at a time, four more may queue.
fn gate() -> Gate {
    quiet_injected_panics(INJECTED);
    gate_support::gate(1, 1, 4)
}

/// The gate holds nothing, every request is accounted for, and a new
/// request is admitted on arrival.
fn assert_released_and_admitting(gate: &Gate) {
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.total, Counts::default(), "capacity still held");
    let tally = snapshot.tally;
    assert_eq!(
        tally.received,
        tally.admitted_direct + tally.admitted_queue + tally.rejected() + tally.cancelled
    );
    gate_support::admitted_with(gate, Descriptor::new());
}

async fn joined_with_panic<T: std::fmt::Debug>(task: tokio::task::JoinHandle<T>) {
    let joined = timeout(PATIENCE, task).await.expect("the task hangs");
    let error = joined.expect_err("the task should have panicked");
    assert!(error.is_panic(), "{error}");
}

fn request() -> Request<()> {
    Request::new(())
}

/// A body that yields `frames` data frames, then panics when polled again.
struct PanicsAfter {
    frames: usize,
}

impl Body for PanicsAfter {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.frames == 0 {
            panic!("{INJECTED} in poll_frame");
        }
        self.frames -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"token")))))
    }
}

#[tokio::test]
async fn a_panic_in_the_inner_call_releases_the_capacity() {
    let gate = gate();
    let mut service = AdmissionLayer::new(gate.clone()).layer(service_fn(
        |_: Request<()>| -> std::future::Ready<Result<Response<Empty<Bytes>>, Infallible>> {
            panic!("{INJECTED} in call")
        },
    ));
    service.ready().await.unwrap();
    // Admitted at once: the inner service is readied and called from the
    // response future, on the task that polls it.
    let task = tokio::spawn(service.call(request()));
    assert_eq!(gate.snapshot().tally.admitted_direct, 1);
    joined_with_panic(task).await;
    assert_released_and_admitting(&gate);
}

#[tokio::test]
async fn a_panic_in_the_inner_call_of_a_queued_request_releases_the_capacity() {
    let gate = gate();
    let mut service = AdmissionLayer::new(gate.clone()).layer(service_fn(
        |_: Request<()>| -> std::future::Ready<Result<Response<Empty<Bytes>>, Infallible>> {
            panic!("{INJECTED} in call")
        },
    ));
    let holder = gate.acquire(None).await.unwrap();
    service.ready().await.unwrap();
    // Queued: the inner service is called from the response future, once
    // admitted, on the task that polls it.
    let task = tokio::spawn(service.call(request()));
    assert_eq!(gate.snapshot().total, counts(1, 1, 1));
    drop(holder);
    joined_with_panic(task).await;
    assert_eq!(gate.snapshot().tally.admitted_queue, 1);
    assert_released_and_admitting(&gate);
}

#[tokio::test]
async fn a_panic_in_the_response_future_releases_the_capacity() {
    let gate = gate();
    let (go, panic_now) = oneshot::channel::<()>();
    let panic_now = std::sync::Arc::new(std::sync::Mutex::new(Some(panic_now)));
    let mut service = AdmissionLayer::new(gate.clone()).layer(service_fn(move |_: Request<()>| {
        let panic_now = panic_now.lock().unwrap().take().expect("one request");
        async move {
            let _ = panic_now.await;
            if true {
                panic!("{INJECTED} in the response future");
            }
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }
    }));
    service.ready().await.unwrap();
    let task = tokio::spawn(service.call(request()));
    // Admitted and answering: the capacity is held until the panic.
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    go.send(()).unwrap();
    joined_with_panic(task).await;
    assert_released_and_admitting(&gate);
}

#[tokio::test]
async fn a_panic_in_poll_frame_before_the_first_token_releases_the_capacity() {
    let gate = gate();
    let mut service = AdmissionLayer::new(gate.clone()).layer(service_fn(|_: Request<()>| {
        std::future::ready(Ok::<_, Infallible>(Response::new(PanicsAfter {
            frames: 0,
        })))
    }));
    service.ready().await.unwrap();
    let response = service.call(request()).await.unwrap();
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    let mut body = response.into_body();
    let task = tokio::spawn(async move { body.frame().await.map(|frame| frame.is_ok()) });
    joined_with_panic(task).await;
    assert_released_and_admitting(&gate);
}

#[tokio::test]
async fn a_panic_in_poll_frame_after_the_first_token_releases_the_capacity() {
    let gate = gate();
    let mut service = AdmissionLayer::new(gate.clone()).layer(service_fn(|_: Request<()>| {
        std::future::ready(Ok::<_, Infallible>(Response::new(PanicsAfter {
            frames: 1,
        })))
    }));
    service.ready().await.unwrap();
    let mut body = service.call(request()).await.unwrap().into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    assert_eq!(first.into_data().unwrap(), "token");
    // The first token released the waiting capacity, not the request's.
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));
    let task = tokio::spawn(async move { body.frame().await.map(|frame| frame.is_ok()) });
    joined_with_panic(task).await;
    assert_released_and_admitting(&gate);
}

/// A detector that panics on the first data frame it sees.
#[derive(Clone)]
struct PanickingDetector;

impl FirstTokenDetector for PanickingDetector {
    fn on_data(&mut self, _data: &[u8]) -> Option<usize> {
        panic!("{INJECTED} in the detector")
    }
}

#[tokio::test]
async fn a_panicking_detector_releases_the_capacity() {
    let gate = gate();
    let mut service = AdmissionLayer::new(gate.clone())
        .detector(PanickingDetector)
        .layer(service_fn(|_: Request<()>| {
            std::future::ready(Ok::<_, Infallible>(Response::new(Full::new(
                Bytes::from_static(b"token"),
            ))))
        }));
    service.ready().await.unwrap();
    let mut body = service.call(request()).await.unwrap().into_body();
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    let task = tokio::spawn(async move { body.frame().await.map(|frame| frame.is_ok()) });
    joined_with_panic(task).await;
    assert_released_and_admitting(&gate);
}

#[tokio::test]
async fn a_panicking_rank_describer_takes_nothing() {
    let gate = gate();
    let mut service = AdmissionLayer::new(gate.clone())
        .rank(|_: &Request<()>, _: &mut Descriptor| panic!("{INJECTED} in the rank describer"))
        .layer(service_fn(|_: Request<()>| {
            std::future::ready(Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())))
        }));
    service.ready().await.unwrap();
    let called = catch_unwind(AssertUnwindSafe(|| service.call(request())));
    assert!(called.is_err());
    assert_eq!(gate.snapshot().tally.received, 0);
    assert_released_and_admitting(&gate);
}

// ---- over a real socket ----

mod served {
    use std::net::SocketAddr;

    use axum::Router;
    use axum::body::Body as AxumBody;
    use axum::routing::post;
    use futures::stream;
    use tokio::net::TcpListener;

    use super::*;

    /// `/panic` panics in the handler, `/panic-mid-stream` after one chunk
    /// of its body, `/ok` answers; behind a gate of one request.
    async fn serve(gate: &Gate) -> SocketAddr {
        let app = Router::new()
            .route(
                "/panic",
                post(|| async {
                    if true {
                        panic!("{INJECTED} in the handler");
                    }
                    "unreachable"
                }),
            )
            .route(
                "/panic-mid-stream",
                post(|| async {
                    // One chunk, a pause (hyper sends what it has), a panic.
                    let chunks = stream::unfold(0, |sent| async move {
                        if sent == 1 {
                            tokio::task::yield_now().await;
                            panic!("{INJECTED} mid-stream");
                        }
                        Some((Ok::<_, Infallible>(Bytes::from_static(b"token ")), sent + 1))
                    });
                    AxumBody::from_stream(chunks)
                }),
            )
            .route("/ok", post(|| async { "done" }))
            .layer(AdmissionLayer::new(gate.clone()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }

    /// A request behind the one that panicked: it waits in the gate's queue
    /// until the panicking connection's capacity comes back, so it is
    /// answered only if that capacity was released.
    async fn next_request_is_admitted(client: &reqwest::Client, addr: SocketAddr, gate: &Gate) {
        let response = timeout(PATIENCE, client.post(format!("http://{addr}/ok")).send())
            .await
            .expect("the next request was never admitted: the panic kept its capacity")
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.text().await.unwrap(), "done");
        let snapshot = gate.snapshot();
        assert_eq!(snapshot.total, Counts::default());
        assert_eq!(snapshot.tally.rejected(), 0);
    }

    #[tokio::test]
    async fn a_panicking_handler_over_a_real_socket_releases_the_capacity() {
        let gate = gate();
        let addr = serve(&gate).await;
        let client = reqwest::Client::new();
        let failed = timeout(PATIENCE, client.post(format!("http://{addr}/panic")).send())
            .await
            .expect("the panicking request hangs");
        assert!(failed.is_err(), "the connection should have been dropped");
        next_request_is_admitted(&client, addr, &gate).await;
    }

    #[tokio::test]
    async fn a_body_that_panics_mid_stream_over_a_real_socket_releases_the_capacity() {
        let gate = gate();
        let addr = serve(&gate).await;
        let client = reqwest::Client::new();
        let streamed = async {
            let response = client
                .post(format!("http://{addr}/panic-mid-stream"))
                .send()
                .await?;
            assert_eq!(response.status(), StatusCode::OK);
            response.bytes().await
        };
        let read = timeout(PATIENCE, streamed)
            .await
            .expect("the panicking stream hangs");
        assert!(read.is_err(), "the stream should have been cut");
        next_request_is_admitted(&client, addr, &gate).await;
    }
}
