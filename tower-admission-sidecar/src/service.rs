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
use tower::ServiceExt;
use tower::util::BoxCloneService;
use tower_layer::Layer;
use tower_service::Service;

use super::answer::mark_as_the_proxy_s;
use super::auth::ApiKeys;
use super::body::{Body, BoxError};
use super::intake::{Intake, RequestBodyLimits};
use super::limits::{DEFAULT_MAX_PASSTHROUGH_REQUESTS, Passthrough};
use super::path::{DEFAULT_PASS_PATHS, Routes};
use super::router_view::RouterView;
use super::upstream::Upstream;
use tower_admission::http::{OpenAiCostLayer, QosHeaders, REJECTION_REASON, RankHeader};
use tower_admission::{AdmissionLayer, Gate, RejectionReason};

/// The generation routes the gate always admits by default, even where a
/// pass list names them: OpenAI's chat completions, completions, responses
/// and embeddings, Anthropic's messages, llama.cpp's `/completion`, TGI's
/// `/generate` and `/generate_stream`. Every other `POST` is admitted too,
/// unless the pass list ([`DEFAULT_PASS_PATHS`](crate::DEFAULT_PASS_PATHS))
/// names it.
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
/// * Every `POST` but those to the pass list
///   ([`DEFAULT_PASS_PATHS`](crate::DEFAULT_PASS_PATHS) unless configured),
///   decided on the normalised path, passes the [`Gate`]: admitted, queued outside the engine,
///   or answered `529` at once. The permit rides in the response body, and
///   waiting ends at the first generated token of the engine's own stream
///   ([`Auto`](tower_admission::detect::Auto)).
/// * Everything else (`GET`s, `POST`s to the cheap routes) is forwarded
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
    routes: Arc<Routes>,
    intake: Intake,
    passthrough: Passthrough,
    api_keys: Option<ApiKeys>,
    tenant_from_api_key: bool,
    trust_router_headers: bool,
    metrics: Option<RenderMetrics>,
    merge_engine_metrics: bool,
    router_view: Option<RouterView>,
    gate: Gate,
}

