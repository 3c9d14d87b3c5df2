//! Serving a [`Sidecar`] on a listener until shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use tokio::io::AsyncWriteExt;
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::time::Instant;
use tower_service::Service;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};

use super::limits::{Activity, ConnectionLimits, Holding, TOO_MANY_CONNECTIONS, Watched};
use super::service::{Drain, Sidecar};

/// Serves `sidecar` on `listener`, HTTP/1.1 and h2c, until `shutdown`
/// completes. Then it stops accepting connections, answers requests still
/// queued in the gate with `503` ([`Drain`]), and lets responses the engine
/// is producing finish for up to `grace`; whatever is still open after that
/// is closed (the engine sees the disconnects and aborts). Connections are
/// bounded by the defaults of [`ConnectionLimits`]; [`serve_with`] sets
/// them.
pub async fn serve(
    listener: TcpListener,
    sidecar: Sidecar,
    drain: Drain,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    serve_with(
        listener,
        sidecar,
        drain,
        shutdown,
        grace,
        ConnectionLimits::default(),
    )
    .await;
}

/// As [`serve`], with `limits` on connections: at most
/// [`max_connections`](ConnectionLimits::max_connections) open (one more is
/// answered `503` and closed, and the cap logged when reached); each closed
/// when no complete request head arrives within
/// [`head_timeout`](ConnectionLimits::head_timeout) of accept, whatever the
/// protocol, or when no request is in progress for
/// [`idle_timeout`](ConnectionLimits::idle_timeout); at most
/// [`max_concurrent_streams`](ConnectionLimits::max_concurrent_streams)
/// HTTP/2 streams on each; closed when its client reads nothing of a
/// response for [`slow_reader_timeout`](ConnectionLimits::slow_reader_timeout),
/// which frees its request's slot and aborts the engine's request.
pub async fn serve_with(
    listener: TcpListener,
    sidecar: Sidecar,
    drain: Drain,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    limits: ConnectionLimits,
) {
    let acceptor = Acceptor::new(limits);
    let graceful = GracefulShutdown::new();
    acceptor.run(listener, sidecar, &graceful, shutdown).await;
    start_draining(&drain, grace);
    finish(graceful, grace).await;
}

/// As [`serve_with`], on `threads` threads of its own, each running a
/// single-threaded Tokio runtime that accepts connections from `listener`
/// and serves them to their end, nginx's shape: a connection, its requests
/// and their engine connections (with an [`Upstream`](crate::Upstream)
/// made [`pool_per_thread`](crate::Upstream::pool_per_thread)) stay on the
/// thread that accepted it, so no wake-up crosses to another thread on the
/// way of a token. The gate, the caps (connections, passthrough requests,
/// request bodies) and the drain are shared by every thread. The calling
/// task waits for `shutdown`, starts the drain, and returns once every
/// thread has finished (after at most `grace`). Fails only when a thread or
/// its runtime cannot be started (the threads already started are stopped).
pub async fn serve_threads(
    listener: std::net::TcpListener,
    threads: NonZeroUsize,
    sidecar: Sidecar,
    drain: Drain,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    limits: ConnectionLimits,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let acceptor = Arc::new(Acceptor::new(limits));
    // Dropped (or set) to stop every thread's accepting.
    let (stop, stopped) = watch::channel(false);
    let mut finished = Vec::with_capacity(threads.get());
    for index in 0..threads.get() {
        let listener = listener.try_clone()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (acceptor, sidecar, mut stopped) =
            (Arc::clone(&acceptor), sidecar.clone(), stopped.clone());
        let (done, finished_one) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("tower-admission-{index}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(error) => {
                            tracing::error!("thread {index} cannot accept: {error}");
                            return;
                        }
                    };
                    let graceful = GracefulShutdown::new();
                    let stop = async move {
                        let _ = stopped.wait_for(|stop| *stop).await;
                    };
                    acceptor.run(listener, sidecar, &graceful, stop).await;
                    finish(graceful, grace).await;
                });
                // The runtime is dropped here, closing whatever is still
                // open after the grace period.
                drop(done);
            })?;
        finished.push(finished_one);
    }
    drop(listener);
    shutdown.await;
    start_draining(&drain, grace);
    let _ = stop.send(true);
    for finished_one in finished {
        let _ = finished_one.await;
    }
    Ok(())
}

