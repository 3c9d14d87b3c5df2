//! [`ResponseFuture`]: waits in the gate's queue if it must, calls the inner
//! service once admitted, and moves the [`Permit`] into the response body.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::reject::{OverloadAnswer, Protocol, Rejection};
use super::{Admitted, ResponseBody};
use crate::detect::{AnyData, FirstTokenDetector};
use crate::{Acquire, Permit};

pin_project! {
    /// Response future of [`Admission`](super::Admission).
    ///
    /// Dropping it while the request is queued cancels the request and frees
    /// its queue place; dropping it after admission, before the response,
    /// releases the engine capacity the request held.
    pub struct ResponseFuture<S, ReqBody, D = AnyData>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody, D>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, D>
    where
        S: Service<Request<ReqBody>>,
    {
        // Queued in the gate. `service` was made ready by `poll_ready` and
        // moved here (the `mem::replace` pattern); it is called on admission.
        Queued {
            acquire: Acquire,
            call: Option<Deferred<S, ReqBody, D>>,
        },
        // Admitted; the inner service is answering.
        Called {
            #[pin]
            future: S::Future,
            // Taken when the response (or an error) arrives.
            admitted: Option<(Permit, D)>,
        },
        // Rejected; answered when first polled.
        Rejected {
            rejection: Option<Rejection>,
        },
    }
}

/// What a queued request needs to proceed once admitted.
pub(crate) struct Deferred<S, ReqBody, D> {
    pub(crate) service: S,
    pub(crate) request: Request<ReqBody>,
    pub(crate) detector: D,
    pub(crate) protocol: Protocol,
    pub(crate) answer: OverloadAnswer,
}

impl<S, ReqBody, D> ResponseFuture<S, ReqBody, D>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn called(future: S::Future, permit: Permit, detector: D) -> Self {
        ResponseFuture {
            state: State::Called {
                future,
                admitted: Some((permit, detector)),
            },
        }
    }

    pub(crate) fn queued(acquire: Acquire, call: Deferred<S, ReqBody, D>) -> Self {
        ResponseFuture {
            state: State::Queued {
                acquire,
                call: Some(call),
            },
        }
    }

    pub(crate) fn rejected(rejection: Rejection) -> Self {
        ResponseFuture {
            state: State::Rejected {
                rejection: Some(rejection),
            },
        }
    }
}

impl<S, ReqBody, ResBody, D> Future for ResponseFuture<S, ReqBody, D>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body,
    D: FirstTokenDetector,
{
    type Output = Result<Response<ResponseBody<ResBody, D>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Queued { acquire, call } => {
                    let admission = ready!(Pin::new(acquire).poll(cx));
                    let Deferred {
                        mut service,
                        mut request,
                        detector,
                        protocol,
                        answer,
                    } = call.take().expect("ResponseFuture polled after completion");
                    match admission {
                        Ok(permit) => state.set(State::Called {
                            future: {
                                request.extensions_mut().insert(Admitted::of(&permit));
                                service.call(request)
                            },
                            admitted: Some((permit, detector)),
                        }),
                        Err(overloaded) => state.set(State::Rejected {
                            rejection: Some(Rejection {
                                overloaded,
                                protocol,
                                answer,
                            }),
                        }),
                    }
                }
                StateProj::Called { future, admitted } => {
                    let result = ready!(future.poll(cx));
                    let (permit, mut detector) = admitted
                        .take()
                        .expect("ResponseFuture polled after completion");
                    // On an error the permit drops here: the request ended.
                    let (head, body) = result?.into_parts();
                    detector.on_response(&head);
                    let body = ResponseBody::admitted(body, permit, detector);
                    return Poll::Ready(Ok(Response::from_parts(head, body)));
                }
                StateProj::Rejected { rejection } => {
                    let rejection = rejection
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(rejection
                        .into_response()
                        .map(ResponseBody::overloaded)));
                }
            }
        }
    }
}

impl<S, ReqBody, D> fmt::Debug for ResponseFuture<S, ReqBody, D>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Queued { .. } => "queued",
            State::Called { .. } => "called",
            State::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
