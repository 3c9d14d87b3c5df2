//! [`AdmissionLayer`]: configuration, shared by every service it wraps.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode, request};
use tower_layer::Layer;

use super::Admission;
use super::bypass::NoBypass;
use crate::detect::{Auto, FirstTokenDetector};
use crate::gate::{Gate, Overloaded};
use crate::http::QosHeaders;
use crate::http::describe::{DeadlineHeader, Describer, GrpcTimeout};
use crate::http::reject::OverloadResponder;

/// Applies [`Admission`] to a service: admission control through one
/// shared [`Gate`].
///
/// The layer holds a clone of the gate, so every service it wraps — each
/// route of an axum `Router`, each clone made per connection or request —
/// admits through the same gate. Create the gate once per worker, outside
/// the layer.
///
/// See the [module docs](crate::http) for an example.
///
/// Each request is described to the gate once, by the layer's describer
/// (see [`Describe`](crate::http::Describe)): the [`Cost`](crate::Cost),
/// [`Priority`](crate::http::Priority) and [`Tenant`](crate::Tenant) extensions
/// always, then what [`qos_headers`](Self::qos_headers), [`rank`](Self::rank),
/// [`grpc_timeout`](Self::grpc_timeout) and
/// [`deadline_header`](Self::deadline_header) turn on, then whatever
/// [`describe`](Self::describe) adds (`X`), in that order.
#[derive(Debug, Clone)]
pub struct AdmissionLayer<D = Auto, R = (), P = NoBypass, X = ()> {
    gate: Gate,
    detector: D,
    bypass: P,
    answer: OverloadResponder,
    describer: Describer<R, X>,
}

impl AdmissionLayer {
    /// Admission through `gate`, with every request unranked, waiting ending
    /// where the response's content type says ([`Auto`]), and overloads
    /// answered with `529 Site is overloaded` (gRPC: `UNAVAILABLE`).
    ///
    /// With feature `metrics`, the layer's series of the client's view
    /// (behaviour §6: `client_time_to_first_token_seconds` and the others)
    /// are registered with the gate's, with the recorder in use now (or,
    /// for a gate still waiting for its recorder, with the one it finds).
    pub fn new(gate: Gate) -> Self {
        super::client::register(&gate);
        AdmissionLayer {
            gate,
            detector: Auto::default(),
            bypass: NoBypass,
            answer: OverloadResponder::default(),
            describer: Describer::default(),
        }
    }
}

impl<D, R, P, X> AdmissionLayer<D, R, P, X> {
    /// Decides where each response's waiting ends, e.g.
    /// [`OpenAiSse`](crate::detect::OpenAiSse) for every response whatever
    /// its content type, or a detector of your own. The default, [`Auto`],
    /// chooses by content type. The detector is cloned for each request.
    pub fn detector<D2: FirstTokenDetector>(self, detector: D2) -> AdmissionLayer<D2, R, P, X> {
        AdmissionLayer {
            gate: self.gate,
            detector,
            bypass: self.bypass,
            answer: self.answer,
            describer: self.describer,
        }
    }

    /// Lets the requests `bypass` picks skip the gate: they are neither
    /// counted, queued nor rejected. For health checks and reflection when
    /// the layer wraps a whole server; see [`Bypass`](crate::http::Bypass).
    pub fn bypass<P2>(self, bypass: P2) -> AdmissionLayer<D, R, P2, X> {
        AdmissionLayer {
            gate: self.gate,
            detector: self.detector,
            bypass,
            answer: self.answer,
            describer: self.describer,
        }
    }

    /// Reads each request's data-parallel rank with `rank`: a
    /// [`RankHeader`](crate::http::RankHeader), or any
    /// [`Describe`](crate::http::Describe)r that sets `descriptor.rank`.
    /// Ranks must come from a trusted router, not from end users.
    ///
    /// The shorthand for the rank part of the layer's describer: it
    /// replaces the rank describer set before (by default none: every
    /// request unranked) and keeps everything else the layer describes.
    ///
    /// ```
    /// use tower_admission::{AdmissionConfig, AdmissionLayer, Descriptor, Gate, RankHeader};
    ///
    /// let gate = Gate::new(AdmissionConfig::new());
    /// let by_header = AdmissionLayer::new(gate.clone()).rank(RankHeader::default());
    /// let by_path = AdmissionLayer::new(gate).rank(
    ///     |req: &http::Request<axum::body::Body>, descriptor: &mut Descriptor| {
    ///         descriptor.rank = req.uri().path().strip_prefix("/rank/").and_then(|r| r.parse().ok());
    ///     },
    /// );
    /// # let _ = (by_header, by_path);
    /// ```
    pub fn rank<R2>(self, rank: R2) -> AdmissionLayer<D, R2, P, X> {
        AdmissionLayer {
            gate: self.gate,
            detector: self.detector,
            bypass: self.bypass,
            answer: self.answer,
            describer: self.describer.rank(rank),
        }
    }

