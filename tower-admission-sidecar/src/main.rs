//! `tower-admission`: the sidecar. Admission control in front of any
//! OpenAI-compatible inference engine (vLLM, SGLang, llama.cpp, TGI).
//!
//! ```sh
//! llama-server -m model.gguf --parallel 4 --port 8080 &
//! tower-admission --upstream http://127.0.0.1:8080        # listens on 127.0.0.1:9000
//! ```
//!
//! See `--help`, the README ("Put it in front of your engine") and the
//! `tower_admission_sidecar` docs.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tower_admission::http::OpenAiCostLayer;
use tower_admission::{AdmissionArgs, EngineCapacity, Gate};
use tower_admission_sidecar::{
    ApiKeys, ConnectionLimits, DEFAULT_ADMIT_PATHS, DEFAULT_PASS_PATHS, DiscoveryTiming,
    EngineReport, RequestBodyLimits, RouterView, RouterViewOptions, Sidecar, Upstream,
    UpstreamOptions, UpstreamUrl,
};

/// An engine scrape older than this (or two intervals) is said in the log:
/// what llm-d's endpoint picker treats as stale.
const STALE_AFTER: Duration = Duration::from_millis(200);

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

    /// A path whose POSTs always pass the gate, even if the pass list names
    /// it; repeat for each. Replaces the default list: /v1/chat/completions,
    /// /v1/completions, /v1/responses, /v1/messages, /v1/embeddings,
    /// /completion, /generate, /generate_stream. Every POST not on the pass
    /// list passes the gate anyway.
    #[arg(long = "admit-path", value_name = "PATH", value_parser = admit_path)]
    admit_paths: Vec<String>,

    /// A path whose POSTs pass straight through, unadmitted (a cheap route);
    /// repeat for each. Replaces the default list of cheap routes (health,
    /// models, metrics, tokenize, detokenize, chat templates, /props,
    /// adapter loading: the engine family's own, learned at start, or
    /// every family's while the engine does not say; printed at start). Paths are compared as the
    /// engine routes them (percent-decoded, dot segments resolved).
    #[arg(long = "pass-path", value_name = "PATH", value_parser = admit_path)]
    pass_paths: Vec<String>,

    /// The largest body of a request bound for the gate, read whole before
    /// admission; a larger one is answered 413.
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true, default_value = "33554432", value_parser = positive)]
    max_request_body_bytes: NonZeroUsize,

    /// Seconds a client has, from its request head, to send the whole body
    /// of a request bound for the gate (read before admission, so a slow
    /// sender holds no queue place or engine slot); 408 after.
    #[arg(long, value_name = "S", allow_negative_numbers = true, default_value = "30", value_parser = positive_seconds)]
    request_body_timeout_s: Duration,

    /// The bytes of every body bound for the gate read, or read and not yet
    /// sent to the engine, at once (queued requests' included); a body that
    /// finds them spent is answered at once with the overload status and
    /// reason body_reads.
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true, default_value = "268435456", value_parser = positive)]
    max_total_request_body_bytes: NonZeroUsize,

    /// Serve clients on N threads of their own, each with a single-threaded
    /// runtime that keeps the connections it accepts and their engine
    /// connections (nginx's worker processes), instead of Tokio's
    /// multi-thread runtime with one shared engine connection pool (the
    /// default).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = positive)]
    workers: Option<NonZeroUsize>,

    /// Open client connections at most; one more is answered 503 and
    /// closed (logged when the cap is reached). Lowered to what the
    /// open-file limit allows (raised to its hard limit at start).
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value = "10000", value_parser = positive)]
    max_connections: NonZeroUsize,

    /// Seconds from accept to a connection's first complete request head
    /// (and for each later head), whatever the protocol.
    #[arg(long, value_name = "S", allow_negative_numbers = true, default_value = "30", value_parser = positive_seconds)]
    head_timeout_s: Duration,

    /// Seconds a client connection with no request in progress stays open.
    #[arg(long, value_name = "S", allow_negative_numbers = true, default_value = "60", value_parser = positive_seconds)]
    idle_timeout_s: Duration,

    /// Concurrent HTTP/2 streams on one client connection.
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value = "128", value_parser = positive)]
    max_concurrent_streams: NonZeroUsize,

    /// Requests passing straight through to the engine (unadmitted) at
    /// once, across every client; one more is answered 503.
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value = "64", value_parser = positive)]
    max_passthrough_requests: NonZeroUsize,

    /// Seconds a client may read nothing of a response before its
    /// connection is closed, its slot freed and the engine's request
    /// aborted.
    #[arg(long, value_name = "S", allow_negative_numbers = true, default_value = "60", value_parser = positive_seconds)]
    slow_reader_timeout_s: Duration,

    /// An API key clients must present (Authorization: Bearer, or
    /// x-api-key), checked before admission: 401 otherwise; repeat for
    /// each. Health probes (GET /health, /ping) need none.
    #[arg(
        long = "api-key",
        value_name = "KEY",
        env = "TOWER_ADMISSION_API_KEY",
        hide_env_values = true
    )]
    api_keys: Vec<String>,

    /// Make each API key a tenant for fair queueing, so one key cannot take
    /// everyone's queue: the tenant its line of --api-key-file names, so
    /// that --tenant-limit and --tenant-weight by that name apply, else its
    /// own (the key hashed, never logged).
    #[arg(long)]
    tenant_from_api_key: bool,

    /// A file of API keys, one a line, as --api-key: KEY, or TENANT KEY (a
    /// tenant name, whitespace, the key) for a key that stands for a named
    /// tenant with --tenant-from-api-key. Blank lines and lines starting
    /// with # are ignored.
    #[arg(long, value_name = "PATH")]
    api_key_file: Option<std::path::PathBuf>,

    /// A router in front sets x-data-parallel-rank, x-admission-priority,
    /// x-admission-tenant and x-admission-deadline-ms: honour them. Without
    /// it they are removed from every request.
    #[arg(long, env = "TOWER_ADMISSION_TRUST_ROUTER_HEADERS")]
    trust_router_headers: bool,

    /// Read each admitted request's OpenAI body (up to 4 MiB, 64 at once, 30 s
    /// each) to estimate its token cost for the token limits; bodies stream
    /// otherwise. The engine token limit then defaults to the engine's KV
    /// cache where the engine states it (vLLM's vllm:cache_config_info).
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

    /// Serve GET /metrics on this address instead of the proxy's (where
    /// /metrics then goes to the engine like any other route).
    #[arg(long, value_name = "ADDR", env = "TOWER_ADMISSION_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,

    /// Append the engine's own /metrics to the sidecar's GET /metrics.
    #[arg(long)]
    merge_engine_metrics: bool,

    /// Serve the router view on GET /metrics: the engine family's own load
    /// gauges (vllm:num_requests_waiting with the gate's queue counted in,
    /// vllm:num_requests_running, vllm:kv_cache_usage_perc; SGLang's names
    /// for SGLang), for routers that read them (llm-d's endpoint picker,
    /// vLLM's production-stack router). The engine's /metrics is then
    /// fetched in the background (--engine-scrape-interval-ms).
    #[arg(long)]
    router_view: bool,

    /// How often the router view fetches the engine's /metrics.
    #[arg(long, value_name = "MS", allow_negative_numbers = true, default_value = "50", value_parser = positive)]
    engine_scrape_interval_ms: NonZeroUsize,

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

