//! An OpenAI-compatible inference server on the simulated engine, with
//! admission control in front of it.
//!
//! ```text
//! cargo run -p tower-admission-sim --example openai_server -- --max-num-seqs 4 --time-scale 2
//! ```
//!
//! Routes: `POST /v1/chat/completions` and `POST /v1/completions` (server-sent
//! events when `"stream": true`, JSON otherwise), `GET /metrics` (Prometheus
//! text: the gate's series and the simulated engine's) and `GET /health`.
//! Both generation routes share one gate; its waiting capacity ends at the
//! first chunk that carries a token ([`OpenAiSse`]) or, for a whole JSON
//! answer, when the engine generates the first token (the handler marks the
//! request's [`FirstToken`]), and the rank comes from
//! the `x-data-parallel-rank` header. `/metrics` and `/health` sit outside
//! the gate: an overloaded worker still answers its probes.
//!
//! Quality of service (behaviour §8): a request's priority comes from the
//! `x-admission-priority` header (an integer, higher first, default 0) and
//! its tenant from `x-admission-tenant`; `--priority-bands`,
//! `--tenant-weight NAME=WEIGHT` and `--aging-interval-ms` configure the
//! queue discipline. In production these headers belong to a trusted router
//! that strips the client's own copies.
//!
//! ```text
//! cargo run -p tower-admission-sim --example openai_server -- --max-num-seqs 1 \
//!   --tenant-weight chat=4 --aging-interval-ms 2000
//! curl localhost:8000/v1/chat/completions -H 'content-type: application/json' \
//!   -H 'x-admission-priority: 5' -H 'x-admission-tenant: chat' \
//!   -d '{"model":"sim","messages":[{"role":"user","content":"Hi"}],"max_tokens":8}'
//! ```
//!
//! ```text
//! curl -N localhost:8000/v1/chat/completions -H 'content-type: application/json' \
//!   -d '{"model":"sim","messages":[{"role":"user","content":"Hi"}],"stream":true,"max_tokens":8}'
//! ```
//!
//! The first line on stdout is `listening on http://ADDRESS`, so a script
//! can start it with `--listen 127.0.0.1:0` and read the port. Ctrl-C or
//! SIGTERM stops it: no new connections, and open responses get a few
//! seconds to finish.
//!
//! Each generation request's body is read first, before the gate
//! (`OpenAiCostLayer`, the outermost layer), so its prompt and output
//! tokens are known when the gate weighs it: at most 64 bodies are read at
//! once (more get the worker-scoped `529`, reason `body_reads`), each must
//! arrive within 30 s (else `408`) and within 4 MiB (else `413`), and a
//! prompt longer than `--max-model-len` is `400`, all before admission.
//! Then the gate: an overloaded server answers with its overload answer
//! before the handler looks at the request. Errors of the request itself are `400` with an OpenAI-style body (`"type":
//! "invalid_request_error"`). Prompt tokens are estimated from the text (four
//! bytes a token); the answer is `max_completion_tokens` or `max_tokens`
//! synthetic words (`finish_reason: "length"`), or `--default-max-tokens`
//! words (`"stop"`) when the request sets neither.

#[path = "openai_server/answers.rs"]
mod answers;
mod common;
#[path = "openai_server/requests.rs"]
mod requests;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use futures::Stream;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tower_admission::detect::OpenAiSse;
use tower_admission::http::FirstToken;
use tower_admission::http::OpenAiCostLayer;
use tower_admission::{
    AdmissionArgs, AdmissionConfig, AdmissionLayer, Admitted, Describe, Gate, QosHeaders,
    RankHeader,
};
use tower_admission_sim::{Request as EngineRequest, SimEngine, SubmitError, TokenStream};

use answers::*;
use common::{EngineArgs, Plan};
use requests::*;

