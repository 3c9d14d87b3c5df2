//! [`Permit`]: the RAII handle of admitted work.

use std::fmt;

use super::Gate;
use super::observe::Stamp;
use super::state::Grant;
use super::types::AdmitSource;

/// Engine capacity held by one admitted request.
///
/// It holds a place under both engine limits from admission. Call
/// [`first_token`](Permit::first_token) when the first generated token
/// appears: the waiting capacity is released and the request capacity kept.
/// Dropping the permit — the response ended, failed, was cancelled, or the
/// holder panicked — releases whatever it still holds, exactly once.
pub struct Permit {
    gate: Gate,
    grant: Grant,
    /// When the request was admitted, for the waiting-time histogram;
    /// `None` when nothing observed its admission.
    admitted_at: Option<Stamp>,
}

impl Permit {
    pub(crate) fn new(gate: Gate, grant: Grant, admitted_at: Option<Stamp>) -> Self {
        Permit {
            gate,
            grant,
            admitted_at,
        }
    }

    /// The first generated token appeared: release the waiting capacity.
    /// Idempotent; the request capacity stays held until the permit drops.
    pub fn first_token(&mut self) {
        if self.grant.is_waiting() {
            self.gate.release(&mut self.grant, false, self.admitted_at);
        }
    }

    /// Whether the permit still holds waiting capacity (no first token yet).
    pub(crate) fn is_waiting(&self) -> bool {
        self.grant.is_waiting()
    }

    /// The rank the request was admitted on; `None` for an unranked request.
    pub fn rank(&self) -> Option<u32> {
        self.grant.rank()
    }

    /// Whether the request was admitted on arrival or from the queue.
    pub fn source(&self) -> AdmitSource {
        self.grant.source()
    }

    /// The gate that admitted the request.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("rank", &self.rank())
            .field("source", &self.source())
            .field("waiting", &self.is_waiting())
            .finish()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.grant.is_released() {
            self.gate.release(&mut self.grant, true, self.admitted_at);
        }
    }
}
