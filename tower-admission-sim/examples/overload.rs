//! Goodput under overload, in virtual time: offered load from 0.5× to 8× of
//! a simulated engine's capacity, for the admission policies a user would
//! pick instead of this crate (none, `tower::limit::ConcurrencyLimit`, a
//! TGI-style semaphore, a vLLM-style cap) and for this crate's gate (with
//! defaults, with a Little's-law waiting limit, sized for the first-token
//! objective, with the objective as its setting, with an engine waiting
//! token budget, with controlled delay at 50 ms), in the scenarios of
//! `tower_admission_sim::sweep::scenarios`.
//!
//! ```text
//! cargo run --release -p tower-admission-sim --example overload
//! cargo run --release -p tower-admission-sim --example overload -- --fast --scenario all
//! cargo run --release -p tower-admission-sim --example overload -- --fast --scenario retry --ttft-slo 2
//! cargo run --release -p tower-admission-sim --example overload -- --scenario long-docs --loads 2 --ttft-slo 2 --queue-limit 18
//! ```
//!
//! Prints one table per scenario (Markdown), checks the goals, and writes
//! two SVG plots per scenario: goodput and p99 TTFT against offered load
//! (default `target/overload-<scenario>-goodput.svg` and `-ttft.svg`). See
//! `tower_admission_sim::sweep` for the experiment and its assumptions.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tower_admission_sim::sweep::{self, Calibration, Point, Scenario, Sweep, SweepConfig, System};

#[path = "plot/mod.rs"]
mod plot;
#[path = "overload/plots.rs"]
mod plots;
use plots::{goodput_plot, ttft_plot};

const USAGE: &str = "\
usage: overload [--fast] [--scenario NAME|all]... [--loads X,Y,..] [--seed N]
                [--out DIR] [--ttft-slo SECONDS] [--tpot-slo MILLISECONDS]
                [--queue-limit N] [--engine-token-limit N] [--burstiness SHAPE]
                [--ranks N] [--threads N]

  --fast             small engine (64 sequences), 20 s window
  --scenario NAME    base, bursty, ranks, long, long-docs, retry, give-up,
                     or all
                     (repeatable; default base)
  --loads LIST       offered loads as multiples of capacity
                     (default 0.5,1,1.5,2,3,4,6,8; --fast 0.5,1,2,4,8)
  --seed N           workload seed (default 1)
  --out DIR          where to write the plots (default target)
  --ttft-slo S       time-to-first-token objective in seconds (default 10)
  --tpot-slo MS      time-per-output-token objective in ms (default 100)
  --queue-limit N    the gate's request queue limit per rank for the
                     'gate, defaults' row (default: 2 x max_num_seqs)
  --engine-token-limit N
                     the gate's engine token limit per rank (prompt + output
                     tokens of admitted requests, a stand-in for the KV
                     cache) for every gate row (default: off)
  --burstiness K     gamma shape of arrival gaps of 'base'; 1 = Poisson
  --ranks N          data-parallel ranks of 'base' (default 1)
  --threads N        points simulated in parallel (default: all cores)";

/// The loads the goals are stated for.
const GOAL_LOADS: [f64; 3] = [2.0, 4.0, 8.0];

/// The loads of the summary table.
const SUMMARY_LOADS: [f64; 4] = [1.0, 2.0, 4.0, 8.0];

/// How far below the best alternative a gate row may be and still count as
/// "at least as much", as a fraction of capacity. Which requests a system
/// serves decides their mean output length: over the ~5,000 completions of
/// a 60 s window at 82 req/s that mean varies by about 1.4% (lognormal
/// lengths, sigma 0.9), so two systems that serve equally well differ by
/// about 2% (one standard deviation); 3% is a tie.
const TIE: f64 = 0.03;

struct Options {
    base: SweepConfig,
    scenarios: Vec<String>,
    out: PathBuf,
}

