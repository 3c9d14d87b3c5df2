//! The QoS evaluation in virtual time (`sim::qos`, seeded): the goals of
//! BENCHMARKS.md's "Quality of service" section that are met, asserted,
//! and the ones that are not, kept as ignored tests that state them.
//! Needs the `sim` feature.

use std::sync::OnceLock;
use std::time::Duration;

use tower_admission_sim::qos::{self, Evaluation, Policy, QosConfig};

/// The incident, once for every test here.
fn incident() -> &'static Evaluation {
    static RESULT: OnceLock<Evaluation> = OnceLock::new();
    RESULT.get_or_init(|| qos::run(&QosConfig::incident()))
}

/// The weighted-fairness scenario, once.
fn fairness() -> &'static Evaluation {
    static RESULT: OnceLock<Evaluation> = OnceLock::new();
    RESULT.get_or_init(|| qos::run(&QosConfig::fairness()))
}

const BEFORE: Duration = Duration::from_secs(5);

/// (p95 TTFT of chat before the batch starts, after it starts), seconds.
fn chat_p95(result: &Evaluation, policy: Policy) -> (f64, f64) {
    let config = &result.config;
    let start = config.start_of("batch");
    let before = result.slice(policy, "chat", BEFORE, start);
    let after = result.slice(policy, "chat", start, config.record_until);
    let p95 = |slice: &qos::Slice| {
        let p = slice.ttft_p95.expect("admitted chat requests");
        assert!(!p.at_least, "{policy}: a chat request never started");
        p.value.as_secs_f64()
    };
    (p95(&before), p95(&after))
}

fn total_goodput(result: &Evaluation, policy: Policy) -> f64 {
    let config = &result.config;
    result.total_goodput(policy, config.start_of("batch"), config.record_until)
}

#[test]
fn without_qos_chat_waits_behind_the_batch_and_with_it_chat_keeps_its_objective() {
    let result = incident();
    let config = &result.config;
    let start = config.start_of("batch");
    // The incident: chat's tail grows by orders of magnitude.
    for policy in [Policy::NoAdmission, Policy::Gate] {
        let (before, after) = chat_p95(result, policy);
        assert!(before < 0.1, "{policy}: {before}");
        assert!(
            after > 10.0,
            "{policy}: chat p95 {after} s after the batch starts"
        );
    }
    // With bands, chat is served before the batch: its tail falls from
    // seconds to a few hundred milliseconds (the engine's prefill of
    // admitted batch prompts is the rest), and nearly all of it is good.
    for policy in [Policy::GateQos, Policy::GateQosWaitLimit] {
        let (_, after) = chat_p95(result, policy);
        assert!(after < 1.5, "{policy}: chat p95 {after} s");
        let chat = result.slice(policy, "chat", start, config.record_until);
        assert_eq!(chat.rejected, 0, "{policy}: {chat:?}");
        assert!(
            chat.good as f64 >= 0.9 * chat.arrived as f64,
            "{policy}: {chat:?}"
        );
    }
    let policy = Policy::GateQosTokenBudget;
    let (_, after) = chat_p95(result, policy);
    assert!(after < 0.2, "{policy}: chat p95 {after} s");
    let chat = result.slice(policy, "chat", start, config.record_until);
    assert!(
        chat.good as f64 >= 0.99 * chat.arrived as f64,
        "{policy}: {chat:?}"
    );
    // A token budget keeps fewer batch prompts ahead of chat in the engine.
    let (_, waits) = chat_p95(result, Policy::GateQosWaitLimit);
    let (_, tokens) = chat_p95(result, Policy::GateQosTokenBudget);
    assert!(tokens < 0.5 * waits, "{tokens} vs {waits}");
}

#[test]
fn with_qos_the_batch_uses_the_capacity_chat_leaves() {
    let result = incident();
    // With a queue wait limit the batch requests the gate keeps start
    // within their 30 s objective, and the two classes together do more
    // good work than either could alone (chat needs slots, batch prefill).
    for policy in [Policy::GateQosWaitLimit, Policy::GateQosTokenBudget] {
        let total = total_goodput(result, policy);
        assert!(total >= 0.9, "{policy}: total goodput {total}");
    }
    // Without admission control the engine's queue eats the goodput.
    let none = total_goodput(result, Policy::NoAdmission);
    assert!(none < 0.9, "{none}");
}

