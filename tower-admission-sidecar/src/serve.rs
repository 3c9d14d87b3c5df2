//! Serving a [`Sidecar`] on a listener until shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tower_service::Service;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

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
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // A client that never finishes its request head holds a connection,
    // not capacity. hyper's own timer covers the heads after the first;
    // the first is timed from accept (below), since hyper starts its timer
    // only once the protocol is known. Heads are bounded by hyper (about
    // 400 KiB, 100 headers: 431 beyond).
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout);
    // Streams a connection may hold open at once. A stream over the limit
    // waits in the client; each stream costs a bounded window of memory.
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let mut cap_logged: Option<Instant> = None;
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (mut stream, _peer) = match accepted {
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
                let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                    if cap_logged.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                        tracing::warn!(
                            "{} connections open, the cap: new connections are answered 503 \
                             and closed",
                            limits.max_connections
                        );
                        cap_logged = Some(Instant::now());
                    }
                    tokio::spawn(async move {
                        let write = stream.write_all(TOO_MANY_CONNECTIONS);
                        let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
                    });
                    continue;
                };
                let activity = Activity::new();
                let service = {
                    let (sidecar, activity) = (sidecar.clone(), Arc::clone(&activity));
                    hyper::service::service_fn(move |req: Request<Incoming>| {
                        let in_progress = activity.begin();
                        let response = sidecar.clone().call(req);
                        async move {
                            let Ok(response) = response.await;
                            Ok::<_, Infallible>(Holding::wrap(response, in_progress))
                        }
                    })
                };
                let (stream, stall) = Watched::new(stream);
                let connection = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    let _permit = permit;
                    tokio::select! {
                        ended = connection => if let Err(error) = ended {
                            tracing::debug!("connection ended with an error: {error}");
                        },
                        () = activity.expired(&limits) => {
                            tracing::debug!("closed a connection silent for too long");
                        }
                        () = stall.exceeded(limits.slow_reader_timeout) => {
                            tracing::info!(
                                "closed a connection whose client read nothing for {} s",
                                limits.slow_reader_timeout.as_secs_f64()
                            );
                        }
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
