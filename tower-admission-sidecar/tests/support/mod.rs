//! What the sidecar's tests share: an engine that is a real HTTP server
//! whose every answer the test steps by hand, the sidecar started in this
//! process in front of it, and a client; with the workspace's test kit
//! (deadlines, child processes) handed on.

#![allow(dead_code)] // each test binary uses part of it

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
use tokio::sync::{mpsc, oneshot};
use tower_admission::{AdmissionConfig, Counts, EngineCapacity, Gate};
use tower_admission_sidecar::{self as proxy, Sidecar, Upstream, UpstreamOptions, UpstreamUrl};

#[allow(unused_imports)] // each test binary uses part of it
pub use tower_admission_testkit::{PATIENCE, Process, within};

// ---------------------------------------------------------------------------
// The engine: a real server whose streams the test drives.

/// A generation request as the engine saw it: its headers, the sender
/// that writes its stream, and a receiver that hears when its response
/// body was dropped before the end (the client, through the sidecar, left).
pub struct Arrival {
    pub headers: HeaderMap,
    pub body: String,
    pub stream: mpsc::UnboundedSender<Bytes>,
    pub dropped: oneshot::Receiver<()>,
}

#[derive(Clone)]
pub struct Engine {
    pub arrivals: mpsc::UnboundedSender<Arrival>,
    pub slots: Arc<AtomicUsize>,
    pub props_reads: Arc<AtomicUsize>,
}

/// Sends on drop, unless disarmed by the stream's end.
pub struct DropAlarm(Option<oneshot::Sender<()>>);

impl Drop for DropAlarm {
    fn drop(&mut self) {
        if let Some(alarm) = self.0.take() {
            let _ = alarm.send(());
        }
    }
}

pub async fn generate(State(engine): State<Engine>, headers: HeaderMap, body: String) -> Response {
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

pub async fn props(State(engine): State<Engine>) -> Response {
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

pub struct EngineServer {
    pub url: String,
    pub arrivals: mpsc::UnboundedReceiver<Arrival>,
    pub slots: Arc<AtomicUsize>,
    pub props_reads: Arc<AtomicUsize>,
    pub _stop: oneshot::Sender<()>,
}

pub async fn engine_on(listener: tokio::net::TcpListener, slots: usize) -> EngineServer {
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

pub async fn engine(slots: usize) -> EngineServer {
    engine_on(
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        slots,
    )
    .await
}

// ---------------------------------------------------------------------------
// The sidecar, in this process.

pub struct Running {
    pub url: String,
    pub gate: Gate,
    pub stop: Option<oneshot::Sender<()>>,
    pub served: tokio::task::JoinHandle<()>,
}

pub fn options() -> UpstreamOptions {
    UpstreamOptions {
        response_timeout: Some(Duration::from_secs(30)),
        ..UpstreamOptions::default()
    }
}

pub async fn sidecar(
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

/// As [`sidecar`], served by [`proxy::serve_threads`] on `threads` threads
/// of its own, forwarding with a pool of engine connections per thread.
pub async fn sidecar_on_threads(
    gate: Gate,
    upstream: &str,
    threads: usize,
    build: impl FnOnce(proxy::SidecarBuilder) -> proxy::SidecarBuilder,
) -> Running {
    let upstream =
        Upstream::new(UpstreamUrl::parse(upstream).unwrap(), options()).pool_per_thread();
    let (sidecar, drain) = build(Sidecar::builder(gate.clone(), upstream)).build();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address: SocketAddr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        proxy::serve_threads(
            listener,
            std::num::NonZeroUsize::new(threads).unwrap(),
            sidecar,
            drain,
            async {
                let _ = stopped.await;
            },
            Duration::from_secs(20),
            proxy::ConnectionLimits::default(),
        )
        .await
        .unwrap();
    });
    Running {
        url: format!("http://{address}"),
        gate,
        stop: Some(stop),
        served,
    }
}

/// One engine slot, one queue place.
pub fn small_gate() -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .capacity(EngineCapacity::new(1, 1))
            .request_queue_limit(1),
    )
}

pub fn chat_body() -> &'static str {
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

pub async fn chat(client: &reqwest::Client, url: &str) -> reqwest::Response {
    client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat_body())
        .send()
        .await
        .unwrap()
}

/// Waits, within the test's patience, until `condition` holds.
pub async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn totals(gate: &Gate) -> Counts {
    gate.snapshot().total
}

pub const ROLE: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n";
pub const TOKEN: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
pub const DONE: &str = "data: [DONE]\n\n";
