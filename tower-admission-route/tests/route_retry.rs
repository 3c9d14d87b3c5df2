//! The frontend side in virtual time: how `route::OverloadRetry` spaces,
//! budgets and stops retries, alone and behind the balancer. How a
//! `route::Worker` turns overload answers into readiness is in
//! `route_worker.rs`.
//!
//! Every test runs with paused time and moves it by explicit steps: a
//! retry's time is an instant, not a sleep that is hoped to be long
//! enough. The workers are scripted services answering what the gate
//! answers (the same headers, statuses and gRPC trailers-only form).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Either, Full};
use tokio::time::Instant;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::ServiceList;
use tower::retry::Retry;
use tower::retry::budget::TpsBudget;
use tower::{Service, ServiceExt};
use tower_admission::RejectionScope;
use tower_admission_route::{Deadline, OverloadAnswer, OverloadRetry, Worker};

#[path = "support/scripted.rs"]
mod scripted;
use scripted::*;

// ---------------------------------------------------------------------------
// The retry policy

fn retrying<S>(service: S, policy: OverloadRetry) -> Retry<OverloadRetry, S> {
    Retry::new(policy, service)
}

fn budget(min_per_sec: u32, percent: f32) -> Arc<TpsBudget> {
    Arc::new(TpsBudget::new(
        Duration::from_secs(60),
        min_per_sec,
        percent,
    ))
}

fn gaps(arrivals: &[Instant]) -> Vec<Duration> {
    arrivals.windows(2).map(|pair| pair[1] - pair[0]).collect()
}

#[tokio::test(start_paused = true)]
async fn retries_back_off_exponentially_with_jitter() {
    let mut schedules = Vec::new();
    for _ in 0..8 {
        let upstream = Scripted::always(Answer::WorkerOverloaded(None));
        let policy = OverloadRetry::new(budget(100, 0.1))
            .backoff(Duration::from_millis(100), Duration::from_secs(10))
            .max_retries(3);
        let mut service = retrying(upstream.clone(), policy);
        let answer = service
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap();
        assert_eq!(answer.status(), 529, "the last overload answer is returned");
        let gaps = gaps(&upstream.arrivals());
        assert_eq!(gaps.len(), 3, "three retries, then the limit");
        for (retry, gap) in gaps.iter().enumerate() {
            let base = Duration::from_millis(100 << retry);
            // (+1 ms: the timer fires on millisecond ticks.)
            let most = base * 2 + Duration::from_millis(1);
            assert!(
                *gap >= base && *gap <= most,
                "retry {retry} waited {gap:?}, outside [{base:?}, {most:?}]"
            );
        }
        schedules.push(gaps);
    }
    schedules.dedup();
    assert!(
        schedules.len() > 1,
        "every request waited alike: no jitter ({schedules:?})"
    );
}

/// Sends four requests at once to an upstream that rejects each of them
/// once (worker-scoped), through `policy`; returns when each was retried,
/// counted from the first sends, in order.
async fn retry_times_of_four_rejected_together(policy: OverloadRetry) -> Vec<Duration> {
    let upstream = Scripted::new(&[
        Answer::WorkerOverloaded(None),
        Answer::WorkerOverloaded(None),
        Answer::WorkerOverloaded(None),
        Answer::WorkerOverloaded(None),
        Answer::Ok,
    ]);
    let service = retrying(upstream.clone(), policy);
    let start = Instant::now();
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let mut service = service.clone();
            tokio::spawn(async move { service.ready().await?.call(request()).await })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status(), 200);
    }
    let arrivals = upstream.arrivals();
    assert!(arrivals[..4].iter().all(|&at| at == start));
    let mut retried_at: Vec<Duration> = arrivals[4..].iter().map(|&at| at - start).collect();
    retried_at.sort();
    retried_at
}

