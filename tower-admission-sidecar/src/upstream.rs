//! [`Upstream`]: forwards a request to the engine and its response back,
//! streaming both ways, over a pool of HTTP/1.1 connections of its own
//! ([`engine_conn`](super::engine_conn)), or hyper's pooled client for h2c.

use std::cell::RefCell;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::sync::Notify;
use tower_service::Service;

use super::answer::json_error;
use super::body::Body;
use super::engine_conn::{Pool, SendError, closed_unanswered};
use tower_admission::http::ORIGIN;

/// The engine's base URL: `http://host:port`, optionally with a path prefix
/// (`http://host:port/engine`) put in front of every forwarded path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    authority: Authority,
    prefix: String,
    /// `Host` for the engine: made once, shared by every request.
    host: HeaderValue,
}

impl UpstreamUrl {
    /// Reads a base URL. Only `http` is spoken: the engine runs on the same
    /// host or pod, so there is no TLS to it.
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url
            .trim()
            .parse()
            .map_err(|error| format!("invalid upstream URL {url:?}: {error}"))?;
        match uri.scheme() {
            Some(scheme) if *scheme == Scheme::HTTP => {}
            Some(scheme) => {
                return Err(format!(
                    "invalid upstream URL {url:?}: scheme {scheme} is not supported, only http \
                     (the engine runs beside the sidecar)"
                ));
            }
            None => {
                return Err(format!(
                    "invalid upstream URL {url:?}: give the scheme, e.g. http://127.0.0.1:8080"
                ));
            }
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("invalid upstream URL {url:?}: no host"))?;
        if uri.query().is_some() {
            return Err(format!(
                "invalid upstream URL {url:?}: a base URL has no query"
            ));
        }
        let prefix = uri.path().trim_end_matches('/').to_owned();
        let host = HeaderValue::from_str(authority.as_str())
            .expect("an authority is a valid header value");
        Ok(UpstreamUrl {
            authority,
            prefix,
            host,
        })
    }

    /// The engine's URL for a request's path and query.
    pub fn join(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        let joined = format!("{}{}", self.prefix, path_and_query);
        let path: PathAndQuery = joined.parse()?;
        self.with_path(path)
    }

    /// The engine's path and query for a request's URI: moved over as
    /// they are when the base URL has no path (nothing parsed, nothing
    /// copied), else behind the base URL's path.
    fn path_for(&self, uri: Uri) -> Result<PathAndQuery, http::Error> {
        match uri.into_parts().path_and_query {
            Some(path) if self.prefix.is_empty() => Ok(path),
            path => {
                let path = path.as_ref().map_or("/", PathAndQuery::as_str);
                Ok(format!("{}{}", self.prefix, path).parse()?)
            }
        }
    }

    /// The engine's URL for a request's URI, in absolute form (HTTP/2
    /// carries the authority in it).
    fn join_uri(&self, uri: Uri) -> Result<Uri, http::Error> {
        self.with_path(self.path_for(uri)?)
    }

    /// The same in origin form, as HTTP/1.1 sends it to a server (the
    /// authority goes in `Host`).
    fn origin_uri(&self, uri: Uri) -> Result<Uri, http::Error> {
        Ok(Uri::from(self.path_for(uri)?))
    }

    fn with_path(&self, path: PathAndQuery) -> Result<Uri, http::Error> {
        Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(self.authority.clone())
            .path_and_query(path)
            .build()
    }

    /// The engine's host and port, as sent in `Host`.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }
}

impl std::fmt::Display for UpstreamUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.authority, self.prefix)
    }
}

/// How the sidecar talks to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamOptions {
    /// Speak HTTP/2 without TLS (h2c, prior knowledge) instead of HTTP/1.1.
    pub h2c: bool,
    /// How long connecting may take before the answer is `504`.
    pub connect_timeout: Duration,
    /// How long the engine may take to send its response head before the
    /// answer is `504`; a non-streaming answer's head comes only when it is
    /// whole, so this bounds a whole non-streaming generation. `None`: no
    /// bound.
    pub response_timeout: Option<Duration>,
}

