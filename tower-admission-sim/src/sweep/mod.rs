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
//! | [`Gate`](System::Gate) | a [`Gate`] with [`SweepConfig::gate`] (defaults: every limit follows the engine's report): `acquire` before the engine, [`Permit::first_token`](tower_admission::Permit::first_token) at the first token, the permit dropped at the end of the stream; rejections answered at once |
//! | [`GateLittlesLaw`](System::GateLittlesLaw) | the gate with its engine request waiting limit sized by Little's law ([`sizing`](tower_admission::sizing)) on a calibration run ([`Calibration`]) |
//! | [`GateSizedForObjective`](System::GateSizedForObjective) | the same, and a request queue limit sized by Little's law for the first-token objective: the queue a rank drains within the objective's slack |
//! | [`GateTtftObjective`](System::GateTtftObjective) | the gate with the run's first-token objective as its [`ttft_objective`](AdmissionConfig::ttft_objective), on the simulator's clock, and no queue tuning |
//! | [`GateTokenBudget`](System::GateTokenBudget) | the gate with an engine waiting token limit of [`Calibration::token_budget`]: the objective × the engine's prefill rate |
//! | [`GateControlledDelay`](System::GateControlledDelay) | the gate with controlled delay ([`AdmissionConfig::queue_delay_target`]) at [`CONTROLLED_DELAY_TARGET`] (50 ms), on the simulator's clock, and the default queue limit |
//!
//! The gate is asked with a [`Descriptor`](tower_admission::Descriptor): the request's rank and its
//! [`Cost`](tower_admission::Cost) (prompt tokens, and its output length as `max_tokens`). A
//! request queued with a wait budget ([`Acquire::expires_at`](tower_admission::Acquire::expires_at))
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
use std::time::Duration;

use super::config::EngineConfig;
use super::engine::{Request, SimEngine};
use super::time::{self, VirtualRuntime};
use super::workload::{Lengths, Workload};
use tower_admission::sizing::{Estimate, Sampler, token_budget};
use tower_admission::{AdmissionConfig, Gate};

pub use self::point::{Class, Point, Sweep};
pub use self::simulate::measure_capacity;
use self::simulate::simulate;
use super::measure::in_parallel;
pub use super::measure::{Percentile, Slo};

mod point;
mod simulate;

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
    /// The gate with controlled delay at [`CONTROLLED_DELAY_TARGET`], on
    /// the simulator's clock: a burst may queue, a standing queue is shed.
    GateControlledDelay,
}

/// The queue delay target of [`System::GateControlledDelay`].
pub const CONTROLLED_DELAY_TARGET: Duration = Duration::from_millis(50);

impl System {
    /// Every system, in table order.
    pub const ALL: [System; 10] = [
        System::NoAdmission,
        System::ConcurrencyLimit,
        System::TgiSemaphore,
        System::VllmCap,
        System::Gate,
        System::GateLittlesLaw,
        System::GateSizedForObjective,
        System::GateTtftObjective,
        System::GateTokenBudget,
        System::GateControlledDelay,
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
            System::GateControlledDelay => "gate, controlled delay",
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
                | System::GateControlledDelay
        )
    }
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
    let scenario = |name, description, edit: &dyn Fn(&mut SweepConfig)| {
        let mut config = base.clone();
        edit(&mut config);
        Scenario {
            name,
            description,
            config,
        }
    };
    // Prompts drawn from `lengths`, those of `long_prompt_tokens` or more
    // counted as long.
    let prompt_mix = |lengths: Lengths, long_prompt_tokens: usize| {
        move |c: &mut SweepConfig| {
            c.prompt_tokens = lengths;
            c.long_prompt_tokens = long_prompt_tokens;
        }
    };
    vec![
        scenario(
            "base",
            "Poisson arrivals, ShareGPT-like lengths, patient clients",
            &|_| {},
        ),
        scenario("bursty", "gamma arrivals, shape 0.25", &|c| {
            c.burstiness = 0.25
        }),
        scenario(
            "ranks",
            "4 ranks, half the requests ranked, half unranked",
            &|c| {
                c.engine.dp_ranks = 4;
                c.ranked = 0.5;
            },
        ),
        scenario(
            "long",
            "long-prompt mix: 1 in 5 prompts ~3000 tokens",
            &prompt_mix(Lengths::long_prompt_mix(), 1024),
        ),
        scenario(
            "long-docs",
            "long-document mix: 1 in 10 prompts of 8k-20k tokens",
            &prompt_mix(Lengths::long_document_mix(), 8192),
        ),
        scenario(
            "retry",
            "clients retry rejections: 3 retries, backoff 250 ms..4 s, budget 0.2/request",
            &|c| c.clients = Clients::Retry(Retry::default()),
        ),
        scenario(
            "give-up",
            "clients cancel at the TTFT objective without a first token",
            &|c| c.clients = Clients::GiveUp { after: c.slo.ttft },
        ),
    ]
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
    /// objective: [`sizing::token_budget`](tower_admission::sizing::token_budget) of
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
    let gate = config.gate.clone();
    // The gate measures queue waits and engine waiting times on the
    // simulator's (virtual) clock.
    let timed = |gate: AdmissionConfig| gate.clock(|| time::now().into_std());
    match system {
        System::Gate => Some(gate),
        System::GateLittlesLaw => {
            Some(gate.engine_request_waiting_limit(calibration.waiting_limit))
        }
        System::GateSizedForObjective => Some(
            gate.engine_request_waiting_limit(calibration.waiting_limit)
                .request_queue_limit(calibration.queue_for_objective),
        ),
        // The objective is the run's own.
        System::GateTtftObjective => Some(timed(gate.ttft_objective(config.slo.ttft))),
        System::GateTokenBudget => Some(gate.engine_waiting_token_limit(calibration.token_budget)),
        System::GateControlledDelay => {
            Some(timed(gate.queue_delay_target(CONTROLLED_DELAY_TARGET)))
        }
        System::NoAdmission | System::ConcurrencyLimit | System::TgiSemaphore | System::VllmCap => {
            None
        }
    }
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
    let points = in_parallel(&jobs, config.threads, |&(system, load)| {
        let point = run_point(config, calibration, system, load);
        on_point(&point);
        point
    });
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
