//! [`ResponseBody`]: carries the [`Permit`] of an admitted request until the
//! response stream ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::Permit;
use crate::detect::{AnyData, FirstTokenDetector};

pin_project! {
    /// Response body of [`Admission`](super::Admission).
    ///
    /// For an admitted request it wraps the inner body and holds the
    /// request's [`Permit`]:
    ///
    /// * **waiting** capacity is released when the detector reports the
    ///   first generated token, or when the body completes;
    /// * **request** capacity is released when the body completes, fails, or
    ///   is dropped — whichever comes first, exactly once.
    ///
    /// "Completes" means what it means to hyper: the body reported
    /// [`is_end_stream`](Body::is_end_stream) when the response was produced,
    /// or later yielded `None`, a trailers frame, an error, or a data frame
    /// after which it reports `is_end_stream`. A body dropped before any of
    /// these was cancelled (the client went away); the permit goes with it.
    ///
    /// For a rejected request it is the overload answer's body.
    pub struct ResponseBody<B, D = AnyData> {
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
            // `None` once the response ended.
            held: Option<Held<D>>,
        },
        Overloaded {
            // `None` once yielded.
            body: Option<Bytes>,
        },
    }
}

/// What an admitted response holds while it streams.
struct Held<D> {
    permit: Permit,
    // `Some` until the first token.
    detector: Option<D>,
}

impl<B, D> ResponseBody<B, D> {
    /// Wraps the body of an admitted response. The detector has seen the
    /// response head.
    pub(crate) fn admitted(body: B, permit: Permit, detector: D) -> Self
    where
        B: Body,
    {
        // A body that is already at its end will never be polled by hyper:
        // the response is complete now.
        let held = if body.is_end_stream() {
            None
        } else {
            Some(Held {
                permit,
                detector: Some(detector),
            })
        };
        ResponseBody {
            kind: Kind::Admitted { body, held },
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

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Admitted { mut body, held } => {
                let polled = body.as_mut().poll_frame(cx);
                let Poll::Ready(frame) = &polled else {
                    return polled;
                };
                let ended = match frame {
                    Some(Ok(frame)) => {
                        if let (Some(data), Some(held)) = (frame.data_ref(), held.as_mut()) {
                            held.on_data(data);
                        }
                        frame.is_trailers() || body.is_end_stream()
                    }
                    Some(Err(_)) | None => true,
                };
                if ended {
                    // Dropping the permit releases the request capacity and,
                    // for a response that ends without a token, the waiting
                    // capacity.
                    *held = None;
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

impl<D: FirstTokenDetector> Held<D> {
    fn on_data(&mut self, data: &[u8]) {
        if let Some(detector) = &mut self.detector {
            if detector.on_data(data).is_some() {
                self.detector = None;
                self.permit.first_token();
            }
        }
    }
}

impl<B, D> fmt::Debug for ResponseBody<B, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("ResponseBody");
        match &self.kind {
            Kind::Admitted { held, .. } => debug
                .field("admitted", &true)
                .field("permit", &held.as_ref().map(|held| &held.permit)),
            Kind::Overloaded { .. } => debug.field("admitted", &false),
        };
        debug.finish_non_exhaustive()
    }
}
