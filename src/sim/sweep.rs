//! The overload evaluation behind `examples/overload.rs`: offered load from
//! below to far above the engine's capacity, for the admission policies a
//! user would pick instead of this crate and for the [`Gate`], in front of
//! the same simulated engine, in virtual time.
//!
//! | [`System`] | in front of the engine |
//! |---|---|
//! | [`NoAdmission`](System::NoAdmission) | nothing: every request joins the engine's own unbounded queue |
//! | [`ConcurrencyLimit`](System::ConcurrencyLimit) | `tower::limit::ConcurrencyLimit` with `max_num_seqs × dp_ranks` permits. Its permit is released when the response future resolves — at the response head, as soon as the engine has queued the request — so it never holds back a streaming engine |
//! | [`TgiSemaphore`](System::TgiSemaphore) | TGI's router: a semaphore of [`SweepConfig::tgi_permits`] (default `max_num_seqs × dp_ranks`) taken with `try_acquire` and held for the whole stream; no queue, an immediate rejection when it is empty |
//! | [`VllmCap`](System::VllmCap) | a vLLM-style cap: rejects when the requests in flight (waiting + running in the engine) reach `dp_ranks × max_num_seqs + queue`, with `queue` = [`SweepConfig::vllm_queue`] (default `2 × max_num_seqs × dp_ranks`, the gate's default queue) |
//! | [`Gate`](System::Gate) | a [`Gate`] with [`SweepConfig::gate`] (defaults: every limit follows the engine's report): `acquire` before the engine, [`Permit::first_token`] at the first token, the permit dropped at the end of the stream; rejections answered at once |
//! | [`GateLittlesLaw`](System::GateLittlesLaw) | the gate with its engine request waiting limit sized by Little's law ([`sizing`](crate::sizing)) on a calibration run ([`Calibration`]) |
//! | [`GateSizedForObjective`](System::GateSizedForObjective) | the same, and a request queue limit sized by Little's law for the first-token objective: the queue a rank drains within the objective's slack |
//! | [`GateTtftObjective`](System::GateTtftObjective) | the gate with the run's first-token objective as its [`ttft_objective`](AdmissionConfig::ttft_objective), on the simulator's clock, and no queue tuning |
//! | [`GateTokenBudget`](System::GateTokenBudget) | the gate with an engine waiting token limit of [`Calibration::token_budget`]: the objective × the engine's prefill rate |
//!
//! The gate is asked with a [`Descriptor`]: the request's rank and its
//! [`Cost`] (prompt tokens, and its output length as `max_tokens`). A
//! request queued with a wait budget ([`Acquire::expires_at`](crate::Acquire::expires_at))
//! is expired by a timer on the simulator's clock, as a server's own timer
//! would; a rejection for the deadline is a rejection. Rows for other
//! gate settings are added in one place, [`gate_config`], with a
//! [`System`] variant each.
//!
//! Each point is one run on its own [`VirtualRuntime`], so the whole sweep
//! is deterministic for a seed, and the runs are spread over threads.
//! Arrivals are open-loop. What clients do is [`Clients`]: patient (they
//! wait for every request to the end and never retry), retrying (rejected
//! requests are sent again after a jittered exponential backoff, under a
//! retry budget), or giving up (a request without a first token at its
//! deadline is cancelled, wherever it waits).
//!
//! **Goodput** is the rate of requests that arrived in the measurement
//! window and completed within both objectives of [`Slo`]: time to first
//! token (from the first send, so queueing, backoff and retries count) and
//! time per output token (the mean gap between tokens after the first). A
//! request rejected for good, or given up, is never good. A run lasts until
//! every request of the window has completed, been rejected, been given up,
//! or missed its first-token objective; arrivals go on until then, so the
//! load stays the same to the end.
//!
//! The default objectives, TTFT ≤ 10 s and TPOT ≤ 100 ms, reflect one
//! consequence of the gate's default queue limit (`2 × max_num_seqs`): at
//! saturation a request waits for about two engine-lifetimes of the
//! requests ahead of it (≈ 6–7 s with ShareGPT-like requests). A tighter
//! first-token objective, such as MLPerf's 2 s for this model, needs a
//! shorter queue: [`System::GateSizedForObjective`] sizes one, or set
//! [`SweepConfig::gate`] (`--queue-limit` in the example).

use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::Service;
use tower::limit::ConcurrencyLimit;

use super::config::{EngineConfig, Token};
use super::engine::{Request, SimEngine, SubmitError, TokenStream};
use super::time::{self, VirtualRuntime};
use super::workload::{Lengths, Workload};
use crate::sizing::{Estimate, Sampler, token_budget};
use crate::{AdmissionConfig, Cost, Descriptor, Gate, Permit};

/// What stands between the clients and the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum System {
    /// Nothing: requests go straight into the engine's queue.
    NoAdmission,
    /// `tower::limit::ConcurrencyLimit` around the engine's `Service`.
    ConcurrencyLimit,
    /// A TGI-style semaphore held for the whole stream, no queue.
    TgiSemaphore,
    /// A vLLM-style cap on requests in flight.
    VllmCap,
    /// This crate's [`Gate`] with [`SweepConfig::gate`].
    Gate,
    /// The gate with a Little's-law engine request waiting limit.
    GateLittlesLaw,
    /// The gate with a Little's-law waiting limit and a request queue
    /// limit sized for the first-token objective.
    GateSizedForObjective,
    /// The gate with the first-token objective ([`Slo::ttft`]) as its
    /// setting, on the simulator's clock, and no queue tuning.
    GateTtftObjective,
    /// The gate with an engine waiting token limit sized for the
    /// first-token objective ([`Calibration::token_budget`]).
    GateTokenBudget,
}

