//! An OpenAI-compatible frontend that spreads requests over workers (the
//! `openai_server` example, or any server behind the gate) and acts on
//! their overload answers.
//!
//! ```text
//! cargo run -p tower-admission-sim --example openai_server -- --listen 127.0.0.1:8001
//! cargo run -p tower-admission-sim --example openai_server -- --listen 127.0.0.1:8002
//! cargo run -p tower-admission-sim --example frontend -- \
//!   --listen 127.0.0.1:8000 --worker http://127.0.0.1:8001 --worker http://127.0.0.1:8002
//! ```
//!
//! Built from tower's parts and the crate's `route` module, nothing
//! home-made:
//!
//! - one `route::Worker` per `--worker` (a hyper client for that address):
//!   a worker-scoped rejection takes it out of rotation for its
//!   `Retry-After` (at most a second; a later success ends that early), a
//!   rank-scoped one keeps it;
//! - `tower::balance::p2c::Balance` over them (a `ServiceList` discover),
//!   picking the worker with fewer requests in flight of two at random;
//! - `tower::retry::Retry` with `route::OverloadRetry`: an overload answer
//!   is retried on another worker after a jittered backoff, within a retry
//!   budget of 5% plus one a second (`TpsBudget`), at most three times and within ten
//!   seconds of the request's arrival; when the budget or the deadline says
//!   no, the client gets the worker's overload answer as it was;
//! - a worker it cannot connect to answers `503` with `Retry-After: 1`, so
//!   it too leaves rotation for a second and its requests go elsewhere.
//!
//! Routes: `POST /v1/chat/completions` and `POST /v1/completions` go to the
//! workers (answers stream through as they come), `GET /metrics`
//! (Prometheus: requests routed per worker, retries, cooldowns, answers by
//! status) and `GET /health` answer here. A request body is read whole
//! before routing (at most 16 MiB), so that it can be sent again.
//!
//! Clients never steer the workers' gates: the `x-admission-*` and
//! `x-data-parallel-rank` headers they send are removed, and the tenant and
//! priority of a request are set here from `--api-key` (the key in its
//! `Authorization: Bearer` header), or not at all. Workers should accept
//! those headers from this frontend only.
//!
//! The first line on stdout is `listening on http://ADDRESS`, so a script
//! can start it with `--listen 127.0.0.1:0` and read the port. Ctrl-C or
//! SIGTERM stops it.

// The shutdown and logging half; the simulated engine's half serves the workers.
#[allow(dead_code)]
mod common;

use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Parser;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::ServiceList;
use tower::retry::{Policy, Retry};
use tower::{BoxError, Service, ServiceExt};
use tower_admission_route::{self as route, Deadline, OverloadRetry, Worker, WorkerHandle};

/// An OpenAI-compatible frontend balancing over workers by their overload
/// answers.
#[derive(Debug, Parser)]
#[command(name = "frontend")]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on the
    /// first line of stdout)
    #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1:8000")]
    listen: SocketAddr,

    /// A worker's base URL, e.g. http://127.0.0.1:8001; repeat for each
    /// worker
    #[arg(long = "worker", value_name = "URL", required = true, value_parser = worker_url)]
    workers: Vec<Uri>,

    /// A client's API key and what the workers' gates should know of it,
    /// as KEY=TENANT or KEY=TENANT:PRIORITY: a request with
    /// `Authorization: Bearer KEY` goes to the workers with
    /// `x-admission-tenant: TENANT` (and `x-admission-priority`); repeat
    /// for each key. The admission headers clients send themselves are
    /// always removed: only this table sets them.
    #[arg(long = "api-key", value_name = "KEY=TENANT[:PRIORITY]", value_parser = api_key)]
    api_keys: Vec<ApiKey>,
}

/// What the frontend tells the workers about one API key's requests.
#[derive(Debug, Clone)]
struct ApiKey {
    key: String,
    tenant: axum::http::HeaderValue,
    priority: Option<i32>,
}

fn api_key(raw: &str) -> Result<ApiKey, String> {
    let (key, grant) = raw
        .split_once('=')
        .ok_or_else(|| format!("{raw:?} is not KEY=TENANT[:PRIORITY]"))?;
    let (tenant, priority) = match grant.rsplit_once(':') {
        Some((tenant, priority)) => {
            let priority = priority
                .parse::<i32>()
                .map_err(|_| format!("{raw:?}: the priority {priority:?} is not an integer"))?;
            (tenant, Some(priority))
        }
        None => (grant, None),
    };
    if key.is_empty() || tenant.is_empty() {
        return Err(format!("{raw:?}: the key and the tenant must not be empty"));
    }
    let tenant = axum::http::HeaderValue::from_str(tenant)
        .map_err(|_| format!("{raw:?}: the tenant {tenant:?} is not a header value"))?;
    Ok(ApiKey {
        key: key.to_owned(),
        tenant,
        priority,
    })
}

