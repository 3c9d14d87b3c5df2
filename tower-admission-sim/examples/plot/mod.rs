//! Line charts as SVG text, for the evaluation examples (`overload`,
//! `qos`): no plotting dependency, a file any browser opens.

#![allow(dead_code)] // each example uses part of it

use std::fmt::Write as _;

/// One line of a chart and its legend entry.
pub struct Series {
    pub name: String,
    /// An SVG colour.
    pub color: &'static str,
    /// More SVG stroke attributes (width, dashes, opacity).
    pub stroke: &'static str,
    pub points: Vec<(f64, f64)>,
}

/// A chart: lines over an x axis from 0 to `x_max`, on a linear or a log
/// y axis.
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_max: f64,
    /// Where the x axis is labelled, and how.
    pub x_ticks: Vec<(f64, String)>,
    /// Log scale (for latencies): a grid line per decade.
    pub log_y: bool,
    pub y_min: f64,
    pub y_max: f64,
    /// How a y grid line is labelled.
    pub y_tick: fn(f64) -> String,
    /// A dashed grey reference line: its points and legend label.
    pub reference: Option<(Vec<(f64, f64)>, String)>,
    /// A dashed vertical line at an x, labelled at its top.
    pub marker: Option<(f64, String)>,
    pub series: Vec<Series>,
    /// A dot (with its value as a tooltip) at every point.
    pub dots: bool,
    /// A footnote under the x axis label.
    pub note: Option<String>,
}

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 460.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

/// The chart as an SVG document.
pub fn render(chart: &Chart) -> String {
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let x = |value: f64| LEFT + value / chart.x_max * plot_width;
    let scale = |v: f64| {
        if chart.log_y {
            (v.log10() - chart.y_min.log10()) / (chart.y_max.log10() - chart.y_min.log10())
        } else {
            (v - chart.y_min) / (chart.y_max - chart.y_min)
        }
    };
    let y = |v: f64| TOP + plot_height - scale(v).clamp(0.0, 1.0) * plot_height;
    let polyline = |points: &[(f64, f64)]| -> String {
        let points: Vec<String> = points
            .iter()
            .map(|&(a, b)| format!("{:.1},{:.1}", x(a), y(b)))
            .collect();
        points.join(" ")
    };

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
        r#"<text x="{}" y="24" font-size="15" text-anchor="middle">{}</text>"#,
        LEFT + plot_width / 2.0,
        chart.title
    );
    // Horizontal grid: five steps, or one per decade on a log scale.
    let y_ticks: Vec<f64> = if chart.log_y {
        let mut tick = chart.y_min;
        let mut ticks = Vec::new();
        while tick <= chart.y_max * 1.0001 {
            ticks.push(tick);
            tick *= 10.0;
        }
        ticks
    } else {
        (0..=5)
            .map(|step| chart.y_min + (chart.y_max - chart.y_min) * step as f64 / 5.0)
            .collect()
    };
    for value in y_ticks {
        let at = y(value);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{at:.1}" x2="{:.1}" y2="{at:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_width,
            LEFT - 8.0,
            at + 4.0,
            (chart.y_tick)(value)
        );
    }
    for (value, label) in &chart.x_ticks {
        let at = x(*value);
        let _ = writeln!(
            svg,
            r##"<line x1="{at:.1}" y1="{TOP}" x2="{at:.1}" y2="{:.1}" stroke="#eee"/><text x="{at:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
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
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + plot_width / 2.0,
        HEIGHT - 15.0,
        chart.x_label
    );
    if let Some(note) = &chart.note {
        let _ = writeln!(
            svg,
            r##"<text x="{LEFT}" y="{:.1}" font-size="10" fill="#555">{note}</text>"##,
            HEIGHT - 2.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text transform="translate(20 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + plot_height / 2.0,
        chart.y_label
    );
    if let Some((at, label)) = &chart.marker {
        let at = x(*at);
        let _ = writeln!(
            svg,
            r##"<line x1="{at:.1}" y1="{TOP}" x2="{at:.1}" y2="{:.1}" stroke="#555" stroke-dasharray="4,4"/><text x="{:.1}" y="{:.1}" fill="#555">{label}</text>"##,
            TOP + plot_height,
            at + 4.0,
            TOP + 14.0
        );
    }
    if let Some((points, _)) = &chart.reference {
        let _ = writeln!(
            svg,
            r##"<polyline points="{}" fill="none" stroke="#888" stroke-dasharray="5,4"/>"##,
            polyline(points)
        );
    }
    let drawn = || {
        chart
            .series
            .iter()
            .filter(|series| !series.points.is_empty())
    };
    for series in drawn() {
        let (color, stroke) = (series.color, series.stroke);
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{color}" {stroke}/>"#,
            polyline(&series.points)
        );
        if chart.dots {
            for &(a, b) in &series.points {
                let _ = writeln!(
                    svg,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"><title>{}: {a}, {b:.3}</title></circle>"#,
                    x(a),
                    y(b),
                    series.name,
                );
            }
        }
    }
    let legend_x = LEFT + plot_width + 20.0;
    let mut legend_y = TOP + 10.0;
    let mut legend = |svg: &mut String, color: &str, stroke: &str, label: &str| {
        let _ = writeln!(
            svg,
            r#"<line x1="{legend_x}" y1="{legend_y}" x2="{}" y2="{legend_y}" stroke="{color}" {stroke}/><text x="{}" y="{}">{label}</text>"#,
            legend_x + 24.0,
            legend_x + 30.0,
            legend_y + 4.0,
        );
        legend_y += 22.0;
    };
    for series in drawn() {
        legend(&mut svg, series.color, series.stroke, &series.name);
    }
    if let Some((_, label)) = &chart.reference {
        legend(&mut svg, "#888", r#"stroke-dasharray="5,4""#, label);
    }
    svg.push_str("</svg>\n");
    svg
}

/// The smallest of 1, 2, 2.5 or 5 times a power of ten that is at least
/// `value`, so the axis has round ticks.
pub fn nice_ceiling(value: f64) -> f64 {
    let value = value.max(1.0);
    let magnitude = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&candidate| candidate >= value)
        .unwrap_or(10.0 * magnitude)
}

/// A log-scale tick in seconds, as `100 ms` or `10 s`.
pub fn seconds_tick(value: f64) -> String {
    if value < 1.0 {
        format!("{:.0} ms", value * 1e3)
    } else {
        format!("{value:.0} s")
    }
}