#[tokio::test(start_paused = true)]
async fn retries_at_the_maximum_backoff_still_spread() {
    // The base starts at its maximum: every wait is between 100 s and
    // 200 s, drawn to the nanosecond (long, so that the timer's millisecond
    // grain merges two waits once in about 10^4 runs).
    let policy = OverloadRetry::new(budget(100, 0.1))
        .backoff(Duration::from_secs(100), Duration::from_secs(100));
    let mut retried_at = retry_times_of_four_rejected_together(policy).await;
    assert!(
        retried_at
            .iter()
            .all(|&at| (Duration::from_secs(100)..=Duration::from_secs(200)).contains(&at)),
        "{retried_at:?}"
    );
    retried_at.dedup();
    assert_eq!(
        retried_at.len(),
        4,
        "retries at the maximum backoff came back together: {retried_at:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_rejections_do_not_come_back_together() {
    // Long backoffs: the timer's millisecond grain cannot merge them.
    let policy = OverloadRetry::new(budget(100, 0.1))
        .backoff(Duration::from_secs(10), Duration::from_secs(100));
    let mut retried_at = retry_times_of_four_rejected_together(policy).await;
    retried_at.dedup();
    assert!(
        retried_at.len() >= 3,
        "retries of requests rejected together came back together: {retried_at:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn retries_stop_when_the_budget_is_spent() {
    // No reserve, 10%: one retry per ten requests.
    let upstream = Scripted::always(Answer::WorkerOverloaded(None));
    let mut service = retrying(upstream.clone(), OverloadRetry::new(budget(0, 0.1)));
    for _ in 0..100 {
        let answer = service
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap();
        assert_eq!(answer.status(), 529);
    }
    assert_eq!(upstream.received(), 110, "sends for 100 requests");
}

#[tokio::test(start_paused = true)]
async fn retries_stop_at_the_deadline() {
    let upstream = Scripted::always(Answer::WorkerOverloaded(None));
    let policy = OverloadRetry::new(budget(100, 0.1))
        .backoff(Duration::from_millis(100), Duration::from_secs(10))
        .max_retries(10);
    let mut service = retrying(upstream.clone(), policy);
    let start = Instant::now();
    let mut request = request();
    request
        .extensions_mut()
        .insert(Deadline(start + Duration::from_millis(300)));
    let answer = service.ready().await.unwrap().call(request).await.unwrap();
    assert_eq!(answer.status(), 529);
    // The first retry leaves within [100, 200] ms; the second could not
    // before [300, 600] ms: it is not made, and nothing waits for it.
    assert_eq!(upstream.received(), 2);
    assert!(Instant::now() - start <= Duration::from_millis(201));
}

#[tokio::test(start_paused = true)]
async fn a_grpc_timeout_is_a_deadline() {
    let upstream = Scripted::always(Answer::GrpcUnavailable(None));
    let policy = OverloadRetry::new(budget(100, 0.1))
        .backoff(Duration::from_millis(100), Duration::from_secs(10))
        .max_retries(10);
    let mut service = retrying(upstream.clone(), policy);
    let mut request = request();
    request
        .headers_mut()
        .insert("grpc-timeout", "300m".parse().unwrap());
    service.ready().await.unwrap().call(request).await.unwrap();
    assert_eq!(upstream.received(), 2);
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured_when_no_worker_took_the_server_out() {
    let upstream = Scripted::new(&[Answer::WorkerOverloaded(Some("2")), Answer::Ok]);
    let mut service = retrying(upstream.clone(), OverloadRetry::new(budget(100, 0.1)));
    let answer = service
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let gap = gaps(&upstream.arrivals())[0];
    assert!(gap >= Duration::from_secs(2), "retried after {gap:?}");
    assert!(gap <= Duration::from_millis(2050), "retried after {gap:?}");
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_past_the_deadline_is_not_waited_for() {
    let upstream = Scripted::always(Answer::WorkerOverloaded(Some("2")));
    let mut service = retrying(upstream.clone(), OverloadRetry::new(budget(100, 0.1)));
    let start = Instant::now();
    let mut request = request();
    request
        .extensions_mut()
        .insert(Deadline::after(Duration::from_secs(1)));
    let answer = service.ready().await.unwrap().call(request).await.unwrap();
    assert_eq!(answer.status(), 529);
    assert_eq!(upstream.received(), 1);
    assert_eq!(Instant::now(), start, "the answer waited for nothing");
}

#[tokio::test(start_paused = true)]
async fn grpc_pushback_is_honoured_and_a_negative_one_refuses_retries() {
    let upstream = Scripted::new(&[Answer::GrpcUnavailable(Some("700")), Answer::Ok]);
    let mut service = retrying(upstream.clone(), OverloadRetry::new(budget(100, 0.1)));
    let answer = service
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert!(answer.headers().get("grpc-status").is_none());
    assert!(gaps(&upstream.arrivals())[0] >= Duration::from_millis(700));

    let refusing = Scripted::always(Answer::GrpcUnavailable(Some("-1")));
    let mut service = retrying(refusing.clone(), OverloadRetry::new(budget(100, 0.1)));
    service
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap();
    assert_eq!(refusing.received(), 1);
}

#[tokio::test(start_paused = true)]
async fn answers_that_are_not_overload_are_not_retried() {
    let policy = || OverloadRetry::new(budget(100, 0.1));
    for status in [200, 400, 404, 429, 500] {
        let upstream = Scripted::always(Answer::Ok);
        let mut service = retrying(
            tower::util::MapResponse::new(upstream.clone(), move |mut response: Response<Body>| {
                *response.status_mut() = StatusCode::from_u16(status).unwrap();
                response
            }),
            policy(),
        );
        service
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap();
        assert_eq!(upstream.received(), 1, "status {status} was retried");
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_body_cannot_be_replayed_is_sent_once() {
    type Streaming = UnsyncBoxBody<Bytes, Infallible>;
    let upstream = Scripted::always(Answer::WorkerOverloaded(None));
    let either = |request: Request<Either<Body, Streaming>>| request.map(|_| Body::default());
    let mut service = Retry::new(
        OverloadRetry::new(budget(100, 0.1)),
        tower::util::MapRequest::new(upstream.clone(), either),
    );
    let streamed: Request<Either<Body, Streaming>> = Request::new(Either::Right(
        Full::new(Bytes::from_static(b"{}")).boxed_unsync(),
    ));
    service.ready().await.unwrap().call(streamed).await.unwrap();
    assert_eq!(upstream.received(), 1);

    let buffered: Request<Either<Body, Streaming>> =
        Request::new(Either::Left(Full::new(Bytes::from_static(b"{}"))));
    service.ready().await.unwrap().call(buffered).await.unwrap();
    assert_eq!(
        upstream.received(),
        1 + 4,
        "a buffered body is retried (three times)"
    );
}

#[tokio::test(start_paused = true)]
async fn behind_the_balancer_a_retry_goes_to_another_worker_without_waiting_out_retry_after() {
    let busy = Scripted::always(Answer::WorkerOverloaded(Some("1")));
    let calm = Scripted::always(Answer::Ok);
    let balance = Balance::new(ServiceList::new(vec![
        Worker::new(busy.clone()),
        Worker::new(calm.clone()),
    ]));
    let mut frontend = Retry::new(
        OverloadRetry::new(budget(100, 0.1)),
        Buffer::<Request<Body>, _>::new(balance, 16),
    );
    let start = Instant::now();
    for _ in 0..40 {
        let response: Response<_> = frontend
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    // Both idle at first: p2c picks the busy one soon (but for 2^-40), and
    // then not again within its cooldown.
    assert_eq!(
        busy.received(),
        1,
        "the busy worker got {} requests",
        busy.received()
    );
    assert_eq!(calm.received(), 40);
    // One backoff at most (25–50 ms by default), not the Retry-After second.
    assert!(Instant::now() - start <= Duration::from_millis(51));
}

#[test]
fn overload_answers_are_read_from_the_head() {
    let answer = OverloadAnswer::read(&response(Answer::RankOverloaded(2))).unwrap();
    assert_eq!(answer.scope, RejectionScope::Rank(2));
    assert!(OverloadAnswer::read(&response(Answer::Ok)).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_huge_retry_after_is_waited_for_the_cap_only_and_never_panics() {
    for retry_after in ["3600", "9300000000000000000", "999999999999999999", "1e300"] {
        let upstream = Scripted::new(&[Answer::WorkerOverloaded(Some(retry_after)), Answer::Ok]);
        let policy = OverloadRetry::new(budget(100, 0.1))
            .backoff(Duration::from_millis(10), Duration::from_millis(20))
            .max_retry_after(Duration::from_secs(2));
        let mut service = retrying(upstream.clone(), policy);
        let answer = service
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "Retry-After {retry_after}");
        let gaps = gaps(&upstream.arrivals());
        assert_eq!(gaps.len(), 1);
        // At most the cap (plus the backoff's own 10-40 ms), never an hour.
        assert!(
            gaps[0] <= Duration::from_millis(2_050),
            "Retry-After {retry_after}: waited {:?}",
            gaps[0]
        );
    }
    // The default cap is a few seconds.
    assert_eq!(
        tower_admission_route::DEFAULT_MAX_RETRY_AFTER,
        Duration::from_secs(5)
    );
}

#[test]
fn a_deadline_past_what_the_clock_holds_does_not_panic() {
    let far = Deadline::after(Duration::MAX);
    assert!(far.0 > Instant::now() + Duration::from_secs(3600 * 24 * 365));
}

#[tokio::test(start_paused = true)]
async fn an_overload_that_may_follow_work_is_resent_only_for_idempotent_methods() {
    /// Answers `503` marked as `headers` say, counting the sends.
    #[derive(Clone)]
    struct Unavailable(Arc<Mutex<usize>>, &'static [(&'static str, &'static str)]);
    impl Service<Request<Body>> for Unavailable {
        type Response = Response<Body>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Response<Body>, Infallible>>;
        fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Request<Body>) -> Self::Future {
            *self.0.lock().unwrap() += 1;
            let mut response = Response::builder().status(503);
            for (name, value) in self.1 {
                response = response.header(*name, *value);
            }
            let response = response
                .body(Full::new(Bytes::from_static(b"busy")))
                .unwrap();
            std::future::ready(Ok(response))
        }
    }
    let engine: &'static [(&str, &str)] = &[("x-admission-origin", "engine")];
    let plain: &'static [(&str, &str)] = &[];
    let gate: &'static [(&str, &str)] = &[("x-admission-rejection-scope", "worker")];
    for (marks, method, sends) in [
        // The engine's own, through the sidecar: it saw the request.
        (engine, http::Method::POST, 1),
        (engine, http::Method::GET, 4),
        // A plain 503: a handler may have done the work before failing.
        (plain, http::Method::POST, 1),
        (plain, http::Method::PUT, 4),
        // The gate's own: the request never reached the engine.
        (gate, http::Method::POST, 4),
    ] {
        let sent = Arc::new(Mutex::new(0));
        let policy = OverloadRetry::new(budget(100, 0.1)).max_retries(3);
        let mut service = retrying(Unavailable(Arc::clone(&sent), marks), policy);
        let mut request = request();
        *request.method_mut() = method.clone();
        let answer = service.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(answer.status(), 503);
        assert_eq!(*sent.lock().unwrap(), sends, "{method} {marks:?}");
        let read = OverloadAnswer::read(&answer).unwrap();
        assert_eq!(read.from_gate, marks == gate);
        assert_eq!(read.from_engine, marks == engine);
    }
}