impl Default for UpstreamOptions {
    fn default() -> Self {
        UpstreamOptions {
            h2c: false,
            connect_timeout: Duration::from_secs(2),
            response_timeout: Some(Duration::from_secs(600)),
        }
    }
}

/// How long an idle engine connection is kept: below the 5 s after which
/// llama.cpp and uvicorn close an idle connection themselves.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(2);

/// Idle engine connections kept at most: enough for the streams of a busy
/// worker to reuse theirs (as nginx's `keepalive 512` per worker does); an
/// idle one costs a file descriptor and a few KiB.
const POOL_MAX_IDLE: usize = 512;

/// A request body the sidecar holds whole (read before admission, or
/// empty), set on the request's extensions: the request can be sent again.
#[derive(Debug, Clone)]
pub(crate) struct Replayable(pub(crate) bytes::Bytes);

/// Forwards requests to one engine. `Clone` shares the connection pool.
///
/// * Hop-by-hop headers (`connection` and those it names, `keep-alive`,
///   `proxy-*`, `te` other than `trailers`, `trailer`, `transfer-encoding`,
///   `upgrade`) are dropped both ways; `host` becomes the engine's.
/// * Bodies stream both ways, frame by frame. Dropping the response body
///   (the client left) drops the engine connection it came on, so the
///   engine sees the disconnect and aborts the request; dropping the
///   response future before the head arrived does the same.
/// * An engine that cannot be reached gets the client a `502`, one that
///   takes too long a `504`, both with an OpenAI-style JSON error and
///   `x-admission-origin: proxy`. The engine's own error answers (its
///   `503` while loading, a `429`) pass through with
///   `x-admission-origin: engine`, so a frontend can tell them from the
///   gate's overload answers (which carry `x-admission-rejection-scope`).
#[derive(Clone)]
pub struct Upstream {
    client: Pools,
    url: Arc<UpstreamUrl>,
    options: UpstreamOptions,
    unreachable: Arc<Notify>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("url", &self.url)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Upstream {
    /// A forwarder to `url`. Must be created inside a Tokio runtime's
    /// context only when used: connections are spawned on the runtime that
    /// polls the requests.
    pub fn new(url: UpstreamUrl, options: UpstreamOptions) -> Self {
        Upstream {
            client: Pools::Shared(engine_connections(&url, &options)),
            url: Arc::new(url),
            options,
            unreachable: Arc::new(Notify::new()),
        }
    }

    /// This forwarder with a pool of engine connections per thread, for a
    /// server running one single-threaded runtime per core
    /// ([`serve_threads`](crate::serve_threads)): a request is sent on a
    /// connection its own thread keeps, so a stream's client and engine
    /// sockets are served by one thread, with no wake-up crossing to
    /// another. Each thread that forwards through it keeps its pool for as
    /// long as the thread lives. On a multi-thread runtime the one shared
    /// pool ([`new`](Upstream::new)) reuses connections better.
    pub fn pool_per_thread(self) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Upstream {
            client: Pools::PerThread(NEXT.fetch_add(1, Ordering::Relaxed)),
            ..self
        }
    }

    /// The pool a request sent from this thread uses.
    fn connections(&self) -> Connections {
        match &self.client {
            Pools::Shared(connections) => connections.clone(),
            Pools::PerThread(id) => THREAD_POOLS.with_borrow_mut(|pools| {
                if let Some((_, connections)) = pools.iter().find(|(of, _)| of == id) {
                    return connections.clone();
                }
                let connections = engine_connections(&self.url, &self.options);
                pools.push((*id, connections.clone()));
                connections
            }),
        }
    }

    /// The engine's base URL.
    pub fn url(&self) -> &UpstreamUrl {
        &self.url
    }

