//! Sizing the engine request waiting limit with Little's law, and the
//! engine waiting token limit from a time-to-first-token objective
//! ([`token_budget`]).
//!
//! For the engine's waiting stage — from admission to the first generated
//! token or completion — Little's law says `L = C × W`: the mean number of
//! waiting requests `L` is the admission rate `C` (requests per second)
//! times the mean time `W` a request waits. Measured on a warmed-up worker
//! at the highest steady load that still meets the latency objective,
//! `ceil(C × W)` (equivalently, the measured `L` rounded up) is the initial
//! candidate for the engine request waiting limit of one rank.
//!
//! ```
//! use std::time::Duration;
//! use tower_admission::sizing::Estimate;
//!
//! // 50 requests/second, each waiting 0.24 s on average: 12 wait at a time.
//! let estimate = Estimate::from_rate_and_wait(50.0, Duration::from_millis(240));
//! assert_eq!(estimate.waiting_limit(), 12);
//! ```
//!
//! A [`Sampler`] computes the estimate from a live [`Gate`](crate::Gate):
//! feed it [`Gate::snapshot`](crate::Gate::snapshot)s at a steady interval
//! (it integrates the waiting count over time for `L` and takes the
//! admissions between the first and the last snapshot for `C`), then ask
//! for the [`estimate`](Sampler::estimate). It refuses — with an
//! [`EstimateError`] saying why — when the window does not measure the
//! engine alone: the gate queued or rejected requests (the limits, not the
//! engine, shaped the traffic), the capacity changed, the rank was not
//! recognised, or there were too few admissions for a meaningful mean.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! use std::time::Duration;
//! use tokio::time::{Instant, interval_at, sleep};
//! use tower_admission::sizing::Sampler;
//! use tower_admission::{AdmissionConfig, EngineCapacity, Gate};
//!
//! let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(256, 1)));
//!
//! // Simulated load: 50 requests/second on rank 0, each waiting 240 ms
//! // for its first token and streaming for 500 ms more.
//! let load = gate.clone();
//! tokio::spawn(async move {
//!     let mut arrivals = tokio::time::interval(Duration::from_millis(20));
//!     loop {
//!         arrivals.tick().await;
//!         let mut permit = load.acquire(Some(0)).await.expect("room");
//!         tokio::spawn(async move {
//!             sleep(Duration::from_millis(240)).await;
//!             permit.first_token();
//!             sleep(Duration::from_millis(500)).await;
//!         });
//!     }
//! });
//!
//! // After a warm-up of one second, sample every 100 ms for ten seconds.
//! let mut sampler = Sampler::rank(0);
//! let start = Instant::now() + Duration::from_millis(1_010);
//! let mut every = interval_at(start, Duration::from_millis(100));
//! for _ in 0..=100 {
//!     every.tick().await;
//!     sampler.record(&gate.snapshot(), Instant::now().into_std());
//! }
//!
//! let estimate = sampler.estimate().expect("a steady window without queueing");
//! assert_eq!(estimate.admission_rate(), 50.0);
//! assert_eq!(estimate.mean_waiting(), 12.0);
//! assert_eq!(estimate.mean_wait(), Duration::from_millis(240));
//! assert_eq!(estimate.waiting_limit(), 12);
//! # }
//! ```
//!
//! The estimate is a mean, not a percentile: validate the candidate under
//! representative load and bursts, watching goodput and latency
//! percentiles. `W` here includes engine queueing and prefill after
//! admission but not the gate's queue, so it is not the frontend's
//! time to first token.

use std::error::Error;
use std::fmt;
use std::time::{Duration, Instant};

use crate::config::EngineCapacity;
use crate::gate::{Snapshot, Tally};

/// Products within this relative distance of an integer are that integer:
/// `C × W` of round-looking measurements carries binary rounding error
/// (`50.0 * 0.28` is `14.000000000000002`), which must not add a slot.
const ROUNDING_TOLERANCE: f64 = 1e-9;

/// Little's law for the engine waiting stage of one rank: `L = C × W`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    mean_waiting: f64,
    admission_rate: f64,
}

