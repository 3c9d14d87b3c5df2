//! The sidecar's proxy (`tower_admission::proxy`) over real sockets: a
//! client (reqwest) → the sidecar → an engine that is a real HTTP server
//! written here (axum), whose every answer the test steps by hand. What
//! depends on a real inference engine is in `tests/llama_cpp.rs`.
#![cfg(all(feature = "proxy", feature = "route"))]

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tower_admission::proxy::{
    self, DiscoveryTiming, ORIGIN, Sidecar, Upstream, UpstreamOptions, UpstreamUrl,
};
use tower_admission::route::OverloadAnswer;
use tower_admission::{AdmissionConfig, Counts, EngineCapacity, Gate, RejectionScope};

use support::within;

// ---------------------------------------------------------------------------
// The engine: a real server whose streams the test drives.

/// A generation request as the engine saw it: its headers, the sender
/// that writes its stream, and a receiver that hears when its response
/// body was dropped before the end (the client, through the sidecar, left).
struct Arrival {
    headers: HeaderMap,
    body: String,
    stream: mpsc::UnboundedSender<Bytes>,
    dropped: oneshot::Receiver<()>,
}

#[derive(Clone)]
struct Engine {
    arrivals: mpsc::UnboundedSender<Arrival>,
    slots: Arc<AtomicUsize>,
    props_reads: Arc<AtomicUsize>,
}

/// Sends on drop, unless disarmed by the stream's end.
struct DropAlarm(Option<oneshot::Sender<()>>);

impl Drop for DropAlarm {
    fn drop(&mut self) {
        if let Some(alarm) = self.0.take() {
            let _ = alarm.send(());
        }
    }
}

async fn generate(State(engine): State<Engine>, headers: HeaderMap, body: String) -> Response {
    let (stream, chunks) = mpsc::unbounded_channel::<Bytes>();
    let (alarm, dropped) = oneshot::channel();
    let _ = engine.arrivals.send(Arrival {
        headers,
        body,
        stream,
        dropped,
    });
    let alarm = DropAlarm(Some(alarm));
    // The stream ends when the test drops the sender; the alarm goes with
    // the body, so dropping the body early sounds it.
    let events = futures::stream::unfold((chunks, alarm), |(mut chunks, mut alarm)| async move {
        match chunks.recv().await {
            Some(chunk) => Some((Ok::<_, Infallible>(chunk), (chunks, alarm))),
            None => {
                alarm.0.take();
                None
            }
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("connection", "x-engine-hop")
        .header("x-engine-hop", "1")
        .body(AxumBody::from_stream(events))
        .unwrap()
}

async fn props(State(engine): State<Engine>) -> Response {
    engine.props_reads.fetch_add(1, Ordering::SeqCst);
    let slots = engine.slots.load(Ordering::SeqCst);
    if slots == 0 {
        // llama.cpp while loading its model.
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":{"message":"Loading model","type":"unavailable_error","code":503}}"#,
        )
            .into_response();
    }
    axum::Json(serde_json::json!({"total_slots": slots, "default_generation_settings": {}}))
        .into_response()
}

struct EngineServer {
    url: String,
    arrivals: mpsc::UnboundedReceiver<Arrival>,
    slots: Arc<AtomicUsize>,
    props_reads: Arc<AtomicUsize>,
    _stop: oneshot::Sender<()>,
}

async fn engine_on(listener: tokio::net::TcpListener, slots: usize) -> EngineServer {
    let (arrivals, arrived) = mpsc::unbounded_channel();
    let engine = Engine {
        arrivals,
        slots: Arc::new(AtomicUsize::new(slots)),
        props_reads: Arc::new(AtomicUsize::new(0)),
    };
    let app = Router::new()
        .route("/v1/chat/completions", post(generate))
        .route(
            "/v1/models",
            get(|| async { r#"{"object":"list","data":[]}"# }),
        )
        .route("/props", get(props))
        .route(
            "/metrics",
            get(|| async { "llamacpp:requests_processing 0\n" }),
        )
        .route(
            "/busy",
            post(|| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [("retry-after", "3")],
                    r#"{"error":{"message":"busy","code":503}}"#,
                )
            }),
        )
        .route("/slow", post(std::future::pending::<&'static str>))
        .with_state(engine.clone());
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    EngineServer {
        url,
        arrivals: arrived,
        slots: engine.slots,
        props_reads: engine.props_reads,
        _stop: stop,
    }
}

async fn engine(slots: usize) -> EngineServer {
    engine_on(
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        slots,
    )
    .await
}

// ---------------------------------------------------------------------------
// The sidecar, in this process.

struct Running {
    url: String,
    gate: Gate,
    stop: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
}

fn options() -> UpstreamOptions {
    UpstreamOptions {
        response_timeout: Some(Duration::from_secs(30)),
        ..UpstreamOptions::default()
    }
}

async fn sidecar(
    gate: Gate,
    upstream: &str,
    options: UpstreamOptions,
    build: impl FnOnce(proxy::SidecarBuilder) -> proxy::SidecarBuilder,
) -> Running {
    let upstream = Upstream::new(UpstreamUrl::parse(upstream).unwrap(), options);
    let (sidecar, drain) = build(Sidecar::builder(gate.clone(), upstream)).build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address: SocketAddr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        proxy::serve(
            listener,
            sidecar,
            drain,
            async {
                let _ = stopped.await;
            },
            Duration::from_secs(20),
        )
        .await;
    });
    Running {
        url: format!("http://{address}"),
        gate,
        stop: Some(stop),
        served,
    }
}

/// One engine slot, one queue place.
fn small_gate() -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .capacity(EngineCapacity::new(1, 1))
            .request_queue_limit(1),
    )
}

