//! `examples/axum_rate_limits.rs` over real sockets: a per-key quota in front
//! of the gate answers `429` without the gate hearing of the request, and
//! the pacer inside the gate is one for every connection — once the router
//! is built once, as the example does.
#![cfg(feature = "http")]

#[allow(dead_code)] // the example's `main` is not run here
#[path = "../examples/axum_rate_limits.rs"]
mod example;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use example::{RateLimits, routes};
use tokio::net::TcpListener;
use tower_admission::{AdmissionConfig, Counts, Gate, Snapshot};

const PATIENCE: Duration = Duration::from_secs(20);

/// Longer than any test: a pacer or quota of one per `FOREVER` lets exactly
/// one request through.
const FOREVER: Duration = Duration::from_secs(3600);

async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .expect("nothing happened in time")
}

/// Serves `app` on a free loopback port.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

/// A gate of one rank: `engine` requests at once, a queue of `queue`.
fn gate(engine: usize, queue: usize) -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(engine)
            .request_queue_limit(queue),
    )
}

/// A chat completion request with `api_key`, on a connection of its own
/// (each client has its own pool).
async fn chat(address: SocketAddr, api_key: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new().post(format!("http://{address}/v1/chat/completions"));
    if let Some(key) = api_key {
        request = request.header("x-api-key", key);
    }
    request.send().await.unwrap()
}

/// Waits until the gate's snapshot satisfies `settled`.
async fn until(gate: &Gate, settled: impl Fn(&Snapshot) -> bool) {
    within(async {
        while !settled(&gate.snapshot()) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
}

#[tokio::test]
async fn a_request_over_its_quota_gets_429_and_takes_no_gate_capacity() {
    // One engine slot, no queue, and a pacer that lets one request through
    // per hour: the second admitted request waits inside the gate, holding
    // the slot, for as long as the test runs.
    let gate = gate(1, 0);
    let limits = RateLimits {
        paced: 1,
        pace_period: FOREVER,
        quota_burst: 1,
        quota_period: FOREVER,
    };
    let address = serve(routes(gate.clone(), &limits).with_state(())).await;

    // carol's request takes the pacer's one pass and ends.
    let first = within(chat(address, Some("carol"))).await;
    assert_eq!(first.status(), 200);
    assert!(within(first.text()).await.unwrap().contains("[DONE]"));
    // bob's is admitted and waits for the pacer: the gate is full.
    let bob = tokio::spawn(chat(address, Some("bob")));
    until(&gate, |snapshot| snapshot.total == Counts::new(1, 1, 0)).await;

    // alice's first request is within her quota: the gate hears of it and,
    // being full, answers 529.
    let overloaded = within(chat(address, Some("alice"))).await;
    assert_eq!(overloaded.status(), 529);
    let before = gate.snapshot();
    assert_eq!(before.tally.received, 3);
    assert_eq!(before.tally.rejected_worker, 1);

    // Her second is over her quota: the quota answers, the gate never
    // hears of it, and its counts and tallies do not move.
    let limited = within(chat(address, Some("alice"))).await;
    assert_eq!(limited.status(), 429);
    assert!(limited.headers().contains_key("retry-after"));
    let after = gate.snapshot();
    assert_eq!(after.total, before.total, "a 429 takes no capacity");
    assert_eq!(after.tally, before.tally, "a 429 is never received");
    assert_eq!(after.total, Counts::new(1, 1, 0));

    // No key at all: refused before the gate too.
    let anonymous = within(chat(address, None)).await;
    assert_eq!(anonymous.status(), 401);
    assert_eq!(gate.snapshot().tally, before.tally);
    bob.abort();
}

#[tokio::test]
async fn the_pacer_inside_the_gate_is_shared_by_every_connection() {
    let gate = gate(4, 0);
    let limits = RateLimits {
        paced: 1,
        pace_period: FOREVER,
        quota_burst: 100,
        quota_period: Duration::from_millis(1),
    };
    let address = serve(routes(gate.clone(), &limits).with_state(())).await;

    let first = within(chat(address, Some("alice"))).await;
    assert_eq!(first.status(), 200, "the pacer's one pass");
    assert!(within(first.text()).await.unwrap().contains("[DONE]"));

    // A second connection: admitted by the gate, then held by the same
    // pacer, so no response head comes.
    let second = tokio::spawn(chat(address, Some("alice")));
    until(&gate, |snapshot| {
        snapshot.tally.received == 2 && snapshot.total == Counts::new(1, 1, 0)
    })
    .await;
    let held = tokio::time::timeout(Duration::from_millis(500), second).await;
    assert!(
        held.is_err(),
        "the second connection passed the pacer: {held:?}"
    );
    assert_eq!(
        gate.snapshot().total,
        Counts::new(1, 1, 0),
        "admitted, paced"
    );
}

#[tokio::test]
async fn a_router_not_built_once_gives_each_connection_its_own_pacer() {
    // The pitfall the example avoids: without `with_state(())` before
    // `serve`, axum builds the route's layers for each connection, and a
    // pacer of one request per hour lets a request through on every one.
    let gate = gate(4, 0);
    let limits = RateLimits {
        paced: 1,
        pace_period: FOREVER,
        quota_burst: 100,
        quota_period: Duration::from_millis(1),
    };
    let address = serve(routes(gate.clone(), &limits)).await;
    for connection in 0..3 {
        let response = within(chat(address, Some("alice"))).await;
        assert_eq!(response.status(), 200, "connection {connection}");
        assert!(within(response.text()).await.unwrap().contains("[DONE]"));
    }
    assert_eq!(gate.snapshot().tally.admitted_direct, 3);
}
