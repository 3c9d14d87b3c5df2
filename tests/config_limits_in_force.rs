//! The limits in force, per rank and combined, with where each comes from:
//! logged when the gate is built and when a capacity report changes them,
//! and the worked example of the crate docs' configuration section (two ranks of 4, queue 8: unranked
//! traffic gets 8 running and 16 queued).

#[path = "support/gate.rs"]
mod gate_support;
#[path = "support/logs.rs"]
mod logs;

use futures::FutureExt;
use tower_admission::{AdmissionConfig, Counts, EngineCapacity, Gate, LimitSource, RejectionScope};

const LOGGED: &str = "admission limits in force";

/// Four per rank (the request limit in code, the waiting limit from the
/// canonical variable), a queue of 8 per rank from the alias.
fn config() -> AdmissionConfig {
    AdmissionConfig::from_lookup(|variable| match variable {
        "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT" => Some("4".into()),
        "DYN_DYNAMO_REQUEST_QUEUE_LIMIT" => Some("8".into()),
        _ => None,
    })
    .engine_request_limit(4)
}

#[test]
fn the_gate_logs_its_limits_when_built_and_when_a_report_changes_them() {
    let logs = logs::Logs::default();
    logs.capture(|| {
        let gate = Gate::new(config());
        let built = logs.containing(LOGGED);
        assert_eq!(built.len(), 1, "{built:?}");
        assert!(built[0].contains(" INFO "), "{built:?}");
        assert!(
            built[0].contains(
                "(the gate was built): 1 rank (assumed: the engine has not reported its capacity)"
            ),
            "{built:?}"
        );

        gate.report_capacity(EngineCapacity::new(256, 2));
        let reported = logs.containing(LOGGED);
        assert_eq!(reported.len(), 2, "{reported:?}");
        assert!(
            reported[1].contains(
                "(the engine reported its capacity): 2 ranks (reported: max_num_seqs 256, dp_ranks 2); \
                 per rank: engine request limit 4 (set in code), \
                 engine request waiting limit 4 (variable DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT), \
                 request queue limit 8 (variable DYN_DYNAMO_REQUEST_QUEUE_LIMIT); \
                 combined, for unranked requests: engine request limit 8, \
                 engine request waiting limit 8, request queue limit 16"
            ),
            "{reported:?}"
        );
        assert!(reported[1].contains("combined_request_queue_limit=16"), "{reported:?}");

        // Engines report again and again: the same limits are not logged again.
        gate.report_capacity(EngineCapacity::new(256, 2));
        gate.report_capacity(EngineCapacity::new(512, 2)); // every limit is explicit
        assert_eq!(logs.containing(LOGGED).len(), 2);

        gate.report_capacity(EngineCapacity::new(256, 3));
        let grown = logs.containing(LOGGED);
        assert_eq!(grown.len(), 3, "{grown:?}");
        assert!(
            grown[2].contains("engine request limit 12, engine request waiting limit 12, request queue limit 24"),
            "{grown:?}"
        );
    });
}

#[test]
fn defaults_say_what_they_follow() {
    let gate = Gate::new(AdmissionConfig::new());
    let before = gate.limits_in_force();
    assert_eq!(before.sources.engine_request_limit, LimitSource::Default);
    assert_eq!(before.ranks, 1);
    assert!(
        before
            .to_string()
            .contains("engine request limit 10000 (default until the engine reports)"),
        "{before}"
    );
    gate.report_capacity(EngineCapacity::new(64, 2));
    let after = gate.limits_in_force();
    assert_eq!(after.per_rank.request_queue_limit, 128);
    assert_eq!(after.combined().request_queue_limit, 256);
    assert!(
        after
            .to_string()
            .contains("request queue limit 128 (default: 2 × the reported max_num_seqs)"),
        "{after}"
    );
}

#[cfg(feature = "clap")]
#[test]
fn a_flag_is_named_as_the_source() {
    use clap::Parser;

    #[derive(Parser)]
    struct Worker {
        #[command(flatten)]
        admission: tower_admission::AdmissionArgs,
    }
    let worker = Worker::parse_from(["worker", "--engine-request-limit", "4"]);
    let config = worker.admission.resolve_with(|variable| {
        (variable == "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT").then(|| "9".into())
    });
    let sources = Gate::new(config).limits_in_force().sources;
    assert_eq!(
        sources.engine_request_limit,
        LimitSource::Flag("--engine-request-limit")
    );
    assert_eq!(sources.request_queue_limit, LimitSource::Default);
}

#[test]
fn unranked_traffic_gets_the_combined_capacity_of_both_ranks() {
    // The worked example: two reported ranks, per-rank limits of 4, a queue
    // of 8 per rank.
    let gate = Gate::new(config().capacity(EngineCapacity::new(256, 2)));
    let mut admitted = Vec::new();
    let mut queued = Vec::new();
    for _ in 0..8 {
        admitted.push(gate.acquire(None).now_or_never().unwrap().unwrap());
    }
    for _ in 0..16 {
        let request = gate.acquire(None);
        assert!(request.is_queued());
        queued.push(request);
    }
    assert_eq!(gate.snapshot().unranked, Counts::new(8, 8, 16));
    let rejected = gate.acquire(None).now_or_never().unwrap().unwrap_err();
    assert_eq!(rejected.scope(), RejectionScope::Worker);

    // A ranked request also fits only the combined capacity, now full.
    let ranked = gate.acquire(Some(0)).now_or_never().unwrap();
    assert!(ranked.is_err(), "the combined capacity is full");
    drop(queued);
    drop(admitted);
    gate_support::assert_idle(&gate.snapshot());
}