fn chat_body() -> &'static str {
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

async fn chat(client: &reqwest::Client, url: &str) -> reqwest::Response {
    client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat_body())
        .send()
        .await
        .unwrap()
}

/// Waits, within the test's patience, until `condition` holds.
async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + support::PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn totals(gate: &Gate) -> Counts {
    gate.snapshot().total
}

const ROLE: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n";
const TOKEN: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";

// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_burst_gets_the_engine_slot_one_queue_place_and_a_529_while_the_engine_sees_one() {
    let mut engine = engine(1).await;
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| b).await;
    let client = client();

    let first = within(chat(&client, &sidecar.url)).await;
    assert_eq!(first.status(), 200);
    let running = within(engine.arrivals.recv()).await.unwrap();

    // The second waits in the sidecar: the engine never hears of it.
    let second = tokio::spawn({
        let (client, url) = (client.clone(), sidecar.url.clone());
        async move { chat(&client, &url).await }
    });
    until("the second request is queued", || {
        totals(&sidecar.gate).queued == 1
    })
    .await;
    assert!(engine.arrivals.try_recv().is_err());

    // The third finds the queue full: an overload answer at once.
    let third = within(chat(&client, &sidecar.url)).await;
    assert_eq!(third.status(), 529);
    let answer = OverloadAnswer::from_head(third.status(), third.headers()).unwrap();
    assert_eq!(answer.scope, RejectionScope::Worker);
    assert!(!third.headers().contains_key(ORIGIN));
    let json: serde_json::Value = third.json().await.unwrap();
    assert_eq!(json["error"]["type"], "overloaded");

    // The first streams to its end through the sidecar: the slot frees and
    // the queued request reaches the engine.
    let mut stream = first.bytes_stream();
    running
        .stream
        .send(Bytes::from_static(ROLE.as_bytes()))
        .unwrap();
    assert_eq!(
        within(stream.next()).await.unwrap().unwrap(),
        ROLE.as_bytes()
    );
    assert_eq!(
        totals(&sidecar.gate).engine_waiting,
        1,
        "a role chunk is not a token"
    );
    running
        .stream
        .send(Bytes::from_static(TOKEN.as_bytes()))
        .unwrap();
    assert_eq!(
        within(stream.next()).await.unwrap().unwrap(),
        TOKEN.as_bytes()
    );
    until("the first token ends waiting", || {
        totals(&sidecar.gate).engine_waiting == 0
    })
    .await;
    running
        .stream
        .send(Bytes::from_static(DONE.as_bytes()))
        .unwrap();
    drop(running.stream);
    let mut rest = Vec::new();
    while let Some(chunk) = within(stream.next()).await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(rest, DONE.as_bytes());

    let next = within(engine.arrivals.recv()).await.unwrap();
    assert_eq!(
        next.body,
        chat_body(),
        "the body reaches the engine as sent"
    );
    drop(next.stream);
    let second = within(second).await.unwrap();
    assert_eq!(second.status(), 200);
    assert!(within(second.bytes()).await.unwrap().is_empty());
    until("everything released", || {
        totals(&sidecar.gate) == Counts::new(0, 0, 0)
    })
    .await;
    let tally = sidecar.gate.snapshot().tally;
    assert_eq!(
        (
            tally.admitted_direct,
            tally.admitted_queue,
            tally.rejected_worker
        ),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn other_routes_pass_straight_through_even_when_the_gate_is_full() {
    let mut engine = engine(1).await;
    let gate = Gate::new(
        AdmissionConfig::new()
            .capacity(EngineCapacity::new(1, 1))
            .request_queue_limit(0),
    );
    let sidecar = sidecar(gate, &engine.url, options(), |b| b).await;
    let client = client();
    let held = within(chat(&client, &sidecar.url)).await;
    let _running = within(engine.arrivals.recv()).await.unwrap();
    assert_eq!(within(chat(&client, &sidecar.url)).await.status(), 529);

    let models = within(client.get(format!("{}/v1/models", sidecar.url)).send())
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
    assert_eq!(
        models.text().await.unwrap(),
        r#"{"object":"list","data":[]}"#
    );
    // A GET to a generation path is not a generation: the engine answers.
    let get = within(
        client
            .get(format!("{}/v1/chat/completions", sidecar.url))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(get.status(), 405);
    assert_eq!(get.headers()[ORIGIN], "engine");
    assert_eq!(totals(&sidecar.gate).engine_requests, 1);
    drop(held);
}

#[tokio::test]
async fn client_headers_that_steer_the_gate_are_removed_unless_a_router_is_trusted() {
    for trusted in [false, true] {
        let mut engine = engine(1).await;
        let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(2, 2)));
        let sidecar = sidecar(gate, &engine.url, options(), |b| {
            b.trust_router_headers(trusted)
        })
        .await;
        let response = within(
            client()
                .post(format!("{}/v1/chat/completions", sidecar.url))
                .header("x-data-parallel-rank", "1")
                .header("x-admission-priority", "100")
                .header("x-admission-tenant", "someone-else")
                .header("x-admission-deadline-ms", "5000")
                .header("authorization", "Bearer k")
                .header("connection", "x-secret-hop")
                .header("x-secret-hop", "1")
                .body(chat_body())
                .send(),
        )
        .await
        .unwrap();
        let arrival = within(engine.arrivals.recv()).await.unwrap();
        let seen = &arrival.headers;
        assert_eq!(seen["authorization"], "Bearer k");
        assert!(
            !seen.contains_key("x-secret-hop"),
            "hop-by-hop header forwarded"
        );
        assert_eq!(
            seen["host"],
            engine.url.strip_prefix("http://").unwrap(),
            "host is the engine's"
        );
        for steering in [
            "x-data-parallel-rank",
            "x-admission-priority",
            "x-admission-tenant",
            "x-admission-deadline-ms",
        ] {
            assert_eq!(
                seen.contains_key(steering),
                trusted,
                "{steering}, trusted {trusted}"
            );
        }
        // The rank header steered the gate only when trusted.
        let snapshot = sidecar.gate.snapshot();
        let ranked = snapshot.ranks[1].engine_requests;
        assert_eq!(ranked, usize::from(trusted), "trusted {trusted}");
        assert_eq!(snapshot.unranked.engine_requests, usize::from(!trusted));
        // The engine's hop-by-hop response header stays on its hop.
        assert!(!response.headers().contains_key("x-engine-hop"));
        drop(arrival.stream);
        within(response.bytes()).await.unwrap();
    }
}

