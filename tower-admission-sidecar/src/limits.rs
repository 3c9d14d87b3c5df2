//! What a client may hold without passing the gate (issue 35, cases 4 and
//! 5): connections, the time a connection may stay silent, HTTP/2 streams,
//! and requests that pass straight through to the engine.
//!
//! The gate bounds generation; everything here bounds the rest, so that
//! idle sockets, a fan-out of HTTP/2 streams, or a flood of passthrough
//! requests cannot take the file descriptors, the engine's connections, or
//! the engine itself from the clients the gate serves.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::answer::json_error;
use super::body::{Body, BoxError};

/// How long a client may take to send a request head, counted from accept
/// for the first request of a connection.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Concurrent HTTP/2 streams on one client connection, by default: room
/// for a router's share of a gate, far below the 4,096 that let one
/// connection open hundreds of engine connections.
pub const MAX_CONCURRENT_STREAMS: u32 = 128;

/// The connection limits [`serve_with`](crate::serve_with) enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionLimits {
    /// Open client connections; one more is answered `503` and closed
    /// (logged when the cap is reached).
    pub max_connections: usize,
    /// From accept to the first complete request head, whatever the
    /// protocol (a client that sends no byte is closed after it).
    pub head_timeout: Duration,
    /// How long a connection with no request in progress stays open.
    pub idle_timeout: Duration,
    /// Concurrent HTTP/2 streams on one client connection.
    pub max_concurrent_streams: u32,
    /// How long a client may read nothing of a response while the sidecar
    /// has more to send (its socket refusing every write) before the
    /// connection is closed, its request's slot freed and the engine's
    /// request aborted.
    pub slow_reader_timeout: Duration,
}

/// How long a client may read nothing of a response, by default.
pub const DEFAULT_SLOW_READER_TIMEOUT: Duration = Duration::from_secs(60);

/// Open client connections at most, by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// How long a connection with no request in progress stays open, by
/// default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            head_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_concurrent_streams: MAX_CONCURRENT_STREAMS,
            slow_reader_timeout: DEFAULT_SLOW_READER_TIMEOUT,
        }
    }
}

impl ConnectionLimits {
    /// `max_connections` connections, each closed when silent for
    /// `head_timeout` before its first request or `idle_timeout` between
    /// requests, with up to `max_concurrent_streams` HTTP/2 streams.
    pub fn new(
        max_connections: usize,
        head_timeout: Duration,
        idle_timeout: Duration,
        max_concurrent_streams: u32,
    ) -> Self {
        ConnectionLimits {
            max_connections,
            head_timeout,
            idle_timeout,
            max_concurrent_streams,
            slow_reader_timeout: DEFAULT_SLOW_READER_TIMEOUT,
        }
    }

    /// Closes a connection whose client reads nothing of a response for
    /// `timeout` (60 s by default).
    pub fn slow_reader_timeout(mut self, timeout: Duration) -> Self {
        self.slow_reader_timeout = timeout;
        self
    }
}

/// What one connection is doing: requests in progress (a request counts
/// from its complete head until its response body is done or dropped), and
/// since when it has done nothing. Requests only write it; the watchdog
/// ([`expired`](Activity::expired)) reads it when its timer fires, so a
/// request wakes no one.
#[derive(Debug)]
pub(crate) struct Activity {
    in_progress: AtomicUsize,
    started: AtomicBool,
    idle_since: Mutex<Instant>,
}

impl Activity {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Activity {
            in_progress: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            idle_since: Mutex::new(Instant::now()),
        })
    }

    /// A request head arrived; the guard ends the request when dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> InProgress {
        self.started.store(true, Ordering::Release);
        self.in_progress.fetch_add(1, Ordering::AcqRel);
        InProgress(Arc::clone(self))
    }

    /// Completes when the connection has been silent too long: no
    /// complete head within `head_timeout` of accept, or no request in
    /// progress for `idle_timeout`. It looks when a deadline passes: before
    /// the first head at least every idle timeout (a first request may
    /// have come and gone), while requests are in progress every idle
    /// timeout, and once idle at the idle timeout after the last request
    /// ended.
    pub(crate) async fn expired(&self, limits: &ConnectionLimits) {
        let no_head = Instant::now() + limits.head_timeout;
        let mut deadline = no_head.min(Instant::now() + limits.idle_timeout);
        loop {
            tokio::time::sleep_until(deadline).await;
            let now = Instant::now();
            deadline = if !self.started.load(Ordering::Acquire) {
                if now >= no_head {
                    return;
                }
                no_head.min(now + limits.idle_timeout)
            } else if self.in_progress.load(Ordering::Acquire) > 0 {
                now + limits.idle_timeout
            } else {
                let idle_until =
                    *self.idle_since.lock().expect("never poisoned") + limits.idle_timeout;
                if now >= idle_until {
                    return;
                }
                idle_until
            };
        }
    }
}

