//! The overload sweep behind `examples/overload.rs`: offered load from below
//! to far above the engine's capacity, for three systems in front of the
//! same simulated engine, in virtual time.
//!
//! | [`System`] | in front of the engine |
//! |---|---|
//! | [`NoAdmission`](System::NoAdmission) | nothing: every request joins the engine's own unbounded queue |
//! | [`ConcurrencyLimit`](System::ConcurrencyLimit) | `tower::limit::ConcurrencyLimit` with `max_num_seqs × dp_ranks` permits. Its permit is released when the response future resolves — at the response headers, as soon as the engine has queued the request — so it never holds back a streaming engine |
//! | [`Gate`](System::Gate) | a [`Gate`] with [`SweepConfig::gate`] (defaults: every limit follows the engine's report): `acquire` before the engine, [`Permit::first_token`] at the first token, the permit dropped at the end of the stream; rejections answered at once |
//!
//! Each point is one run on its own [`VirtualRuntime`], so the
//! whole sweep is deterministic for a seed, and the runs are spread over
//! threads. Clients are open-loop and patient: they never give up on a
//! request and never retry a rejection.
//!
//! **Goodput** is the rate of requests that arrived in the measurement
//! window and completed within both objectives of [`Slo`]: time to first
//! token (from arrival, so queueing in front of the engine counts) and
//! time per output token (the mean gap between tokens after the first). A
//! rejected request is never good. A run lasts until every request of the
//! window has completed, been rejected, or missed its first-token objective;
//! arrivals go on until then, so the load stays the same to the end.
//!
//! The default objectives, TTFT ≤ 10 s and TPOT ≤ 100 ms, reflect one
//! consequence of the gate's default queue limit (`2 × max_num_seqs`): at
//! saturation a request waits for about two engine-lifetimes of the
//! requests ahead of it (≈ 6–7 s with the default engine and ShareGPT-like
//! requests). A tighter first-token objective, such as MLPerf's 2 s for this
//! model, needs a shorter queue: set [`SweepConfig::gate`] (or
//! `--queue-limit` in the example).

use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tower::Service;
use tower::limit::ConcurrencyLimit;

use super::config::{EngineConfig, Token};
use super::engine::{Request, SimEngine, SubmitError, TokenStream};
use super::time::{self, VirtualRuntime};
use super::workload::{Lengths, Workload};
use crate::{AdmissionConfig, Gate, Permit};

/// What stands between the clients and the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum System {
    /// Nothing: requests go straight into the engine's queue.
    NoAdmission,
    /// `tower::limit::ConcurrencyLimit` around the engine's `Service`.
    ConcurrencyLimit,
    /// This crate's [`Gate`].
    Gate,
}

impl System {
    /// The three systems, in table order.
    pub const ALL: [System; 3] = [System::NoAdmission, System::ConcurrencyLimit, System::Gate];

    /// A short name for tables and plots.
    pub fn name(&self) -> &'static str {
        match self {
            System::NoAdmission => "no admission control",
            System::ConcurrencyLimit => "tower ConcurrencyLimit",
            System::Gate => "tower-admission Gate",
        }
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
    /// Time to first token, from arrival.
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

/// Everything a sweep depends on.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// The simulated engine.
    pub engine: EngineConfig,
    /// The gate's configuration for [`System::Gate`]; the engine reports its
    /// capacity to the gate at start.
    pub gate: AdmissionConfig,
    /// Gamma shape of the arrival gaps (1 = Poisson).
    pub burstiness: f64,
    /// Prompt lengths.
    pub prompt_tokens: Lengths,
    /// Output lengths.
    pub output_tokens: Lengths,
    /// Offered loads, as multiples of the engine's capacity.
    pub loads: Vec<f64>,
    /// The systems to compare.
    pub systems: Vec<System>,
    /// What makes a request good.
    pub slo: Slo,
    /// Time from the start before measured arrivals begin.
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
    /// ShareGPT-like Poisson traffic, loads 0.5× to 4× in steps of 0.5, a
    /// 10 s warm-up and a 40 s window, all three systems, seed 1.
    fn default() -> Self {
        SweepConfig {
            engine: EngineConfig::default(),
            gate: AdmissionConfig::new(),
            burstiness: 1.0,
            prompt_tokens: Lengths::sharegpt_prompt(),
            output_tokens: Lengths::sharegpt_output(),
            loads: vec![0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0],
            systems: System::ALL.to_vec(),
            slo: Slo::default(),
            warmup: Duration::from_secs(10),
            window: Duration::from_secs(40),
            seed: 1,
            threads: std::thread::available_parallelism().map_or(1, usize::from),
        }
    }
}