impl System {
    /// Every system, in table order.
    pub const ALL: [System; 9] = [
        System::NoAdmission,
        System::ConcurrencyLimit,
        System::TgiSemaphore,
        System::VllmCap,
        System::Gate,
        System::GateLittlesLaw,
        System::GateSizedForObjective,
        System::GateTtftObjective,
        System::GateTokenBudget,
    ];

    /// What a user would pick instead of this crate.
    pub const ALTERNATIVES: [System; 4] = [
        System::NoAdmission,
        System::ConcurrencyLimit,
        System::TgiSemaphore,
        System::VllmCap,
    ];

    /// A short name for tables and plots.
    pub fn name(&self) -> &'static str {
        match self {
            System::NoAdmission => "no admission control",
            System::ConcurrencyLimit => "tower ConcurrencyLimit",
            System::TgiSemaphore => "TGI-style semaphore",
            System::VllmCap => "vLLM-style cap",
            System::Gate => "gate, defaults",
            System::GateLittlesLaw => "gate, Little's-law wait",
            System::GateSizedForObjective => "gate, sized for TTFT",
            System::GateTtftObjective => "gate with TTFT objective",
            System::GateTokenBudget => "gate with token budget",
        }
    }

    /// Whether this is the crate's gate in some configuration.
    pub fn is_gate(&self) -> bool {
        matches!(
            self,
            System::Gate
                | System::GateLittlesLaw
                | System::GateSizedForObjective
                | System::GateTtftObjective
                | System::GateTokenBudget
        )
    }
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Latency objectives of a good request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slo {
    /// Time to first token, from the first send.
    pub ttft: Duration,
    /// Time per output token: the mean gap between tokens after the first.
    pub tpot: Duration,
}

impl Default for Slo {
    /// TTFT ≤ 10 s, TPOT ≤ 100 ms (see the [module docs](self)).
    fn default() -> Self {
        Slo {
            ttft: Duration::from_secs(10),
            tpot: Duration::from_millis(100),
        }
    }
}

/// What clients do when a request is rejected or slow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Clients {
    /// Wait for every request to the end; take a rejection as final.
    Patient,
    /// Send a rejected request again, as [`Retry`] says.
    Retry(Retry),
    /// Cancel a request that has no first token `after` its first send,
    /// wherever it waits (a queue, the engine); take a rejection as final.
    GiveUp {
        /// The client's patience.
        after: Duration,
    },
}

/// Retries of rejected requests: jittered exponential backoff under a
/// retry budget, never past the first-token objective (a retry that could
/// only start after it is not sent).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retry {
    /// Retries of one request at most.
    pub max_retries: u32,
    /// Backoff cap before the first retry; it doubles with every retry up
    /// to `max_backoff`, and the wait is drawn uniformly below the cap
    /// ("full jitter").
    pub first_backoff: Duration,
    /// Largest backoff cap.
    pub max_backoff: Duration,
    /// Retries earned per request sent for the first time (a token bucket
    /// shared by all clients, as in gRPC and Finagle retry budgets).
    pub budget_ratio: f64,
    /// Size of the bucket, and its content at the start.
    pub budget_reserve: f64,
}

impl Default for Retry {
    /// Three retries, backoff 250 ms doubling to 4 s, a budget of 0.2
    /// retries per request with a reserve of 10.
    fn default() -> Self {
        Retry {
            max_retries: 3,
            first_backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(4),
            budget_ratio: 0.2,
            budget_reserve: 10.0,
        }
    }
}

/// Everything a sweep depends on.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// The simulated engine.
    pub engine: EngineConfig,
    /// The gate's configuration for the gate systems; the engine reports
    /// its capacity to the gate at start.
    pub gate: AdmissionConfig,
    /// Gamma shape of the arrival gaps (1 = Poisson).
    pub burstiness: f64,
    /// Prompt lengths.
    pub prompt_tokens: Lengths,
    /// Prompts of this many tokens or more are "long": [`Point::long`]
    /// counts them apart from the others ([`Point::short`]).
    pub long_prompt_tokens: usize,
    /// Output lengths.
    pub output_tokens: Lengths,
    /// Fraction of requests that name a rank (round-robin over the ranks);
    /// the others are unranked (the gate counts them on the combined
    /// capacity, the engine puts them on its least loaded rank).
    pub ranked: f64,
    /// What clients do on rejection or delay.
    pub clients: Clients,
    /// Permits of [`System::TgiSemaphore`]; `None`: `max_num_seqs ×
    /// dp_ranks`.
    pub tgi_permits: Option<usize>,
    /// The `queue` of [`System::VllmCap`]; `None`: `2 × max_num_seqs ×
    /// dp_ranks`.
    pub vllm_queue: Option<usize>,
    /// Offered loads, as multiples of the engine's capacity.
    pub loads: Vec<f64>,
    /// The systems to compare.
    pub systems: Vec<System>,
    /// What makes a request good.
    pub slo: Slo,
    /// Time from the start before measured arrivals begin. A run uses at
    /// least 1.5 × the first-token objective ([`SweepConfig::warmup`]), so
    /// that the queues of every system have filled (or, for clients that
    /// give up, turned over) before the window: otherwise requests of the
    /// window are served early, in place of a backlog that has not formed
    /// yet, and goodput reads above capacity.
    pub warmup: Duration,
    /// Length of the window of measured arrivals.
    pub window: Duration,
    /// Seed of the workload; each load uses the same requests, scaled in time.
    pub seed: u64,
    /// Threads that run points in parallel (at least 1).
    pub threads: usize,
}

