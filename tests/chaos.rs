//! Chaos soak over real sockets: an axum worker with the admission layer,
//! served over loopback TCP (HTTP/1.1 and HTTP/2), and 64 clients sharing
//! pooled connections (reqwest over HTTP/1.1, hyper's pooled client over
//! HTTP/2) sending tens of thousands of streaming requests while everything
//! that can go wrong does:
//!
//! * clients go away at random points — before the gate sees the request
//!   (a half-written head), while it waits in the queue or for its response
//!   head, after the head but before the first token, mid-stream, or while
//!   uploading the request body;
//! * the handler answers 500, fails its body mid-stream, panics before
//!   answering or mid-stream (its task dies), returns an
//!   already-finished body, or ends with trailers;
//! * the engine reports new capacities meanwhile (ranks and `max_num_seqs`
//!   change every few milliseconds), and requests carry random, invalid or
//!   repeated `x-data-parallel-rank` headers.
//!
//! Over HTTP/1.1 a client that goes away closes its connection, and a panic
//! kills the connection's task; over HTTP/2 the client resets its stream
//! (`RST_STREAM`), and a panic kills only that stream's task.
//!
//! Afterwards every count is zero, `received = admitted + rejected +
//! cancelled`, no client task is stuck (each request is bounded by a
//! liveness timeout, which is a failure, not a synchronisation), and a
//! second run on the same gate and server leaves the resident memory within
//! 10% of what the first left.
//!
//! The server counts its open connections and HTTP/2 stream tasks; the test
//! waits on that count (not on a clock) until all of them — and with them
//! every response future and body — are gone before it reads the gate.
//!
//! `chaos_soak` is ignored by default:
//!
//! ```sh
//! CHAOS_REQUESTS=20000 cargo test --release --test chaos -- --ignored --nocapture
//! ```
//!
//! `CHAOS_SEED` replays a run's random choices (the seed is printed; the
//! interleaving of a real server is not replayable). `chaos_smoke` runs a
//! few hundred requests in the default test run.
#![cfg(feature = "http")]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as PooledClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::time::timeout;
use tower_admission::detect::OpenAiSse;
use tower_admission::{
    AdmissionConfig, AdmissionLayer, Counts, EngineCapacity, Gate, RankHeader, Snapshot, Tally,
};

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

#[path = "support/panics.rs"]
mod panics_hook;
use panics_hook::quiet_injected_panics;

/// Clients sending at once.
const CONCURRENCY: usize = 64;
/// Longest any one request may take before the test calls it stuck.
const REQUEST_LIVENESS: Duration = Duration::from_secs(60);
/// Longest the server may take to close every connection once the clients
/// are gone.
const DRAIN_LIVENESS: Duration = Duration::from_secs(60);
const ROUTE: &str = "/v1/chat/completions";

const ROLE_CHUNK: &[u8] =
    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n";
const TOKEN_CHUNK: &[u8] =
    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"},\"finish_reason\":null}]}\n\n";
const DONE_CHUNK: &[u8] = b"data: [DONE]\n\n";

/// Panics raised on purpose say so; the hook keeps them off stderr.
const INJECTED: &str = "injected chaos panic";

// ---- randomness ----

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// `CHAOS_SEED`, or one from the clock; printed either way.
fn seed() -> u64 {
    let seed = env_or(
        "CHAOS_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64),
    );
    println!("CHAOS_SEED={seed}");
    seed
}

// ---- what each request does ----

/// How the handler answers the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Streams a role chunk, tokens and `[DONE]`.
    Stream,
    /// Streams, but the first token takes a while.
    SlowFirstToken,
    /// Answers 500 with a short body.
    ServerError,
    /// Streams a few chunks, then the body fails.
    BodyError,
    /// Panics before answering.
    PanicInHandler,
    /// Streams a few chunks, then panics inside the body's poll.
    PanicMidStream,
    /// Answers 200 with an already-finished (empty) body.
    EmptyBody,
    /// Streams, then ends with a trailers frame.
    Trailers,
}