/// An OpenAI-compatible server on a simulated continuous-batching engine,
/// behind tower-admission's gate.
#[derive(Debug, Parser)]
#[command(name = "openai_server")]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on the
    /// first line of stdout)
    #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1:8000")]
    listen: SocketAddr,

    #[command(flatten)]
    engine: EngineArgs,

    #[command(flatten)]
    admission: AdmissionArgs,

    /// HTTP status of overload answers, e.g. 503 or 429 instead of 529
    #[arg(long, value_name = "STATUS", default_value = "529", value_parser = overload_status)]
    overload_status: StatusCode,

    /// Serve without the gate, to compare: every request goes straight to
    /// the engine, whose own queue grows without bound
    #[arg(long)]
    no_admission: bool,

    /// Do not report the engine's capacity to the gate, as vLLM tells a
    /// sidecar nothing about its max_num_seqs: limits not set by a flag or
    /// variable stay at their defaults (10000 per rank, queue 20000); with
    /// --adaptive-waiting-limit the gate finds the waiting limit itself
    #[arg(long)]
    no_capacity_report: bool,

    /// Prefix of the gate's metric names (dynamo_backend_admission gives the
    /// source system's names)
    #[arg(long, value_name = "PREFIX", default_value = tower_admission::metrics::DEFAULT_PREFIX)]
    metrics_prefix: String,
}

/// The QoS part of the startup banner: where priority and tenant come
/// from, and the settings of the queue discipline.
fn describe_qos(config: &AdmissionConfig) -> String {
    let explicit = config.explicit();
    let aging = explicit.aging_interval.map_or_else(
        || "off".to_owned(),
        |interval| format!("{} ms", interval.as_millis()),
    );
    let bands = match explicit.priority_bands.as_slice() {
        [] => "every priority".to_owned(),
        bands => bands
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join(","),
    };
    let weights: Vec<String> = explicit
        .tenant_weights
        .iter()
        .map(|(tenant, weight)| format!("{tenant}={weight}"))
        .collect();
    let weights = if weights.is_empty() {
        "all 1".to_owned()
    } else {
        weights.join(",")
    };
    format!(
        "qos: priority from {}, tenant from {}; priority bands {bands}; tenant weights {weights}; \
         aging interval {aging}",
        QosHeaders::DEFAULT_PRIORITY_NAME,
        QosHeaders::DEFAULT_TENANT_NAME,
    )
}

fn overload_status(raw: &str) -> Result<StatusCode, String> {
    raw.trim()
        .parse::<u16>()
        .ok()
        .and_then(|code| StatusCode::from_u16(code).ok())
        .filter(|status| status.is_client_error() || status.is_server_error())
        .ok_or_else(|| format!("{raw:?} is not an HTTP error status (400-599)"))
}

/// What every handler shares.
#[derive(Clone)]
struct App {
    engine: SimEngine,
    engine_args: Arc<EngineArgs>,
    /// The gate's rank describer, for `--no-admission` runs: with the gate, a
    /// request carries the rank it was counted on (`Admitted`).
    rank: RankHeader,
    ids: Arc<Ids>,
    metrics: PrometheusHandle,
    /// The gate, to refresh its time-dependent gauges before a scrape;
    /// `None` with `--no-admission`.
    gate: Option<Gate>,
}

/// Response ids: unique within the process, and across restarts.
struct Ids {
    epoch: u64,
    next: AtomicU64,
}