fn worker_url(raw: &str) -> Result<Uri, String> {
    let uri: Uri = raw
        .trim()
        .parse()
        .map_err(|error| format!("{raw:?} is not a URL: {error}"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!(
            "{raw:?} is not an http:// URL with a host (this example speaks plain HTTP/1.1)"
        ));
    }
    if uri
        .path_and_query()
        .is_some_and(|path| path.as_str() != "/")
    {
        return Err(format!(
            "{raw:?} has a path: give the worker's base URL, the request's path is appended"
        ));
    }
    Ok(uri)
}

/// Largest request body read before routing.
const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// No retry starts later than this after the request arrived.
const RETRY_DEADLINE: Duration = Duration::from_secs(10);

/// Requests waiting for a ready worker (all cooling, say) at most.
const BUFFER: usize = 1024;

type WorkerBody = Full<Bytes>;
type Upstream = Buffer<
    axum::http::Request<WorkerBody>,
    <Balance<ServiceList<Vec<Worker<WorkerClient>>>, axum::http::Request<WorkerBody>> as Service<
        axum::http::Request<WorkerBody>,
    >>::Future,
>;

/// What every handler shares.
#[derive(Clone)]
struct App {
    upstream: Retry<Counted<OverloadRetry>, Upstream>,
    workers: Arc<Vec<(String, WorkerHandle)>>,
    metrics: PrometheusHandle,
    api_keys: Arc<Vec<ApiKey>>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    common::init_logging();

    let metrics = match PrometheusBuilder::new().install_recorder() {
        Ok(handle) => handle,
        Err(error) => {
            eprintln!("error: cannot install the Prometheus recorder: {error}");
            return ExitCode::FAILURE;
        }
    };
    describe_metrics();

    let client = Client::builder(TokioExecutor::new()).build_http::<WorkerBody>();
    let workers: Vec<Worker<WorkerClient>> = args
        .workers
        .iter()
        .map(|base| {
            Worker::new(WorkerClient {
                client: client.clone(),
                base: base.clone(),
            })
        })
        .collect();
    let handles: Vec<(String, WorkerHandle)> = args
        .workers
        .iter()
        .zip(&workers)
        .map(|(base, worker)| (worker_label(base), worker.handle()))
        .collect();
    let balance = Balance::new(ServiceList::new(workers));
    let upstream = Buffer::new(balance, BUFFER);
    let budget = Arc::new(OverloadRetry::default_budget());
    let app = App {
        upstream: Retry::new(Counted(OverloadRetry::new(budget)), upstream),
        workers: Arc::new(handles),
        metrics,
        api_keys: Arc::new(args.api_keys.clone()),
    };

    let router = Router::new()
        .route("/v1/chat/completions", post(forward))
        .route("/v1/completions", post(forward))
        .route("/metrics", get(metrics_text))
        .route("/health", get(|| async { "ok\n" }))
        .fallback(not_found)
        .with_state(app.clone());

