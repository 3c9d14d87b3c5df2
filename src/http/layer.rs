//! [`AdmissionLayer`]: configuration, shared by every service it wraps.

use http::StatusCode;
use tower_layer::Layer;

use super::reject::OverloadAnswer;
use super::{Admission, NoRank};
use crate::Gate;
use crate::detect::{AnyData, FirstTokenDetector};

/// Applies [`Admission`] to a service: admission control through one
/// shared [`Gate`].
///
/// The layer holds a clone of the gate, so every service it wraps — each
/// route of an axum `Router`, each clone made per connection or request —
/// admits through the same gate. Create the gate once per worker, outside
/// the layer.
///
/// See the [module docs](super) for an example.
#[derive(Debug, Clone)]
pub struct AdmissionLayer<D = AnyData, R = NoRank> {
    gate: Gate,
    detector: D,
    rank: R,
    answer: OverloadAnswer,
}

impl AdmissionLayer {
    /// Admission through `gate`, with every request unranked, waiting ending
    /// at the first non-empty data frame ([`AnyData`]), and overloads
    /// answered with `529 Site is overloaded` (gRPC: `UNAVAILABLE`).
    pub fn new(gate: Gate) -> Self {
        AdmissionLayer {
            gate,
            detector: AnyData,
            rank: NoRank,
            answer: OverloadAnswer::default(),
        }
    }
}

impl<D, R> AdmissionLayer<D, R> {
    /// Decides where each response's waiting ends, e.g.
    /// [`OpenAiSse`](crate::detect::OpenAiSse) for OpenAI-compatible event
    /// streams or [`Grpc`](crate::detect::Grpc) for gRPC streams. The
    /// detector is cloned for each request.
    pub fn detector<D2: FirstTokenDetector>(self, detector: D2) -> AdmissionLayer<D2, R> {
        AdmissionLayer {
            gate: self.gate,
            detector,
            rank: self.rank,
            answer: self.answer,
        }
    }

    /// Reads each request's data-parallel rank with `rank`, a
    /// [`RankExtractor`](super::RankExtractor) such as
    /// [`RankHeader`](super::RankHeader). Ranks must come from a trusted
    /// router, not from end users.
    pub fn rank<R2>(self, rank: R2) -> AdmissionLayer<D, R2> {
        AdmissionLayer {
            gate: self.gate,
            detector: self.detector,
            rank,
            answer: self.answer,
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

    /// The gate requests are admitted through.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }
}

impl<S, D: Clone, R: Clone> Layer<S> for AdmissionLayer<D, R> {
    type Service = Admission<S, D, R>;

    fn layer(&self, inner: S) -> Self::Service {
        Admission {
            inner,
            gate: self.gate.clone(),
            detector: self.detector.clone(),
            rank: self.rank.clone(),
            answer: self.answer,
        }
    }
}