const HANDLERS: [(Answer, u64); 8] = [
    (Answer::Stream, 54),
    (Answer::SlowFirstToken, 10),
    (Answer::ServerError, 6),
    (Answer::BodyError, 6),
    (Answer::PanicInHandler, 5),
    (Answer::PanicMidStream, 5),
    (Answer::EmptyBody, 7),
    (Answer::Trailers, 7),
];

/// What the client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientAct {
    /// Reads the whole answer.
    ReadAll,
    /// Gives up after `ms` milliseconds without a response head: while
    /// queued, or admitted and waiting for the head.
    GiveUpWaiting { ms: u64 },
    /// Drops the response as soon as its head arrives: before the first token.
    DropAfterHead,
    /// Reads `chunks` chunks, then drops the response: mid-stream.
    DropMidStream { chunks: u32 },
    /// Writes half a request head and hangs up: the gate never sees it.
    HalfHead,
    /// Writes a whole head announcing a body, part of the body, and hangs up.
    HalfBody,
}

fn client_act(rng: &mut Rng) -> ClientAct {
    match rng.pick(&[56, 12, 10, 12, 5, 5]) {
        0 => ClientAct::ReadAll,
        1 => ClientAct::GiveUpWaiting { ms: rng.below(6) },
        2 => ClientAct::DropAfterHead,
        3 => ClientAct::DropMidStream {
            chunks: 1 + rng.below(4) as u32,
        },
        4 => ClientAct::HalfHead,
        _ => ClientAct::HalfBody,
    }
}

/// `x-data-parallel-rank` values to send: none, a rank (maybe one the
/// engine no longer reports), or garbage.
fn rank_values(rng: &mut Rng) -> Vec<String> {
    match rng.pick(&[30, 45, 5, 5, 5, 5, 5]) {
        0 => vec![],
        // Rank 0 is the busiest, so that its queue fills while others have room.
        1 => vec![if rng.below(2) == 0 { 0 } else { rng.below(4) }.to_string()],
        2 => vec!["7".to_owned()],
        3 => vec!["abc".to_owned()],
        4 => vec!["-1".to_owned()],
        5 => vec!["1".to_owned(), "2".to_owned()],
        _ => vec!["99999999999999999999".to_owned()],
    }
}

#[derive(Debug, Clone)]
struct Plan {
    handler: Answer,
    /// Tokens to stream.
    tokens: u32,
    /// Seeds the handler's own choices (delays, where it fails).
    handler_seed: u64,
    act: ClientAct,
    ranks: Vec<String>,
    /// Over HTTP/2 rather than HTTP/1.1 (raw half-requests are HTTP/1.1).
    http2: bool,
}

impl Plan {
    fn new(seed: u64, index: usize) -> Plan {
        let mut rng = Rng::new(seed ^ (index as u64).wrapping_mul(0xA076_1D64_78BD_642F));
        let weights: Vec<u64> = HANDLERS.iter().map(|(_, weight)| *weight).collect();
        let handler = HANDLERS[rng.pick(&weights)].0;
        Plan {
            handler,
            tokens: 2 + rng.below(12) as u32,
            handler_seed: rng.next(),
            act: client_act(&mut rng),
            ranks: rank_values(&mut rng),
            http2: rng.below(10) < 3,
        }
    }

    /// The `x-chaos` header telling the handler what to do.
    fn header(&self) -> String {
        format!(
            "{} {} {}",
            HANDLERS
                .iter()
                .position(|(handler, _)| *handler == self.handler)
                .unwrap(),
            self.tokens,
            self.handler_seed
        )
    }
}

// ---- the server ----