impl Default for SweepConfig {
    /// The full sweep: the default engine (256 sequences, one rank),
    /// ShareGPT-like Poisson traffic from patient clients, every request
    /// ranked, loads 0.5× to 8×, a 15 s warm-up and a 60 s window, every
    /// system, seed 1.
    fn default() -> Self {
        SweepConfig {
            engine: EngineConfig::default(),
            gate: AdmissionConfig::new(),
            burstiness: 1.0,
            prompt_tokens: Lengths::sharegpt_prompt(),
            long_prompt_tokens: 8192,
            output_tokens: Lengths::sharegpt_output(),
            ranked: 1.0,
            clients: Clients::Patient,
            tgi_permits: None,
            vllm_queue: None,
            loads: vec![0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0],
            systems: System::ALL.to_vec(),
            slo: Slo::default(),
            warmup: Duration::from_secs(15),
            window: Duration::from_secs(60),
            seed: 1,
            threads: std::thread::available_parallelism().map_or(1, usize::from),
        }
    }
}

impl SweepConfig {
    /// A quick sweep for tests: an engine of 64 sequences (a quarter of the
    /// work per simulated second), loads 0.5×, 1×, 2×, 4× and 8×, a 15 s
    /// warm-up and a 20 s window.
    pub fn fast() -> Self {
        SweepConfig {
            engine: EngineConfig {
                max_num_seqs: 64,
                ..EngineConfig::default()
            },
            loads: vec![0.5, 1.0, 2.0, 4.0, 8.0],
            warmup: Duration::from_secs(15),
            window: Duration::from_secs(20),
            ..SweepConfig::default()
        }
    }

    fn workload(&self, rate: f64) -> Workload {
        Workload {
            rate,
            burstiness: self.burstiness,
            prompt_tokens: self.prompt_tokens,
            output_tokens: self.output_tokens,
        }
    }

    /// The warm-up a run uses: [`SweepConfig::warmup`], and at least 1.5 ×
    /// the first-token objective.
    pub fn warmup(&self) -> Duration {
        self.warmup.max(self.slo.ttft.mul_f64(1.5))
    }

    fn total_seqs(&self) -> usize {
        self.engine.max_num_seqs * self.engine.dp_ranks
    }

    /// The permits of [`System::TgiSemaphore`].
    pub fn tgi_permits(&self) -> usize {
        self.tgi_permits.unwrap_or(self.total_seqs())
    }

    /// The in-flight cap of [`System::VllmCap`]: `dp_ranks × max_num_seqs
    /// + queue`.
    pub fn vllm_cap(&self) -> usize {
        self.total_seqs() + self.vllm_queue.unwrap_or(2 * self.total_seqs())
    }
}

/// A named variation of a [`SweepConfig`]: one row group of the evaluation.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// A short name (`base`, `bursty`, ...), for flags and file names.
    pub name: &'static str,
    /// What differs from `base`.
    pub description: &'static str,
    /// The configuration.
    pub config: SweepConfig,
}

/// The scenarios of the evaluation, each a variation of `base`:
///
/// | name | what differs |
/// |---|---|
/// | `base` | nothing: Poisson arrivals, ShareGPT-like lengths, patient clients, one rank |
/// | `bursty` | gamma arrivals of shape 0.25 (gaps with 4× the variance of Poisson) |
/// | `ranks` | four ranks; half the requests name a rank, half are unranked |
/// | `long` | the long-prompt mix ([`Lengths::long_prompt_mix`]); prompts of 1024 tokens or more count as long |
/// | `long-docs` | the long-document mix ([`Lengths::long_document_mix`]): one prompt in ten of 8k–20k tokens; prompts of 8192 tokens or more count as long |
/// | `retry` | clients retry rejections ([`Retry::default`]) |
/// | `give-up` | clients cancel a request without a first token at the TTFT objective |
pub fn scenarios(base: &SweepConfig) -> Vec<Scenario> {
    let with = |f: &dyn Fn(&mut SweepConfig)| {
        let mut config = base.clone();
        f(&mut config);
        config
    };
    vec![
        Scenario {
            name: "base",
            description: "Poisson arrivals, ShareGPT-like lengths, patient clients",
            config: base.clone(),
        },
        Scenario {
            name: "bursty",
            description: "gamma arrivals, shape 0.25",
            config: with(&|c| c.burstiness = 0.25),
        },
        Scenario {
            name: "ranks",
            description: "4 ranks, half the requests ranked, half unranked",
            config: with(&|c| {
                c.engine.dp_ranks = 4;
                c.ranked = 0.5;
            }),
        },
        Scenario {
            name: "long",
            description: "long-prompt mix: 1 in 5 prompts ~3000 tokens",
            config: with(&|c| {
                c.prompt_tokens = Lengths::long_prompt_mix();
                c.long_prompt_tokens = 1024;
            }),
        },
        Scenario {
            name: "long-docs",
            description: "long-document mix: 1 in 10 prompts of 8k-20k tokens",
            config: with(&|c| {
                c.prompt_tokens = Lengths::long_document_mix();
                c.long_prompt_tokens = 8192;
            }),
        },
        Scenario {
            name: "retry",
            description: "clients retry rejections: 3 retries, backoff 250 ms..4 s, budget 0.2/request",
            config: with(&|c| c.clients = Clients::Retry(Retry::default())),
        },
        Scenario {
            name: "give-up",
            description: "clients cancel at the TTFT objective without a first token",
            config: with(&|c| c.clients = Clients::GiveUp { after: c.slo.ttft }),
        },
    ]
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

/// The outcome of one system at one offered load. Counts are over the
/// requests that arrived in the measurement window.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The system measured.
    pub system: System,
    /// Offered load as a multiple of the engine's capacity.
    pub load: f64,
    /// Offered load, requests per second (first sends only).
    pub offered: f64,
    /// Requests that arrived in the window.
    pub arrived: usize,
    /// Sends of those requests, retries included.
    pub sends: usize,
    /// Of those requests, rejected for good (after any retries).
    pub rejected: usize,
    /// Of those, given up by their client (cancelled).
    pub abandoned: usize,
    /// Of those, completed before the run ended.
    pub completed: usize,
    /// Of those, completed within both objectives.
    pub good: usize,
    /// Good requests per second of window.
    pub goodput: f64,
    /// Goodput as a fraction of the engine's capacity.
    pub capacity_fraction: f64,
    /// Median time to first token (from the first send) of the requests
    /// that were admitted and not given up.
    pub ttft_p50: Option<Percentile>,
    /// 99th percentile of the same.
    pub ttft_p99: Option<Percentile>,
    /// Median time per output token of the completed requests.
    pub tpot_p50: Option<Duration>,
    /// 99th percentile of the same.
    pub tpot_p99: Option<Duration>,
    /// Preemptions in the engine over the whole run.
    pub preemptions: u64,
    /// Requests cancelled inside the engine over the whole run: work the
    /// engine queued or started for clients that left.
    pub engine_cancelled: u64,
    /// The longest the engine's own waiting queue got over the run (sampled
    /// at each arrival): where the excess load waits without admission
    /// control.
    pub engine_queue_peak: usize,
    /// Simulated length of the run.
    pub simulated: Duration,
    /// The requests with prompts shorter than
    /// [`SweepConfig::long_prompt_tokens`].
    pub short: Class,
    /// The requests with prompts of [`SweepConfig::long_prompt_tokens`] or
    /// more.
    pub long: Class,
}

