//! Little's-law sizing from gate snapshots: the time average, the rate, and
//! every reason to refuse an estimate.

use std::time::{Duration, Instant};

use tower_admission::sizing::{EstimateError, Sampler};
use tower_admission::{AdmissionConfig, EngineCapacity, Gate, Permit};

fn admit(gate: &Gate, rank: Option<u32>) -> Permit {
    futures::executor::block_on(gate.acquire(rank)).expect("room")
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

#[test]
fn the_waiting_count_is_averaged_over_time_not_over_samples() {
    let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(8, 1)));
    let t0 = Instant::now();
    let mut sampler = Sampler::rank(0).min_admissions(1);

    let mut permits = vec![admit(&gate, Some(0)), admit(&gate, Some(0))];
    sampler.record(&gate.snapshot(), t0); // 2 waiting for 1 s
    permits.push(admit(&gate, Some(0)));
    permits.push(admit(&gate, Some(0)));
    sampler.record(&gate.snapshot(), t0 + secs(1.0)); // 4 waiting for 2 s
    for permit in &mut permits {
        permit.first_token();
    }
    sampler.record(&gate.snapshot(), t0 + secs(3.0));

    assert_eq!(sampler.window(), secs(3.0));
    assert_eq!(
        sampler.tally().admitted(),
        2,
        "admissions inside the window"
    );
    let estimate = sampler.estimate().unwrap();
    assert_eq!(estimate.mean_waiting(), 10.0 / 3.0); // (2×1 + 4×2) / 3
    assert_eq!(estimate.admission_rate(), 2.0 / 3.0);
    assert_eq!(estimate.mean_wait(), secs(5.0));
    assert_eq!(estimate.waiting_limit(), 4);
}

#[test]
fn a_window_with_gate_queueing_is_refused() {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_waiting_limit(1)
            .capacity(EngineCapacity::new(8, 1)),
    );
    let t0 = Instant::now();
    let mut sampler = Sampler::rank(0).min_admissions(1);
    sampler.record(&gate.snapshot(), t0);
    let mut first = admit(&gate, Some(0));
    let queued = gate.acquire(Some(0));
    assert!(queued.is_queued());
    sampler.record(&gate.snapshot(), t0 + secs(1.0));
    first.first_token(); // the queued request is admitted
    let _second = futures::executor::block_on(queued).unwrap();
    sampler.record(&gate.snapshot(), t0 + secs(2.0));

    let error = sampler.estimate().unwrap_err();
    assert_eq!(
        error,
        EstimateError::Queueing {
            peak_queued: 1,
            admitted_from_queue: 1,
            cancelled_in_queue: 0
        }
    );
    assert!(
        error.to_string().contains("the gate queued requests"),
        "{error}"
    );
}

#[test]
fn queue_admissions_between_samples_are_noticed() {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_waiting_limit(1)
            .capacity(EngineCapacity::new(8, 1)),
    );
    let t0 = Instant::now();
    let mut sampler = Sampler::rank(0).min_admissions(1);
    sampler.record(&gate.snapshot(), t0);
    let mut first = admit(&gate, Some(0));
    let queued = gate.acquire(Some(0));
    first.first_token();
    let _second = futures::executor::block_on(queued).unwrap();
    sampler.record(&gate.snapshot(), t0 + secs(1.0)); // never saw it queued
    assert!(matches!(
        sampler.estimate(),
        Err(EstimateError::Queueing {
            peak_queued: 0,
            admitted_from_queue: 1,
            ..
        })
    ));
}

#[test]
fn a_window_with_rejections_is_refused() {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(0)
            .capacity(EngineCapacity::new(8, 1)),
    );
    let t0 = Instant::now();
    let mut sampler = Sampler::worker().min_admissions(1);
    sampler.record(&gate.snapshot(), t0);
    let _held = admit(&gate, None);
    assert!(futures::executor::block_on(gate.acquire(None)).is_err());
    sampler.record(&gate.snapshot(), t0 + secs(1.0));
    let error = sampler.estimate().unwrap_err();
    assert_eq!(error, EstimateError::Rejections { rejected: 1 });
    assert!(error.to_string().contains("rejected 1 request"), "{error}");
}

#[test]
fn too_few_admissions_are_refused() {
    let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(8, 1)));
    let t0 = Instant::now();
    let mut sampler = Sampler::rank(0);
    sampler.record(&gate.snapshot(), t0);
    let _permits: Vec<_> = (0..3).map(|_| admit(&gate, Some(0))).collect();
    sampler.record(&gate.snapshot(), t0 + secs(1.0));
    let error = sampler.estimate().unwrap_err();
    assert_eq!(
        error,
        EstimateError::TooFewAdmissions {
            admitted: 3,
            required: Sampler::DEFAULT_MIN_ADMISSIONS
        }
    );
    assert!(error.to_string().contains("only 3 admission(s)"), "{error}");
}