    /// Woken each time a request could not reach the engine (it may be
    /// restarting): capacity discovery reads the engine again.
    pub(crate) fn unreachable(&self) -> Arc<Notify> {
        Arc::clone(&self.unreachable)
    }

    fn prepare(&self, req: Request<Body>) -> Result<Request<Body>, http::Error> {
        let (mut parts, body) = req.into_parts();
        let uri = std::mem::take(&mut parts.uri);
        parts.uri = if self.options.h2c {
            self.url.join_uri(uri)?
        } else {
            self.url.origin_uri(uri)?
        };
        remove_hop_by_hop(&mut parts.headers);
        parts.headers.insert(header::HOST, self.url.host.clone());
        if self.options.h2c {
            // HTTP/2 has no Host header: the authority is in the URI.
            parts.headers.remove(header::HOST);
        }
        parts.version = http::Version::HTTP_11;
        if self.options.h2c {
            parts.version = http::Version::HTTP_2;
        }
        Ok(Request::from_parts(parts, body))
    }
}

/// Where an [`Upstream`] keeps its engine connections.
#[derive(Clone)]
enum Pools {
    /// One pool for every thread.
    Shared(Connections),
    /// A pool per thread, in [`THREAD_POOLS`] under this forwarder's id.
    PerThread(u64),
}

/// The engine connections of one pool.
#[derive(Clone)]
enum Connections {
    /// HTTP/1.1: a pool of our own ([`engine_conn`](super::engine_conn)).
    Http1(Arc<Pool>),
    /// h2c: hyper's pooled client (an HTTP/2 connection carries many
    /// streams at once, so a task of its own drives it).
    H2c(Arc<Client<HttpConnector, Body>>),
}

thread_local! {
    /// The engine connection pools of this thread, by the id of the
    /// [`Upstream::pool_per_thread`] forwarder they serve (one or two in a
    /// process: a short list).
    static THREAD_POOLS: RefCell<Vec<(u64, Connections)>> =
        const { RefCell::new(Vec::new()) };
}

/// A pool of connections to `url` with `options`' protocol and connect
/// timeout.
fn engine_connections(url: &UpstreamUrl, options: &UpstreamOptions) -> Connections {
    if options.h2c {
        return Connections::H2c(Arc::new(engine_client(options)));
    }
    let authority = url.authority();
    Connections::Http1(Arc::new(Pool::new(
        authority.host(),
        authority.port_u16().unwrap_or(80),
        options.connect_timeout,
        POOL_IDLE_TIMEOUT,
        POOL_MAX_IDLE,
    )))
}

/// An h2c client for the engine, with `options`' connect timeout.
fn engine_client(options: &UpstreamOptions) -> Client<HttpConnector, Body> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(options.connect_timeout));
    let mut builder = Client::builder(TokioExecutor::new());
    builder.http2_only(options.h2c);
    // Connections are reused where the engine keeps them (vLLM, SGLang,
    // TGI): one connection per request left a TIME_WAIT socket each, and
    // ran out of ports near 470 requests/s to another host. A response body
    // dropped before its end (the client left) still closes its connection,
    // never pooled, so the engine still sees the disconnect and aborts.
    // Engines close kept-alive connections when they like (after 5 s idle,
    // like uvicorn): idle ones are dropped here first, a request hyper never
    // wrote is retried on another connection (hyper's
    // retry_canceled_requests), and one written on a connection the engine
    // had closed is sent again once (`retry_once`). The HTTP/1.1 pool does
    // the same (`engine_conn::Pool::send`).
    builder
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_MAX_IDLE)
        .retry_canceled_requests(true);
    builder.build(connector)
}

/// How many names [`HOP_BY_HOP`] holds: a bit each in `remove_hop_by_hop`.
const HOP_BY_HOP_NAMES: usize = 8;

/// Headers meaningful for one connection only (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; HOP_BY_HOP_NAMES] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

