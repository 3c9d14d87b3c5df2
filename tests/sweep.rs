//! The overload sweep in virtual time (`SweepConfig::fast`): the gate keeps
//! goodput near its peak far past capacity, while no admission control and
//! `tower::limit::ConcurrencyLimit` (released at response headers) let it
//! collapse. Needs the `sim` feature.
#![cfg(feature = "sim")]

use tower_admission::sim::sweep::{self, SweepConfig, System};

#[test]
fn the_gate_holds_goodput_at_four_times_capacity_where_no_admission_collapses() {
    let config = SweepConfig::fast();
    let capacity = sweep::measure_capacity(&config);
    let result = sweep::run(&config, capacity, |_| {});
    let peak = result.peak_goodput(System::Gate);
    let at_4x = |system| {
        let point = result.point(system, 4.0).expect("4x is in the fast sweep");
        (point.goodput, point)
    };

    // The peak is about the engine's capacity: nothing is lost below it.
    assert!(
        peak >= 0.9 * capacity,
        "peak {peak:.1} vs capacity {capacity:.1}"
    );
    let (gate, gate_point) = at_4x(System::Gate);
    assert!(
        gate >= 0.8 * peak,
        "gate at 4x: {gate:.1} req/s, peak {peak:.1}: {gate_point:?}"
    );
    // It keeps goodput by turning most of the excess away, fast.
    assert!(
        gate_point.rejected * 2 > gate_point.arrived,
        "{gate_point:?}"
    );
    for system in [System::NoAdmission, System::ConcurrencyLimit] {
        let (goodput, point) = at_4x(system);
        assert!(
            goodput < 0.3 * peak,
            "{system} at 4x: {goodput:.1} req/s, gate peak {peak:.1}: {point:?}"
        );
        assert_eq!(point.rejected, 0, "{system} turns nothing away");
        // ... and the excess waits inside the engine, out of sight.
        assert!(
            point.engine_queue_peak > 10 * config.engine.max_num_seqs,
            "{system}: {point:?}"
        );
    }
    // With the gate it waits outside: the engine holds at most what the
    // gate admitted (max_num_seqs), and only a few wait for a prefill slot.
    assert!(
        gate_point.engine_queue_peak < config.engine.max_num_seqs,
        "{gate_point:?}"
    );
}

#[test]
fn a_sweep_is_deterministic_for_a_seed() {
    let config = SweepConfig {
        loads: vec![2.0],
        systems: vec![System::NoAdmission, System::Gate],
        ..SweepConfig::fast()
    };
    let capacity = sweep::measure_capacity(&config);
    assert_eq!(capacity, sweep::measure_capacity(&config));

    let first = sweep::run(&config, capacity, |_| {});
    let second = sweep::run(&config, capacity, |_| {});
    assert_eq!(first, second);

    let reseeded = SweepConfig { seed: 2, ..config };
    assert_ne!(first, sweep::run(&reseeded, capacity, |_| {}));
}
