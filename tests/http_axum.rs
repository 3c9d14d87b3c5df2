//! The layer on a whole axum `Router`, served over real TCP to a real HTTP
//! client: several routes share one gate, streamed answers hold capacity
//! until they end, a client that goes away frees what it held, and a burst
//! gets exactly the admissions, queue places and overload answers the limits
//! allow.
//!
//! The handlers are a stand-in engine the test drives: each admitted request
//! hands the test a sender for its SSE events and streams until the test
//! drops it. Every wait is on an explicit signal (a channel, a closed
//! sender), bounded by a timeout so that a broken layer fails the test
//! instead of hanging it.
#![cfg(feature = "http")]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::routing::{get, post};
use futures::{Stream, StreamExt};
use http::{Request, StatusCode, Uri};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tower::{Layer, Service};
use tower_admission::detect::OpenAiSse;
use tower_admission::{AdmissionConfig, AdmissionLayer, Counts, EngineCapacity, Gate, RankHeader};

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::counts;

const PATIENCE: Duration = Duration::from_secs(10);

const ROLE_CHUNK: &str = r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#;
const TOKEN_CHUNK: &str = r#"{"choices":[{"index":0,"delta":{"content":"Hello"}}]}"#;

/// One admitted request, as the stand-in engine sees it.
struct Started {
    path: String,
    /// SSE event data to stream; dropping it ends the response.
    events: mpsc::UnboundedSender<String>,
}

#[derive(Clone)]
struct Engine {
    started: mpsc::UnboundedSender<Started>,
}

async fn generate(
    State(engine): State<Engine>,
    uri: Uri,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (events, rx) = mpsc::unbounded_channel();
    let path = uri.path().to_owned();
    engine.started.send(Started { path, events }).unwrap();
    Sse::new(UnboundedReceiverStream::new(rx).map(|data| Ok(Event::default().data(data))))
}

/// Tells the test each time a request has been through admission's `call`,
/// where the gate decides: after it, the request is admitted, queued or
/// rejected, and the gate's counts say so.
#[derive(Clone)]
struct Announce<S> {
    inner: S,
    decided: mpsc::UnboundedSender<()>,
}

impl<S, B> Service<Request<B>> for Announce<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> S::Future {
        let future = self.inner.call(req);
        let _ = self.decided.send(());
        future
    }
}

struct Worker {
    url: String,
    addr: SocketAddr,
    gate: Gate,
    started: mpsc::UnboundedReceiver<Started>,
    decided: mpsc::UnboundedReceiver<()>,
}

impl Worker {
    /// Serves two generation routes behind one admission layer, applied to
    /// each route's method router with `route_layer` as the docs advise,
    /// and a health check without it.
    async fn start(gate: Gate, layer: AdmissionLayer<OpenAiSse, RankHeader>) -> Worker {
        let (started_tx, started) = mpsc::unbounded_channel();
        let (decided_tx, decided) = mpsc::unbounded_channel();
        let admitted = tower::ServiceBuilder::new()
            .layer(tower::layer::layer_fn(move |inner| Announce {
                inner,
                decided: decided_tx.clone(),
            }))
            .layer(layer);
        let app = Router::new()
            .route(
                "/v1/chat/completions",
                post(generate).route_layer(admitted.clone()),
            )
            .route("/v1/completions", post(generate).route_layer(admitted))
            .route("/health", get(|| async { "ok" }))
            .with_state(Engine {
                started: started_tx,
            });

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Worker {
            url: format!("http://{addr}"),
            addr,
            gate,
            started,
            decided,
        }
    }

    async fn next_started(&mut self) -> Started {
        within(self.started.recv())
            .await
            .expect("the server is gone")
    }

    /// Waits until `n` more requests have been decided by the gate.
    async fn decisions(&mut self, n: usize) {
        for _ in 0..n {
            within(self.decided.recv()).await.unwrap();
        }
    }

    fn total(&self) -> Counts {
        self.gate.snapshot().total
    }
}

async fn within<F: Future>(future: F) -> F::Output {
    timeout(PATIENCE, future)
        .await
        .expect("timed out waiting for the server")
}

fn layer(gate: &Gate) -> AdmissionLayer<OpenAiSse, RankHeader> {
    AdmissionLayer::new(gate.clone())
        .detector(OpenAiSse::default())
        .rank(RankHeader::default())
}

