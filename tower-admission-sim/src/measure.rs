//! What the simulated experiments share ([`sweep`](super::sweep) and
//! [`qos`](super::qos)): the latency objectives of a good request, a
//! percentile over censored samples, asking the gate on the simulator's
//! clock, the ledger a run records its requests in, and running the runs
//! on a few threads.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::engine::Request;
use super::time;
use tower_admission::{Cost, Descriptor, Gate, Permit};

/// Latency objectives of a good request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slo {
    /// Time to first token, from the first send.
    pub ttft: Duration,
    /// Time per output token: the mean gap between tokens after the first.
    pub tpot: Duration,
}

impl Default for Slo {
    /// TTFT ≤ 10 s, TPOT ≤ 100 ms (see the [sweep's docs](super::sweep)).
    fn default() -> Self {
        Slo {
            ttft: Duration::from_secs(10),
            tpot: Duration::from_millis(100),
        }
    }
}

/// A latency percentile. When some requests had not had their first token
/// when the run ended, their latency is only known to be at least the time
/// they had waited; a percentile that depends on such a lower bound is
/// itself a lower bound, marked `at_least`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Percentile {
    /// The value (a lower bound if `at_least`).
    pub value: Duration,
    /// Whether the true value may be larger.
    pub at_least: bool,
}

impl Percentile {
    /// The `quantile` (0..=1, nearest rank) of `samples`, each a value and
    /// whether it is only a lower bound. `None` without samples.
    pub(crate) fn of(samples: &mut [(Duration, bool)], quantile: f64) -> Option<Percentile> {
        if samples.is_empty() {
            return None;
        }
        samples.sort();
        let rank = ((quantile * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
        let below = &samples[..rank];
        Some(Percentile {
            value: below[rank - 1].0,
            at_least: below.iter().any(|&(_, censored)| censored),
        })
    }
}

impl fmt::Display for Percentile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = if self.at_least { ">" } else { "" };
        let seconds = self.value.as_secs_f64();
        let text = if seconds < 1.0 {
            format!("{prefix}{:.0} ms", seconds * 1e3)
        } else {
            format!("{prefix}{seconds:.1} s")
        };
        f.pad(&text)
    }
}

/// What the gate is told of `request`: its rank, and its cost (prompt
/// tokens and, as `max_tokens`, its output length).
pub(crate) fn descriptor_of(request: Request) -> Descriptor {
    Descriptor::new()
        .with_rank(request.rank)
        .with_cost(Cost::new(
            request.prompt_tokens,
            Some(request.output_tokens),
        ))
}

/// Asks the gate to admit `descriptor`. When the request is queued with a
/// wait budget, a timer on the simulator's clock expires it, as a server
/// does with its own timer: the gate keeps none.
pub(crate) async fn acquire(
    gate: &Gate,
    descriptor: Descriptor,
) -> Result<Permit, tower_admission::Overloaded> {
    let mut acquire = gate.acquire_with(descriptor);
    let Some(expires_at) = acquire.expires_at() else {
        return acquire.await;
    };
    match time::timeout_at(Instant::from_std(expires_at), &mut acquire).await {
        Some(outcome) => outcome,
        None => {
            // Rejected for its deadline, unless an admission was offered
            // meanwhile: the Acquire tells which.
            acquire.expire();
            acquire.await
        }
    }
}

/// What a run records of the requests it measures, a record each, shared
/// by its arrivals, its clients and the run itself, which ends once
/// recording is over and every record is resolved (its request's fate is
/// settled for the measure).
pub(crate) struct Ledger<R> {
    lines: Arc<Mutex<Lines<R>>>,
    /// Wakes the run when the last open record is resolved.
    settled: Arc<Notify>,
}

struct Lines<R> {
    records: Vec<R>,
    /// Whether each record is resolved.
    resolved: Vec<bool>,
    /// Records not yet resolved.
    open: usize,
    /// Whether recording is over.
    closed: bool,
}

impl<R> Ledger<R> {
    pub(crate) fn new() -> Self {
        Ledger {
            lines: Arc::new(Mutex::new(Lines {
                records: Vec::new(),
                resolved: Vec::new(),
                open: 0,
                closed: false,
            })),
            settled: Arc::new(Notify::new()),
        }
    }

    /// Records a request: `record` is its line, the entry its client's
    /// handle on it.
    pub(crate) fn record(&self, record: R) -> Entry<R> {
        let mut lines = lock(&self.lines);
        lines.records.push(record);
        lines.resolved.push(false);
        lines.open += 1;
        Entry {
            ledger: self.clone(),
            index: lines.records.len() - 1,
        }
    }

    /// Recording is over: no request is recorded after this.
    pub(crate) fn close(&self) {
        let mut lines = lock(&self.lines);
        if !lines.closed {
            lines.closed = true;
            if lines.open == 0 {
                self.settled.notify_one();
            }
        }
    }

    /// Waits until recording is over and every record is resolved.
    pub(crate) async fn settled(&self) {
        loop {
            {
                let lines = lock(&self.lines);
                if lines.closed && lines.open == 0 {
                    return;
                }
            }
            self.settled.notified().await;
        }
    }

    /// Takes the records out, in the order they were recorded; an entry
    /// must not be used after.
    pub(crate) fn take_records(&self) -> Vec<R> {
        std::mem::take(&mut lock(&self.lines).records)
    }
}

impl<R> Clone for Ledger<R> {
    fn clone(&self) -> Self {
        Ledger {
            lines: Arc::clone(&self.lines),
            settled: Arc::clone(&self.settled),
        }
    }
}

/// A client's handle on its request's record in a [`Ledger`].
pub(crate) struct Entry<R> {
    ledger: Ledger<R>,
    index: usize,
}

impl<R> Entry<R> {
    pub(crate) fn update(&self, f: impl FnOnce(&mut R)) {
        f(&mut lock(&self.ledger.lines).records[self.index]);
    }

    /// The request's fate is settled for the measure: the run need not
    /// wait for it any longer. Once is enough; again does nothing.
    pub(crate) fn resolve(&self) {
        let mut lines = lock(&self.ledger.lines);
        if !std::mem::replace(&mut lines.resolved[self.index], true) {
            lines.open -= 1;
            if lines.open == 0 && lines.closed {
                self.ledger.settled.notify_one();
            }
        }
    }
}

/// `run` on every job, `threads` jobs at a time (at least one), each on a
/// thread of its own taking the next job not yet taken; the results in the
/// order of the jobs.
pub(crate) fn in_parallel<J: Sync, R: Send>(
    jobs: &[J],
    threads: usize,
    run: impl Fn(&J) -> R + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let results = Mutex::new((0..jobs.len()).map(|_| None).collect::<Vec<Option<R>>>());
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(index) else {
                        break;
                    };
                    let result = run(job);
                    lock(&results)[index] = Some(result);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner)
        .into_iter()
        .map(|result| result.expect("every job ran"))
        .collect()
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while these locks are held.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_percentile_over_censored_samples_is_a_lower_bound() {
        let ms = Duration::from_millis;
        let mut samples = vec![(ms(10), false), (ms(20), false), (ms(15), true)];
        assert_eq!(
            Percentile::of(&mut samples, 0.3),
            Some(Percentile {
                value: ms(10),
                at_least: false
            })
        );
        let median = Percentile::of(&mut samples, 0.5).unwrap();
        assert_eq!((median.value, median.at_least), (ms(15), true));
        assert_eq!(median.to_string(), ">15 ms");
        assert_eq!(Percentile::of(&mut [], 0.5), None);
    }
}
