//! Metrics of behaviour §6: the families and their labels, gauges that follow the
//! gate's counts after every event, and counters that add up.
#![cfg(feature = "metrics")]

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use futures::FutureExt;
use futures::task::noop_waker_ref;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::registry::{AtomicStorage, Registry};
use tower_admission::{
    Acquire, AdmissionConfig, Cost, Counts, Descriptor, EngineCapacity, Gate, Permit, Snapshot,
};

// ----- helpers ------------------------------------------------------------

/// A recorder whose values can be read without resetting them
/// (`DebuggingRecorder` snapshots reset counters and gauges), so that a test
/// can look at every gauge after every step.
struct Mirror {
    registry: Registry<Key, AtomicStorage>,
}

impl Mirror {
    fn new() -> Self {
        Mirror {
            registry: Registry::atomic(),
        }
    }

    /// Every gauge, by name and `dp_rank`.
    fn gauges(&self) -> BTreeMap<(String, String), f64> {
        self.registry
            .get_gauge_handles()
            .into_iter()
            .map(|(key, value)| {
                let value = f64::from_bits(value.load(Ordering::SeqCst));
                ((key.name().to_owned(), dp_rank(&key)), value)
            })
            .collect()
    }

    fn gauge(&self, name: &str, dp_rank: &str) -> f64 {
        let gauges = self.gauges();
        *gauges
            .get(&(format!("admission_{name}"), dp_rank.to_owned()))
            .unwrap_or_else(|| panic!("no gauge {name}{{dp_rank={dp_rank}}} in {gauges:?}"))
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let key = Key::from_parts(
            format!("admission_{name}"),
            labels
                .iter()
                .map(|&(k, v)| metrics::Label::new(k.to_owned(), v.to_owned()))
                .collect::<Vec<_>>(),
        );
        self.registry
            .get_counter_handles()
            .get(&key)
            .unwrap_or_else(|| panic!("no counter {key:?}"))
            .load(Ordering::SeqCst)
    }

    fn histogram_len(&self, name: &str, dp_rank: &str) -> usize {
        let key = Key::from_parts(
            format!("admission_{name}"),
            vec![metrics::Label::new("dp_rank", dp_rank.to_owned())],
        );
        self.registry
            .get_histogram_handles()
            .get(&key)
            .unwrap_or_else(|| panic!("no histogram {key:?}"))
            .data()
            .len()
    }
}

impl metrics::Recorder for Mirror {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.registry
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.registry
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.registry
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

fn dp_rank(key: &Key) -> String {
    key.labels()
        .find(|label| label.key() == "dp_rank")
        .map(|label| label.value().to_owned())
        .expect("every series has a dp_rank")
}

/// Asserts that every count gauge equals the gate's own counts: ranks the
/// gate recognises, the unranked bucket, and zero for ranks that vanished.
#[track_caller]
fn assert_gauges_follow(mirror: &Mirror, snapshot: &Snapshot) {
    let expected = |dp_rank: &str| -> Counts {
        if dp_rank == "unspecified" {
            return snapshot.unranked;
        }
        let rank: usize = dp_rank.parse().unwrap();
        snapshot.ranks.get(rank).copied().unwrap_or_default()
    };
    let mut seen = 0;
    for ((name, dp_rank), value) in mirror.gauges() {
        let counts = expected(&dp_rank);
        let want = match name.strip_prefix("admission_").unwrap() {
            "engine_request_count" => counts.engine_requests,
            "engine_request_waiting_count" => counts.engine_waiting,
            "request_queue_count" => counts.queued,
            _ => continue,
        };
        assert_eq!(
            value, want as f64,
            "{name}{{dp_rank={dp_rank}}} in {snapshot:?}"
        );
        seen += 1;
    }
    assert_eq!(
        seen,
        3 * (snapshot.rank_tallies.len() + 1),
        "a gauge per bucket"
    );
}

fn poll(acquire: &mut Acquire) -> Poll<Result<Permit, tower_admission::Overloaded>> {
    Pin::new(acquire).poll(&mut Context::from_waker(noop_waker_ref()))
}

#[track_caller]
fn admitted(acquire: &mut Acquire) -> Permit {
    match poll(acquire) {
        Poll::Ready(Ok(permit)) => permit,
        other => panic!("expected an admission, got {other:?}"),
    }
}

const GAUGES: [&str; 6] = [
    "engine_request_count",
    "engine_request_waiting_count",
    "request_queue_count",
    "engine_request_limit",
    "engine_request_waiting_limit",
    "request_queue_limit",
];

// ----- families -----------------------------------------------------------

/// `(kind, name, sorted labels)` of one series.
type Series = (String, String, Vec<(String, String)>);

/// Every series in a snapshot.
fn series(recorder: &DebuggingRecorder) -> BTreeSet<Series> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, _)| {
            let kind = match key.kind() {
                MetricKind::Counter => "counter",
                MetricKind::Gauge => "gauge",
                MetricKind::Histogram => "histogram",
            };
            let (_, key) = key.into_parts();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            (kind.to_owned(), key.name().to_owned(), labels)
        })
        .collect()
}