/// The requests of one prompt-length class at a [`Point`]: arrivals in the
/// window, their goodput and the time to first token of the admitted ones.
#[derive(Debug, Clone, PartialEq)]
pub struct Class {
    /// Requests of the class that arrived in the window.
    pub arrived: usize,
    /// Of those, rejected for good.
    pub rejected: usize,
    /// Of those, completed within both objectives.
    pub good: usize,
    /// Good requests of the class per second of window.
    pub goodput: f64,
    /// Median time to first token of the admitted requests of the class
    /// (not given up).
    pub ttft_p50: Option<Percentile>,
    /// 99th percentile of the same.
    pub ttft_p99: Option<Percentile>,
}

impl Point {
    /// Requests rejected for good, as a fraction of arrivals.
    pub fn rejection_rate(&self) -> f64 {
        ratio(self.rejected, self.arrived)
    }

    /// Sends per request: 1 without retries.
    pub fn sends_per_request(&self) -> f64 {
        ratio(self.sends, self.arrived)
    }

    /// Requests given up by their clients, as a fraction of arrivals.
    pub fn abandon_rate(&self) -> f64 {
        ratio(self.abandoned, self.arrived)
    }
}

fn ratio(n: usize, of: usize) -> f64 {
    if of == 0 { 0.0 } else { n as f64 / of as f64 }
}

/// The result of a sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    /// The engine's measured capacity, requests per second, and the
    /// Little's-law sizes.
    pub calibration: Calibration,
    /// Every point, system by system, load by load, in configuration order.
    pub points: Vec<Point>,
}

impl Sweep {
    /// The engine's measured capacity, requests per second.
    pub fn capacity(&self) -> f64 {
        self.calibration.capacity
    }

    /// The points of one system, by increasing load.
    pub fn points_of(&self, system: System) -> impl Iterator<Item = &Point> {
        self.points
            .iter()
            .filter(move |point| point.system == system)
    }

    /// The point of `system` at `load`, if it was run.
    pub fn point(&self, system: System, load: f64) -> Option<&Point> {
        self.points_of(system).find(|point| point.load == load)
    }

    /// The highest goodput `system` reached (0 if it was not run).
    pub fn peak_goodput(&self, system: System) -> f64 {
        self.points_of(system)
            .map(|point| point.goodput)
            .fold(0.0, f64::max)
    }
}

/// What a sweep measures before its points: the engine's capacity and the
/// gate's Little's-law sizes for the sized gate systems.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// The engine's capacity, requests per second ([`measure_capacity`]).
    pub capacity: f64,
    /// Little's law on the engine waiting stage of rank 0, measured at
    /// [`Calibration::LOAD`] × capacity with limits high enough that the
    /// gate never queued: `C` admissions per second, `W` mean time from
    /// admission to first token.
    pub estimate: Estimate,
    /// The engine request waiting limit per rank: `ceil(C × W)`.
    pub waiting_limit: usize,
    /// The request queue limit per rank for the first-token objective: the
    /// requests a rank admits (at capacity) in half the slack the
    /// objective leaves after `W`, by Little's law again. Half: the
    /// objective bounds the 99th percentile, not the mean.
    pub queue_for_objective: usize,
    /// The engine waiting token limit per rank for the first-token
    /// objective: [`sizing::token_budget`](crate::sizing::token_budget) of
    /// the objective and the engine's prefill rate,
    /// [`EngineConfig::prefill_tokens_per_second`] (a full chunked-prefill
    /// step, from the step-time model).
    pub token_budget: usize,
}

impl Calibration {
    /// The load of the sizing run, as a multiple of capacity: a high,
    /// steady load that meets the objectives.
    pub const LOAD: f64 = 0.9;

    /// Measures the capacity, then sizes the gate with a
    /// [`Sampler`] on a run at [`Self::LOAD`] ×
    /// capacity (every request ranked, patient clients).
    pub fn measure(config: &SweepConfig) -> Calibration {
        let capacity = measure_capacity(config);
        let estimate = VirtualRuntime::new().block_on(sizing_run(config, capacity));
        let per_rank = capacity / config.engine.dp_ranks as f64;
        let slack = config.slo.ttft.saturating_sub(estimate.mean_wait()) / 2;
        let queue_for_objective = (per_rank * slack.as_secs_f64()).floor() as usize;
        Calibration {
            capacity,
            estimate,
            waiting_limit: estimate.waiting_limit(),
            queue_for_objective,
            token_budget: token_budget(config.slo.ttft, config.engine.prefill_tokens_per_second()),
        }
    }
}