impl std::fmt::Debug for Sidecar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_settings(
            f,
            "Sidecar",
            &self.upstream,
            &self.routes.admit,
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
    pass_paths: Vec<String>,
    body_limits: RequestBodyLimits,
    max_passthrough: usize,
    api_keys: Option<ApiKeys>,
    tenant_from_api_key: bool,
    trust_router_headers: bool,
    cost: Option<OpenAiCostLayer>,
    overload_status: StatusCode,
    metrics: Option<RenderMetrics>,
    merge_engine_metrics: bool,
    router_view: Option<RouterView>,
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
pub struct Drain(Gate);

impl Drain {
    /// From now on requests that have not reached the engine (queued in
    /// the gate, or arriving) are answered `503` with
    /// `x-admission-rejection-scope: worker` and reason `shutdown`, and
    /// counted in `rejection_total{reason="shutdown"}` ([`Gate::shut_down`]);
    /// those the engine runs go on.
    pub fn start(&self) {
        self.0.shut_down();
    }
}

impl Sidecar {
    /// A sidecar admitting through `gate` and forwarding to `upstream`.
    pub fn builder(gate: Gate, upstream: Upstream) -> SidecarBuilder {
        SidecarBuilder {
            gate,
            upstream,
            paths: DEFAULT_ADMIT_PATHS.iter().map(|&p| p.to_owned()).collect(),
            pass_paths: DEFAULT_PASS_PATHS.iter().map(|&p| p.to_owned()).collect(),
            body_limits: RequestBodyLimits::default(),
            max_passthrough: DEFAULT_MAX_PASSTHROUGH_REQUESTS,
            api_keys: None,
            tenant_from_api_key: false,
            trust_router_headers: false,
            cost: None,
            overload_status: StatusCode::from_u16(529).expect("529 is a status"),
            metrics: None,
            merge_engine_metrics: false,
            router_view: None,
        }
    }

    /// The gate requests are admitted through.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }
}

impl SidecarBuilder {
    /// The paths whose `POST`s always pass the gate, even where the pass
    /// list names them, replacing [`DEFAULT_ADMIT_PATHS`]. Compared with
    /// the normalised path ([`normalise_path`](crate::normalise_path)),
    /// case ignored, without the query. Every `POST` not on the pass list
    /// passes the gate anyway.
    pub fn admit_paths<I, P>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        self.paths = paths.into_iter().map(Into::into).collect();
        self
    }

    /// The paths whose `POST`s pass straight through, unadmitted, unless
    /// the admit list names them, replacing
    /// [`DEFAULT_PASS_PATHS`](crate::DEFAULT_PASS_PATHS). Compared with the
    /// normalised path, exactly, without the query.
    pub fn pass_paths<I, P>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        self.pass_paths = paths.into_iter().map(Into::into).collect();
        self
    }

    /// How the body of a request bound for the gate is read, whole, before
    /// the gate sees it ([`RequestBodyLimits`]; 32 MiB within 30 s, and
    /// 256 MiB of every body read or held at once, by
    /// default).
    pub fn request_body_limits(mut self, limits: RequestBodyLimits) -> Self {
        self.body_limits = limits;
        self
    }

    /// The API keys every request but the health probes must present,
    /// checked before the gate (`401` otherwise). None by default.
    pub fn api_keys(mut self, keys: ApiKeys) -> Self {
        self.api_keys = Some(keys);
        self
    }

    /// Makes each API key ([`api_keys`](Self::api_keys)) its own tenant
    /// for fair queueing (behaviour §8): the key, hashed with a per-process
    /// seed, is the request's `x-admission-tenant`, replacing any other, so
    /// one key cannot take everyone's queue. Off by default.
    pub fn tenant_from_api_key(mut self, on: bool) -> Self {
        self.tenant_from_api_key = on;
        self
    }

    /// Requests passing straight through to the engine at once, across
    /// every client (64 by default); one more is answered `503` at once.
    pub fn max_passthrough_requests(mut self, max: usize) -> Self {
        self.max_passthrough = max;
        self
    }

    /// Whether a router in front sets the headers that steer the gate:
    /// `x-data-parallel-rank`, `x-admission-priority`, `x-admission-tenant`
    /// and `x-admission-deadline-ms`. Off by default: they are removed
    /// from client requests, so no client picks its own rank or priority.
    pub fn trust_router_headers(mut self, trust: bool) -> Self {
        self.trust_router_headers = trust;
        self
    }

    /// Estimates each admitted request's token cost from its OpenAI body
    /// ([`OpenAiCostLayer`]: the body is read, up to its bound, before the
    /// gate decides), for the token limits. Off by default: bodies stream.
    pub fn estimate_cost(mut self, estimate: bool) -> Self {
        self.cost = estimate.then(OpenAiCostLayer::new);
        self
    }

    /// Estimates each admitted request's token cost with `layer`, an
    /// [`OpenAiCostLayer`] configured as you need (its `max_model_len`,
    /// body bound, concurrent reads, read timeout, tokenizer).
    pub fn cost_layer(mut self, layer: OpenAiCostLayer) -> Self {
        self.cost = Some(layer);
        self
    }

    /// The status of the gate's overload answers; 529 by default.
    ///
    /// # Panics
    ///
    /// As [`AdmissionLayer::overload_status`].
    pub fn overload_status(mut self, status: StatusCode) -> Self {
        self.overload_status = status;
        self
    }

    /// Serves `GET /metrics` with `render` (the gate's series, say a
    /// Prometheus recorder's handle). Without it `/metrics` is forwarded
    /// to the engine like any other route.
    pub fn metrics(mut self, render: RenderMetrics) -> Self {
        self.metrics = Some(render);
        self
    }

    /// Appends the engine's own `GET /metrics` to the sidecar's, so one
    /// scrape target shows both.
    pub fn merge_engine_metrics(mut self, merge: bool) -> Self {
        self.merge_engine_metrics = merge;
        self
    }

    /// Serves the [`RouterView`] on `GET /metrics` after the gate's series:
    /// the engine family's own load gauges with the gate's queue counted
    /// in, for routers that read them. With
    /// [`merge_engine_metrics`](Self::merge_engine_metrics) the engine's
    /// series come from the view's background scrape, without those the
    /// view serves.
    pub fn router_view(mut self, view: RouterView) -> Self {
        self.router_view = Some(view);
        self
    }

    /// The sidecar, and the [`Drain`] that starts its shutdown.
    pub fn build(self) -> (Sidecar, Drain) {
        let mut layer =
            AdmissionLayer::new(self.gate.clone()).overload_status(self.overload_status);
        if self.tenant_from_api_key && !self.trust_router_headers {
            // The tenant header is the sidecar's own (set from the key);
            // the client's steering headers are removed before it.
            layer = layer.qos_headers(QosHeaders::default());
        }
        let upstream = self.upstream.clone();
        // One overload status for the gate's answers and the cost layer's.
        let cost = self.cost.map(|cost| {
            cost.overload_status(self.overload_status)
                .gate(self.gate.clone())
        });
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
        let drain = Drain(self.gate.clone());
        let sidecar = Sidecar {
            admitted,
            upstream: self.upstream,
            routes: Arc::new(Routes {
                admit: self.paths,
                pass: self.pass_paths,
            }),
            intake: Intake::new(self.body_limits, self.gate.clone(), self.overload_status),
            passthrough: Passthrough::new(self.max_passthrough),
            api_keys: self.api_keys,
            tenant_from_api_key: self.tenant_from_api_key,
            trust_router_headers: self.trust_router_headers,
            metrics: self.metrics,
            merge_engine_metrics: self.merge_engine_metrics,
            router_view: self.router_view,
            gate: self.gate,
        };
        (sidecar, drain)
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
        if let Some(keys) = &self.api_keys {
            let tenant = match keys.check(&req) {
                Err(refused) => {
                    let answer = refused.answer();
                    return Box::pin(async move { Ok(answer) });
                }
                Ok(key) if self.tenant_from_api_key => key.and_then(|key| keys.tenant(key)),
                Ok(_) => None,
            };
            if let Some(tenant) = tenant {
                req.headers_mut()
                    .insert(QosHeaders::DEFAULT_TENANT_NAME, tenant);
            }
        }
        if *req.method() == Method::GET && req.uri().path() == "/metrics" {
            if let Some(render) = &self.metrics {
                return Box::pin(metrics(
                    self.gate.clone(),
                    Arc::clone(render),
                    Extra::of(
                        self.merge_engine_metrics.then(|| self.upstream.clone()),
                        self.router_view.clone(),
                    ),
                ));
            }
        }
        match self.routes.admits(&mut req) {
            Ok(true) => {}
            Ok(false) => {
                let place = self.passthrough.enter();
                return Box::pin(Passthrough::forward(place, self.upstream.clone(), req));
            }
            Err(unroutable) => return Box::pin(async move { Ok(unroutable.answer()) }),
        }
        // Once the drain starts, the shut gate answers every request that
        // has not reached the engine: queued, or arriving. The body is read
        // first (bounded in size and time), so a slow sender holds no place.
        let mut admitted = self.admitted.clone();
        let intake = self.intake.clone();
        Box::pin(async move {
            let req = match intake.read(req).await {
                Ok(req) => req,
                Err(answer) => return Ok(answer),
            };
            let mut response = admitted.call(req).await?;
            let reason = response.headers().get(REJECTION_REASON);
            if reason.is_some_and(|reason| reason == RejectionReason::Shutdown.as_str()) {
                // The shutdown `503` is the sidecar's, not the engine's.
                mark_as_the_proxy_s(&mut response);
            }
            Ok(response)
        })
    }
}

