//! The noisy-tenant evaluation in virtual time (`qos::QosConfig::noisy_tenant`,
//! seeded), in small: the flood starts at 20 s and the run records until
//! 60 s (the example: 30 s and 90 s). The claims of BENCHMARKS.md's "The
//! noisy tenant" section are asserted, the issue's goal among them: it is
//! met with both the gate's tenant limits (the flood bounded by name) and
//! the engine's long-prefill threshold, and with neither alone.

use std::sync::OnceLock;
use std::time::Duration;

use tower_admission::{RejectionReason, TenantLimits};
use tower_admission_sim::qos::{self, Evaluation, Policy, QosConfig};

const WARMUP: Duration = Duration::from_secs(5);

fn small() -> QosConfig {
    let mut config = QosConfig::noisy_tenant();
    config.traffic[1].start = Duration::from_secs(20);
    config.record_until = Duration::from_secs(60);
    config.drain = Duration::from_secs(60);
    config
}

/// The defaults, fair queueing and tenant limits, once for every test.
fn noisy() -> &'static Evaluation {
    static RESULT: OnceLock<Evaluation> = OnceLock::new();
    RESULT.get_or_init(|| qos::run(&small()))
}

/// Steady's p95 TTFT (before the flood, during it), seconds.
fn steady_p95(result: &Evaluation, policy: Policy) -> (f64, f64) {
    let config = &result.config;
    let start = config.start_of("flood");
    let p95 = |from, until| {
        let slice = result.slice(policy, "steady", from, until);
        let p = slice.ttft_p95.expect("admitted steady requests");
        assert!(!p.at_least, "{policy}: a steady request never started");
        p.value.as_secs_f64()
    };
    (p95(WARMUP, start), p95(start, config.record_until))
}

/// Steady's requests during the flood that met the TTFT objective, as a
/// fraction of its arrivals.
fn steady_good(result: &Evaluation, policy: Policy) -> f64 {
    let config = &result.config;
    let slice = result.slice(
        policy,
        "steady",
        config.start_of("flood"),
        config.record_until,
    );
    slice.good as f64 / slice.arrived as f64
}

fn refusals(result: &Evaluation, policy: Policy, name: &str, reason: RejectionReason) -> usize {
    let config = &result.config;
    result
        .rejections(policy, name, Duration::ZERO, config.record_until)
        .iter()
        .find(|(r, _)| *r == reason)
        .map_or(0, |(_, n)| *n)
}

#[test]
fn without_tenant_limits_the_flood_blows_steady_tail_far_past_the_goal() {
    let result = noisy();
    for policy in [Policy::Gate, Policy::GateQos] {
        let (before, during) = steady_p95(result, policy);
        assert!(before < 0.05, "{policy}: {before} s before the flood");
        // The check of the goal can fail: here it fails by two orders of
        // magnitude (the flood fills the engine, and the queue, with its
        // long prompts).
        assert!(
            during > 10.0 * before && during > 1.0,
            "{policy}: {before} s -> {during} s"
        );
        assert!(steady_good(result, policy) < 0.25, "{policy}");
        // Nothing is refused for its tenant without tenant limits.
        for name in ["steady", "flood"] {
            assert_eq!(
                refusals(result, policy, name, RejectionReason::TenantLimit),
                0,
                "{policy}: {name}"
            );
        }
    }
}

#[test]
fn with_tenant_limits_steady_fares_better_and_the_flood_is_refused_for_its_tenant() {
    let result = noisy();
    let policy = Policy::GateTenantLimits;
    let (before, during) = steady_p95(result, policy);
    assert!(before < 0.05, "{before} s before the flood");
    for other in [Policy::Gate, Policy::GateQos] {
        let (_, without) = steady_p95(result, other);
        assert!(
            during < 0.5 * without,
            "{during} s against {other}'s {without} s"
        );
        assert!(
            steady_good(result, policy) > steady_good(result, other) + 0.2,
            "against {other}"
        );
    }
    // The flood, at its queue limit, is refused for its tenant. So is
    // steady, less often: the flood's prefill slows every step, steady
    // needs more slots than before and queues, and the queue limit of 8
    // holds for every tenant.
    let config = &result.config;
    let share = |name: &str| {
        let arrived = result
            .slice(policy, name, Duration::ZERO, config.record_until)
            .arrived;
        refusals(result, policy, name, RejectionReason::TenantLimit) as f64 / arrived as f64
    };
    assert!(share("flood") > 0.3, "{}", share("flood"));
    assert!(share("steady") < share("flood"), "{}", share("steady"));
    // And the engine is not thrashed: the flood cannot take the KV.
    assert_eq!(result.run(policy).expect("ran").preemptions, 0);
}