/// The gate's configuration for a gate `system`; `None` for the others.
///
/// This is where rows for the gate's settings go: add a [`System`]
/// variant (to [`System::ALL`] too) and its configuration here. A
/// request's descriptor is built in `admit`, where the gate is asked.
pub fn gate_config(
    system: System,
    config: &SweepConfig,
    calibration: &Calibration,
) -> Option<AdmissionConfig> {
    match system {
        System::Gate => Some(config.gate.clone()),
        System::GateLittlesLaw => Some(
            config
                .gate
                .clone()
                .engine_request_waiting_limit(calibration.waiting_limit),
        ),
        System::GateSizedForObjective => Some(
            config
                .gate
                .clone()
                .engine_request_waiting_limit(calibration.waiting_limit)
                .request_queue_limit(calibration.queue_for_objective),
        ),
        // The objective is the run's own; the gate measures queue waits and
        // engine waiting times on the simulator's (virtual) clock.
        System::GateTtftObjective => Some(
            config
                .gate
                .clone()
                .ttft_objective(config.slo.ttft)
                .clock(|| time::now().into_std()),
        ),
        System::GateTokenBudget => Some(
            config
                .gate
                .clone()
                .engine_waiting_token_limit(calibration.token_budget),
        ),
        System::NoAdmission | System::ConcurrencyLimit | System::TgiSemaphore | System::VllmCap => {
            None
        }
    }
}

/// Measures the engine's capacity in requests per second: `max_num_seqs`
/// closed-loop clients per rank keep it full with the sweep's request
/// lengths, and completions are counted over three windows after the
/// warm-up (virtual time is cheap; a longer count is a steadier one).
pub fn measure_capacity(config: &SweepConfig) -> f64 {
    VirtualRuntime::new().block_on(async {
        let engine = SimEngine::new(config.engine.clone());
        let ranks = config.engine.dp_ranks;
        let requests = Arc::new(Mutex::new(config.workload(1.0).arrivals(config.seed)));
        let completed = Arc::new(AtomicUsize::new(0));
        let window = config.window * 3;
        let window_start = time::now() + config.warmup;
        let window_end = window_start + window;
        for client in 0..config.engine.max_num_seqs * ranks {
            let engine = engine.clone();
            let requests = Arc::clone(&requests);
            let completed = Arc::clone(&completed);
            time::spawn(async move {
                loop {
                    let next = lock(&requests).next().expect("arrivals never end");
                    let request = Request {
                        prompt_tokens: next.prompt_tokens,
                        output_tokens: next.output_tokens,
                        rank: Some((client % ranks) as u32),
                    };
                    let Ok(mut stream) = engine.submit(request) else {
                        return;
                    };
                    while let Some(token) = stream.next_token().await {
                        let now = time::now();
                        if token.last && now >= window_start && now < window_end {
                            completed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
        time::sleep_until(window_end).await;
        completed.load(Ordering::Relaxed) as f64 / window.as_secs_f64()
    })
}

/// The Little's-law run of [`Calibration::measure`].
async fn sizing_run(config: &SweepConfig, capacity: f64) -> Estimate {
    let engine = SimEngine::new(config.engine.clone());
    let huge = 1 << 20;
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(huge)
            .engine_request_waiting_limit(huge)
            .request_queue_limit(0),
    );
    engine.report_to(&gate);
    let ranks = config.engine.dp_ranks;
    let start = time::now();
    let arrivals = config
        .workload(Calibration::LOAD * capacity)
        .arrivals(config.seed ^ 0x5eed);
    {
        let gate = gate.clone();
        let engine = engine.clone();
        time::spawn(async move {
            for (index, arrival) in arrivals.enumerate() {
                time::sleep_until(start + arrival.at).await;
                let Ok(mut permit) = gate.acquire(Some((index % ranks) as u32)).await else {
                    continue;
                };
                let request = Request {
                    prompt_tokens: arrival.prompt_tokens,
                    output_tokens: arrival.output_tokens,
                    rank: permit.rank(),
                };
                let Ok(mut stream) = engine.submit(request) else {
                    continue;
                };
                time::spawn(async move {
                    if stream.next_token().await.is_some() {
                        permit.first_token();
                        while stream.next_token().await.is_some() {}
                    }
                    drop(permit);
                });
            }
        });
    }
    time::sleep_until(start + config.warmup).await;
    let mut sampler = Sampler::rank(0);
    let every = Duration::from_millis(10);
    let end = start + config.warmup + config.window;
    let mut at = time::now();
    while at <= end {
        sampler.record(&gate.snapshot(), at.into_std());
        at += every;
        time::sleep_until(at).await;
    }
    sampler.estimate().unwrap_or_else(|error| {
        panic!(
            "the sizing run at {}x did not measure the engine alone: {error}",
            Calibration::LOAD
        )
    })
}

/// Runs every system at every load, `config.threads` points at a time, and
/// calls `on_point` as each finishes (from the thread that ran it).
pub fn run(
    config: &SweepConfig,
    calibration: &Calibration,
    on_point: impl Fn(&Point) + Sync,
) -> Sweep {
    let jobs: Vec<(System, f64)> = config
        .systems
        .iter()
        .flat_map(|&system| config.loads.iter().map(move |&load| (system, load)))
        .collect();
    let next = AtomicUsize::new(0);
    let results = Mutex::new(vec![None; jobs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..config.threads.clamp(1, jobs.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(system, load)) = jobs.get(index) else {
                        break;
                    };
                    let point = run_point(config, calibration, system, load);
                    on_point(&point);
                    lock(&results)[index] = Some(point);
                }
            });
        }
    });
    let points = results
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner)
        .into_iter()
        .map(|point| point.expect("every job ran"))
        .collect();
    Sweep {
        calibration: *calibration,
        points,
    }
}

