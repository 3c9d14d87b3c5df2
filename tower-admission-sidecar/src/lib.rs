//! The sidecar: the gate of [`tower_admission`] in front of an engine it does
//! not contain — vLLM, SGLang, llama.cpp, TGI, anything that speaks OpenAI
//! over HTTP (behaviour §11).
//!
//! # Put it in front of your engine
//!
//! No Rust server needed: the `tower-admission` binary is a sidecar, a reverse
//! proxy that puts the gate of `tower-admission` in front of any engine that
//! speaks OpenAI over HTTP — vLLM, SGLang, llama.cpp's `llama-server`, TGI.
//! Run one per engine (or per data-parallel engine), on the same host or in
//! the same pod, and send clients to it instead of the engine. **Bind the
//! engine to `127.0.0.1`** so that clients cannot go around the sidecar: a
//! request that reaches the engine directly is one the gate never counted.
//!
//! ```sh
//! cargo install tower-admission-sidecar
//! # or from a checkout of the repository:
//! cargo run --release -p tower-admission-sidecar -- --upstream http://127.0.0.1:8000
//! ```
//!
//! ```sh
//! # vLLM states its max_num_seqs nowhere a client can read: give it (the
//! # sidecar recognises vLLM and refuses to start without it)
//! vllm serve MODEL --max-num-seqs 64 --host 127.0.0.1 --port 8000 &
//! tower-admission --upstream http://127.0.0.1:8000 --max-num-seqs 64 --listen 0.0.0.0:9000
//!
//! # SGLang: capacity from GET /server_info (max running requests per rank, dp_size)
//! python -m sglang.launch_server --model-path MODEL --host 127.0.0.1 --port 30000 &
//! tower-admission --upstream http://127.0.0.1:30000 --listen 0.0.0.0:9000
//!
//! # llama.cpp: capacity from GET /props (total_slots = --parallel)
//! llama-server -m model.gguf --parallel 4 --metrics --host 127.0.0.1 --port 8080 &
//! tower-admission --upstream http://127.0.0.1:8080 --listen 0.0.0.0:9000
//!
//! # TGI: capacity from GET /info
//! text-generation-launcher --model-id MODEL --hostname 127.0.0.1 --port 3000 &
//! tower-admission --upstream http://127.0.0.1:3000 --listen 0.0.0.0:9000
//! ```
//!
//! The sidecar listens on `127.0.0.1:9000` unless told otherwise
//! (`--listen`, `TOWER_ADMISSION_LISTEN`); `tower-admission --help` lists
//! every flag.
//!
//! What it does:
//!
//! * Every `POST` passes the gate, judged by its path as the engine routes
//!   it (percent-decoded, dot segments and repeated slashes resolved), except
//!   a short list of cheap routes (`DEFAULT_PASS_PATHS`: health, model
//!   listing, tokenize, adapter loading; narrowed at start to the engine
//!   family's own, `EngineKind::pass_paths`; `--pass-path` replaces it,
//!   `--admit-path` admits one whatever the list says); other methods go
//!   straight to the engine, and a path that cannot be normalised safely is
//!   `400`. The excess waits in the sidecar's bounded queue, or gets `529` at
//!   once, instead of waiting in the engine's hidden queue.
//! * A body bound for the gate is read whole before admission (32 MiB, 30 s
//!   by default), so a slow sender holds no place; responses stream,
//!   unbuffered; waiting ends at the first generated
//!   token of the engine's own stream. A client that leaves while queued never
//!   reaches the engine; one that leaves while the engine generates closes its
//!   engine connection, so the engine aborts the request, and the gate frees
//!   its capacity at once.
//! * Capacity: `--max-num-seqs N` (and `--data-parallel-size N`) when given;
//!   otherwise asked of the engine (llama.cpp `/props`, SGLang `/server_info`,
//!   TGI `/info`) every 5 s (`--capacity-poll-interval-ms`), and again at once
//!   after a request finds the engine gone (a restart may change it). Until a
//!   report arrives the gate works on its defaults; the log names the source.
//!   In front of vLLM, which reports nothing, it refuses to start without
//!   `--max-num-seqs`.
//! * KV headroom: with `--estimate-cost` (each request's prompt plus
//!   `max_tokens` weighed before admission), the engine token limit follows
//!   the KV cache the engine states (vLLM's `vllm:cache_config_info`:
//!   `num_gpu_blocks` × `block_size` per rank), unless a flag sets it: the
//!   gate admits no more tokens than the engine holds, so the engine never
//!   preempts a running request for lack of KV blocks; the rest waits in the
//!   sidecar's queue.
//! * The engine unreachable: `502`; no response head in time
//!   (`--upstream-timeout-s`, 600 by default): `504`; both OpenAI-style JSON
//!   errors with `x-admission-origin: proxy`. The engine's own error answers
//!   (its `503` while loading a model, a `429`) pass through with
//!   `x-admission-origin: engine`: a frontend tells them from the gate's `529`,
//!   and `tower-admission-route`'s `OverloadRetry` does not resend a
//!   non-idempotent request one of them answered.
//! * `x-admission-*` and `x-data-parallel-rank` headers from clients are
//!   removed unless `--trust-router-headers` says a router in front sets
//!   them; then the rank, priority, tenant and `x-admission-deadline-ms`
//!   deadline are honoured.
//! * `GET /metrics` serves the gate's series, the saturation gauge
//!   `admission_saturation{dp_rank}` among them (what a router or an
//!   autoscaler reads); `--merge-engine-metrics` appends the engine's own
//!   `/metrics`, so one scrape target shows both.
//! * `--router-view`: `GET /metrics` also serves the engine family's own
//!   load gauges with the gate counted in, for the routers that read them
//!   (llm-d's endpoint picker, vLLM's production-stack router):
//!   `vllm:num_requests_waiting` is vLLM's waiting plus the gate's queue
//!   (per `engine` rank), beside vLLM's `vllm:num_requests_running` and
//!   `vllm:kv_cache_usage_perc`; SGLang's names for SGLang; vLLM's names,
//!   made from the gate and the engine's gauges, for llama.cpp and TGI. The
//!   engine's `/metrics` is read in the background
//!   (`--engine-scrape-interval-ms`, 50), so a scrape never waits on it;
//!   `admission_engine_scrape_age_seconds` says how old it is. Without it
//!   the engine's waiting gauge reads 0 on the busiest worker, whose excess
//!   waits in the sidecar, and the router sends it more.
//! * An engine that reports nothing (vLLM's waiting limit, say) leaves the
//!   waiting limit at its default; `--adaptive-waiting-limit` lets the gate
//!   find it from the engine waiting times it sees.
//! * SIGTERM: no new connections; requests still queued, and new requests on
//!   open connections, are answered `503` (reason `shutdown`, worker scope:
//!   send them elsewhere); open streams finish within `--shutdown-grace-s`
//!   (30).
//! * Every admission flag of `tower-admission`'s configuration, with its
//!   environment variables (`--engine-request-limit`,
//!   `--request-queue-limit`, the token limits, deadlines, priorities, …);
//!   `--estimate-cost` reads OpenAI bodies for the token limits (bounded:
//!   4 MiB, 64 at once — beyond that `529` with reason `body_reads` — and
//!   30 s), and with `--max-model-len N` counts a client's `max_tokens` at
//!   most up to the context and answers a prompt beyond it `400`.
//!
//! Measured against a real llama.cpp server in `tests/proxy_llama_cpp.rs` (a
//! burst beyond its slots: slots + queue streamed whole, the rest `529` at
//! once, `llamacpp:requests_deferred` 0 throughout); the aiperf comparison
//! with and without the sidecar is in the repository's BENCHMARKS.md. A
//! Kubernetes sidecar container: `docs/deployment.md` ("The sidecar in
//! Kubernetes"); behind nginx, which resends a rejected request to another
//! worker only on a status it can name (`--overload-status 503`): "nginx in
//! front of sidecars"; behind a router that reads vLLM's gauges: "Routers
//! that read engine gauges". The behaviour it keeps is §11 of
//! `docs/behaviour.md`.
//!
//! # As a library
//!
//! The `tower-admission` binary is this crate with flags; use the crate to
//! put the same proxy inside a server of your own:
//!
//! ```no_run
//! use tower_admission::{AdmissionConfig, Gate};
//! use tower_admission_sidecar::{Sidecar, Upstream, UpstreamOptions, UpstreamUrl};
//!
//! # async fn run() -> std::io::Result<()> {
//! let gate = Gate::new(AdmissionConfig::from_env());
//! let url = UpstreamUrl::parse("http://127.0.0.1:8080").expect("a valid URL");
//! let upstream = Upstream::new(url, UpstreamOptions::default());
//! // Capacity from the engine's own report (llama.cpp /props, SGLang
//! // /server_info, TGI /info), read again every few seconds:
//! tower_admission_sidecar::discover_capacity(gate.clone(), &upstream, Default::default(), None);
//! let (sidecar, drain) = Sidecar::builder(gate, upstream).build();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9000").await?;
//! let shutdown = async { let _ = tokio::signal::ctrl_c().await; };
//! tower_admission_sidecar::serve(listener, sidecar, drain, shutdown, std::time::Duration::from_secs(30)).await;
//! # Ok(())
//! # }
//! ```
//!
//! What it does, and why:
//!
//! * **Admission by what the engine will do, fail-closed.** Every `POST`
//!   passes the gate except those to a short list of cheap routes
//!   ([`DEFAULT_PASS_PATHS`]: health, model listing, metrics, tokenize and
//!   detokenize, chat templates, llama.cpp's `/props`, adapter loading; the
//!   full table is there), which are forwarded unadmitted like every
//!   `GET`. The binary asks the engine what it is at start and keeps only
//!   that family's rows ([`EngineKind::pass_paths`]); while the engine does
//!   not say, the whole list. So a generation route the sidecar has never heard of (llama.cpp's
//!   `/infill`, vLLM's `/pooling`, an SDK posting to `/chat/completions`)
//!   is still admitted. [`DEFAULT_ADMIT_PATHS`] are admitted even if a pass
//!   list names them. Both lists are compared with the path as the engine
//!   routes it ([`normalise_path`]: percent-decoded once, `%2F` included,
//!   dot segments and repeated slashes resolved), over HTTP/1.1 and HTTP/2
//!   alike, and that normalised path is what the engine receives; a path
//!   that cannot be normalised safely (bad escapes, double encoding, a
//!   decoded `?`, `#`, `\` or control character) is answered `400` before
//!   the engine. `--admit-path` and `--pass-path` replace the two lists.
//!   A request the gate queues waits in the sidecar, not in the engine's
//!   hidden queue, and a client that leaves while queued never reaches the
//!   engine.
//! * **Bodies read before admission, responses streamed**: the body of a
//!   request bound for the gate is read whole before the gate sees the
//!   request ([`RequestBodyLimits`]: up to 32 MiB, within 30 s of its head;
//!   `413` and `408` otherwise, `--max-request-body-bytes`,
//!   `--request-body-timeout-s`; 256 MiB of bodies read or held at once,
//!   `--max-total-request-body-bytes`, beyond which a body gets the
//!   overload answer with reason `body_reads`), so a client that sends its body slowly
//!   holds no queue place and no engine slot, and a queued client that
//!   leaves is seen to leave whatever its body's size. Bodies of requests
//!   that pass straight through, and every response, are forwarded frame by
//!   frame, never buffered. The permit rides
//!   in the response body; waiting ends at the first generated token of the
//!   engine's stream, found by the default detector
//!   ([`Auto`](tower_admission::detect::Auto)).
//! * **Disconnects reach the engine**: a client that leaves while the engine
//!   streams drops the engine connection the response came on, so the
//!   engine aborts the request (llama.cpp, vLLM, SGLang and TGI all stop
//!   generating on a closed connection), and the gate releases its
//!   capacity at once.
//! * **Engine connections reused**: a connection whose response was read
//!   to its end goes back to a pool (idle ones closed 2–3 s after their
//!   last use, below the engines' own 5 s), so requests leave no TIME_WAIT socket each; one the
//!   client left early is closed, never reused. A request the engine never
//!   read because it closed the connection as the request went out
//!   (llama.cpp closes after each stream) is sent again once on another
//!   connection, when its body is held whole (read before admission, or
//!   empty), instead of a `502`.
//! * **Threads of its own, on request** ([`serve_threads`], `--workers N`):
//!   N threads, each running a single-threaded runtime that accepts
//!   connections from the one listening socket and serves them to their
//!   end, with engine connections of its own
//!   ([`Upstream::pool_per_thread`]), nginx's worker shape: a token's way
//!   from the engine's socket to the client's wakes no other thread. The
//!   gate and every cap are shared. By default the binary serves on
//!   Tokio's multi-thread runtime with one engine connection pool; on the
//!   project's 2-core VM neither shape was clearly cheaper (BENCHMARKS.md,
//!   "The sidecar against nginx").
//! * **Credentials** ([`ApiKeys`], `--api-key`, `--api-key-file`): when
//!   set, every request but the health probes must present a key
//!   (`Authorization: Bearer`, or `x-api-key`) or is answered `401` before
//!   the gate, so a client without a key takes no queue place. Keys are
//!   never logged. With `--tenant-from-api-key`
//!   ([`SidecarBuilder::tenant_from_api_key`]) each key is a tenant for
//!   fair queueing, so one key cannot take everyone's queue: the tenant
//!   its line of `--api-key-file` names (`TENANT KEY`, [`ApiKeys::named`]),
//!   whose per-tenant limits, weights and metric labels then apply, else
//!   the key hashed with a per-process seed.
//! * **Metrics apart** ([`serve_metrics`], `--metrics-listen`): `GET
//!   /metrics` on an address of its own, for the scraper only; the proxy's
//!   address then forwards `/metrics` to the engine like any other route.
//! * **Slow readers**: a client connection whose socket accepts no byte of
//!   the response for 60 s (`--slow-reader-timeout-s`) is closed; its
//!   request's slot is freed and the engine sees the disconnect.
//! * **Faults**: an unreachable engine is `502`, a slow one `504`, each an
//!   OpenAI-style JSON error; the engine's own error answers pass through
//!   marked `x-admission-origin: engine` ([`ORIGIN`]).
//! * **Draining**: once the shutdown future passed to [`serve`] completes,
//!   requests still queued and new ones get `503` with reason `shutdown`
//!   (worker scope); admitted streams get the grace period to finish.
//! * **Capacity** ([`discover_capacity`]): see [`capacity`] for what each
//!   engine reports and where.

