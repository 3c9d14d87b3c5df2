//! `GET /metrics` on an address of its own (issue 35, case 8): the gate's
//! series are for the operator's scraper, not for every client that can
//! reach the proxy.

use std::convert::Infallible;
use std::future::Future;

use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use super::answer::json_error;
use super::router_view::RouterView;
use super::service::{Extra, RenderMetrics, metrics};
use super::upstream::Upstream;
use tower_admission::Gate;

/// Serves `GET /metrics` on `listener` (the gate's series rendered by
/// `render`, then the router view when given, then `engine`'s own
/// `/metrics` when given: from the view's background scrape if there is a
/// view) until `shutdown`;
/// every other request is `404`. Nothing here reaches the gate or, but for
/// the engine's metrics, the engine.
pub async fn serve_metrics(
    listener: TcpListener,
    gate: Gate,
    render: RenderMetrics,
    engine: Option<Upstream>,
    router_view: Option<RouterView>,
    shutdown: impl Future<Output = ()>,
) {
    let extra = Extra::of(engine, router_view);
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!("accepting a metrics connection failed: {error}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let (gate, render, extra) = (gate.clone(), render.clone(), extra.clone());
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (gate, render, extra) = (gate.clone(), render.clone(), extra.clone());
            async move {
                if req.method() == Method::GET && req.uri().path() == "/metrics" {
                    metrics(gate, render, extra).await
                } else {
                    Ok::<_, Infallible>(json_error(
                        StatusCode::NOT_FOUND,
                        "only GET /metrics is served here",
                        "not_found_error",
                    ))
                }
            }
        });
        tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            // A scrape takes well under this; an idle scraper is closed.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(60), connection).await;
        });
    }
}
