//! `tower-admission`: the sidecar. Admission control in front of any
//! OpenAI-compatible inference engine (vLLM, SGLang, llama.cpp, TGI).
//!
//! ```sh
//! llama-server -m model.gguf --parallel 4 --port 8080 &
//! tower-admission --upstream http://127.0.0.1:8080        # listens on 127.0.0.1:9000
//! ```
//!
//! See `--help`, the README ("Put it in front of your engine") and the
//! `tower_admission::proxy` docs.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tower_admission::http::OpenAiCostLayer;
use tower_admission::proxy::{
    self, DEFAULT_ADMIT_PATHS, DiscoveryTiming, EngineReport, Sidecar, Upstream, UpstreamOptions,
    UpstreamUrl,
};
use tower_admission::{AdmissionArgs, EngineCapacity, Gate};

/// Admission control in front of an OpenAI-compatible inference engine: each
/// generation request is admitted, queued outside the engine, or answered
/// 529 at once, so the engine's own hidden queue stays empty.
#[derive(Debug, Parser)]
#[command(name = "tower-admission", version)]
struct Args {
    /// Address to listen on (HTTP/1.1 and h2c).
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:9000",
        env = "TOWER_ADMISSION_LISTEN"
    )]
    listen: SocketAddr,

    /// The engine's base URL, e.g. http://127.0.0.1:8080.
    #[arg(long, value_name = "URL", value_parser = upstream_url, env = "TOWER_ADMISSION_UPSTREAM")]
    upstream: UpstreamUrl,

    /// Speak HTTP/2 without TLS (prior knowledge) to the engine, for
    /// engines that serve h2c; HTTP/1.1 otherwise.
    #[arg(long)]
    upstream_h2c: bool,

    /// Seconds the engine may take to send a response head (a whole
    /// non-streaming answer) before the client gets 504; 0: no limit.
    #[arg(long, value_name = "S", allow_negative_numbers = true, default_value = "600", value_parser = seconds)]
    upstream_timeout_s: Duration,

    /// Milliseconds connecting to the engine may take before 504.
    #[arg(long, value_name = "MS", allow_negative_numbers = true, default_value = "2000", value_parser = positive_millis)]
    upstream_connect_timeout_ms: Duration,

    /// The engine's max_num_seqs (sequences per data-parallel rank): the
    /// capacity report when the engine does not tell (vLLM). Without it the
    /// sidecar asks the engine (llama.cpp /props, SGLang /server_info, TGI
    /// /info) and keeps asking.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = positive, env = "TOWER_ADMISSION_MAX_NUM_SEQS")]
    max_num_seqs: Option<NonZeroUsize>,

    /// The engine's data-parallel ranks, with --max-num-seqs, or in place of
    /// the rank count the engine reports [default: 1, or the engine's].
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = positive, env = "TOWER_ADMISSION_DATA_PARALLEL_SIZE")]
    data_parallel_size: Option<NonZeroUsize>,

    /// Milliseconds between capacity reads once the engine has reported.
    #[arg(long, value_name = "MS", allow_negative_numbers = true, default_value = "5000", value_parser = positive_millis)]
    capacity_poll_interval_ms: Duration,

    /// A path whose POSTs pass the gate; repeat for each. Replaces the
    /// default list: /v1/chat/completions, /v1/completions, /v1/responses,
    /// /v1/messages, /v1/embeddings, /completion, /generate, /generate_stream.
    #[arg(long = "admit-path", value_name = "PATH", value_parser = admit_path)]
    admit_paths: Vec<String>,

    /// A router in front sets x-data-parallel-rank, x-admission-priority,
    /// x-admission-tenant and x-admission-deadline-ms: honour them. Without
    /// it they are removed from every request.
    #[arg(long, env = "TOWER_ADMISSION_TRUST_ROUTER_HEADERS")]
    trust_router_headers: bool,

    /// Read each admitted request's OpenAI body (up to 4 MiB, 64 at once, 30 s
    /// each) to estimate its token cost for the token limits; bodies stream
    /// otherwise.
    #[arg(long)]
    estimate_cost: bool,

    /// With --estimate-cost: the engine's context length; a request's
    /// max_tokens counts at most what its prompt leaves of it, and a prompt
    /// longer than it is answered 400 before admission.
    #[arg(long, value_name = "TOKENS", allow_negative_numbers = true, value_parser = positive, requires = "estimate_cost")]
    max_model_len: Option<NonZeroUsize>,

    /// Status of the gate's overload answers.
    #[arg(long, value_name = "STATUS", default_value = "529", value_parser = overload_status)]
    overload_status: http::StatusCode,

    /// Prefix of the gate's metric names.
    #[arg(long, value_name = "PREFIX", default_value = tower_admission::metrics::DEFAULT_PREFIX)]
    metrics_prefix: String,

    /// Append the engine's own /metrics to the sidecar's GET /metrics.
    #[arg(long)]
    merge_engine_metrics: bool,

    /// Seconds open responses get to finish after SIGTERM or Ctrl-C.
    #[arg(long, value_name = "S", allow_negative_numbers = true, default_value = "30", value_parser = seconds)]
    shutdown_grace_s: Duration,

    #[command(flatten)]
    admission: AdmissionArgs,
}

fn upstream_url(raw: &str) -> Result<UpstreamUrl, String> {
    UpstreamUrl::parse(raw)
}