impl Ids {
    fn new() -> Ids {
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64);
        Ids {
            epoch,
            next: AtomicU64::new(0),
        }
    }

    fn next(&self, prefix: &str) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:016x}{n:08x}", self.epoch)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    common::init_logging();

    // The recorder must be installed before the gate registers its series.
    let metrics = match PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            &tower_admission::metrics::SECONDS_BUCKETS,
        )
        .and_then(PrometheusBuilder::install_recorder)
    {
        Ok(handle) => handle,
        Err(error) => {
            eprintln!("error: cannot install the Prometheus recorder: {error}");
            return ExitCode::FAILURE;
        }
    };
    describe_engine_stats();
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });

    let engine = args.engine.start();
    let rank = RankHeader::default();
    let mut app = App {
        engine: engine.clone(),
        engine_args: Arc::new(args.engine.clone()),
        rank: rank.clone(),
        ids: Arc::new(Ids::new()),
        metrics,
        gate: None,
    };

    let mut router = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions));
    let admission = if args.no_admission {
        "admission: off (--no-admission): every request goes straight to the engine".to_owned()
    } else {
        let config = args
            .admission
            .resolve()
            .metrics_prefix(&args.metrics_prefix);
        let qos = describe_qos(&config);
        let gate = Gate::new(config);
        if !args.no_capacity_report {
            engine.report_to(&gate);
        }
        app.gate = Some(gate.clone());
        let limits = gate.limits_in_force().per_rank;
        let in_force = gate.limits_in_force();
        // One gate for every generation route: `route_layer` wraps each
        // route's matched methods with a clone of the layer (clones share
        // the gate); a 405 or 404 takes no admission capacity.
        router = router
            .route_layer(
                AdmissionLayer::new(gate)
                    .detector(OpenAiSse::default())
                    .rank(rank)
                    .qos_headers(QosHeaders::default())
                    .overload_status(args.overload_status),
            )
            // Outside admission, so each request's prompt and output tokens
            // are known when the gate weighs it against the token limits.
            .route_layer(
                OpenAiCostLayer::new()
                    .max_model_len(args.engine.max_model_len.get())
                    .overload_status(args.overload_status),
            );
        let tokens =
            |limit: Option<usize>| limit.map_or_else(|| "off".to_owned(), |n| n.to_string());
        format!(
            "admission: per rank engine request limit {}, engine request waiting limit {}, \
             request queue limit {}; overload status {}; metrics prefix {}; \
             token limits: engine waiting {}, engine {}, queue {}; {qos}\n\
             admission limits in force: {in_force}",
            limits.engine_request_limit,
            limits.engine_request_waiting_limit,
            limits.request_queue_limit,
            args.overload_status.as_u16(),
            args.metrics_prefix,
            tokens(limits.engine_waiting_token_limit),
            tokens(limits.engine_token_limit),
            tokens(limits.request_queue_token_limit),
        )
    };
    let router = router
        .route("/metrics", get(metrics_text))
        .route("/health", get(|| async { "ok\n" }))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app);

    let (listener, address, shutdown) = match common::bind(args.listen).await {
        Ok(bound) => bound,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Printed at once (stdout is line-buffered): scripts wait for this line.
    println!("listening on http://{address}");
    println!("{}", args.engine.describe());
    println!("{admission}");
    println!("routes: POST /v1/chat/completions, POST /v1/completions, GET /metrics, GET /health");

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

// ---------------------------------------------------------------------------
// Handlers

async fn chat_completions(State(app): State<App>, request: Request) -> Response {
    chat(app, request)
        .await
        .unwrap_or_else(|error| error.into_response())
}

async fn chat(app: App, request: Request) -> Result<Response, ApiError> {
    let rank = app.engine_rank(&request);
    let first_token = request.extensions().get::<FirstToken>().cloned();
    let body: ChatRequest = read_json(request).await?;
    single_choice(body.n)?;
    if body.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages: at least one message is required",
        ));
    }
    let max_tokens = body.max_completion_tokens.or(body.max_tokens);
    let plan = app
        .engine_args
        .plan(body.prompt_tokens(), max_tokens)
        .map_err(ApiError::invalid)?;
    app.generate(
        Api::Chat,
        body.model,
        plan,
        rank,
        Delivery {
            stream: body.stream.unwrap_or(false),
            stream_options: body.stream_options,
            first_token,
        },
    )
    .await
}

async fn completions(State(app): State<App>, request: Request) -> Response {
    complete(app, request)
        .await
        .unwrap_or_else(|error| error.into_response())
}

async fn complete(app: App, request: Request) -> Result<Response, ApiError> {
    let rank = app.engine_rank(&request);
    let first_token = request.extensions().get::<FirstToken>().cloned();
    let body: CompletionRequest = read_json(request).await?;
    single_choice(body.n)?;
    let plan = app
        .engine_args
        .plan(body.prompt_tokens()?, body.max_tokens)
        .map_err(ApiError::invalid)?;
    app.generate(
        Api::Completion,
        body.model,
        plan,
        rank,
        Delivery {
            stream: body.stream.unwrap_or(false),
            stream_options: body.stream_options,
            first_token,
        },
    )
    .await
}