#[test]
fn a_token_limit_of_an_eighth_of_the_kv_keeps_nearly_all_of_steady_good() {
    let mut config = small();
    config.tenant_token_limit = Some(config.engine.kv_blocks * config.engine.block_size / 8);
    config.policies = vec![Policy::GateTenantLimits];
    let result = qos::run(&config);
    let policy = Policy::GateTenantLimits;
    let good = steady_good(&result, policy);
    assert!(good >= 0.95, "{good}");
    // Still several times its tail before the flood: every step that
    // carries a flood prompt's 2,048-token prefill chunk lasts 41 ms.
    let (before, during) = steady_p95(&result, policy);
    assert!(
        during > 1.5 * before && during < 0.3,
        "{before} s -> {during} s"
    );
}

#[test]
fn the_flood_bounded_by_name_leaves_steady_all_its_goodput_but_not_its_tail() {
    let mut config = small();
    config.policies = vec![Policy::GateTenantLimits];
    let unbounded = qos::run(&config);
    config.tenant_overrides = vec![("flood", TenantLimits::new().tokens(4096).requests(1))];
    let bounded = qos::run(&config);
    let policy = Policy::GateTenantLimits;
    let admitted = |result: &Evaluation| {
        let slice = result.slice(policy, "flood", Duration::ZERO, result.config.record_until);
        slice.admitted
    };
    // The override holds for the flood only: it is admitted far less, and
    // steady (under the defaults for every tenant) loses nothing.
    assert!(
        admitted(&bounded) * 5 < admitted(&unbounded),
        "{} against {}",
        admitted(&bounded),
        admitted(&unbounded)
    );
    assert!(steady_good(&bounded, policy) >= 0.99);
    assert!(steady_good(&bounded, policy) > steady_good(&unbounded, policy));
    // Even one flood request at a time doubles steady's tail: a step that
    // carries a chunk of its prompt lasts 41 ms against 7 ms. (The engine's
    // long-prefill threshold shortens those steps: the next test.)
    let (before, during) = steady_p95(&bounded, policy);
    assert!(
        during > 1.5 * before && during < 0.1,
        "{before} s -> {during} s"
    );
}

/// Issue 37's goal (BENCHMARKS.md, "The noisy tenant"): with tenant
/// limits, steady's p95 TTFT during the flood within 1.5× of before. The
/// gate's limits, even with the flood bounded by name to one request (the
/// test above), bound what the flood holds, not how long an engine step
/// takes: its prompts are prefilled in 2,048-token chunks, 41 ms a step
/// against 7 ms. The engine's side is vLLM's
/// `--long-prefill-token-threshold`: at 256 tokens (above steady's
/// prompts, so its tail before the flood is unchanged) a step with a flood
/// prompt's chunk beside other requests lasts about 10 ms. It takes both:
/// the threshold alone, under the defaults or fair queueing, leaves the
/// flood to fill the queue.
#[test]
fn the_goal_is_met_with_the_flood_named_and_the_engines_long_prefill_threshold() {
    let mut config = small();
    config.engine.long_prefill_token_threshold = 256;
    config.tenant_overrides = vec![("flood", TenantLimits::new().tokens(4096).requests(1))];
    let result = qos::run(&config);

    let policy = Policy::GateTenantLimits;
    let (before, during) = steady_p95(&result, policy);
    assert!(during <= 1.5 * before, "{before} s -> {during} s");
    // Met without moving the baseline: steady's tail before the flood is
    // what it is without the threshold.
    let (unthresholded, _) = steady_p95(noisy(), policy);
    assert!(
        before <= 1.1 * unthresholded,
        "{before} s against {unthresholded} s"
    );
    assert!(steady_good(&result, policy) >= 0.99);
    // The flood is still served, a request at a time.
    let flood = result.slice(policy, "flood", Duration::ZERO, config.record_until);
    assert!(flood.admitted >= 10, "{}", flood.admitted);

    for alone in [Policy::Gate, Policy::GateQos] {
        let (before, during) = steady_p95(&result, alone);
        assert!(
            during > 10.0 * before && during > 1.0,
            "{alone}: {before} s -> {during} s"
        );
    }
}