impl Estimate {
    /// From the admission rate `C` (requests per second) and the mean
    /// waiting time `W`.
    ///
    /// # Panics
    ///
    /// If `admission_rate` is not a positive finite number.
    pub fn from_rate_and_wait(admission_rate: f64, mean_wait: Duration) -> Estimate {
        assert_positive_rate(admission_rate);
        Estimate {
            mean_waiting: admission_rate * mean_wait.as_secs_f64(),
            admission_rate,
        }
    }

    /// From the time-averaged waiting count `L` and the admission rate `C`
    /// (requests per second), as measured from metrics: `L` is the time
    /// average of `engine_request_waiting_count`, `C` the rate of
    /// `request_admit_total` summed over both sources, for one rank.
    ///
    /// # Panics
    ///
    /// If `mean_waiting` is negative or not finite, or `admission_rate` is
    /// not a positive finite number.
    pub fn from_occupancy_and_rate(mean_waiting: f64, admission_rate: f64) -> Estimate {
        assert!(
            mean_waiting.is_finite() && mean_waiting >= 0.0,
            "mean waiting count must be a non-negative finite number, not {mean_waiting}"
        );
        assert_positive_rate(admission_rate);
        Estimate {
            mean_waiting,
            admission_rate,
        }
    }

    /// `L`: the mean number of admitted requests waiting for their first
    /// token or completion.
    pub fn mean_waiting(&self) -> f64 {
        self.mean_waiting
    }

    /// `C`: admissions per second, from both sources.
    pub fn admission_rate(&self) -> f64 {
        self.admission_rate
    }

    /// `W = L / C`: the mean time from admission to first token or
    /// completion (saturating at [`Duration::MAX`]).
    pub fn mean_wait(&self) -> Duration {
        Duration::try_from_secs_f64(self.mean_waiting / self.admission_rate)
            .unwrap_or(Duration::MAX)
    }

    /// The candidate engine request waiting limit: `ceil(C × W)`, that is
    /// `L` rounded up, and at least 1. A product within a relative 1e-9 of
    /// an integer counts as that integer, so that 50 req/s × 0.28 s gives
    /// 14, not 15 (the product in `f64` is `14.000000000000002`).
    pub fn waiting_limit(&self) -> usize {
        let nearest = self.mean_waiting.round();
        let limit = if (self.mean_waiting - nearest).abs() <= ROUNDING_TOLERANCE * nearest.max(1.0)
        {
            nearest
        } else {
            self.mean_waiting.ceil()
        };
        // `as` saturates; a limit of 0 would admit nothing.
        (limit as usize).max(1)
    }
}

/// The candidate engine waiting token limit of one rank: the prompt tokens
/// the engine can prefill within the time-to-first-token objective,
/// `objective × prefill tokens per second`, rounded down (and at least 1).
///
/// Prompts admitted beyond this budget would wait behind the ones already
/// prefilling and miss the objective, however few requests they are: the
/// article's 6,000 tokens/s × 0.3 s gives about 1,800 tokens.
///
/// ```
/// use std::time::Duration;
/// use tower_admission::sizing::token_budget;
///
/// assert_eq!(token_budget(Duration::from_millis(300), 6_000.0), 1_800);
/// ```
///
/// Like [`Estimate::waiting_limit`] this rests on a mean: the prefill rate
/// measured at steady load. It does not bound the time to first token of a
/// request that arrives behind a burst, nor of one whose prompt alone is
/// larger than the budget (it is admitted alone, and takes as long as it
/// takes); validate the candidate under representative load and watch the
/// latency percentiles.
///
/// # Panics
///
/// If `prefill_tokens_per_second` is not a positive finite number.
pub fn token_budget(ttft_objective: Duration, prefill_tokens_per_second: f64) -> usize {
    assert!(
        prefill_tokens_per_second.is_finite() && prefill_tokens_per_second > 0.0,
        "prefill rate must be a positive finite number of tokens per second, not {prefill_tokens_per_second}"
    );
    let tokens = ttft_objective.as_secs_f64() * prefill_tokens_per_second;
    // Within a relative 1e-9 of an integer counts as that integer.
    let nearest = tokens.round();
    let tokens = if (tokens - nearest).abs() <= ROUNDING_TOLERANCE * nearest.max(1.0) {
        nearest
    } else {
        tokens.floor()
    };
    (tokens as usize).max(1)
}

