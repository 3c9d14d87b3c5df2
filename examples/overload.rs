//! Goodput under overload, in virtual time: offered load from 0.5× to 4× of
//! a simulated engine's capacity, with no admission control, with
//! `tower::limit::ConcurrencyLimit`, and with this crate's gate.
//!
//! ```text
//! cargo run --release --example overload --features sim
//! cargo run --release --example overload --features sim -- --fast --seed 7 --svg plot.svg
//! ```
//!
//! Prints a table and writes an SVG plot of goodput against offered load
//! (default `target/overload.svg`). See `tower_admission::sim::sweep` for
//! the experiment and its assumptions.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tower_admission::AdmissionConfig;
use tower_admission::sim::sweep::{self, Point, Sweep, SweepConfig, System};

const USAGE: &str = "\
usage: overload [--fast] [--seed N] [--svg PATH] [--ttft-slo SECONDS]
                [--tpot-slo MILLISECONDS] [--queue-limit N] [--burstiness SHAPE]
                [--ranks N] [--threads N]

  --fast             small engine (64 sequences), 4 loads, 20 s window
  --seed N           workload seed (default 1)
  --svg PATH         where to write the plot (default target/overload.svg)
  --ttft-slo S       time-to-first-token objective in seconds (default 10)
  --tpot-slo MS      time-per-output-token objective in ms (default 100)
  --queue-limit N    the gate's request queue limit per rank
                     (default: 2 x max_num_seqs, following the engine)
  --burstiness K     gamma shape of arrival gaps; 1 = Poisson (default 1)
  --ranks N          data-parallel ranks of the engine (default 1); requests
                     are spread over them round-robin
  --threads N        points simulated in parallel (default: all cores)";

struct Options {
    config: SweepConfig,
    svg: PathBuf,
}

fn parse() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let mut fast = false;
    let mut flags = Vec::new();
    let mut svg = PathBuf::from("target/overload.svg");
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--fast" => fast = true,
            "-h" | "--help" => return Err(String::new()),
            "--svg" => svg = args.next().ok_or("--svg needs a path")?.into(),
            "--seed" | "--ttft-slo" | "--tpot-slo" | "--queue-limit" | "--burstiness"
            | "--ranks" | "--threads" => {
                let value = args.next().ok_or(format!("{arg} needs a value"))?;
                flags.push((arg, value));
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let mut config = if fast {
        SweepConfig::fast()
    } else {
        SweepConfig::default()
    };
    for (flag, value) in flags {
        let number = || -> Result<f64, String> {
            value
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite() && *n >= 0.0)
                .ok_or(format!("{flag}: {value:?} is not a non-negative number"))
        };
        let count = || -> Result<usize, String> {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag}: {value:?} is not a non-negative integer"))
        };
        match flag.as_str() {
            "--seed" => {
                config.seed = value
                    .parse()
                    .map_err(|_| format!("--seed: {value:?} is not an integer"))?
            }
            "--ttft-slo" => config.slo.ttft = Duration::from_secs_f64(number()?),
            "--tpot-slo" => config.slo.tpot = Duration::from_secs_f64(number()? / 1e3),
            "--queue-limit" => config.gate = AdmissionConfig::new().request_queue_limit(count()?),
            "--burstiness" => {
                config.burstiness = number()?;
                if config.burstiness == 0.0 {
                    return Err("--burstiness must be positive".into());
                }
            }
            "--ranks" => {
                config.engine.dp_ranks = count()?;
                if config.engine.dp_ranks == 0 {
                    return Err("--ranks must be positive".into());
                }
            }
            "--threads" => config.threads = count()?.max(1),
            _ => unreachable!("only known flags are collected"),
        }
    }
    Ok(Options { config, svg })
}