    let (listener, address, shutdown) = match common::bind(args.listen).await {
        Ok(bound) => bound,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let names: Vec<&str> = app.workers.iter().map(|(name, _)| name.as_str()).collect();
    // Printed at once (stdout is line-buffered): scripts wait for this line.
    println!("listening on http://{address}");
    println!("workers: {}", names.join(", "));
    println!(
        "routing: power of two choices by requests in flight; a worker-scoped overload answer \
         takes a worker out for its Retry-After (at most 1 s); retries: jittered backoff, budget \
         5% + 1/s, at most 3, within {} s",
        RETRY_DEADLINE.as_secs()
    );
    println!("routes: POST /v1/chat/completions, POST /v1/completions, GET /metrics, GET /health");
    println!(
        "admission headers: from clients removed; set from {} API key(s)",
        args.api_keys.len()
    );

    let served = common::serve_until_shutdown(shutdown, |signal| {
        axum::serve(listener, router)
            .with_graceful_shutdown(signal)
            .into_future()
    })
    .await;
    match served {
        Ok(()) => {
            eprintln!("stopped");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: the server failed: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `host:port` of a worker, for labels and the banner.
fn worker_label(base: &Uri) -> String {
    base.authority()
        .map_or_else(|| base.to_string(), |authority| authority.to_string())
}

// ---------------------------------------------------------------------------
// Forwarding

/// One worker's HTTP/1.1 client: sends a request to the worker's address,
/// keeping its path and query.
///
/// A worker it cannot connect to answers `503` with `Retry-After: 1` and
/// `x-admission-rejection-scope: worker`, as an overloaded gate would: the
/// request never reached it, so it is retried
/// elsewhere, and the worker leaves rotation for a second instead of
/// attracting requests by failing them fast (it has no requests in flight,
/// the lightest load there is).
#[derive(Clone)]
struct WorkerClient {
    client: Client<HttpConnector, WorkerBody>,
    base: Uri,
}

/// A worker's answer, or the frontend's `503` for a worker it cannot reach.
type WorkerAnswer = http_body_util::Either<hyper::body::Incoming, Full<Bytes>>;

impl Service<axum::http::Request<WorkerBody>> for WorkerClient {
    type Response = axum::http::Response<WorkerAnswer>;
    type Error = hyper_util::client::legacy::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The client pools connections and queues requests itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: axum::http::Request<WorkerBody>) -> Self::Future {
        let mut parts = self.base.clone().into_parts();
        parts.path_and_query = request.uri().path_and_query().cloned();
        *request.uri_mut() = Uri::from_parts(parts).expect("a base URL and a request path");
        let answer = self.client.request(request);
        let worker = worker_label(&self.base);
        Box::pin(async move {
            match answer.await {
                Ok(response) => Ok(response.map(http_body_util::Either::Left)),
                Err(error) if error.is_connect() => Ok(unreachable(&worker, &error)),
                Err(error) => Err(error),
            }
        })
    }
}

fn unreachable(
    worker: &str,
    error: &hyper_util::client::legacy::Error,
) -> axum::http::Response<WorkerAnswer> {
    let body = json!({
        "error": {
            "message": format!("cannot connect to worker {worker}: {}", error_chain(error)),
            "type": "server_error",
            "param": null,
            "code": 503,
        }
    });
    axum::http::Response::builder()
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::RETRY_AFTER, "1")
        // The request never left the frontend: say so as the gate does,
        // so that the retry policy sends it elsewhere whatever its method.
        .header("x-admission-rejection-scope", "worker")
        .body(http_body_util::Either::Right(Full::new(Bytes::from(
            body.to_string(),
        ))))
        .expect("a valid response")
}

/// Hop-by-hop headers, which a proxy does not forward; `host` and
/// `content-length` are set again for the next hop.
const NOT_FORWARDED: [HeaderName; 8] = [
    header::CONNECTION,
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

/// The headers that steer a worker's gate: rank, priority, tenant,
/// deadline, cost. Workers honour them, so they must come from here, never
/// from a client: a client that sets its own priority jumps every queue.
fn steers_the_gate(name: &HeaderName) -> bool {
    name.as_str().starts_with("x-admission-") || name.as_str() == "x-data-parallel-rank"
}

/// Removes what the client said to the gates, then says what the API key
/// table trusts.
fn set_admission_headers(headers: &mut HeaderMap, api_keys: &[ApiKey]) {
    let steering: Vec<HeaderName> = headers
        .keys()
        .filter(|name| steers_the_gate(name))
        .cloned()
        .collect();
    for name in steering {
        headers.remove(name);
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(grant) = presented.and_then(|key| api_keys.iter().find(|grant| grant.key == key))
    else {
        return;
    };
    headers.insert("x-admission-tenant", grant.tenant.clone());
    if let Some(priority) = grant.priority {
        headers.insert("x-admission-priority", priority.into());
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in &NOT_FORWARDED {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

async fn forward(State(app): State<App>, request: Request) -> Response {
    metrics::counter!("frontend_requests_total").increment(1);
    let response = route_request(app, request).await;
    metrics::counter!("frontend_responses_total", "status" => response.status().as_str().to_owned())
        .increment(1);
    response
}

async fn route_request(app: App, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, MAX_REQUEST_BYTES).await {
        Ok(body) => body,
        Err(error) => {
            return api_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!(
                    "cannot read the request body (at most {MAX_REQUEST_BYTES} bytes): {error}"
                ),
            );
        }
    };
    strip_hop_by_hop(&mut parts.headers);
    set_admission_headers(&mut parts.headers, &app.api_keys);
    let mut outgoing = axum::http::Request::new(Full::new(body));
    *outgoing.method_mut() = parts.method;
    *outgoing.uri_mut() = parts
        .uri
        .path_and_query()
        .map_or_else(|| Uri::from_static("/"), |path| Uri::from(path.clone()));
    *outgoing.headers_mut() = parts.headers;
    outgoing
        .extensions_mut()
        .insert(Deadline::after(RETRY_DEADLINE));

    let answer = call_upstream(app.upstream, outgoing).await;
    match answer {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, Body::new(body))
        }
        Err(error) => api_error(
            StatusCode::BAD_GATEWAY,
            "server_error",
            format!("no answer from the worker: {}", error_chain(&*error)),
        ),
    }
}

/// The routed call as a named `Send` future: written inline in the async
/// handler, the compiler cannot prove the handler's future `Send` (its
/// error conversions are checked for every lifetime).
fn call_upstream(
    upstream: Retry<Counted<OverloadRetry>, Upstream>,
    request: axum::http::Request<WorkerBody>,
) -> impl Future<Output = Result<axum::http::Response<route::ResponseBody<WorkerAnswer>>, BoxError>> + Send
{
    upstream.oneshot(request)
}

fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The retry policy, counting the retries it allows.
#[derive(Clone)]
struct Counted<P>(P);

impl<P, Req, Res> Policy<Req, Res, BoxError> for Counted<P>
where
    P: Policy<Req, Res, BoxError>,
{
    type Future = P::Future;

    fn retry(
        &mut self,
        request: &mut Req,
        result: &mut Result<Res, BoxError>,
    ) -> Option<P::Future> {
        let retry = self.0.retry(request, result);
        if retry.is_some() {
            metrics::counter!("frontend_retries_total").increment(1);
        }
        retry
    }

    fn clone_request(&mut self, request: &Req) -> Option<Req> {
        self.0.clone_request(request)
    }
}

// ---------------------------------------------------------------------------
// Metrics and errors

fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        "frontend_requests_total",
        "Requests received for the workers."
    );
    describe_counter!(
        "frontend_responses_total",
        "Answers sent to clients, by HTTP status (after retries)."
    );
    describe_counter!(
        "frontend_retries_total",
        "Overload answers retried on another worker."
    );
    describe_counter!(
        "frontend_worker_requests_total",
        "Requests routed to each worker, retries included."
    );
    describe_counter!(
        "frontend_worker_rejections_total",
        "Overload answers from each worker, by scope (rank or worker)."
    );
    describe_counter!(
        "frontend_worker_cooldowns_total",
        "Times a worker-scoped rejection took the worker out of rotation."
    );
    describe_gauge!(
        "frontend_worker_in_flight",
        "Requests routed to the worker whose answer has not ended."
    );
    describe_gauge!(
        "frontend_worker_cooling",
        "1 while the worker is out of rotation after a worker-scoped rejection."
    );
}

async fn metrics_text(State(app): State<App>) -> Response {
    for (name, handle) in app.workers.iter() {
        let worker = name.clone();
        let stats = handle.stats();
        metrics::counter!("frontend_worker_requests_total", "worker" => worker.clone())
            .absolute(stats.requests);
        metrics::counter!("frontend_worker_rejections_total", "worker" => worker.clone(), "scope" => "worker")
            .absolute(stats.worker_rejections);
        metrics::counter!("frontend_worker_rejections_total", "worker" => worker.clone(), "scope" => "rank")
            .absolute(stats.rank_rejections);
        metrics::counter!("frontend_worker_cooldowns_total", "worker" => worker.clone())
            .absolute(stats.cooldowns);
        metrics::gauge!("frontend_worker_in_flight", "worker" => worker.clone())
            .set(handle.in_flight() as f64);
        metrics::gauge!("frontend_worker_cooling", "worker" => worker)
            .set(if handle.is_cooling() { 1.0 } else { 0.0 });
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics.render(),
    )
        .into_response()
}

/// An OpenAI-style error: `{"error":{"message","type","param","code"}}`.
fn api_error(status: StatusCode, kind: &str, message: String) -> Response {
    let body = json!({
        "error": {"message": message, "type": kind, "param": null, "code": status.as_u16()}
    });
    (status, axum::Json(body)).into_response()
}

async fn not_found() -> Response {
    api_error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such route; try POST /v1/chat/completions or POST /v1/completions".to_owned(),
    )
}
