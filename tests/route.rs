//! The frontend side in virtual time: how a `route::Worker` turns overload
//! answers into readiness (and so into `tower::balance` routing), and how
//! `route::OverloadRetry` spaces, budgets and stops retries.
//!
//! Every test runs with paused time and moves it by explicit steps: a
//! cooldown's end is an instant, not a sleep that is hoped to be long
//! enough. The workers are scripted services answering what the gate
//! answers (the same headers, statuses and gRPC trailers-only form).
#![cfg(feature = "route")]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Either, Full};
use tokio::time::{Instant, advance};
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::ServiceList;
use tower::retry::Retry;
use tower::retry::budget::TpsBudget;
use tower::util::BoxService;
use tower::{BoxError, Service, ServiceExt};
use tower_admission::RejectionScope;
use tower_admission::route::{Deadline, OverloadAnswer, OverloadRetry, Worker};

type Body = Full<Bytes>;

/// What a scripted worker answers to its `n`th request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Ok,
    /// `529`, worker scope, with this `Retry-After` (if any).
    WorkerOverloaded(Option<&'static str>),
    /// `529`, rank scope.
    RankOverloaded(u32),
    /// gRPC trailers-only `UNAVAILABLE` with this pushback (if any).
    GrpcUnavailable(Option<&'static str>),
}

fn response(answer: Answer) -> Response<Body> {
    let builder = Response::builder();
    let builder = match answer {
        Answer::Ok => builder.status(200),
        Answer::WorkerOverloaded(retry_after) => {
            let builder = builder
                .status(529)
                .header("content-type", "application/json")
                .header("x-admission-rejection-scope", "worker");
            match retry_after {
                Some(value) => builder.header("retry-after", value),
                None => builder,
            }
        }
        Answer::RankOverloaded(rank) => builder
            .status(529)
            .header("x-admission-rejection-scope", "rank")
            .header("x-admission-rank", rank),
        Answer::GrpcUnavailable(pushback) => {
            let builder = builder
                .status(200)
                .header("content-type", "application/grpc")
                .header("grpc-status", "14")
                .header("x-admission-rejection-scope", "worker");
            match pushback {
                Some(value) => builder.header("grpc-retry-pushback-ms", value),
                None => builder,
            }
        }
    };
    let body = match answer {
        Answer::Ok => "ok",
        _ => r#"{"error":{"type":"overloaded"}}"#,
    };
    builder.body(Full::new(Bytes::from(body))).unwrap()
}

/// A worker that answers from a script (the last answer repeats) and notes
/// when each request arrived.
#[derive(Clone)]
struct Scripted {
    script: Arc<Mutex<VecDeque<Answer>>>,
    arrivals: Arc<Mutex<Vec<Instant>>>,
}

impl Scripted {
    fn new(script: &[Answer]) -> Scripted {
        Scripted {
            script: Arc::new(Mutex::new(script.iter().copied().collect())),
            arrivals: Arc::default(),
        }
    }

    fn always(answer: Answer) -> Scripted {
        Scripted::new(&[answer])
    }

    fn arrivals(&self) -> Vec<Instant> {
        self.arrivals.lock().unwrap().clone()
    }

    fn received(&self) -> usize {
        self.arrivals.lock().unwrap().len()
    }
}

impl Service<Request<Body>> for Scripted {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        self.arrivals.lock().unwrap().push(Instant::now());
        let mut script = self.script.lock().unwrap();
        let answer = if script.len() > 1 {
            script.pop_front().unwrap()
        } else {
            script[0]
        };
        std::future::ready(Ok(response(answer)))
    }
}

fn request() -> Request<Body> {
    Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"prompt":"Hi"}"#)))
        .unwrap()
}

/// Whether a worker is ready now, polled from a task that records wake-ups.
fn poll_ready<S: Service<Request<Body>>>(
    task: &mut tokio_test::task::Spawn<()>,
    worker: &mut S,
) -> bool
where
    S::Error: std::fmt::Debug,
{
    match task.enter(|cx, _| worker.poll_ready(cx)) {
        Poll::Ready(result) => {
            result.unwrap();
            true
        }
        Poll::Pending => false,
    }
}