fn assert_positive_rate(admission_rate: f64) {
    assert!(
        admission_rate.is_finite() && admission_rate > 0.0,
        "admission rate must be a positive finite number, not {admission_rate}"
    );
}

/// Why a [`Sampler`] gives no estimate.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EstimateError {
    /// Fewer than two snapshots, or no time between the first and the last.
    TooFewSamples {
        /// Snapshots recorded.
        samples: usize,
    },
    /// The sampled rank was not a recognised rank of the gate in some
    /// snapshot.
    RankNotRecognised {
        /// The sampled rank.
        rank: u32,
    },
    /// The engine reported a different capacity during the window.
    CapacityChanged {
        /// The capacity at the first snapshot.
        from: Option<EngineCapacity>,
        /// The capacity it changed to.
        to: Option<EngineCapacity>,
    },
    /// The whole worker was sampled, but it has several ranks.
    MultipleRanks {
        /// The number of ranks.
        ranks: usize,
    },
    /// Requests waited in the gate's queue during the window.
    Queueing {
        /// The most requests seen queued in one snapshot.
        peak_queued: usize,
        /// Requests admitted from the queue.
        admitted_from_queue: u64,
        /// Requests cancelled while queued.
        cancelled_in_queue: u64,
    },
    /// The gate rejected requests during the window.
    Rejections {
        /// Requests rejected.
        rejected: u64,
    },
    /// Too few admissions for a meaningful mean.
    TooFewAdmissions {
        /// Requests admitted during the window.
        admitted: u64,
        /// The least the sampler accepts.
        required: u64,
    },
}

impl fmt::Display for EstimateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EstimateError::TooFewSamples { samples } => write!(
                f,
                "the window is empty ({samples} snapshot(s)): record snapshots over a steady \
                 interval of time"
            ),
            EstimateError::RankNotRecognised { rank } => write!(
                f,
                "rank {rank} was not a recognised rank of the gate throughout the window"
            ),
            EstimateError::CapacityChanged { from, to } => write!(
                f,
                "the engine capacity changed during the window ({from:?} to {to:?}): the window \
                 is not steady"
            ),
            EstimateError::MultipleRanks { ranks } => write!(
                f,
                "the worker has {ranks} ranks: sample one rank, since the worker total does not \
                 show how requests spread over ranks"
            ),
            EstimateError::Queueing {
                peak_queued,
                admitted_from_queue,
                cancelled_in_queue,
            } => write!(
                f,
                "the gate queued requests during the window (peak {peak_queued} queued, \
                 {admitted_from_queue} admitted from the queue, {cancelled_in_queue} cancelled \
                 while queued): the gate's limits, not the engine, shaped the traffic; raise both \
                 engine limits for the calibration run or lower the load"
            ),
            EstimateError::Rejections { rejected } => write!(
                f,
                "the gate rejected {rejected} request(s) during the window: the gate's limits, \
                 not the engine, shaped the traffic; raise the limits for the calibration run or \
                 lower the load"
            ),
            EstimateError::TooFewAdmissions { admitted, required } => write!(
                f,
                "only {admitted} admission(s) during the window, fewer than the {required} \
                 needed for a meaningful mean: sample for longer or under more load"
            ),
        }
    }
}

impl Error for EstimateError {}

/// Measures `L` and `C` of one rank (or of a single-rank worker) from a
/// series of [`Snapshot`]s, for an [`Estimate`].
///
/// The waiting count is integrated over time, holding each snapshot's value
/// until the next one: sample often compared with the mean wait (every
/// 100 ms for waits of about a second, say) and over a long enough window
/// (a minute or more) for the time average to settle. Snapshots must come
/// in time order; see the [module docs](self) for an example.
#[derive(Debug, Clone)]
pub struct Sampler {
    scope: Scope,
    min_admissions: u64,
    samples: usize,
    first: Option<Sample>,
    last: Option<Sample>,
    /// Integral of the waiting count over time, in request-nanoseconds
    /// (exact: no rounding accumulates over a long window).
    waiting_nanos: u128,
    peak_queued: usize,
    /// A snapshot in which the rank was not recognised.
    rank_missing: bool,
    /// The first capacity different from the first snapshot's.
    capacity_changed: Option<Option<EngineCapacity>>,
}