fn expected_series(prefix: &str, ranks: &[&str]) -> BTreeSet<Series> {
    let mut expected = BTreeSet::new();
    let mut add = |kind: &str, suffix: &str, dp_rank: &str, extra: Option<(&str, &str)>| {
        let mut labels = vec![("dp_rank".to_owned(), dp_rank.to_owned())];
        labels.extend(extra.map(|(k, v)| (k.to_owned(), v.to_owned())));
        labels.sort();
        expected.insert((kind.to_owned(), format!("{prefix}_{suffix}"), labels));
    };
    for &dp_rank in ranks.iter().chain(&["unspecified"]) {
        for gauge in GAUGES {
            add("gauge", gauge, dp_rank, None);
        }
        add("counter", "request_receive_total", dp_rank, None);
        add(
            "counter",
            "request_admit_total",
            dp_rank,
            Some(("source", "direct")),
        );
        add(
            "counter",
            "request_admit_total",
            dp_rank,
            Some(("source", "queue")),
        );
        add(
            "counter",
            "rejection_total",
            dp_rank,
            Some(("scope", "worker")),
        );
        if dp_rank != "unspecified" {
            // Unranked rejections are always worker-scoped.
            add(
                "counter",
                "rejection_total",
                dp_rank,
                Some(("scope", "rank")),
            );
        }
        add("counter", "cancellation_total", dp_rank, None);
        add("histogram", "request_queue_wait_seconds", dp_rank, None);
        add("histogram", "engine_request_waiting_seconds", dp_rank, None);
        add("gauge", "request_queue_oldest_age_seconds", dp_rank, None);
    }
    expected
}

#[test]
fn every_family_of_the_spec_with_its_labels() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let gate = Gate::new(AdmissionConfig::new());
        assert_eq!(
            series(&recorder),
            expected_series("admission", &[]),
            "before the engine reports"
        );
        gate.report_capacity(EngineCapacity::new(8, 2));
        assert_eq!(series(&recorder), expected_series("admission", &["0", "1"]));
        gate.report_capacity(EngineCapacity::new(8, 1));
        assert_eq!(
            series(&recorder),
            expected_series("admission", &["0", "1"]),
            "a vanished rank keeps its series"
        );
    });
}

#[test]
fn the_prefix_gives_the_source_systems_names() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let _gate = Gate::new(
            AdmissionConfig::new()
                .metrics_prefix("dynamo_backend_admission")
                .capacity(EngineCapacity::new(4, 3)),
        );
    });
    assert_eq!(
        series(&recorder),
        expected_series("dynamo_backend_admission", &["0", "1", "2"])
    );
}

#[test]
fn every_family_is_described_with_its_unit() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let _gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(4, 2)));
    });
    let mut described = BTreeMap::new();
    for (key, unit, description, _) in recorder.snapshotter().snapshot().into_vec() {
        let (_, key) = key.into_parts();
        let description =
            description.unwrap_or_else(|| panic!("{} has no description", key.name()));
        assert!(!description.is_empty());
        described.insert(key.name().to_owned(), unit);
    }
    assert_eq!(described.len(), 13, "{described:?}");
    for (name, unit) in described {
        let want = if name.ends_with("_seconds") {
            Unit::Seconds
        } else {
            Unit::Count
        };
        assert_eq!(unit, Some(want), "{name}");
    }
}

// ----- gauges -------------------------------------------------------------

