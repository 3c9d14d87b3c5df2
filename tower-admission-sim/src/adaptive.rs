//! The evaluation of the adaptive engine request waiting limit behind
//! `examples/adaptive.rs` ([`AdaptiveWaitingLimit`](tower_admission::AdaptiveWaitingLimit)):
//! the simulated engine under steady overload, slowed to half speed (or
//! given longer decodes: [`Change`]) for the middle third of the run and
//! back for the last, in virtual time, seeded.
//!
//! | [`Setup`] | the gate in front of the engine |
//! |---|---|
//! | [`CapacityReported`](Setup::CapacityReported) | the engine reports `max_num_seqs`: every limit follows it; the run's first-token objective as [`ttft_objective`](tower_admission::AdmissionConfig::ttft_objective) |
//! | [`HandSized`](Setup::HandSized) | the engine reports nothing (the limits stay at their 10000 defaults, as behind a sidecar in front of vLLM); the waiting limit sized by hand with the documented Little's-law procedure ([`Calibration`]) on the full-speed engine; the objective |
//! | [`Adaptive`](Setup::Adaptive) | the engine reports nothing; the adaptive waiting limit with its defaults; the objective |
//! | [`NothingReported`](Setup::NothingReported) | the engine reports nothing, and nothing else is set but the objective |
//!
//! Arrivals are open-loop at [`AdaptiveEvaluation::load`] × the full-speed
//! engine's capacity for the whole run, so the slow phase is twice as
//! overloaded again. Every request names rank 0 and tells the gate its
//! cost. Clients are patient; a request is **good** when its first token
//! comes within the objective of its arrival (rejected requests never
//! are). Goodput is counted per phase over the requests that arrived in
//! it (the first phase after its warm-up). The gate's waiting limit is
//! sampled every [`AdaptiveEvaluation::trace_every`] for the plot and
//! the settling figures.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::config::StepTime;
use super::engine::{Request, SimEngine};
use super::measure::{Percentile, acquire, descriptor_of, lock};
use super::sweep::{Calibration, SweepConfig};
use super::time::{self, VirtualRuntime};
use super::workload::{Lengths, MixPart};
use tower_admission::{AdmissionConfig, Gate};

/// What the evaluation runs.
#[derive(Debug, Clone)]
pub struct AdaptiveEvaluation {
    /// The engine, the workload, the seed and the objective (only
    /// [`Slo::ttft`](super::sweep::Slo::ttft) counts here).
    pub sweep: SweepConfig,
    /// Offered load, as a multiple of the full-speed engine's capacity.
    pub load: f64,
    /// Length of each of the three phases: as configured, changed, as
    /// configured.
    pub phase: Duration,
    /// What changes in the middle phase.
    pub change: Change,
    /// How often the gate's limit is sampled.
    pub trace_every: Duration,
    /// The setups to run.
    pub setups: Vec<Setup>,
}

impl Default for AdaptiveEvaluation {
    /// The default engine and workload of the overload sweep, a 2 s
    /// first-token objective, 2× load, phases of 60 s (the first one with
    /// the sweep's 15 s warm-up), half speed in the middle, every setup.
    fn default() -> Self {
        let mut sweep = SweepConfig::default();
        sweep.slo.ttft = Duration::from_secs(2);
        AdaptiveEvaluation {
            sweep,
            load: 2.0,
            phase: Duration::from_secs(60),
            change: Change::Slowdown(2.0),
            trace_every: Duration::from_millis(100),
            setups: Setup::ALL.to_vec(),
        }
    }
}

/// What changes for the middle third of a run; neither is reported to the
/// gate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change {
    /// Every engine step takes this many times longer
    /// ([`SimEngine::set_slowdown`]; 2.0: half speed). The Little's-law
    /// waiting limit does not change: the admission rate falls as much as
    /// the waiting time rises.
    Slowdown(f64),
    /// Requests that arrive in the middle phase generate this many times
    /// more tokens (2.0: the engine completes half as many requests per
    /// second, and prefill takes as long as before): the Little's-law
    /// waiting limit falls.
    LongerDecode(f64),
}

