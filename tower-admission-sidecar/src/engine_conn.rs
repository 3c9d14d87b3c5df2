//! HTTP/1.1 connections to the engine, kept in a [`Pool`] of our own: the
//! engine is one host, so an idle connection is a plain stack's top, with
//! nothing hashed and no pool task (issue 38's profile: hyper-util's
//! pooled client hashed the engine's address three times a request and
//! spent a tenth of a short request's instructions on its pool).
//!
//! * Each connection's I/O runs on a task of its own (as with hyper-util's
//!   client); a request is sent on an idle connection that is ready, or on
//!   a new one.
//! * The response body gives its connection back to the pool once it has
//!   ended; dropped before (the client left), the connection is closed
//!   with it, so the engine sees the disconnect and aborts the request.
//! * Idle connections older than the pool's idle timeout are closed, by
//!   a task that runs while there are any (and whenever the pool is
//!   used); one the engine closed meanwhile is seen closed when taken,
//!   and the next is tried.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::body::{Body, BoxError};

/// Idle HTTP/1.1 connections to one engine.
pub(crate) struct Pool {
    idle: Mutex<Idle>,
    host: String,
    port: u16,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_idle: usize,
}

/// The idle connections, and whether a sweeper watches them.
#[derive(Default)]
struct Idle {
    /// The most recently used at the back (taken first: its socket is
    /// warm); the oldest at the front (expired first).
    connections: VecDeque<Kept>,
    /// A task drops the expired ones while there are any.
    swept: bool,
}

struct Kept {
    send: http1::SendRequest<Body>,
    since: Instant,
}

/// Why a request got no response from the engine.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The engine did not accept the connection in time.
    ConnectTimeout(Duration),
    /// The engine could not be reached.
    Connect(std::io::Error),
    /// A new connection closed before the request could be written.
    Closed,
    /// The engine dropped the request or broke the protocol.
    Engine(hyper::Error),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::ConnectTimeout(limit) => {
                write!(f, "no connection within {} s", limit.as_secs_f64())
            }
            SendError::Connect(error) => write!(f, "connecting failed: {error}"),
            SendError::Closed => f.write_str("the connection closed before the request was sent"),
            SendError::Engine(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendError::ConnectTimeout(_) | SendError::Closed => None,
            SendError::Connect(error) => error.source(),
            SendError::Engine(error) => std::error::Error::source(error),
        }
    }
}

impl Pool {
    pub(crate) fn new(
        host: &str,
        port: u16,
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_idle: usize,
    ) -> Self {
        // An IPv6 authority is bracketed; a socket address is not.
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Pool {
            idle: Mutex::new(Idle::default()),
            host: host.to_owned(),
            port,
            connect_timeout,
            idle_timeout,
            max_idle,
        }
    }

    /// Sends `req` on an idle connection or a new one. A request that was
    /// never written (its connection closed as it went out) goes out on
    /// another connection; one written on a kept-alive connection the
    /// engine closed unanswered is sent once more, as `again` makes it
    /// (when the body can be sent again), on a new connection.
    pub(crate) async fn send(
        self: &Arc<Self>,
        mut req: Request<Body>,
        again: impl FnOnce(&Request<Body>) -> Option<Request<Body>>,
    ) -> Result<Response<Body>, SendError> {
        let mut again = Some(again);
        // Idle connections tried before a new one: a few at most.
        let mut reuse = 3;
        loop {
            let reused = if reuse > 0 { self.take() } else { None };
            reuse -= 1;
            let fresh = reused.is_none();
            let mut send = match reused {
                Some(send) => send,
                None => self.connect().await?,
            };
            // Only a kept-alive connection may have been closed by the
            // engine as the request went out: a copy is kept for that.
            let copy = match again.take() {
                Some(again) if !fresh => again(&req),
                not_now => {
                    again = not_now;
                    None
                }
            };
            match send.try_send_request(req).await {
                Ok(response) => {
                    let pool = Arc::clone(self);
                    return Ok(response.map(|body| {
                        Body::new(GivesBack {
                            body,
                            send: Some(send),
                            pool,
                        })
                    }));
                }
                Err(mut error) => match error.take_message() {
                    Some(back) if !fresh => req = back,
                    Some(_) => return Err(SendError::Closed),
                    None => {
                        let error = error.into_error();
                        match copy {
                            Some(copy) if closed_unanswered(&error) => {
                                tracing::debug!(
                                    "the engine closed a kept-alive connection without \
                                     answering: sent again ({error})"
                                );
                                req = copy;
                                reuse = 0;
                            }
                            _ => return Err(SendError::Engine(error)),
                        }
                    }
                },
            }
        }
    }