/// A positive whole number of seconds.
fn positive_seconds(raw: &str) -> Result<Duration, String> {
    positive(raw).map(|s| Duration::from_secs(s.get() as u64))
}

/// A positive whole number of milliseconds.
fn positive_millis(raw: &str) -> Result<Duration, String> {
    positive(raw).map(|ms| Duration::from_millis(ms.get() as u64))
}

/// A path as the engine routes it ([`normalise_path`]).
fn admit_path(raw: &str) -> Result<String, String> {
    if raw.starts_with('/') && !raw.contains(['?', '#', ' ']) {
        tower_admission_sidecar::normalise_path(raw)
            .map_err(|refusal| format!("{raw:?}: {refusal}"))
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

// Clients are served on this runtime, or with --workers on threads of their
// own; then this runtime runs only what is not on a request's way: capacity
// discovery, the router view's engine scrapes, a separate metrics listener,
// the signals.
#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    init_logging();
    // Each client connection takes a descriptor, and one to the engine
    // while its request runs: the usual soft limit of 1,024 left new
    // clients unanswered behind a thousand idle sockets.
    let open_files = tower_admission_sidecar::raise_open_file_limit();
    let mut max_connections = args.max_connections.get();
    if let Some(open_files) = open_files {
        let room = (open_files.saturating_sub(64) / 2).max(1) as usize;
        if room < max_connections {
            tracing::warn!(
                "the open-file limit {open_files} allows {room} connections: --max-connections \
                 lowered from {max_connections}"
            );
            max_connections = room;
        }
    }
    let connection_limits = ConnectionLimits::new(
        max_connections,
        args.head_timeout_s,
        args.idle_timeout_s,
        u32::try_from(args.max_concurrent_streams.get()).unwrap_or(u32::MAX),
    )
    .slow_reader_timeout(args.slow_reader_timeout_s);
    let mut api_keys = (!args.api_keys.is_empty()).then(|| ApiKeys::new(&args.api_keys));
    if let Some(path) = &args.api_key_file {
        match read_api_key_file(path) {
            Ok(keys) => api_keys = Some(api_keys.map_or(keys.clone(), |flags| flags.and(keys))),
            Err(error) => {
                eprintln!("error: --api-key-file {}: {error}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    if args.tenant_from_api_key && api_keys.is_none() {
        eprintln!("error: --tenant-from-api-key needs --api-key or --api-key-file");
        return ExitCode::FAILURE;
    }
    if api_keys.as_ref().is_some_and(ApiKeys::is_empty) {
        eprintln!("error: --api-key-file holds no key");
        return ExitCode::FAILURE;
    }

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
    let options = UpstreamOptions {
        h2c: args.upstream_h2c,
        connect_timeout: args.upstream_connect_timeout_ms,
        response_timeout: (!args.upstream_timeout_s.is_zero()).then_some(args.upstream_timeout_s),
    };
    let mut upstream = Upstream::new(args.upstream.clone(), options);
    if args.workers.is_some() {
        upstream = upstream.pool_per_thread();
    }
    // Estimating costs, the engine token limit follows the engine's KV
    // cache where the engine states it (vLLM's vllm:cache_config_info) and
    // no flag or variable set it: the gate then admits no more prompt plus
    // maximum output tokens than the engine holds, so the engine never
    // preempts a running request for lack of KV blocks.
    let mut kv_source = None;
    if args.estimate_cost && config.limits_for(None).engine_token_limit.is_none() {
        if let Some(tokens) =
            tower_admission_sidecar::ask_kv_cache_tokens(&upstream, Duration::from_secs(2)).await
        {
            config = config.engine_token_limit(tokens);
            kv_source = Some(tokens);
        }
    }
    let gate = Gate::new(config);

    // What the engine is, asked once (2 s) unless both the capacity and the
    // pass list are given: a vLLM without --max-num-seqs is refused below,
    // and the default pass list narrows to the engine family's own cheap
    // routes. An engine not answering yet keeps the whole list.
    let first = if flagged.is_none() || args.pass_paths.is_empty() {
        Some(tower_admission_sidecar::ask_engine(&upstream, Duration::from_secs(2)).await)
    } else {
        None
    };
    let family = match first {
        Some(EngineReport::Capacity(kind, _) | EngineReport::Silent(kind)) => Some(kind),
        _ => None,
    };
    let capacity_source = match flagged {
        Some(capacity) => format!(
            "capacity: from --max-num-seqs {} and {} rank(s)",
            capacity.max_num_seqs, capacity.dp_ranks
        ),
        None => {
            // vLLM tells a client nothing of its max_num_seqs: without the
            // flag the gate would stay at its 10000 defaults, admission
            // control in name only. Refuse to start in front of one.
            if let Some(EngineReport::Silent(kind)) = first {
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
            tower_admission_sidecar::discover_capacity(
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
    let render: tower_admission_sidecar::RenderMetrics = Arc::new(move || render.render());
    let router_view = args.router_view.then(|| {
        let interval = Duration::from_millis(args.engine_scrape_interval_ms.get() as u64);
        let options = RouterViewOptions::new(interval, (2 * interval).max(STALE_AFTER));
        RouterView::spawn(gate.clone(), &upstream, &args.metrics_prefix, options)
    });
    let mut metrics_bound = None;
    if let Some(address) = args.metrics_listen {
        let listener = match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!("error: cannot listen on {address} (--metrics-listen): {error}");
                return ExitCode::FAILURE;
            }
        };
        let bound = listener.local_addr().map_or(address, |bound| bound);
        metrics_bound = Some(bound);
        tokio::spawn(tower_admission_sidecar::serve_metrics(
            listener,
            gate.clone(),
            Arc::clone(&render),
            args.merge_engine_metrics.then(|| upstream.clone()),
            router_view.clone(),
            std::future::pending(),
        ));
    }
    let mut builder = Sidecar::builder(gate.clone(), upstream)
        .trust_router_headers(args.trust_router_headers)
        .estimate_cost(args.estimate_cost)
        .overload_status(args.overload_status)
        .merge_engine_metrics(args.merge_engine_metrics)
        .max_passthrough_requests(args.max_passthrough_requests.get())
        .request_body_limits(
            RequestBodyLimits::new(
                args.max_request_body_bytes.get(),
                args.request_body_timeout_s,
            )
            .max_total_bytes(args.max_total_request_body_bytes.get()),
        );
    let paths: Vec<String> = if args.admit_paths.is_empty() {
        DEFAULT_ADMIT_PATHS.iter().map(|&p| p.to_owned()).collect()
    } else {
        args.admit_paths.clone()
    };
    builder = builder.admit_paths(paths.clone());
    let (pass_paths, pass_source): (Vec<String>, String) = match family {
        _ if !args.pass_paths.is_empty() => (args.pass_paths.clone(), "--pass-path".to_owned()),
        Some(kind) => (
            kind.pass_paths().iter().map(|&p| p.to_owned()).collect(),
            format!("the {} routes", kind.name()),
        ),
        None => (
            DEFAULT_PASS_PATHS.iter().map(|&p| p.to_owned()).collect(),
            "every engine family's (the engine did not say what it is)".to_owned(),
        ),
    };
    builder = builder.pass_paths(pass_paths.clone());
    if args.estimate_cost {
        let mut cost = OpenAiCostLayer::new();
        if let Some(tokens) = args.max_model_len {
            cost = cost.max_model_len(tokens.get());
        }
        builder = builder.cost_layer(cost);
    }
    if let Some(keys) = &api_keys {
        builder = builder
            .api_keys(keys.clone())
            .tenant_from_api_key(args.tenant_from_api_key);
    }
    if args.metrics_listen.is_none() {
        builder = builder.metrics(render);
    }
    if let Some(view) = &router_view {
        builder = builder.router_view(view.clone());
    }
    let (sidecar, drain) = builder.build();

    let listener = match std::net::TcpListener::bind(args.listen) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("error: cannot listen on {}: {error}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let address = listener.local_addr().map_or(args.listen, |address| address);
    let limits = gate.limits_in_force().per_rank;
    // Printed at once (stdout is line-buffered): scripts wait for this line.
    println!("listening on http://{address}");
    println!("upstream: {}", args.upstream);
    println!("{capacity_source}");
    if let Some(tokens) = kv_source {
        println!(
            "engine token limit: {tokens} per rank, the engine's KV cache \
             (vllm:cache_config_info)"
        );
    }
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
    println!(
        "request bodies bound for the gate: read whole before admission, up to {} bytes within \
         {} s, {} bytes of them at once",
        args.max_request_body_bytes,
        args.request_body_timeout_s.as_secs(),
        args.max_total_request_body_bytes
    );
    if let Some(bound) = metrics_bound {
        println!("metrics: GET http://{bound}/metrics");
    }
    println!(
        "admitted: POST {}, and every other POST except {} (pass list: {pass_source})",
        paths.join(", "),
        pass_paths.join(", ")
    );

    println!(
        "connections: served by {}; at most {max_connections} open \
         (open-file limit {}), first head within {} s of accept, idle ones closed after {} s, {} \
         HTTP/2 streams each; {} passthrough requests at once; clients reading nothing cut off \
         after {} s; API keys: {}",
        args.workers.map_or_else(
            || "Tokio's multi-thread runtime".to_owned(),
            |workers| format!("{workers} threads of their own (--workers)")
        ),
        open_files.map_or_else(|| "unknown".to_owned(), |limit| limit.to_string()),
        args.head_timeout_s.as_secs(),
        args.idle_timeout_s.as_secs(),
        connection_limits.max_concurrent_streams,
        args.max_passthrough_requests,
        args.slow_reader_timeout_s.as_secs(),
        api_keys.as_ref().map_or(0, ApiKeys::len),
    );

    match args.workers {
        None => {
            let listener = listener
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpListener::from_std(listener));
            let listener = match listener {
                Ok(listener) => listener,
                Err(error) => {
                    eprintln!("error: cannot listen on {}: {error}", args.listen);
                    return ExitCode::FAILURE;
                }
            };
            tower_admission_sidecar::serve_with(
                listener,
                sidecar,
                drain,
                shutdown_signal(),
                args.shutdown_grace_s,
                connection_limits,
            )
            .await;
        }
        Some(workers) => {
            let served = tower_admission_sidecar::serve_threads(
                listener,
                workers,
                sidecar,
                drain,
                shutdown_signal(),
                args.shutdown_grace_s,
                connection_limits,
            )
            .await;
            if let Err(error) = served {
                eprintln!("error: cannot start the {workers} serving threads (--workers): {error}");
                return ExitCode::FAILURE;
            }
        }
    }
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

/// The keys of an `--api-key-file`: a line holds `KEY`, or `TENANT KEY`;
/// blank lines and `#` comments are skipped. An error names the line, never
/// a key.
fn read_api_key_file(path: &std::path::Path) -> Result<ApiKeys, String> {
    let text = std::fs::read_to_string(path).map_err(|error| format!("cannot read it: {error}"))?;
    let mut plain = Vec::new();
    let mut named = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields[..] {
            [key] => plain.push(key),
            [tenant, key] => named.push((tenant, key)),
            _ => {
                return Err(format!(
                    "line {}: expected KEY or TENANT KEY, found {} fields",
                    number + 1,
                    fields.len()
                ));
            }
        }
    }
    let named = ApiKeys::named(named).map_err(|error| error.to_string())?;
    Ok(ApiKeys::new(plain).and(named))
}