/// How a request wants its answer.
struct Delivery {
    /// As a stream of chunks, rather than one JSON answer.
    stream: bool,
    stream_options: Option<StreamOptions>,
    /// The request's admission, marked at the first token of a whole
    /// answer; `None` without admission control.
    first_token: Option<FirstToken>,
}

impl App {
    /// Runs a validated request on the engine and answers it: a stream of
    /// chunks when asked for, one JSON answer otherwise.
    async fn generate(
        &self,
        api: Api,
        model: String,
        plan: Plan,
        rank: Option<u32>,
        delivery: Delivery,
    ) -> Result<Response, ApiError> {
        let tokens = self.submit(plan, rank)?;
        let id_prefix = match api {
            Api::Chat => "chatcmpl",
            Api::Completion => "cmpl",
        };
        let answer = Answer {
            api,
            id: self.ids.next(id_prefix),
            created: unix_seconds(),
            model,
            plan,
        };
        if delivery.stream {
            let include_usage = delivery.stream_options.unwrap_or_default().include_usage;
            Ok(answer.stream(tokens, include_usage).into_response())
        } else {
            Ok(answer
                .collect(tokens, delivery.first_token)
                .await
                .into_response())
        }
    }

    /// The rank to run a request on: the one the gate counted it on, or
    /// (without admission control) the one its header asks for.
    fn engine_rank(&self, request: &Request) -> Option<u32> {
        match request.extensions().get::<Admitted>() {
            Some(admitted) => admitted.rank,
            None => self.rank.descriptor(request).rank,
        }
    }

    /// Hands a validated request to the engine, on the gate's rank for it
    /// (a rank the engine does not have is unranked for the gate too).
    fn submit(&self, plan: Plan, rank: Option<u32>) -> Result<TokenStream, ApiError> {
        let ranks = self.engine.config().dp_ranks;
        let rank = rank.filter(|&rank| (rank as usize) < ranks);
        self.engine
            .submit(EngineRequest {
                prompt_tokens: plan.prompt_tokens,
                output_tokens: plan.output_tokens,
                rank,
            })
            .map_err(|error| match error {
                SubmitError::TooLong { .. } | SubmitError::UnknownRank(_) => {
                    ApiError::invalid(error.to_string())
                }
                SubmitError::Stopped => ApiError::unavailable(error.to_string()),
            })
    }
}

async fn metrics_text(State(app): State<App>) -> Response {
    record_engine_stats(&app.engine);
    // The age of the oldest queued request, as of this scrape.
    if let Some(gate) = &app.gate {
        gate.refresh_metrics();
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

fn describe_engine_stats() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        "sim_engine_running_requests",
        "Requests in the simulated engine's running batch."
    );
    describe_gauge!(
        "sim_engine_waiting_requests",
        "Requests in the simulated engine's own waiting queue (unbounded, inside the engine)."
    );
    describe_gauge!("sim_engine_kv_blocks_used", "KV cache blocks in use.");
    describe_counter!(
        "sim_engine_completed_total",
        "Requests that generated all their tokens."
    );
    describe_counter!(
        "sim_engine_cancelled_total",
        "Requests cancelled in the engine before they completed."
    );
    describe_counter!(
        "sim_engine_preemptions_total",
        "Requests preempted (recomputed) for lack of KV cache."
    );
}

/// The simulated engine's own occupancy, per rank, read at each scrape:
/// without admission control the excess shows up in its waiting queue.
fn record_engine_stats(engine: &SimEngine) {
    for rank in 0..engine.config().dp_ranks {
        let stats = engine.rank_stats(rank as u32);
        let labels = [("dp_rank", rank.to_string())];
        metrics::gauge!("sim_engine_running_requests", &labels).set(stats.running as f64);
        metrics::gauge!("sim_engine_waiting_requests", &labels).set(stats.waiting as f64);
        metrics::gauge!("sim_engine_kv_blocks_used", &labels).set(stats.kv_blocks_used as f64);
        metrics::counter!("sim_engine_completed_total", &labels).absolute(stats.completed);
        metrics::counter!("sim_engine_cancelled_total", &labels).absolute(stats.cancelled);
        metrics::counter!("sim_engine_preemptions_total", &labels).absolute(stats.preemptions);
    }
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no such route; try POST /v1/chat/completions or POST /v1/completions",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}
