//! The frontend side of [`tower_admission`]: routing over many workers by
//! their overload answers, and retrying those answers politely (behaviour
//! §10).
//!
//! A gate protects one worker. A frontend that spreads requests over many
//! workers acts on their answers:
//!
//! - a **worker-scoped** rejection (`x-admission-rejection-scope: worker`,
//!   `Retry-After: 1`) takes the worker out of rotation for the
//!   `Retry-After` time, at most one second; a later success ends that
//!   early. A gate with
//!   [`retry_after_from_drain_rate`](tower_admission::AdmissionConfig::retry_after_from_drain_rate)
//!   sends longer estimates: [`WorkerLayer::max_cooldown`] and
//!   [`OverloadRetry::max_retry_after`] cap what is honoured (1 s and 5 s
//!   by default), raise them to follow it;
//! - a **rank-scoped** one keeps the worker in rotation and marks the rank
//!   busy for as long, so a rank-aware router picks another rank;
//! - the request itself never reached the engine, so it may be sent again,
//!   elsewhere: after a jittered exponential backoff, within a retry budget
//!   and before its deadline.
//!
//! None of this is a new balancer. [`Worker`] wraps one worker's client
//! service: it reports itself not ready during a cooldown and counts its
//! requests in flight as its `tower::load::Load`, which is all that
//! `tower::balance::p2c::Balance` (power of two choices over a `Discover`
//! of workers) needs. [`OverloadRetry`] is a `tower::retry::Policy` spending
//! a `tower::retry::budget::TpsBudget`.
//!
//! ```
//! use std::convert::Infallible;
//! use std::sync::Arc;
//!
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use tower::balance::p2c::Balance;
//! use tower::buffer::Buffer;
//! use tower::discover::ServiceList;
//! use tower::retry::Retry;
//! use tower::{Layer, Service, ServiceExt, service_fn};
//! use tower_admission_route::{OverloadRetry, WorkerLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // One client service per worker (here: stand-ins that always answer).
//! let workers: Vec<_> = (0..3)
//!     .map(|_| {
//!         WorkerLayer::new().layer(service_fn(|_: Request<Bytes>| async {
//!             Ok::<_, Infallible>(Response::new(Bytes::from_static(b"ok")))
//!         }))
//!     })
//!     .collect();
//! let handles: Vec<_> = workers.iter().map(|worker| worker.handle()).collect();
//! let balance = Balance::new(ServiceList::new(workers));
//! let budget = Arc::new(OverloadRetry::default_budget());
//! // `Retry` clones its service for each request: a `Buffer` shares the
//! // balancer (one task polls it, so cooldowns wake that task).
//! let mut frontend = Retry::new(OverloadRetry::new(budget), Buffer::new(balance, 1024));
//!
//! let response = frontend
//!     .ready()
//!     .await
//!     .unwrap()
//!     .call(Request::new(Bytes::from_static(b"{}")))
//!     .await
//!     .unwrap();
//! assert_eq!(response.status(), 200);
//! assert_eq!(handles.iter().map(|h| h.stats().requests).sum::<u64>(), 1);
//! # }
//! ```
//!
//! [`OverloadRetry`] retries with jittered exponential backoff, honours
//! `Retry-After` and `grpc-retry-pushback-ms`, spends a shared `TpsBudget`
//! (5% of requests plus one a second by default: 1.08 sends per request
//! under sustained 3× overload), stops at the request's deadline, and never
//! resends a body that cannot be replayed, nor a non-idempotent request
//! that the engine itself answered (`x-admission-origin: engine`, passed on
//! by the sidecar).
//!
//! The repository's `tower-admission-sim/examples/frontend.rs` is an
//! OpenAI-compatible frontend built this way (`cargo run -p
//! tower-admission-sim --example frontend -- --worker http://127.0.0.1:8001
//! --worker http://127.0.0.1:8002`; its `/metrics` shows routing, retries
//! and cooldowns), and `docs/deployment.md` shows the same answers handled
//! by Envoy, gRPC clients' retry policy and Kubernetes probes.

mod answer;
mod clock;
mod retry;
mod worker;

pub use self::answer::OverloadAnswer;
pub use self::retry::{
    DEFAULT_MAX_BACKOFF, DEFAULT_MAX_RETRIES, DEFAULT_MAX_RETRY_AFTER, DEFAULT_MIN_BACKOFF,
    Deadline, OverloadRetry, ReplayBody, RetryDelay,
};
pub use self::worker::{
    MAX_COOLDOWN, ResponseBody, ResponseFuture, Worker, WorkerHandle, WorkerLayer, WorkerStats,
};
