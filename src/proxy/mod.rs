//! The sidecar (feature `proxy`): the gate in front of an engine it does not
//! contain — vLLM, SGLang, llama.cpp, TGI, anything that speaks OpenAI over
//! HTTP (SPEC §11).
//!
//! The `tower-admission` binary is this module with flags; use the module
//! to put the same proxy inside a server of your own:
//!
//! ```no_run
//! use tower_admission::proxy::{self, Sidecar, Upstream, UpstreamOptions, UpstreamUrl};
//! use tower_admission::{AdmissionConfig, Gate};
//!
//! # async fn run() -> std::io::Result<()> {
//! let gate = Gate::new(AdmissionConfig::from_env());
//! let url = UpstreamUrl::parse("http://127.0.0.1:8080").expect("a valid URL");
//! let upstream = Upstream::new(url, UpstreamOptions::default());
//! // Capacity from the engine's own report (llama.cpp /props, SGLang
//! // /server_info, TGI /info), read again every few seconds:
//! proxy::discover_capacity(gate.clone(), &upstream, Default::default(), None);
//! let (sidecar, drain) = Sidecar::builder(gate, upstream).build();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9000").await?;
//! let shutdown = async { let _ = tokio::signal::ctrl_c().await; };
//! proxy::serve(listener, sidecar, drain, shutdown, std::time::Duration::from_secs(30)).await;
//! # Ok(())
//! # }
//! ```
//!
//! What it does, and why:
//!
//! * **Admitted routes** ([`DEFAULT_ADMIT_PATHS`]) pass the gate; every
//!   other route is forwarded unadmitted. A request the gate queues waits
//!   in the sidecar, not in the engine's hidden queue, and a client that
//!   leaves while queued never reaches the engine.
//! * **Streaming end to end**: request and response bodies are forwarded
//!   frame by frame, never buffered (unless
//!   [`estimate_cost`](SidecarBuilder::estimate_cost) asks for the token
//!   cost, which reads the request body up to its bound). The permit rides
//!   in the response body; waiting ends at the first generated token of the
//!   engine's stream, found by the default detector
//!   ([`Auto`](crate::detect::Auto)).
//! * **Disconnects reach the engine**: a client that leaves while the engine
//!   streams drops the engine connection the response came on, so the
//!   engine aborts the request (llama.cpp, vLLM, SGLang and TGI all stop
//!   generating on a closed connection), and the gate releases its
//!   capacity at once.
//! * **Faults**: an unreachable engine is `502`, a slow one `504`, each an
//!   OpenAI-style JSON error; the engine's own error answers pass through
//!   marked `x-admission-origin: engine` ([`ORIGIN`]).
//! * **Capacity** ([`discover_capacity`]): see [`capacity`] for what each
//!   engine reports and where.

mod answer;
mod body;
pub mod capacity;
mod serve;
mod service;
mod upstream;

pub use self::body::{Body, BoxError};
pub use self::capacity::{DiscoveryTiming, EngineKind, EngineReport};
pub use self::serve::{HEADER_READ_TIMEOUT, MAX_CONCURRENT_STREAMS, serve};
pub use self::service::{
    DEADLINE_HEADER, DEFAULT_ADMIT_PATHS, Drain, RenderMetrics, Sidecar, SidecarBuilder,
};
pub use self::upstream::{Upstream, UpstreamOptions, UpstreamUrl};
pub use crate::http::ORIGIN;

use crate::Gate;

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
/// came from. Until a report arrives the gate works on its defaults (SPEC
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
