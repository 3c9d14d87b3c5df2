//! The metrics of behaviour §8 as Prometheus renders them: the age of the
//! oldest queued request per `dp_rank` (stale between events until
//! `Gate::refresh_metrics`), the per-priority series that exist only with
//! configured priority bands, `reason="displaced"`, and never a tenant.
#![cfg(feature = "metrics")]

use tower_admission_testkit::exposition;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::FutureExt;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use tower_admission::{
    Acquire, AdmissionConfig, Descriptor, EngineCapacity, Gate, Permit, RejectionReason, Tenant,
};

use self::exposition::Exposition;

/// A gate whose series are registered with a fresh Prometheus recorder.
fn gate_with(config: AdmissionConfig) -> (Gate, PrometheusRecorder) {
    let recorder = PrometheusBuilder::new().build_recorder();
    let gate = metrics::with_local_recorder(&recorder, || Gate::new(config.metrics_prefix("qos")));
    (gate, recorder)
}

fn scrape(recorder: &PrometheusRecorder) -> Exposition {
    Exposition::parse(&recorder.handle().render())
}

/// Refreshes the gate's time-dependent gauges, then scrapes: what a
/// `/metrics` handler does.
fn refresh_and_scrape(gate: &Gate, recorder: &PrometheusRecorder) -> Exposition {
    gate.refresh_metrics();
    scrape(recorder)
}

fn oldest_age(exposition: &Exposition, dp_rank: &str) -> f64 {
    exposition.value(
        "qos_request_queue_oldest_age_seconds",
        &[("dp_rank", dp_rank)],
    )
}

fn admitted(acquire: Acquire) -> Permit {
    acquire
        .now_or_never()
        .expect("decided at once")
        .expect("admitted")
}

fn queued(acquire: Acquire) -> Acquire {
    assert!(acquire.is_queued(), "{acquire:?}");
    acquire
}

/// Polls a queued request once: its permit, once admitted.
fn poll_admitted(acquire: &mut Acquire) -> Permit {
    acquire
        .now_or_never()
        .expect("admitted by now")
        .expect("admitted, not rejected")
}

/// The label names used by any sample of the exposition.
fn label_names(exposition: &Exposition) -> BTreeSet<String> {
    exposition
        .samples
        .keys()
        .flat_map(|(_, labels)| labels.keys().cloned())
        .collect()
}

/// The label sets of every sample named `name`, as `(dp_rank, priority)`.
fn rank_priority_pairs(exposition: &Exposition, name: &str) -> BTreeSet<(String, String)> {
    exposition
        .samples
        .keys()
        .filter(|(series, _)| series == name)
        .map(|(_, labels)| {
            assert_eq!(labels.len(), 2, "{name}: {labels:?}");
            (labels["dp_rank"].clone(), labels["priority"].clone())
        })
        .collect()
}

/// The sum of every sample named `name` with this `dp_rank`.
fn sum(exposition: &Exposition, name: &str, dp_rank: &str) -> f64 {
    exposition
        .samples
        .iter()
        .filter(|((series, labels), _)| series == name && labels["dp_rank"] == dp_rank)
        .map(|(_, value)| value)
        .sum()
}

// ----- the age of the oldest queued request --------------------------------