pub(crate) fn remove_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the (few) names notes which are there: most messages
    // hold none (the map is left alone) or one (`connection: keep-alive`),
    // and only those are removed, each a hashed lookup.
    const TE_BIT: u16 = 1 << HOP_BY_HOP_NAMES;
    let mut present = 0u16;
    for name in headers.keys() {
        if let Some(index) = HOP_BY_HOP.iter().position(|hop| hop == name) {
            present |= 1 << index;
        } else if name == header::TE {
            present |= TE_BIT;
        }
    }
    if present == 0 {
        return;
    }
    // The headers `Connection` names (`HOP_BY_HOP[0]`), looked up by the
    // token itself: nothing allocated but the list of its values (each a
    // reference count), which lets the map change.
    if present & 1 != 0 {
        let values: Vec<HeaderValue> = headers
            .get_all(header::CONNECTION)
            .iter()
            .cloned()
            .collect();
        for token in values
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
        {
            // A token that is no header name finds nothing.
            headers.remove(token.trim());
        }
    }
    for (index, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << index) != 0 {
            headers.remove(name);
        }
    }
    // `te: trailers` is end to end in practice (gRPC needs it); any other
    // transfer coding is this connection's.
    if present & TE_BIT != 0
        && !headers
            .get_all(header::TE)
            .iter()
            .all(|value| value.as_bytes().eq_ignore_ascii_case(b"trailers"))
    {
        headers.remove(header::TE);
    }
}

impl Service<Request<Body>> for Upstream {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    /// Always ready: the pool opens a connection per request when none is
    /// idle.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let replay = req.extensions().get::<Replayable>().cloned().or_else(|| {
            http_body::Body::is_end_stream(req.body()).then(|| Replayable(bytes::Bytes::new()))
        });
        let prepared = self.prepare(req);
        let connections = self.connections();
        let timeout = self.options.response_timeout;
        let unreachable = Arc::clone(&self.unreachable);
        Box::pin(async move {
            let req = match prepared {
                Ok(req) => req,
                Err(error) => {
                    return Ok(json_error(
                        StatusCode::BAD_REQUEST,
                        &format!("the request cannot be forwarded: {error}"),
                        "invalid_request_error",
                    ));
                }
            };
            let sent = async move {
                match connections {
                    Connections::Http1(pool) => pool
                        .send(req, move |req| {
                            replay.map(|Replayable(bytes)| copy(req, bytes))
                        })
                        .await
                        .map_err(|error| Failure::of_connection(&error)),
                    Connections::H2c(client) => retry_once(&client, req, replay)
                        .await
                        .map(|response| response.map(Body::new))
                        .map_err(|error| Failure::of_client(&error)),
                }
            };
            let result = match timeout {
                Some(limit) => match tokio::time::timeout(limit, sent).await {
                    Ok(result) => result,
                    Err(_) => {
                        tracing::warn!(
                            "the engine sent no response head within {limit:?}: answered 504"
                        );
                        return Ok(timed_out(limit));
                    }
                },
                None => sent.await,
            };
            match result {
                Ok(response) => Ok(from_engine(response)),
                Err(failure) => {
                    if failure.connecting() {
                        unreachable.notify_one();
                    }
                    let answer = failure.answer();
                    tracing::warn!(
                        "forwarding to the engine failed, answered {}: {}",
                        answer.status().as_u16(),
                        failure.message()
                    );
                    Ok(answer)
                }
            }
        })
    }
}

/// `req` again, with `body`: the same method, URI, version and headers.
fn copy(req: &Request<Body>, body: bytes::Bytes) -> Request<Body> {
    let mut again = Request::new(Body::from(body));
    *again.method_mut() = req.method().clone();
    *again.uri_mut() = req.uri().clone();
    *again.version_mut() = req.version();
    *again.headers_mut() = req.headers().clone();
    again
}