fn positive(raw: &str) -> Result<NonZeroUsize, String> {
    raw.trim()
        .parse::<NonZeroUsize>()
        .map_err(|_| format!("{raw:?} is not a positive integer"))
}

/// A whole number of seconds, 0 included.
fn seconds(raw: &str) -> Result<Duration, String> {
    raw.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|error| error.to_string())
}

/// A positive whole number of milliseconds.
fn positive_millis(raw: &str) -> Result<Duration, String> {
    positive(raw).map(|ms| Duration::from_millis(ms.get() as u64))
}

fn admit_path(raw: &str) -> Result<String, String> {
    if raw.starts_with('/') && !raw.contains(['?', '#', ' ']) {
        Ok(raw.to_owned())
    } else {
        Err(format!(
            "{raw:?} is not a path (it starts with '/', without query)"
        ))
    }
}

fn overload_status(raw: &str) -> Result<http::StatusCode, String> {
    raw.parse::<http::StatusCode>()
        .ok()
        .filter(|status| status.is_client_error() || status.is_server_error())
        .ok_or_else(|| format!("{raw:?} is not a 4xx or 5xx status"))
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal, not for a log collector.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    init_logging();

    // Installed before the gate, which registers its series when created.
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
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });

    let mut config = args
        .admission
        .resolve()
        .metrics_prefix(&args.metrics_prefix)
        // The one series a router or an autoscaler reads (docs/deployment.md).
        .saturation_metric(true);
    let flagged = args.max_num_seqs.map(|seqs| {
        let ranks = args.data_parallel_size.map_or(1, NonZeroUsize::get);
        EngineCapacity::new(seqs.get(), ranks)
    });
    if let Some(capacity) = flagged {
        config = config.capacity(capacity);
    }
    let gate = Gate::new(config);

    let options = UpstreamOptions {
        h2c: args.upstream_h2c,
        connect_timeout: args.upstream_connect_timeout_ms,
        response_timeout: (!args.upstream_timeout_s.is_zero()).then_some(args.upstream_timeout_s),
    };
    let upstream = Upstream::new(args.upstream.clone(), options);
    let capacity_source = match flagged {
        Some(capacity) => format!(
            "capacity: from --max-num-seqs {} and {} rank(s)",
            capacity.max_num_seqs, capacity.dp_ranks
        ),
        None => {
            // vLLM tells a client nothing of its max_num_seqs: without the
            // flag the gate would stay at its 10000 defaults, admission
            // control in name only. Refuse to start in front of one.
            let first = proxy::ask_engine(&upstream, Duration::from_secs(2)).await;
            if let EngineReport::Silent(kind) = first {
                eprintln!(
                    "error: the engine is {}: its capacity cannot be read; pass --max-num-seqs N \
                     (the engine's own --max-num-seqs) and, for data parallelism, \
                     --data-parallel-size N",
                    kind.describe()
                );
                return ExitCode::FAILURE;
            }
            let timing = DiscoveryTiming {
                interval: args.capacity_poll_interval_ms,
                ..DiscoveryTiming::default()
            };
            let ranks = args.data_parallel_size;
            proxy::discover_capacity(
                gate.clone(),
                &upstream,
                timing,
                ranks.map(NonZeroUsize::get),
            );
            "capacity: asked of the engine (llama.cpp /props, SGLang /server_info, TGI /info); \
             the gate's defaults until it answers"
                .to_owned()
        }
    };

    let render = metrics.clone();
    let mut builder = Sidecar::builder(gate.clone(), upstream)
        .trust_router_headers(args.trust_router_headers)
        .estimate_cost(args.estimate_cost)
        .overload_status(args.overload_status)
        .metrics(Arc::new(move || render.render()))
        .merge_engine_metrics(args.merge_engine_metrics);
    let paths: Vec<String> = if args.admit_paths.is_empty() {
        DEFAULT_ADMIT_PATHS.iter().map(|&p| p.to_owned()).collect()
    } else {
        args.admit_paths.clone()
    };
    builder = builder.admit_paths(paths.clone());
    if args.estimate_cost {
        let mut cost = OpenAiCostLayer::new();
        if let Some(tokens) = args.max_model_len {
            cost = cost.max_model_len(tokens.get());
        }
        builder = builder.cost_layer(cost);
    }
    let (sidecar, drain) = builder.build();

    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("error: cannot listen on {}: {error}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let address = listener.local_addr().map_or(args.listen, |address| address);
    let limits = gate.limits();
    // Printed at once (stdout is line-buffered): scripts wait for this line.
    println!("listening on http://{address}");
    println!("upstream: {}", args.upstream);
    println!("{capacity_source}");
    println!(
        "admission: per rank engine request limit {}, engine request waiting limit {}, request \
         queue limit {}; overload status {}; router headers {}",
        limits.engine_request_limit,
        limits.engine_request_waiting_limit,
        limits.request_queue_limit,
        args.overload_status.as_u16(),
        if args.trust_router_headers {
            "trusted"
        } else {
            "removed"
        },
    );
    println!("limits in force: {}", gate.limits_in_force());
    println!("admitted: POST {}", paths.join(", "));

    proxy::serve(
        listener,
        sidecar,
        drain,
        shutdown_signal(),
        args.shutdown_grace_s,
    )
    .await;
    eprintln!("stopped");
    ExitCode::SUCCESS
}

/// SIGTERM (Kubernetes, systemd) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