mod answer;
mod auth;
mod body;
pub mod capacity;
mod engine_conn;
mod intake;
mod kv;
mod limits;
mod metrics_listen;
mod path;
mod router_view;
mod serve;
mod service;
mod upstream;

pub use self::auth::{ApiKeys, InvalidTenantName};
pub use self::body::{Body, BoxError};
pub use self::capacity::{DiscoveryTiming, EngineKind, EngineReport};
pub use self::intake::{
    DEFAULT_MAX_REQUEST_BODY_BYTES, DEFAULT_MAX_TOTAL_REQUEST_BODY_BYTES,
    DEFAULT_REQUEST_BODY_TIMEOUT, RequestBodyLimits,
};
pub use self::kv::{MAX_KV_CACHE_TOKENS, ask_kv_cache_tokens, vllm_kv_cache_tokens};
pub use self::limits::{
    ConnectionLimits, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_PASSTHROUGH_REQUESTS, DEFAULT_SLOW_READER_TIMEOUT, HEADER_READ_TIMEOUT,
    MAX_CONCURRENT_STREAMS, raise_open_file_limit,
};
pub use self::metrics_listen::serve_metrics;
pub use self::path::{DEFAULT_PASS_PATHS, PathRefusal, normalise_path};
pub use self::router_view::{RouterView, RouterViewOptions};
pub use self::serve::{serve, serve_threads, serve_with};
pub use self::service::{
    DEADLINE_HEADER, DEFAULT_ADMIT_PATHS, Drain, RenderMetrics, Sidecar, SidecarBuilder,
};
pub use self::upstream::{Upstream, UpstreamOptions, UpstreamUrl};
pub use tower_admission::http::ORIGIN;

