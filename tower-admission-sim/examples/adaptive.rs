//! The adaptive engine request waiting limit, evaluated on the simulated
//! engine in virtual time (`tower_admission_sim::adaptive`): steady
//! overload in front of an engine that reports nothing, slowed to half
//! speed for the middle third of the run and back to full speed, against a
//! waiting limit sized by hand with Little's law and against the engine
//! reporting its capacity. Prints the sizing and a table, and writes a plot
//! of the waiting limit over time.
//!
//! ```sh
//! cargo run --release -p tower-admission-sim --example adaptive
//! cargo run --release -p tower-admission-sim --example adaptive -- --load 3 --seed 2 --out target/eval
//! ```

#[path = "plot/mod.rs"]
mod plot;

use std::path::PathBuf;
use std::time::Duration;

use tower_admission_sim::adaptive::{AdaptiveEvaluation, Change, Run, Setup, Sizing};

const USAGE: &str = "\
usage: adaptive [--load X] [--seed N] [--phase SECONDS] [--slowdown F | --longer-decode F]
                [--ttft-slo SECONDS] [--out DIR]

  --load X         offered load as a multiple of the engine's capacity (default 2)
  --seed N         workload seed (default 1)
  --phase S        length of each phase: full speed, slowed, full speed (default 60)
  --slowdown F     step-time factor of the middle phase (default 2: half speed)
  --longer-decode F  instead, requests of the middle phase generate F times
                   more tokens
  --ttft-slo S     time-to-first-token objective in seconds (default 2)
  --out DIR        where to write adaptive-limit.svg (default target)";

fn main() {
    let (evaluation, out) = match parse() {
        Ok(parsed) => parsed,
        Err(error) => {
            if !error.is_empty() {
                eprintln!("adaptive: {error}");
            }
            eprintln!("{USAGE}");
            std::process::exit(if error.is_empty() { 0 } else { 2 });
        }
    };
    let sizing = evaluation.size();
    print_sizing(&evaluation, &sizing);
    let runs = evaluation.run(&sizing);
    print_table(&evaluation, &runs);
    print_goals(&evaluation, &sizing, &runs);
    std::fs::create_dir_all(&out).expect("create the output directory");
    let path = out.join("adaptive-limit.svg");
    std::fs::write(&path, limit_plot(&evaluation, &sizing, &runs)).expect("write the plot");
    let csv = out.join("adaptive-limit.csv");
    std::fs::write(&csv, trace_csv(&runs)).expect("write the trace");
    println!("\nwrote {} and {}", path.display(), csv.display());
}

fn parse() -> Result<(AdaptiveEvaluation, PathBuf), String> {
    let mut evaluation = AdaptiveEvaluation::default();
    let mut out = PathBuf::from("target");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Err(String::new());
        }
        let value = args.next().ok_or(format!("{arg} needs a value"))?;
        let number = || -> Result<f64, String> {
            value
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or(format!("invalid {arg}: {value:?} (a positive number)"))
        };
        match arg.as_str() {
            "--load" => evaluation.load = number()?,
            "--seed" => {
                evaluation.sweep.seed = value
                    .parse()
                    .map_err(|_| format!("invalid --seed: {value:?}"))?
            }
            "--phase" => evaluation.phase = Duration::from_secs_f64(number()?),
            "--slowdown" => evaluation.change = Change::Slowdown(number()?),
            "--longer-decode" => evaluation.change = Change::LongerDecode(number()?),
            "--ttft-slo" => evaluation.sweep.slo.ttft = Duration::from_secs_f64(number()?),
            "--out" => out = value.into(),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    Ok((evaluation, out))
}

fn print_sizing(evaluation: &AdaptiveEvaluation, sizing: &Sizing) {
    println!(
        "engine: max_num_seqs {}, {} rank(s); ShareGPT-like Poisson arrivals at {}x capacity; \
         objective TTFT <= {:?}; seed {}",
        evaluation.sweep.engine.max_num_seqs,
        evaluation.sweep.engine.dp_ranks,
        evaluation.load,
        evaluation.sweep.slo.ttft,
        evaluation.sweep.seed
    );
    let changed = evaluation.change.name();
    for (name, calibration) in [
        ("as configured", &sizing.full),
        (changed.as_str(), &sizing.slowed),
    ] {
        let estimate = calibration.estimate;
        println!(
            "{name:>14}: capacity {:.1} req/s; Little's law at 0.9x: L {:.2}, C {:.1}/s, W {:.1} ms \
             -> waiting limit {}",
            calibration.capacity,
            estimate.mean_waiting(),
            estimate.admission_rate(),
            estimate.mean_wait().as_secs_f64() * 1e3,
            calibration.waiting_limit
        );
    }
}

fn print_table(evaluation: &AdaptiveEvaluation, runs: &[Run]) {
    let changed = evaluation.change.name();
    let phases = ["before", changed.as_str(), "after"];
    println!(
        "\n| setup | phase | goodput (req/s) | rejected | p99 TTFT | waiting limit (2nd half mean) | settled after |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for run in runs {
        for (phase, name) in run.phases.iter().zip(phases) {
            let rejected = phase.rejected as f64 / phase.arrivals.max(1) as f64;
            println!(
                "| {} | {name} | {:.1} | {:.0}% | {} | {:.2} | {} |",
                run.setup.name(),
                phase.goodput,
                rejected * 100.0,
                phase
                    .p99_ttft
                    .map_or_else(|| "-".to_owned(), |p| p.to_string()),
                phase.settled_limit,
                phase
                    .settled_after
                    .map_or_else(|| "never".to_owned(), |d| format!("{} s", d.as_secs())),
            );
        }
    }
}

