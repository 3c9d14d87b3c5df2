//! An in-process event-stream service whose futures and body frames are
//! all ready at once, and the driver of one request's whole life through
//! a service with a no-op waker: what `benches/http.rs` times and
//! `tests/http_allocations.rs` counts the allocations of. The body is the
//! caller's (a server formatting each event, or static frames).

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::marker::PhantomData;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower::Service;

/// Answers every request at once with a `text/event-stream` body `B`, as
/// `B::default()` starts it.
pub struct Chat<B>(PhantomData<fn() -> B>);

impl<B> Chat<B> {
    pub fn new() -> Self {
        Chat(PhantomData)
    }
}

impl<B> Clone for Chat<B> {
    fn clone(&self) -> Self {
        Chat::new()
    }
}

impl<B: Default> Service<Request<()>> for Chat<B> {
    type Response = Response<B>;
    type Error = Infallible;
    type Future = Ready<Result<Response<B>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<()>) -> Self::Future {
        let mut response = Response::new(B::default());
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/event-stream"),
        );
        ready(Ok(response))
    }
}

/// One request's whole life through `service`: readiness, call, response,
/// every frame. Returns the bytes of data the body sent.
pub fn one_request<S, B>(service: &mut S, request: Request<()>) -> usize
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(Ok(())) = service.poll_ready(&mut cx) else {
        panic!("service not ready")
    };
    let future = pin!(service.call(request));
    let Poll::Ready(Ok(response)) = future.poll(&mut cx) else {
        panic!("no response")
    };
    let mut body = pin!(response.into_body());
    let mut bytes = 0;
    loop {
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => bytes += frame.into_data().map_or(0, |d| d.len()),
            Poll::Ready(None) => return bytes,
            _ => panic!("the body stalled or failed"),
        }
    }
}
