//! The stress run of `tests/stress.rs`, shared with the tests that repeat
//! it under hostile conditions (`tests/observer_panics.rs`): thousands of
//! tasks acquire, cancel at random points, see first tokens and release,
//! all at once, while capacity reports shrink and grow the ranks.

#![allow(dead_code)] // each test binary uses part of it

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_admission::{EngineCapacity, Gate};

use super::gate_support::assert_idle;
use super::panics::quiet_injected_panics;
use super::rng::Rng;

/// Completes after being polled `n` times, yielding in between: a
/// cancellation point that depends on scheduling, not on a clock.
struct AfterPolls(u64);

impl Future for AfterPolls {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 == 0 {
            return Poll::Ready(());
        }
        self.0 -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

async fn yield_times(n: u64) {
    for _ in 0..n {
        tokio::task::yield_now().await;
    }
}

#[derive(Debug, Default)]
struct Outcome {
    admitted: u64,
    rejected: u64,
    abandoned: u64,
}

async fn client(gate: Gate, seed: u64) -> Outcome {
    let mut rng = Rng(seed);
    let mut outcome = Outcome::default();
    for _ in 0..20 {
        let rank = match rng.below(6) {
            0 => None,
            5 => Some(9), // not a rank this worker has
            r => Some((r - 1) as u32),
        };
        let acquire = gate.acquire(rank);
        let permit = if rng.below(4) == 0 {
            // Give up after a random number of polls, maybe while queued.
            tokio::select! {
                result = acquire => result,
                () = AfterPolls(rng.below(8)) => {
                    outcome.abandoned += 1;
                    continue;
                }
            }
        } else {
            acquire.await
        };
        let Ok(mut permit) = permit else {
            outcome.rejected += 1;
            continue;
        };
        outcome.admitted += 1;
        yield_times(rng.below(4)).await;
        match rng.below(4) {
            0 => {} // completes without a token
            1 => {
                permit.first_token();
                permit.first_token();
            }
            _ => {
                permit.first_token();
                yield_times(rng.below(4)).await;
            }
        }
        if rng.below(8) == 0 {
            // A handler that panics while holding its permit.
            let task = tokio::spawn(async move {
                let _held = permit;
                panic!("injected handler panic");
            });
            assert!(task.await.is_err());
        } else {
            drop(permit);
        }
    }
    outcome
}

/// Runs 4,000 clients of 20 requests each through `gate` (which must have
/// had a capacity report of 4 ranks) and checks that the gate ends empty,
/// every request accounted for, nobody left waiting.
pub async fn run_stress(gate: &Gate) {
    quiet_injected_panics("injected");
    let tasks: Vec<_> = (0..4000)
        .map(|seed| tokio::spawn(client(gate.clone(), seed)))
        .collect();
    // Capacity reports arrive meanwhile: ranks shrink and grow back.
    let reporter = {
        let gate = gate.clone();
        tokio::spawn(async move {
            for round in 0..200u64 {
                let ranks = [4, 2, 3, 1][(round % 4) as usize];
                gate.report_capacity(EngineCapacity::new(64, ranks));
                tokio::task::yield_now().await;
            }
            gate.report_capacity(EngineCapacity::new(64, 4));
        })
    };

    // A liveness bound, not a synchronisation: with a lost wake-up some task
    // would wait for ever while capacity is free.
    let all = futures::future::join_all(tasks);
    let results = tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("a task was left waiting while capacity was free");
    reporter.await.unwrap();

    let mut outcome = Outcome::default();
    for result in results {
        let task = result.expect("client task");
        outcome.admitted += task.admitted;
        outcome.rejected += task.rejected;
        outcome.abandoned += task.abandoned;
    }

    let snapshot = gate.snapshot();
    assert_idle(&snapshot);
    let tally = snapshot.tally;
    assert_eq!(tally.received, 4000 * 20);
    assert_eq!(
        tally.received,
        tally.admitted_direct + tally.admitted_queue + tally.rejected() + tally.cancelled
    );
    // An abandoned request was cancelled while queued, or was admitted or
    // rejected on arrival and then dropped unseen.
    assert_eq!(
        outcome.admitted + outcome.rejected + outcome.abandoned,
        tally.received
    );
    assert!(tally.admitted() >= outcome.admitted);
    assert!(tally.rejected() >= outcome.rejected);
    assert_eq!(
        (tally.admitted() - outcome.admitted)
            + (tally.rejected() - outcome.rejected)
            + tally.cancelled,
        outcome.abandoned
    );
    assert!(tally.admitted_queue > 0 && tally.cancelled > 0 && tally.rejected() > 0);
}