#[derive(Debug, Clone, Copy)]
enum Scope {
    Worker,
    Rank(u32),
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    waiting: usize,
    tally: Tally,
    capacity: Option<EngineCapacity>,
}

impl Sampler {
    /// Admissions a window needs, unless [`min_admissions`](Self::min_admissions) says otherwise.
    pub const DEFAULT_MIN_ADMISSIONS: u64 = 100;

    /// Samples one rank: its own waiting count and admissions.
    pub fn rank(rank: u32) -> Sampler {
        Sampler::new(Scope::Rank(rank))
    }

    /// Samples the whole worker, ranked and unranked requests together.
    /// Only meaningful for a worker with one rank (or before the engine
    /// reports, when everything is unranked); with more ranks the estimate
    /// is refused with [`EstimateError::MultipleRanks`].
    pub fn worker() -> Sampler {
        Sampler::new(Scope::Worker)
    }

    fn new(scope: Scope) -> Sampler {
        Sampler {
            scope,
            min_admissions: Self::DEFAULT_MIN_ADMISSIONS,
            samples: 0,
            first: None,
            last: None,
            waiting_nanos: 0,
            peak_queued: 0,
            rank_missing: false,
            capacity_changed: None,
        }
    }

    /// The fewest admissions a window needs for an estimate (default
    /// [`DEFAULT_MIN_ADMISSIONS`](Self::DEFAULT_MIN_ADMISSIONS); at least 1).
    pub fn min_admissions(mut self, n: u64) -> Sampler {
        self.min_admissions = n.max(1);
        self
    }

    /// Records a snapshot taken at `at`. An instant earlier than the last
    /// one recorded counts as no time passing.
    pub fn record(&mut self, snapshot: &Snapshot, at: Instant) {
        self.samples += 1;
        let (counts, tally) = match self.scope {
            Scope::Worker => (Some(snapshot.total), Some(snapshot.tally)),
            Scope::Rank(rank) => (
                snapshot.ranks.get(rank as usize).copied(),
                snapshot.rank_tallies.get(rank as usize).copied(),
            ),
        };
        let (Some(counts), Some(tally)) = (counts, tally) else {
            self.rank_missing = true;
            return;
        };
        let sample = Sample {
            at,
            waiting: counts.engine_waiting,
            tally,
            capacity: snapshot.capacity,
        };
        self.peak_queued = self.peak_queued.max(counts.queued);
        match (self.first, self.last) {
            (Some(first), Some(last)) => {
                let elapsed = at.saturating_duration_since(last.at);
                self.waiting_nanos += last.waiting as u128 * elapsed.as_nanos();
                if sample.capacity != first.capacity && self.capacity_changed.is_none() {
                    self.capacity_changed = Some(sample.capacity);
                }
                self.last = Some(Sample {
                    at: at.max(last.at),
                    ..sample
                });
            }
            _ => {
                self.first = Some(sample);
                self.last = Some(sample);
            }
        }
    }

    /// Time between the first and the last snapshot recorded.
    pub fn window(&self) -> Duration {
        match (self.first, self.last) {
            (Some(first), Some(last)) => last.at.saturating_duration_since(first.at),
            _ => Duration::ZERO,
        }
    }

    /// How requests ended between the first and the last snapshot.
    pub fn tally(&self) -> Tally {
        match (self.first, self.last) {
            (Some(first), Some(last)) => last.tally.since(&first.tally),
            _ => Tally::default(),
        }
    }