/// What every accepting loop shares: the connection protocol settings, the
/// cap on open connections and when it was last logged.
struct Acceptor {
    builder: auto::Builder<TokioExecutor>,
    connections: Arc<Semaphore>,
    cap_logged: Mutex<Option<Instant>>,
    limits: ConnectionLimits,
}

impl Acceptor {
    fn new(limits: ConnectionLimits) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // A client that never finishes its request head holds a connection,
        // not capacity. hyper's own timer covers the heads after the first;
        // the first is timed from accept (below), since hyper starts its
        // timer only once the protocol is known. Heads are bounded by hyper
        // (about 400 KiB, 100 headers: 431 beyond).
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.head_timeout);
        // Streams a connection may hold open at once. A stream over the
        // limit waits in the client; each stream costs a bounded window of
        // memory.
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_concurrent_streams);
        Acceptor {
            builder,
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            cap_logged: Mutex::new(None),
            limits,
        }
    }

    /// Accepts connections from `listener` and serves each on a task of its
    /// own (watched by `graceful`) until `shutdown` completes.
    async fn run(
        &self,
        listener: TcpListener,
        sidecar: Sidecar,
        graceful: &GracefulShutdown,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _peer)) => self.serve(stream, &sidecar, graceful),
                    Err(error) => {
                        // Out of file descriptors, say: the listener itself
                        // is fine, try again shortly.
                        tracing::warn!("accepting a connection failed: {error}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                () = &mut shutdown => break,
            }
        }
    }

    /// Serves one accepted connection on a task of its own, or answers it
    /// `503` and closes it when the cap on open connections is reached.
    fn serve(&self, mut stream: TcpStream, sidecar: &Sidecar, graceful: &GracefulShutdown) {
        let limits = self.limits;
        let _ = stream.set_nodelay(true);
        let Ok(permit) = Arc::clone(&self.connections).try_acquire_owned() else {
            let mut logged = self
                .cap_logged
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if logged.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                tracing::warn!(
                    "{} connections open, the cap: new connections are answered 503 and closed",
                    limits.max_connections
                );
                *logged = Some(Instant::now());
            }
            tokio::spawn(async move {
                let write = stream.write_all(TOO_MANY_CONNECTIONS);
                let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
            });
            return;
        };
        let activity = Activity::new();
        let service = {
            let (sidecar, activity) = (sidecar.clone(), Arc::clone(&activity));
            hyper::service::service_fn(move |req: Request<Incoming>| {
                let in_progress = activity.begin();
                let response = sidecar.clone().call(req);
                async move {
                    let Ok(response) = response.await;
                    // Served as it is: no box around the box per frame.
                    Ok::<_, Infallible>(Holding::around(response, in_progress))
                }
            })
        };
        let (stream, stall) = Watched::new(stream);
        let connection = self
            .builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        // The connection runs on a task of its own, woken by its sockets
        // alone; its watchdogs on another, which closes it by aborting
        // that task. (Polled together, each wake-up of the connection, a
        // streamed chunk, say, polled the watchdogs' timer and `Notify`
        // too: the largest cost of the sidecar's own per chunk.)
        let mut connection = tokio::spawn(graceful.watch(connection));
        tokio::spawn(async move {
            let _permit = permit;
            let slow_reader = tokio::select! {
                ended = &mut connection => {
                    match ended {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => {
                            tracing::debug!("connection ended with an error: {error}");
                        }
                        Err(error) => tracing::warn!("a connection's task failed: {error}"),
                    }
                    return;
                }
                () = activity.expired(&limits) => false,
                () = stall.exceeded(limits.slow_reader_timeout) => true,
            };
            connection.abort();
            // The permit is held until the connection is dropped.
            let _ = connection.await;
            if slow_reader {
                tracing::info!(
                    "closed a connection whose client read nothing for {} s",
                    limits.slow_reader_timeout.as_secs_f64()
                );
            } else {
                tracing::debug!("closed a connection silent for too long");
            }
        });
    }
}

/// No new connections from here on: requests not yet at the engine are
/// answered `503`.
fn start_draining(drain: &Drain, grace: Duration) {
    drain.start();
    tracing::info!(
        "shutting down: no new connections; queued requests answered 503; open responses get \
         {} s to finish",
        grace.as_secs_f64()
    );
}

/// Lets the connections `graceful` watches finish for up to `grace`.
async fn finish(graceful: GracefulShutdown, grace: Duration) {
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("every connection finished"),
        () = tokio::time::sleep(grace) => {
            tracing::warn!("shutting down: closing the responses still open after the grace period");
        }
    }
}