/// Sends one request through a ready worker and reads the answer's status.
async fn send<S>(worker: &mut S) -> StatusCode
where
    S: Service<Request<Body>, Response = Response<tower_admission::route::ResponseBody<Body>>>,
    S::Error: std::fmt::Debug,
{
    let response = worker.ready().await.unwrap().call(request()).await.unwrap();
    let status = response.status();
    response.into_body().collect().await.unwrap();
    status
}

// ---------------------------------------------------------------------------
// The worker wrapper

#[tokio::test(start_paused = true)]
async fn a_worker_scoped_rejection_removes_the_worker_for_its_cooldown_and_no_longer() {
    let script = Scripted::new(&[Answer::WorkerOverloaded(Some("1")), Answer::Ok]);
    let mut worker = Worker::new(script.clone());
    let handle = worker.handle();
    let mut task = tokio_test::task::spawn(());

    assert_eq!(send(&mut worker).await, 529);
    assert!(handle.is_cooling());
    assert!(
        !poll_ready(&mut task, &mut worker),
        "ready during its cooldown"
    );

    advance(Duration::from_millis(999)).await;
    assert!(!task.is_woken());
    assert!(
        !poll_ready(&mut task, &mut worker),
        "ready before one second"
    );

    advance(Duration::from_millis(1)).await;
    assert!(
        task.is_woken(),
        "the cooldown's end must wake the waiting task"
    );
    assert!(
        poll_ready(&mut task, &mut worker),
        "not ready after its cooldown"
    );
    assert!(!handle.is_cooling());
    assert_eq!(send(&mut worker).await, 200);
    let stats = handle.stats();
    assert_eq!(
        (stats.requests, stats.worker_rejections, stats.cooldowns),
        (2, 1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_cooldown_lasts_the_retry_after_but_never_more_than_a_second() {
    for (retry_after, cooldown_ms) in [
        (Some("0.25"), 250),
        (Some("5"), 1000),
        (None, 1000),
        (Some("Sun, 06 Nov 2050 08:49:37 GMT"), 1000),
        (Some("soon"), 1000),
    ] {
        let mut worker = Worker::new(Scripted::new(&[
            Answer::WorkerOverloaded(retry_after),
            Answer::Ok,
        ]));
        let mut task = tokio_test::task::spawn(());
        assert_eq!(send(&mut worker).await, 529);
        advance(Duration::from_millis(cooldown_ms - 1)).await;
        assert!(
            !poll_ready(&mut task, &mut worker),
            "Retry-After {retry_after:?}: ready before {cooldown_ms} ms"
        );
        advance(Duration::from_millis(1)).await;
        assert!(task.is_woken());
        assert!(
            poll_ready(&mut task, &mut worker),
            "Retry-After {retry_after:?}: not ready after {cooldown_ms} ms"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_grpc_unavailable_answer_cools_its_worker_for_its_pushback() {
    let mut worker = Worker::new(Scripted::new(&[
        Answer::GrpcUnavailable(Some("300")),
        Answer::Ok,
    ]));
    let mut task = tokio_test::task::spawn(());
    assert_eq!(send(&mut worker).await, 200, "trailers-only: HTTP 200");
    assert!(worker.handle().is_cooling());
    advance(Duration::from_millis(299)).await;
    assert!(!poll_ready(&mut task, &mut worker));
    advance(Duration::from_millis(1)).await;
    assert!(task.is_woken());
    assert!(poll_ready(&mut task, &mut worker));
    assert_eq!(worker.handle().stats().worker_rejections, 1);
}

#[tokio::test(start_paused = true)]
async fn a_503_from_a_server_without_the_gate_cools_its_worker() {
    let plain = tower::util::MapResponse::new(
        Scripted::always(Answer::Ok),
        |mut response: Response<Body>| {
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
        },
    );
    let mut worker = Worker::new(plain);
    let mut task = tokio_test::task::spawn(());
    assert_eq!(send(&mut worker).await, 503);
    advance(Duration::from_millis(999)).await;
    assert!(
        !poll_ready(&mut task, &mut worker),
        "no scope, no Retry-After: one second"
    );
    advance(Duration::from_millis(1)).await;
    assert!(poll_ready(&mut task, &mut worker));
}

#[tokio::test(start_paused = true)]
async fn a_rank_scoped_rejection_keeps_the_worker_and_marks_the_rank_busy() {
    let mut worker = Worker::new(Scripted::new(&[Answer::RankOverloaded(3), Answer::Ok]));
    let handle = worker.handle();
    let mut task = tokio_test::task::spawn(());

    assert_eq!(send(&mut worker).await, 529);
    assert!(
        poll_ready(&mut task, &mut worker),
        "a busy rank removed its worker"
    );
    assert!(!handle.is_cooling());
    assert_eq!(handle.busy_ranks(), vec![3]);
    assert!(handle.is_rank_busy(3));
    assert!(!handle.is_rank_busy(0));

    advance(Duration::from_millis(999)).await;
    assert!(handle.is_rank_busy(3));
    advance(Duration::from_millis(1)).await;
    assert!(handle.busy_ranks().is_empty());
    assert_eq!(send(&mut worker).await, 200);
    let stats = handle.stats();
    assert_eq!((stats.rank_rejections, stats.cooldowns), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_later_success_ends_a_cooldown_early() {
    // Two requests in flight; the first is rejected, the second succeeds
    // 100 ms later (it was admitted from the worker's queue, say).
    let (service, mut upstream) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut worker = Worker::new(service);
    let handle = worker.handle();
    let mut task = tokio_test::task::spawn(());

    assert!(poll_ready(&mut task, &mut worker));
    let rejected = worker.call(request());
    assert!(poll_ready(&mut task, &mut worker));
    let admitted = worker.call(request());
    assert_eq!(handle.in_flight(), 2);

    let (_, respond) = upstream.next_request().await.unwrap();
    respond.send_response(response(Answer::WorkerOverloaded(Some("1"))));
    assert_eq!(rejected.await.unwrap().status(), 529);
    assert!(!poll_ready(&mut task, &mut worker));

    advance(Duration::from_millis(100)).await;
    assert!(!task.is_woken());
    let (_, respond) = upstream.next_request().await.unwrap();
    respond.send_response(response(Answer::Ok));
    let admitted = admitted.await.unwrap();
    assert!(task.is_woken(), "the success must wake the waiting task");
    assert!(
        poll_ready(&mut task, &mut worker),
        "still cooling after a success"
    );
    assert!(!handle.is_cooling());

    // The admitted request is in flight until its body ends.
    assert_eq!(handle.in_flight(), 1);
    admitted.into_body().collect().await.unwrap();
    assert_eq!(handle.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_health_signal_ends_a_cooldown_early() {
    let mut worker = Worker::new(Scripted::new(&[Answer::WorkerOverloaded(Some("1"))]));
    let handle = worker.handle();
    let mut task = tokio_test::task::spawn(());
    assert_eq!(send(&mut worker).await, 529);
    assert!(!poll_ready(&mut task, &mut worker));
    advance(Duration::from_millis(10)).await;
    handle.mark_healthy();
    assert!(task.is_woken());
    assert!(poll_ready(&mut task, &mut worker));
}

#[tokio::test(start_paused = true)]
async fn p2c_routes_around_a_cooling_worker_and_back_after_its_cooldown() {
    let busy = Scripted::new(&[Answer::WorkerOverloaded(Some("1")), Answer::Ok]);
    let calm = Scripted::always(Answer::Ok);
    let workers = vec![Worker::new(busy.clone()), Worker::new(calm.clone())];
    let mut balance = Balance::new(ServiceList::new(workers));

    // Until the busy worker has answered once (p2c picks at random).
    let mut sent = 0;
    while busy.received() == 0 {
        send(&mut balance).await;
        sent += 1;
        assert!(sent < 64, "p2c never picked the busy worker");
    }
    let calm_before = calm.received();
    for _ in 0..40 {
        assert_eq!(send(&mut balance).await, 200);
    }
    advance(Duration::from_millis(999)).await;
    for _ in 0..40 {
        assert_eq!(send(&mut balance).await, 200);
    }
    assert_eq!(busy.received(), 1, "a cooling worker was routed to");
    assert_eq!(calm.received(), calm_before + 80);

    advance(Duration::from_millis(1)).await;
    for _ in 0..40 {
        assert_eq!(send(&mut balance).await, 200);
    }
    // Both idle: p2c picks either at random, so (but for 2^-40) both.
    assert!(busy.received() > 1, "the worker did not come back");
}

#[tokio::test(start_paused = true)]
async fn a_balancer_whose_workers_all_cool_wakes_when_the_first_cooldown_ends() {
    let short = Scripted::new(&[Answer::WorkerOverloaded(Some("0.3")), Answer::Ok]);
    let long = Scripted::new(&[Answer::WorkerOverloaded(Some("1")), Answer::Ok]);
    let mut balance = Balance::new(ServiceList::new(vec![
        Worker::new(short.clone()),
        Worker::new(long.clone()),
    ]));
    while short.received() == 0 || long.received() == 0 {
        assert_eq!(send(&mut balance).await, 529);
    }
    let mut task = tokio_test::task::spawn(());
    assert!(
        !poll_ready(&mut task, &mut balance),
        "ready with every worker cooling"
    );
    advance(Duration::from_millis(299)).await;
    assert!(!task.is_woken());
    advance(Duration::from_millis(1)).await;
    assert!(task.is_woken(), "the balancer's task was not woken");
    assert!(poll_ready(&mut task, &mut balance));
    assert_eq!(
        balance.call(request()).await.unwrap().status(),
        200,
        "routed to the worker still cooling"
    );
    assert_eq!(short.received(), 2);
    assert_eq!(long.received(), 1);
}

#[tokio::test(start_paused = true)]
async fn p2c_keeps_routing_to_a_worker_with_a_busy_rank() {
    let ranked = Scripted::new(&[Answer::RankOverloaded(1), Answer::Ok]);
    let other = Scripted::always(Answer::Ok);
    let workers = vec![Worker::new(ranked.clone()), Worker::new(other.clone())];
    let mut balance = Balance::new(ServiceList::new(workers));
    let mut sent = 0;
    while ranked.received() == 0 {
        send(&mut balance).await;
        sent += 1;
        assert!(sent < 64);
    }
    for _ in 0..40 {
        assert_eq!(send(&mut balance).await, 200);
    }
    assert!(
        ranked.received() > 1,
        "a rank-scoped rejection removed its worker"
    );
}

#[tokio::test(start_paused = true)]
async fn p2c_prefers_the_worker_with_fewer_requests_in_flight() {
    type Boxed = BoxService<Request<Body>, Response<Body>, BoxError>;
    let (held, _upstream) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let idle = Scripted::always(Answer::Ok);
    let loaded = Worker::new(Boxed::new(held));
    let loaded_handle = loaded.handle();
    let workers = vec![
        loaded,
        Worker::new(Boxed::new(
            idle.clone()
                .map_err(|never: Infallible| -> BoxError { match never {} }),
        )),
    ];
    let mut balance = Balance::new(ServiceList::new(workers));
    // Until one request is held in flight by the mock worker.
    let mut held_in_flight = None;
    for _ in 0..64 {
        let future = balance.ready().await.unwrap().call(request());
        if loaded_handle.in_flight() == 1 {
            held_in_flight = Some(future);
            break;
        }
        future.await.unwrap();
    }
    assert!(held_in_flight.is_some(), "p2c never picked the mock worker");
    let before = idle.received();
    for _ in 0..20 {
        assert_eq!(send(&mut balance).await, 200);
    }
    assert_eq!(
        idle.received(),
        before + 20,
        "p2c sent to the busier worker"
    );
}

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
        tower_admission::route::DEFAULT_MAX_RETRY_AFTER,
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