#[tokio::test]
async fn an_unreachable_engine_is_a_502_that_releases_its_capacity() {
    // A port nobody listens on: bound, then closed.
    let closed = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let sidecar = sidecar(small_gate(), &closed, options(), |b| b).await;
    let response = within(chat(&client(), &sidecar.url)).await;
    assert_eq!(response.status(), 502);
    assert_eq!(response.headers()[ORIGIN], "proxy");
    assert_eq!(response.headers()["content-type"], "application/json");
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["error"]["code"], 502);
    assert_eq!(json["error"]["type"], "upstream_unreachable");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unreachable"),
        "{json}"
    );
    until("the capacity is released", || {
        totals(&sidecar.gate) == Counts::new(0, 0, 0)
    })
    .await;
    // Not a gate overload: a frontend must not read it as one.
    let tally = sidecar.gate.snapshot().tally;
    assert_eq!((tally.rejected_rank, tally.rejected_worker), (0, 0));
}

#[tokio::test]
async fn an_engine_that_sends_no_head_in_time_is_a_504() {
    let engine = engine(1).await;
    let options = UpstreamOptions {
        response_timeout: Some(Duration::from_millis(200)),
        ..UpstreamOptions::default()
    };
    let sidecar = sidecar(small_gate(), &engine.url, options, |b| {
        b.admit_paths(["/slow"])
    })
    .await;
    let response = within(client().post(format!("{}/slow", sidecar.url)).send())
        .await
        .unwrap();
    assert_eq!(response.status(), 504);
    assert_eq!(response.headers()[ORIGIN], "proxy");
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["error"]["type"], "upstream_timeout");
    until("the capacity is released", || {
        totals(&sidecar.gate) == Counts::new(0, 0, 0)
    })
    .await;
}

