//! What the admission layer costs one streamed request, in process (no
//! sockets): a 20-event OpenAI-style SSE answer driven from `poll_ready` to
//! the end of its body, through
//!
//! * `bare`: the service alone;
//! * `concurrency_limit`: `tower::limit::ConcurrencyLimit` around it;
//! * `admission/auto`: `Admission` with the default detector (`Auto`, which
//!   reads this `text/event-stream` answer with `OpenAiSse`);
//! * `admission/any_data`: `Admission` with the `AnyData` detector.
//!
//! Every future and body here is ready at once, so each iteration is driven
//! by polling with a no-op waker: what is measured is the middleware, not an
//! executor. The service formats each event, as a server would.
//!
//! Run: `cargo bench --bench http`

use std::convert::Infallible;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use criterion::{Criterion, criterion_group};
use http::Request;
use http_body::{Body, Frame, SizeHint};
use tower::Layer;
use tower::limit::ConcurrencyLimit;
use tower_admission::detect::AnyData;
use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};

const EVENTS: usize = 20;

/// An OpenAI chat completion stream: a role chunk, content chunks, a
/// finish chunk, `[DONE]`.
#[derive(Default)]
struct ChatStream {
    sent: usize,
}

impl Body for ChatStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let event = match self.sent {
            EVENTS.. => return Poll::Ready(None),
            0 => r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"}}]}"#.to_owned() + "\n\n",
            n if n == EVENTS - 2 => r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#.to_owned() + "\n\n",
            n if n == EVENTS - 1 => "data: [DONE]\n\n".to_owned(),
            n => format!(
                r#"data: {{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":"token{n}"}}}}]}}"#
            ) + "\n\n",
        };
        self.sent += 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
    }

    fn is_end_stream(&self) -> bool {
        self.sent >= EVENTS
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// The chat service the layers wrap: it formats each event.
type Chat = sse_chat::Chat<ChatStream>;

fn streaming_request(c: &mut Criterion) {
    let mut group = c.benchmark_group("sse_20_events");

    let mut bare = Chat::new();
    group.bench_function("bare", |b| {
        b.iter(|| black_box(one_request(&mut bare, Request::new(()))))
    });

    let mut limited = ConcurrencyLimit::new(Chat::new(), 10_000);
    group.bench_function("concurrency_limit", |b| {
        b.iter(|| black_box(one_request(&mut limited, Request::new(()))))
    });

    let gate = Gate::new(AdmissionConfig::new());
    let mut admission = AdmissionLayer::new(gate.clone()).layer(Chat::new());
    group.bench_function("admission/auto", |b| {
        b.iter(|| black_box(one_request(&mut admission, Request::new(()))))
    });

    let mut admission_any = AdmissionLayer::new(gate.clone())
        .detector(AnyData)
        .layer(Chat::new());
    group.bench_function("admission/any_data", |b| {
        b.iter(|| black_box(one_request(&mut admission_any, Request::new(()))))
    });

    group.finish();
    assert_eq!(gate.snapshot().total, Default::default(), "capacity leaked");
}

/// The same four, interleaved (see `support`), for ratios a noisy machine
/// cannot skew.
fn interleaved() {
    let gate = Gate::new(AdmissionConfig::new());
    let mut bare = Chat::new();
    let mut limited = ConcurrencyLimit::new(Chat::new(), 10_000);
    let mut admission = AdmissionLayer::new(gate.clone()).layer(Chat::new());
    let mut admission_any = AdmissionLayer::new(gate.clone())
        .detector(AnyData)
        .layer(Chat::new());
    support::print_table(
        "one 20-event SSE request",
        &mut [
            ("bare", &mut || {
                black_box(one_request(&mut bare, Request::new(())));
            }),
            ("tower ConcurrencyLimit", &mut || {
                black_box(one_request(&mut limited, Request::new(())));
            }),
            ("Admission, default detector (Auto: OpenAiSse)", &mut || {
                black_box(one_request(&mut admission, Request::new(())));
            }),
            ("Admission, AnyData detector", &mut || {
                black_box(one_request(&mut admission_any, Request::new(())));
            }),
        ],
    );
    assert_eq!(gate.snapshot().total, Default::default(), "capacity leaked");
}

#[path = "support/mod.rs"]
mod support;

#[path = "../tests/support/sse_chat.rs"]
mod sse_chat;

use sse_chat::one_request;

criterion_group!(benches, streaming_request);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    interleaved();
}