#[test]
fn an_empty_window_is_refused() {
    let gate = Gate::new(AdmissionConfig::new());
    let t0 = Instant::now();
    let mut sampler = Sampler::worker().min_admissions(1);
    assert_eq!(
        sampler.estimate(),
        Err(EstimateError::TooFewSamples { samples: 0 })
    );
    sampler.record(&gate.snapshot(), t0);
    sampler.record(&gate.snapshot(), t0);
    assert_eq!(
        sampler.estimate(),
        Err(EstimateError::TooFewSamples { samples: 2 })
    );
}

#[test]
fn a_capacity_change_is_not_a_steady_window() {
    let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(8, 1)));
    let t0 = Instant::now();
    let mut sampler = Sampler::rank(0).min_admissions(1);
    sampler.record(&gate.snapshot(), t0);
    let _permit = admit(&gate, Some(0));
    gate.report_capacity(EngineCapacity::new(16, 1));
    sampler.record(&gate.snapshot(), t0 + secs(1.0));
    let error = sampler.estimate().unwrap_err();
    assert_eq!(
        error,
        EstimateError::CapacityChanged {
            from: Some(EngineCapacity::new(8, 1)),
            to: Some(EngineCapacity::new(16, 1)),
        }
    );
    assert!(error.to_string().contains("not steady"), "{error}");
}

#[test]
fn a_rank_must_be_recognised_and_a_multi_rank_worker_sampled_per_rank() {
    let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(8, 2)));
    let t0 = Instant::now();
    let mut unknown = Sampler::rank(2).min_admissions(1);
    let mut worker = Sampler::worker().min_admissions(1);
    for at in [t0, t0 + secs(1.0)] {
        let _permit = admit(&gate, Some(1));
        unknown.record(&gate.snapshot(), at);
        worker.record(&gate.snapshot(), at);
    }
    let error = unknown.estimate().unwrap_err();
    assert_eq!(error, EstimateError::RankNotRecognised { rank: 2 });
    assert!(error.to_string().contains("rank 2"), "{error}");
    let error = worker.estimate().unwrap_err();
    assert_eq!(error, EstimateError::MultipleRanks { ranks: 2 });
    assert!(error.to_string().contains("sample one rank"), "{error}");
}

/// Steady simulated load on one rank: a request every `every`, waiting
/// `wait` for its first token, then streaming for a while.
fn load(gate: &Gate, rank: u32, every: Duration, wait: Duration) {
    let gate = gate.clone();
    tokio::spawn(async move {
        let mut arrivals = tokio::time::interval(every);
        loop {
            arrivals.tick().await;
            let gate = gate.clone();
            tokio::spawn(async move {
                let Ok(mut permit) = gate.acquire(Some(rank)).await else {
                    return;
                };
                tokio::time::sleep(wait).await;
                permit.first_token();
                tokio::time::sleep(Duration::from_millis(300)).await;
            });
        }
    });
}

/// Samples `rank` every 100 ms for ten seconds, after a second of warm-up.
async fn sample(gate: &Gate, mut sampler: Sampler) -> Sampler {
    let start = tokio::time::Instant::now() + Duration::from_millis(1_005);
    let mut every = tokio::time::interval_at(start, Duration::from_millis(100));
    for _ in 0..=100 {
        every.tick().await;
        sampler.record(&gate.snapshot(), tokio::time::Instant::now().into_std());
    }
    sampler
}

#[tokio::test(start_paused = true)]
async fn live_sampling_recovers_each_ranks_rate_and_wait() {
    let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(256, 2)));
    load(
        &gate,
        0,
        Duration::from_millis(20),
        Duration::from_millis(240),
    );
    load(
        &gate,
        1,
        Duration::from_millis(50),
        Duration::from_millis(500),
    );

    let (rank0, rank1) = tokio::join!(
        sample(&gate, Sampler::rank(0)),
        sample(&gate, Sampler::rank(1))
    );
    let rank0 = rank0.estimate().unwrap();
    assert_eq!(rank0.admission_rate(), 50.0);
    assert_eq!(rank0.mean_wait(), Duration::from_millis(240));
    assert_eq!(rank0.waiting_limit(), 12);
    let rank1 = rank1.estimate().unwrap();
    assert_eq!(rank1.admission_rate(), 20.0);
    assert_eq!(rank1.mean_wait(), Duration::from_millis(500));
    assert_eq!(rank1.waiting_limit(), 10);
}

#[tokio::test(start_paused = true)]
async fn live_sampling_refuses_when_the_waiting_limit_already_binds() {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_waiting_limit(8) // the load needs 12
            .capacity(EngineCapacity::new(256, 1)),
    );
    load(
        &gate,
        0,
        Duration::from_millis(20),
        Duration::from_millis(240),
    );
    let sampler = sample(&gate, Sampler::rank(0)).await;
    assert!(matches!(
        sampler.estimate(),
        Err(EstimateError::Queueing { .. })
    ));
}