/// What `GET /metrics` serves after the gate's own series.
#[derive(Debug, Clone)]
pub(crate) enum Extra {
    /// Nothing.
    Nothing,
    /// The engine's `/metrics`, fetched at the scrape.
    Engine(Box<Upstream>),
    /// The router view, and (when `true`) the engine's last background
    /// scrape without the series the view serves.
    View(RouterView, bool),
}

impl Extra {
    /// From the engine to merge (if any) and the router view (if any).
    pub(crate) fn of(merge: Option<Upstream>, view: Option<RouterView>) -> Extra {
        match (merge, view) {
            (merge, Some(view)) => Extra::View(view, merge.is_some()),
            (Some(engine), None) => Extra::Engine(Box::new(engine)),
            (None, None) => Extra::Nothing,
        }
    }
}

/// `GET /metrics`: the gate's series, then the router view and the
/// engine's series if asked.
pub(crate) async fn metrics(
    gate: Gate,
    render: RenderMetrics,
    extra: Extra,
) -> Result<Response<Body>, Infallible> {
    gate.refresh_metrics();
    let mut text = render();
    match extra {
        Extra::Nothing => {}
        Extra::Engine(mut engine) => text.push_str(&engine_metrics(&mut engine).await),
        Extra::View(view, merge) => text.push_str(&view.render(merge)),
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
