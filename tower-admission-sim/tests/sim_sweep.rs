//! The overload evaluation in virtual time (`SweepConfig::fast`, seeded):
//! the claims BENCHMARKS.md makes, small enough for every `cargo test`.
//! Needs the `sim` feature.

use std::time::Duration;

use tower_admission_sim::sweep::{self, Calibration, Clients, Retry, Sweep, SweepConfig, System};

/// Runs `systems` at `loads` on the fast engine, with `f` applied.
fn sweep(systems: &[System], loads: &[f64], f: impl FnOnce(&mut SweepConfig)) -> Sweep {
    let mut config = SweepConfig {
        systems: systems.to_vec(),
        loads: loads.to_vec(),
        ..SweepConfig::fast()
    };
    f(&mut config);
    let calibration = Calibration::measure(&config);
    sweep::run(&config, &calibration, |_| {})
}

#[test]
fn at_four_and_eight_times_capacity_the_gate_keeps_goodput_where_no_admission_collapses() {
    let mut systems = System::ALTERNATIVES.to_vec();
    systems.push(System::Gate);
    let result = sweep(&systems, &[4.0, 8.0], |_| {});
    let capacity = result.capacity();
    let objective = SweepConfig::fast().slo.ttft;
    for load in [4.0, 8.0] {
        let at = |system| result.point(system, load).expect("run");
        let gate = at(System::Gate);
        assert!(
            gate.capacity_fraction >= 0.9,
            "gate at {load}x: {:.2} of capacity: {gate:?}",
            gate.capacity_fraction
        );
        // At least the best alternative's, within the spread of one point
        // of this short run: which requests a system serves decides the
        // mean output length of its ~600 completions, about ±4% (the
        // TGI-style semaphore and the vLLM-style cap hold goodput too; the
        // 60 s runs of BENCHMARKS.md narrow it).
        for other in System::ALTERNATIVES {
            let point = at(other);
            assert!(
                gate.goodput >= point.goodput - 0.1 * capacity,
                "{other} beats the gate at {load}x: {point:?} vs {gate:?}"
            );
        }
        // It keeps goodput by turning the excess away, fast: the admitted
        // requests meet the first-token objective.
        assert!(gate.rejection_rate() > 0.5, "{gate:?}");
        let p99 = gate.ttft_p99.expect("admitted requests");
        assert!(!p99.at_least && p99.value <= objective, "{gate:?}");
        // With the gate the excess waits outside the engine.
        assert!(gate.engine_queue_peak < 64, "{gate:?}");

        for system in [System::NoAdmission, System::ConcurrencyLimit] {
            let point = at(system);
            assert!(
                point.capacity_fraction < 0.3,
                "{system} at {load}x: {point:?}"
            );
            assert_eq!(point.rejected, 0, "{system} turns nothing away");
            // ... and the excess waits inside the engine, out of sight.
            assert!(point.engine_queue_peak > 640, "{system}: {point:?}");
        }
    }
}

#[test]
fn a_tight_first_token_objective_needs_a_queue_sized_for_it() {
    // 2 s: the default queue (2 x max_num_seqs) holds about 4.5 s of work.
    let result = sweep(
        &[System::Gate, System::GateSizedForObjective],
        &[4.0],
        |config| config.slo.ttft = Duration::from_secs(2),
    );
    let objective = Duration::from_secs(2);
    let defaults = result.point(System::Gate, 4.0).expect("run");
    let sized = result
        .point(System::GateSizedForObjective, 4.0)
        .expect("run");
    let p99 = |point: &sweep::Point| point.ttft_p99.expect("admitted").value;
    assert!(p99(defaults) > objective, "{defaults:?}");
    assert!(defaults.capacity_fraction < 0.5, "{defaults:?}");
    assert!(p99(sized) <= objective, "{sized:?}");
    assert!(sized.capacity_fraction >= 0.9, "{sized:?}");
    assert!(
        result.calibration.queue_for_objective < 64,
        "{:?}",
        result.calibration
    );
}

#[test]
fn the_retry_budget_bounds_retry_amplification() {
    let retry = Retry::default();
    let result = sweep(&[System::Gate, System::TgiSemaphore], &[4.0], |config| {
        config.clients = Clients::Retry(retry);
    });
    for system in [System::Gate, System::TgiSemaphore] {
        let point = result.point(system, 4.0).expect("run");
        let sends = point.sends_per_request();
        // Most requests are rejected at 4x, and would be retried three
        // times without the budget; with it, 0.2 retries per request.
        assert!(sends > 1.1, "{system}: {point:?}");
        assert!(
            sends <= 1.0 + retry.budget_ratio + 0.02,
            "{system}: {point:?}"
        );
        assert!(point.capacity_fraction >= 0.9, "{system}: {point:?}");
    }
}