/// What the server did, counted where it happened.
#[derive(Default)]
struct ServerEvents {
    handled: AtomicU64,
    panics_in_handler: AtomicU64,
    panics_mid_stream: AtomicU64,
    server_errors: AtomicU64,
    body_errors: AtomicU64,
    empty_bodies: AtomicU64,
    trailers: AtomicU64,
    streams_finished: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// Waits `ms` milliseconds of the engine's work; 0 only yields.
async fn work(ms: u64) {
    if ms == 0 {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

struct StreamState {
    step: u32,
    tokens: u32,
    handler: Answer,
    /// The step at which a failing stream fails.
    fail_at: u32,
    rng: Rng,
    events: Arc<ServerEvents>,
}

type ChunkResult = Result<Frame<Bytes>, std::io::Error>;

/// The next frame of a streamed answer.
async fn next_frame(mut state: StreamState) -> Option<(ChunkResult, StreamState)> {
    let step = state.step;
    state.step += 1;
    let failing = matches!(state.handler, Answer::BodyError | Answer::PanicMidStream);
    if failing && step == state.fail_at {
        work(state.rng.below(2)).await;
        if state.handler == Answer::PanicMidStream {
            bump(&state.events.panics_mid_stream);
            panic!("{INJECTED} mid-stream");
        }
        bump(&state.events.body_errors);
        return Some((
            Err(std::io::Error::other("engine failed mid-stream")),
            state,
        ));
    }
    let frame = match step {
        0 => Frame::data(Bytes::from_static(ROLE_CHUNK)),
        1 => {
            let first_token_ms = if state.handler == Answer::SlowFirstToken {
                5 + state.rng.below(15)
            } else {
                state.rng.below(3)
            };
            work(first_token_ms).await;
            Frame::data(Bytes::from_static(TOKEN_CHUNK))
        }
        step if step <= state.tokens => {
            work(state.rng.below(3)).await;
            Frame::data(Bytes::from_static(TOKEN_CHUNK))
        }
        step if step == state.tokens + 1 => Frame::data(Bytes::from_static(DONE_CHUNK)),
        step if step == state.tokens + 2 && state.handler == Answer::Trailers => {
            bump(&state.events.trailers);
            let mut trailers = HeaderMap::new();
            trailers.insert("x-finish-reason", "stop".parse().unwrap());
            Frame::trailers(trailers)
        }
        _ => {
            bump(&state.events.streams_finished);
            return None;
        }
    };
    Some((Ok(frame), state))
}

async fn generate(State(events): State<Arc<ServerEvents>>, headers: HeaderMap) -> Response {
    bump(&events.handled);
    let plan = headers
        .get("x-chaos")
        .and_then(|value| value.to_str().ok())
        .map(|value| value.split(' ').map(str::to_owned).collect::<Vec<_>>())
        .unwrap_or_default();
    let field = |index: usize| plan.get(index).and_then(|value| value.parse::<u64>().ok());
    let handler = HANDLERS[field(0).unwrap_or(0) as usize % HANDLERS.len()].0;
    let tokens = field(1).unwrap_or(4) as u32;
    let mut rng = Rng::new(field(2).unwrap_or(0));

    // Time to the response head.
    work(rng.below(3)).await;
    match handler {
        Answer::ServerError => {
            bump(&events.server_errors);
            return (StatusCode::INTERNAL_SERVER_ERROR, "engine failed").into_response();
        }
        Answer::PanicInHandler => {
            bump(&events.panics_in_handler);
            panic!("{INJECTED} in the handler");
        }
        Answer::EmptyBody => {
            bump(&events.empty_bodies);
            return StatusCode::OK.into_response();
        }
        _ => {}
    }
    let fail_at = 1 + rng.below(u64::from(tokens)) as u32;
    let state = StreamState {
        step: 0,
        tokens,
        handler,
        fail_at,
        rng,
        events,
    };
    let body = http_body_util::StreamBody::new(futures::stream::unfold(state, next_frame));
    let mut response = AxumBody::new(body).into_response();
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        "text/event-stream".parse().unwrap(),
    );
    response
}

/// Counts a connection, or an HTTP/2 stream's task, from its start to its
/// end (normal, error or panic).
struct OpenTask(Arc<watch::Sender<usize>>);

impl OpenTask {
    fn new(open: &Arc<watch::Sender<usize>>) -> OpenTask {
        open.send_modify(|open| *open += 1);
        OpenTask(open.clone())
    }
}

impl Drop for OpenTask {
    fn drop(&mut self) {
        self.0.send_modify(|open| *open -= 1);
    }
}

/// Spawns hyper's HTTP/2 stream tasks on tokio, counted.
#[derive(Clone)]
struct CountedExecutor(Arc<watch::Sender<usize>>);

impl<F> hyper::rt::Executor<F> for CountedExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        let task = OpenTask::new(&self.0);
        tokio::spawn(async move {
            let _task = task;
            future.await;
        });
    }
}

