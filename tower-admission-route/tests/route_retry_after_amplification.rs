//! `Retry-After` from the drain rate against the fixed `Retry-After: 1`,
//! side by side in one run: a frontend built as `examples/frontend.rs`
//! builds it (`route::Worker`s under tower's p2c balancer, a `Buffer`,
//! `Retry` with `route::OverloadRetry`) over three workers behind real
//! gates (`AdmissionLayer`, 4 running and 16 queued each, one second of
//! work a request: 12 requests a second in all, four seconds of queue),
//! offered three times that for two virtual minutes by clients that retry
//! every rejection (up to three times, no retry budget) after the answer's
//! `Retry-After`, within a ten-second deadline.
//!
//! - **fixed**: the defaults: `Retry-After: 1`.
//! - **drain rate**: the gates with
//!   `AdmissionConfig::retry_after_from_drain_rate(30 s)`, the frontend's
//!   caps raised to match (`WorkerLayer::max_cooldown(30 s)`,
//!   `OverloadRetry::max_retry_after(30 s)`).
//!
//! Each twice: with the clients themselves waiting out `Retry-After`
//! (the workers' cool-downs off, `WorkerLayer::max_cooldown(0)`: the
//! measured rows), and with the frontend's cool-downs on (a cooling worker
//! leaves the rotation, and a retry goes at once to another worker, or
//! waits in the `Buffer` for one: shown for comparison).
//!
//! Retry amplification is sends to the workers per completed request;
//! goodput is requests completed within the deadline, per second. Virtual
//! time: the figures do not depend on the machine.
//!
//! ```text
//! cargo test --release -p tower-admission-route --test route_retry_after_amplification -- --nocapture
//! ```

#[path = "support/amplification.rs"]
mod amplification;

use std::time::Duration;

use amplification::{DEADLINE, OVERLOAD, RUN, RUNNING, WORK, WORKERS, unlimited_budget};
use tokio::time::Instant;
use tower_admission::{AdmissionConfig, Gate};
use tower_admission_route::{OverloadRetry, WorkerLayer};

const QUEUED: usize = 16;
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
const SEED: u64 = 0x5eed_0024;

#[derive(Debug)]
struct Outcome {
    requests: usize,
    sends: u64,
    ok: usize,
    good: usize,
    overloaded: usize,
}

impl Outcome {
    /// Sends to the workers per completed request.
    fn amplification(&self) -> f64 {
        self.sends as f64 / self.ok.max(1) as f64
    }

    /// Requests completed within the deadline, per second.
    fn goodput(&self) -> f64 {
        self.good as f64 / RUN.as_secs_f64()
    }
}

fn gate(drain_rate: bool) -> Gate {
    let config = AdmissionConfig::new()
        .engine_request_limit(RUNNING)
        .engine_request_waiting_limit(RUNNING)
        .request_queue_limit(QUEUED)
        .clock(|| Instant::now().into_std());
    Gate::new(if drain_rate {
        config.retry_after_from_drain_rate(MAX_RETRY_AFTER)
    } else {
        config
    })
}

/// Offers `OVERLOAD` times the workers' capacity for `RUN`, Poisson
/// arrivals, each request with a `DEADLINE`.
async fn offer(drain_rate: bool, cooldowns: bool) -> Outcome {
    let workers = match (cooldowns, drain_rate) {
        (false, _) => WorkerLayer::new().max_cooldown(Duration::ZERO),
        (true, true) => WorkerLayer::new().max_cooldown(MAX_RETRY_AFTER),
        (true, false) => WorkerLayer::new(),
    };
    // Clients that retry every rejection: no budget to hold them back.
    let policy = OverloadRetry::new(unlimited_budget());
    let policy = if drain_rate {
        policy.max_retry_after(MAX_RETRY_AFTER)
    } else {
        policy
    };
    let offered = amplification::offer(workers, || gate(drain_rate), policy, SEED).await;
    let (mut ok, mut good, mut overloaded) = (0, 0, 0);
    for &answer in &offered.answers {
        match answer {
            (200, took) => {
                ok += 1;
                good += usize::from(took <= DEADLINE);
            }
            (529, _) => overloaded += 1,
            (other, _) => panic!("unexpected status {other}"),
        }
    }
    Outcome {
        requests: offered.answers.len(),
        sends: offered.sends,
        ok,
        good,
        overloaded,
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_from_the_drain_rate_sends_less_for_the_same_goodput() {
    let fixed = offer(false, false).await;
    let drain = offer(true, false).await;
    let fixed_cooling = offer(false, true).await;
    let drain_cooling = offer(true, true).await;

    println!(
        "{WORKERS} workers x {RUNNING} running + {QUEUED} queued, {WORK:?} a request; offered \
         {OVERLOAD}x capacity for {RUN:?} (virtual); clients retry every rejection up to 3 \
         times after Retry-After, within {DEADLINE:?}"
    );
    println!(
        "| Retry-After | client requests | sends to workers | sends per completed request | completed | goodput (req/s within {DEADLINE:?}) | 529 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, outcome) in [
        ("fixed 1 s (default), clients wait it out", &fixed),
        ("drain rate (max 30 s), clients wait it out", &drain),
        ("fixed 1 s (default), frontend cool-downs", &fixed_cooling),
        ("drain rate (max 30 s), frontend cool-downs", &drain_cooling),
    ] {
        println!(
            "| {name} | {} | {} | {:.3} | {} | {:.2} | {} |",
            outcome.requests,
            outcome.sends,
            outcome.amplification(),
            outcome.ok,
            outcome.goodput(),
            outcome.overloaded
        );
    }

    assert!(
        drain.amplification() < fixed.amplification(),
        "drain rate {:.3} sends per completed request, fixed {:.3}",
        drain.amplification(),
        fixed.amplification()
    );
    // The retries' jitter is random (tower's HasherRng, seeded per
    // request), so the drain-rate figure moves from run to run: 0.90-0.97
    // of the fixed one's in 13 runs (2026-12-07; a clean CI run failed a
    // bound of 0.9 at 0.899).
    assert!(
        drain.goodput() >= 0.85 * fixed.goodput(),
        "drain rate {:.2} req/s, fixed {:.2}",
        drain.goodput(),
        fixed.goodput()
    );
}