#[tokio::test]
async fn the_engine_s_own_overload_passes_through_marked_as_the_engine_s() {
    let engine = engine(1).await;
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| {
        b.admit_paths(["/busy"])
    })
    .await;
    let response = within(client().post(format!("{}/busy", sidecar.url)).send())
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()[ORIGIN], "engine");
    assert_eq!(response.headers()["retry-after"], "3");
    assert!(
        !response
            .headers()
            .contains_key("x-admission-rejection-scope")
    );
    let answer = OverloadAnswer::from_head(response.status(), response.headers()).unwrap();
    assert!(!answer.from_gate, "the engine's 503 is not the gate's");
    assert_eq!(
        response.text().await.unwrap(),
        r#"{"error":{"message":"busy","code":503}}"#
    );
}

#[tokio::test]
async fn a_streaming_client_that_leaves_closes_the_engine_request_and_frees_the_gate() {
    let mut engine = engine(1).await;
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| b).await;
    let response = within(chat(&client(), &sidecar.url)).await;
    let arrival = within(engine.arrivals.recv()).await.unwrap();
    arrival
        .stream
        .send(Bytes::from_static(TOKEN.as_bytes()))
        .unwrap();
    let mut stream = response.bytes_stream();
    within(stream.next()).await.unwrap().unwrap();
    assert_eq!(totals(&sidecar.gate).engine_requests, 1);

    drop(stream); // the client leaves mid-stream
    within(arrival.dropped)
        .await
        .expect("the engine's response body is dropped: its connection closed");
    until("the gate releases the request", || {
        totals(&sidecar.gate) == Counts::new(0, 0, 0)
    })
    .await;
    assert_eq!(sidecar.gate.snapshot().tally.admitted_direct, 1);
}

