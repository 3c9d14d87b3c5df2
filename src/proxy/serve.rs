//! Serving a [`Sidecar`] on a listener until shutdown.

use std::future::Future;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use super::{Drain, Sidecar};

/// How long a client may take to send a request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Concurrent HTTP/2 streams on one client connection.
pub const MAX_CONCURRENT_STREAMS: u32 = 4096;

/// Serves `sidecar` on `listener`, HTTP/1.1 and h2c, until `shutdown`
/// completes. Then it stops accepting connections, answers requests still
/// queued in the gate with `503` ([`Drain`]), and lets responses the engine
/// is producing finish for up to `grace`; whatever is still open after that
/// is closed (the engine sees the disconnects and aborts).
pub async fn serve(
    listener: TcpListener,
    sidecar: Sidecar,
    drain: Drain,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // A client that never finishes its request head holds a connection,
    // not capacity: it is closed after HEADER_READ_TIMEOUT. Heads are
    // bounded by hyper (about 400 KiB, 100 headers: 431 beyond).
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    // Streams a connection may hold open at once. A stream over the limit
    // waits where the gate cannot see it, so the limit is far above any
    // gate's queue; each stream costs a bounded window of memory.
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors, say: the listener itself
                        // is fine, try again shortly.
                        tracing::warn!("accepting a connection failed: {error}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(sidecar.clone());
                let connection = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::debug!("connection ended with an error: {error}");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    drain.start();
    tracing::info!(
        "shutting down: no new connections; queued requests answered 503; open responses get \
         {} s to finish",
        grace.as_secs_f64()
    );
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("every connection finished"),
        () = tokio::time::sleep(grace) => {
            tracing::warn!("shutting down: closing the responses still open after the grace period");
        }
    }
}