    /// An idle connection ready for a request, if there is one; those
    /// closed meanwhile are dropped.
    fn take(&self) -> Option<http1::SendRequest<Body>> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        self.expire(&mut idle.connections);
        while let Some(Kept { send, .. }) = idle.connections.pop_back() {
            if send.is_ready() {
                return Some(send);
            }
        }
        None
    }

    /// Keeps a connection whose response has ended for the next request,
    /// unless the pool is full or the connection closed.
    fn put(self: &Arc<Self>, send: http1::SendRequest<Body>) {
        if send.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        self.expire(&mut idle.connections);
        if idle.connections.len() >= self.max_idle {
            return;
        }
        idle.connections.push_back(Kept {
            send,
            since: Instant::now(),
        });
        if !idle.swept {
            // Outside a runtime (a body dropped as one shuts down) the
            // connection is kept unwatched: the next use expires it.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                idle.swept = true;
                runtime.spawn(sweep(Arc::downgrade(self)));
            }
        }
    }

    /// Drops the connections idle for longer than the idle timeout (below
    /// the engine's own, so none is used as the engine closes it).
    fn expire(&self, connections: &mut VecDeque<Kept>) {
        while connections
            .front()
            .is_some_and(|oldest| oldest.since.elapsed() >= self.idle_timeout)
        {
            connections.pop_front();
        }
    }

    /// A new connection, its I/O on a task of its own.
    async fn connect(&self) -> Result<http1::SendRequest<Body>, SendError> {
        let connecting = TcpStream::connect((self.host.as_str(), self.port));
        let stream = match tokio::time::timeout(self.connect_timeout, connecting).await {
            Err(_) => return Err(SendError::ConnectTimeout(self.connect_timeout)),
            Ok(Err(error)) => return Err(SendError::Connect(error)),
            Ok(Ok(stream)) => stream,
        };
        let _ = stream.set_nodelay(true);
        let (send, io) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(SendError::Engine)?;
        tokio::spawn(async move {
            if let Err(error) = io.await {
                tracing::debug!("an engine connection ended with an error: {error}");
            }
        });
        Ok(send)
    }
}

/// Closes a pool's expired idle connections every half idle timeout, so
/// none outlives it by more than half, until the pool has none (the next
/// connection kept starts another sweep) or is gone.
async fn sweep(pool: std::sync::Weak<Pool>) {
    loop {
        let Some(every) = pool
            .upgrade()
            .map(|pool| (pool.idle_timeout / 2).max(Duration::from_millis(1)))
        else {
            return;
        };
        tokio::time::sleep(every).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let mut idle = pool.idle.lock().unwrap_or_else(PoisonError::into_inner);
        pool.expire(&mut idle.connections);
        if idle.connections.is_empty() {
            idle.swept = false;
            return;
        }
    }
}

/// Whether the engine closed the connection before any response byte.
pub(crate) fn closed_unanswered(error: &hyper::Error) -> bool {
    if error.is_incomplete_message() || error.is_canceled() {
        return true;
    }
    let mut source = std::error::Error::source(error);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ) {
                return true;
            }
        }
        source = error.source();
    }
    false
}

/// A response body from the engine that gives its connection back to the
/// pool once it has ended.
struct GivesBack {
    body: Incoming,
    /// `None` once given back, or after an error.
    send: Option<http1::SendRequest<Body>>,
    pool: Arc<Pool>,
}

impl GivesBack {
    fn give_back(&mut self) {
        if let Some(send) = self.send.take() {
            self.pool.put(send);
        }
    }
}

impl http_body::Body for GivesBack {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.give_back(),
            Poll::Ready(Some(Ok(_))) if this.body.is_end_stream() => this.give_back(),
            Poll::Ready(Some(Err(_))) => this.send = None,
            _ => {}
        }
        polled.map(|frame| frame.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for GivesBack {
    fn drop(&mut self) {
        // A server that saw the end (`is_end_stream`) may drop the body
        // without polling it to `None`: the connection is still good.
        // Dropped before the end, the body takes its connection with it
        // (hyper closes a connection whose response was not read whole).
        if http_body::Body::is_end_stream(&self.body) {
            self.give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use http_body_util::{BodyExt, Full};

    /// An engine answering every request `ok`, and how many connections
    /// it has open.
    async fn engine() -> (u16, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&open);
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let count = Arc::clone(&count);
                count.fetch_add(1, SeqCst);
                tokio::spawn(async move {
                    let ok = hyper::service::service_fn(|_| async {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    });
                    let served = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), ok);
                    let _ = served.await;
                    count.fetch_sub(1, SeqCst);
                });
            }
        });
        (port, open)
    }

    async fn get(pool: &Arc<Pool>) -> Bytes {
        let req = Request::get("/v1/models")
            .header(http::header::HOST, "engine")
            .body(Body::empty())
            .unwrap();
        let response = pool.send(req, |_| None).await.unwrap();
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn an_idle_connection_is_reused_and_closed_once_it_has_idled_too_long() {
        let (port, open) = engine().await;
        let idle_timeout = Duration::from_millis(200);
        let pool = Arc::new(Pool::new(
            "127.0.0.1",
            port,
            Duration::from_secs(2),
            idle_timeout,
            8,
        ));
        for _ in 0..3 {
            assert_eq!(get(&pool).await, "ok");
        }
        assert_eq!(open.load(SeqCst), 1, "three requests, one connection");
        // No request comes: the sweeper closes the idle connection, and
        // stops once the pool has none.
        let deadline = Instant::now() + Duration::from_secs(10);
        while open.load(SeqCst) > 0 {
            assert!(Instant::now() < deadline, "the idle connection stayed open");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        {
            let idle = pool.idle.lock().unwrap();
            assert!(idle.connections.is_empty());
            assert!(!idle.swept, "the sweeper stopped with nothing to watch");
        }
        // Used again, the pool connects anew and watches again.
        assert_eq!(get(&pool).await, "ok");
        assert_eq!(open.load(SeqCst), 1);
        assert!(pool.idle.lock().unwrap().swept);
    }
}