use tower_admission::Gate;

/// Asks the engine behind `upstream` once what it reports of its capacity
/// (llama.cpp `/props`, SGLang `/server_info`, TGI `/info`, and vLLM's
/// `/v1/models` to recognise an engine that reports nothing), each read
/// bounded by `timeout`.
pub async fn ask_engine(upstream: &Upstream, timeout: std::time::Duration) -> EngineReport {
    capacity::ask_engine(upstream.url(), timeout).await
}

/// Asks the engine behind `upstream` for its capacity and reports it to
/// `gate`, now and every [`DiscoveryTiming::interval`] after (every
/// [`retry`](DiscoveryTiming::retry) until a first report arrives, and at
/// once after a request finds the engine unreachable: it may be
/// restarting with other settings). Each change is logged with the route it
/// came from. Until a report arrives the gate works on its defaults (behaviour
/// §5). `ranks`, when given, replaces the number of data-parallel ranks
/// the engine reports (llama.cpp and TGI report one). Runs on the current
/// Tokio runtime until the runtime shuts down.
pub fn discover_capacity(
    gate: Gate,
    upstream: &Upstream,
    timing: DiscoveryTiming,
    ranks: Option<usize>,
) -> tokio::task::JoinHandle<()> {
    let discovery = capacity::Discovery {
        gate,
        upstream: upstream.url().clone(),
        timing,
        unreachable: upstream.unreachable(),
        ranks,
    };
    tokio::spawn(discovery.run())
}