#[tokio::test]
async fn a_queued_client_that_leaves_never_reaches_the_engine() {
    let mut engine = engine(1).await;
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| b).await;
    let client = client();
    let first = within(chat(&client, &sidecar.url)).await;
    let running = within(engine.arrivals.recv()).await.unwrap();

    let queued = tokio::spawn({
        let (client, url) = (client.clone(), sidecar.url.clone());
        async move { chat(&client, &url).await }
    });
    until("queued", || totals(&sidecar.gate).queued == 1).await;
    queued.abort(); // the client gives up
    until("the queue place is freed", || {
        totals(&sidecar.gate).queued == 0
    })
    .await;
    assert_eq!(sidecar.gate.snapshot().tally.cancelled, 1);

    // The slot frees; nothing was waiting for it, so the engine hears of
    // no one else.
    drop(running.stream);
    within(first.bytes()).await.unwrap();
    until("idle", || totals(&sidecar.gate) == Counts::new(0, 0, 0)).await;
    assert!(engine.arrivals.try_recv().is_err());
}

#[tokio::test]
async fn capacity_is_learned_from_the_engine_and_read_again_when_it_restarts() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    // Loading: every route answers 503, as llama.cpp does.
    let engine = engine_on(listener, 0).await;
    let gate = Gate::new(AdmissionConfig::new());
    let upstream = Upstream::new(UpstreamUrl::parse(&engine.url).unwrap(), options());
    let timing = DiscoveryTiming {
        interval: Duration::from_secs(3600),
        retry: Duration::from_millis(20),
        timeout: Duration::from_secs(2),
    };
    let discovery = proxy::discover_capacity(gate.clone(), &upstream, timing, None);
    until("the engine was asked while loading", || {
        engine.props_reads.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert_eq!(gate.snapshot().capacity, None, "no report while loading");
    assert_eq!(
        gate.limits().engine_request_limit,
        tower_admission::DEFAULT_ENGINE_LIMIT
    );

    engine.slots.store(3, Ordering::SeqCst);
    until("the capacity is reported", || {
        gate.snapshot().capacity == Some(EngineCapacity::new(3, 1))
    })
    .await;
    assert_eq!(gate.limits().engine_request_limit, 3);
    assert_eq!(gate.limits().request_queue_limit, 6);

    // The engine restarts with other settings, on the same address. A
    // request that finds it gone makes the sidecar ask again at once,
    // though the next scheduled read is an hour away.
    drop(engine);
    let (sidecar, _drain) = Sidecar::builder(gate.clone(), upstream.clone()).build();
    loop {
        use tower::ServiceExt;
        let request = http::Request::post("/v1/chat/completions")
            .body(http_body_util::Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let response = within(sidecar.clone().oneshot(request)).await.unwrap();
        if response.status() == 502 {
            break;
        }
    }
    let restarted = engine_on(tokio::net::TcpListener::bind(address).await.unwrap(), 5).await;
    until("the new capacity is reported", || {
        gate.snapshot().capacity == Some(EngineCapacity::new(5, 1))
    })
    .await;
    assert!(restarted.props_reads.load(Ordering::SeqCst) >= 1);
    discovery.abort();
}

#[tokio::test]
async fn metrics_serve_the_gate_s_series_and_optionally_the_engine_s() {
    let engine = engine(1).await;
    for merge in [false, true] {
        let sidecar = sidecar(small_gate(), &engine.url, options(), |b| {
            b.metrics(Arc::new(|| "gate_series 1\n".to_owned()))
                .merge_engine_metrics(merge)
        })
        .await;
        let response = within(client().get(format!("{}/metrics", sidecar.url)).send())
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
        let text = response.text().await.unwrap();
        let expected = if merge {
            "gate_series 1\nllamacpp:requests_processing 0\n"
        } else {
            "gate_series 1\n"
        };
        assert_eq!(text, expected);
    }
    // Without a renderer /metrics is the engine's, like any other route.
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| b).await;
    let text = within(client().get(format!("{}/metrics", sidecar.url)).send())
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(text, "llamacpp:requests_processing 0\n");
}

#[tokio::test]
async fn at_shutdown_queued_requests_get_503_and_running_streams_finish() {
    let mut engine = engine(1).await;
    let mut sidecar = sidecar(small_gate(), &engine.url, options(), |b| b).await;
    let client = client();
    let first = within(chat(&client, &sidecar.url)).await;
    let running = within(engine.arrivals.recv()).await.unwrap();
    let queued = tokio::spawn({
        let (client, url) = (client.clone(), sidecar.url.clone());
        async move { chat(&client, &url).await }
    });
    until("queued", || totals(&sidecar.gate).queued == 1).await;

    let _ = sidecar.stop.take().unwrap().send(());
    let queued = within(queued).await.unwrap();
    assert_eq!(queued.status(), 503);
    assert_eq!(queued.headers()["x-admission-rejection-reason"], "shutdown");
    assert_eq!(queued.headers()["x-admission-rejection-scope"], "worker");
    assert!(
        engine.arrivals.try_recv().is_err(),
        "the queued request never ran"
    );
    // New connections are refused.
    assert!(
        client
            .post(format!("{}/v1/chat/completions", sidecar.url))
            .body(chat_body())
            .send()
            .await
            .is_err()
    );

    // The running stream still finishes, then the server stops.
    running
        .stream
        .send(Bytes::from_static(TOKEN.as_bytes()))
        .unwrap();
    running
        .stream
        .send(Bytes::from_static(DONE.as_bytes()))
        .unwrap();
    drop(running.stream);
    let body = within(first.bytes()).await.unwrap();
    assert_eq!(body, format!("{TOKEN}{DONE}").as_bytes());
    within(&mut sidecar.served).await.unwrap();
}

// ---------------------------------------------------------------------------
// The binary's flags.

fn sidecar_binary(args: &[&str]) -> (std::process::ExitStatus, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tower-admission"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn invalid_flags_fail_at_startup_naming_the_flag_and_the_value() {
    for (args, flag, value) in [
        (
            &["--upstream", "https://engine:8000"][..],
            "--upstream",
            "https://engine:8000",
        ),
        (
            &["--upstream", "engine:8000"][..],
            "--upstream",
            "engine:8000",
        ),
        (
            &["--upstream", "http://e", "--engine-request-limit", "0"][..],
            "--engine-request-limit",
            "0",
        ),
        (
            &["--upstream", "http://e", "--max-num-seqs", "-4"][..],
            "--max-num-seqs",
            "-4",
        ),
        (
            &["--upstream", "http://e", "--admit-path", "v1/chat"][..],
            "--admit-path",
            "v1/chat",
        ),
        (
            &["--upstream", "http://e", "--overload-status", "200"][..],
            "--overload-status",
            "200",
        ),
    ] {
        let (status, stderr) = sidecar_binary(args);
        assert!(!status.success(), "{args:?} started");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(stderr.contains(value), "{args:?}: {stderr}");
    }
    let (status, stderr) = sidecar_binary(&[]);
    assert!(!status.success());
    assert!(stderr.contains("--upstream"), "{stderr}");
}

#[test]
fn help_lists_the_sidecar_and_admission_flags() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tower-admission"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--listen",
        "--upstream",
        "--max-num-seqs",
        "--data-parallel-size",
        "--admit-path",
        "--trust-router-headers",
        "--merge-engine-metrics",
        "--engine-request-limit",
        "--request-queue-limit",
        "--ttft-objective-ms",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
}

