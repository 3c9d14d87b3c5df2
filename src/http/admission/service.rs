//! [`Admission`]: the middleware service.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::admitted::admit;
use super::bypass::{Bypass, NoBypass};
use super::client::{Arrival, Measure};
use super::future::Deferred;
use super::{ResponseBody, ResponseFuture};
use crate::detect::{Auto, FirstTokenDetector};
use crate::gate::Gate;
use crate::http::describe::{Describe, Describer};
use crate::http::reject::OverloadResponder;

/// Admission control for an HTTP or gRPC service: each request is admitted,
/// queued, or answered with an overload response before it reaches the
/// inner service.
///
/// Built by [`AdmissionLayer`](crate::http::AdmissionLayer); see the
/// [module docs](crate::http) for how it behaves and composes.
#[derive(Debug, Clone)]
pub struct Admission<S, D = Auto, R = (), P = NoBypass, X = ()> {
    pub(super) inner: S,
    pub(super) gate: Gate,
    pub(super) detector: D,
    pub(super) bypass: P,
    pub(super) answer: OverloadResponder,
    pub(super) describer: Describer<R, X>,
}

impl<S, D, R, P, X> Admission<S, D, R, P, X> {
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
}

impl<S, ReqBody, ResBody, D, R, P, X> Service<Request<ReqBody>> for Admission<S, D, R, P, X>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: Body<Data = Bytes>,
    D: FirstTokenDetector,
    R: Describe<ReqBody>,
    P: Bypass<ReqBody>,
    X: Describe<ReqBody>,
{
    type Response = Response<ResponseBody<ResBody, D>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, D>;

    /// Always ready: admission is decided in `call`, whatever the inner
    /// service's readiness, so that no request waits where the gate cannot
    /// see it. Each call drives a clone of the inner service to readiness
    /// in its response future, after admission; an inner readiness error
    /// comes out of that future.
    #[inline]
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        if self.bypass.bypass(&req) {
            return ResponseFuture::admitted(
                self.inner.clone(),
                req,
                None,
                Measure::none(),
                self.detector.clone(),
            );
        }
        // Described once, by the layer's one describer; what the QoS
        // headers held becomes the request's extensions for the inner
        // service.
        let (descriptor, qos) = self.describer.read(&req);
        qos.insert_into(&mut req);
        // The client's clock starts here, before any queue wait.
        let arrival = Arrival::now(&self.gate, &descriptor);
        let mut acquire = self.gate.acquire_with(descriptor);

        // The gate decided on arrival unless the request was queued: take
        // the decision now.
        if !acquire.is_queued() {
            let mut cx = Context::from_waker(Waker::noop());
            if let Poll::Ready(decision) = Pin::new(&mut acquire).poll(&mut cx) {
                return match decision {
                    Ok(permit) => {
                        let mut req = req;
                        let held = admit(&mut req, permit);
                        ResponseFuture::admitted(
                            self.inner.clone(),
                            req,
                            Some(held),
                            arrival.admitted(),
                            self.detector.clone(),
                        )
                    }
                    Err(overloaded) => {
                        let (head, _) = req.into_parts();
                        ResponseFuture::rejected(self.answer.respond(overloaded, &head))
                    }
                };
            }
        }

        // Queued: the request waits with a clone of the inner service,
        // which is driven to readiness only once the request is admitted.
        ResponseFuture::queued(
            acquire,
            Deferred {
                service: self.inner.clone(),
                request: req,
                detector: self.detector.clone(),
                answer: self.answer.clone(),
                arrival,
            },
        )
    }
}