impl Change {
    /// A short name for tables.
    pub fn name(&self) -> String {
        match self {
            Change::Slowdown(factor) => format!("step time x{factor}"),
            Change::LongerDecode(factor) => format!("output x{factor}"),
        }
    }

    /// `config` as it is during the change, for sizing.
    fn apply(&self, config: &SweepConfig) -> SweepConfig {
        let mut changed = config.clone();
        match *self {
            Change::Slowdown(factor) => {
                changed.engine.step_time = slow(changed.engine.step_time, factor);
            }
            Change::LongerDecode(factor) => {
                changed.output_tokens = scaled(changed.output_tokens, factor);
            }
        }
        changed
    }
}

/// The gate's configuration of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Setup {
    /// The engine reports its capacity; the objective.
    CapacityReported,
    /// Nothing reported; a Little's-law waiting limit; the objective.
    HandSized,
    /// Nothing reported; the adaptive waiting limit; the objective.
    Adaptive,
    /// Nothing reported; only the objective.
    NothingReported,
}

impl Setup {
    /// Every setup, in table order.
    pub const ALL: [Setup; 4] = [
        Setup::CapacityReported,
        Setup::HandSized,
        Setup::Adaptive,
        Setup::NothingReported,
    ];

    /// A short name for tables and plots.
    pub fn name(&self) -> &'static str {
        match self {
            Setup::CapacityReported => "capacity reported",
            Setup::HandSized => "nothing reported, hand-sized wait",
            Setup::Adaptive => "nothing reported, adaptive wait",
            Setup::NothingReported => "nothing reported",
        }
    }
}

/// What the evaluation measured before its runs: the capacity and the
/// Little's-law waiting limit of the engine at full speed and slowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sizing {
    /// At full speed.
    pub full: Calibration,
    /// During the [`AdaptiveEvaluation::change`].
    pub slowed: Calibration,
}

/// One phase of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    /// Requests that arrived in the phase's window.
    pub arrivals: usize,
    /// Of them, with a first token within the objective.
    pub good: usize,
    /// Of them, rejected.
    pub rejected: usize,
    /// Good requests per second of the window.
    pub goodput: f64,
    /// 99th percentile TTFT of the admitted requests of the window.
    pub p99_ttft: Option<Percentile>,
    /// The waiting limit's time average over the second half of the phase.
    pub settled_limit: f64,
    /// From the phase's start, how long until the waiting limit's
    /// five-second trailing mean came within ±25% of `settled_limit` and
    /// stayed there for the rest of the phase; `None` if it never settled.
    pub settled_after: Option<Duration>,
}

/// One setup's run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The setup.
    pub setup: Setup,
    /// Full speed, slowed, full speed again.
    pub phases: [Phase; 3],
    /// `(seconds from the start, waiting limit, waiting count)` every
    /// [`AdaptiveEvaluation::trace_every`].
    pub trace: Vec<(f64, usize, usize)>,
}

impl AdaptiveEvaluation {
    /// Measures the capacity and the Little's-law waiting limits, at full
    /// speed and slowed, by the procedure of `docs/operations.md`
    /// ([`Calibration::measure`]: 0.9× load, limits high, no gate queueing).
    pub fn size(&self) -> Sizing {
        Sizing {
            full: Calibration::measure(&self.sweep),
            slowed: Calibration::measure(&self.change.apply(&self.sweep)),
        }
    }

    /// The gate's configuration of `setup`.
    pub fn gate_config(&self, setup: Setup, sizing: &Sizing) -> AdmissionConfig {
        let objective = AdmissionConfig::new()
            .ttft_objective(self.sweep.slo.ttft)
            .clock(|| time::now().into_std());
        match setup {
            Setup::CapacityReported | Setup::NothingReported => objective,
            Setup::HandSized => objective.engine_request_waiting_limit(sizing.full.waiting_limit),
            Setup::Adaptive => objective.adaptive_waiting_limit(true),
        }
    }