#[tokio::test(start_paused = true)]
async fn the_oldest_age_follows_the_gates_clock_and_is_current_after_a_refresh() {
    // Honouring client deadlines makes the gate keep time on its clock:
    // here tokio's, paused.
    let (gate, recorder) = gate_with(
        AdmissionConfig::new()
            .request_deadlines(true)
            .clock(|| tokio::time::Instant::now().into_std())
            .engine_request_limit(1)
            .request_queue_limit(4)
            .capacity(EngineCapacity::new(8, 2)),
    );
    let every_rank = ["0", "1", "unspecified"];
    for rank in every_rank {
        assert_eq!(oldest_age(&scrape(&recorder), rank), 0.0, "{rank}: empty");
    }

    let mut running = admitted(gate.acquire(Some(0)));
    let mut first = queued(gate.acquire(Some(0)));
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(
        oldest_age(&scrape(&recorder), "0"),
        0.0,
        "stale: no event since the arrival"
    );
    let exposition = refresh_and_scrape(&gate, &recorder);
    assert_eq!(oldest_age(&exposition, "0"), 3.0, "refreshed");
    assert_eq!(oldest_age(&exposition, "1"), 0.0, "rank 1 has no queue");
    assert_eq!(oldest_age(&exposition, "unspecified"), 0.0);

    // An event on the rank measures the age too: the oldest is still first.
    let mut second = queued(gate.acquire(Some(0)));
    assert_eq!(oldest_age(&scrape(&recorder), "0"), 3.0);
    tokio::time::advance(Duration::from_millis(1500)).await;
    assert_eq!(oldest_age(&refresh_and_scrape(&gate, &recorder), "0"), 4.5);

    // The first leaves the queue: the second, queued 1.5 s ago, is oldest.
    drop(running);
    running = poll_admitted(&mut first);
    assert_eq!(oldest_age(&scrape(&recorder), "0"), 1.5);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(oldest_age(&refresh_and_scrape(&gate, &recorder), "0"), 3.5);

    // The queue empties: 0, at the event and after any refresh.
    drop(running);
    let last = poll_admitted(&mut second);
    assert_eq!(oldest_age(&scrape(&recorder), "0"), 0.0);
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(oldest_age(&refresh_and_scrape(&gate, &recorder), "0"), 0.0);
    drop(last);
    assert!(gate.snapshot().is_idle());
}

#[tokio::test(start_paused = true)]
async fn unranked_requests_have_their_own_oldest_age() {
    let (gate, recorder) = gate_with(
        AdmissionConfig::new()
            .aging_interval(Duration::from_secs(60))
            .clock(|| tokio::time::Instant::now().into_std())
            .engine_request_limit(1)
            .request_queue_limit(4),
    );
    // Before the engine reports, every request is unranked.
    let running = admitted(gate.acquire(None));
    let waiting = queued(gate.acquire(Some(0)));
    tokio::time::advance(Duration::from_millis(250)).await;
    let exposition = refresh_and_scrape(&gate, &recorder);
    assert_eq!(oldest_age(&exposition, "unspecified"), 0.25);
    drop(waiting); // cancelled
    assert_eq!(oldest_age(&scrape(&recorder), "unspecified"), 0.0);
    drop(running);
}

#[test]
fn a_refresh_changes_the_metrics_only() {
    let (gate, recorder) = gate_with(
        AdmissionConfig::new()
            .priority_bands([0, 10])
            .engine_request_limit(1)
            .request_queue_limit(2)
            .capacity(EngineCapacity::new(8, 2)),
    );
    let _left = qos_traffic(&gate);
    let before = gate.snapshot();
    let first = refresh_and_scrape(&gate, &recorder);
    assert_eq!(gate.snapshot(), before);
    let second = refresh_and_scrape(&gate, &recorder);
    // Only the age of the queued request moves.
    let age = |exposition: &Exposition| oldest_age(exposition, "0");
    assert!(age(&second) >= age(&first));
    let without_age = |exposition: &Exposition| {
        let mut samples = exposition.samples.clone();
        samples.retain(|(name, _), _| name != "qos_request_queue_oldest_age_seconds");
        samples
    };
    assert_eq!(without_age(&first), without_age(&second));
}

#[test]
fn without_a_clock_the_oldest_age_is_measured_from_the_arrival() {
    // The default gate keeps no time: the age comes from the stamp the
    // metrics take at every arrival. Real time, so only its direction is
    // checked.
    let (gate, recorder) = gate_with(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(4),
    );
    let running = admitted(gate.acquire(None));
    let waiting = queued(gate.acquire(None));
    let earlier = oldest_age(&refresh_and_scrape(&gate, &recorder), "unspecified");
    let later = oldest_age(&refresh_and_scrape(&gate, &recorder), "unspecified");
    assert!(earlier > 0.0, "{earlier}");
    assert!(later >= earlier, "{earlier} then {later}");
    assert!(later < 60.0, "{later}");
    drop(waiting);
    assert_eq!(
        oldest_age(&refresh_and_scrape(&gate, &recorder), "unspecified"),
        0.0
    );
    drop(running);
}