// ---------------------------------------------------------------------------
// HTTP/2 and hostile heads.

#[tokio::test]
async fn h2c_clients_and_h2c_engines_stream_through() {
    use http_body_util::BodyExt;
    let mut engine = engine(1).await;
    let options = UpstreamOptions {
        h2c: true,
        ..options()
    };
    let sidecar = sidecar(small_gate(), &engine.url, options, |b| b).await;
    let address = sidecar.url.strip_prefix("http://").unwrap().to_owned();
    let stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let (mut send, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let request = http::Request::post(format!("{}/v1/chat/completions", sidecar.url))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from_static(
            chat_body().as_bytes(),
        )))
        .unwrap();
    let response = within(send.send_request(request)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), http::Version::HTTP_2);
    let arrival = within(engine.arrivals.recv()).await.unwrap();
    assert_eq!(arrival.body, chat_body());
    assert!(
        !arrival.headers.contains_key("host"),
        "HTTP/2 carries the authority"
    );
    arrival
        .stream
        .send(Bytes::from_static(TOKEN.as_bytes()))
        .unwrap();
    let mut body = response.into_body();
    let frame = within(body.frame()).await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), TOKEN.as_bytes());
    until("the first token ends waiting", || {
        totals(&sidecar.gate).engine_waiting == 0
    })
    .await;
    drop(arrival.stream);
    while within(body.frame()).await.is_some() {}
    until("released", || totals(&sidecar.gate) == Counts::new(0, 0, 0)).await;
}

