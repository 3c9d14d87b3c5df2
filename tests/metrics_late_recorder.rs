//! A gate built before the metrics recorder is installed still exports its
//! series: at its first event after the recorder appears it registers them,
//! says so, and sets every one, counters included from the start. One test
//! in this binary: it installs the process's global recorder.
#![cfg(feature = "metrics")]

#[path = "support/logs.rs"]
mod logs;

use futures::FutureExt;
use metrics_exporter_prometheus::PrometheusBuilder;
use tower_admission::{AdmissionConfig, EngineCapacity, Gate};

const LATE: &str = "a metrics recorder was installed after the admission gate was built";

/// A Prometheus sample's value, if the series is rendered.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.trim().parse().unwrap())
}

#[test]
fn a_gate_built_before_the_recorder_registers_its_series_at_its_next_event() {
    let logs = logs::Logs::default();
    let _logging = logs.set_default();
    let early = Gate::new(
        AdmissionConfig::new()
            .metrics_prefix("early")
            .capacity(EngineCapacity::new(4, 2)),
    );
    // Counted before any recorder exists.
    let first = early.acquire(None).now_or_never().unwrap().unwrap();

    let prometheus = PrometheusBuilder::new().install_recorder().unwrap();
    assert!(
        !prometheus.render().contains("early_"),
        "no event yet, so nothing registered"
    );
    assert!(logs.containing(LATE).is_empty());

    drop(first); // the gate's first event after the recorder was installed
    let text = prometheus.render();
    let unranked = r#"{dp_rank="unspecified"}"#;
    assert_eq!(
        sample(&text, &format!("early_request_receive_total{unranked}")),
        Some(1.0),
        "the arrival before the recorder is counted\n{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"early_request_admit_total{dp_rank="unspecified",source="direct"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, &format!("early_engine_request_count{unranked}")),
        Some(0.0)
    );
    // The limits, set by the whole refresh that followed the registration.
    assert_eq!(
        sample(&text, r#"early_engine_request_limit{dp_rank="1"}"#),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, &format!("early_engine_request_limit{unranked}")),
        Some(8.0)
    );
    assert_eq!(logs.containing(LATE).len(), 1, "{:?}", logs.lines());

    // Later events record as usual, and register nothing again.
    let second = early.acquire(Some(1)).now_or_never().unwrap().unwrap();
    let text = prometheus.render();
    assert_eq!(
        sample(&text, r#"early_engine_request_count{dp_rank="1"}"#),
        Some(1.0),
        "{text}"
    );
    drop(second);
    assert_eq!(logs.containing(LATE).len(), 1);

    // A gate built after the recorder registers at once, and says nothing.
    let _after = Gate::new(AdmissionConfig::new().metrics_prefix("after"));
    assert_eq!(
        sample(
            &prometheus.render(),
            &format!("after_request_queue_limit{unranked}")
        ),
        Some(20000.0)
    );
    assert_eq!(logs.containing(LATE).len(), 1);
}
