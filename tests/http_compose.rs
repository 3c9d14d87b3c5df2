//! Admission in a `ServiceBuilder` stack with tower's timeout, rate limit,
//! concurrency limit and load shedding: where each goes, and why (see the
//! `tower_admission::http` module docs). The clock is paused, so time passes
//! only when every task is idle or the test advances it.
#![cfg(feature = "http")]

use std::future::poll_fn;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody, combinators::UnsyncBoxBody};
use tokio::sync::mpsc;
use tokio::time::{Instant, advance};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_test::{assert_pending, assert_ready, assert_ready_ok, task};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_admission::{AdmissionLayer, Gate};

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::counts;

type Body = UnsyncBoxBody<Bytes, BoxError>;
type Frames = mpsc::UnboundedSender<Result<Frame<Bytes>, BoxError>>;

/// An engine that answers at once with a stream the test holds: the
/// response ends when the test drops the stream's sender.
fn engine() -> (
    impl Service<Request<()>, Response = Response<Body>, Error = BoxError, Future: Send> + Clone,
    mpsc::UnboundedReceiver<Frames>,
) {
    let (streams_tx, streams) = mpsc::unbounded_channel();
    let service = tower::service_fn(move |_: Request<()>| {
        let (frames, rx) = mpsc::unbounded_channel();
        let _ = streams_tx.send(frames);
        let body = StreamBody::new(UnboundedReceiverStream::new(rx)).boxed_unsync();
        async move { Ok::<_, BoxError>(Response::new(body)) }
    });
    (service, streams)
}

fn gate(engine: usize, queue: usize) -> Gate {
    gate_support::gate(engine, engine, queue)
}

#[tokio::test(start_paused = true)]
async fn a_timeout_outside_admission_bounds_the_queue_wait_and_cancels() {
    let gate = gate(1, 1);
    let (engine, mut streams) = engine();
    let mut stack = ServiceBuilder::new()
        .timeout(Duration::from_secs(1))
        .layer(AdmissionLayer::new(gate.clone()))
        .service(engine);

    let first = stack
        .ready()
        .await
        .unwrap()
        .call(Request::new(()))
        .await
        .unwrap();
    let stream = streams.recv().await.unwrap();

    let queued_at = Instant::now();
    let err = stack
        .ready()
        .await
        .unwrap()
        .call(Request::new(()))
        .await
        .unwrap_err();
    assert!(err.is::<tower::timeout::error::Elapsed>(), "{err}");
    assert_eq!(queued_at.elapsed(), Duration::from_secs(1));
    // The timeout dropped the queued request: cancelled, its place freed.
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    assert_eq!(gate.snapshot().tally.cancelled, 1);

    // The timeout bounds the response head, not the stream: the first
    // answer is still running after it.
    advance(Duration::from_secs(60)).await;
    stream
        .send(Ok(Frame::data(Bytes::from_static(b"token"))))
        .unwrap();
    let mut body = first.into_body();
    assert!(body.frame().await.unwrap().unwrap().is_data());
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));
    drop(stream);
    assert!(body.frame().await.is_none());
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_timeout_inside_admission_leaves_the_queue_wait_unbounded() {
    let gate = gate(1, 1);
    let (engine, mut streams) = engine();
    let mut stack = ServiceBuilder::new()
        .layer(AdmissionLayer::new(gate.clone()))
        .timeout(Duration::from_secs(1))
        .service(engine);

    let first = stack
        .ready()
        .await
        .unwrap()
        .call(Request::new(()))
        .await
        .unwrap();
    let stream = streams.recv().await.unwrap();
    let mut second = task::spawn(stack.ready().await.unwrap().call(Request::new(())));
    assert_pending!(second.poll());

    advance(Duration::from_secs(3600)).await;
    assert_pending!(second.poll());
    assert_eq!(gate.snapshot().total, counts(1, 1, 1));

    // The first answer ends; the second is admitted and only now meets the
    // timeout, which the engine beats.
    drop(stream);
    drop(first);
    assert!(second.is_woken());
    let response = assert_ready_ok!(second.poll());
    assert_eq!(gate.snapshot().tally.admitted_queue, 1);
    drop(response);
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_behind_a_buffer_paces_admitted_requests_while_the_gate_answers_at_once() {
    // `RateLimit` is not `Clone`, and its pushback in `poll_ready` would
    // stall every request, even those the gate rejects at once. Behind a
    // `Buffer` the gate decides at call time and admitted requests wait
    // for the limiter.
    let gate = gate(2, 0);
    let (engine, _streams) = engine();
    let mut stack = ServiceBuilder::new()
        .layer(AdmissionLayer::new(gate.clone()))
        .buffer(8)
        .rate_limit(1, Duration::from_secs(1))
        .service(engine);

    let _first = stack
        .ready()
        .await
        .unwrap()
        .call(Request::new(()))
        .await
        .unwrap();
    let started = Instant::now();
    let mut second = task::spawn(stack.ready().await.unwrap().call(Request::new(())));
    assert_pending!(second.poll());
    assert_eq!(gate.snapshot().total, counts(2, 2, 0));

    let third = stack
        .ready()
        .await
        .unwrap()
        .call(Request::new(()))
        .await
        .unwrap();
    assert_eq!(third.status().as_u16(), 529);
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "rejected without waiting"
    );

    let _second = second.await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_concurrency_limit_outside_admission_queues_where_the_gate_cannot_see() {
    // The gate has room for two and a queue of ten; the limit allows one.
    let gate = gate(2, 10);
    let (engine, _streams) = engine();
    let mut stack = ServiceBuilder::new()
        .concurrency_limit(1)
        .layer(AdmissionLayer::new(gate.clone()))
        .service(engine);

    let first = stack.ready().await.unwrap().call(Request::new(()));
    let mut ready = task::spawn(poll_fn(|cx| stack.poll_ready(cx)));
    assert_pending!(ready.poll());
    assert_eq!(gate.snapshot().tally.received, 1);
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));

    // The limit counts requests until their response head; the gate counts
    // them until their stream ends.
    let response = first.await.unwrap();
    assert!(ready.is_woken());
    assert_ready_ok!(ready.poll());
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    drop(response);
    assert_eq!(gate.snapshot().total, counts(0, 0, 0));
}

