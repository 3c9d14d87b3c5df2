//! Controlled delay (opt-in), on tokio's paused clock, over the public API:
//! a burst the queue absorbs within the target and the interval is
//! admitted whole; a queue that stands above the target for an interval
//! sheds its requests older than the target (worker scope, reason
//! `queue_delay`: in the `Overloaded`, the HTTP header, the JSON body and
//! the metric label) until it has drained; off by default; and the setting
//! from the environment and the command line, with the same rules as the
//! others.
#![cfg(feature = "http")]

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use tokio::time::{Instant, advance};
use tower::{Layer, ServiceExt, service_fn};
use tower_admission::{
    Acquire, AdmissionConfig, AdmissionLayer, Gate, Permit, RejectionReason, RejectionScope,
};

const TARGET: Duration = Duration::from_millis(50);
const MS: Duration = Duration::from_millis(1);

/// A gate of `slots` engine slots and a long queue, with controlled delay
/// at `TARGET` (interval 100 ms) unless `off`, on tokio's clock.
fn gate(slots: usize, codel: bool) -> Gate {
    let config = AdmissionConfig::new()
        .engine_request_limit(slots)
        .request_queue_limit(1000)
        .clock(|| Instant::now().into_std());
    Gate::new(if codel {
        config.queue_delay_target(TARGET)
    } else {
        config.request_queue_wait_limit(Duration::from_secs(3600))
    })
}

fn now(acquire: Acquire) -> Permit {
    acquire.now_or_never().expect("decided").expect("admitted")
}

