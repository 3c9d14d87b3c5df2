//! Quality of service in virtual time (behaviour §8): the seed's incident — chat
//! traffic at 60% of capacity, then batch summarisation at 200% — with no
//! admission control, the FIFO gate and the gate with priority bands; and
//! two tenants weighted 3:1, both overloading the engine.
//!
//! ```text
//! cargo run --release -p tower-admission-sim --example qos
//! cargo run --release -p tower-admission-sim --example qos -- --seed 2 --aging 30
//! ```
//!
//! Prints the tables and the goals, and writes a plot of chat TTFT over
//! time for each policy (default `target/qos-incident-chat-ttft.svg`). See
//! `tower_admission_sim::qos` for the experiment and its assumptions.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tower_admission_sim::qos::{self, Evaluation, Policy, QosConfig};
use tower_admission_sim::sweep::Percentile;

#[path = "plot/mod.rs"]
mod plot;

const USAGE: &str = "\
usage: qos [--seed N] [--aging SECONDS] [--wait-limit SECONDS]
           [--token-budget N] [--max-num-batched-tokens N] [--out DIR]
           [--threads N]

  --seed N           workload seed (default 1)
  --aging S          the QoS rows' aging interval (default 60)
  --wait-limit S     the wait-limit rows' queue wait limit (default 10;
                     the fairness scenario keeps 5)
  --token-budget N   the token-budget row's engine waiting token limit
                     (default 2048)
  --max-num-batched-tokens N
                     the simulated engine's chunked-prefill budget per step
                     (default 2048, vLLM's)
  --out DIR          where to write the plot (default target)
  --threads N        policies simulated in parallel (default: all cores)";

/// The goal on chat's tail: p95 TTFT after the batch starts within this
/// multiple of before.
const CHAT_TAIL: f64 = 1.5;
/// The goal on total goodput, as a fraction of capacity.
const TOTAL: f64 = 0.9;
/// The goal on weighted fairness: the admitted ratio within this fraction
/// of the weights' ratio.
const FAIR: f64 = 0.05;

struct Options {
    incident: QosConfig,
    fairness: QosConfig,
    out: PathBuf,
}

fn parse() -> Result<Options, String> {
    let mut incident = QosConfig::incident();
    let mut fairness = QosConfig::fairness();
    let mut out = PathBuf::from("target");
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let seconds = || -> Result<Duration, String> {
            value
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0)
                .map(Duration::from_secs_f64)
                .ok_or(format!("{flag}: {value:?} is not a positive number"))
        };
        let count = || -> Result<usize, String> {
            value
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or(format!("{flag}: {value:?} is not a positive integer"))
        };
        match flag.as_str() {
            "--seed" => {
                let seed = value
                    .parse()
                    .map_err(|_| format!("--seed: {value:?} is not an integer"))?;
                incident.seed = seed;
                fairness.seed = seed;
            }
            "--aging" => incident.aging_interval = Some(seconds()?),
            "--wait-limit" => incident.queue_wait_limit = seconds()?,
            "--token-budget" => incident.token_budget = count()?,
            "--batch-load" => incident.traffic[1].load = seconds()?.as_secs_f64(),
            "--max-num-batched-tokens" => {
                incident.engine.max_num_batched_tokens = count()?;
                fairness.engine.max_num_batched_tokens = incident.engine.max_num_batched_tokens;
            }
            "--out" => out = value.into(),
            "--threads" => {
                incident.threads = count()?;
                fairness.threads = incident.threads;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Options {
        incident,
        fairness,
        out,
    })
}

fn main() -> ExitCode {
    let Options {
        incident,
        fairness,
        out,
    } = match parse() {
        Ok(options) => options,
        Err(message) if message.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("error: {message}\n\n{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    let wall = Instant::now();
    let result = qos::run(&incident);
    print!("{}", incident_report(&result));
    if let Err(error) = std::fs::create_dir_all(&out) {
        eprintln!("error: cannot create {}: {error}", out.display());
        return ExitCode::FAILURE;
    }
    let path = out.join("qos-incident-chat-ttft.svg");
    if let Err(error) = std::fs::write(&path, ttft_plot(&result)) {
        eprintln!("error: cannot write {}: {error}", path.display());
        return ExitCode::FAILURE;
    }
    println!("plot: {}", path.display());
    print!("{}", interference_report(&incident));
    print!("{}", aging_report(&incident));

    let result = qos::run(&fairness);
    print!("{}", fairness_report(&result));
    println!("\n({:.1} s of wall time)", wall.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}

fn latency(p: Option<Percentile>) -> String {
    p.map_or("-".into(), |p| p.to_string())
}

fn incident_report(result: &Evaluation) -> String {
    let config = &result.config;
    let batch_start = config.start_of("batch");
    let warmup = Duration::from_secs(5);
    let (before_from, before_until) = (warmup, batch_start);
    let (after_from, after_until) = (batch_start, config.record_until);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## The incident: chat at {}x, then batch at {}x from {:?}\n",
        config.traffic[0].load, config.traffic[1].load, batch_start
    );
    let _ = writeln!(
        out,
        "capacity (each class alone, engine kept full): chat {:.1} req/s, batch {:.1} req/s; \
         chat good: TTFT <= {:?}, TPOT <= {:?}; batch good: TTFT <= {:?}, TPOT <= {:?}",
        result.capacity("chat"),
        result.capacity("batch"),
        config.traffic[0].slo.ttft,
        config.traffic[0].slo.tpot,
        config.traffic[1].slo.ttft,
        config.traffic[1].slo.tpot,
    );
    let _ = writeln!(
        out,
        "QoS rows: bands {:?}, aging {:?}; wait limit {:?}; token budget {}; seed {}\n",
        config.priority_bands,
        config.aging_interval,
        config.queue_wait_limit,
        config.token_budget,
        config.seed
    );
    let _ = writeln!(
        out,
        "| {:<26} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} | {:>6} | {:>8} | {:>8} | {:>6} | {:>9} | {:>7} | {:>10} | {:>7} |",
        "policy",
        "chat p50",
        "chat p95",
        "chat p50",
        "chat p95",
        "chat",
        "chat",
        "batch",
        "batch",
        "batch",
        "batch",
        "total",
        "longest",
        "engine",
    );
    let _ = writeln!(
        out,
        "| {:<26} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} | {:>6} | {:>8} | {:>8} | {:>6} | {:>9} | {:>7} | {:>10} | {:>7} |",
        "",
        "before",
        "before",
        "after",
        "after",
        "queue p95",
        "good",
        "admit/s",
        "good/s",
        "reject",
        "displaced",
        "goodput",
        "batch wait",
        "preempt",
    );
    let _ = writeln!(
        out,
        "|{}|----------:|----------:|----------:|----------:|----------:|-------:|---------:|---------:|-------:|----------:|--------:|-----------:|--------:|",
        "-".repeat(28)
    );
    for run in &result.runs {
        let policy = run.policy;
        let before = result.slice(policy, "chat", before_from, before_until);
        let chat = result.slice(policy, "chat", after_from, after_until);
        let batch = result.slice(policy, "batch", after_from, after_until);
        let total = result.total_goodput(policy, after_from, after_until);
        let _ = writeln!(
            out,
            "| {:<26} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} | {:>5.0}% | {:>8.1} | {:>8.1} | {:>5.0}% | {:>9} | {:>6.0}% | {:>10} | {:>7} |",
            policy.name(),
            latency(before.ttft_p50),
            latency(before.ttft_p95),
            latency(chat.ttft_p50),
            latency(chat.ttft_p95),
            latency(chat.queue_p95),
            100.0 * chat.good as f64 / chat.arrived.max(1) as f64,
            batch.admitted as f64 / (after_until - after_from).as_secs_f64(),
            batch.goodput,
            100.0 * batch.rejected as f64 / batch.arrived.max(1) as f64,
            batch.displaced,
            100.0 * total,
            latency(batch.longest_wait),
            run.preemptions,
        );
    }
    let _ = writeln!(
        out,
        "\nbefore: chat arrivals {before_from:?}..{before_until:?}; after: arrivals \
         {after_from:?}..{after_until:?}. TTFT of requests not rejected; \">\" marks a lower \
         bound (no first token when the run ended). total goodput: chat good/s over chat \
         capacity + batch good/s over batch capacity. longest batch wait: to a first token or \
         a rejection.\n"
    );
    let _ = writeln!(
        out,
        "goals (chat p95 TTFT after <= {CHAT_TAIL}x before; total goodput >= {:.0}% of capacity; \
         every batch request answered, and the longest wait of the last third of the window's \
         arrivals at most 1.25x the middle third's: it does not grow with the overload):",
        100.0 * TOTAL
    );
    for run in &result.runs {
        let policy = run.policy;
        let before = result.slice(policy, "chat", before_from, before_until);
        let chat = result.slice(policy, "chat", after_from, after_until);
        let batch = result.slice(policy, "batch", after_from, after_until);
        let total = result.total_goodput(policy, after_from, after_until);
        let (Some(p95_before), Some(p95_after)) = (before.ttft_p95, chat.ttft_p95) else {
            continue;
        };
        let ratio = p95_after.value.as_secs_f64() / p95_before.value.as_secs_f64();
        let tail = !p95_after.at_least && ratio <= CHAT_TAIL;
        let bounded = result.waits_bounded(policy, "batch", after_from, after_until);
        let (middle, last) = result.longest_waits(policy, "batch", after_from, after_until);
        let mark = |ok: bool| if ok { "yes" } else { "NO" };
        let _ = writeln!(
            out,
            "  {:<26} chat p95 {:.1}x {}; total {:.0}% {}; longest batch wait {} (middle / last \
             third {} / {}) {}",
            policy.name(),
            ratio,
            mark(tail),
            100.0 * total,
            mark(total >= TOTAL),
            latency(batch.longest_wait),
            latency(middle),
            latency(last),
            mark(bounded),
        );
    }
    out
}

/// The batch load against chat's tail and total goodput, with the gate's
/// best QoS row: what prefill interference inside the engine costs chat
/// however the gate orders its queue.
fn interference_report(incident: &QosConfig) -> String {
    let policy = Policy::GateQosTokenBudget;
    let batch_start = incident.start_of("batch");
    let mut out = format!(
        "\n## Prefill interference: chat's tail against the batch load ({})\n\n",
        policy.name()
    );
    let _ = writeln!(
        out,
        "| {:>10} | {:>9} | {:>9} | {:>9} | {:>10} | {:>7} |",
        "batch load", "chat p95", "chat p95", "x before", "batch", "total"
    );
    let _ = writeln!(
        out,
        "| {:>10} | {:>9} | {:>9} | {:>9} | {:>10} | {:>7} |",
        "", "before", "after", "", "good/s", "goodput"
    );
    let _ = writeln!(
        out,
        "|-----------:|----------:|----------:|----------:|-----------:|--------:|"
    );
    for load in [0.05, 0.1, 0.2, 0.5, 1.0, 2.0] {
        let mut config = incident.clone();
        config.traffic[1].load = load;
        config.policies = vec![policy];
        let result = qos::run(&config);
        let before = result.slice(policy, "chat", Duration::from_secs(5), batch_start);
        let after = result.slice(policy, "chat", batch_start, config.record_until);
        let batch = result.slice(policy, "batch", batch_start, config.record_until);
        let ratio = match (before.ttft_p95, after.ttft_p95) {
            (Some(b), Some(a)) => format!("{:.1}x", a.value.as_secs_f64() / b.value.as_secs_f64()),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "| {:>9}x | {:>9} | {:>9} | {:>9} | {:>10.1} | {:>6.0}% |",
            load,
            latency(before.ttft_p95),
            latency(after.ttft_p95),
            ratio,
            batch.goodput,
            100.0 * result.total_goodput(policy, batch_start, config.record_until),
        );
    }
    out
}

/// The aging interval against chat's tail and the batch's longest wait,
/// with QoS and the default queue (no wait limit).
fn aging_report(incident: &QosConfig) -> String {
    let policy = Policy::GateQos;
    let batch_start = incident.start_of("batch");
    let mut out = format!(
        "\n## Aging: chat's tail against the aging interval ({}, default queue)\n\n",
        policy.name()
    );
    let _ = writeln!(
        out,
        "| {:>8} | {:>9} | {:>9} | {:>6} | {:>10} | {:>10} | {:>7} |",
        "aging", "chat p50", "chat p95", "chat", "batch", "longest", "total"
    );
    let _ = writeln!(
        out,
        "| {:>8} | {:>9} | {:>9} | {:>6} | {:>10} | {:>10} | {:>7} |",
        "interval", "after", "after", "good", "good/s", "batch wait", "goodput"
    );
    let _ = writeln!(
        out,
        "|---------:|----------:|----------:|-------:|-----------:|-----------:|--------:|"
    );
    for aging in [None, Some(120), Some(60), Some(30), Some(20), Some(10)] {
        let mut config = incident.clone();
        config.aging_interval = aging.map(Duration::from_secs);
        config.policies = vec![policy];
        let result = qos::run(&config);
        let chat = result.slice(policy, "chat", batch_start, config.record_until);
        let batch = result.slice(policy, "batch", batch_start, config.record_until);
        let _ = writeln!(
            out,
            "| {:>8} | {:>9} | {:>9} | {:>5.0}% | {:>10.1} | {:>10} | {:>6.0}% |",
            aging.map_or("off".into(), |s| format!("{s} s")),
            latency(chat.ttft_p50),
            latency(chat.ttft_p95),
            100.0 * chat.good as f64 / chat.arrived.max(1) as f64,
            batch.goodput,
            latency(batch.longest_wait),
            100.0 * result.total_goodput(policy, batch_start, config.record_until),
        );
    }
    out
}

fn fairness_report(result: &Evaluation) -> String {
    let config = &result.config;
    let (from, until) = (Duration::from_secs(10), config.record_until);
    let weights: Vec<String> = config
        .tenant_weights
        .iter()
        .map(|(tenant, weight)| format!("{tenant}={weight}"))
        .collect();
    let mut out = format!(
        "\n## Weighted fairness: tenants a and b at {}x capacity each, weights {} (others 1)\n\n\
         admissions {from:?}..{until:?}; wait-limit row: {:?}; reject: of arrivals, any reason; \
         expired: of arrivals, rejected for the wait limit after waiting in the queue\n\n",
        config.traffic[0].load,
        weights.join(", "),
        config.queue_wait_limit
    );
    let _ = writeln!(
        out,
        "| {:<26} | {:>10} | {:>10} | {:>9} | {:>10} | {:>10} | {:>9} | {:>8} | {:>8} | {:>9} | {:>9} |",
        "policy",
        "a admitted",
        "b admitted",
        "a:b req",
        "a tokens",
        "b tokens",
        "a:b tok",
        "a reject",
        "b reject",
        "a expired",
        "b expired",
    );
    let _ = writeln!(
        out,
        "|{}|-----------:|-----------:|----------:|-----------:|-----------:|----------:|---------:|---------:|----------:|----------:|",
        "-".repeat(28)
    );
    for run in &result.runs {
        let policy = run.policy;
        let a = result.admitted(policy, "a", from, until);
        let b = result.admitted(policy, "b", from, until);
        let a_slice = result.slice(policy, "a", from, until);
        let b_slice = result.slice(policy, "b", from, until);
        let _ = writeln!(
            out,
            "| {:<26} | {:>10} | {:>10} | {:>9.2} | {:>10} | {:>10} | {:>9.2} | {:>7.0}% | {:>7.0}% | {:>8.0}% | {:>8.0}% |",
            policy.name(),
            a.requests,
            b.requests,
            a.requests as f64 / b.requests.max(1) as f64,
            a.tokens,
            b.tokens,
            a.tokens as f64 / b.tokens.max(1) as f64,
            100.0 * a_slice.rejected as f64 / a_slice.arrived.max(1) as f64,
            100.0 * b_slice.rejected as f64 / b_slice.arrived.max(1) as f64,
            100.0 * a_slice.expired as f64 / a_slice.arrived.max(1) as f64,
            100.0 * b_slice.expired as f64 / b_slice.arrived.max(1) as f64,
        );
    }
    let target = 3.0;
    let _ = writeln!(
        out,
        "\ngoal: admitted tokens a:b within {:.0}% of {target}:1 ({:.2}..{:.2})",
        100.0 * FAIR,
        target * (1.0 - FAIR),
        target * (1.0 + FAIR)
    );
    for run in result.runs.iter().filter(|run| run.policy.uses_qos()) {
        let a = result.admitted(run.policy, "a", from, until);
        let b = result.admitted(run.policy, "b", from, until);
        let ratio = a.tokens as f64 / b.tokens.max(1) as f64;
        let ok = (ratio / target - 1.0).abs() <= FAIR;
        let _ = writeln!(
            out,
            "  {:<26} {ratio:.2} {}",
            run.policy.name(),
            if ok { "yes" } else { "NO" }
        );
    }
    out
}

/// Line colours and strokes, one per policy.
fn style(policy: Policy) -> (&'static str, &'static str) {
    match policy {
        Policy::NoAdmission => ("#d62728", r#"stroke-width="5" stroke-opacity="0.5""#),
        Policy::Gate => ("#1f77b4", r#"stroke-width="2.5""#),
        Policy::GateQos => ("#ff7f0e", r#"stroke-width="2.5" stroke-dasharray="8,4""#),
        Policy::GateQosWaitLimit => ("#9467bd", r#"stroke-width="2""#),
        Policy::GateQosTokenBudget => ("#2ca02c", r#"stroke-width="2.5""#),
        Policy::GateTenantLimits => ("#8c564b", r#"stroke-width="2""#),
    }
}

/// Chat p95 TTFT in 2 s bins of arrival time, one line per policy, on a
/// log scale; dashed lines where the batch starts and at chat's objective.
fn ttft_plot(result: &Evaluation) -> String {
    let config = &result.config;
    let bin = Duration::from_secs(2);
    let series: Vec<plot::Series> = result
        .runs
        .iter()
        .map(|run| {
            let (color, stroke) = style(run.policy);
            let points = result
                .ttft_series(run.policy, "chat", bin, 0.95)
                .into_iter()
                .map(|(from, p)| {
                    let middle = (from + bin / 2).as_secs_f64();
                    (middle, p.value.as_secs_f64().max(0.001))
                })
                .collect();
            plot::Series {
                name: run.policy.name().to_owned(),
                color,
                stroke,
                points,
            }
        })
        .collect();
    let objective = config.traffic[0].slo.ttft.as_secs_f64();
    let values = series
        .iter()
        .flat_map(|series| series.points.iter().map(|p| p.1));
    let (low, high) = values.fold((objective, objective), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let x_max = config.record_until.as_secs_f64();
    let x_ticks = (0..=(x_max / 10.0) as u32)
        .map(|step| (f64::from(step) * 10.0, format!("{}", step * 10)))
        .collect();
    plot::render(&plot::Chart {
        title: format!(
            "chat p95 TTFT (2 s bins of arrival); batch at {}x from {:?}",
            config.traffic[1].load,
            config.start_of("batch"),
        ),
        x_label: "arrival time (s)".into(),
        y_label: "chat p95 TTFT (log scale)".into(),
        x_max,
        x_ticks,
        log_y: true,
        y_min: 10f64.powf(low.log10().floor()),
        y_max: 10f64.powf(high.log10().ceil()),
        y_tick: plot::seconds_tick,
        reference: Some((
            vec![(0.0, objective), (x_max, objective)],
            format!("chat objective ({:?})", config.traffic[0].slo.ttft),
        )),
        marker: Some((
            config.start_of("batch").as_secs_f64(),
            "batch starts".into(),
        )),
        series,
        dots: false,
        note: None,
    })
}