#[test]
fn gauges_follow_every_event_and_never_drift() {
    let mirror = Mirror::new();
    let _recorder = metrics::set_default_local_recorder(&mirror);
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .engine_request_waiting_limit(1)
            .request_queue_limit(1),
    );
    let check = || assert_gauges_follow(&mirror, &gate.snapshot());
    check();
    // Before the report: one assumed rank, everything unranked.
    assert_eq!(mirror.gauge("engine_request_limit", "unspecified"), 1.0);
    assert_eq!(mirror.gauge("request_queue_limit", "unspecified"), 1.0);

    gate.report_capacity(EngineCapacity::new(64, 2));
    check();
    for rank in ["0", "1"] {
        assert_eq!(mirror.gauge("engine_request_limit", rank), 1.0);
        assert_eq!(mirror.gauge("engine_request_waiting_limit", rank), 1.0);
        assert_eq!(mirror.gauge("request_queue_limit", rank), 1.0);
    }
    assert_eq!(
        mirror.gauge("engine_request_limit", "unspecified"),
        2.0,
        "combined"
    );

    // Arrive on rank 0: admitted directly.
    let mut first = gate.acquire(Some(0));
    let mut first = admitted(&mut first);
    check();
    assert_eq!(mirror.gauge("engine_request_count", "0"), 1.0);
    assert_eq!(mirror.gauge("engine_request_waiting_count", "0"), 1.0);

    // Arrive on rank 0 again: queued.
    let mut second = gate.acquire(Some(0));
    assert!(poll(&mut second).is_pending());
    check();
    assert_eq!(mirror.gauge("request_queue_count", "0"), 1.0);

    // First token: waiting ends, the request limit still holds the queue.
    first.first_token();
    check();
    assert_eq!(mirror.gauge("engine_request_waiting_count", "0"), 0.0);
    assert_eq!(mirror.gauge("engine_request_count", "0"), 1.0);
    assert_eq!(mirror.gauge("request_queue_count", "0"), 1.0);

    // Finish: the queued request is offered the slot at once; the gauges
    // move with the offer, before its waiter even looks.
    drop(first);
    check();
    assert_eq!(mirror.gauge("request_queue_count", "0"), 0.0);
    assert_eq!(mirror.gauge("engine_request_waiting_count", "0"), 1.0);
    assert_eq!(
        mirror.counter(
            "request_admit_total",
            &[("dp_rank", "0"), ("source", "queue")]
        ),
        0
    );
    let second = admitted(&mut second);
    check();
    assert_eq!(
        mirror.counter(
            "request_admit_total",
            &[("dp_rank", "0"), ("source", "queue")]
        ),
        1
    );
    assert_eq!(mirror.histogram_len("request_queue_wait_seconds", "0"), 1);
    assert_eq!(
        mirror.histogram_len("engine_request_waiting_seconds", "0"),
        1,
        "the first request's wait"
    );

    // Rank 1 admits one, queues one; cancelling the queued one frees its place.
    let mut third = gate.acquire(Some(1));
    let third = admitted(&mut third);
    let mut fourth = gate.acquire(Some(1));
    assert!(poll(&mut fourth).is_pending());
    check();
    assert_eq!(mirror.gauge("request_queue_count", "1"), 1.0);
    drop(fourth);
    check();
    assert_eq!(mirror.gauge("request_queue_count", "1"), 0.0);
    assert_eq!(mirror.counter("cancellation_total", &[("dp_rank", "1")]), 1);

    // An unranked request queues behind the full combined capacity.
    let mut fifth = gate.acquire(None);
    assert!(poll(&mut fifth).is_pending());
    check();
    assert_eq!(mirror.gauge("request_queue_count", "unspecified"), 1.0);

    // Rank 1 finishing hands its slot to the unranked waiter: two buckets
    // change in one event.
    drop(third);
    check();
    assert_eq!(mirror.gauge("engine_request_count", "1"), 0.0);
    assert_eq!(mirror.gauge("engine_request_count", "unspecified"), 1.0);
    assert_eq!(mirror.gauge("request_queue_count", "unspecified"), 0.0);
    let fifth = admitted(&mut fifth);

    // Another request queues on rank 1; then the engine shrinks to one
    // rank: rank 1's gauges and limits go to zero, its queued request
    // becomes unranked.
    let mut sixth = gate.acquire(Some(1));
    assert!(poll(&mut sixth).is_pending());
    check();
    assert_eq!(mirror.gauge("request_queue_count", "1"), 1.0);
    gate.report_capacity(EngineCapacity::new(64, 1));
    check();
    for gauge in GAUGES {
        assert_eq!(mirror.gauge(gauge, "1"), 0.0, "{gauge} of a vanished rank");
    }
    assert_eq!(mirror.gauge("request_queue_count", "unspecified"), 1.0);
    assert_eq!(mirror.gauge("engine_request_limit", "unspecified"), 1.0);

    // Growth admits the queued request at once.
    gate.report_capacity(EngineCapacity::new(64, 3));
    check();
    assert_eq!(mirror.gauge("request_queue_count", "unspecified"), 0.0);
    assert_eq!(mirror.gauge("engine_request_limit", "2"), 1.0);
    let sixth = admitted(&mut sixth);
    assert_eq!(sixth.rank(), None);

    drop((second, fifth, sixth));
    check();
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.total, Counts::default());
    assert_eq!(snapshot.tally.received, 6);
}