fn parse() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let mut fast = false;
    let mut flags = Vec::new();
    let mut scenarios = Vec::new();
    let mut out = PathBuf::from("target");
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--fast" => fast = true,
            "-h" | "--help" => return Err(String::new()),
            "--out" => out = args.next().ok_or("--out needs a directory")?.into(),
            "--scenario" => scenarios.push(args.next().ok_or("--scenario needs a name")?),
            "--seed"
            | "--ttft-slo"
            | "--tpot-slo"
            | "--queue-limit"
            | "--engine-token-limit"
            | "--burstiness"
            | "--ranks"
            | "--threads"
            | "--loads" => {
                let value = args.next().ok_or(format!("{arg} needs a value"))?;
                flags.push((arg, value));
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let mut base = if fast {
        SweepConfig::fast()
    } else {
        SweepConfig::default()
    };
    for (flag, value) in flags {
        let number = |value: &str| -> Result<f64, String> {
            value
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite() && *n > 0.0)
                .ok_or(format!("{flag}: {value:?} is not a positive number"))
        };
        let count = || -> Result<usize, String> {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag}: {value:?} is not a non-negative integer"))
        };
        match flag.as_str() {
            "--seed" => {
                base.seed = value
                    .parse()
                    .map_err(|_| format!("--seed: {value:?} is not an integer"))?
            }
            "--ttft-slo" => base.slo.ttft = Duration::from_secs_f64(number(&value)?),
            "--tpot-slo" => base.slo.tpot = Duration::from_secs_f64(number(&value)? / 1e3),
            "--queue-limit" => base.gate = base.gate.clone().request_queue_limit(count()?),
            "--engine-token-limit" => {
                let n = count()?;
                if n == 0 {
                    return Err("--engine-token-limit must be positive".into());
                }
                base.gate = base.gate.clone().engine_token_limit(n);
            }
            "--burstiness" => base.burstiness = number(&value)?,
            "--ranks" => {
                base.engine.dp_ranks = count()?;
                if base.engine.dp_ranks == 0 {
                    return Err("--ranks must be positive".into());
                }
            }
            "--threads" => base.threads = count()?.max(1),
            "--loads" => {
                base.loads = value.split(',').map(number).collect::<Result<_, _>>()?;
            }
            _ => unreachable!("only known flags are collected"),
        }
    }
    if scenarios.is_empty() {
        scenarios.push("base".into());
    }
    let known: Vec<&str> = sweep::scenarios(&base).iter().map(|s| s.name).collect();
    for name in &scenarios {
        if name != "all" && !known.contains(&name.as_str()) {
            return Err(format!(
                "--scenario: {name:?} is none of {} or all",
                known.join(", ")
            ));
        }
    }
    Ok(Options {
        base,
        scenarios,
        out,
    })
}