#[tokio::test]
async fn a_huge_header_is_refused_before_it_takes_anything() {
    let mut engine = engine(1).await;
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| b).await;
    let client = client();
    for (name, value) in [
        ("x-long", "a".repeat(1 << 20)),
        ("x-data-parallel-rank", "9".repeat(1 << 20)),
    ] {
        let response = client
            .post(format!("{}/v1/chat/completions", sidecar.url))
            .header(name, value)
            .body(chat_body())
            .send()
            .await;
        // hyper answers 431 or closes the connection; either way nothing
        // reached the gate or the engine.
        if let Ok(response) = response {
            assert_eq!(response.status(), 431, "{name}");
        }
    }
    let mut many = client.post(format!("{}/v1/chat/completions", sidecar.url));
    for n in 0..500 {
        many = many.header(format!("x-h{n}"), "1");
    }
    if let Ok(response) = many.body(chat_body()).send().await {
        assert_eq!(response.status(), 431);
    }
    assert_eq!(sidecar.gate.snapshot().tally.received, 0);
    assert!(engine.arrivals.try_recv().is_err());
    // The sidecar still serves.
    let response = within(chat(&client, &sidecar.url)).await;
    assert_eq!(response.status(), 200);
    drop(within(engine.arrivals.recv()).await.unwrap().stream);
    within(response.bytes()).await.unwrap();
}

#[tokio::test]
async fn an_oversized_body_with_cost_estimation_is_413_before_admission() {
    let mut engine = engine(1).await;
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| {
        b.estimate_cost(true)
    })
    .await;
    let big = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "a".repeat(tower_admission::http::DEFAULT_MAX_BODY_BYTES + 1)
    );
    let response = within(
        client()
            .post(format!("{}/v1/chat/completions", sidecar.url))
            .body(big)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 413);
    assert_eq!(sidecar.gate.snapshot().tally.received, 0);
    // A body within bounds is read, weighed, and passed on unchanged.
    let response = within(chat(&client(), &sidecar.url)).await;
    assert_eq!(response.status(), 200);
    let arrival = within(engine.arrivals.recv()).await.unwrap();
    assert_eq!(arrival.body, chat_body());
    drop(arrival.stream);
    within(response.bytes()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_takes_its_capacity_from_the_flag_and_drains_on_sigterm() {
    let mut engine = engine(1).await;
    let mut process = support::Process::spawn(
        env!("CARGO_BIN_EXE_tower-admission").as_ref(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &engine.url,
            "--max-num-seqs",
            "1",
            "--request-queue-limit",
            "1",
            "--capacity-poll-interval-ms",
            "600000",
        ],
        &[],
    );
    let url = process.listening_url();
    let banner = process.wait_for_stdout("banner", |text| {
        text.contains("admitted: POST").then(|| text.to_owned())
    });
    assert!(
        banner.contains("capacity: from --max-num-seqs 1 and 1 rank(s)"),
        "{banner}"
    );
    assert!(banner.contains("engine request limit 1,"), "{banner}");

    let client = client();
    let first = within(chat(&client, &url)).await;
    let running = within(engine.arrivals.recv()).await.unwrap();
    let queued = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { chat(&client, &url).await }
    });
    // The engine never reports: /props here says one slot, and the flag
    // wins anyway. Wait for the queue through the sidecar's own metrics.
    let deadline = tokio::time::Instant::now() + support::PATIENCE;
    let text = loop {
        let text = within(client.get(format!("{url}/metrics")).send())
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let queued_line = format!(
            "{}_request_queue_count{{dp_rank=\"unspecified\"}} 1",
            tower_admission::metrics::DEFAULT_PREFIX
        );
        if text.contains(&queued_line) {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never queued:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The sidecar records the saturation gauge for routers and autoscalers:
    // with its one slot taken and a request queued the worker is busy.
    let saturation = text
        .lines()
        .find_map(|line| {
            line.strip_prefix(&format!(
                "{}_saturation{{dp_rank=\"unspecified\"}} ",
                tower_admission::metrics::DEFAULT_PREFIX
            ))
        })
        .unwrap_or_else(|| panic!("no saturation gauge:\n{text}"));
    let saturation: f64 = saturation.parse().unwrap();
    assert!(saturation > 0.0 && saturation <= 1.0, "{saturation}");

    process.terminate();
    let queued = within(queued).await.unwrap();
    assert_eq!(queued.status(), 503);
    assert_eq!(queued.headers()["x-admission-rejection-reason"], "shutdown");
    running
        .stream
        .send(Bytes::from_static(DONE.as_bytes()))
        .unwrap();
    drop(running.stream);
    assert_eq!(within(first.bytes()).await.unwrap(), DONE.as_bytes());
    let (status, _, stderr) = tokio::task::spawn_blocking(move || process.wait())
        .await
        .unwrap();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("shutting down"), "{stderr}");
}