fn unranked_gate(engine: usize, queue: usize) -> Gate {
    gate_support::gate(engine, engine, queue)
}

/// Reads response chunks until one contains `needle`.
async fn read_until(response: &mut reqwest::Response, needle: &str) {
    let mut seen = String::new();
    while !seen.contains(needle) {
        let chunk = within(response.chunk())
            .await
            .unwrap()
            .expect("the stream ended early");
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_frees_its_capacity() {
    let gate = unranked_gate(2, 0);
    let mut worker = Worker::start(gate.clone(), layer(&gate)).await;
    let client = reqwest::Client::new();

    let mut response = within(
        client
            .post(format!("{}/v1/chat/completions", worker.url))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let stream = worker.next_started().await;
    assert_eq!(worker.total(), counts(1, 1, 0));

    // The role chunk reaches the client but is not a generated token.
    stream.events.send(ROLE_CHUNK.to_owned()).unwrap();
    read_until(&mut response, "assistant").await;
    assert_eq!(worker.total(), counts(1, 1, 0));

    stream.events.send(TOKEN_CHUNK.to_owned()).unwrap();
    read_until(&mut response, "Hello").await;
    assert_eq!(worker.total(), counts(1, 0, 0));

    // The client hangs up mid-answer. Once the server notices the closed
    // connection it drops the response body, which closes the engine's
    // event channel and must release the request.
    drop(response);
    within(stream.events.closed()).await;
    assert_eq!(worker.total(), counts(0, 0, 0));

    let tally = gate.snapshot().tally;
    assert_eq!((tally.received, tally.admitted_direct), (1, 1));
}

#[tokio::test]
async fn a_burst_gets_exactly_the_admissions_queue_places_and_overloads_the_limits_allow() {
    // Two engine slots and one queue place, shared by both routes.
    let gate = unranked_gate(2, 1);
    let mut worker = Worker::start(gate.clone(), layer(&gate)).await;
    let client = reqwest::Client::new();

    const BURST: usize = 6;
    let mut answers = Vec::new();
    for i in 0..BURST {
        let route = if i % 2 == 0 {
            "chat/completions"
        } else {
            "completions"
        };
        let request = client.post(format!("{}/v1/{route}", worker.url)).send();
        answers.push(tokio::spawn(async move {
            let response = request.await.unwrap();
            let status = response.status();
            let headers = response.headers().clone();
            let body = response.bytes().await.unwrap();
            (status, headers, body)
        }));
    }
    worker.decisions(BURST).await;

    let first = worker.next_started().await;
    let second = worker.next_started().await;
    assert_eq!(worker.total(), counts(2, 2, 1));
    let tally = gate.snapshot().tally;
    assert_eq!(tally.received, BURST as u64);
    assert_eq!(tally.admitted_direct, 2);
    assert_eq!(tally.rejected_worker, 3);

    // Routes added after the layer are not admitted: the health check
    // answers while the worker is full.
    let health = within(client.get(format!("{}/health", worker.url)).send())
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);

    // The first answer ends; the queued request takes its place.
    first.events.send(TOKEN_CHUNK.to_owned()).unwrap();
    drop(first);
    let third = worker.next_started().await;
    assert!(third.path.starts_with("/v1/"));
    drop(second);
    drop(third);

    let mut ok = 0;
    let mut overloaded = 0;
    for answer in answers {
        let (status, headers, body) = within(answer).await.unwrap();
        match status.as_u16() {
            200 => {
                ok += 1;
                assert_eq!(headers["content-type"], "text/event-stream");
            }
            529 => {
                overloaded += 1;
                assert_eq!(headers["content-type"], "application/json");
                assert_eq!(headers["x-admission-rejection-scope"], "worker");
                assert_eq!(headers["retry-after"], "1");
                assert!(headers.get("x-admission-rank").is_none());
                let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(json["error"]["type"], "overloaded");
                assert_eq!(json["error"]["code"], 529);
                assert_eq!(json["error"]["scope"], "worker");
                assert!(json["error"]["rank"].is_null());
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((ok, overloaded), (3, 3));

    assert_eq!(worker.total(), counts(0, 0, 0));
    let tally = gate.snapshot().tally;
    assert_eq!(tally.admitted_direct + tally.admitted_queue, 3);
    assert_eq!(tally.rejected_worker, 3);
    assert_eq!(tally.cancelled, 0);
}

#[tokio::test]
async fn a_busy_rank_gets_rank_scoped_answers_and_never_blocks_another() {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(0)
            .capacity(EngineCapacity::new(1, 2)),
    );
    let mut worker = Worker::start(gate.clone(), layer(&gate)).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/completions", worker.url);
    let post = |rank: &str| {
        client
            .post(&url)
            .header("x-data-parallel-rank", rank)
            .send()
    };

    let busy = within(post("0")).await.unwrap();
    let rank0 = worker.next_started().await;
    assert_eq!(gate.snapshot().ranks[0], counts(1, 1, 0));

    let rejected = within(post("0")).await.unwrap();
    assert_eq!(rejected.status().as_u16(), 529);
    assert_eq!(rejected.headers()["x-admission-rejection-scope"], "rank");
    assert_eq!(rejected.headers()["x-admission-rank"], "0");
    assert!(rejected.headers().get("retry-after").is_none());
    let json: serde_json::Value = rejected.json().await.unwrap();
    assert_eq!(json["error"]["scope"], "rank");
    assert_eq!(json["error"]["rank"], 0);

    let other = within(post("1")).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    let rank1 = worker.next_started().await;
    assert_eq!(gate.snapshot().ranks[1], counts(1, 1, 0));

    drop((rank0, rank1));
    within(busy.bytes()).await.unwrap();
    within(other.bytes()).await.unwrap();
    assert_eq!(worker.total(), counts(0, 0, 0));
}

/// The reason phrase is written by hyper, from the response extension the
/// layer sets with feature `hyper`.
#[cfg(feature = "hyper")]
#[tokio::test]
async fn the_status_line_says_the_site_is_overloaded() {
    let gate = unranked_gate(1, 0);
    let mut worker = Worker::start(gate.clone(), layer(&gate)).await;
    let client = reqwest::Client::new();
    let busy = within(client.post(format!("{}/v1/completions", worker.url)).send())
        .await
        .unwrap();
    let stream = worker.next_started().await;

    // Read the status line as it crossed the wire.
    let mut socket = within(TcpStream::connect(worker.addr)).await.unwrap();
    socket
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nhost: worker\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    within(socket.read_to_end(&mut answer)).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 529 Site is overloaded\r\n"),
        "{answer}"
    );
    assert!(answer.contains(r#""type":"overloaded""#), "{answer}");

    drop(stream);
    within(busy.bytes()).await.unwrap();
    assert_eq!(worker.total(), counts(0, 0, 0));
}

#[tokio::test]
async fn unknown_paths_and_wrong_methods_take_no_admission_capacity() {
    let gate = unranked_gate(1, 0);
    let mut worker = Worker::start(gate.clone(), layer(&gate)).await;
    let client = reqwest::Client::new();
    let busy = within(client.post(format!("{}/v1/completions", worker.url)).send())
        .await
        .unwrap();
    let stream = worker.next_started().await;
    assert_eq!(worker.total(), counts(1, 1, 0));

    // The worker is full, yet a wrong path gets 404 and a wrong method 405,
    // not an overload answer, and the gate never hears of them.
    let not_found = within(client.post(format!("{}/v1/nothing", worker.url)).send())
        .await
        .unwrap();
    assert_eq!(not_found.status(), StatusCode::NOT_FOUND);
    let wrong_method = within(client.get(format!("{}/v1/completions", worker.url)).send())
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), StatusCode::METHOD_NOT_ALLOWED);
    let health = within(client.get(format!("{}/health", worker.url)).send())
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    assert_eq!(gate.snapshot().tally.received, 1);

    let rejected = within(
        client
            .post(format!("{}/v1/chat/completions", worker.url))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(rejected.status().as_u16(), 529);

    drop(stream);
    within(busy.bytes()).await.unwrap();
    assert_eq!(worker.total(), counts(0, 0, 0));
}

/// A layer's services are cloned per route and per request; the gate they
/// share is the one handed to the layer.
#[test]
fn every_clone_of_the_layer_admits_through_one_gate() {
    let gate = unranked_gate(1, 0);
    let layer = layer(&gate);
    let a = layer
        .clone()
        .layer(tower::service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(axum::body::Body::empty()))
        }));
    let b = a.clone();
    let mut futures = Vec::new();
    for mut service in [a, b] {
        futures.push(service.call(Request::new(())));
    }
    let tally = gate.snapshot().tally;
    assert_eq!((tally.admitted_direct, tally.rejected_worker), (1, 1));
}