/// Runs one system at `load` × capacity requests per second, on a fresh
/// engine in virtual time.
pub fn run_point(
    config: &SweepConfig,
    calibration: &Calibration,
    system: System,
    load: f64,
) -> Point {
    VirtualRuntime::new().block_on(simulate(config, calibration, system, load))
}

/// The system in front of the engine, as each client sees it.
#[derive(Clone)]
enum Front {
    Direct(SimEngine),
    Limited(ConcurrencyLimit<SimEngine>),
    /// A semaphore taken without waiting and held to the end of the stream
    /// (TGI's router, and a cap on requests in flight).
    Held(Arc<Semaphore>, SimEngine),
    Gate(Gate, SimEngine),
}

/// What a request holds while it streams.
enum Hold {
    Nothing,
    Semaphore(#[allow(dead_code)] OwnedSemaphorePermit),
    Gate(Permit),
}

/// A send that got through to its first token, or did not.
enum Started {
    Streaming {
        stream: TokenStream,
        hold: Hold,
        first: Token,
    },
    Rejected,
    /// The engine refused it or stopped: not good, and not a rejection by
    /// the system under test.
    Failed,
}

impl Front {
    async fn start(self, request: Request) -> Started {
        match self {
            Front::Direct(engine) => first_token(engine.submit(request), Hold::Nothing).await,
            Front::Limited(mut limit) => {
                // `ServiceExt::oneshot`, spelled out: wait for a permit, call,
                // and the permit goes when the response future resolves.
                if std::future::poll_fn(|cx| limit.poll_ready(cx))
                    .await
                    .is_err()
                {
                    return Started::Failed;
                }
                first_token(limit.call(request).await, Hold::Nothing).await
            }
            Front::Held(semaphore, engine) => match semaphore.try_acquire_owned() {
                Ok(permit) => first_token(engine.submit(request), Hold::Semaphore(permit)).await,
                Err(_) => Started::Rejected,
            },
            Front::Gate(gate, engine) => match admit(&gate, request).await {
                Ok(permit) => {
                    let request = Request {
                        rank: permit.rank().or(request.rank),
                        ..request
                    };
                    first_token(engine.submit(request), Hold::Gate(permit)).await
                }
                Err(_overloaded) => Started::Rejected,
            },
        }
    }
}

/// Asks the gate for `request` ([`descriptor_of`], [`acquire`]).
async fn admit(gate: &Gate, request: Request) -> Result<Permit, crate::Overloaded> {
    acquire(gate, descriptor_of(request)).await
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
) -> Result<Permit, crate::Overloaded> {
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

async fn first_token(submitted: Result<TokenStream, SubmitError>, mut hold: Hold) -> Started {
    let Ok(mut stream) = submitted else {
        return Started::Failed;
    };
    match stream.next_token().await {
        Some(first) => {
            if let Hold::Gate(permit) = &mut hold {
                permit.first_token();
            }
            Started::Streaming {
                stream,
                hold,
                first,
            }
        }
        None => Started::Failed,
    }
}

/// What became of the requests of the measurement window.
#[derive(Default)]
struct Ledger {
    records: Vec<Record>,
    /// Window requests not yet completed, rejected, given up, failed or
    /// late.
    open: usize,
    /// Whether arrivals have gone past the end of the window.
    window_over: bool,
    /// The longest engine waiting queue seen at an arrival.
    engine_queue_peak: usize,
}

struct Record {
    arrival: Instant,
    prompt_tokens: usize,
    sends: usize,
    rejected: bool,
    abandoned: bool,
    first_token: Option<Instant>,
    finished: Option<Instant>,
    tokens: usize,
    /// Counted out of `open` (done, or past its first-token objective).
    resolved: bool,
}

/// A client's handle on its line of the ledger, if it arrived in the window.
struct Entry {
    ledger: Arc<Mutex<Ledger>>,
    index: usize,
    notify: Arc<Notify>,
}

impl Entry {
    fn update(&self, f: impl FnOnce(&mut Record)) {
        f(&mut lock(&self.ledger).records[self.index]);
    }

    /// The request's fate is settled for goodput: the run need not wait for
    /// it any longer.
    fn resolve(&self) {
        let mut ledger = lock(&self.ledger);
        let record = &mut ledger.records[self.index];
        if !record.resolved {
            record.resolved = true;
            ledger.open -= 1;
            if ledger.open == 0 && ledger.window_over {
                self.notify.notify_one();
            }
        }
    }
}

/// The retry budget all clients of a run share: a token bucket.
struct RetryBudget {
    retry: Retry,
    balance: Mutex<f64>,
}

impl RetryBudget {
    fn new(retry: Retry) -> RetryBudget {
        RetryBudget {
            retry,
            balance: Mutex::new(retry.budget_reserve),
        }
    }

    fn deposit(&self) {
        let mut balance = lock(&self.balance);
        *balance = (*balance + self.retry.budget_ratio).min(self.retry.budget_reserve);
    }

    fn withdraw(&self) -> bool {
        let mut balance = lock(&self.balance);
        if *balance >= 1.0 {
            *balance -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What a client's sends came to before any first token.
enum Fate {
    Started(Started),
    /// Given up at the client's deadline: every send was cancelled.
    Abandoned,
}

async fn simulate(
    config: &SweepConfig,
    calibration: &Calibration,
    system: System,
    load: f64,
) -> Point {
    let engine = SimEngine::new(config.engine.clone());
    let front = match system {
        System::NoAdmission => Front::Direct(engine.clone()),
        System::ConcurrencyLimit => {
            Front::Limited(ConcurrencyLimit::new(engine.clone(), config.total_seqs()))
        }
        System::TgiSemaphore => Front::Held(
            Arc::new(Semaphore::new(config.tgi_permits())),
            engine.clone(),
        ),
        System::VllmCap => Front::Held(Arc::new(Semaphore::new(config.vllm_cap())), engine.clone()),
        System::Gate
        | System::GateLittlesLaw
        | System::GateSizedForObjective
        | System::GateTtftObjective
        | System::GateTokenBudget => {
            let gate = Gate::new(gate_config(system, config, calibration).expect("a gate system"));
            engine.report_to(&gate);
            Front::Gate(gate, engine.clone())
        }
    };
    let capacity = calibration.capacity;
    let offered = load * capacity;
    let start = time::now();
    let window_start = start + config.warmup();
    let window_end = window_start + config.window;
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let notify = Arc::new(Notify::new());
    let ranks = config.engine.dp_ranks;
    let budget = match config.clients {
        Clients::Retry(retry) => Some(Arc::new(RetryBudget::new(retry))),
        _ => None,
    };

    let arrivals = config.workload(offered).arrivals(config.seed);
    let ranked_fraction = config.ranked;
    let clients = config.clients;
    let slo = config.slo;
    let seed = config.seed;
    time::spawn({
        let ledger = Arc::clone(&ledger);
        let notify = Arc::clone(&notify);
        let engine = engine.clone();
        async move {
            let mut ranked = 0usize;
            for (index, arrival) in arrivals.enumerate() {
                let at = start + arrival.at;
                time::sleep_until(at).await;
                let engine_queue = engine.stats().waiting;
                let entry = {
                    let mut ledger_now = lock(&ledger);
                    ledger_now.engine_queue_peak = ledger_now.engine_queue_peak.max(engine_queue);
                    if at < window_start {
                        None
                    } else if at < window_end {
                        ledger_now.records.push(Record {
                            arrival: at,
                            prompt_tokens: arrival.prompt_tokens,
                            sends: 0,
                            rejected: false,
                            abandoned: false,
                            first_token: None,
                            finished: None,
                            tokens: 0,
                            resolved: false,
                        });
                        ledger_now.open += 1;
                        Some(Entry {
                            ledger: Arc::clone(&ledger),
                            index: ledger_now.records.len() - 1,
                            notify: Arc::clone(&notify),
                        })
                    } else {
                        if !ledger_now.window_over {
                            ledger_now.window_over = true;
                            notify.notify_one();
                        }
                        None
                    }
                };
                // Low-discrepancy choice of the ranked requests, round-robin
                // over the ranks among them.
                let rank = if (index as f64 * 0.618_033_988_749_895).fract() < ranked_fraction {
                    ranked += 1;
                    Some(((ranked - 1) % ranks) as u32)
                } else {
                    None
                };
                let request = Request {
                    prompt_tokens: arrival.prompt_tokens,
                    output_tokens: arrival.output_tokens,
                    rank,
                };
                if let Some(budget) = &budget {
                    budget.deposit();
                }
                let rng = StdRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9e37_79b9));
                time::spawn(client(
                    front.clone(),
                    request,
                    Behaviour {
                        clients,
                        budget: budget.clone(),
                        rng,
                        slo,
                    },
                    at,
                    entry,
                ));
            }
        }
    });

    loop {
        {
            let ledger = lock(&ledger);
            if ledger.window_over && ledger.open == 0 {
                break;
            }
        }
        notify.notified().await;
    }
    let end = time::now();
    // The arrivals and the clients still running go with the runtime.
    let ledger = lock(&ledger);
    let mut outcomes = Outcomes::of(&ledger.records, config.slo, end);
    let class = |long: bool| {
        let records: Vec<&Record> = ledger
            .records
            .iter()
            .filter(|record| (record.prompt_tokens >= config.long_prompt_tokens) == long)
            .collect();
        let mut outcomes = Outcomes::of(records.iter().copied(), config.slo, end);
        Class {
            arrived: records.len(),
            rejected: outcomes.rejected,
            good: outcomes.good,
            goodput: outcomes.good as f64 / config.window.as_secs_f64(),
            ttft_p50: Percentile::of(&mut outcomes.ttfts, 0.50),
            ttft_p99: Percentile::of(&mut outcomes.ttfts, 0.99),
        }
    };
    let goodput = outcomes.good as f64 / config.window.as_secs_f64();
    let stats = engine.stats();
    Point {
        system,
        load,
        offered,
        arrived: ledger.records.len(),
        sends: outcomes.sends,
        rejected: outcomes.rejected,
        abandoned: outcomes.abandoned,
        completed: outcomes.completed,
        good: outcomes.good,
        goodput,
        capacity_fraction: goodput / capacity,
        ttft_p50: Percentile::of(&mut outcomes.ttfts, 0.50),
        ttft_p99: Percentile::of(&mut outcomes.ttfts, 0.99),
        tpot_p50: Percentile::of(&mut outcomes.tpots, 0.50).map(|p| p.value),
        tpot_p99: Percentile::of(&mut outcomes.tpots, 0.99).map(|p| p.value),
        preemptions: stats.preemptions,
        engine_cancelled: stats.cancelled,
        engine_queue_peak: ledger.engine_queue_peak,
        simulated: end - start,
        short: class(false),
        long: class(true),
    }
}

/// How a client behaves, and what it needs for that.
struct Behaviour {
    clients: Clients,
    budget: Option<Arc<RetryBudget>>,
    rng: StdRng,
    slo: Slo,
}

/// Sends until the request starts, is rejected for good, or (for clients
/// that give up) the client's patience ends.
async fn sends(
    front: Front,
    request: Request,
    behaviour: &mut Behaviour,
    arrival: Instant,
    entry: Option<&Entry>,
) -> Fate {
    let ttft_deadline = arrival + behaviour.slo.ttft;
    let mut retries = 0u32;
    loop {
        if let Some(entry) = entry {
            entry.update(|record| record.sends += 1);
        }
        let started = front.clone().start(request).await;
        let Started::Rejected = started else {
            return Fate::Started(started);
        };
        let Clients::Retry(retry) = behaviour.clients else {
            return Fate::Started(Started::Rejected);
        };
        if retries >= retry.max_retries {
            return Fate::Started(Started::Rejected);
        }
        let cap = retry
            .first_backoff
            .saturating_mul(1 << retries.min(20))
            .min(retry.max_backoff);
        let backoff = cap.mul_f64(behaviour.rng.random::<f64>());
        let resend = time::now() + backoff;
        // A retry that could only start after the objective is not worth
        // sending; nor is one the budget cannot pay for.
        if resend >= ttft_deadline {
            return Fate::Started(Started::Rejected);
        }
        let paid = behaviour
            .budget
            .as_ref()
            .is_some_and(|budget| budget.withdraw());
        if !paid {
            return Fate::Started(Started::Rejected);
        }
        retries += 1;
        time::sleep_until(resend).await;
    }
}

/// One client: sends its request (again, if it retries), then reads its
/// tokens to the end, noting what happened in its ledger entry.
async fn client(
    front: Front,
    request: Request,
    mut behaviour: Behaviour,
    arrival: Instant,
    entry: Option<Entry>,
) {
    let ttft_deadline = arrival + behaviour.slo.ttft;
    let give_up = match behaviour.clients {
        Clients::GiveUp { after } => Some(arrival + after),
        _ => None,
    };
    let fate = async {
        let sends = sends(front, request, &mut behaviour, arrival, entry.as_ref());
        match give_up {
            // Dropping the sends at the deadline cancels them: a queued
            // request leaves its queue, an admitted one the engine.
            Some(deadline) => time::timeout_at(deadline, sends)
                .await
                .unwrap_or(Fate::Abandoned),
            None => sends.await,
        }
    };
    let mut fate = pin!(fate);
    let fate = match &entry {
        None => fate.await,
        Some(entry) => match time::timeout_at(ttft_deadline, fate.as_mut()).await {
            Some(fate) => fate,
            None => {
                // Too late to be good: the run need not wait for it, but the
                // client still waits, and the engine still works for it.
                entry.resolve();
                fate.await
            }
        },
    };
    let (mut stream, hold, first) = match fate {
        Fate::Started(Started::Streaming {
            stream,
            hold,
            first,
        }) => (stream, hold, first),
        Fate::Started(Started::Rejected) => {
            if let Some(entry) = &entry {
                entry.update(|record| record.rejected = true);
                entry.resolve();
            }
            return;
        }
        Fate::Abandoned => {
            if let Some(entry) = &entry {
                entry.update(|record| record.abandoned = true);
                entry.resolve();
            }
            return;
        }
        Fate::Started(Started::Failed) => {
            if let Some(entry) = &entry {
                entry.resolve();
            }
            return;
        }
    };
    if let Some(entry) = &entry {
        let now = time::now();
        entry.update(|record| record.first_token = Some(now));
    }
    let mut tokens = 1;
    let mut last = first.last;
    while !last {
        match stream.next_token().await {
            Some(token) => {
                tokens += 1;
                last = token.last;
            }
            None => break,
        }
    }
    // The response ends: the gate's or the semaphore's capacity goes back.
    drop(hold);
    if let Some(entry) = &entry {
        let now = time::now();
        entry.update(|record| {
            record.finished = Some(now);
            record.tokens = tokens;
        });
        entry.resolve();
    }
}

/// Counts over the records of the window.
struct Outcomes {
    sends: usize,
    rejected: usize,
    abandoned: usize,
    completed: usize,
    good: usize,
    /// Time to first token of each request that was admitted and not given
    /// up, and whether it is only a lower bound (no first token when the
    /// run ended).
    ttfts: Vec<(Duration, bool)>,
    /// Time per output token of each completed request.
    tpots: Vec<(Duration, bool)>,
}

impl Outcomes {
    fn of<'a>(records: impl IntoIterator<Item = &'a Record>, slo: Slo, end: Instant) -> Outcomes {
        let mut outcomes = Outcomes {
            sends: 0,
            rejected: 0,
            abandoned: 0,
            completed: 0,
            good: 0,
            ttfts: Vec::new(),
            tpots: Vec::new(),
        };
        for record in records {
            outcomes.sends += record.sends;
            if record.rejected {
                outcomes.rejected += 1;
                continue;
            }
            if record.abandoned {
                outcomes.abandoned += 1;
                continue;
            }
            let ttft = match record.first_token {
                Some(first) => (first - record.arrival, false),
                None => (end - record.arrival, true),
            };
            outcomes.ttfts.push(ttft);
            let (Some(first), Some(finished)) = (record.first_token, record.finished) else {
                continue;
            };
            outcomes.completed += 1;
            let gaps = u32::try_from(record.tokens.saturating_sub(1)).unwrap_or(u32::MAX);
            let tpot = (finished - first).checked_div(gaps).unwrap_or_default();
            outcomes.tpots.push((tpot, false));
            if ttft.0 <= slo.ttft && tpot <= slo.tpot {
                outcomes.good += 1;
            }
        }
        outcomes
    }
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

    #[test]
    fn the_retry_budget_is_a_bucket_of_earned_retries() {
        let budget = RetryBudget::new(Retry {
            budget_reserve: 2.0,
            budget_ratio: 0.5,
            ..Retry::default()
        });
        assert!(budget.withdraw());
        assert!(budget.withdraw());
        assert!(!budget.withdraw());
        budget.deposit();
        assert!(!budget.withdraw());
        budget.deposit();
        assert!(budget.withdraw());
        for _ in 0..10 {
            budget.deposit();
        }
        // The bucket holds at most its reserve.
        assert!(budget.withdraw() && budget.withdraw() && !budget.withdraw());
    }
}
