//! [`Sidecar`]: which requests pass the gate, which pass straight through,
//! and what the sidecar answers itself (`/metrics`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use tokio::sync::watch;
use tower::ServiceExt;
use tower::util::BoxCloneService;
use tower_layer::Layer;
use tower_service::Service;

use super::answer::shutting_down;
use super::upstream::Forwarded;
use super::{Body, BoxError, Upstream};
use crate::builder::setters;
use crate::http::{OpenAiCostLayer, QosHeaders, RankHeader};
use crate::{AdmissionLayer, Gate};

/// The generation routes the gate admits by default: OpenAI's chat
/// completions, completions, responses and embeddings, Anthropic's
/// messages, llama.cpp's `/completion`, TGI's `/generate` and
/// `/generate_stream`. Only `POST`s to them are admitted.
pub const DEFAULT_ADMIT_PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/embeddings",
    "/completion",
    "/generate",
    "/generate_stream",
];

/// The header a trusted router sends a queue deadline in, in milliseconds
/// (honoured with [`SidecarBuilder::trust_router_headers`] only).
pub const DEADLINE_HEADER: &str = "x-admission-deadline-ms";

/// The largest engine `/metrics` text appended to the sidecar's own.
const MAX_ENGINE_METRICS_BYTES: usize = 16 << 20;

/// Renders the gate's metrics, in the Prometheus text format.
pub type RenderMetrics = Arc<dyn Fn() -> String + Send + Sync>;

type Admitted = BoxCloneService<Request<Body>, Response<Body>, Infallible>;

/// The sidecar's service: a reverse proxy to one engine with the gate in
/// front of its generation routes.
///
/// * `POST` to an admitted path ([`DEFAULT_ADMIT_PATHS`] unless
///   configured) passes the [`Gate`]: admitted, queued outside the engine,
///   or answered `529` at once. The permit rides in the response body, and
///   waiting ends at the first generated token of the engine's own stream
///   ([`Auto`](crate::detect::Auto)).
/// * Everything else (`/v1/models`, `/health`, `/props`, …) is forwarded
///   unadmitted, so `/health` is the engine's.
/// * `GET /metrics` is the sidecar's own: the gate's series, and with
///   [`merge_engine_metrics`](SidecarBuilder::merge_engine_metrics) the
///   engine's `/metrics` after them.
/// * Headers that steer the gate (`x-admission-*`, `x-data-parallel-rank`)
///   are removed from every request unless
///   [`trust_router_headers`](SidecarBuilder::trust_router_headers) says a
///   router in front sets them; then the rank, priority, tenant and
///   deadline headers are honoured, and passed on to the engine.
#[derive(Clone)]
pub struct Sidecar {
    admitted: Admitted,
    upstream: Upstream,
    paths: Arc<[String]>,
    trust_router_headers: bool,
    metrics: Option<RenderMetrics>,
    merge_engine_metrics: bool,
    gate: Gate,
    draining: watch::Receiver<bool>,
}

impl std::fmt::Debug for Sidecar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_settings(
            f,
            "Sidecar",
            &self.upstream,
            &self.paths,
            self.trust_router_headers,
        )
    }
}

/// How a sidecar and its builder show themselves: by the settings they
/// share (the gate shows its own state, the closures nothing).
fn debug_settings(
    f: &mut std::fmt::Formatter<'_>,
    name: &str,
    upstream: &Upstream,
    paths: &[String],
    trust_router_headers: bool,
) -> std::fmt::Result {
    f.debug_struct(name)
        .field("upstream", upstream)
        .field("paths", &paths)
        .field("trust_router_headers", &trust_router_headers)
        .finish_non_exhaustive()
}

/// Builds a [`Sidecar`].
pub struct SidecarBuilder {
    gate: Gate,
    upstream: Upstream,
    paths: Vec<String>,
    trust_router_headers: bool,
    cost: Option<OpenAiCostLayer>,
    overload_status: StatusCode,
    metrics: Option<RenderMetrics>,
    merge_engine_metrics: bool,
}

impl std::fmt::Debug for SidecarBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_settings(
            f,
            "SidecarBuilder",
            &self.upstream,
            &self.paths,
            self.trust_router_headers,
        )
    }
}

