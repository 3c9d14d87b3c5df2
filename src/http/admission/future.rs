//! [`ResponseFuture`]: waits in the gate's queue if it must, drives the inner
//! service to readiness and calls it once admitted, and moves the request's
//! permit into the response body.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::ResponseBody;
use super::admitted::admit;
use super::client::{Arrival, Measure};
use super::first_token::Held;
use crate::detect::{Auto, FirstTokenDetector};
use crate::gate::Acquire;
use crate::http::reject::OverloadResponder;

pin_project! {
    /// Response future of [`Admission`](crate::http::Admission).
    ///
    /// Dropping it while the request is queued cancels the request and frees
    /// its queue place; dropping it after admission, before the response,
    /// releases the engine capacity the request held.
    pub struct ResponseFuture<S, ReqBody, D = Auto>
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
        // Queued in the gate, with a clone of the inner service that has
        // not been polled yet.
        Queued {
            acquire: Acquire,
            call: Option<Deferred<S, ReqBody, D>>,
            // Armed at the first poll when the request has a queue wait
            // budget: when it fires, the request expires.
            timer: Option<Pin<Box<tokio::time::Sleep>>>,
        },
        // Admitted (or bypassing the gate): driving the inner service to
        // readiness, then calling it.
        Ready {
            service: S,
            request: Option<Request<ReqBody>>,
            // `None` for a request that bypassed the gate.
            held: Option<Held>,
            measure: Option<Measure>,
            detector: Option<D>,
        },
        // The inner service is answering.
        Called {
            #[pin]
            future: S::Future,
            held: Option<Held>,
            measure: Option<Measure>,
            detector: Option<D>,
        },
        // Rejected; answered when first polled.
        Rejected {
            response: Option<Response<Bytes>>,
        },
        Done,
    }
}

/// What a queued request needs to proceed once admitted.
pub(crate) struct Deferred<S, ReqBody, D> {
    pub(crate) service: S,
    pub(crate) request: Request<ReqBody>,
    pub(crate) detector: D,
    pub(crate) answer: OverloadResponder,
    /// When it arrived, for the client's view.
    pub(crate) arrival: Arrival,
}

impl<S, ReqBody, D> ResponseFuture<S, ReqBody, D>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn admitted(
        service: S,
        request: Request<ReqBody>,
        held: Option<Held>,
        measure: Measure,
        detector: D,
    ) -> Self {
        ResponseFuture {
            state: State::Ready {
                service,
                request: Some(request),
                held,
                measure: Some(measure),
                detector: Some(detector),
            },
        }
    }

    pub(crate) fn queued(acquire: Acquire, call: Deferred<S, ReqBody, D>) -> Self {
        ResponseFuture {
            state: State::Queued {
                acquire,
                call: Some(call),
                timer: None,
            },
        }
    }

    pub(crate) fn rejected(response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Rejected {
                response: Some(response),
            },
        }
    }
}

const POLLED_AFTER_COMPLETION: &str = "ResponseFuture polled after completion";

impl<S, ReqBody, ResBody, D> Future for ResponseFuture<S, ReqBody, D>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body,
    D: FirstTokenDetector,
{
    type Output = Result<Response<ResponseBody<ResBody, D>>, S::Error>;

    // Inlined into the server's task: the response (head and body, a few
    // hundred bytes) is then built where the server takes it, not copied
    // out of one more call.
    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Queued {
                    acquire,
                    call,
                    timer,
                } => {
                    if timer.is_none() {
                        if let Some(at) = acquire.expires_at() {
                            let at = tokio::time::Instant::from_std(at);
                            *timer = Some(Box::pin(tokio::time::sleep_until(at)));
                        }
                    }
                    let mut admission = Pin::new(&mut *acquire).poll(cx);
                    if admission.is_pending() {
                        if let Some(timer) = timer.as_mut() {
                            if timer.as_mut().poll(cx).is_ready() {
                                // The budget ran out: the request leaves the
                                // queue (unless admitted in the meantime).
                                acquire.expire();
                                admission = Pin::new(&mut *acquire).poll(cx);
                            }
                        }
                    }
                    let Poll::Ready(admission) = admission else {
                        return Poll::Pending;
                    };
                    let Deferred {
                        service,
                        mut request,
                        detector,
                        answer,
                        arrival,
                    } = call.take().expect(POLLED_AFTER_COMPLETION);
                    match admission {
                        Ok(permit) => {
                            let held = admit(&mut request, permit);
                            state.set(State::Ready {
                                service,
                                request: Some(request),
                                held: Some(held),
                                measure: Some(arrival.admitted()),
                                detector: Some(detector),
                            });
                        }
                        Err(overloaded) => {
                            let (head, _) = request.into_parts();
                            state.set(State::Rejected {
                                response: Some(answer.respond(overloaded, &head)),
                            });
                        }
                    }
                }
                StateProj::Ready {
                    service,
                    request,
                    held,
                    measure,
                    detector,
                } => {
                    if let Err(error) = ready!(service.poll_ready(cx)) {
                        // The permit drops with the state: the request ended
                        // (and the client's view counts it cut off).
                        state.set(State::Done);
                        return Poll::Ready(Err(error));
                    }
                    let future = service.call(request.take().expect(POLLED_AFTER_COMPLETION));
                    let (held, measure, detector) = (held.take(), measure.take(), detector.take());
                    state.set(State::Called {
                        future,
                        held,
                        measure,
                        detector,
                    });
                }
                StateProj::Called {
                    future,
                    held,
                    measure,
                    detector,
                } => {
                    let result = ready!(future.poll(cx));
                    let (held, measure, detector) = (held.take(), measure.take(), detector.take());
                    state.set(State::Done);
                    // On an error the permit drops here: the request ended.
                    let (head, body) = result?.into_parts();
                    let mut detector = detector.expect(POLLED_AFTER_COMPLETION);
                    let mut measure = measure.expect(POLLED_AFTER_COMPLETION);
                    if held.is_some() {
                        detector.on_response(&head);
                        measure.on_response(&head);
                    }
                    let body = ResponseBody::admitted(body, held, measure, detector);
                    return Poll::Ready(Ok(Response::from_parts(head, body)));
                }
                StateProj::Rejected { response } => {
                    let response = response.take().expect(POLLED_AFTER_COMPLETION);
                    state.set(State::Done);
                    return Poll::Ready(Ok(response.map(ResponseBody::overloaded)));
                }
                StateProj::Done => panic!("{POLLED_AFTER_COMPLETION}"),
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
            State::Ready { .. } => "ready",
            State::Called { .. } => "called",
            State::Rejected { .. } => "rejected",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
