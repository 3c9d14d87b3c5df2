//! One evaluation in virtual time: each traffic shape's capacity measured,
//! then every policy run against it, clients and their ledger.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::super::capacity;
use super::super::engine::{Request, SimEngine};
use super::super::measure::{self, Entry, Ledger};
use super::super::time::{self, VirtualRuntime};
use super::super::workload::{Lengths, Workload};
use super::*;
use tower_admission::{Descriptor, Gate, Permit, Tenant};

/// Measures each traffic shape's capacity, then runs every policy,
/// `config.threads` at a time.
pub fn run(config: &QosConfig) -> Evaluation {
    let capacities = capacities(config);
    let runs = measure::in_parallel(&config.policies, config.threads, |&policy| {
        VirtualRuntime::new().block_on(simulate(config, &capacities, policy))
    });
    Evaluation {
        config: config.clone(),
        capacities,
        runs,
    }
}

/// The engine's capacity for each traffic's shape alone (measured once per
/// distinct shape): a closed loop keeps the engine full for a 10 s
/// warm-up, then completions are counted for 30 s.
fn capacities(config: &QosConfig) -> Vec<f64> {
    let mut measured: Vec<((Lengths, Lengths), f64)> = Vec::new();
    config
        .traffic
        .iter()
        .map(|traffic| {
            if let Some((_, capacity)) =
                measured.iter().find(|(shape, _)| *shape == traffic.shape())
            {
                return *capacity;
            }
            let lengths = Workload {
                rate: 1.0,
                burstiness: 1.0,
                prompt_tokens: traffic.prompt_tokens,
                output_tokens: traffic.output_tokens,
            };
            let ten_seconds = Duration::from_secs(10);
            let capacity = capacity::measure(
                &config.engine,
                &lengths,
                config.seed,
                ten_seconds,
                ten_seconds,
            );
            measured.push((traffic.shape(), capacity));
            capacity
        })
        .collect()
}

async fn simulate(config: &QosConfig, capacities: &[f64], policy: Policy) -> Run {
    let engine = SimEngine::new(config.engine.clone());
    let gate = policy.gate_config(config).map(|gate_config| {
        let gate = Gate::new(gate_config);
        engine.report_to(&gate);
        gate
    });
    let start = time::now();
    let ledger = Ledger::new();
    let record_until = start + config.record_until;

    // One arrival task per traffic; all record into the same ledger.
    let remaining = Arc::new(AtomicUsize::new(config.traffic.len()));
    for (index, traffic) in config.traffic.iter().enumerate() {
        let workload = Workload {
            rate: traffic.load * capacities[index],
            burstiness: 1.0,
            prompt_tokens: traffic.prompt_tokens,
            output_tokens: traffic.output_tokens,
        };
        let arrivals = workload.arrivals(config.seed ^ (index as u64).wrapping_mul(0x9e37_79b9));
        let descriptor = if policy.uses_qos() {
            Descriptor::new()
                .with_priority(traffic.priority)
                .with_tenant(Tenant::new(traffic.tenant))
        } else {
            Descriptor::new()
        };
        let traffic_start = start + traffic.start;
        let (ledger, engine, gate) = (ledger.clone(), engine.clone(), gate.clone());
        let remaining = Arc::clone(&remaining);
        time::spawn(async move {
            let mut recording = true;
            for arrival in arrivals {
                let at = traffic_start + arrival.at;
                time::sleep_until(at).await;
                let request = Request {
                    prompt_tokens: arrival.prompt_tokens,
                    output_tokens: arrival.output_tokens,
                    rank: None,
                };
                let entry = if at < record_until {
                    Some(ledger.record(Outcome {
                        traffic: index,
                        arrival: at - start,
                        engine_tokens: request.prompt_tokens.max(1) + request.output_tokens.max(1),
                        admitted: None,
                        first_token: None,
                        finished: None,
                        tokens: 0,
                        rejected: None,
                    }))
                } else {
                    if recording {
                        recording = false;
                        // The last traffic past the line ends the recording.
                        if remaining.fetch_sub(1, Ordering::Relaxed) == 1 {
                            ledger.close();
                        }
                    }
                    None
                };
                let descriptor = descriptor.with_cost(measure::descriptor_of(request).cost);
                time::spawn(client(
                    engine.clone(),
                    gate.clone(),
                    request,
                    descriptor,
                    entry,
                    start,
                ));
            }
        });
    }

    // Every recorded request done, or the drain over: whichever is first.
    time::timeout_at(record_until + config.drain, ledger.settled()).await;
    let end = time::now() - start;
    let mut outcomes = ledger.take_records();
    outcomes.sort_by_key(|outcome| outcome.arrival);
    Run {
        policy,
        outcomes,
        end,
        preemptions: engine.stats().preemptions,
    }
}

/// One client: asks the gate (if any), sends its request to the engine
/// and reads its tokens to the end, noting each step in its entry with
/// the time since `start`.
async fn client(
    engine: SimEngine,
    gate: Option<Gate>,
    request: Request,
    descriptor: Descriptor,
    entry: Option<Entry<Outcome>>,
    start: Instant,
) {
    let note = |f: &dyn Fn(&mut Outcome, Duration)| {
        if let Some(entry) = &entry {
            let now = time::now() - start;
            entry.update(|outcome| f(outcome, now));
        }
    };
    let mut permit: Option<Permit> = None;
    if let Some(gate) = &gate {
        match measure::acquire(gate, descriptor).await {
            Ok(admitted) => permit = Some(admitted),
            Err(overloaded) => {
                note(&|outcome, now| outcome.rejected = Some((now, overloaded.reason())));
                if let Some(entry) = &entry {
                    entry.resolve();
                }
                return;
            }
        }
    }
    note(&|outcome, now| outcome.admitted = Some(now));
    let Ok(mut stream) = engine.submit(request) else {
        if let Some(entry) = &entry {
            entry.resolve();
        }
        return;
    };
    let mut tokens = 0;
    while let Some(token) = stream.next_token().await {
        tokens += 1;
        if tokens == 1 {
            note(&|outcome, now| outcome.first_token = Some(now));
            if let Some(permit) = &mut permit {
                permit.first_token();
            }
        }
        if token.last {
            break;
        }
    }
    drop(permit);
    note(&|outcome, now| {
        outcome.finished = Some(now);
        outcome.tokens = tokens;
    });
    if let Some(entry) = &entry {
        entry.resolve();
    }
}