/// Starts the sidecar's drain at shutdown: every request still queued is
/// answered with `503`. Dropping it without [`start`](Drain::start) never
/// drains.
#[derive(Debug)]
pub struct Drain(watch::Sender<bool>);

impl Drain {
    /// From now on requests that have not reached the engine (queued in
    /// the gate, or arriving) are answered `503` with
    /// `x-admission-rejection-scope: worker` and reason `shutdown`; those
    /// the engine runs go on.
    pub fn start(&self) {
        self.0.send_replace(true);
    }
}

impl Sidecar {
    /// A sidecar admitting through `gate` and forwarding to `upstream`.
    pub fn builder(gate: Gate, upstream: Upstream) -> SidecarBuilder {
        SidecarBuilder {
            gate,
            upstream,
            paths: DEFAULT_ADMIT_PATHS.iter().map(|&p| p.to_owned()).collect(),
            trust_router_headers: false,
            cost: None,
            overload_status: StatusCode::from_u16(529).expect("529 is a status"),
            metrics: None,
            merge_engine_metrics: false,
        }
    }

    /// The gate requests are admitted through.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    fn is_admitted(&self, method: &Method, path: &str) -> bool {
        *method == Method::POST && self.paths.iter().any(|admitted| admitted == path)
    }
}

impl SidecarBuilder {
    /// The paths whose `POST`s pass the gate, replacing
    /// [`DEFAULT_ADMIT_PATHS`]. Matched exactly, without the query.
    pub fn admit_paths<I, P>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        self.paths = paths.into_iter().map(Into::into).collect();
        self
    }

    setters! {
        /// Whether a router in front sets the headers that steer the gate:
        /// `x-data-parallel-rank`, `x-admission-priority`, `x-admission-tenant`
        /// and `x-admission-deadline-ms`. Off by default: they are removed
        /// from client requests, so no client picks its own rank or priority.
        fn trust_router_headers(trust: bool) => trust_router_headers = trust;

        /// Estimates each admitted request's token cost from its OpenAI body
        /// ([`OpenAiCostLayer`]: the body is read, up to its bound, before the
        /// gate decides), for the token limits. Off by default: bodies stream.
        fn estimate_cost(estimate: bool) => cost = estimate.then(OpenAiCostLayer::new);

        /// Estimates each admitted request's token cost with `layer`, an
        /// [`OpenAiCostLayer`] configured as you need (its `max_model_len`,
        /// body bound, concurrent reads, read timeout, tokenizer).
        fn cost_layer(layer: OpenAiCostLayer) => cost = Some(layer);

        /// The status of the gate's overload answers; 529 by default.
        ///
        /// # Panics
        ///
        /// As [`AdmissionLayer::overload_status`].
        fn overload_status(status: StatusCode) => overload_status = status;

        /// Serves `GET /metrics` with `render` (the gate's series, say a
        /// Prometheus recorder's handle). Without it `/metrics` is forwarded
        /// to the engine like any other route.
        fn metrics(render: RenderMetrics) => metrics = Some(render);

        /// Appends the engine's own `GET /metrics` to the sidecar's, so one
        /// scrape target shows both.
        fn merge_engine_metrics(merge: bool) => merge_engine_metrics = merge;
    }

    /// The sidecar, and the [`Drain`] that starts its shutdown.
    pub fn build(self) -> (Sidecar, Drain) {
        let layer = AdmissionLayer::new(self.gate.clone()).overload_status(self.overload_status);
        let upstream = self.upstream.clone();
        // One overload status for the gate's answers and the cost layer's.
        let cost = self
            .cost
            .map(|cost| cost.overload_status(self.overload_status));
        let admitted: Admitted = match (self.trust_router_headers, cost) {
            (false, None) => boxed(layer.layer(upstream)),
            (false, Some(cost)) => boxed(cost.layer(layer.layer(upstream))),
            (true, cost) => {
                let layer = layer
                    .rank(RankHeader::default())
                    .qos_headers(QosHeaders::default())
                    .deadline_header(DEADLINE_HEADER);
                match cost {
                    Some(cost) => boxed(cost.layer(layer.layer(upstream))),
                    None => boxed(layer.layer(upstream)),
                }
            }
        };
        let (sender, draining) = watch::channel(false);
        let sidecar = Sidecar {
            admitted,
            upstream: self.upstream,
            paths: self.paths.into(),
            trust_router_headers: self.trust_router_headers,
            metrics: self.metrics,
            merge_engine_metrics: self.merge_engine_metrics,
            gate: self.gate,
            draining,
        };
        (sidecar, Drain(sender))
    }
}