/// An engine that answers as vLLM's OpenAI server does to a client asking
/// for its capacity: models `owned_by` vllm, and no capacity route.
async fn vllm_like() -> (String, oneshot::Sender<()>) {
    let app = Router::new().route(
        "/v1/models",
        get(|| async {
            axum::Json(serde_json::json!({
                "object": "list",
                "data": [{"id": "m", "object": "model", "owned_by": "vllm", "max_model_len": 4096}],
            }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    (url, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_front_of_vllm_the_binary_requires_max_num_seqs() {
    let (url, _stop) = vllm_like().await;
    let upstream = Upstream::new(UpstreamUrl::parse(&url).unwrap(), options());
    assert_eq!(
        proxy::ask_engine(&upstream, Duration::from_secs(2)).await,
        proxy::EngineReport::Silent(proxy::EngineKind::Vllm)
    );

    let binary = env!("CARGO_BIN_EXE_tower-admission");
    let mut refused = support::Process::spawn(
        binary.as_ref(),
        &["--listen", "127.0.0.1:0", "--upstream", &url],
        &[],
    );
    let (status, _, stderr) = tokio::task::spawn_blocking(move || refused.wait())
        .await
        .unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("vLLM") && stderr.contains("--max-num-seqs"),
        "{stderr}"
    );

    let started = support::Process::spawn(
        binary.as_ref(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &url,
            "--max-num-seqs",
            "8",
        ],
        &[],
    );
    let banner = started.wait_for_stdout("banner", |text| {
        text.contains("admitted: POST").then(|| text.to_owned())
    });
    assert!(
        banner.contains("capacity: from --max-num-seqs 8"),
        "{banner}"
    );
}

#[tokio::test]
async fn with_a_context_length_a_prompt_beyond_it_is_400_before_admission() {
    let mut engine = engine(1).await;
    let cost = tower_admission::http::OpenAiCostLayer::new().max_model_len(10);
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| b.cost_layer(cost)).await;
    let long = format!(
        r#"{{"model":"m","stream":true,"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "word ".repeat(100)
    );
    let response = within(
        client()
            .post(format!("{}/v1/chat/completions", sidecar.url))
            .body(long)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 400);
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["error"]["type"], "invalid_request_error");
    assert_eq!(sidecar.gate.snapshot().tally.received, 0);
    assert!(engine.arrivals.try_recv().is_err());
}