struct Server {
    addr: SocketAddr,
    open: watch::Receiver<usize>,
    events: Arc<ServerEvents>,
}

/// Serves the worker: `ROUTE` behind the admission layer, `/health` beside
/// it; one task per connection (HTTP/1.1, or HTTP/2 with prior knowledge)
/// and one per HTTP/2 stream, as `axum::serve` does, but counted.
async fn serve(gate: &Gate) -> Server {
    let events = Arc::new(ServerEvents::default());
    let app = Router::new()
        .route(ROUTE, post(generate))
        .layer(
            AdmissionLayer::new(gate.clone())
                .detector(OpenAiSse::default())
                .rank(RankHeader::default()),
        )
        .route("/health", get(|| async { "ok" }))
        .with_state(events.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (open_tx, open) = watch::channel(0usize);
    let open_tx = Arc::new(open_tx);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue; // e.g. a connection reset before it was accepted
            };
            let connection = OpenTask::new(&open_tx);
            let service = TowerToHyperService::new(app.clone());
            let executor = CountedExecutor(open_tx.clone());
            tokio::spawn(async move {
                let _connection = connection;
                let _ = auto::Builder::new(executor)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Server { addr, open, events }
}

impl Server {
    /// Waits until every connection made so far has been accepted and has
    /// ended, with its HTTP/2 stream tasks: then no response future or body
    /// of the run is left.
    async fn drained(&mut self) {
        // A connection accepted after every earlier one: the listener's
        // backlog holds nothing older.
        let mut sentinel = TcpStream::connect(self.addr).await.unwrap();
        sentinel
            .write_all(b"GET /health HTTP/1.1\r\nhost: worker\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        timeout(DRAIN_LIVENESS, sentinel.read_to_end(&mut answer))
            .await
            .expect("the server does not answer")
            .unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200"));
        drop(sentinel);
        let drained = timeout(DRAIN_LIVENESS, self.open.wait_for(|&open| open == 0))
            .await
            .map(|open| open.map(|_| ()));
        match drained {
            Ok(result) => result.expect("the server's count of connections is gone"),
            Err(_) => panic!(
                "{} connections or stream tasks still open {DRAIN_LIVENESS:?} after the clients left",
                *self.open.borrow()
            ),
        }
    }
}

// ---- the clients ----

/// How requests ended, seen by the clients.
#[derive(Debug, Default, Clone)]
struct ClientFigures {
    requests: u64,
    http2: u64,
    completed: u64,
    overloaded: u64,
    server_errors: u64,
    /// Connection failures the client did not cause (a panic or a failed
    /// body on the server cut the stream).
    cut_by_server: u64,
    gave_up_waiting: u64,
    dropped_after_head: u64,
    dropped_mid_stream: u64,
    half_heads: u64,
    half_bodies: u64,
}

impl ClientFigures {
    fn add(&mut self, other: &ClientFigures) {
        self.requests += other.requests;
        self.http2 += other.http2;
        self.completed += other.completed;
        self.overloaded += other.overloaded;
        self.server_errors += other.server_errors;
        self.cut_by_server += other.cut_by_server;
        self.gave_up_waiting += other.gave_up_waiting;
        self.dropped_after_head += other.dropped_after_head;
        self.dropped_mid_stream += other.dropped_mid_stream;
        self.half_heads += other.half_heads;
        self.half_bodies += other.half_bodies;
    }

    fn disconnects(&self) -> u64 {
        self.gave_up_waiting
            + self.dropped_after_head
            + self.dropped_mid_stream
            + self.half_heads
            + self.half_bodies
    }
}

/// The clients of one run, sharing pooled connections.
#[derive(Clone)]
struct Clients {
    http1: reqwest::Client,
    http2: PooledClient<HttpConnector, Full<Bytes>>,
}

impl Clients {
    fn new() -> Clients {
        Clients {
            http1: reqwest::Client::builder()
                .pool_max_idle_per_host(CONCURRENCY)
                .build()
                .unwrap(),
            http2: PooledClient::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http(),
        }
    }

    /// Sends `plan`'s request; resolves at its response head.
    async fn send(&self, addr: SocketAddr, plan: &Plan) -> Result<Streamed, ()> {
        const BODY: &str = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        let url = format!("http://{addr}{ROUTE}");
        if plan.http2 {
            let mut request = http::Request::post(url).header("x-chaos", plan.header());
            for rank in &plan.ranks {
                request = request.header("x-data-parallel-rank", rank);
            }
            let request = request.body(Full::new(Bytes::from_static(BODY.as_bytes())));
            let response = self.http2.request(request.unwrap()).await.map_err(drop)?;
            return Ok(Streamed::Http2(response));
        }
        let mut request = self
            .http1
            .post(url)
            .header("x-chaos", plan.header())
            .body(BODY);
        for rank in &plan.ranks {
            request = request.header("x-data-parallel-rank", rank);
        }
        let response = request.send().await.map_err(drop)?;
        Ok(Streamed::Http1(response))
    }
}

/// A response being read, over either protocol. Dropping it before its end
/// closes the HTTP/1.1 connection or resets the HTTP/2 stream.
enum Streamed {
    Http1(reqwest::Response),
    Http2(http::Response<hyper::body::Incoming>),
}

impl Streamed {
    fn status(&self) -> u16 {
        match self {
            Streamed::Http1(response) => response.status().as_u16(),
            Streamed::Http2(response) => response.status().as_u16(),
        }
    }

    /// The next chunk of data; `Err` if the server cut the stream.
    async fn chunk(&mut self) -> Result<Option<Bytes>, ()> {
        match self {
            Streamed::Http1(response) => response.chunk().await.map_err(drop),
            Streamed::Http2(response) => loop {
                match response.body_mut().frame().await {
                    None => return Ok(None),
                    Some(Err(_)) => return Err(()),
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            return Ok(Some(data));
                        }
                    }
                }
            },
        }
    }

    /// Reads to the end; the data, or `Err` if the server cut the stream.
    async fn read_to_end(&mut self) -> Result<Vec<u8>, ()> {
        let mut all = Vec::new();
        while let Some(chunk) = self.chunk().await? {
            all.extend_from_slice(&chunk);
        }
        Ok(all)
    }
}

fn raw_head(plan: &Plan, body_len: usize) -> Vec<u8> {
    let mut head = format!(
        "POST {ROUTE} HTTP/1.1\r\nhost: worker\r\ncontent-type: application/json\r\ncontent-length: {body_len}\r\nx-chaos: {}\r\n",
        plan.header()
    );
    for rank in &plan.ranks {
        head.push_str(&format!("x-data-parallel-rank: {rank}\r\n"));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

async fn one_request(clients: &Clients, addr: SocketAddr, plan: &Plan) -> ClientFigures {
    let mut figures = ClientFigures {
        requests: 1,
        ..ClientFigures::default()
    };
    match plan.act {
        ClientAct::HalfHead => {
            let head = raw_head(plan, 0);
            let mut socket = TcpStream::connect(addr).await.unwrap();
            let _ = socket.write_all(&head[..head.len() / 2]).await;
            figures.half_heads += 1;
            return figures;
        }
        ClientAct::HalfBody => {
            let mut socket = TcpStream::connect(addr).await.unwrap();
            let _ = socket.write_all(&raw_head(plan, 64)).await;
            let _ = socket.write_all(b"{\"messages\":[").await;
            tokio::task::yield_now().await;
            figures.half_bodies += 1;
            return figures;
        }
        _ => {}
    }

    if plan.http2 {
        figures.http2 += 1;
    }
    let sent = clients.send(addr, plan);
    let response = match plan.act {
        ClientAct::GiveUpWaiting { ms } => match timeout(Duration::from_millis(ms), sent).await {
            Ok(response) => response,
            Err(_) => {
                figures.gave_up_waiting += 1;
                return figures;
            }
        },
        _ => sent.await,
    };
    let Ok(mut response) = response else {
        figures.cut_by_server += 1;
        return figures;
    };
    match response.status() {
        529 => {
            figures.overloaded += 1;
            let body = response.read_to_end().await.unwrap_or_default();
            let body = String::from_utf8_lossy(&body);
            assert!(
                body.contains("overloaded"),
                "a 529 without its JSON: {body}"
            );
            return figures;
        }
        500 => {
            figures.server_errors += 1;
            let _ = response.read_to_end().await;
            return figures;
        }
        200 => {}
        status => panic!("unexpected status {status} for {plan:?}"),
    }
    match plan.act {
        ClientAct::DropAfterHead | ClientAct::GiveUpWaiting { .. } => {
            figures.dropped_after_head += 1;
        }
        ClientAct::DropMidStream { chunks } => {
            for _ in 0..chunks {
                match response.chunk().await {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        figures.completed += 1;
                        return figures;
                    }
                    Err(_) => {
                        figures.cut_by_server += 1;
                        return figures;
                    }
                }
            }
            figures.dropped_mid_stream += 1;
        }
        ClientAct::ReadAll => match response.read_to_end().await {
            Ok(_) => figures.completed += 1,
            Err(()) => figures.cut_by_server += 1,
        },
        ClientAct::HalfHead | ClientAct::HalfBody => unreachable!("answered above"),
    }
    figures
}

/// Sends requests `next..requests` (shared with the other clients) one at a
/// time; each is bounded by `REQUEST_LIVENESS`.
async fn client_task(
    clients: Clients,
    addr: SocketAddr,
    seed: u64,
    next: Arc<AtomicUsize>,
    requests: usize,
) -> ClientFigures {
    let mut figures = ClientFigures::default();
    loop {
        let index = next.fetch_add(1, Ordering::Relaxed);
        if index >= requests {
            return figures;
        }
        let plan = Plan::new(seed, index);
        let done = timeout(REQUEST_LIVENESS, one_request(&clients, addr, &plan))
            .await
            .unwrap_or_else(|_| {
                panic!("request {index} ({plan:?}) stuck for {REQUEST_LIVENESS:?}")
            });
        figures.add(&done);
    }
}

// ---- the engine's capacity reports ----

#[derive(Debug, Default)]
struct ReporterFigures {
    reports: u64,
    most_in_engine: usize,
    most_queued: usize,
}

/// Reports a new capacity every 2 ms until told to stop, and samples the
/// gate's peak occupancy.
async fn report_capacities(
    gate: Gate,
    seed: u64,
    mut stop: oneshot::Receiver<()>,
) -> ReporterFigures {
    let mut rng = Rng::new(seed ^ 0xC0FF_EE00);
    let mut figures = ReporterFigures::default();
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    loop {
        tokio::select! {
            _ = &mut stop => return figures,
            _ = tick.tick() => {}
        }
        let max_num_seqs = 4 + rng.below(21) as usize;
        let ranks = 1 + rng.below(4) as usize;
        gate.report_capacity(EngineCapacity::new(max_num_seqs, ranks));
        figures.reports += 1;
        let total = gate.snapshot().total;
        figures.most_in_engine = figures.most_in_engine.max(total.engine_requests);
        figures.most_queued = figures.most_queued.max(total.queued);
    }
}

// ---- one run ----

struct RunFigures {
    clients: ClientFigures,
    reporter: ReporterFigures,
    tally: Tally,
    handled: u64,
    panics_in_handler: u64,
    panics_mid_stream: u64,
    server_errors: u64,
    body_errors: u64,
    empty_bodies: u64,
    trailers: u64,
    streams_finished: u64,
    elapsed: Duration,
    end: Snapshot,
}

/// `requests` requests through `server` from a fresh pool of clients, the
/// engine reporting capacities meanwhile; returns once every connection has
/// ended, with the gate checked empty.
async fn run(gate: &Gate, server: &mut Server, requests: usize, seed: u64) -> RunFigures {
    let started = Instant::now();
    let before = gate.snapshot().tally;
    let events = server.events.clone();
    let server_before: Vec<u64> = [
        &events.handled,
        &events.panics_in_handler,
        &events.panics_mid_stream,
        &events.server_errors,
        &events.body_errors,
        &events.empty_bodies,
        &events.trailers,
        &events.streams_finished,
    ]
    .iter()
    .map(|counter| read(counter))
    .collect();

    let (stop, stopped) = oneshot::channel();
    let reporter = tokio::spawn(report_capacities(gate.clone(), seed, stopped));
    let pool = Clients::new();
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            tokio::spawn(client_task(
                pool.clone(),
                server.addr,
                seed,
                next.clone(),
                requests,
            ))
        })
        .collect();
    let mut clients = ClientFigures::default();
    for task in tasks {
        // Each request is bounded; a panic here is a stuck request or a
        // broken expectation, with its plan in the message.
        clients.add(&task.await.expect("client task"));
    }
    drop(pool);
    stop.send(()).unwrap();
    let reporter = reporter.await.unwrap();
    server.drained().await;
    let elapsed = started.elapsed();

    let end = gate.snapshot();
    assert_eq!(end.total, Counts::default(), "held after the run: {end:?}");
    assert_eq!(end.unranked, Counts::default());
    for (rank, counts) in end.ranks.iter().enumerate() {
        assert_eq!(*counts, Counts::default(), "rank {rank}");
    }
    let tally = end.tally;
    assert_eq!(
        tally.received,
        tally.admitted_direct + tally.admitted_queue + tally.rejected() + tally.cancelled,
        "every request ends one way: {tally:?}"
    );
    let mut unranked_and_ranks = end.unranked_tally;
    for rank in &end.rank_tallies {
        unranked_and_ranks.received += rank.received;
    }
    assert_eq!(unranked_and_ranks.received, tally.received);

    let server_now: Vec<u64> = [
        &events.handled,
        &events.panics_in_handler,
        &events.panics_mid_stream,
        &events.server_errors,
        &events.body_errors,
        &events.empty_bodies,
        &events.trailers,
        &events.streams_finished,
    ]
    .iter()
    .map(|counter| read(counter))
    .collect();
    let delta = |index: usize| server_now[index] - server_before[index];
    let figures = RunFigures {
        clients,
        reporter,
        tally: tally.since(&before),
        handled: delta(0),
        panics_in_handler: delta(1),
        panics_mid_stream: delta(2),
        server_errors: delta(3),
        body_errors: delta(4),
        empty_bodies: delta(5),
        trailers: delta(6),
        streams_finished: delta(7),
        elapsed,
        end,
    };
    // Every admitted request reached the handler, and nothing else did.
    assert_eq!(figures.handled, figures.tally.admitted());
    figures
}