#[test]
fn clients_that_give_up_leave_abandoned_work_only_without_admission_control() {
    let result = sweep(&[System::NoAdmission, System::Gate], &[4.0], |config| {
        config.clients = Clients::GiveUp {
            after: config.slo.ttft,
        };
    });
    let none = result.point(System::NoAdmission, 4.0).expect("run");
    let gate = result.point(System::Gate, 4.0).expect("run");
    // Without admission control most requests wait in the engine until
    // their clients leave; a few leave mid-prefill, after the engine
    // started on them.
    assert!(none.abandon_rate() > 0.5, "{none:?}");
    assert!(none.engine_cancelled as usize >= none.abandoned, "{none:?}");
    // The gate answers the excess at once: nobody waits long enough to
    // give up, and the engine never works for a client that left.
    assert_eq!(gate.abandoned, 0, "{gate:?}");
    assert_eq!(gate.engine_cancelled, 0, "{gate:?}");
    assert!(gate.goodput > none.goodput, "{gate:?} vs {none:?}");
}

#[test]
fn a_sweep_is_deterministic_for_a_seed() {
    let config = SweepConfig {
        loads: vec![2.0],
        systems: vec![System::NoAdmission, System::Gate],
        ..SweepConfig::fast()
    };
    let calibration = Calibration::measure(&config);
    assert_eq!(calibration, Calibration::measure(&config));

    let first = sweep::run(&config, &calibration, |_| {});
    let second = sweep::run(&config, &calibration, |_| {});
    assert_eq!(first, second);

    let reseeded = SweepConfig { seed: 2, ..config };
    assert_ne!(first, sweep::run(&reseeded, &calibration, |_| {}));
}

#[test]
fn the_ttft_objective_alone_keeps_goodput_and_bounds_the_first_token_wait() {
    // The objective is the gate's only setting: no queue limit, no waiting
    // limit. Goal: >= 90% of capacity at 2x, 4x and 8x, p99 TTFT of the
    // admitted requests within the objective. The gate's wait budget is
    // the objective minus the *mean* engine waiting time, so the requests
    // admitted at the end of their budget reach the objective on average:
    // p99 lands on it, a little above (by 0.1-2% in BENCHMARKS.md's
    // runs). The bound checked is the objective plus 3%.
    for (objective, loads) in [
        (Duration::from_secs(1), &[2.0, 4.0, 8.0][..]),
        (Duration::from_millis(500), &[8.0][..]),
    ] {
        let result = sweep(&[System::GateTtftObjective], loads, |config| {
            config.slo.ttft = objective;
        });
        for &load in loads {
            let point = result.point(System::GateTtftObjective, load).expect("run");
            assert!(
                point.capacity_fraction >= 0.9,
                "{objective:?} at {load}x: {point:?}"
            );
            let p99 = point.ttft_p99.expect("admitted requests");
            assert!(
                !p99.at_least && p99.value <= objective.mul_f64(1.03),
                "{objective:?} at {load}x: {point:?}"
            );
            // It gets there by turning the excess away, not by queueing it.
            assert!(point.rejection_rate() > 0.4, "{point:?}");
        }
    }
}

#[test]
fn with_long_documents_the_token_budget_does_not_cost_goodput_and_shortens_the_short_tail() {
    // The long-docs scenario at 2x, a 0.5 s objective, the queue sized for
    // it and the KV cache's size as the engine token limit on every gate
    // row: counts only vs counts plus the engine waiting token budget.
    let base = SweepConfig {
        systems: vec![System::Gate, System::GateTokenBudget],
        loads: vec![2.0],
        ..SweepConfig::fast()
    };
    let mut config = sweep::scenarios(&base)
        .into_iter()
        .find(|scenario| scenario.name == "long-docs")
        .expect("the long-docs scenario")
        .config;
    config.slo.ttft = Duration::from_millis(500);
    let calibration = Calibration::measure(&config);
    config.gate = tower_admission::AdmissionConfig::new()
        .request_queue_limit(calibration.queue_for_objective.max(1))
        .engine_token_limit(config.engine.kv_blocks * config.engine.block_size);
    let result = sweep::run(&config, &calibration, |_| {});
    let defaults = result.point(System::Gate, 2.0).expect("run");
    let budget = result.point(System::GateTokenBudget, 2.0).expect("run");
    for point in [defaults, budget] {
        assert_eq!(point.short.arrived + point.long.arrived, point.arrived);
        assert!(point.long.arrived * 20 > point.arrived, "{point:?}");
    }
    assert_eq!(
        calibration.token_budget,
        tower_admission::sizing::token_budget(
            Duration::from_millis(500),
            config.engine.prefill_tokens_per_second()
        )
    );
    // Goodput does not fall, within the spread of one point of this short
    // run (about ±4% of capacity, as above; seed 1: 18.1 vs 18.8 req/s).
    assert!(
        budget.goodput >= defaults.goodput - 0.1 * result.capacity(),
        "{budget:?} vs {defaults:?}"
    );
    let short_p99 = |point: &sweep::Point| point.short.ttft_p99.expect("admitted").value;
    assert!(
        short_p99(budget) < short_p99(defaults),
        "{budget:?} vs {defaults:?}"
    );
}
