//! Admission control for streaming LLM inference servers.
//!
//! A worker has one [`Gate`]. Before a request consumes engine capacity the
//! gate decides whether to **admit** it now, **queue** it in a bounded FIFO,
//! or **reject** it fast with an explicit overload answer, so that goodput —
//! requests that meet their latency objectives — stays near capacity however
//! hard the load pushes. Excess work waits outside the engine, never hidden
//! inside it.
//!
//! Two engine limits and one queue apply per data-parallel rank:
//!
//! | setting | counts | released at |
//! |---|---|---|
//! | engine request limit | admitted requests whose response has not ended | end of the response stream |
//! | engine request waiting limit | admitted requests without a first token yet | first generated token, or completion |
//! | request queue limit | requests waiting outside the engine | admission, or cancellation while queued |
//!
//! ```
//! use tower_admission::{AdmissionConfig, EngineCapacity, Gate};
//!
//! # futures::executor::block_on(async {
//! let gate = Gate::new(AdmissionConfig::new());
//! gate.report_capacity(EngineCapacity::new(256, 1)); // from the engine
//! let mut permit = gate.acquire(None).await?; // None: no rank; Err(Overloaded) when full
//! // ... stream the response; at the first generated token:
//! permit.first_token();
//! // ... when the response ends, the permit is dropped.
//! # Ok::<_, tower_admission::Overloaded>(())
//! # });
//! ```
//!
//! Unranked requests (no rank, or one the engine has not reported) draw on
//! the combined capacity of all ranks. A rank is only as trustworthy as
//! whatever supplied it: take it from your router, not from end users.
//!
//! # As a Tower layer
//!
//! With the `http` feature (on by default), `AdmissionLayer` puts the gate in
//! front of an axum, tonic or hyper service. The permit travels into the
//! response body and is released when the stream ends. A
//! [`FirstTokenDetector`] decides where waiting ends. Rejected requests get
//! `529` with an OpenAI-style JSON error, or a gRPC `UNAVAILABLE`. The `http`
//! module has the details, explains how the layer composes with timeouts
//! and rate limiters, and how to test a service behind it with
//! `tower-test`.
//!
//! # Features
//!
//! | feature | default | what |
//! |---|---|---|
//! | `http` | yes | the Tower layer, the overload answers, the detectors |
//! | `hyper` | yes | the `Site is overloaded` reason phrase on HTTP/1 |
//! | `metrics` | yes | the series of the `metrics` module, through the `metrics` facade |
//! | `clap` | no | `AdmissionArgs`, the admission flags for a server's CLI |
//! | `tonic` | no | `Admission` is a tonic `NamedService` when the service it wraps is one |
//! | `sim` | no | a simulated continuous-batching engine, workloads and the overload sweep |
//! | `route` | no | the frontend side: overload-aware workers for tower's balancer, a retry policy |
//! | `proxy` | no | the sidecar: the `tower-admission` binary and the [`proxy`] module, the gate in front of any OpenAI-compatible engine |
//!
//! Configuration from the environment: [`AdmissionConfig::from_env`].
//! Sizing the waiting limit with Little's law: [`sizing`].
#![deny(missing_docs, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
mod config;
#[cfg(feature = "http")]
pub mod detect;
mod gate;
#[cfg(feature = "http")]
mod headers;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "http")]
mod json;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(feature = "proxy")]
#[cfg_attr(docsrs, doc(cfg(feature = "proxy")))]
pub mod proxy;
#[cfg(feature = "route")]
#[cfg_attr(docsrs, doc(cfg(feature = "route")))]
pub mod route;
#[cfg(feature = "sim")]
pub mod sim;
pub mod sizing;

/// Who hears of the gate's events: the `metrics` series when the feature is
/// on, nobody otherwise. The one place that chooses.
#[cfg(feature = "metrics")]
type DefaultObserver = crate::metrics::Recorder;
#[cfg(not(feature = "metrics"))]
type DefaultObserver = crate::gate::observe::NoObserver;

#[cfg(feature = "clap")]
pub use crate::config::AdmissionArgs;
pub use crate::config::{
    AdaptiveWaitingLimit, AdmissionConfig, DEFAULT_ENGINE_LIMIT, DEFAULT_QUEUE_LIMIT,
    EngineCapacity, LimitSource, LimitSources, Limits, LimitsInForce, MAX_DP_RANKS,
};
#[cfg(feature = "http")]
pub use crate::detect::FirstTokenDetector;
pub use crate::gate::{
    Acquire, AdmitSource, Cost, Counts, Descriptor, Gate, Overloaded, Permit, RejectionReason,
    RejectionScope, Snapshot, Tally, Tenant,
};
#[cfg(feature = "http")]
pub use crate::http::{
    Admission, AdmissionLayer, Admitted, DataParallelRank, Describe, NoRank, Priority, QosHeaders,
    RankExtension, RankExtractor, RankHeader,
};