fn main() -> ExitCode {
    let Options { config, svg } = match parse() {
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
    let engine = &config.engine;
    println!(
        "engine: {} rank(s) x max_num_seqs {}, token budget {}, {} KV blocks of {} tokens; \
         step = {:?} + {:?}/prefill token + {:?}/decode token",
        engine.dp_ranks,
        engine.max_num_seqs,
        engine.max_num_batched_tokens,
        engine.kv_blocks,
        engine.block_size,
        engine.step_time.base,
        engine.step_time.per_prefill_token,
        engine.step_time.per_decode_token,
    );
    println!(
        "workload: gamma arrivals (shape {}), ShareGPT-like lengths, seed {}; \
         window {:?} after {:?} of warm-up",
        config.burstiness, config.seed, config.window, config.warmup
    );
    println!(
        "good request: TTFT <= {:?} and TPOT <= {:?}; rejected requests are never good",
        config.slo.ttft, config.slo.tpot
    );

    let jobs = config.systems.len() * config.loads.len();
    let bar = ProgressBar::new(jobs as u64 + 1).with_style(
        ProgressStyle::with_template("{spinner} [{elapsed}] {bar:30} {pos}/{len} {msg}")
            .expect("a valid template"),
    );
    bar.set_message("measuring capacity");
    let capacity = sweep::measure_capacity(&config);
    bar.inc(1);
    bar.set_message("sweeping");
    let result = sweep::run(&config, capacity, |point| {
        bar.inc(1);
        bar.set_message(format!("{} at {}x", point.system, point.load));
    });
    bar.finish_and_clear();

    println!(
        "capacity (closed loop, engine kept full): {capacity:.1} req/s\n\n{}\n\
         TTFT: \">\" marks a lower bound (requests still without a first token when the run ended)\n\
         engine queue: the longest the engine's own waiting queue got",
        table(&result)
    );
    if let Some(parent) = svg.parent().filter(|p| !p.as_os_str().is_empty()) {
        if let Err(error) = std::fs::create_dir_all(parent) {
            eprintln!("error: cannot create {}: {error}", parent.display());
            return ExitCode::FAILURE;
        }
    }
    if let Err(error) = std::fs::write(&svg, plot(&result, &config)) {
        eprintln!("error: cannot write {}: {error}", svg.display());
        return ExitCode::FAILURE;
    }
    println!(
        "plot: {}   ({:.1} s of wall time)",
        svg.display(),
        wall.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}

fn table(result: &Sweep) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:>5} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8}",
        "system", "load", "offered", "goodput", "rejected", "p50 TTFT", "p99 TTFT", "engine"
    );
    let _ = writeln!(
        out,
        "{:<24} {:>5} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8}",
        "", "", "req/s", "req/s", "", "admitted", "admitted", "queue"
    );
    let mut previous = None;
    for point in &result.points {
        if previous.is_some() && previous != Some(point.system) {
            out.push('\n');
        }
        previous = Some(point.system);
        let _ = writeln!(out, "{}", row(point));
    }
    out
}

fn row(point: &Point) -> String {
    let percent = |n: usize| {
        if point.arrived == 0 {
            0.0
        } else {
            100.0 * n as f64 / point.arrived as f64
        }
    };
    let latency = |p: Option<sweep::Percentile>| p.map_or("-".to_string(), |p| p.to_string());
    format!(
        "{:<24} {:>4}x {:>9.1} {:>9.1} {:>8.0}% {:>10} {:>10} {:>8}",
        point.system.name(),
        point.load,
        point.offered,
        point.goodput,
        percent(point.rejected),
        latency(point.ttft_p50),
        latency(point.ttft_p99),
        point.engine_queue_peak,
    )
}

