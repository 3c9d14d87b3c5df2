//! The noisy tenant in virtual time (behaviour §8, per-tenant limits): the
//! source documents' "prevent one tenant with long prompts from
//! monopolizing KV blocks and blocking others; bound requests and estimated
//! token-work budgets per tenant".
//!
//! ```text
//! cargo run --release -p tower-admission-sim --example noisy_tenant
//! cargo run --release -p tower-admission-sim --example noisy_tenant -- --seed 2
//! ```
//!
//! **The engine**: the simulator's default, vLLM serving an 8B model on one
//! H100 (256 sequences, 2,048-token chunked prefill, 384,000 tokens of KV;
//! a step costs 5.75 ms + 17.25 µs per prompt token + 6 µs per decoding
//! request). **The load**, open-loop Poisson arrivals of patient clients,
//! one seeded trace for every configuration:
//!
//! - tenant `steady`: chat turns of 100–200 prompt and 100–200 output tokens
//!   (lognormal, mean 150), at 0.4× the engine's capacity for such requests
//!   (measured alone, the engine kept full), from the start;
//! - tenant `flood`: long prompts (lognormal mean 4,000 tokens,
//!   2,048–8,192) with short answers (mean 200), at 3× the engine's
//!   capacity for them, from 30 s.
//!
//! Every request tells the gate its cost (prompt tokens and `max_tokens`);
//! requests carry their tenant except under the defaults. The
//! configurations: the gate's defaults (limits 256/256, one FIFO queue of
//! 512); fair queueing (equal tenant weights, by tokens); per-tenant limits
//! for every tenant — 128 engine requests (half of `max_num_seqs`),
//! 192,000 engine tokens (half the KV), 8 queued requests — with a 1 s
//! TTFT objective. Steady's requests are good when their first token comes
//! within 1 s. "Before" is steady arriving 5–30 s, "during" 30–90 s (the
//! flood lasts to the end of the run).
//!
//! The goal (issue 37): with tenant limits, steady's p95 TTFT during the
//! flood within 1.5× of before. With the limits alone it is not met on
//! seeds 1–3 (38–40×; 8–9× with the token limit at an eighth of the KV,
//! the sizing table): the limits bound what the flood holds, not the share
//! of each engine step its prompts' prefill takes (BENCHMARKS.md, "The
//! noisy tenant"). With the flood bounded by name (`--flood-tokens 6000`,
//! or `--flood-tokens 4096 --flood-requests 1`) steady keeps all its
//! goodput and its median, and its p95 is 1.3–2.0× before: one step
//! carrying a 2,048-token chunk of a flood prompt is its tail.
//!
//! `--long-prefill-threshold N` sets the engine's side, vLLM's
//! `--long-prefill-token-threshold` (off by default, as in vLLM): a
//! request's prefill chunk in one step is at most N tokens while another
//! request is running or waiting. With the flood bounded by name and
//! N = 256 (above steady's prompts, so its tail before the flood does not
//! move) the goal is met on seeds 1–3 (1.2–1.3×); the threshold alone,
//! under the defaults or fair queueing, changes little:
//!
//! ```text
//! cargo run --release -p tower-admission-sim --example noisy_tenant -- \
//!     --flood-tokens 6000 --long-prefill-threshold 256
//! ```
//!
//! See `tower_admission_sim::qos` for the experiment and its assumptions.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tower_admission::TenantLimits;
use tower_admission_sim::qos::{self, Evaluation, Policy, QosConfig};
use tower_admission_sim::sweep::Percentile;

