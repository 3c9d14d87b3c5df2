//! The overload sweep's two plots, goodput and time to first token
//! against offered load, one line per system in a style of its own.

use super::*;

/// Line styles: (colour, extra stroke attributes). Systems that draw the
/// same curve are told apart by width and dashes.
fn style(system: System) -> (&'static str, &'static str) {
    match system {
        System::NoAdmission => ("#d62728", r#"stroke-width="7" stroke-opacity="0.4""#),
        System::ConcurrencyLimit => ("#ff7f0e", r#"stroke-width="2.5" stroke-dasharray="8,5""#),
        System::TgiSemaphore => ("#9467bd", r#"stroke-width="2.5""#),
        System::VllmCap => ("#8c564b", r#"stroke-width="5" stroke-opacity="0.5""#),
        System::Gate => ("#1f77b4", r#"stroke-width="2.5""#),
        System::GateLittlesLaw => ("#17becf", r#"stroke-width="2" stroke-dasharray="3,3""#),
        System::GateSizedForObjective => ("#2ca02c", r#"stroke-width="2.5""#),
        System::GateTtftObjective => ("#e377c2", r#"stroke-width="2.5" stroke-dasharray="2,4""#),
        System::GateTokenBudget => ("#bcbd22", r#"stroke-width="2" stroke-dasharray="10,3""#),
        System::GateControlledDelay => ("#7f7f7f", r#"stroke-width="2.5" stroke-dasharray="6,2""#),
    }
}

/// The lines of `config.systems`, each from its points of the sweep.
fn lines(
    result: &Sweep,
    config: &SweepConfig,
    value: impl Fn(&Point) -> Option<f64>,
) -> Vec<plot::Series> {
    config
        .systems
        .iter()
        .map(|&system| {
            let (color, stroke) = style(system);
            plot::Series {
                name: system.name().to_owned(),
                color,
                stroke,
                points: result
                    .points_of(system)
                    .filter_map(|p| Some((p.load, value(p)?)))
                    .collect(),
            }
        })
        .collect()
}

/// The x axis of a sweep: offered load, a tick at each load run.
fn load_ticks(config: &SweepConfig) -> (f64, Vec<(f64, String)>) {
    let max_load = config.loads.iter().copied().fold(1.0, f64::max);
    let ticks = std::iter::once(0.0)
        .chain(config.loads.iter().copied())
        .map(|load| (load, format!("{load}x")))
        .collect();
    (max_load, ticks)
}

pub(crate) fn goodput_plot(result: &Sweep, config: &SweepConfig, scenario: &Scenario) -> String {
    let capacity = result.capacity();
    let (max_load, x_ticks) = load_ticks(config);
    let max_goodput = result
        .points
        .iter()
        .map(|p| p.goodput)
        .fold(capacity, f64::max);
    plot::render(&plot::Chart {
        title: format!(
            "{}: goodput (TTFT ≤ {:?}, TPOT ≤ {:?})",
            scenario.name, config.slo.ttft, config.slo.tpot
        ),
        x_label: format!("offered load (x capacity = {capacity:.1} req/s)"),
        y_label: "goodput (req/s)".into(),
        x_max: max_load,
        x_ticks,
        log_y: false,
        y_min: 0.0,
        y_max: plot::nice_ceiling(max_goodput * 1.1),
        y_tick: |value| format!("{value:.0}"),
        reference: Some((
            vec![(0.0, 0.0), (1.0, capacity), (max_load, capacity)],
            "ideal".into(),
        )),
        marker: None,
        series: lines(result, config, |p| Some(p.goodput)),
        dots: true,
        note: None,
    })
}

pub(crate) fn ttft_plot(result: &Sweep, config: &SweepConfig, scenario: &Scenario) -> String {
    let objective = config.slo.ttft.as_secs_f64();
    let (max_load, x_ticks) = load_ticks(config);
    let values: Vec<f64> = result
        .points
        .iter()
        .filter_map(|p| p.ttft_p99.map(|t| t.value.as_secs_f64().max(0.001)))
        .collect();
    let y_min = values.iter().copied().fold(objective, f64::min);
    let y_max = values.iter().copied().fold(objective, f64::max);
    plot::render(&plot::Chart {
        title: format!(
            "{}: p99 TTFT of admitted requests (objective {:?})",
            scenario.name, config.slo.ttft
        ),
        x_label: "offered load (x capacity)".into(),
        y_label: "p99 TTFT (log scale)".into(),
        x_max: max_load,
        x_ticks,
        log_y: true,
        y_min: 10f64.powf(y_min.log10().floor()),
        y_max: 10f64.powf(y_max.log10().ceil()),
        y_tick: plot::seconds_tick,
        reference: Some((
            vec![(0.0, objective), (max_load, objective)],
            "objective".into(),
        )),
        marker: None,
        series: lines(result, config, |p| {
            p.ttft_p99.map(|t| t.value.as_secs_f64().max(0.001))
        }),
        dots: true,
        note: Some(
            "where requests still waited for a first token at the end of a run, p99 is a lower bound"
                .into(),
        ),
    })
}
