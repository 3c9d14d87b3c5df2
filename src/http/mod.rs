//! Admission control as a Tower HTTP middleware: [`AdmissionLayer`] and
//! [`Admission`].
//!
//! Each request is decided when the service is **called**: a [`Bypass`]
//! predicate may let it skip the gate, its rank is read by a
//! [`RankExtractor`], its cost (for token budgets) from a
//! [`Cost`](crate::Cost) request extension set by an earlier layer (see
//! [`OpenAiCostLayer`] and [`CostLayer`]), its priority and tenant (SPEC
//! §8) from [`Priority`] and [`Tenant`](crate::Tenant) extensions (see
//! [`QosHeaders`] and [`QosLayer`]; take them from a trusted router only),
//! and the worker's
//! [`Gate`](crate::Gate) admits it, queues it, or rejects it.
//!
//! * **Admitted** requests reach the inner service with two extensions:
//!   [`Admitted`] (the rank they are counted under) and [`FirstToken`]. The
//!   request's [`Permit`](crate::Permit) travels into the [`ResponseBody`]:
//!   its *waiting* capacity is released when the
//!   [`FirstTokenDetector`](crate::FirstTokenDetector) sees the first
//!   generated token, when the handler calls [`FirstToken::mark`], or when
//!   the body ends; its *request* capacity when the body ends, fails, or is
//!   dropped by a client that went away.
//! * **Queued** requests wait in the gate's queue (FIFO, unless priorities
//!   or tenants order it), outside the inner service. Dropping the response
//!   future (the client disconnected, a timeout fired) cancels them and
//!   frees their queue place. A queued request displaced from a full queue
//!   by an arrival of higher priority gets its overload answer at once
//!   (reason `displaced`).
//! * **Rejected** requests get an overload answer at once, decided before any
//!   header is sent:
//!   - HTTP: status `529 Site is overloaded` (configurable with
//!     [`AdmissionLayer::overload_status`]), `content-type: application/json`,
//!     and a body in the OpenAI error format, with the rejection's scope and
//!     rank as extra members:
//!     `{"error":{"message":"…","type":"overloaded","param":null,"code":529,"scope":"rank","rank":3}}`
//!     (`"scope":"worker","rank":null` for worker scope);
//!   - gRPC (request `content-type: application/grpc…`): a trailers-only
//!     `200` with `grpc-status: 14` (`UNAVAILABLE`, configurable with
//!     [`AdmissionLayer::grpc_overload_code`]) and a percent-encoded
//!     `grpc-message`, and an empty body; a gRPC-Web request gets its own
//!     `content-type` back;
//!   - both carry `x-admission-rejection-scope: rank|worker`, and
//!     `x-admission-rank: N` for rank scope. Worker-scoped rejections add
//!     `retry-after: 1` (HTTP) or `grpc-retry-pushback-ms: 1000` (gRPC): a
//!     frontend should route elsewhere for a second
//!     ([`AdmissionLayer::retry_after`] changes or removes it). Rank-scoped
//!     ones do not: the worker still has room for other ranks.
//!   - [`AdmissionLayer::overload_response`] replaces all of this with a
//!     response of your own.
//!
//! The reason phrase "Site is overloaded" is sent on HTTP/1 through hyper's
//! [`ReasonPhrase`](https://docs.rs/hyper/1/hyper/ext/struct.ReasonPhrase.html)
//! response extension (feature `hyper`, on by default); HTTP/2 has no
//! reason phrases.
//!
//! The service's error type is the inner service's: rejections are
//! responses, so axum needs no `HandleErrorLayer`.
//!
//! # Example: axum
//!
//! One gate per worker, shared by every route. Put the layer on each
//! route's method router with
//! [`MethodRouter::route_layer`](https://docs.rs/axum/0.8/axum/routing/method_routing/struct.MethodRouter.html#method.route_layer),
//! so that unknown paths (404) and wrong methods (405) are answered without
//! taking admission capacity (axum's `Router::route_layer` keeps 404s out
//! but not 405s; `Router::layer` keeps neither out). Routes without it
//! (health checks, metrics) are not admitted:
//!
//! ```
//! use axum::{Router, routing::{get, post}};
//! use tower_admission::{AdmissionConfig, AdmissionLayer, EngineCapacity, Gate, RankHeader};
//!
//! let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(256, 2)));
//! let admitted = AdmissionLayer::new(gate.clone()).rank(RankHeader::default());
//! let app: Router = Router::new()
//!     .route("/v1/chat/completions", post(|| async { "…" }).route_layer(admitted.clone()))
//!     .route("/v1/completions", post(|| async { "…" }).route_layer(admitted))
//!     .route("/health", get(|| async { "ok" })); // not admitted
//! # let _ = app;
//! ```
//!
//! # Example: tonic
//!
//! Per service, with the `tonic` feature (`Admission` is a tonic
//! `NamedService` when the service it wraps is one):
//!
//! ```ignore
//! Server::builder()
//!     .add_service(AdmissionLayer::new(gate.clone()).layer(GeneratorServer::new(generator)))
//!     .add_service(health_service) // not admitted
//!     .serve(address)
//!     .await?;
//! ```
//!
//! Or around the whole server, letting health checks and reflection bypass
//! the gate:
//!
//! ```ignore
//! Server::builder()
//!     .layer(AdmissionLayer::new(gate).bypass(BypassPaths::grpc_health_and_reflection()))
//!     .add_service(health_service)
//!     .add_service(GeneratorServer::new(generator))
//! ```
//!
//! `examples/tonic_minimal.rs` is a complete server.
//!
//! **Queues in front of the gate.** tonic's
//! `Server::concurrency_limit_per_connection` and HTTP/2's
//! `max_concurrent_streams` (`Server::http2_max_concurrent_streams`, hyper's
//! `max_concurrent_streams`) hold requests back before any layer sees them:
//! a request over the connection's limit waits, unseen by the gate, with no
//! FIFO across connections and no overload answer. Leave them unset, or
//! well above the gate's limits plus its queue, so that the gate decides.
//!
//! # Composing with other middleware
//!
//! `Admission` is always ready: it decides in `call`, and a request waits
//! for the inner service's readiness only once admitted, in its response
//! future, on a clone of the inner service (the pattern of tower's
//! `Oneshot`). A queued request holds no reservation of the inner service
//! (a `Buffer` slot, a `ConcurrencyLimit` permit), so the gate sees every
//! request. Where other layers go matters:
//!
//! * **Timeouts go outside.** A timeout outside admission (tower's
//!   `TimeoutLayer`, tower-http's `TimeoutLayer` that answers 408) bounds the
//!   queue wait plus the time to the response head; when it fires it drops
//!   the response future, which cancels a queued request or releases an
//!   admitted one. Inside admission it bounds only the inner service, and a
//!   queued request may wait for as long as the queue takes (the gate has no
//!   queue timeout by default).
//! * **Don't put a `ConcurrencyLimit` or `RateLimit` in front.** They push
//!   back in `poll_ready`. Outside admission, requests stall *before* the
//!   gate sees them: an invisible queue with no bound, no FIFO across
//!   connections, no overload answer. A `ConcurrencyLimit` also counts a
//!   request only until its response head, not until its stream ends. The
//!   gate already is the concurrency limit: size it instead.
//! * **Pacing goes inside, behind a `Buffer`.** `Admission` needs a `Clone`
//!   inner service, because each request drives its own clone. `RateLimit`
//!   is not `Clone`; behind a `Buffer`, the gate decides at call time and
//!   only admitted requests wait for the limiter (still counted as admitted
//!   while they do).
//! * **`LoadShed` outside** never sheds: admission is always ready. Its
//!   rejections are replaced by admission's.
//! * **Compression goes outside.** The detector must see the bytes the
//!   inner service produced: an `OpenAiSse` detector cannot read a
//!   compressed event stream, so waiting would end in the wrong place.
//! * **Tracing and metrics go outside**, so that they see overload answers.
//! * **Routes**: each route's clone of the layer shares the layer's gate.
//!
//! [`Gate`]: crate::Gate

mod admitted;
mod body;
mod bypass;
mod cost;
mod deadline;
mod first_token;
mod future;
mod layer;
mod qos;
mod rank;
mod reject;
mod service;
#[cfg(feature = "tonic")]
mod tonic;

pub use self::body::ResponseBody;

pub use self::admitted::Admitted;
pub use self::bypass::{Bypass, BypassPaths, NoBypass};
pub use self::cost::{
    CostBody, CostExtractor, CostHeader, CostLayer, DEFAULT_MAX_BODY_BYTES, OpenAiCost,
    OpenAiCostLayer, SetCost,
};
pub use self::first_token::FirstToken;
pub use self::future::ResponseFuture;
pub use self::layer::AdmissionLayer;
pub use self::qos::{Priority, Qos, QosExtractor, QosHeaders, QosLayer, SetQos};
pub use self::rank::{DataParallelRank, NoRank, RankExtension, RankExtractor, RankHeader};
pub use self::reject::{ORIGIN, REJECTED_RANK, REJECTION_REASON, REJECTION_SCOPE};
pub use self::service::Admission;

/// The README's Rust examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