fn print_run(label: &str, figures: &RunFigures) {
    let clients = &figures.clients;
    let tally = &figures.tally;
    println!(
        "{label}: {} requests ({} over HTTP/2) in {:.1} s ({:.0}/s)\n\
         \x20 clients: completed {}, overloaded (529) {}, 500 {}, cut by the server {}\n\
         \x20 disconnects injected: {} (half head, before the gate {}; half body {}; \
         gave up waiting for the head {}; after the head, before the first token {}; mid-stream {})\n\
         \x20 server: handled {}, panics injected {} (in the handler {}, mid-stream {}), \
         500s {}, body errors {}, empty bodies {}, trailers {}, streams finished {}\n\
         \x20 engine: {} capacity reports; peak in engine {}, peak queued {}\n\
         \x20 gate tally: received {}, admitted {} (direct {}, from the queue {}), \
         rejected {} (rank {}, worker {}), cancelled {}\n\
         \x20 counts at the end: total {:?}, unranked {:?}, ranks {:?}",
        clients.requests,
        clients.http2,
        figures.elapsed.as_secs_f64(),
        clients.requests as f64 / figures.elapsed.as_secs_f64(),
        clients.completed,
        clients.overloaded,
        clients.server_errors,
        clients.cut_by_server,
        clients.disconnects(),
        clients.half_heads,
        clients.half_bodies,
        clients.gave_up_waiting,
        clients.dropped_after_head,
        clients.dropped_mid_stream,
        figures.handled,
        figures.panics_in_handler + figures.panics_mid_stream,
        figures.panics_in_handler,
        figures.panics_mid_stream,
        figures.server_errors,
        figures.body_errors,
        figures.empty_bodies,
        figures.trailers,
        figures.streams_finished,
        figures.reporter.reports,
        figures.reporter.most_in_engine,
        figures.reporter.most_queued,
        tally.received,
        tally.admitted(),
        tally.admitted_direct,
        tally.admitted_queue,
        tally.rejected(),
        tally.rejected_rank,
        tally.rejected_worker,
        tally.cancelled,
        figures.end.total,
        figures.end.unranked,
        figures.end.ranks,
    );
}