// ----- counters -----------------------------------------------------------

/// A small deterministic generator, so that a failure reproduces.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Counter values and histogram lengths by `(suffix, dp_rank, other labels)`.
type Totals = BTreeMap<Series, u64>;

fn counters_and_histogram_counts(recorder: &DebuggingRecorder) -> Totals {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let (_, key) = key.into_parts();
            let dp_rank = dp_rank(&key);
            let other: Vec<_> = key
                .labels()
                .filter(|l| l.key() != "dp_rank")
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let value = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(values) => values.len() as u64,
                DebugValue::Gauge(_) => return None,
            };
            let name = key.name().strip_prefix("admission_").unwrap().to_owned();
            Some(((name, dp_rank, other), value))
        })
        .collect()
}

fn total(totals: &Totals, name: &str, dp_rank: Option<&str>, label: Option<(&str, &str)>) -> u64 {
    totals
        .iter()
        .filter(|((n, r, other), _)| {
            n == name
                && dp_rank.is_none_or(|want| r == want)
                && label.is_none_or(|(k, v)| other.iter().any(|(ok, ov)| ok == k && ov == v))
        })
        .map(|(_, value)| value)
        .sum()
}

#[test]
fn counters_add_up_after_a_mixed_run() {
    let recorder = DebuggingRecorder::new();
    let (snapshot, ranks) = metrics::with_local_recorder(&recorder, || {
        let gate = Gate::new(
            AdmissionConfig::new()
                .engine_request_limit(3)
                .engine_request_waiting_limit(2)
                .request_queue_limit(2),
        );
        let mut rng = Lcg(7);
        let mut pending: Vec<Acquire> = Vec::new();
        let mut permits: Vec<Permit> = Vec::new();
        for step in 0..4_000 {
            if step == 1_000 {
                gate.report_capacity(EngineCapacity::new(8, 3));
            }
            if step == 2_500 {
                gate.report_capacity(EngineCapacity::new(8, 2));
            }
            match rng.below(10) {
                0..=3 => {
                    // Ranks 0..=3 and none: rank 3 is never recognised.
                    let rank = match rng.below(5) {
                        4 => None,
                        r => Some(r as u32),
                    };
                    pending.push(gate.acquire(rank));
                }
                4 if !pending.is_empty() => {
                    // Cancel (or drop an admitted, never-polled) request.
                    let i = rng.below(pending.len() as u64) as usize;
                    drop(pending.swap_remove(i));
                }
                5 | 6 if !permits.is_empty() => {
                    let i = rng.below(permits.len() as u64) as usize;
                    permits[i].first_token();
                }
                7 | 8 if !permits.is_empty() => {
                    let i = rng.below(permits.len() as u64) as usize;
                    drop(permits.swap_remove(i));
                }
                _ => {}
            }
            // Poll everything: admitted ones become permits, rejected ones end.
            let mut still = Vec::new();
            for mut acquire in pending.drain(..) {
                match poll(&mut acquire) {
                    Poll::Ready(Ok(permit)) => permits.push(permit),
                    Poll::Ready(Err(_)) => {}
                    Poll::Pending => still.push(acquire),
                }
            }
            pending = still;
        }
        drop(pending);
        drop(permits);
        (gate.snapshot(), gate.snapshot().rank_tallies.len())
    });
    assert_eq!(snapshot.total, Counts::default(), "everything settled");
    let tally = snapshot.tally;
    assert!(tally.admitted_queue > 0 && tally.rejected_rank > 0 && tally.rejected_worker > 0);
    assert!(
        tally.cancelled > 0 && tally.admitted_direct > 0,
        "{tally:?}"
    );

    let totals = counters_and_histogram_counts(&recorder);
    let sum = |name, label| total(&totals, name, None, label);
    let received = sum("request_receive_total", None);
    let admitted = sum("request_admit_total", None);
    let rejected = sum("rejection_total", None);
    let cancelled = sum("cancellation_total", None);
    assert_eq!(received, admitted + rejected + cancelled);
    assert_eq!(received, tally.received);

    // Per bucket, the counters are the gate's tallies.
    let buckets = (0..ranks)
        .map(|rank| (rank.to_string(), snapshot.rank_tallies[rank]))
        .chain([("unspecified".to_owned(), snapshot.unranked_tally)]);
    for (dp_rank, tally) in buckets {
        let count = |name, label| total(&totals, name, Some(&dp_rank), label);
        let from_metrics = [
            count("request_receive_total", None),
            count("request_admit_total", Some(("source", "direct"))),
            count("request_admit_total", Some(("source", "queue"))),
            count("rejection_total", Some(("scope", "rank"))),
            count("rejection_total", Some(("scope", "worker"))),
            count("cancellation_total", None),
        ];
        let from_gate = [
            tally.received,
            tally.admitted_direct,
            tally.admitted_queue,
            tally.rejected_rank,
            tally.rejected_worker,
            tally.cancelled,
        ];
        assert_eq!(from_metrics, from_gate, "dp_rank={dp_rank}");
        // One queue-wait observation per queue admission, one waiting-time
        // observation per admission (every wait ended).
        assert_eq!(
            count("request_queue_wait_seconds", None),
            tally.admitted_queue,
            "dp_rank={dp_rank}"
        );
    }
    assert_eq!(
        sum("engine_request_waiting_seconds", None),
        tally.admitted()
    );
}

