//! Metrics of SPEC §6 through the `metrics` facade.
//!
//! (Recording is filled in by the metrics issue; these hooks are where the
//! gate reports its transitions.)

use crate::config::AdmissionConfig;
use crate::gate::Waiter;
use crate::gate::state::{Arrival, Grant, State};

/// Records the gate's transitions.
#[derive(Debug)]
pub(crate) struct Recorder {}

impl Recorder {
    pub(crate) fn new(_config: &AdmissionConfig) -> Self {
        Recorder {}
    }

    pub(crate) fn on_configured(&self, _state: &State<Waiter>) {}

    pub(crate) fn on_arrival(&self, _state: &State<Waiter>, _rank: Option<u32>, _arrival: &Arrival) {}

    pub(crate) fn on_admitted_from_queue(&self, _state: &State<Waiter>, _grant: &Grant) {}

    pub(crate) fn on_release(&self, _state: &State<Waiter>, _grant: &Grant) {}

    pub(crate) fn on_cancelled(&self, _state: &State<Waiter>, _rank: Option<u32>) {}
}
