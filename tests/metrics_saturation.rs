//! One saturation signal: `Gate::saturation` and `Gate::rank_saturation`
//! (0 idle, 1 when the next request would be rejected), and the gauge
//! `<prefix>_saturation{dp_rank}` with `AdmissionConfig::saturation_metric`
//! (the worker's under `unspecified`, set at every event whichever rank it
//! concerned); without the setting there is no such series.
#![cfg(feature = "metrics")]

use std::collections::BTreeMap;

use futures::FutureExt;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower_admission::{AdmissionConfig, EngineCapacity, Gate};

/// The saturation gauges by `dp_rank`, from one snapshot (a snapshot
/// resets what it read).
fn gauges(snapshotter: &Snapshotter) -> BTreeMap<String, f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let rank = key
                .labels()
                .find(|l| l.key() == "dp_rank")?
                .value()
                .to_owned();
            match value {
                DebugValue::Gauge(v) if key.name() == "admission_saturation" => {
                    Some((rank, v.into_inner()))
                }
                _ => None,
            }
        })
        .collect()
}

#[test]
fn saturation_is_demand_over_what_the_gate_can_hold() {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(2)
            .request_queue_limit(2)
            .capacity(EngineCapacity::new(2, 2)),
    );
    assert_eq!(gate.saturation(), 0.0);
    // Rank 0: engine full (2 of 2), one of 2 queued. Combined: 2 of 4 in
    // the engine, 1 of 4 queued.
    let _a = gate.acquire(Some(0)).now_or_never().unwrap().unwrap();
    let _b = gate.acquire(Some(0)).now_or_never().unwrap().unwrap();
    let _c = gate.acquire(Some(0));
    assert_eq!(gate.rank_saturation(0), 0.75);
    assert_eq!(gate.saturation(), (0.5 * 4.0 + 0.25 * 4.0) / 8.0);
    // Rank 1 is idle, but a ranked request needs the combined room too.
    assert_eq!(gate.rank_saturation(1), gate.saturation());
    let _d = gate.acquire(Some(0));
    assert_eq!(gate.rank_saturation(0), 1.0);
    assert!(gate.acquire(Some(0)).now_or_never().unwrap().is_err());
    // An unknown rank is unranked: the worker's.
    assert_eq!(gate.rank_saturation(9), gate.saturation());
}

#[test]
fn the_gauge_follows_the_gate_and_the_worker_series_every_event() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let gate = Gate::new(
            AdmissionConfig::new()
                .engine_request_limit(1)
                .request_queue_limit(1)
                .saturation_metric(true)
                .capacity(EngineCapacity::new(1, 2)),
        );
        let running = gate.acquire(Some(1)).now_or_never().unwrap().unwrap();
        // Rank 1's event sets rank 1's series and the worker's.
        let after = gauges(&snapshotter);
        assert_eq!(after.get("1"), Some(&0.5));
        assert_eq!(after.get("unspecified"), Some(&0.25));
        drop(running);
        let after = gauges(&snapshotter);
        assert_eq!(after.get("1"), Some(&0.0));
        assert_eq!(after.get("unspecified"), Some(&0.0));
    });
}

#[test]
fn without_the_setting_there_is_no_saturation_series() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let gate = Gate::new(AdmissionConfig::new());
        let _permit = gate.acquire(None).now_or_never().unwrap().unwrap();
        assert!(gauges(&snapshotter).is_empty());
        assert!(gate.saturation() > 0.0);
    });
}