/// One service type for every arrangement of the admitted route.
fn boxed<S, B>(service: S) -> Admitted
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    BoxCloneService::new(service.map_response(|response| response.map(Body::new)))
}

/// Whether a header steers the gate: a client must not set it itself.
fn steers_the_gate(name: &str) -> bool {
    name.starts_with("x-admission-") || name == RankHeader::DEFAULT_NAME
}

fn remove_steering_headers(headers: &mut HeaderMap) {
    let steering: Vec<_> = headers
        .keys()
        .filter(|name| steers_the_gate(name.as_str()))
        .cloned()
        .collect();
    for name in steering {
        headers.remove(name);
    }
}

type SidecarFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl<B> Service<Request<B>> for Sidecar
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = SidecarFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let mut req = req.map(Body::new);
        if !self.trust_router_headers {
            remove_steering_headers(req.headers_mut());
        }
        if *req.method() == Method::GET && req.uri().path() == "/metrics" {
            if let Some(render) = &self.metrics {
                return Box::pin(metrics(
                    self.gate.clone(),
                    Arc::clone(render),
                    self.merge_engine_metrics.then(|| self.upstream.clone()),
                ));
            }
        }
        if !self.is_admitted(req.method(), req.uri().path()) {
            return Box::pin(self.upstream.call(req));
        }
        let mut draining = self.draining.clone();
        if *draining.borrow() {
            return Box::pin(async { Ok(shutting_down()) });
        }
        let forwarded = Forwarded::default();
        req.extensions_mut().insert(forwarded.clone());
        let mut admitted = self.admitted.clone();
        Box::pin(async move {
            let response = admitted.call(req);
            tokio::pin!(response);
            tokio::select! {
                biased;
                response = &mut response => response,
                () = drained(&mut draining) => {
                    if forwarded.happened() {
                        // The engine has it: let it finish.
                        response.await
                    } else {
                        // Still queued: dropping the future frees its place.
                        Ok(shutting_down())
                    }
                }
            }
        })
    }
}

/// Completes when the drain starts; never, if its [`Drain`] was dropped
/// without starting it.
async fn drained(draining: &mut watch::Receiver<bool>) {
    if draining.wait_for(|&draining| draining).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// `GET /metrics`: the gate's series, then the engine's if asked.
async fn metrics(
    gate: Gate,
    render: RenderMetrics,
    engine: Option<Upstream>,
) -> Result<Response<Body>, Infallible> {
    gate.refresh_metrics();
    let mut text = render();
    if let Some(mut engine) = engine {
        text.push_str(&engine_metrics(&mut engine).await);
    }
    let mut response = Response::new(Body::from(text));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(response)
}

async fn engine_metrics(engine: &mut Upstream) -> String {
    let request = Request::get("/metrics")
        .body(Body::new(Empty::<Bytes>::new()))
        .expect("a GET of a fixed path is a valid request");
    let Ok(response) = engine.call(request).await;
    let status = response.status();
    if status != StatusCode::OK {
        return format!("# the engine's /metrics answered {status}\n");
    }
    match Limited::new(response.into_body(), MAX_ENGINE_METRICS_BYTES)
        .collect()
        .await
    {
        Ok(body) => {
            let mut text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text
        }
        Err(error) => format!("# the engine's /metrics could not be read: {error}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_gate_s_own_headers_are_steering() {
        let mut headers = HeaderMap::new();
        for name in [
            "x-admission-priority",
            "x-admission-tenant",
            "x-admission-deadline-ms",
            "x-data-parallel-rank",
            "authorization",
            "x-request-id",
        ] {
            headers.insert(name, "1".parse().unwrap());
        }
        remove_steering_headers(&mut headers);
        let mut left: Vec<_> = headers.keys().map(|name| name.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "x-request-id"]);
    }
}