// ----- priority bands -------------------------------------------------------

const BY_PRIORITY: [&str; 3] = [
    "qos_request_queue_by_priority_count",
    "qos_request_admit_by_priority_total",
    "qos_rejection_by_priority_total",
];

/// Admissions, queueing, a displacement and a full-queue rejection, with
/// priorities 0, 3 and 12 from three tenants, on rank 0. Returns what is
/// left: the admitted priority-12 request and the queued priority-3 one.
fn qos_traffic(gate: &Gate) -> (Permit, Acquire) {
    let request = |priority: i32, tenant: &str| {
        gate.acquire_with(
            Descriptor::new()
                .with_rank(Some(0))
                .with_priority(priority)
                .with_tenant(Tenant::new(tenant)),
        )
    };
    let running = admitted(request(0, "alice"));
    let low = queued(request(3, "bob"));
    let mut displaced = queued(request(0, "carol"));
    let mut high = queued(request(12, "alice"));
    let Some(Err(overloaded)) = (&mut displaced).now_or_never() else {
        panic!("the newest of the lowest band gives way")
    };
    assert_eq!(overloaded.reason(), RejectionReason::Displaced);
    let Some(Err(overloaded)) = request(0, "bob").now_or_never() else {
        panic!("a full queue, and nothing lower to displace")
    };
    assert_eq!(overloaded.reason(), RejectionReason::QueueFull);
    drop(running);
    (poll_admitted(&mut high), low)
}

#[test]
fn priority_series_exist_only_with_configured_bands() {
    let config = || {
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(2)
            .capacity(EngineCapacity::new(8, 2))
    };

    let (plain, recorder) = gate_with(config());
    let _left = qos_traffic(&plain);
    let exposition = refresh_and_scrape(&plain, &recorder);
    for name in BY_PRIORITY {
        assert!(!exposition.types.contains_key(name), "{name}");
    }
    assert!(!label_names(&exposition).contains("priority"));

    let (banded, recorder) = gate_with(config().priority_bands([10, 0]));
    let _left = qos_traffic(&banded);
    let exposition = refresh_and_scrape(&banded, &recorder);
    let expected: BTreeSet<(String, String)> = ["0", "1", "unspecified"]
        .into_iter()
        .flat_map(|rank| ["0", "10"].map(|priority| (rank.to_owned(), priority.to_owned())))
        .collect();
    for (name, kind) in BY_PRIORITY.into_iter().zip(["gauge", "counter", "counter"]) {
        assert_eq!(exposition.types[name], kind, "{name}");
        assert_eq!(
            rank_priority_pairs(&exposition, name),
            expected,
            "{name}: the configured bands only, 3 and 12 fall in them"
        );
    }
    let value = |name: &str, priority: &str| {
        exposition.value(name, &[("dp_rank", "0"), ("priority", priority)])
    };
    // Band 0: the running request (0), the low (3) still queued, the
    // displaced (0) and the rejected (0); band 10: the high one (12).
    assert_eq!(value("qos_request_queue_by_priority_count", "0"), 1.0);
    assert_eq!(value("qos_request_queue_by_priority_count", "10"), 0.0);
    assert_eq!(value("qos_request_admit_by_priority_total", "0"), 1.0);
    assert_eq!(value("qos_request_admit_by_priority_total", "10"), 1.0);
    assert_eq!(value("qos_rejection_by_priority_total", "0"), 2.0);
    assert_eq!(value("qos_rejection_by_priority_total", "10"), 0.0);
    // Summed over `priority`, the per-band series are the plain ones.
    for (by_priority, plain) in [
        (
            "qos_request_queue_by_priority_count",
            "qos_request_queue_count",
        ),
        (
            "qos_request_admit_by_priority_total",
            "qos_request_admit_total",
        ),
        ("qos_rejection_by_priority_total", "qos_rejection_total"),
    ] {
        for rank in ["0", "1", "unspecified"] {
            assert_eq!(
                sum(&exposition, by_priority, rank),
                sum(&exposition, plain, rank),
                "{by_priority} against {plain}, dp_rank {rank}"
            );
        }
    }
}