#[tokio::test(start_paused = true)]
async fn a_burst_absorbed_within_the_interval_is_never_shed() {
    let gate = gate(2, true);
    let mut running: Vec<Permit> = (0..2).map(|_| now(gate.acquire(None))).collect();
    let mut queued: Vec<Acquire> = (0..6).map(|_| gate.acquire(None)).collect();
    // Two served every 40 ms: the last waits 120 ms < target + interval.
    for _ in 0..3 {
        advance(40 * MS).await;
        running.clear();
        for acquire in queued.drain(..2) {
            running.push(acquire.now_or_never().expect("decided").expect("admitted"));
        }
    }
    assert_eq!(gate.snapshot().tally.rejected(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_standing_queue_sheds_its_requests_older_than_the_target() {
    let gate = gate(1, true);
    let running = now(gate.acquire(None));
    let old: Vec<Acquire> = (0..3).map(|_| gate.acquire(None)).collect();
    advance(120 * MS).await;
    let young = gate.acquire(None);
    // 120 ms after they queued the queue has been above the target for
    // 70 ms: not yet a whole interval.
    assert_eq!(gate.snapshot().tally.rejected(), 0);
    advance(40 * MS).await;
    // An event at 160 ms: above for 110 ms. The three old requests are
    // shed; the young one (40 ms) stays.
    let newest = gate.acquire(None);
    for acquire in old {
        let overloaded = acquire.await.expect_err("shed");
        assert_eq!(overloaded.reason(), RejectionReason::QueueDelay);
        assert_eq!(overloaded.scope(), RejectionScope::Worker);
        assert_eq!(overloaded.reason().as_str(), "queue_delay");
    }
    assert!(young.is_queued());
    let tally = gate.snapshot().tally;
    assert_eq!((tally.rejected_worker, tally.shed_worker), (3, 3));
    // Shedding goes on while the queue stands: at the next event the young
    // one is shed too, now older than the target though it never waited an
    // interval, and the capacity freed goes to the newest (20 ms).
    advance(20 * MS).await;
    drop(running);
    let overloaded = young.await.expect_err("shed at 60 ms");
    assert_eq!(overloaded.reason(), RejectionReason::QueueDelay);
    let admitted = newest.await.expect("admitted");
    assert_eq!(gate.snapshot().tally.shed_worker, 4);
    drop(admitted);
    // The queue stays empty for an interval: it has drained, and a new
    // queue is a burst again, not shed before a whole interval above.
    let running = now(gate.acquire(None));
    advance(150 * MS).await;
    // An event (an arrival that leaves at once) sees the drained queue.
    drop(gate.acquire(None));
    let burst: Vec<Acquire> = (0..2).map(|_| gate.acquire(None)).collect();
    advance(120 * MS).await;
    drop(running);
    let mut burst = burst.into_iter();
    let first = burst.next().unwrap().await.expect("a burst is not shed");
    drop(first);
    assert_eq!(gate.snapshot().tally.shed_worker, 4);
}

#[tokio::test(start_paused = true)]
async fn without_a_target_a_standing_queue_stands() {
    let gate = gate(1, false);
    let running = now(gate.acquire(None));
    let old: Vec<Acquire> = (0..3).map(|_| gate.acquire(None)).collect();
    advance(Duration::from_secs(10)).await;
    let _newer = gate.acquire(None);
    drop(running);
    let mut old = old.into_iter();
    let first = old.next().unwrap().await.expect("admitted after 10 s");
    drop(first);
    assert_eq!(gate.snapshot().tally.rejected(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_answer_names_the_reason_in_header_body_and_metric() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let gate = gate(1, true);
    let service =
        AdmissionLayer::new(gate.clone()).layer(service_fn(|_: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }));
    let running = now(gate.acquire(None));
    let request = || {
        Request::post("/v1/completions")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let waiting = tokio::spawn(service.clone().oneshot(request()));
    tokio::task::yield_now().await;
    assert_eq!(gate.snapshot().total.queued, 1);
    advance(200 * MS).await;
    // Any event sheds the standing request; the layer answers it at once.
    let _newer = gate.acquire(None);
    let response = waiting.await.unwrap().unwrap();
    assert_eq!(response.status().as_u16(), 529);
    assert_eq!(
        response.headers()["x-admission-rejection-reason"],
        "queue_delay"
    );
    assert_eq!(response.headers()["x-admission-rejection-scope"], "worker");
    assert_eq!(response.headers()["retry-after"], "1");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"]["reason"], "queue_delay");
    assert_eq!(json["error"]["scope"], "worker");
    drop(running);
    gate.refresh_metrics();
    let shed = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(key, _, _, value)| {
            let key = key.key();
            let labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (key.name() == "admission_rejection_total"
                && labels.contains(&("reason".into(), "queue_delay".into()))
                && labels.contains(&("dp_rank".into(), "unspecified".into())))
            .then_some(value)
        })
        .expect("a rejection_total series of reason queue_delay");
    assert_eq!(
        shed,
        metrics_util::debugging::DebugValue::Counter(1),
        "one request shed"
    );
}

#[test]
fn the_target_comes_from_the_environment_with_the_usual_rules() {
    const VAR: &str = "DYN_BACKEND_ADMISSION_QUEUE_DELAY_TARGET_MS";
    let lookup = |value: &'static str| move |name: &str| (name == VAR).then(|| value.to_owned());
    assert_eq!(
        AdmissionConfig::from_lookup(lookup(" 50 "))
            .explicit()
            .queue_delay_target,
        Some(TARGET)
    );
    for invalid in ["0", "-5", "fifty", ""] {
        assert_eq!(
            AdmissionConfig::from_lookup(lookup(invalid))
                .explicit()
                .queue_delay_target,
            None,
            "{invalid:?} is ignored (with a warning)"
        );
    }
    assert_eq!(AdmissionConfig::new().explicit().queue_delay_target, None);
    assert_eq!(AdmissionConfig::new().explicit().queue_delay_interval, None);
}

#[test]
#[should_panic(expected = "invalid queue_delay_target: 0")]
fn a_zero_target_in_code_panics_naming_the_setting() {
    let _ = AdmissionConfig::new().queue_delay_target(Duration::ZERO);
}

#[cfg(feature = "clap")]
#[test]
fn the_flag_beats_the_variable_and_a_bad_value_fails_naming_the_flag() {
    use clap::Parser;
    use tower_admission::AdmissionArgs;

    #[derive(Debug, Parser)]
    struct Worker {
        #[command(flatten)]
        admission: AdmissionArgs,
    }
    let worker = Worker::try_parse_from(["worker", "--queue-delay-target-ms", "25"]).unwrap();
    let config = worker.admission.resolve_with(|name| {
        (name == "DYN_BACKEND_ADMISSION_QUEUE_DELAY_TARGET_MS").then(|| "50".to_owned())
    });
    assert_eq!(
        config.explicit().queue_delay_target,
        Some(Duration::from_millis(25))
    );
    let error = Worker::try_parse_from(["worker", "--queue-delay-target-ms", "0"]).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("--queue-delay-target-ms") && message.contains('0'),
        "{message}"
    );
}
