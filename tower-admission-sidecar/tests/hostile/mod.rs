//! What the `proxy_hostile_*` tests share: an engine that records every
//! request that reaches it and holds each answer open (so the gate stays
//! full), the sidecar in this process, and clients that send exactly the
//! bytes a hostile client would (raw HTTP/1.1 over a socket, h2c with a
//! `:path` no URL library has touched).

#![allow(dead_code)] // each test file uses its own part

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tower_admission::{AdmissionConfig, Counts, EngineCapacity, Gate};
use tower_admission_sidecar::{self as proxy, Sidecar, Upstream, UpstreamOptions, UpstreamUrl};
use tower_admission_testkit::{PATIENCE, within};

pub use tower_admission_testkit::within as patiently;

/// What reached the engine: each request's method and path, in order.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<Vec<String>>>);

impl Seen {
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

pub struct RecordingEngine {
    pub url: String,
    pub seen: Seen,
    /// Connections the engine has accepted.
    pub connections: Arc<std::sync::atomic::AtomicUsize>,
    _stop: oneshot::Sender<()>,
}

/// Every request is recorded as `METHOD /path` once its whole body has
/// arrived. A `GET`, or a request to a path under `/quick`, is answered
/// `{}` at once; a `POST /flood` with an endless stream; anything else `200` with one
/// event and a stream that stays open until the engine stops: an admitted
/// request holds its slot.
pub async fn recording_engine() -> RecordingEngine {
    let seen = Seen::default();
    async fn record(State(seen): State<Seen>, request: Request) -> Response {
        let line = format!("{} {}", request.method(), request.uri().path());
        let flood = line == "POST /flood";
        let get =
            request.method() == http::Method::GET || request.uri().path().starts_with("/quick");
        let _ = axum::body::to_bytes(request.into_body(), usize::MAX).await;
        seen.0.lock().unwrap().push(line);
        if get {
            return Response::new(AxumBody::from("{}"));
        }
        if flood {
            // Without end, as fast as the reader takes it.
            let chunk = Bytes::from(vec![b'x'; 64 << 10]);
            let flood = futures::stream::repeat_with(move || {
                Ok::<_, std::convert::Infallible>(chunk.clone())
            });
            return Response::new(AxumBody::from_stream(flood));
        }
        let first = futures::stream::once(async {
            Ok::<_, std::convert::Infallible>(Bytes::from_static(b"data: {}\n\n"))
        });
        let open = futures::stream::pending();
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(AxumBody::from_stream(futures::StreamExt::chain(
                first, open,
            )))
            .unwrap()
    }
    let app = Router::new().fallback(record).with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    let listener = axum::serve::ListenerExt::tap_io(listener, move |_| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    RecordingEngine {
        url,
        seen,
        connections,
        _stop: stop,
    }
}

pub struct Running {
    pub address: SocketAddr,
    pub gate: Gate,
    _stop: oneshot::Sender<()>,
}

/// The sidecar in front of `engine`, with the default settings changed by
/// `build`.
pub async fn sidecar(
    gate: Gate,
    engine: &str,
    build: impl FnOnce(proxy::SidecarBuilder) -> proxy::SidecarBuilder,
) -> Running {
    sidecar_with(gate, engine, build, proxy::ConnectionLimits::default()).await
}

/// As [`sidecar`], served with `limits`.
pub async fn sidecar_with(
    gate: Gate,
    engine: &str,
    build: impl FnOnce(proxy::SidecarBuilder) -> proxy::SidecarBuilder,
    limits: proxy::ConnectionLimits,
) -> Running {
    let options = UpstreamOptions {
        response_timeout: Some(Duration::from_secs(30)),
        ..UpstreamOptions::default()
    };
    let upstream = Upstream::new(UpstreamUrl::parse(engine).unwrap(), options);
    let (sidecar, drain) = build(Sidecar::builder(gate.clone(), upstream)).build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(proxy::serve_with(
        listener,
        sidecar,
        drain,
        async {
            let _ = stopped.await;
        },
        Duration::from_secs(1),
        limits,
    ));
    Running {
        address,
        gate,
        _stop: stop,
    }
}

/// `slots` engine slots, `queue` queue places.
pub fn gate(slots: usize, queue: usize) -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .capacity(EngineCapacity::new(slots, 1))
            .request_queue_limit(queue),
    )
}

pub fn totals(gate: &Gate) -> Counts {
    gate.snapshot().total
}

pub const CHAT: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// Sends `POST path` with `body` as exactly these bytes, and reads the
/// response head: its status, its head text, and the connection (still open).
pub async fn post_raw(address: SocketAddr, path: &str, body: &str) -> (u16, String, TcpStream) {
    post_raw_with(address, path, "", body).await
}

/// As [`post_raw`], with extra header lines (each ending in `\r\n`).
pub async fn post_raw_with(
    address: SocketAddr,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String, TcpStream) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: sidecar\r\ncontent-type: application/json\r\n{headers}\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = within(read_head(&mut stream)).await;
    (status_of(&head), head, stream)
}

/// Reads up to the end of a response head (and whatever came with it).
pub async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 4096];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") {
        let read = stream.read(&mut byte).await.unwrap();
        assert!(read > 0, "closed before a response head: {head:?}");
        head.extend_from_slice(&byte[..read]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

pub fn status_of(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// An h2c connection to `address`.
pub async fn h2c(
    address: SocketAddr,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Full<Bytes>> {
    let stream = TcpStream::connect(address).await.unwrap();
    let (send, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    send
}

/// Waits, within the tests' patience, until `condition` holds.
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
