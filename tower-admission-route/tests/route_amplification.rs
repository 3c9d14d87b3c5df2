//! Retry amplification under sustained overload: a frontend built as
//! `examples/frontend.rs` builds it (`route::Worker`s under tower's p2c
//! balancer, a `Buffer`, `Retry` with `route::OverloadRetry`) over three
//! workers behind real gates (`AdmissionLayer`, 4 running and 4 queued
//! each, one second of work a request: 12 requests a second in all),
//! offered three times that, 36 a second, for two virtual minutes.
//!
//! With the retry budget, the workers receive at most 1.1 sends per client
//! request; without it (the same policy, an unlimited budget) every
//! rejected request is sent up to four times. Virtual time: the figures do
//! not depend on the machine.
//!
//! ```text
//! cargo test --release -p tower-admission-route --test route_amplification -- --nocapture
//! ```

#[path = "support/amplification.rs"]
mod amplification;

use std::sync::Arc;
use std::time::Duration;

use amplification::{OVERLOAD, RUN, RUNNING, WORK, WORKERS, unlimited_budget};
use tower::retry::budget::TpsBudget;
use tower_admission::{AdmissionConfig, Gate};
use tower_admission_route::{OverloadRetry, WorkerLayer};

const QUEUED: usize = 4;
const SEED: u64 = 0x5eed_0012;

#[derive(Debug)]
struct Outcome {
    requests: usize,
    sends: u64,
    ok: usize,
    overloaded: usize,
}

impl Outcome {
    fn amplification(&self) -> f64 {
        self.sends as f64 / self.requests as f64
    }
}

fn gate() -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(RUNNING)
            .engine_request_waiting_limit(RUNNING)
            .request_queue_limit(QUEUED),
    )
}

/// Offers `OVERLOAD` times the workers' capacity for `RUN`, Poisson
/// arrivals, each request with a ten-second deadline.
async fn offer(policy: OverloadRetry) -> Outcome {
    let offered = amplification::offer(WorkerLayer::new(), gate, policy, SEED).await;
    let (mut ok, mut overloaded) = (0, 0);
    for &(status, _) in &offered.answers {
        match status {
            200 => ok += 1,
            529 => overloaded += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    Outcome {
        requests: offered.answers.len(),
        sends: offered.sends,
        ok,
        overloaded,
    }
}

#[tokio::test(start_paused = true)]
async fn retry_amplification_under_sustained_triple_overload_stays_within_the_budget() {
    let budgeted = offer(OverloadRetry::new(
        Arc::new(OverloadRetry::default_budget()),
    ))
    .await;
    let unlimited = offer(OverloadRetry::new(unlimited_budget())).await;
    let none = offer(OverloadRetry::new(Arc::new(TpsBudget::new(
        Duration::from_secs(10),
        0,
        0.0,
    ))))
    .await;

    println!(
        "{WORKERS} workers x {RUNNING} running + {QUEUED} queued, {WORK:?} a request; offered \
         {OVERLOAD}x capacity for {RUN:?} (virtual)"
    );
    println!("| retries | client requests | sends to workers | sends per request | 200 | 529 |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, outcome) in [
        ("default budget (5% + 1/s)", &budgeted),
        ("unlimited budget (max 3 per request)", &unlimited),
        ("none", &none),
    ] {
        println!(
            "| {name} | {} | {} | {:.3} | {} | {} |",
            outcome.requests,
            outcome.sends,
            outcome.amplification(),
            outcome.ok,
            outcome.overloaded
        );
    }

    assert!(
        budgeted.amplification() <= 1.1,
        "the budget let {:.3} sends per request through",
        budgeted.amplification()
    );
    assert!(budgeted.sends > budgeted.requests as u64, "no retry at all");
    assert_eq!(none.sends, none.requests as u64);
    assert!(
        unlimited.amplification() > 1.5,
        "without a budget the overload should have been amplified: {:.3}",
        unlimited.amplification()
    );
    // Retries do not make the overloaded fleet do more work.
    let served = |outcome: &Outcome| outcome.ok as f64 / RUN.as_secs_f64();
    assert!(served(&budgeted) <= 1.05 * (WORKERS * RUNNING) as f64 / WORK.as_secs_f64() + 1.0);
}