// ----- tokens -------------------------------------------------------------

#[test]
fn token_series_exist_only_with_a_token_limit_and_follow_the_gate() {
    let mirror = Mirror::new();
    let _recorder = metrics::set_default_local_recorder(&mirror);
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_waiting_token_limit(1000)
            .capacity(EngineCapacity::new(4, 2)),
    );
    // The limit that is set has a series per rank and the combined one;
    // the two that are not set have none.
    assert_eq!(mirror.gauge("engine_waiting_token_limit", "0"), 1000.0);
    assert_eq!(
        mirror.gauge("engine_waiting_token_limit", "unspecified"),
        2000.0
    );
    let names: BTreeSet<String> = mirror.gauges().into_keys().map(|(name, _)| name).collect();
    assert!(!names.contains("admission_engine_token_limit"), "{names:?}");
    assert!(!names.contains("admission_request_queue_token_limit"));

    let long = Descriptor::new()
        .with_rank(Some(1))
        .with_cost(Cost::new(800, Some(100)));
    let mut running = gate.acquire_with(long).now_or_never().unwrap().unwrap();
    let queued = gate.acquire_with(long);
    assert!(queued.is_queued());
    assert_eq!(mirror.gauge("engine_waiting_token_count", "1"), 800.0);
    assert_eq!(mirror.gauge("engine_token_count", "1"), 900.0);
    assert_eq!(mirror.gauge("request_queue_token_count", "1"), 800.0);
    assert_eq!(mirror.gauge("engine_waiting_token_count", "0"), 0.0);
    running.first_token();
    assert_eq!(
        mirror.gauge("engine_waiting_token_count", "1"),
        800.0,
        "the next one waits"
    );
    assert_eq!(mirror.gauge("engine_token_count", "1"), 1800.0);
    assert_eq!(mirror.gauge("request_queue_token_count", "1"), 0.0);
    drop((running, queued));
    assert_eq!(mirror.gauge("engine_waiting_token_count", "1"), 0.0);
    assert_eq!(mirror.gauge("engine_token_count", "1"), 0.0);
}