/// Sends `req` over h2c, and once more on another connection when the
/// engine closed the first without a byte of response and the body can be
/// sent again.
async fn retry_once(
    client: &Client<HttpConnector, Body>,
    req: Request<Body>,
    replay: Option<Replayable>,
) -> Result<Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
    let again = replay.map(|Replayable(bytes)| copy(&req, bytes));
    match client.request(req).await {
        Err(error) if client_closed_unanswered(&error) => match again {
            Some(again) => {
                tracing::debug!(
                    "the engine closed a connection without answering: sent again ({})",
                    chain(&error)
                );
                client.request(again).await
            }
            None => Err(error),
        },
        result => result,
    }
}

/// Whether the engine closed the h2c client's connection before any
/// response byte.
fn client_closed_unanswered(error: &hyper_util::client::legacy::Error) -> bool {
    if error.is_connect() {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if let Some(hyper) = error.downcast_ref::<hyper::Error>() {
            if closed_unanswered(hyper) {
                return true;
            }
        }
        source = error.source();
    }
    false
}

/// Why the engine gave no response head, and the answer that says it.
enum Failure {
    /// Connecting took too long: `504`.
    ConnectTimeout(String),
    /// The engine cannot be reached: `502`.
    Unreachable(String),
    /// The engine dropped the request or broke the protocol: `502`.
    Failed(String),
}

impl Failure {
    fn of_connection(error: &SendError) -> Failure {
        let text = chain(error);
        match error {
            SendError::ConnectTimeout(_) => Failure::ConnectTimeout(text),
            SendError::Connect(_) => Failure::Unreachable(text),
            SendError::Closed | SendError::Engine(_) => Failure::Failed(text),
        }
    }

    fn of_client(error: &hyper_util::client::legacy::Error) -> Failure {
        let text = chain(error);
        if is_timeout(error) {
            Failure::ConnectTimeout(text)
        } else if error.is_connect() {
            Failure::Unreachable(text)
        } else {
            Failure::Failed(text)
        }
    }

    /// Whether the engine could not be connected to (it may be
    /// restarting).
    fn connecting(&self) -> bool {
        !matches!(self, Failure::Failed(_))
    }

    fn message(&self) -> &str {
        match self {
            Failure::ConnectTimeout(text) | Failure::Unreachable(text) | Failure::Failed(text) => {
                text
            }
        }
    }

    /// `504` for an engine that did not accept the connection in time,
    /// `502` for one that cannot be reached or dropped the request.
    fn answer(&self) -> Response<Body> {
        match self {
            Failure::ConnectTimeout(text) => json_error(
                StatusCode::GATEWAY_TIMEOUT,
                &format!("connecting to the engine timed out: {text}"),
                "upstream_timeout",
            ),
            Failure::Unreachable(text) => json_error(
                StatusCode::BAD_GATEWAY,
                &format!("the engine is unreachable: {text}"),
                "upstream_unreachable",
            ),
            Failure::Failed(text) => json_error(
                StatusCode::BAD_GATEWAY,
                &format!("the engine failed the request: {text}"),
                "upstream_error",
            ),
        }
    }
}

/// The engine's response, ready for the client.
fn from_engine(response: Response<Body>) -> Response<Body> {
    let (mut parts, body) = response.into_parts();
    remove_hop_by_hop(&mut parts.headers);
    if parts.status.is_client_error() || parts.status.is_server_error() {
        parts
            .headers
            .insert(ORIGIN, HeaderValue::from_static("engine"));
    }
    Response::from_parts(parts, body)
}

fn timed_out(limit: Duration) -> Response<Body> {
    json_error(
        StatusCode::GATEWAY_TIMEOUT,
        &format!(
            "the engine sent no response within {} s",
            limit.as_secs_f64()
        ),
        "upstream_timeout",
    )
}

fn is_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return true;
            }
        }
        source = error.source();
    }
    false
}

fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(error) = source {
        text.push_str(": ");
        text.push_str(&error.to_string());
        source = error.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_keep_their_prefix_and_refuse_what_is_not_http() {
        let url = UpstreamUrl::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            url.join("/v1/models?x=1").unwrap(),
            "http://127.0.0.1:8080/v1/models?x=1"
        );
        let prefixed = UpstreamUrl::parse("http://engine:8000/api/").unwrap();
        assert_eq!(
            prefixed.join("/v1/models").unwrap(),
            "http://engine:8000/api/v1/models"
        );
        // A request's URI, as the server read it (origin or absolute form),
        // becomes the engine's: moved over without a prefix, joined with one.
        for (request, engine) in [
            (
                "/v1/chat/completions?x=1",
                "http://127.0.0.1:8080/v1/chat/completions?x=1",
            ),
            (
                "http://sidecar:9/v1/models",
                "http://127.0.0.1:8080/v1/models",
            ),
        ] {
            let uri: Uri = request.parse().unwrap();
            assert_eq!(url.join_uri(uri).unwrap(), engine, "{request}");
        }
        let uri: Uri = "/v1/models?x=1".parse().unwrap();
        assert_eq!(
            prefixed.join_uri(uri).unwrap(),
            "http://engine:8000/api/v1/models?x=1"
        );
        // HTTP/1.1 to the engine: origin form, the authority in `Host`
        // (llama.cpp answers an absolute-form target 404).
        for (base, request, engine) in [
            (&url, "/v1/models?x=1", "/v1/models?x=1"),
            (&url, "http://sidecar:9/props", "/props"),
            (&prefixed, "/v1/models", "/api/v1/models"),
        ] {
            let uri: Uri = request.parse().unwrap();
            let origin = base.origin_uri(uri).unwrap();
            assert_eq!(origin, engine, "{request}");
            assert!(origin.authority().is_none(), "{request}");
        }
        assert_eq!(url.host, "127.0.0.1:8080");
        for bad in ["https://engine", "engine:8000", "http://engine/?q=1", ""] {
            let error = UpstreamUrl::parse(bad).unwrap_err();
            assert!(error.contains("upstream URL"), "{bad}: {error}");
        }
    }

    #[test]
    fn hop_by_hop_headers_are_dropped_with_those_connection_names() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, "keep-alive, x-secret".parse().unwrap());
        headers.insert("x-secret", "1".parse().unwrap());
        headers.insert("keep-alive", "timeout=5".parse().unwrap());
        headers.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        headers.insert(header::UPGRADE, "websocket".parse().unwrap());
        headers.insert(header::TE, "gzip".parse().unwrap());
        headers.insert(header::AUTHORIZATION, "Bearer k".parse().unwrap());
        headers.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        remove_hop_by_hop(&mut headers);
        // `HeaderMap::remove` may reorder what is left: compare as a set.
        let mut left: Vec<_> = headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "content-type"]);

        // Tokens that name no header (empty, invalid, long, in capitals)
        // find nothing and break nothing; a named `te` goes whatever its
        // value.
        let mut odd = HeaderMap::new();
        let long = "x".repeat(200);
        let connection = format!("close, , bad name, X-Secret, {long}, te");
        odd.insert(header::CONNECTION, connection.parse().unwrap());
        odd.append(header::CONNECTION, "x-other".parse().unwrap());
        odd.insert("x-secret", "1".parse().unwrap());
        odd.insert("x-other", "1".parse().unwrap());
        odd.insert(header::TE, "trailers".parse().unwrap());
        odd.insert(header::ACCEPT, "*/*".parse().unwrap());
        remove_hop_by_hop(&mut odd);
        let left: Vec<_> = odd.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["accept"]);

        let mut grpc = HeaderMap::new();
        grpc.insert(header::TE, "trailers".parse().unwrap());
        remove_hop_by_hop(&mut grpc);
        assert!(grpc.contains_key(header::TE));
    }
}