impl SweepConfig {
    /// A quick sweep for tests: an engine of 64 sequences (a quarter of the
    /// work per simulated second), loads 0.5×, 1×, 2× and 4×, a 5 s warm-up
    /// and a 20 s window.
    pub fn fast() -> Self {
        SweepConfig {
            engine: EngineConfig {
                max_num_seqs: 64,
                ..EngineConfig::default()
            },
            loads: vec![0.5, 1.0, 2.0, 4.0],
            warmup: Duration::from_secs(5),
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
    fn of(samples: &mut [(Duration, bool)], quantile: f64) -> Option<Percentile> {
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
    /// Offered load, requests per second.
    pub offered: f64,
    /// Requests that arrived in the window.
    pub arrived: usize,
    /// Of those, rejected by the system in front of the engine.
    pub rejected: usize,
    /// Of those, completed before the run ended.
    pub completed: usize,
    /// Of those, completed within both objectives.
    pub good: usize,
    /// Good requests per second of window.
    pub goodput: f64,
    /// Median time to first token of the requests that were not rejected.
    pub ttft_p50: Option<Percentile>,
    /// 99th percentile of the same.
    pub ttft_p99: Option<Percentile>,
    /// Preemptions in the engine over the whole run.
    pub preemptions: u64,
    /// The longest the engine's own waiting queue got over the run (sampled
    /// at each arrival): where the excess load waits without admission
    /// control.
    pub engine_queue_peak: usize,
    /// Simulated length of the run.
    pub simulated: Duration,
}

/// The result of a sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    /// The engine's measured capacity, requests per second.
    pub capacity: f64,
    /// Every point, system by system, load by load, in configuration order.
    pub points: Vec<Point>,
}

impl Sweep {
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

fn paused_runtime() -> VirtualRuntime {
    VirtualRuntime::new()
}

/// Measures the engine's capacity in requests per second: `max_num_seqs`
/// closed-loop clients per rank keep it full with the sweep's request
/// lengths, and completions are counted over the window after the warm-up.
pub fn measure_capacity(config: &SweepConfig) -> f64 {
    paused_runtime().block_on(async {
        let engine = SimEngine::new(config.engine.clone());
        let ranks = config.engine.dp_ranks;
        let requests = Arc::new(Mutex::new(config.workload(1.0).arrivals(config.seed)));
        let completed = Arc::new(AtomicUsize::new(0));
        let window_start = time::now() + config.warmup;
        let window_end = window_start + config.window;
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
        completed.load(Ordering::Relaxed) as f64 / config.window.as_secs_f64()
    })
}

/// Runs every system at every load, `config.threads` points at a time, and
/// calls `on_point` as each finishes (from the thread that ran it).
/// `capacity` (requests per second, from [`measure_capacity`]) turns loads
/// into rates.
pub fn run(config: &SweepConfig, capacity: f64, on_point: impl Fn(&Point) + Sync) -> Sweep {
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
                    let point = run_point(config, system, capacity, load);
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
    Sweep { capacity, points }
}

/// Runs one system at `load` × `capacity` requests per second, on a fresh
/// engine in virtual time.
pub fn run_point(config: &SweepConfig, system: System, capacity: f64, load: f64) -> Point {
    paused_runtime().block_on(simulate(config, system, capacity, load))
}

/// The system in front of the engine, as each client sees it.
#[derive(Clone)]
enum Front {
    Direct(SimEngine),
    Limited(ConcurrencyLimit<SimEngine>),
    Gate(Gate, SimEngine),
}

/// A request that got through to its first token, or did not.
enum Started {
    Streaming {
        stream: TokenStream,
        permit: Option<Permit>,
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
            Front::Direct(engine) => first_token(engine.submit(request), None).await,
            Front::Limited(mut limit) => {
                // `ServiceExt::oneshot`, spelled out: wait for a permit, call,
                // and the permit goes when the response future resolves.
                if std::future::poll_fn(|cx| limit.poll_ready(cx))
                    .await
                    .is_err()
                {
                    return Started::Failed;
                }
                first_token(limit.call(request).await, None).await
            }
            Front::Gate(gate, engine) => match gate.acquire(request.rank).await {
                Ok(permit) => first_token(engine.submit(request), Some(permit)).await,
                Err(_overloaded) => Started::Rejected,
            },
        }
    }
}

async fn first_token(
    submitted: Result<TokenStream, SubmitError>,
    mut permit: Option<Permit>,
) -> Started {
    let Ok(mut stream) = submitted else {
        return Started::Failed;
    };
    match stream.next_token().await {
        Some(first) => {
            if let Some(permit) = &mut permit {
                permit.first_token();
            }
            Started::Streaming {
                stream,
                permit,
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
    /// Window requests not yet completed, rejected, failed or late.
    open: usize,
    /// Whether arrivals have gone past the end of the window.
    window_over: bool,
    /// The longest engine waiting queue seen at an arrival.
    engine_queue_peak: usize,
}

struct Record {
    arrival: Instant,
    rejected: bool,
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

async fn simulate(config: &SweepConfig, system: System, capacity: f64, load: f64) -> Point {
    let engine = SimEngine::new(config.engine.clone());
    let front = match system {
        System::NoAdmission => Front::Direct(engine.clone()),
        System::ConcurrencyLimit => {
            let engine_capacity = engine.capacity();
            let permits = engine_capacity.max_num_seqs * engine_capacity.dp_ranks;
            Front::Limited(ConcurrencyLimit::new(engine.clone(), permits))
        }
        System::Gate => {
            let gate = Gate::new(config.gate.clone());
            engine.report_to(&gate);
            Front::Gate(gate, engine.clone())
        }
    };
    let offered = load * capacity;
    let start = time::now();
    let window_start = start + config.warmup;
    let window_end = window_start + config.window;
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let notify = Arc::new(Notify::new());
    let ranks = config.engine.dp_ranks;
    let ttft_objective = config.slo.ttft;

    let arrivals = config.workload(offered).arrivals(config.seed);
    time::spawn({
        let ledger = Arc::clone(&ledger);
        let notify = Arc::clone(&notify);
        let engine = engine.clone();
        async move {
            for (index, arrival) in arrivals.enumerate() {
                let at = start + arrival.at;
                time::sleep_until(at).await;
                let engine_queue = engine.stats().waiting;
                {
                    let mut ledger_now = lock(&ledger);
                    ledger_now.engine_queue_peak = ledger_now.engine_queue_peak.max(engine_queue);
                }
                let entry = if at < window_start {
                    None
                } else if at < window_end {
                    let mut ledger_now = lock(&ledger);
                    ledger_now.records.push(Record {
                        arrival: at,
                        rejected: false,
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
                    let mut ledger_now = lock(&ledger);
                    if !ledger_now.window_over {
                        ledger_now.window_over = true;
                        notify.notify_one();
                    }
                    None
                };
                let request = Request {
                    prompt_tokens: arrival.prompt_tokens,
                    output_tokens: arrival.output_tokens,
                    rank: Some((index % ranks) as u32),
                };
                let started = front.clone().start(request);
                time::spawn(client(started, at + ttft_objective, entry));
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
    // The generator goes on; it is dropped with the runtime.
    let ledger = lock(&ledger);
    let Outcomes {
        rejected,
        completed,
        good,
        mut ttfts,
    } = Outcomes::of(&ledger.records, config.slo, end);
    Point {
        system,
        load,
        offered,
        arrived: ledger.records.len(),
        rejected,
        completed,
        good,
        goodput: good as f64 / config.window.as_secs_f64(),
        ttft_p50: Percentile::of(&mut ttfts, 0.50),
        ttft_p99: Percentile::of(&mut ttfts, 0.99),
        preemptions: engine.stats().preemptions,
        engine_queue_peak: ledger.engine_queue_peak,
        simulated: end - start,
    }
}

/// One client: waits (without giving up) for its request to start, then
/// reads its tokens to the end, noting times in its ledger entry.
async fn client(
    started: impl Future<Output = Started>,
    ttft_deadline: Instant,
    entry: Option<Entry>,
) {
    let mut started = pin!(started);
    let started = match &entry {
        None => started.await,
        Some(entry) => match time::timeout_at(ttft_deadline, started.as_mut()).await {
            Some(started) => started,
            None => {
                // Too late to be good: the run need not wait for it, but the
                // client still waits, and the engine still works for it.
                entry.resolve();
                started.await
            }
        },
    };
    let (mut stream, permit, first) = match started {
        Started::Streaming {
            stream,
            permit,
            first,
        } => (stream, permit, first),
        Started::Rejected => {
            if let Some(entry) = &entry {
                entry.update(|record| record.rejected = true);
                entry.resolve();
            }
            return;
        }
        Started::Failed => {
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
    // The response ends: the gate's capacity goes back.
    drop(permit);
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
    rejected: usize,
    completed: usize,
    good: usize,
    /// Time to first token of each request that was not rejected, and
    /// whether it is only a lower bound (no first token when the run ended).
    ttfts: Vec<(Duration, bool)>,
}

impl Outcomes {
    fn of(records: &[Record], slo: Slo, end: Instant) -> Outcomes {
        let mut outcomes = Outcomes {
            rejected: 0,
            completed: 0,
            good: 0,
            ttfts: Vec::with_capacity(records.len()),
        };
        for record in records {
            if record.rejected {
                outcomes.rejected += 1;
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
            if ttft.0 <= slo.ttft && tpot <= slo.tpot {
                outcomes.good += 1;
            }
        }
        outcomes
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
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