    /// `L` and `C` over the window, or why the window cannot give them.
    pub fn estimate(&self) -> Result<Estimate, EstimateError> {
        if let Scope::Rank(rank) = self.scope {
            if self.rank_missing {
                return Err(EstimateError::RankNotRecognised { rank });
            }
        }
        let window = self.window();
        let (Some(first), Some(_)) = (self.first, self.last) else {
            return Err(self.too_few_samples());
        };
        if window.is_zero() {
            return Err(self.too_few_samples());
        }
        if let Some(to) = self.capacity_changed {
            return Err(EstimateError::CapacityChanged {
                from: first.capacity,
                to,
            });
        }
        if let (Scope::Worker, Some(capacity)) = (self.scope, first.capacity) {
            if capacity.dp_ranks > 1 {
                return Err(EstimateError::MultipleRanks {
                    ranks: capacity.dp_ranks,
                });
            }
        }
        let tally = self.tally();
        if self.peak_queued > 0 || tally.admitted_queue > 0 || tally.cancelled > 0 {
            return Err(EstimateError::Queueing {
                peak_queued: self.peak_queued,
                admitted_from_queue: tally.admitted_queue,
                cancelled_in_queue: tally.cancelled,
            });
        }
        if tally.rejected() > 0 {
            return Err(EstimateError::Rejections {
                rejected: tally.rejected(),
            });
        }
        if tally.admitted() < self.min_admissions {
            return Err(EstimateError::TooFewAdmissions {
                admitted: tally.admitted(),
                required: self.min_admissions,
            });
        }
        Ok(Estimate::from_occupancy_and_rate(
            self.waiting_nanos as f64 / window.as_nanos() as f64,
            tally.admitted() as f64 / window.as_secs_f64(),
        ))
    }

    fn too_few_samples(&self) -> EstimateError {
        EstimateError::TooFewSamples {
            samples: self.samples,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_budget_is_the_prefill_the_objective_allows() {
        assert_eq!(token_budget(Duration::from_millis(300), 6_000.0), 1_800);
        // 0.7 s × 3,000 tokens/s is 2100.0000000000005 in f64, not 2101.
        assert_eq!(token_budget(Duration::from_millis(700), 3_000.0), 2_100);
        assert_eq!(token_budget(Duration::from_millis(250), 1_001.0), 250);
        assert_eq!(token_budget(Duration::ZERO, 6_000.0), 1);
    }

    #[test]
    #[should_panic(expected = "prefill rate must be a positive finite number")]
    fn a_zero_prefill_rate_panics() {
        let _ = token_budget(Duration::from_secs(1), 0.0);
    }

    #[test]
    fn the_spec_example_gives_twelve() {
        let estimate = Estimate::from_rate_and_wait(50.0, Duration::from_millis(240));
        assert_eq!(estimate.mean_waiting(), 12.0);
        assert_eq!(estimate.waiting_limit(), 12);
        let estimate = Estimate::from_occupancy_and_rate(12.0, 50.0);
        assert_eq!(estimate.mean_wait(), Duration::from_millis(240));
        assert_eq!(estimate.waiting_limit(), 12);
    }

    #[test]
    fn binary_rounding_of_the_product_does_not_add_a_slot() {
        // Round-looking measurements whose `f64` product lands just above
        // the integer: a bare `ceil` would add one.
        for (rate, wait_ms, limit) in [(50.0, 280, 14), (100.0, 70, 7), (100.0, 1_100, 110)] {
            let product = rate * Duration::from_millis(wait_ms).as_secs_f64();
            assert_eq!(
                product.ceil(),
                limit as f64 + 1.0,
                "{product} is just above {limit}"
            );
            let estimate = Estimate::from_rate_and_wait(rate, Duration::from_millis(wait_ms));
            assert_eq!(estimate.waiting_limit(), limit, "{rate} × {wait_ms} ms");
        }
    }

    #[test]
    fn anything_measurably_above_an_integer_rounds_up() {
        let limit = |l: f64| Estimate::from_occupancy_and_rate(l, 1.0).waiting_limit();
        assert_eq!(limit(12.0), 12);
        assert_eq!(limit(12.000001), 13);
        assert_eq!(limit(12.3), 13);
        assert_eq!(limit(11.9999999999), 12);
        assert_eq!(limit(0.0), 1, "a waiting limit is at least 1");
        assert_eq!(limit(0.2), 1);
        assert_eq!(limit(1e300), usize::MAX);
    }

    #[test]
    #[should_panic(expected = "admission rate must be a positive finite number, not 0")]
    fn a_zero_rate_panics() {
        let _ = Estimate::from_rate_and_wait(0.0, Duration::from_secs(1));
    }

    #[test]
    #[should_panic(expected = "mean waiting count must be a non-negative finite number")]
    fn a_nan_occupancy_panics() {
        let _ = Estimate::from_occupancy_and_rate(f64::NAN, 1.0);
    }
}