fn run_of(runs: &[Run], setup: Setup) -> Option<&Run> {
    runs.iter().find(|run| run.setup == setup)
}

fn print_goals(evaluation: &AdaptiveEvaluation, sizing: &Sizing, runs: &[Run]) {
    let (Some(adaptive), Some(hand)) = (
        run_of(runs, Setup::Adaptive),
        run_of(runs, Setup::HandSized),
    ) else {
        return;
    };
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    println!("\ngoals (adaptive against hand-sized):");
    let little = sizing.full.waiting_limit as f64;
    let settled = adaptive.phases[0].settled_limit;
    println!(
        "- steady {}x: limit settles at {settled:.2}, Little's law {little}: {:+.0}% (goal within 25%): {}",
        evaluation.load,
        (settled / little - 1.0) * 100.0,
        verdict((settled / little - 1.0).abs() <= 0.25)
    );
    for (index, goal, name) in [
        (0, 0.95, "steady"),
        (1, 0.9, "changed phase"),
        (2, 0.9, "after"),
    ] {
        let ratio =
            adaptive.phases[index].goodput / hand.phases[index].goodput.max(f64::MIN_POSITIVE);
        println!(
            "- {name}: goodput {:.1} against {:.1} req/s: {ratio:.2} (goal >= {goal}): {}",
            adaptive.phases[index].goodput,
            hand.phases[index].goodput,
            verdict(ratio >= goal)
        );
    }
    let little = [sizing.slowed.waiting_limit, sizing.full.waiting_limit];
    for (index, name) in [(1, "follows the change"), (2, "recovers")] {
        let phase = &adaptive.phases[index];
        println!(
            "- {name}: settled after {} at {:.2} (goal within 30 s): {}; Little's law in this phase {}",
            phase
                .settled_after
                .map_or_else(|| "never".to_owned(), |d| format!("{} s", d.as_secs())),
            phase.settled_limit,
            verdict(
                phase
                    .settled_after
                    .is_some_and(|d| d <= Duration::from_secs(30))
            ),
            little[index - 1]
        );
    }
}

/// Every run's trace: `setup,seconds,waiting limit,waiting count`.
fn trace_csv(runs: &[Run]) -> String {
    let mut csv = String::from("setup,seconds,waiting_limit,engine_waiting\n");
    for run in runs {
        for &(at, limit, waiting) in &run.trace {
            csv.push_str(&format!(
                "\"{}\",{at:.1},{limit},{waiting}\n",
                run.setup.name()
            ));
        }
    }
    csv
}

fn limit_plot(evaluation: &AdaptiveEvaluation, sizing: &Sizing, runs: &[Run]) -> String {
    let phase = evaluation.phase.as_secs_f64();
    let x_max = phase * 3.0;
    let series: Vec<plot::Series> = runs
        .iter()
        .filter(|run| matches!(run.setup, Setup::Adaptive | Setup::HandSized))
        .map(|run| {
            let (color, stroke) = match run.setup {
                Setup::Adaptive => ("#2ca02c", r#"stroke-width="1.5""#),
                _ => ("#1f77b4", r#"stroke-width="2.5" stroke-dasharray="6,4""#),
            };
            // One-second means: the raw trace steps between integers.
            let points = run
                .trace
                .chunks(10)
                .map(|chunk| {
                    let at = chunk[0].0;
                    let mean =
                        chunk.iter().map(|&(_, l, _)| l as f64).sum::<f64>() / chunk.len() as f64;
                    (at, mean)
                })
                .filter(|&(at, _)| at <= x_max)
                .collect();
            plot::Series {
                name: format!("{} (1 s mean)", run.setup.name()),
                color,
                stroke,
                points,
            }
        })
        .collect();
    let peak = series
        .iter()
        .flat_map(|s| s.points.iter().map(|&(_, y)| y))
        .fold(sizing.full.waiting_limit as f64, f64::max);
    let little_full = sizing.full.waiting_limit as f64;
    let little_slow = sizing.slowed.waiting_limit as f64;
    plot::render(&plot::Chart {
        title: format!(
            "engine request waiting limit over time, {}x load, {} from {phase:.0} s to {:.0} s",
            evaluation.load,
            evaluation.change.name(),
            phase * 2.0
        ),
        x_label: "simulated time (s)".into(),
        y_label: "waiting limit per rank".into(),
        x_max,
        x_ticks: (0..=6)
            .map(|i| {
                (
                    i as f64 * x_max / 6.0,
                    format!("{:.0}", i as f64 * x_max / 6.0),
                )
            })
            .collect(),
        log_y: false,
        y_min: 0.0,
        y_max: plot::nice_ceiling(peak * 1.2),
        y_tick: |value| format!("{value:.0}"),
        reference: Some((
            vec![
                (0.0, little_full),
                (phase, little_full),
                (phase, little_slow),
                (phase * 2.0, little_slow),
                (phase * 2.0, little_full),
                (x_max, little_full),
            ],
            "Little's law (0.9x)".into(),
        )),
        marker: Some((phase, evaluation.change.name())),
        series,
        dots: false,
        note: None,
    })
}