    /// Runs every setup, one thread each.
    pub fn run(&self, sizing: &Sizing) -> Vec<Run> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .setups
                .iter()
                .map(|&setup| scope.spawn(move || self.run_one(setup, sizing)))
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().expect("a run panicked"))
                .collect()
        })
    }

    /// Runs one setup on its own virtual runtime.
    pub fn run_one(&self, setup: Setup, sizing: &Sizing) -> Run {
        VirtualRuntime::new().block_on(self.simulate(setup, sizing))
    }

    async fn simulate(&self, setup: Setup, sizing: &Sizing) -> Run {
        let engine = SimEngine::new(self.sweep.engine.clone());
        let gate = Gate::new(self.gate_config(setup, sizing));
        if setup == Setup::CapacityReported {
            engine.report_to(&gate);
        }
        let objective = self.sweep.slo.ttft;
        let start = time::now();
        let end = start + self.phase * 3;
        let records: Arc<Mutex<Vec<Record>>> = Arc::default();
        let rate = self.load * sizing.full.capacity;
        let workload = super::workload::Workload {
            rate,
            burstiness: self.sweep.burstiness,
            prompt_tokens: self.sweep.prompt_tokens,
            output_tokens: self.sweep.output_tokens,
        };
        {
            let (gate, engine, records) = (gate.clone(), engine.clone(), Arc::clone(&records));
            let arrivals = workload.arrivals(self.sweep.seed);
            let longer = match self.change {
                Change::LongerDecode(factor) => factor,
                Change::Slowdown(_) => 1.0,
            };
            let (changed_from, changed_to) = (start + self.phase, start + self.phase * 2);
            time::spawn(async move {
                for arrival in arrivals {
                    let at = start + arrival.at;
                    if at >= end + objective {
                        break;
                    }
                    time::sleep_until(at).await;
                    let index = {
                        let mut records = lock(&records);
                        records.push(Record {
                            arrival: at,
                            first_token: None,
                            rejected: false,
                        });
                        records.len() - 1
                    };
                    let output_tokens = if at >= changed_from && at < changed_to {
                        (arrival.output_tokens as f64 * longer).round() as usize
                    } else {
                        arrival.output_tokens
                    };
                    let request = Request {
                        prompt_tokens: arrival.prompt_tokens,
                        output_tokens,
                        rank: Some(0),
                    };
                    let (gate, engine, records) =
                        (gate.clone(), engine.clone(), Arc::clone(&records));
                    time::spawn(async move {
                        let Ok(mut permit) = acquire(&gate, descriptor_of(request)).await else {
                            lock(&records)[index].rejected = true;
                            return;
                        };
                        let Ok(mut stream) = engine.submit(request) else {
                            return;
                        };
                        if stream.next_token().await.is_none() {
                            return;
                        }
                        permit.first_token();
                        lock(&records)[index].first_token = Some(time::now());
                        while stream.next_token().await.is_some() {}
                        drop(permit);
                    });
                }
            });
        }
        let mut trace = Vec::new();
        let mut at = start;
        let slowdown = match self.change {
            Change::Slowdown(factor) => factor,
            Change::LongerDecode(_) => 1.0,
        };
        let mut slowed = false;
        let mut restored = false;
        while at < end + objective {
            if !slowed && at >= start + self.phase {
                engine.set_slowdown(slowdown);
                slowed = true;
            }
            if !restored && at >= start + self.phase * 2 {
                engine.set_slowdown(1.0);
                restored = true;
            }
            let snapshot = gate.snapshot();
            trace.push((
                (at - start).as_secs_f64(),
                snapshot.limits.engine_request_waiting_limit,
                snapshot.total.engine_waiting,
            ));
            at += self.trace_every;
            time::sleep_until(at).await;
        }
        let records = lock(&records);
        let warmup = self.sweep.warmup().min(self.phase / 2);
        let phase = |n: u32, from: Duration| {
            let window_start = start + self.phase * n + from;
            let window_end = start + self.phase * (n + 1);
            self.phase_result(
                &records,
                &trace,
                objective,
                (window_start, window_end),
                (self.phase * n).as_secs_f64(),
            )
        };
        Run {
            setup,
            phases: [
                phase(0, warmup),
                phase(1, Duration::ZERO),
                phase(2, Duration::ZERO),
            ],
            trace,
        }
    }

    fn phase_result(
        &self,
        records: &[Record],
        trace: &[(f64, usize, usize)],
        objective: Duration,
        (from, to): (Instant, Instant),
        phase_start: f64,
    ) -> Phase {
        let window: Vec<&Record> = records
            .iter()
            .filter(|record| record.arrival >= from && record.arrival < to)
            .collect();
        let good = window
            .iter()
            .filter(|record| {
                record
                    .first_token
                    .is_some_and(|first| first - record.arrival <= objective)
            })
            .count();
        let rejected = window.iter().filter(|record| record.rejected).count();
        let mut ttfts: Vec<(Duration, bool)> = window
            .iter()
            .filter(|record| !record.rejected)
            .map(|record| match record.first_token {
                Some(first) => (first - record.arrival, false),
                None => (to + objective - record.arrival, true),
            })
            .collect();
        let phase_end = phase_start + self.phase.as_secs_f64();
        let limits = |from: f64, to: f64| -> Vec<f64> {
            trace
                .iter()
                .filter(|(at, _, _)| *at >= from && *at < to)
                .map(|&(_, limit, _)| limit as f64)
                .collect()
        };
        let mean = |values: &[f64]| values.iter().sum::<f64>() / values.len().max(1) as f64;
        let half = phase_start + self.phase.as_secs_f64() / 2.0;
        let settled_limit = mean(&limits(half, phase_end));
        // Five-second trailing means, one per second from the phase's
        // start: the limit in force is an integer that steps up and down
        // by one around its estimate, so a shorter mean is mostly noise.
        let seconds = self.phase.as_secs() as usize;
        let means: Vec<f64> = (0..seconds)
            .map(|s| {
                let to = phase_start + s as f64 + 1.0;
                mean(&limits(to - 5.0, to))
            })
            .collect();
        let within = |value: f64| (value - settled_limit).abs() <= 0.25 * settled_limit;
        let settled_after = (0..seconds)
            .find(|&s| means[s..].iter().all(|&m| within(m)))
            .map(|s| Duration::from_secs(s as u64 + 1));
        Phase {
            arrivals: window.len(),
            good,
            rejected,
            goodput: good as f64 / (to - from).as_secs_f64(),
            p99_ttft: Percentile::of(&mut ttfts, 0.99),
            settled_limit,
            settled_after,
        }
    }
}

