//! [`Admission`]: the middleware service.

use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::future::Deferred;
use super::reject::{OverloadAnswer, Protocol, Rejection};
use super::{NoRank, RankExtractor, ResponseBody, ResponseFuture};
use crate::detect::{AnyData, FirstTokenDetector};
use crate::{AdmitSource, Cost, Descriptor, Gate, Permit};

/// What the gate decided for a request, inserted into the request's
/// extensions before the inner service sees it: the rank the request is
/// counted under (`None` when unranked, including an unrecognised rank) and
/// how it got in. A handler that runs the request on an engine rank should
/// use this rank, the one the gate accounted for.
///
/// With axum: `Extension(admitted): Extension<Admitted>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// The rank the request is counted under.
    pub rank: Option<u32>,
    /// Whether it was admitted on arrival or from the queue.
    pub source: AdmitSource,
}

impl Admitted {
    pub(crate) fn of(permit: &Permit) -> Admitted {
        Admitted {
            rank: permit.rank(),
            source: permit.source(),
        }
    }
}

/// Admission control for an HTTP or gRPC service: each request is admitted,
/// queued, or answered with an overload response before it reaches the
/// inner service.
///
/// Built by [`AdmissionLayer`](super::AdmissionLayer); see the
/// [module docs](super) for how it behaves and composes.
#[derive(Debug, Clone)]
pub struct Admission<S, D = AnyData, R = NoRank> {
    pub(super) inner: S,
    pub(super) gate: Gate,
    pub(super) detector: D,
    pub(super) rank: R,
    pub(super) answer: OverloadAnswer,
}

impl<S> Admission<S> {
    /// Wraps `inner` with the default configuration: every request
    /// unranked, waiting ends at the first data frame, status 529.
    pub fn new(inner: S, gate: Gate) -> Self {
        Admission {
            inner,
            gate,
            detector: AnyData,
            rank: NoRank,
            answer: OverloadAnswer::default(),
        }
    }
}

impl<S, D, R> Admission<S, D, R> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The gate this service admits through.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }
}

impl<S, ReqBody, ResBody, D, R> Service<Request<ReqBody>> for Admission<S, D, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: Body<Data = Bytes>,
    D: FirstTokenDetector,
    R: RankExtractor<ReqBody>,
{
    type Response = Response<ResponseBody<ResBody, D>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, D>;

    /// Forwards to the inner service: admission is decided in `call`, so
    /// that arrival order is call order and the rank extractor sees the
    /// request.
    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let cost = req.extensions().get::<Cost>().copied().unwrap_or_default();
        let request = Descriptor::new()
            .with_rank(self.rank.rank(&req))
            .with_cost(cost);
        let protocol = Protocol::of(&req);
        let mut acquire = self.gate.acquire_with(request);

        // The gate decided on arrival unless the request was queued: take
        // the decision now, so an admitted request calls the (ready) inner
        // service without cloning it.
        if !acquire.is_queued() {
            let mut cx = Context::from_waker(Waker::noop());
            if let Poll::Ready(decision) = Pin::new(&mut acquire).poll(&mut cx) {
                return match decision {
                    Ok(permit) => {
                        let mut req = req;
                        req.extensions_mut().insert(Admitted::of(&permit));
                        ResponseFuture::called(self.inner.call(req), permit, self.detector.clone())
                    }
                    Err(overloaded) => ResponseFuture::rejected(Rejection {
                        overloaded,
                        protocol,
                        answer: self.answer,
                    }),
                };
            }
        }

        // Queued: the service made ready by `poll_ready` waits with the
        // request and is called on admission; `self` keeps a fresh clone,
        // which must be driven to readiness again before the next call.
        let fresh = self.inner.clone();
        let service = mem::replace(&mut self.inner, fresh);
        ResponseFuture::queued(
            acquire,
            Deferred {
                service,
                request: req,
                detector: self.detector.clone(),
                protocol,
                answer: self.answer,
            },
        )
    }
}