    /// Describes each request further with `describer`, a
    /// [`Describe`](crate::http::Describe): a closure
    /// `Fn(&Request<B>, &mut Descriptor)`, a built-in reader such as
    /// [`CostHeader`](crate::http::CostHeader), or a tuple of them. It runs after
    /// everything the layer already describes, so what it fills in wins;
    /// calling `describe` again adds another after it.
    ///
    /// ```
    /// use tower_admission::http::CostHeader;
    /// use tower_admission::{AdmissionConfig, AdmissionLayer, Descriptor, Gate, RankHeader};
    ///
    /// let layer = AdmissionLayer::new(Gate::new(AdmissionConfig::new()))
    ///     .rank(RankHeader::default())
    ///     .describe((
    ///         CostHeader::new("x-prompt-tokens"),
    ///         |req: &http::Request<axum::body::Body>, descriptor: &mut Descriptor| {
    ///             if req.uri().path() == "/v1/embeddings" {
    ///                 descriptor.priority = -1;
    ///             }
    ///         },
    ///     ));
    /// # let _ = layer;
    /// ```
    pub fn describe<X2>(self, describer: X2) -> AdmissionLayer<D, R, P, (X, X2)> {
        AdmissionLayer {
            gate: self.gate,
            detector: self.detector,
            bypass: self.bypass,
            answer: self.answer,
            describer: self.describer.and(describer),
        }
    }

    /// The status of overload answers to HTTP requests; 529 by default
    /// (503 and 429 are common alternatives). The JSON body's `code`
    /// follows it. gRPC requests are never answered with it: see
    /// [`grpc_overload_code`](Self::grpc_overload_code).
    ///
    /// # Panics
    ///
    /// If `status` is not a client or server error (4xx, 5xx): an overload
    /// answer that looks like success would be worse than none.
    pub fn overload_status(mut self, status: StatusCode) -> Self {
        assert!(
            status.is_client_error() || status.is_server_error(),
            "overload_status must be a 4xx or 5xx status, not {status}"
        );
        self.answer.status = status;
        self
    }

    /// The status of HTTP answers to requests refused because their
    /// tenant is over its limit (scope `tenant`, reason `tenant_limit`);
    /// 429 by default: the worker has room for other tenants, and the
    /// client's own quota is what ran out.
    ///
    /// # Panics
    ///
    /// If `status` is not a client or server error (4xx, 5xx).
    pub fn tenant_overload_status(mut self, status: StatusCode) -> Self {
        assert!(
            status.is_client_error() || status.is_server_error(),
            "tenant_overload_status must be a 4xx or 5xx status, not {status}"
        );
        self.answer.tenant_status = status;
        self
    }

    /// The `grpc-status` of overload answers to gRPC requests; 14
    /// (`UNAVAILABLE`) by default. 8 (`RESOURCE_EXHAUSTED`) is the common
    /// alternative. With tonic: `grpc_overload_code(tonic::Code::Unavailable as i32)`.
    ///
    /// # Panics
    ///
    /// If `code` is not a gRPC error code (1 to 16).
    pub fn grpc_overload_code(mut self, code: i32) -> Self {
        self.answer.grpc_code = match u16::try_from(code) {
            Ok(code @ 1..=16) => code,
            _ => panic!("grpc_overload_code must be a gRPC error code (1..=16), not {code}"),
        };
        self
    }