/// Goodput against offered load, one line per system, with the ideal
/// (goodput = offered load up to capacity, then flat) dashed.
fn plot(result: &Sweep, config: &SweepConfig) -> String {
    const WIDTH: f64 = 760.0;
    const HEIGHT: f64 = 460.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 230.0;
    const TOP: f64 = 50.0;
    const BOTTOM: f64 = 60.0;
    // (system, colour, extra stroke attributes): no admission control and
    // ConcurrencyLimit draw the same curve, so one is wide and pale under
    // the other, which is dashed.
    let styles = [
        (
            System::NoAdmission,
            "#d62728",
            r#"stroke-width="7" stroke-opacity="0.45""#,
        ),
        (
            System::ConcurrencyLimit,
            "#ff7f0e",
            r#"stroke-width="2.5" stroke-dasharray="8,5""#,
        ),
        (System::Gate, "#1f77b4", r#"stroke-width="2.5""#),
    ];
    let max_load = config.loads.iter().copied().fold(1.0, f64::max);
    let max_goodput = result
        .points
        .iter()
        .map(|p| p.goodput)
        .fold(result.capacity, f64::max);
    let y_max = nice_ceiling(max_goodput * 1.1);
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let x = |load: f64| LEFT + load / max_load * plot_width;
    let y = |goodput: f64| TOP + plot_height - goodput / y_max * plot_height;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="24" font-size="15" text-anchor="middle">Goodput under overload (good: TTFT ≤ {:?}, TPOT ≤ {:?})</text>"#,
        LEFT + plot_width / 2.0,
        config.slo.ttft,
        config.slo.tpot
    );
    // Grid and axes.
    for step in 0..=5 {
        let value = y_max * step as f64 / 5.0;
        let at = y(value);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{at:.1}" x2="{:.1}" y2="{at:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{value:.0}</text>"##,
            LEFT + plot_width,
            LEFT - 8.0,
            at + 4.0
        );
    }
    for load in std::iter::once(0.0).chain(config.loads.iter().copied()) {
        let at = x(load);
        let _ = writeln!(
            svg,
            r##"<line x1="{at:.1}" y1="{TOP}" x2="{at:.1}" y2="{:.1}" stroke="#eee"/><text x="{at:.1}" y="{:.1}" text-anchor="middle">{load}x</text>"##,
            TOP + plot_height,
            TOP + plot_height + 18.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_width}" height="{plot_height}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">offered load (x capacity = {:.1} req/s)</text>"#,
        LEFT + plot_width / 2.0,
        HEIGHT - 15.0,
        result.capacity
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(20 {:.1}) rotate(-90)" text-anchor="middle">goodput (req/s)</text>"#,
        TOP + plot_height / 2.0
    );
    // The ideal: all offered load is good up to capacity.
    let _ = writeln!(
        svg,
        r##"<polyline points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="none" stroke="#888" stroke-dasharray="5,4"/>"##,
        x(0.0),
        y(0.0),
        x(1.0),
        y(result.capacity),
        x(max_load),
        y(result.capacity)
    );
    // One line per system.
    for &(system, color, stroke) in &styles {
        let points: Vec<String> = result
            .points_of(system)
            .map(|p| format!("{:.1},{:.1}", x(p.load), y(p.goodput)))
            .collect();
        if points.is_empty() {
            continue;
        }
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{color}" {stroke}/>"#,
            points.join(" ")
        );
        for p in result.points_of(system) {
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"><title>{}: {}x, {:.1} req/s good, {} rejected</title></circle>"#,
                x(p.load),
                y(p.goodput),
                system.name(),
                p.load,
                p.goodput,
                p.rejected
            );
        }
    }
    // Legend.
    let legend_x = LEFT + plot_width + 20.0;
    let mut legend_y = TOP + 10.0;
    for &(system, color, stroke) in &styles {
        if result.points_of(system).next().is_none() {
            continue;
        }
        let _ = writeln!(
            svg,
            r#"<line x1="{legend_x}" y1="{legend_y}" x2="{}" y2="{legend_y}" stroke="{color}" {stroke}/><text x="{}" y="{}">{}</text>"#,
            legend_x + 24.0,
            legend_x + 30.0,
            legend_y + 4.0,
            system.name()
        );
        legend_y += 22.0;
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{legend_x}" y1="{legend_y}" x2="{}" y2="{legend_y}" stroke="#888" stroke-dasharray="5,4"/><text x="{}" y="{}">ideal</text>"##,
        legend_x + 24.0,
        legend_x + 30.0,
        legend_y + 4.0
    );
    svg.push_str("</svg>\n");
    svg
}

/// The smallest of 1, 2, 2.5 or 5 times a power of ten that is at least
/// `value`, so the axis has round ticks.
fn nice_ceiling(value: f64) -> f64 {
    let value = value.max(1.0);
    let magnitude = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&candidate| candidate >= value)
        .unwrap_or(10.0 * magnitude)
}