/// One request in progress on a connection.
#[derive(Debug)]
pub(crate) struct InProgress(Arc<Activity>);

impl Drop for InProgress {
    fn drop(&mut self) {
        *self.0.idle_since.lock().expect("never poisoned") = Instant::now();
        self.0.in_progress.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that holds `G` until it is done or dropped.
pub(crate) struct Holding<G> {
    body: Body,
    _held: G,
}

impl<G: Send + Unpin + 'static> Holding<G> {
    /// `response`, its body holding `held`.
    pub(crate) fn around(response: Response<Body>, held: G) -> Response<Holding<G>> {
        response.map(|body| Holding { body, _held: held })
    }

    /// The same, as a [`Body`] (boxed once more: where the type must be
    /// the sidecar's one body).
    pub(crate) fn wrap(response: Response<Body>, held: G) -> Response<Body> {
        Holding::around(response, held).map(Body::new)
    }
}

impl<G: Unpin> http_body::Body for Holding<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The default bound on requests passing straight through to the engine at
/// once (health checks, model listings, tokenization: cheap routes).
pub const DEFAULT_MAX_PASSTHROUGH_REQUESTS: usize = 64;

/// Requests passing straight through at once, across every client: one
/// over the bound is answered `503` at once, so no client opens an engine
/// connection per HTTP/2 stream without end.
#[derive(Debug, Clone)]
pub(crate) struct Passthrough(Arc<Semaphore>);

impl Passthrough {
    pub(crate) fn new(max: usize) -> Self {
        Passthrough(Arc::new(Semaphore::new(max)))
    }

    /// A place for one passthrough request, if there is one.
    pub(crate) fn enter(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.0).try_acquire_owned().ok()
    }

    /// The answer when there is no place.
    fn full() -> Response<Body> {
        let mut answer = json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many requests are passing through to the engine; retry shortly",
            "overloaded",
        );
        answer
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        answer
    }

    /// Forwards `req` through `upstream` holding a place until the response
    /// body is done.
    pub(crate) async fn forward(
        permit: Option<OwnedSemaphorePermit>,
        mut upstream: crate::upstream::Upstream,
        req: Request<Body>,
    ) -> Result<Response<Body>, std::convert::Infallible> {
        let Some(permit) = permit else {
            return Ok(Passthrough::full());
        };
        let Ok(response) = tower_service::Service::call(&mut upstream, req).await;
        Ok(Holding::wrap(response, permit))
    }
}

/// The answer to a connection over [`ConnectionLimits::max_connections`],
/// written as it is accepted, before it is closed.
pub(crate) const TOO_MANY_CONNECTIONS: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\nx-admission-origin: proxy\r\nretry-after: 1\r\n\
connection: close\r\ncontent-length: 93\r\n\r\n\
{\"error\":{\"message\":\"too many open connections\",\"type\":\"overloaded\",\"param\":null,\"code\":503}}";

/// Raises this process's open-file limit to its hard limit, and returns
/// the limit now in force (`None` where it cannot be read).
pub fn raise_open_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `limit` is a valid, writable rlimit for the call.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            // SAFETY: `raised` is a valid rlimit; failure leaves the limit
            // unchanged.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                limit = raised;
            }
        }
        #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every unix
        Some(limit.rlim_cur as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// A client socket that remembers since when its writes have been refused
/// (the client reads nothing and its buffers are full).
pub(crate) struct Watched<T> {
    io: T,
    stalled_since: Arc<Mutex<Option<Instant>>>,
}

impl<T> Watched<T> {
    pub(crate) fn new(io: T) -> (Self, Stall) {
        let stalled_since = Arc::new(Mutex::new(None));
        let stall = Stall(Arc::clone(&stalled_since));
        (Watched { io, stalled_since }, stall)
    }

    fn note<R>(&self, poll: &Poll<R>) {
        let mut since = self.stalled_since.lock().expect("never poisoned");
        match poll {
            Poll::Pending => {
                since.get_or_insert_with(Instant::now);
            }
            Poll::Ready(_) => *since = None,
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.note(&poll);
        poll
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.note(&poll);
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.note(&poll);
        poll
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Since when a [`Watched`] socket's writes have been refused.
pub(crate) struct Stall(Arc<Mutex<Option<Instant>>>);

impl Stall {
    /// Completes once writes have been refused for `limit` without a
    /// break: the client has read nothing for that long.
    pub(crate) async fn exceeded(&self, limit: Duration) {
        loop {
            let since = *self.0.lock().expect("never poisoned");
            match since {
                Some(since) if since.elapsed() >= limit => return,
                Some(since) => tokio::time::sleep_until(since + limit).await,
                None => tokio::time::sleep(limit.min(Duration::from_secs(1))).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_too_many_connections_answer_says_its_length() {
        let text = std::str::from_utf8(TOO_MANY_CONNECTIONS).unwrap();
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(text.contains(&format!("content-length: {}\r\n", body.len())));
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], 503);
    }
}