#[test]
fn no_batch_request_waits_forever() {
    let result = incident();
    let config = &result.config;
    let (start, until) = (config.start_of("batch"), config.record_until);
    for policy in [
        Policy::Gate,
        Policy::GateQos,
        Policy::GateQosWaitLimit,
        Policy::GateQosTokenBudget,
    ] {
        // Every batch request is answered (a first token or a rejection),
        // and the longest wait does not grow with the overload...
        assert!(
            result.waits_bounded(policy, "batch", start, until),
            "{policy}: {:?}",
            result.longest_waits(policy, "batch", start, until)
        );
        // ... and, with a wait limit, stays within it and a prefill.
        if matches!(
            policy,
            Policy::GateQosWaitLimit | Policy::GateQosTokenBudget
        ) {
            let batch = result.slice(policy, "batch", start, until);
            let longest = batch.longest_wait.expect("batch requests");
            assert!(
                longest.value <= config.queue_wait_limit + Duration::from_secs(2),
                "{policy}: {batch:?}"
            );
        }
    }
    // Without admission control the engine's queue grows as long as the
    // overload lasts, and so does the wait.
    assert!(
        !result.waits_bounded(Policy::NoAdmission, "batch", start, until),
        "{:?}",
        result.longest_waits(Policy::NoAdmission, "batch", start, until)
    );
}

/// Documents an unmet goal (BENCHMARKS.md, "Quality of service"): chat's
/// p95 TTFT after the batch starts within 1.5× of before. The gate takes
/// the queueing out of chat's TTFT, but every engine step that carries a
/// 2048-token prefill chunk of a batch prompt lasts 41 ms against 7 ms, so
/// chat's p95 goes from 26 ms to 128–488 ms however the gate orders its
/// queue; only a batch load near 5% of its capacity keeps it within 1.5×.
#[test]
#[ignore = "unmet goal: prefill interference inside the engine (see BENCHMARKS.md)"]
fn chat_p95_after_the_batch_starts_stays_within_one_and_a_half_times_before() {
    let result = incident();
    for policy in [
        Policy::GateQos,
        Policy::GateQosWaitLimit,
        Policy::GateQosTokenBudget,
    ] {
        let (before, after) = chat_p95(result, policy);
        assert!(after <= 1.5 * before, "{policy}: {before} s -> {after} s");
    }
}

/// Admitted tokens of tenant `a` over tenant `b` under `policy`.
fn share(result: &Evaluation, policy: Policy) -> f64 {
    let (from, until) = (Duration::from_secs(10), result.config.record_until);
    let a = result.admitted(policy, "a", from, until);
    let b = result.admitted(policy, "b", from, until);
    a.tokens as f64 / b.tokens as f64
}

#[test]
fn with_a_queue_wait_limit_admitted_shares_follow_the_weights() {
    let result = fairness();
    let ratio = share(result, Policy::GateQosWaitLimit);
    assert!((ratio / 3.0 - 1.0).abs() <= 0.05, "a:b = {ratio}");
    // Without tenants the gate shares by arrivals: 1:1.
    let fifo = share(result, Policy::Gate);
    assert!((fifo - 1.0).abs() <= 0.1, "a:b = {fifo}");
}

/// Documents an unmet goal (BENCHMARKS.md, "Weighted fairness"): with the
/// default queue and no wait limit, a full queue rejects arrivals whatever
/// their tenant, so each tenant is admitted as often as it finds room:
/// about 1:1, not 3:1.
#[test]
#[ignore = "unmet goal: a full queue rejects regardless of tenant (see BENCHMARKS.md)"]
fn with_the_default_queue_admitted_shares_follow_the_weights() {
    let ratio = share(fairness(), Policy::GateQos);
    assert!((ratio / 3.0 - 1.0).abs() <= 0.05, "a:b = {ratio}");
}
