//! One point of the sweep in virtual time: the system in front of the
//! engine as each client sees it ([`Front`]), what clients do (patient,
//! retrying under a budget, giving up), the ledger of the measurement
//! window, and the engine's capacity measured closed-loop.

use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::Service;
use tower::limit::ConcurrencyLimit;

use super::super::config::Token;
use super::super::engine::{Request, SimEngine, SubmitError, TokenStream};
use super::super::measure::{Entry, Ledger, Percentile, Slo, acquire, descriptor_of, lock};
use super::super::time;
use super::*;
use tower_admission::{Gate, Permit};

/// Measures the engine's capacity in requests per second: `max_num_seqs`
/// closed-loop clients per rank keep it full with the sweep's request
/// lengths, and completions are counted over three windows after the
/// warm-up (virtual time is cheap; a longer count is a steadier one).
pub fn measure_capacity(config: &SweepConfig) -> f64 {
    super::super::capacity::measure(
        &config.engine,
        &config.workload(1.0),
        config.seed,
        config.warmup,
        config.window,
    )
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
async fn admit(gate: &Gate, request: Request) -> Result<Permit, tower_admission::Overloaded> {
    acquire(gate, descriptor_of(request)).await
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

/// What became of a request of the measurement window.
struct Record {
    arrival: Instant,
    prompt_tokens: usize,
    sends: usize,
    rejected: bool,
    abandoned: bool,
    first_token: Option<Instant>,
    finished: Option<Instant>,
    tokens: usize,
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

pub(super) async fn simulate(
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
        | System::GateTokenBudget
        | System::GateControlledDelay => {
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
    // A record is resolved once done, or past its first-token objective.
    let ledger = Ledger::new();
    let engine_queue_peak = Arc::new(AtomicUsize::new(0));
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
        let ledger = ledger.clone();
        let engine_queue_peak = Arc::clone(&engine_queue_peak);
        let engine = engine.clone();
        async move {
            let mut ranked = 0usize;
            for (index, arrival) in arrivals.enumerate() {
                let at = start + arrival.at;
                time::sleep_until(at).await;
                engine_queue_peak.fetch_max(engine.stats().waiting, Ordering::Relaxed);
                let entry = if at < window_start {
                    None
                } else if at < window_end {
                    Some(ledger.record(Record {
                        arrival: at,
                        prompt_tokens: arrival.prompt_tokens,
                        sends: 0,
                        rejected: false,
                        abandoned: false,
                        first_token: None,
                        finished: None,
                        tokens: 0,
                    }))
                } else {
                    ledger.close();
                    None
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

    ledger.settled().await;
    let end = time::now();
    // The arrivals and the clients still running go with the runtime.
    let records = ledger.take_records();
    let mut outcomes = Outcomes::of(&records, config.slo, end);
    let class = |long: bool| {
        let records: Vec<&Record> = records
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
        arrived: records.len(),
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
        engine_queue_peak: engine_queue_peak.load(Ordering::Relaxed),
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
    entry: Option<&Entry<Record>>,
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
    entry: Option<Entry<Record>>,
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

#[cfg(test)]
mod tests {
    use super::*;

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
