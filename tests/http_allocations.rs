//! What the admission layer allocates per request (issue 23's HTTP row):
//! the request's [`FirstToken`](tower_admission::http::FirstToken) cell and
//! its two extensions, nothing per frame, nothing to judge the events of
//! an OpenAI stream whose events come whole in their frames, and nothing
//! more to measure the client's view while metrics are recorded.
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

/// A recorder whose handles are atomics: recording allocates nothing, so
/// what a request allocates with it is what the layer and the gate do.
#[cfg(feature = "metrics")]
mod atomic_recorder {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use metrics::{
        Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString,
        Unit,
    };

    /// Samples recorded in the client's view's histograms, by any test.
    pub static CLIENT_SAMPLES: AtomicU64 = AtomicU64::new(0);

    /// Sums what it is given, as bits of an `f64`.
    #[derive(Default)]
    pub struct Samples {
        sum: AtomicU64,
        client: bool,
    }

    impl HistogramFn for Samples {
        fn record(&self, value: f64) {
            let _ = self
                .sum
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |sum| {
                    Some((f64::from_bits(sum) + value).to_bits())
                });
            if self.client {
                CLIENT_SAMPLES.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Not zero-sized: the gate takes a zero-sized recorder for none.
    #[derive(Default)]
    pub struct Atomic {
        _registered: AtomicU64,
    }

    impl Recorder for Atomic {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(Arc::new(AtomicU64::new(0)))
        }

        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(Arc::new(AtomicU64::new(0)))
        }

        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(Arc::new(Samples {
                sum: AtomicU64::new(0),
                client: key.name().contains("_client_"),
            }))
        }
    }
}

#[cfg(feature = "metrics")]
#[test]
fn the_clients_view_allocates_nothing_per_request_or_per_chunk() {
    use std::sync::atomic::Ordering;

    let recorder = atomic_recorder::Atomic::default();
    let mut recorded = metrics::with_local_recorder(&recorder, || {
        let gate = Gate::new(AdmissionConfig::new().metrics_prefix("allocations"));
        AdmissionLayer::new(gate).layer(Chat::new())
    });
    let mut plain = AdmissionLayer::new(Gate::new(AdmissionConfig::new())).layer(Chat::new());
    // Every request is measured (its first token, the gap before the
    // finishing chunk after it, its end; `[DONE]` is no content chunk) and
    // the gate's events are observed: neither allocates once warmed up.
    let before = atomic_recorder::CLIENT_SAMPLES.load(Ordering::Relaxed);
    assert_eq!(
        allocations_per_request(&mut recorded),
        allocations_per_request(&mut plain),
    );
    let samples = atomic_recorder::CLIENT_SAMPLES.load(Ordering::Relaxed) - before;
    assert!(
        samples >= 16 * 3,
        "the 16 requests were measured: {samples} samples"
    );
}