const USAGE: &str = "\
usage: noisy_tenant [--seed N] [--steady-load X] [--flood-load X]
                    [--tenant-requests N] [--tenant-tokens N]
                    [--tenant-queue N] [--flood-requests N]
                    [--flood-tokens N] [--long-prefill-threshold N]
                    [--threads N]

  --seed N             workload seed (default 1)
  --steady-load X      steady's load, times its capacity (default 0.4)
  --flood-load X       the flood's load, times its capacity (default 3)
  --tenant-requests N  the limits row's engine requests per tenant (128)
  --tenant-tokens N    the limits row's engine tokens per tenant (192000)
  --tenant-queue N     the limits row's queued requests per tenant (8)
  --flood-requests N   the limits row's engine requests of tenant flood, by
                       name (default: the limit for every tenant)
  --flood-tokens N     the limits row's engine tokens of tenant flood, by
                       name (default: the limit for every tenant)
  --long-prefill-threshold N
                       the engine's cap on one request's prefill chunk in
                       a step, vLLM's --long-prefill-token-threshold, for
                       every row (default 0: no cap, vLLM's default)
  --threads N          configurations simulated in parallel (default: all
                       cores)";

/// The goal on steady's tail: p95 TTFT during the flood within this
/// multiple of before.
const TAIL: f64 = 1.5;
/// Steady's "before" window starts here (the engine warms up first).
const WARMUP: Duration = Duration::from_secs(5);

fn parse() -> Result<QosConfig, String> {
    let mut config = QosConfig::noisy_tenant();
    let mut flood: Option<TenantLimits> = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let load = || -> Result<f64, String> {
            value
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
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
                config.seed = value
                    .parse()
                    .map_err(|_| format!("--seed: {value:?} is not an integer"))?;
            }
            "--steady-load" => config.traffic[0].load = load()?,
            "--flood-load" => config.traffic[1].load = load()?,
            "--tenant-requests" => config.tenant_request_limit = Some(count()?),
            "--tenant-tokens" => config.tenant_token_limit = Some(count()?),
            "--tenant-queue" => config.tenant_queue_limit = Some(count()?),
            "--flood-requests" => flood = Some(flood.unwrap_or_default().requests(count()?)),
            "--flood-tokens" => flood = Some(flood.unwrap_or_default().tokens(count()?)),
            "--long-prefill-threshold" => {
                config.engine.long_prefill_token_threshold = value
                    .parse()
                    .map_err(|_| format!("{flag}: {value:?} is not a non-negative integer"))?;
            }
            "--threads" => config.threads = count()?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if let Some(flood) = flood {
        config.tenant_overrides.push(("flood", flood));
    }
    Ok(config)
}

fn main() -> ExitCode {
    let config = match parse() {
        Ok(config) => config,
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
    let result = qos::run(&config);
    print!("{}", report(&result));
    print!("{}", sizing_report(&config));
    println!("\n({:.1} s of wall time)", wall.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}

fn objective(config: &QosConfig) -> String {
    config
        .ttft_objective
        .map_or("off".into(), |objective| format!("{objective:?}"))
}

fn latency(p: Option<Percentile>) -> String {
    p.map_or("-".into(), |p| p.to_string())
}

/// Steady's p95 TTFT during the flood over before, if both are known.
fn tail_ratio(result: &Evaluation, policy: Policy) -> Option<(f64, bool)> {
    let config = &result.config;
    let start = config.start_of("flood");
    let before = result.slice(policy, "steady", WARMUP, start).ttft_p95?;
    let during = result
        .slice(policy, "steady", start, config.record_until)
        .ttft_p95?;
    let ratio = during.value.as_secs_f64() / before.value.as_secs_f64();
    Some((ratio, !during.at_least && ratio <= TAIL))
}

fn report(result: &Evaluation) -> String {
    let config = &result.config;
    let start = config.start_of("flood");
    let until = config.record_until;
    let span = (until - start).as_secs_f64();
    let steady = &config.traffic[0];
    let flood = &config.traffic[1];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## The noisy tenant: steady at {}x, then flood at {}x from {start:?}\n",
        steady.load, flood.load
    );
    let _ = writeln!(
        out,
        "engine: {} sequences, {} tokens of KV, {}-token prefill chunks, long-prefill \
         threshold {}; capacity (each tenant's requests alone): steady {:.1} req/s, flood \
         {:.1} req/s; offered: steady {:.1} req/s, flood {:.1} req/s",
        config.engine.max_num_seqs,
        config.engine.kv_blocks * config.engine.block_size,
        config.engine.max_num_batched_tokens,
        match config.engine.long_prefill_token_threshold {
            0 => "off".to_owned(),
            n => format!("{n} tokens"),
        },
        result.capacity("steady"),
        result.capacity("flood"),
        steady.load * result.capacity("steady"),
        flood.load * result.capacity("flood"),
    );
    let _ = writeln!(
        out,
        "steady good: TTFT <= {:?}; tenant limits row: per tenant {} engine requests, {} \
         engine tokens, {} queued, TTFT objective {}; seed {}\n",
        steady.slo.ttft,
        config
            .tenant_request_limit
            .map_or("-".into(), |n| n.to_string()),
        config
            .tenant_token_limit
            .map_or("-".into(), |n| n.to_string()),
        config
            .tenant_queue_limit
            .map_or("-".into(), |n| n.to_string()),
        objective(config),
        config.seed,
    );
    let _ = writeln!(
        out,
        "| {:<24} | {:>17} | {:>17} | {:>7} | {:>10} | {:>6} | {:>6} | {:>8} | {:>8} | {:<32} | {:>7} |",
        "configuration",
        "steady p50 / p95",
        "steady p50 / p95",
        "p95 x",
        "steady",
        "steady",
        "steady",
        "flood",
        "flood",
        "flood refusals",
        "engine",
    );
    let _ = writeln!(
        out,
        "| {:<24} | {:>17} | {:>17} | {:>7} | {:>10} | {:>6} | {:>6} | {:>8} | {:>8} | {:<32} | {:>7} |",
        "",
        "TTFT before",
        "TTFT during",
        "before",
        "good/s",
        "good",
        "refused",
        "admitted",
        "refused",
        "by reason",
        "preempt",
    );
    let _ = writeln!(
        out,
        "|{}|------------------:|------------------:|--------:|-----------:|-------:|-------:|---------:|---------:|{}|--------:|",
        "-".repeat(26),
        "-".repeat(34),
    );
    for run in &result.runs {
        let policy = run.policy;
        let before = result.slice(policy, "steady", WARMUP, start);
        let during = result.slice(policy, "steady", start, until);
        let flooded = result.slice(policy, "flood", start, until);
        let reasons: Vec<String> = result
            .rejections(policy, "flood", start, until)
            .iter()
            .map(|(reason, n)| format!("{} {n}", reason.as_str()))
            .collect();
        let _ = writeln!(
            out,
            "| {:<24} | {:>17} | {:>17} | {:>7} | {:>10.1} | {:>5.0}% | {:>5.0}% | {:>8} | {:>8} | {:<32} | {:>7} |",
            name(policy),
            format!(
                "{} / {}",
                latency(before.ttft_p50),
                latency(before.ttft_p95)
            ),
            format!(
                "{} / {}",
                latency(during.ttft_p50),
                latency(during.ttft_p95)
            ),
            tail_ratio(result, policy).map_or("-".into(), |(ratio, _)| format!("{ratio:.1}x")),
            during.good as f64 / span,
            100.0 * during.good as f64 / during.arrived.max(1) as f64,
            100.0 * during.rejected as f64 / during.arrived.max(1) as f64,
            flooded.admitted,
            flooded.rejected,
            if reasons.is_empty() {
                "-".to_owned()
            } else {
                reasons.join(", ")
            },
            run.preemptions,
        );
    }
    let _ = writeln!(out, "\nsteady's refusals during the flood, by reason:");
    for run in &result.runs {
        let reasons: Vec<String> = result
            .rejections(run.policy, "steady", start, until)
            .iter()
            .map(|(reason, n)| format!("{} {n}", reason.as_str()))
            .collect();
        let _ = writeln!(
            out,
            "  {:<24} {}",
            name(run.policy),
            if reasons.is_empty() {
                "-".to_owned()
            } else {
                reasons.join(", ")
            }
        );
    }
    let _ = writeln!(
        out,
        "\nthe flood's arrivals during the flood: admitted, completed (by the end of the \
         drain), TTFT of those not refused:"
    );
    let flood_index = config
        .traffic
        .iter()
        .position(|traffic| traffic.name == "flood")
        .expect("a flood");
    for run in &result.runs {
        let flooded = result.slice(run.policy, "flood", start, until);
        let completed = run
            .outcomes
            .iter()
            .filter(|o| o.traffic == flood_index && o.arrival >= start && o.arrival < until)
            .filter(|o| o.finished.is_some())
            .count();
        let _ = writeln!(
            out,
            "  {:<24} admitted {:>4}, completed {:>4}, TTFT p50 / p95 {} / {}",
            name(run.policy),
            flooded.admitted,
            completed,
            latency(flooded.ttft_p50),
            latency(flooded.ttft_p95),
        );
    }
    let _ = writeln!(
        out,
        "\nbefore: steady arrivals {WARMUP:?}..{start:?}; during: arrivals {start:?}..{until:?}. \
         TTFT of requests not refused (\">\" marks a lower bound: no first token when the run \
         ended). good: completed with TTFT <= {:?}, of steady's arrivals during the flood; \
         good/s over the {span:.0} s. flood counts: arrivals during the flood.\n",
        steady.slo.ttft
    );
    let _ = writeln!(
        out,
        "goal (issue 37): with tenant limits, steady's p95 TTFT during the flood <= {TAIL}x before"
    );
    for run in &result.runs {
        let verdict = match tail_ratio(result, run.policy) {
            Some((ratio, true)) => format!("{ratio:.1}x: met"),
            Some((ratio, false)) => format!("{ratio:.1}x: NOT met"),
            None => "no figure".into(),
        };
        let _ = writeln!(out, "  {:<24} {verdict}", name(run.policy));
    }
    out
}

/// The tenant-limits row with the per-tenant engine token limit at
/// fractions of the KV cache: how tight a limit steady's tail needs, and
/// what it costs (steady holds some 20,000 tokens itself).
fn sizing_report(config: &QosConfig) -> String {
    let policy = Policy::GateTenantLimits;
    let start = config.start_of("flood");
    let until = config.record_until;
    let span = (until - start).as_secs_f64();
    let kv_tokens = config.engine.kv_blocks * config.engine.block_size;
    let mut out = format!(
        "\n## Sizing the per-tenant token limit ({} engine requests, {} queued per tenant, \
         TTFT objective {})\n\n",
        config
            .tenant_request_limit
            .map_or("-".into(), |n| n.to_string()),
        config
            .tenant_queue_limit
            .map_or("-".into(), |n| n.to_string()),
        objective(config),
    );
    let _ = writeln!(
        out,
        "| {:>14} | {:>9} | {:>9} | {:>7} | {:>6} | {:>7} | {:>8} | {:<32} |",
        "tokens/tenant", "steady", "steady", "p95 x", "steady", "steady", "flood", "flood refusals"
    );
    let _ = writeln!(
        out,
        "| {:>14} | {:>9} | {:>9} | {:>7} | {:>6} | {:>7} | {:>8} | {:<32} |",
        "", "p95 bef.", "p95 dur.", "before", "good", "refused", "admit/s", "by reason"
    );
    let _ = writeln!(
        out,
        "|---------------:|----------:|----------:|--------:|-------:|--------:|---------:|{}|",
        "-".repeat(34)
    );
    for divisor in [1, 2, 4, 8, 16, 32] {
        let tokens = kv_tokens / divisor;
        let mut sized = config.clone();
        sized.tenant_token_limit = Some(tokens);
        sized.policies = vec![policy];
        let result = qos::run(&sized);
        let before = result.slice(policy, "steady", WARMUP, start);
        let during = result.slice(policy, "steady", start, until);
        let flood = result.slice(policy, "flood", start, until);
        let reasons: Vec<String> = result
            .rejections(policy, "flood", start, until)
            .iter()
            .map(|(reason, n)| format!("{} {n}", reason.as_str()))
            .collect();
        let _ = writeln!(
            out,
            "| {:>14} | {:>9} | {:>9} | {:>7} | {:>5.0}% | {:>6.0}% | {:>8.1} | {:<32} |",
            format!("{tokens} (KV/{divisor})"),
            latency(before.ttft_p95),
            latency(during.ttft_p95),
            tail_ratio(&result, policy).map_or("-".into(), |(ratio, _)| format!("{ratio:.1}x")),
            100.0 * during.good as f64 / during.arrived.max(1) as f64,
            100.0 * during.rejected as f64 / during.arrived.max(1) as f64,
            flood.admitted as f64 / span,
            reasons.join(", "),
        );
    }
    out
}

/// The configurations' names in this evaluation.
fn name(policy: Policy) -> &'static str {
    match policy {
        Policy::Gate => "gate, defaults (no QoS)",
        Policy::GateQos => "gate, fair queueing",
        Policy::GateTenantLimits => "gate, tenant limits",
        other => other.name(),
    }
}
