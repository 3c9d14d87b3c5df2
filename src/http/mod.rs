//! Admission control as a Tower HTTP middleware: [`AdmissionLayer`] and
//! [`Admission`].
//!
//! Each request is decided when the service is **called**: its rank is read
//! by a [`RankExtractor`], its cost (for token budgets) from a
//! [`Cost`](crate::Cost) request extension set by an earlier layer (see
//! [`OpenAiCostLayer`] and [`CostLayer`]), and the worker's
//! [`Gate`](crate::Gate) admits it, queues it, or rejects it.
//!
//! * **Admitted** requests reach the inner service. The request's
//!   [`Permit`](crate::Permit) travels into the [`ResponseBody`]: its
//!   *waiting* capacity is released when the
//!   [`FirstTokenDetector`](crate::FirstTokenDetector) sees the first
//!   generated token (or the body ends), its *request* capacity when the body
//!   ends, fails, or is dropped by a client that went away.
//! * **Queued** requests wait in the gate's FIFO, outside the inner service.
//!   Dropping the response future (the client disconnected, a timeout fired)
//!   cancels them and frees their queue place.
//! * **Rejected** requests get an overload answer at once, decided before any
//!   header is sent:
//!   - HTTP: status `529 Site is overloaded` (configurable with
//!     [`AdmissionLayer::overload_status`]), `content-type: application/json`,
//!     and an OpenAI-style body
//!     `{"error":{"message":"…","type":"overloaded","code":529,"scope":"rank","rank":3}}`
//!     (`"scope":"worker","rank":null` for worker scope);
//!   - gRPC (request `content-type: application/grpc…`): a trailers-only
//!     `200` with `grpc-status: 14` (`UNAVAILABLE`, configurable with
//!     [`AdmissionLayer::grpc_overload_code`]) and a percent-encoded
//!     `grpc-message`, and an empty body;
//!   - both carry `x-admission-rejection-scope: rank|worker`, and
//!     `x-admission-rank: N` for rank scope. Worker-scoped rejections add
//!     `retry-after: 1` (HTTP) or `grpc-retry-pushback-ms: 1000` (gRPC): a
//!     frontend should route elsewhere for a second. Rank-scoped ones do
//!     not: the worker still has room for other ranks.
//!
//! The reason phrase "Site is overloaded" is sent on HTTP/1 through hyper's
//! [`ReasonPhrase`](https://docs.rs/hyper/1/hyper/ext/struct.ReasonPhrase.html)
//! response extension (feature `hyper`, on by default); HTTP/2 has no
//! reason phrases.
//!
//! The service's error type is the inner service's: rejections are
//! responses, so axum needs no `HandleErrorLayer`.
//!
//! # Example
//!
//! One gate per worker, shared by every route:
//!
//! ```
//! use axum::{Router, routing::{get, post}};
//! use tower_admission::detect::OpenAiSse;
//! use tower_admission::{AdmissionConfig, AdmissionLayer, EngineCapacity, Gate, RankHeader};
//!
//! let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(256, 2)));
//! let app: Router = Router::new()
//!     .route("/v1/chat/completions", post(|| async { "…" }))
//!     .route("/v1/completions", post(|| async { "…" }))
//!     .layer(
//!         AdmissionLayer::new(gate.clone())
//!             .detector(OpenAiSse::default())
//!             .rank(RankHeader::default()),
//!     )
//!     .route("/health", get(|| async { "ok" })); // added after: not admitted
//! # let _ = app;
//! ```
//!
//! # Composing with other middleware
//!
//! `Admission` forwards `poll_ready` to the inner service and decides in
//! `call`. Where other layers go matters:
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
//!   inner service, because a queued request calls the service later, from
//!   its response future (the `mem::replace` pattern of `tower-service`).
//!   `RateLimit` is not `Clone`, and its stalled `poll_ready` would be
//!   forwarded, holding back even requests the gate rejects at once. Behind a
//!   `Buffer`, the gate decides at call time and only admitted requests wait
//!   for the limiter (still counted as admitted while they do).
//! * **`LoadShed` outside** sheds only when the inner service is not ready
//!   (admission itself is always ready when its inner service is), and
//!   answers with an error, not an overload response. Admission's rejections
//!   replace it.
//! * **Compression goes outside.** The detector must see the bytes the
//!   inner service produced: an `OpenAiSse` detector cannot read a
//!   compressed event stream, so waiting would end in the wrong place.
//! * **Tracing and metrics go outside**, so that they see overload answers.
//! * **Routes**: axum's `Router::layer` wraps each route separately, and
//!   all of them share the layer's gate. Routes added after the layer (health
//!   checks, metrics) are not admitted.
//!
//! [`Gate`]: crate::Gate

mod body;
mod cost;
mod future;
mod layer;
mod rank;
mod reject;
mod service;

pub use self::body::ResponseBody;
pub use self::cost::{
    CostBody, CostExtractor, CostHeader, CostLayer, DEFAULT_MAX_BODY_BYTES, OpenAiCost,
    OpenAiCostLayer, SetCost,
};
pub use self::future::ResponseFuture;
pub use self::layer::AdmissionLayer;
pub use self::rank::{DataParallelRank, NoRank, RankExtension, RankExtractor, RankHeader};
pub use self::reject::{REJECTED_RANK, REJECTION_SCOPE};
pub use self::service::{Admission, Admitted};