    /// The `Retry-After` of worker-scoped overload answers, in seconds
    /// (gRPC: `grpc-retry-pushback-ms`, in milliseconds); `None` sends
    /// none. 1 second by default: long enough for a frontend to route
    /// elsewhere, short enough to come back once the burst has passed.
    /// Rank-scoped answers never carry one: the worker still has room for
    /// other ranks. Tenant-scoped answers carry it too, with the tenant's
    /// own drain estimate when the gate has one.
    ///
    /// With a gate that estimates it from its drain rate
    /// ([`AdmissionConfig::retry_after_from_drain_rate`](crate::AdmissionConfig::retry_after_from_drain_rate)),
    /// the estimate ([`Overloaded::retry_after`](crate::Overloaded::retry_after)) replaces `seconds`
    /// whenever the gate has one; `None` still sends none.
    pub fn retry_after(mut self, seconds: Option<u32>) -> Self {
        self.answer.retry_after = seconds;
        self
    }

    /// Builds the whole overload response with `build`, for services with
    /// an error format of their own. It gets the rejection and the
    /// rejected request's head, and replaces every other overload setting
    /// of the layer (status, gRPC code, `Retry-After`, headers, body).
    ///
    /// ```
    /// use tower_admission::{AdmissionConfig, AdmissionLayer, Gate, RejectionScope};
    ///
    /// let layer = AdmissionLayer::new(Gate::new(AdmissionConfig::new())).overload_response(
    ///     |overloaded: &tower_admission::Overloaded, _request: &http::request::Parts| {
    ///         let body = match overloaded.scope() {
    ///             RejectionScope::Worker => "busy, try another worker",
    ///             _ => "busy, try another rank",
    ///         };
    ///         http::Response::builder()
    ///             .status(503)
    ///             .body(bytes::Bytes::from_static(body.as_bytes()))
    ///             .unwrap()
    ///     },
    /// );
    /// # let _ = layer;
    /// ```
    pub fn overload_response<F>(mut self, build: F) -> Self
    where
        F: Fn(&Overloaded, &request::Parts) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.answer.build = Some(Arc::new(build));
        self
    }

    /// Honours a gRPC request's `grpc-timeout`: the request waits in the
    /// queue no longer; if its deadline passes there, it is answered
    /// `DEADLINE_EXCEEDED` at once. Off by default. The shorthand for
    /// adding [`GrpcTimeout`] to the layer's describer.
    pub fn grpc_timeout(mut self) -> Self {
        self.describer.grpc_timeout = Some(GrpcTimeout);
        self
    }

    /// Honours a deadline the client (or a trusted router) sends in header
    /// `name`, in milliseconds from arrival: the request waits in the queue
    /// no longer, and is answered with an overload of reason `deadline` if
    /// it passes there. Off by default. The shorthand for adding
    /// [`DeadlineHeader`] to the layer's describer
    /// (with both this and [`grpc_timeout`](Self::grpc_timeout), the
    /// smaller deadline wins).
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn deadline_header(mut self, name: &str) -> Self {
        self.describer.deadline_header = Some(DeadlineHeader::new(name));
        self
    }

    /// Reads each request's priority and tenant (behaviour §8) from the headers
    /// `headers` names, `x-admission-priority` and `x-admission-tenant` with
    /// [`QosHeaders::default()`](crate::http::QosHeaders), and sets them as the
    /// request's [`Priority`](crate::http::Priority) and
    /// [`Tenant`](crate::Tenant) extensions before admission, replacing any
    /// an earlier layer set. A malformed header is ignored: priority 0, no
    /// tenant, unless an earlier layer said otherwise. Off by default:
    /// without it the layer still honours the extensions, set by your own
    /// middleware, and what a describer of yours
    /// ([`describe`](Self::describe)) fills in.
    ///
    /// Take these headers from a trusted router only, never straight from
    /// end users: a client that sets its own priority jumps the queue.
    pub fn qos_headers(mut self, headers: QosHeaders) -> Self {
        self.describer.qos_headers = Some(headers);
        self
    }

    /// The gate requests are admitted through.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }
}

impl<S, D: Clone, R: Clone, P: Clone, X: Clone> Layer<S> for AdmissionLayer<D, R, P, X> {
    type Service = Admission<S, D, R, P, X>;

    fn layer(&self, inner: S) -> Self::Service {
        Admission {
            inner,
            gate: self.gate.clone(),
            detector: self.detector.clone(),
            bypass: self.bypass.clone(),
            answer: self.answer.clone(),
            describer: self.describer.clone(),
        }
    }
}