#[test]
fn displaced_requests_are_counted_with_their_reason_when_bands_are_configured() {
    let (gate, recorder) = gate_with(
        AdmissionConfig::new()
            .priority_bands([0, 10])
            .engine_request_limit(1)
            .request_queue_limit(2)
            .capacity(EngineCapacity::new(8, 2)),
    );
    let _left = qos_traffic(&gate);
    let exposition = refresh_and_scrape(&gate, &recorder);
    let rejections = |scope: &str, reason: &str| {
        exposition.value(
            "qos_rejection_total",
            &[("dp_rank", "0"), ("scope", scope), ("reason", reason)],
        )
    };
    // Rank 1 could still take requests: both rejections name rank 0.
    assert_eq!(rejections("rank", "displaced"), 1.0);
    assert_eq!(rejections("rank", "queue_full"), 1.0);
    assert_eq!(rejections("rank", "deadline"), 0.0);
    assert_eq!(rejections("worker", "displaced"), 0.0);
    let tally = gate.snapshot().rank_tallies[0];
    assert_eq!(tally.displaced(), 1);
    assert_eq!(tally.rejected(), 2);
}

#[test]
fn displaced_requests_are_counted_with_their_reason_when_deadlines_are_on() {
    // No bands, but priorities still displace, and deadlines turn reasons on.
    let (gate, recorder) = gate_with(
        AdmissionConfig::new()
            .request_queue_wait_limit(Duration::from_secs(3600))
            .engine_request_limit(1)
            .request_queue_limit(2)
            .capacity(EngineCapacity::new(8, 2)),
    );
    let _left = qos_traffic(&gate);
    let exposition = refresh_and_scrape(&gate, &recorder);
    let rejections = |reason: &str| {
        exposition.value(
            "qos_rejection_total",
            &[("dp_rank", "0"), ("scope", "rank"), ("reason", reason)],
        )
    };
    assert_eq!(rejections("displaced"), 1.0);
    assert_eq!(rejections("queue_full"), 1.0);
    for name in BY_PRIORITY {
        assert!(!exposition.types.contains_key(name), "{name}: no bands");
    }
}

#[test]
fn without_bands_or_deadlines_rejections_carry_no_reason() {
    let (gate, recorder) = gate_with(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(2)
            .capacity(EngineCapacity::new(8, 2)),
    );
    let _left = qos_traffic(&gate);
    let exposition = refresh_and_scrape(&gate, &recorder);
    assert!(!label_names(&exposition).contains("reason"));
    assert_eq!(
        exposition.value(
            "qos_rejection_total",
            &[("dp_rank", "0"), ("scope", "rank")]
        ),
        2.0,
        "the displaced one and the full-queue one"
    );
}

#[test]
fn no_series_ever_carries_a_tenant() {
    let (gate, recorder) = gate_with(
        AdmissionConfig::new()
            .priority_bands([0, 10])
            .tenant_weight("alice", 3)
            .request_queue_wait_limit(Duration::from_secs(3600))
            .engine_request_limit(1)
            .request_queue_limit(2)
            .capacity(EngineCapacity::new(8, 2)),
    );
    let _left = qos_traffic(&gate);
    let exposition = refresh_and_scrape(&gate, &recorder);
    let allowed: BTreeSet<String> = [
        "dp_rank", "source", "scope", "reason", "priority", "quantile",
    ]
    .map(str::to_owned)
    .into();
    let names = label_names(&exposition);
    assert!(names.is_subset(&allowed), "{names:?}");
    for tenant in ["alice", "bob", "carol"] {
        assert!(
            !exposition.text.contains(tenant),
            "{tenant} in\n{}",
            exposition.text
        );
    }
}
