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
use std::future::{Future, Ready, ready};
use std::hint::black_box;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use criterion::{Criterion, criterion_group};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tower::limit::ConcurrencyLimit;
use tower::{Layer, Service};
use tower_admission::detect::AnyData;
use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};

const EVENTS: usize = 20;

/// An OpenAI chat completion stream: a role chunk, content chunks, a
/// finish chunk, `[DONE]`.
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

#[derive(Clone)]
struct Chat;

impl Service<Request<()>> for Chat {
    type Response = Response<ChatStream>;
    type Error = Infallible;
    type Future = Ready<Result<Response<ChatStream>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<()>) -> Self::Future {
        let mut response = Response::new(ChatStream { sent: 0 });
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/event-stream"),
        );
        ready(Ok(response))
    }
}

/// One request's whole life: readiness, call, response, every frame.
fn one_request<S, B>(service: &mut S) -> usize
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
    let future = pin!(service.call(Request::new(())));
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

fn streaming_request(c: &mut Criterion) {
    let mut group = c.benchmark_group("sse_20_events");

    let mut bare = Chat;
    group.bench_function("bare", |b| b.iter(|| black_box(one_request(&mut bare))));

    let mut limited = ConcurrencyLimit::new(Chat, 10_000);
    group.bench_function("concurrency_limit", |b| {
        b.iter(|| black_box(one_request(&mut limited)))
    });

    let gate = Gate::new(AdmissionConfig::new());
    let mut admission = AdmissionLayer::new(gate.clone()).layer(Chat);
    group.bench_function("admission/auto", |b| {
        b.iter(|| black_box(one_request(&mut admission)))
    });

    let mut admission_any = AdmissionLayer::new(gate.clone())
        .detector(AnyData)
        .layer(Chat);
    group.bench_function("admission/any_data", |b| {
        b.iter(|| black_box(one_request(&mut admission_any)))
    });

    group.finish();
    assert_eq!(gate.snapshot().total, Default::default(), "capacity leaked");
}

/// The same four, interleaved (see `support`), for ratios a noisy machine
/// cannot skew.
fn interleaved() {
    let gate = Gate::new(AdmissionConfig::new());
    let mut bare = Chat;
    let mut limited = ConcurrencyLimit::new(Chat, 10_000);
    let mut admission = AdmissionLayer::new(gate.clone()).layer(Chat);
    let mut admission_any = AdmissionLayer::new(gate.clone())
        .detector(AnyData)
        .layer(Chat);
    support::print_table(
        "one 20-event SSE request",
        &mut [
            ("bare", &mut || {
                black_box(one_request(&mut bare));
            }),
            ("tower ConcurrencyLimit", &mut || {
                black_box(one_request(&mut limited));
            }),
            ("Admission, default detector (Auto: OpenAiSse)", &mut || {
                black_box(one_request(&mut admission));
            }),
            ("Admission, AnyData detector", &mut || {
                black_box(one_request(&mut admission_any));
            }),
        ],
    );
    assert_eq!(gate.snapshot().total, Default::default(), "capacity leaked");
}

#[path = "support/mod.rs"]
mod support;

criterion_group!(benches, streaming_request);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    interleaved();
}