fn main() -> ExitCode {
    let Options {
        base,
        scenarios,
        out,
    } = match parse() {
        Ok(options) => options,
        Err(message) => {
            if message.is_empty() {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {message}\n\n{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    let wall = Instant::now();
    let engine = &base.engine;
    println!(
        "engine: max_num_seqs {} per rank, token budget {}, {} KV blocks of {} tokens; \
         step = {:?} + {:?}/prefill token + {:?}/decode token",
        engine.max_num_seqs,
        engine.max_num_batched_tokens,
        engine.kv_blocks,
        engine.block_size,
        engine.step_time.base,
        engine.step_time.per_prefill_token,
        engine.step_time.per_decode_token,
    );
    println!(
        "seed {}; window {:?} after {:?} of warm-up; good request: TTFT <= {:?} and TPOT <= {:?} \
         (TTFT from the first send; rejected and given-up requests are never good)",
        base.seed, base.window, base.warmup, base.slo.ttft, base.slo.tpot
    );
    if let Err(error) = std::fs::create_dir_all(&out) {
        eprintln!("error: cannot create {}: {error}", out.display());
        return ExitCode::FAILURE;
    }
    let all = scenarios.iter().any(|name| name == "all");
    let chosen: Vec<Scenario> = sweep::scenarios(&base)
        .into_iter()
        .filter(|s| all || scenarios.iter().any(|name| name == s.name))
        .collect();
    for scenario in &chosen {
        if let Err(error) = run_scenario(scenario, &out) {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    }
    println!("({:.1} s of wall time)", wall.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}

fn run_scenario(scenario: &Scenario, out: &std::path::Path) -> Result<(), String> {
    let config = &scenario.config;
    let jobs = config.systems.len() * config.loads.len();
    let bar = ProgressBar::new(jobs as u64 + 1).with_style(
        ProgressStyle::with_template("{spinner} [{elapsed}] {bar:30} {pos}/{len} {msg}")
            .expect("a valid template"),
    );
    bar.set_message(format!("{}: calibrating", scenario.name));
    let calibration = Calibration::measure(config);
    bar.inc(1);
    let result = sweep::run(config, &calibration, |point| {
        bar.inc(1);
        bar.set_message(format!(
            "{}: {} at {}x",
            scenario.name, point.system, point.load
        ));
    });
    bar.finish_and_clear();

    println!(
        "\n## Scenario `{}`: {}\n\n{} rank(s); capacity (closed loop, engine kept full) {:.1} req/s; \
         Little's law at {}x: C = {:.1} req/s per rank, W = {:.0} ms -> engine request waiting \
         limit {}; queue for the TTFT objective {} per rank; TGI permits {}, vLLM cap {}\n",
        scenario.name,
        scenario.description,
        config.engine.dp_ranks,
        calibration.capacity,
        Calibration::LOAD,
        calibration.estimate.admission_rate(),
        calibration.estimate.mean_wait().as_secs_f64() * 1e3,
        calibration.waiting_limit,
        calibration.queue_for_objective,
        config.tgi_permits(),
        config.vllm_cap(),
    );
    print!("{}", table(&result));
    println!();
    print!("{}", summary(&result, config));
    println!(
        "\nTTFT: \">\" marks a lower bound (requests still without a first token when the run ended)"
    );
    print!("{}", goals(&result, config));
    print!("{}", controlled_delay_goal(&result, config));
    if result.points.iter().any(|point| point.long.arrived > 0) {
        print!("{}", split(&result, config));
    }
    for (suffix, svg) in [
        ("goodput", goodput_plot(&result, config, scenario)),
        ("ttft", ttft_plot(&result, config, scenario)),
    ] {
        let path = out.join(format!("overload-{}-{suffix}.svg", scenario.name));
        std::fs::write(&path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

fn table(result: &Sweep) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| {:<24} | {:>4} | {:>8} | {:>6} | {:>6} | {:>6} | {:>8} | {:>8} | {:>8} | {:>8} | {:>5} | {:>6} | {:>7} |",
        "system",
        "load",
        "goodput",
        "of cap",
        "reject",
        "gave up",
        "p50 TTFT",
        "p99 TTFT",
        "p50 TPOT",
        "p99 TPOT",
        "sends",
        "engine",
        "engine"
    );
    let _ = writeln!(
        out,
        "| {:<24} | {:>4} | {:>8} | {:>6} | {:>6} | {:>6} | {:>8} | {:>8} | {:>8} | {:>8} | {:>5} | {:>6} | {:>7} |",
        "", "", "req/s", "", "", "", "", "", "", "", "/req", "queue", "cancels"
    );
    let _ = writeln!(
        out,
        "|{}|-----:|---------:|-------:|-------:|--------:|---------:|---------:|---------:|---------:|------:|-------:|--------:|",
        "-".repeat(26)
    );
    for point in &result.points {
        let _ = writeln!(out, "{}", row(point));
    }
    out
}

fn row(point: &Point) -> String {
    let latency = |p: Option<sweep::Percentile>| p.map_or("-".to_string(), |p| p.to_string());
    let tpot = |d: Option<Duration>| {
        d.map_or("-".to_string(), |d| {
            format!("{:.0} ms", d.as_secs_f64() * 1e3)
        })
    };
    format!(
        "| {:<24} | {:>3}x | {:>8.1} | {:>5.0}% | {:>5.0}% | {:>6.0}% | {:>8} | {:>8} | {:>8} | {:>8} | {:>5.2} | {:>6} | {:>7} |",
        point.system.name(),
        point.load,
        point.goodput,
        100.0 * point.capacity_fraction,
        100.0 * point.rejection_rate(),
        100.0 * point.abandon_rate(),
        latency(point.ttft_p50),
        latency(point.ttft_p99),
        tpot(point.tpot_p50),
        tpot(point.tpot_p99),
        point.sends_per_request(),
        point.engine_queue_peak,
        point.engine_cancelled,
    )
}

/// One line per system: goodput as a fraction of capacity and p99 TTFT at
/// 1×, 2×, 4× and 8×, and at 8× the sends per request and the share given
/// up.
fn summary(result: &Sweep, config: &SweepConfig) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| {:<24} | {:>22} | {:>32} | {:>9} | {:>10} |",
        "system", "goodput 1x/2x/4x/8x", "p99 TTFT 1x / 2x / 4x / 8x", "sends 8x", "gave up 8x"
    );
    let _ = writeln!(
        out,
        "|{}|-----------------------:|---------------------------------:|----------:|-----------:|",
        "-".repeat(26)
    );
    for &system in &config.systems {
        let at = |load| result.point(system, load);
        let goodput: Vec<String> = SUMMARY_LOADS
            .iter()
            .map(|&l| {
                at(l).map_or("-".into(), |p| {
                    format!("{:.0}%", 100.0 * p.capacity_fraction)
                })
            })
            .collect();
        let ttft: Vec<String> = SUMMARY_LOADS
            .iter()
            .map(|&l| {
                at(l)
                    .and_then(|p| p.ttft_p99)
                    .map_or("-".into(), |t| t.to_string())
            })
            .collect();
        let eight = at(8.0);
        let _ = writeln!(
            out,
            "| {:<24} | {:>22} | {:>32} | {:>9} | {:>10} |",
            system.name(),
            goodput.join(" / "),
            ttft.join(" / "),
            eight.map_or("-".into(), |p| format!("{:.2}", p.sends_per_request())),
            eight.map_or("-".into(), |p| format!("{:.0}%", 100.0 * p.abandon_rate())),
        );
    }
    out
}

/// The goals of the evaluation, for each gate row at 2×, 4× and 8×: goodput
/// at least 90% of capacity, at least every alternative's, and p99 TTFT of
/// admitted requests within the objective.
fn goals(result: &Sweep, config: &SweepConfig) -> String {
    let mut out = format!(
        "\ngoals at 2x, 4x, 8x (>= 90% of capacity; >= every alternative, within {:.0}% of \
         capacity; p99 TTFT of admitted requests <= {:?}):\n",
        100.0 * TIE,
        config.slo.ttft
    );
    for &system in config.systems.iter().filter(|s| s.is_gate()) {
        let mut verdicts = Vec::new();
        for load in GOAL_LOADS {
            let Some(point) = result.point(system, load) else {
                continue;
            };
            let best_other = System::ALTERNATIVES
                .iter()
                .filter_map(|&other| result.point(other, load))
                .map(|p| p.goodput)
                .fold(0.0, f64::max);
            let capacity = point.capacity_fraction >= 0.9;
            let beats = point.goodput >= best_other - TIE * result.capacity();
            let ttft = point
                .ttft_p99
                .is_some_and(|p| !p.at_least && p.value <= config.slo.ttft);
            let mark = |ok: bool| if ok { "yes" } else { "NO" };
            verdicts.push(format!(
                "{load}x: {:.0}% {} / beats others {} / p99 TTFT {}",
                100.0 * point.capacity_fraction,
                mark(capacity),
                mark(beats),
                mark(ttft)
            ));
        }
        if !verdicts.is_empty() {
            let _ = writeln!(out, "  {:<24} {}", system.name(), verdicts.join("; "));
        }
    }
    out
}

/// How far below another row the controlled-delay row may be and still
/// count as "at least as much": 1% of that row's goodput.
const CONTROLLED_DELAY_TIE: f64 = 0.01;

/// The controlled-delay goal at every load of 1× and more: goodput at least
/// the TGI-style semaphore's and the gate defaults' (within 1%), and p99
/// TTFT of admitted requests within twice the semaphore's.
fn controlled_delay_goal(result: &Sweep, config: &SweepConfig) -> String {
    let mut out = format!(
        "\ncontrolled-delay goal (target {:?}; goodput >= the TGI-style semaphore's and the \
         defaults', within {:.0}%; p99 TTFT <= 2x the semaphore's):\n",
        sweep::CONTROLLED_DELAY_TARGET,
        100.0 * CONTROLLED_DELAY_TIE
    );
    let latency = |p: Option<sweep::Percentile>| p.map_or("-".to_string(), |p| p.to_string());
    let mark = |ok: bool| if ok { "yes" } else { "NO" };
    for &load in config.loads.iter().filter(|&&load| load >= 1.0) {
        let (Some(codel), Some(semaphore), Some(defaults)) = (
            result.point(System::GateControlledDelay, load),
            result.point(System::TgiSemaphore, load),
            result.point(System::Gate, load),
        ) else {
            continue;
        };
        let at_least =
            |other: &Point| codel.goodput >= other.goodput * (1.0 - CONTROLLED_DELAY_TIE);
        let ttft = match (codel.ttft_p99, semaphore.ttft_p99) {
            (Some(codel), Some(semaphore)) => !codel.at_least && codel.value <= semaphore.value * 2,
            _ => false,
        };
        let _ = writeln!(
            out,
            "  {load}x: goodput {:.1} vs semaphore {:.1} {} / defaults {:.1} {}; p99 TTFT {} vs semaphore {} {}",
            codel.goodput,
            semaphore.goodput,
            mark(at_least(semaphore)),
            defaults.goodput,
            mark(at_least(defaults)),
            latency(codel.ttft_p99),
            latency(semaphore.ttft_p99),
            mark(ttft),
        );
    }
    out
}

/// Short and long prompts apart: goodput and p50/p99 TTFT of each class,
/// and the token-budget goal: with the engine waiting token limit, short
/// requests' p99 TTFT within the objective and total goodput not below the
/// defaults' (within [`TIE`]).
fn split(result: &Sweep, config: &SweepConfig) -> String {
    let latency = |p: Option<sweep::Percentile>| p.map_or("-".to_string(), |p| p.to_string());
    let mut out = format!(
        "\nshort (prompt < {} tokens) and long requests apart:\n\n",
        config.long_prompt_tokens
    );
    let _ = writeln!(
        out,
        "| {:<24} | {:>4} | {:>8} | {:>8} | {:>9} | {:>9} | {:>8} | {:>8} | {:>9} | {:>9} | {:>6} | {:>7} |",
        "system",
        "load",
        "goodput",
        "short",
        "short p50",
        "short p99",
        "long",
        "long",
        "long p50",
        "long p99",
        "long",
        "engine"
    );
    let _ = writeln!(
        out,
        "| {:<24} | {:>4} | {:>8} | {:>8} | {:>9} | {:>9} | {:>8} | {:>8} | {:>9} | {:>9} | {:>6} | {:>7} |",
        "",
        "",
        "req/s",
        "good/s",
        "TTFT",
        "TTFT",
        "arrived",
        "good/s",
        "TTFT",
        "TTFT",
        "reject",
        "preempt"
    );
    let _ = writeln!(
        out,
        "|{}|-----:|---------:|---------:|----------:|----------:|---------:|---------:|----------:|----------:|-------:|--------:|",
        "-".repeat(26)
    );
    for point in &result.points {
        let _ = writeln!(
            out,
            "| {:<24} | {:>3}x | {:>8.1} | {:>8.1} | {:>9} | {:>9} | {:>8} | {:>8.2} | {:>9} | {:>9} | {:>5.0}% | {:>7} |",
            point.system.name(),
            point.load,
            point.goodput,
            point.short.goodput,
            latency(point.short.ttft_p50),
            latency(point.short.ttft_p99),
            point.long.arrived,
            point.long.goodput,
            latency(point.long.ttft_p50),
            latency(point.long.ttft_p99),
            100.0 * ratio(point.long.rejected, point.long.arrived),
            point.preemptions,
        );
    }
    let _ = writeln!(
        out,
        "\ntoken-budget goal (engine waiting token limit {} per rank; short p99 TTFT <= {:?}; \
         total goodput >= the defaults', within {:.0}% of capacity):",
        result.calibration.token_budget,
        config.slo.ttft,
        100.0 * TIE
    );
    for &load in &config.loads {
        let (Some(defaults), Some(budget)) = (
            result.point(System::Gate, load),
            result.point(System::GateTokenBudget, load),
        ) else {
            continue;
        };
        let short = budget
            .short
            .ttft_p99
            .is_some_and(|p| !p.at_least && p.value <= config.slo.ttft);
        let goodput = budget.goodput >= defaults.goodput - TIE * result.capacity();
        let mark = |ok: bool| if ok { "yes" } else { "NO" };
        let _ = writeln!(
            out,
            "  {load}x: short p99 TTFT {} (defaults {}) {}; goodput {:.1} vs {:.1} req/s {}",
            latency(budget.short.ttft_p99),
            latency(defaults.short.ttft_p99),
            mark(short),
            budget.goodput,
            defaults.goodput,
            mark(goodput)
        );
    }
    out
}

fn ratio(n: usize, of: usize) -> f64 {
    if of == 0 { 0.0 } else { n as f64 / of as f64 }
}
