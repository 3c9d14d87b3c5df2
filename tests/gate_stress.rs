//! Thousands of tasks on a multi-threaded runtime acquire, cancel at random
//! points, see first tokens and release, all at once. Whatever interleaving
//! the scheduler picks, the gate must end empty, with every request
//! accounted for and no task left waiting while capacity is free.

use tower_admission::{AdmissionConfig, EngineCapacity, Gate};

#[path = "support/gate.rs"]
mod gate_support;
#[path = "support/panics.rs"]
mod panics;
use tower_admission_testkit::rng;
#[path = "support/stress.rs"]
mod stress;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousands_of_tasks_leave_the_gate_empty_and_nobody_stuck() {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(8)
            .engine_request_waiting_limit(4)
            .request_queue_limit(16),
    );
    gate.report_capacity(EngineCapacity::new(64, 4));
    stress::run_stress(&gate).await;
}
