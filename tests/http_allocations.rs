//! What the admission layer allocates per request (issue 23's HTTP row):
//! the request's [`FirstToken`](tower_admission::http::FirstToken) cell and
//! its two extensions, nothing per frame, and nothing to judge the events of
//! an OpenAI stream whose events come whole in their frames.
//!
//! Allocations are counted per thread by a counting global allocator, so
//! the tests of this binary may run in parallel.
#![cfg(feature = "http")]

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use tower::{Layer, Service};
use tower_admission::detect::AnyData;
use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};

#[path = "support/alloc.rs"]
mod alloc;
#[path = "support/sse_chat.rs"]
mod sse_chat;
use alloc::{Counting, thread_allocations};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const EVENTS: [&str; 5] = [
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    ": keep-alive\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
];

/// An event stream whose frames are static: it allocates nothing itself.
#[derive(Default)]
struct Events {
    sent: usize,
}

impl Body for Events {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let event = EVENTS.get(self.sent).map(|event| {
            self.sent += 1;
            Ok(Frame::data(Bytes::from_static(event.as_bytes())))
        });
        Poll::Ready(event)
    }

    fn is_end_stream(&self) -> bool {
        self.sent >= EVENTS.len()
    }
}

/// The chat service the layers wrap: its frames are static.
type Chat = sse_chat::Chat<Events>;

/// A request whose extension map exists already, as it does in axum and
/// hyper servers by the time a layer sees it.
#[derive(Clone)]
struct Marker;

/// Allocations of one request's whole life, after the request is built:
/// readiness, call, response, every frame.
fn allocations_of_one_request<S, B>(service: &mut S) -> usize
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let mut request = Request::new(());
    request.extensions_mut().insert(Marker);
    let before = thread_allocations();
    sse_chat::one_request(service, request);
    thread_allocations() - before
}

/// The fewest allocations of a few requests: warmed up, and not counting
/// what a first call sets up once.
fn allocations_per_request<S, B>(service: &mut S) -> usize
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    (0..16)
        .map(|_| allocations_of_one_request(service))
        .min()
        .expect("some requests")
}

#[test]
fn an_admitted_request_allocates_its_cell_and_its_two_extensions() {
    let gate = Gate::new(AdmissionConfig::new());
    let mut any_data = AdmissionLayer::new(gate.clone())
        .detector(AnyData)
        .layer(Chat::new());
    // The `FirstToken` cell, and a box each for the `Admitted` and
    // `FirstToken` extensions; the bare service allocates its response's
    // header map.
    assert_eq!(
        allocations_per_request(&mut any_data) - allocations_per_request(&mut Chat::new()),
        3
    );
}

#[test]
fn judging_events_whole_in_their_frames_allocates_nothing() {
    let gate = Gate::new(AdmissionConfig::new());
    let mut auto = AdmissionLayer::new(gate.clone()).layer(Chat::new());
    let mut any_data = AdmissionLayer::new(gate)
        .detector(AnyData)
        .layer(Chat::new());
    assert_eq!(
        allocations_per_request(&mut auto),
        allocations_per_request(&mut any_data),
        "the default detector (Auto: OpenAiSse) allocates nothing more"
    );
}
