//! A metrics recorder is user code. One that panics on every call must not
//! cost the gate anything: no capacity lost, no waiter stalled, no request
//! cancelled in another's name, no process aborted by a second panic while
//! a permit is dropped during unwinding.

#![cfg(feature = "metrics")]

use futures::FutureExt;
use tokio_test::task;
use tower_admission::{AdmissionConfig, EngineCapacity, Gate};

#[path = "support/gate.rs"]
mod gate_support;
#[path = "support/panicking_recorder.rs"]
mod panicking_recorder;
#[path = "support/panics.rs"]
mod panics;
use tower_admission_testkit::rng;
#[path = "support/stress.rs"]
mod stress;

use gate_support::{assert_idle, counts, gate};
use panicking_recorder::PanickingRecorder;

const HANDLES_PANIC: PanickingRecorder = PanickingRecorder {
    panic_on_register: false,
};
const EVERYTHING_PANICS: PanickingRecorder = PanickingRecorder {
    panic_on_register: true,
};

/// A gate whose series were registered with `recorder` (the handles the
/// gate keeps are the recorder's, whichever thread later uses them).
fn gate_recorded_by(recorder: PanickingRecorder, config: AdmissionConfig) -> Gate {
    panics::quiet_injected_panics("injected");
    metrics::with_local_recorder(&recorder, || Gate::new(config))
}

#[test]
fn a_recorder_that_panics_while_a_waiter_takes_its_admission_cancels_nobody_else() {
    // The sequence that used to cancel another request: limits (1, 1),
    // queue 2; A admitted, B queued; A ends, so B is offered; the recorder
    // panics while B takes its admission; C arrives in the slot B's entry
    // had; B's future is dropped.
    panics::quiet_injected_panics("injected");
    let gate = metrics::with_local_recorder(&HANDLES_PANIC, || gate(1, 1, 2));
    let a = gate.acquire(None).now_or_never().unwrap().unwrap();
    let mut b = task::spawn(gate.acquire(None));
    assert!(b.poll().is_pending());
    drop(a);
    assert!(b.is_woken());
    let b_permit = match b.poll() {
        std::task::Poll::Ready(Ok(permit)) => permit,
        other => panic!("B is admitted despite the recorder: {other:?}"),
    };
    let mut c = task::spawn(gate.acquire(None));
    assert!(c.poll().is_pending());
    drop(b);
    assert_eq!(gate.snapshot().total, counts(1, 1, 1), "C is still queued");
    drop(b_permit);
    assert!(c.is_woken());
    let c_permit = match c.poll() {
        std::task::Poll::Ready(Ok(permit)) => permit,
        other => panic!("C is admitted once B ends: {other:?}"),
    };
    drop(c_permit);
    let snapshot = gate.snapshot();
    assert_idle(&snapshot);
    assert_eq!(snapshot.tally.cancelled, 0);
    assert_eq!(snapshot.tally.admitted(), 3);
}

#[test]
fn a_recorder_that_panics_when_registering_leaves_a_working_gate() {
    let gate = gate_recorded_by(
        EVERYTHING_PANICS,
        AdmissionConfig::new()
            .engine_request_limit(1)
            .capacity(EngineCapacity::new(4, 2)),
    );
    let mut permit = gate.acquire(Some(1)).now_or_never().unwrap().unwrap();
    let mut queued = task::spawn(gate.acquire(Some(1)));
    assert!(queued.poll().is_pending());
    permit.first_token();
    drop(permit);
    assert!(queued.is_woken());
    assert!(matches!(queued.poll(), std::task::Poll::Ready(Ok(_))));
    drop(queued);
    assert_idle(&gate.snapshot());
}

#[test]
fn a_permit_dropped_while_unwinding_with_a_panicking_recorder_does_not_abort() {
    let gate = gate_recorded_by(HANDLES_PANIC, AdmissionConfig::new());
    let held = gate.clone();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _permit = held.acquire(None).now_or_never().unwrap().unwrap();
        panic!("injected handler panic");
    }));
    assert!(unwound.is_err());
    assert_idle(&gate.snapshot());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stress_run_under_a_recorder_that_panics_on_every_call_loses_nothing() {
    let gate = gate_recorded_by(
        HANDLES_PANIC,
        AdmissionConfig::new()
            .engine_request_limit(8)
            .engine_request_waiting_limit(4)
            .request_queue_limit(16)
            .capacity(EngineCapacity::new(64, 4)),
    );
    stress::run_stress(&gate).await;
}
