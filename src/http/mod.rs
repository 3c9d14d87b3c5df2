//! Admission control as a Tower HTTP middleware: [`AdmissionLayer`] and
//! [`Admission`].
//!
//! Each request is decided when the service is **called**: a [`Bypass`]
//! predicate may let it skip the gate; the layer's one describer
//! ([`Describe`]) reads it once into a [`Descriptor`](crate::Descriptor) —
//! its rank ([`RankHeader`], or a describer of your own), its cost for
//! token budgets (a [`Cost`](crate::Cost) request extension set by
//! [`OpenAiCostLayer`], or [`CostHeader`]), its priority and tenant
//! (behaviour §8, from [`QosHeaders`] or [`Priority`] and
//! [`Tenant`](crate::Tenant) extensions; take them from a trusted router
//! only) and its deadline ([`GrpcTimeout`], [`DeadlineHeader`]) — and the
//! worker's [`Gate`](crate::Gate), given the descriptor whole, admits it,
//! queues it, or rejects it.
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
//!     and a body in the OpenAI error format (`message`, `type`, `param`,
//!     `code`), with the rejection's `scope`, `rank` and `reason` as extra
//!     members, in this order:
//!     `{"error":{"message":"overloaded: data-parallel rank 1 has no room to admit or queue the request","type":"overloaded","param":null,"code":529,"scope":"rank","rank":1,"reason":"queue_full"}}`
//!     (`"scope":"worker","rank":null` for worker scope; `reason` is
//!     that of the [`RejectionReason`](crate::RejectionReason), as in the
//!     `x-admission-rejection-reason` header). The example under
//!     [Testing](#testing-with-tower-test) receives exactly this body. A
//!     request the gate rejects because it is shutting down
//!     ([`Gate::shut_down`](crate::Gate::shut_down), reason `shutdown`) is
//!     answered `503` whatever the overload status: it is not an
//!     overload, and another worker may take it at once;
//!   - gRPC (request `content-type: application/grpc…`): a trailers-only
//!     `200` with `grpc-status: 14` (`UNAVAILABLE`, configurable with
//!     [`AdmissionLayer::grpc_overload_code`]) and a percent-encoded
//!     `grpc-message`, and an empty body; a gRPC-Web request gets its own
//!     `content-type` back;
//!   - both carry `x-admission-rejection-scope: rank|worker`,
//!     `x-admission-rejection-reason: queue_full|deadline|displaced|queue_delay|shutdown|body_reads`
//!     (`body_reads`: [`OpenAiCostLayer`]'s answer when too many bodies are
//!     being read),
//!     and `x-admission-rank: N` for rank scope. Worker-scoped rejections add
//!     `retry-after: 1` (HTTP) or `grpc-retry-pushback-ms: 1000` (gRPC): a
//!     frontend should route elsewhere for a second
//!     ([`AdmissionLayer::retry_after`] changes or removes it; a gate with
//!     [`retry_after_from_drain_rate`](crate::AdmissionConfig::retry_after_from_drain_rate)
//!     sends its estimate of when it will have room instead). Rank-scoped
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
//! responses, so the admission layer adds no error of its own and, around
//! an infallible service (an axum handler or route), needs no
//! `HandleErrorLayer`. A layer inside it that has errors of its own still
//! does: tower's `Buffer` turns every error into `BoxError`, and an axum
//! route must be infallible (see [pacing](#composing-with-other-middleware)).
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
//! * **Rate limiters that reject go outside; those that delay go inside.**
//!   A limiter that answers at once — `429` per key: `tower_governor`, an
//!   API-key quota, a token bucket of your own — belongs *in front of* the
//!   gate: a request it turns away never reaches the gate, so it takes no
//!   capacity and is not counted as received. A limiter that *delays*
//!   (tower's `RateLimit`, or `ConcurrencyLimit`) must never be in front:
//!   it pushes back in `poll_ready`, and outside admission requests stall
//!   *before* the gate sees them — an invisible queue with no bound, no
//!   FIFO across connections, no overload answer (30 requests at once
//!   through `RateLimit(2/s)` outside all get `200`, the last some 14 s
//!   later). A `ConcurrencyLimit` also counts a request only until its
//!   response head, not until its stream ends; the gate already is the
//!   concurrency limit: size it instead.
//! * **Pacing goes inside, behind a `Buffer`, and axum needs a
//!   `HandleErrorLayer` for it.** `Admission` needs a `Clone` inner service,
//!   because each request drives its own clone; `RateLimit` is not `Clone`,
//!   and a `Buffer` in front of it shares one among the clones. The gate
//!   decides at call time and only admitted requests wait for the limiter
//!   (still counted as admitted while they do). `Buffer`'s error is
//!   `BoxError`, and an axum route must be infallible: put axum's
//!   `HandleErrorLayer` between the admission layer and the `Buffer`.
//!   And build the router **once** (`.with_state(())` before
//!   `axum::serve`): otherwise axum builds a `route_layer`'s stack for each
//!   connection, each connection gets a `Buffer` and `RateLimit` of its
//!   own, and the pacing limits nothing (axum issues #2582 and #2634).
//!
//!   ```
//!   # #[tokio::main(flavor = "current_thread")]
//!   # async fn main() {
//!   use std::time::Duration;
//!
//!   use axum::error_handling::HandleErrorLayer;
//!   use axum::{BoxError, Router, http::StatusCode, routing::post};
//!   use tower::{ServiceBuilder, buffer::BufferLayer, limit::RateLimitLayer};
//!   use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};
//!
//!   let gate = Gate::new(AdmissionConfig::new());
//!   let paced = ServiceBuilder::new()
//!       .layer(AdmissionLayer::new(gate)) // decides first
//!       .layer(HandleErrorLayer::new(|error: BoxError| async move {
//!           (StatusCode::SERVICE_UNAVAILABLE, error.to_string())
//!       }))
//!       .layer(BufferLayer::new(1024)) // at least the engine request limit
//!       .layer(RateLimitLayer::new(2, Duration::from_secs(1)));
//!   let app: Router = Router::new()
//!       .route("/v1/chat/completions", post(|| async { "…" }).route_layer(paced))
//!       .with_state(()); // built once: one Buffer and RateLimit for every connection
//!   # let _ = app;
//!   # }
//!   ```
//!
//!   `examples/axum_rate_limits.rs` adds a `tower_governor` quota per API
//!   key outside the gate; `tests/rate_limits.rs` checks both over real
//!   sockets.
//! * **`LoadShed` outside** never sheds: admission is always ready. Its
//!   rejections are replaced by admission's.
//! * **Compression goes outside.** The detector must see the bytes the
//!   inner service produced: an `OpenAiSse` detector cannot read a
//!   compressed event stream, so waiting would end in the wrong place.
//! * **Tracing and metrics go outside**, so that they see overload answers.
//! * **Routes**: each route's clone of the layer shares the layer's gate.
//!
//! # Testing with tower-test
//!
//! The layer is a plain tower `Service` over `http` types, so
//! `tower_test::mock` stands in for the engine, and `tokio_test::task`
//! polls the response futures one step at a time: each assertion sees the
//! gate exactly where the requests left it, with no runtime and no sleeps.
//! A request queued while the engine request limit is full does not reach
//! the mock, and is admitted when the first response's **body** ends (not
//! its head):
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use tokio_test::{assert_pending, assert_ready, assert_ready_ok, task};
//! use tower_admission::{AdmissionConfig, AdmissionLayer, Counts, Gate};
//! use tower_test::mock;
//!
//! // One request in the engine at a time, one place in the queue.
//! let gate = Gate::new(AdmissionConfig::new().engine_request_limit(1).request_queue_limit(1));
//! let layer = AdmissionLayer::new(gate.clone());
//! let (mut service, mut engine) = mock::spawn_layer::<Request<()>, Response<Full<Bytes>>, _>(layer);
//!
//! // The first request is admitted and reaches the mock engine.
//! assert_ready_ok!(service.poll_ready());
//! let mut first = task::spawn(service.call(Request::new(())));
//! assert_pending!(first.poll());
//! let (_, respond) = assert_ready!(engine.poll_request()).expect("reaches the engine");
//!
//! // The second waits in the gate's queue: it never reaches the engine.
//! assert_ready_ok!(service.poll_ready()); // the layer is always ready
//! let mut second = task::spawn(service.call(Request::new(())));
//! assert_pending!(second.poll());
//! assert!(engine.poll_request().is_pending());
//! let snapshot = gate.snapshot();
//! assert_eq!(snapshot.total, Counts::new(1, 1, 1)); // engine requests, waiting, queued
//! assert_eq!((snapshot.tally.received, snapshot.tally.admitted_direct), (2, 1));
//!
//! // The engine answers. The response head alone frees nothing...
//! respond.send_response(Response::new(Full::new(Bytes::from_static(b"Hello"))));
//! let response = assert_ready_ok!(first.poll());
//! assert_pending!(second.poll());
//! assert_eq!(gate.snapshot().total, Counts::new(1, 1, 1));
//!
//! // ...the end of its body does: the queued request is admitted.
//! let mut body = task::spawn(response.into_body().collect());
//! assert_eq!(assert_ready_ok!(body.poll()).to_bytes(), "Hello");
//! assert!(second.is_woken());
//! assert_pending!(second.poll()); // now waiting for the engine's answer
//! assert_ready!(engine.poll_request()).expect("admitted from the queue");
//! let snapshot = gate.snapshot();
//! assert_eq!(snapshot.total, Counts::new(1, 1, 0));
//! assert_eq!(snapshot.tally.admitted_queue, 1);
//! ```
//!
//! [`Gate::snapshot`](crate::Gate::snapshot) is the thing to assert on: a
//! [`Snapshot`](crate::Snapshot) has the [`Counts`](crate::Counts) of the
//! whole worker (`total`), of the unranked requests (`unranked`) and of each
//! rank (`ranks[r]`) — `engine_requests`, `engine_waiting`, `queued`, built
//! for comparison with `Counts::new(engine_requests, engine_waiting,
//! queued)` — and the [`Tally`](crate::Tally) of how requests ended
//! (`tally`, `unranked_tally`, `rank_tallies[r]`): `received`,
//! `admitted_direct`, `admitted_queue`, `rejected_rank`, `rejected_worker`,
//! `cancelled`, and more for deadlines and displacement. `Tally::since`
//! gives what happened between two snapshots; `Snapshot::is_idle` says
//! nothing is held or queued and every request received has ended one way.
//!
//! An overload answer, with its headers and body as sent:
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use tokio_test::{assert_pending, assert_ready, assert_ready_ok, task};
//! use tower_admission::{AdmissionConfig, AdmissionLayer, EngineCapacity, Gate, RankHeader};
//! use tower_test::mock;
//!
//! // Two ranks of one request each, no queue.
//! let config = AdmissionConfig::new().engine_request_limit(1).request_queue_limit(0);
//! let gate = Gate::new(config.capacity(EngineCapacity::new(8, 2)));
//! let layer = AdmissionLayer::new(gate.clone()).rank(RankHeader::default());
//! let (mut service, mut engine) = mock::spawn_layer::<Request<()>, Response<Full<Bytes>>, _>(layer);
//! let for_rank_1 = || Request::builder().header("x-data-parallel-rank", "1").body(()).unwrap();
//!
//! assert_ready_ok!(service.poll_ready());
//! let mut first = task::spawn(service.call(for_rank_1()));
//! assert_pending!(first.poll());
//! assert_ready!(engine.poll_request()).expect("rank 1 had room");
//!
//! // Rank 1 is full; rank 0 still has room: a rank-scoped overload answer,
//! // without reaching the engine.
//! assert_ready_ok!(service.poll_ready());
//! let response = assert_ready_ok!(task::spawn(service.call(for_rank_1())).poll());
//! assert!(engine.poll_request().is_pending());
//! assert_eq!(response.status(), 529);
//! let headers = response.headers();
//! assert_eq!(headers["x-admission-rejection-scope"], "rank");
//! assert_eq!(headers["x-admission-rejection-reason"], "queue_full");
//! assert_eq!(headers["x-admission-rank"], "1");
//! assert!(!headers.contains_key("retry-after"));
//! let body = assert_ready_ok!(task::spawn(response.into_body().collect()).poll()).to_bytes();
//! assert_eq!(
//!     body,
//!     r#"{"error":{"message":"overloaded: data-parallel rank 1 has no room to admit or queue the request","type":"overloaded","param":null,"code":529,"scope":"rank","rank":1,"reason":"queue_full"}}"#
//! );
//! assert_eq!(gate.snapshot().tally.rejected_rank, 1);
//! ```
//!
//! [`Gate`]: crate::Gate

mod admission;
mod cost;
mod describe;
mod estimate;
mod reject;

pub use self::admission::{
    Admission, AdmissionLayer, Admitted, Bypass, BypassPaths, FirstToken, NoBypass, ResponseBody,
    ResponseFuture,
};
pub use self::cost::{CostBody, OpenAiCost, OpenAiCostLayer};
pub use self::describe::{
    CostHeader, DeadlineHeader, Describe, GrpcTimeout, Priority, QosHeaders, RankHeader,
};
pub use self::reject::{ORIGIN, REJECTED_RANK, REJECTION_REASON, REJECTION_SCOPE};

// The one writer of the OpenAI-style error bodies, for the sidecar's own.
pub use self::reject::{error_response, overload_response};

/// The README's Rust examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