/// A step time `factor` times longer.
fn slow(step: StepTime, factor: f64) -> StepTime {
    StepTime {
        base: step.base.mul_f64(factor),
        per_prefill_token: step.per_prefill_token.mul_f64(factor),
        per_decode_token: step.per_decode_token.mul_f64(factor),
    }
}

/// `lengths` `factor` times longer: the same shape, every mean and bound
/// scaled.
fn scaled(lengths: Lengths, factor: f64) -> Lengths {
    let times = |n: usize| ((n as f64) * factor).round().max(1.0) as usize;
    let part = |part: MixPart| MixPart {
        mean: part.mean * factor,
        min: times(part.min),
        max: times(part.max),
        ..part
    };
    match lengths {
        Lengths::Fixed(n) => Lengths::Fixed(times(n)),
        Lengths::LogNormal {
            mean,
            sigma,
            min,
            max,
        } => Lengths::LogNormal {
            mean: mean * factor,
            sigma,
            min: times(min),
            max: times(max),
        },
        Lengths::Mix {
            short,
            long,
            long_fraction,
        } => Lengths::Mix {
            short: part(short),
            long: part(long),
            long_fraction,
        },
    }
}

/// What became of one request.
struct Record {
    arrival: Instant,
    first_token: Option<Instant>,
    rejected: bool,
}
