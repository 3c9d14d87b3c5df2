//! [`ResponseBody`]: carries the [`Permit`](crate::Permit) of an admitted
//! request until the response stream ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::client::{Measure, carries_content};
use super::first_token::Held;
use crate::detect::{Auto, FirstTokenDetector};

pin_project! {
    /// Response body of [`Admission`](crate::http::Admission).
    ///
    /// For an admitted request it wraps the inner body and holds the
    /// request's [`Permit`](crate::Permit):
    ///
    /// * **waiting** capacity is released when the detector reports the
    ///   first generated token, when the handler calls
    ///   [`FirstToken::mark`](crate::http::FirstToken::mark), or when the body
    ///   completes;
    /// * **request** capacity is released when the body completes, fails, or
    ///   is dropped — whichever comes first, exactly once.
    ///
    /// "Completes" means what it means to hyper: the body reported
    /// [`is_end_stream`](Body::is_end_stream) when the response was produced,
    /// or later yielded `None`, a trailers frame, an error, or a data frame
    /// after which it reports `is_end_stream`. A body dropped before any of
    /// these was cancelled (the client went away); the permit goes with it.
    ///
    /// With feature `metrics`, it also measures the client's view of the
    /// response (see the [`metrics`](crate::metrics) module): the first
    /// content token, the gap before each later content chunk (every
    /// non-empty data frame but an event stream's `[DONE]` and usage-only
    /// trailers), and the end.
    ///
    /// For a rejected request it is the overload answer's body.
    pub struct ResponseBody<B, D = Auto> {
        #[pin]
        kind: Kind<B, D>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B, D> {
        Admitted {
            #[pin]
            body: B,
            // `Some` until waiting ends.
            detector: Option<D>,
            // `None` once the response ended (or for a request that
            // bypassed the gate).
            held: Option<Held>,
            // The client's view, while metrics are recorded: ended with
            // `held`, or counted cut off when dropped before.
            measure: Measure,
        },
        Overloaded {
            // `None` once yielded.
            body: Option<Bytes>,
        },
    }
}

impl<B, D> ResponseBody<B, D> {
    /// Wraps the body of an admitted response. The detector has seen the
    /// response head. `held` is `None` for a request that bypassed the gate.
    pub(crate) fn admitted(body: B, held: Option<Held>, mut measure: Measure, detector: D) -> Self
    where
        B: Body,
    {
        // A body that is already at its end will never be polled by hyper:
        // the response is complete now.
        let (held, detector) = match held {
            Some(held) if !body.is_end_stream() => {
                let detector = (!held.waiting_over()).then_some(detector);
                (Some(held), detector)
            }
            _ => {
                measure.end(true);
                (None, None)
            }
        };
        ResponseBody {
            kind: Kind::Admitted {
                body,
                detector,
                held,
                measure,
            },
        }
    }

    /// The body of an overload answer.
    pub(crate) fn overloaded(body: Bytes) -> Self {
        let body = if body.is_empty() { None } else { Some(body) };
        ResponseBody {
            kind: Kind::Overloaded { body },
        }
    }
}

impl<B, D> Body for ResponseBody<B, D>
where
    B: Body<Data = Bytes>,
    D: FirstTokenDetector,
{
    type Data = Bytes;
    type Error = B::Error;

    // Inlined into the server's loop: the inner body's frame is then
    // written where the server reads it, not copied out of this call.
    #[inline(always)]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Admitted {
                mut body,
                detector,
                held,
                measure,
            } => {
                let polled = body.as_mut().poll_frame(cx);
                // A response that bypassed the gate or has ended passes
                // frames through: one branch per frame. (Without `held`
                // there is no detector either.)
                let Some(holding) = held.as_mut() else {
                    return polled;
                };
                if let Poll::Ready(frame) = &polled {
                    let ended = match frame {
                        Some(Ok(frame)) => {
                            if let Some(data) = frame.data_ref() {
                                // Once waiting is over the detector is gone.
                                if detector.is_some() {
                                    watch(detector, holding, data);
                                }
                                // The client's view: from the first token
                                // on, every frame but the stream's trailers
                                // is a content chunk.
                                if measure.is_on()
                                    && holding.waiting_over()
                                    && carries_content(data)
                                {
                                    measure.chunk();
                                }
                            }
                            frame.is_trailers() || body.is_end_stream()
                        }
                        Some(Err(_)) => {
                            measure.end(false);
                            true
                        }
                        None => true,
                    };
                    if ended {
                        end(detector, held, measure);
                    }
                }
                polled
            }
            KindProj::Overloaded { body } => {
                Poll::Ready(body.take().map(|data| Ok(Frame::data(data))))
            }
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Admitted { body, .. } => body.is_end_stream(),
            Kind::Overloaded { body } => body.is_none(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Admitted { body, .. } => body.size_hint(),
            Kind::Overloaded { body } => {
                SizeHint::with_exact(body.as_ref().map_or(0, |body| body.len() as u64))
            }
        }
    }
}

/// Shows `data` to the detector while waiting lasts; drops the detector
/// once waiting is over. Out of line, so that the per-frame path of
/// `poll_frame` stays small enough to be inlined into the server's loop.
#[inline(never)]
fn watch<D: FirstTokenDetector>(detector: &mut Option<D>, held: &mut Held, data: &[u8]) {
    let Some(watching) = detector else {
        return;
    };
    // A handler marked the first token, or the detector sees it here.
    let over = held.waiting_over() || {
        let found = watching.on_data(data).is_some();
        if found {
            held.first_token();
        }
        found
    };
    if over {
        *detector = None;
    }
}

/// The response ended: dropping the permit releases the request capacity
/// and, for a response that ends without a token, the waiting capacity;
/// the client's view records it completed, unless it was ended as failed
/// already.
#[inline(never)]
fn end<D>(detector: &mut Option<D>, held: &mut Option<Held>, measure: &mut Measure) {
    measure.end(true);
    *held = None;
    *detector = None;
}

impl<B, D> fmt::Debug for ResponseBody<B, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("ResponseBody");
        match &self.kind {
            Kind::Admitted { held, .. } => debug.field("admitted", &true).field("held", held),
            Kind::Overloaded { .. } => debug.field("admitted", &false),
        };
        debug.finish_non_exhaustive()
    }
}
