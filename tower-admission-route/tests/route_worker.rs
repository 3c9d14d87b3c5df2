//! The frontend side in virtual time: how a `route::Worker` turns overload
//! answers into readiness (and so into `tower::balance` routing). The retry
//! policy is in `route_retry.rs`.
//!
//! Every test runs with paused time and moves it by explicit steps: a
//! cooldown's end is an instant, not a sleep that is hoped to be long
//! enough. The workers are scripted services answering what the gate
//! answers (the same headers, statuses and gRPC trailers-only form).

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::time::advance;
use tower::balance::p2c::Balance;
use tower::discover::ServiceList;
use tower::util::BoxService;
use tower::{BoxError, Service, ServiceExt};
use tower_admission_route::Worker;

#[path = "support/scripted.rs"]
mod scripted;
use scripted::*;

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