#[tokio::test]
async fn load_shedding_outside_admission_leaves_overloads_to_the_gate() {
    let gate = gate(1, 0);
    let (engine, _streams) = engine();
    let mut stack = ServiceBuilder::new()
        .load_shed()
        .layer(AdmissionLayer::new(gate.clone()))
        .service(engine);

    let _first = stack
        .ready()
        .await
        .unwrap()
        .call(Request::new(()))
        .await
        .unwrap();
    // Admission is always ready, so nothing is shed; the gate answers the
    // overload as a response a client understands, not as an error.
    let mut ready = task::spawn(poll_fn(|cx| stack.poll_ready(cx)));
    assert_ready!(ready.poll()).unwrap();
    drop(ready);
    let response = stack.call(Request::new(())).await.unwrap();
    assert_eq!(response.status().as_u16(), 529);
    assert_eq!(response.headers()["x-admission-rejection-scope"], "worker");
}

#[tokio::test]
async fn a_buffer_inside_admission_holds_no_reservation_for_queued_requests() {
    // The gate admits one and queues ten; the buffer inside has two slots.
    // Were the buffer's readiness held by queued requests, the fourth call
    // would stall in `poll_ready`, unseen by the gate.
    let gate = gate(1, 10);
    let (engine, _streams) = engine();
    let mut stack = ServiceBuilder::new()
        .layer(AdmissionLayer::new(gate.clone()))
        .buffer(2)
        .service(engine);

    let mut calls = Vec::new();
    for n in 0..12 {
        let mut ready = task::spawn(poll_fn(|cx| stack.poll_ready(cx)));
        assert!(ready.poll().is_ready(), "call {n} stalled in poll_ready");
        drop(ready);
        let mut call = task::spawn(stack.call(Request::new(())));
        let polled = call.poll();
        calls.push((call, polled));
    }
    assert_eq!(gate.snapshot().total, counts(1, 1, 10));
    let answered: Vec<u16> = calls
        .iter()
        .filter_map(|(_, polled)| match polled {
            std::task::Poll::Ready(Ok(response)) => Some(response.status().as_u16()),
            _ => None,
        })
        .collect();
    assert_eq!(answered, [529], "one answered at once, with an overload");
    assert!(calls[11].1.is_ready(), "the twelfth is the one rejected");
    let tally = gate.snapshot().tally;
    assert_eq!((tally.received, tally.rejected_worker), (12, 1));

    // The admitted request reaches the engine through the buffer; when it
    // ends, the oldest queued one follows.
    let (first, _) = calls.remove(0);
    let response = first.await.unwrap();
    drop(response);
    assert_eq!(gate.snapshot().total, counts(1, 1, 9));
    let (second, _) = calls.remove(0);
    let _second = second.await.unwrap();
}