/// Every kind of chaos happened in a run large enough for it.
fn assert_exercised(figures: &RunFigures) {
    let clients = &figures.clients;
    let tally = &figures.tally;
    let happened = [
        ("half heads", clients.half_heads),
        ("half bodies", clients.half_bodies),
        ("give-ups while waiting", clients.gave_up_waiting),
        ("drops before the first token", clients.dropped_after_head),
        ("drops mid-stream", clients.dropped_mid_stream),
        ("panics in the handler", figures.panics_in_handler),
        ("panics mid-stream", figures.panics_mid_stream),
        ("500s", figures.server_errors),
        ("body errors", figures.body_errors),
        ("empty bodies", figures.empty_bodies),
        ("trailers", figures.trailers),
        ("admissions from the queue", tally.admitted_queue),
        ("cancellations while queued", tally.cancelled),
        ("rank-scoped rejections", tally.rejected_rank),
        ("worker-scoped rejections", tally.rejected_worker),
        ("completed streams", clients.completed),
    ];
    for (what, count) in happened {
        assert!(count > 0, "no {what} in {} requests", clients.requests);
    }
}

/// Resident memory of this process, in KiB, after the allocator has given
/// back what it holds free: what stays is what is still allocated, so the
/// comparison between runs measures retention, not the allocator's whims.
fn resident_kib() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's malloc_trim only returns free heap pages to the
        // system; it may be called at any time.
        unsafe {
            malloc_trim(0);
        }
    }
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// A worker whose defaults follow the engine (request limit `max_num_seqs`,
/// queue `2 × max_num_seqs` per rank) with an explicit waiting limit of 6
/// per rank, so that first tokens matter.
fn worker_gate() -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .engine_request_waiting_limit(6)
            .capacity(EngineCapacity::new(8, 2)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak of tens of thousands of requests: CHAOS_REQUESTS=20000 cargo test --release --test chaos -- --ignored"]
async fn chaos_soak() {
    quiet_injected_panics(INJECTED);
    let requests = env_or("CHAOS_REQUESTS", 20_000usize);
    let seed = seed();
    let gate = worker_gate();
    let mut server = serve(&gate).await;
    let rss_start = resident_kib();

    let first = run(&gate, &mut server, requests, seed).await;
    let rss_first = resident_kib();
    print_run("run 1", &first);
    let second = run(&gate, &mut server, requests, seed.wrapping_add(1)).await;
    let rss_second = resident_kib();
    print_run("run 2", &second);
    println!(
        "resident memory: {rss_start} KiB at the start, {rss_first} KiB after run 1, \
         {rss_second} KiB after run 2 ({:+.1}%)",
        (rss_second as f64 - rss_first as f64) * 100.0 / rss_first as f64
    );

    if requests >= 10_000 {
        assert_exercised(&first);
        assert_exercised(&second);
    }
    assert!(
        rss_second * 10 <= rss_first * 11,
        "resident memory grew from {rss_first} KiB to {rss_second} KiB over the second run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_smoke() {
    quiet_injected_panics(INJECTED);
    let seed = seed();
    let gate = worker_gate();
    let mut server = serve(&gate).await;
    let figures = run(
        &gate,
        &mut server,
        env_or("CHAOS_SMOKE_REQUESTS", 400),
        seed,
    )
    .await;
    print_run("smoke", &figures);
}

#[test]
fn plans_are_a_function_of_the_seed_and_index() {
    let (a, b) = (Plan::new(7, 42), Plan::new(7, 42));
    assert_eq!(
        (
            a.handler,
            a.tokens,
            a.act,
            a.ranks.clone(),
            a.http2,
            a.header()
        ),
        (
            b.handler,
            b.tokens,
            b.act,
            b.ranks.clone(),
            b.http2,
            b.header()
        )
    );
}
