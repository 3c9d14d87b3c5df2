//! The client's view of an admitted request (behaviour §6): measured from
//! its arrival at the layer to the end of its response, while the gate's
//! metrics are recorded. Without feature `metrics` these types are empty
//! and every call does nothing, so the layer's code reads the same either
//! way.

use http::response;

use crate::gate::{Descriptor, Gate};

/// An HTTP layer admits through `gate`: the client's view is registered
/// with the gate's series (with feature `metrics`).
pub(crate) fn register(gate: &Gate) {
    #[cfg(feature = "metrics")]
    gate.observer().want_client();
    #[cfg(not(feature = "metrics"))]
    let _ = gate;
}

/// A request that arrived at the layer: when, and what it is measured
/// against (nothing while metrics are not recorded).
pub(crate) struct Arrival {
    #[cfg(feature = "metrics")]
    started: Option<crate::metrics::client::Started>,
}

impl Arrival {
    /// A request described by `descriptor` arrives now.
    #[inline]
    pub(crate) fn now(gate: &Gate, descriptor: &Descriptor) -> Arrival {
        #[cfg(not(feature = "metrics"))]
        let _ = (gate, descriptor);
        Arrival {
            #[cfg(feature = "metrics")]
            started: gate.observer().client_arrival(
                descriptor.priority,
                descriptor.tenant,
                descriptor.deadline,
            ),
        }
    }

    /// The request was admitted: its response is measured until it ends.
    #[inline]
    pub(crate) fn admitted(self) -> Measure {
        Measure {
            #[cfg(feature = "metrics")]
            measuring: self.started.map(crate::metrics::client::Started::admitted),
        }
    }
}

/// An admitted request's response, measured until it ends. Dropped before
/// that (the client went away, the inner service failed), the request
/// counts as finished, cut off: it did not meet its objectives.
pub(crate) struct Measure {
    #[cfg(feature = "metrics")]
    measuring: Option<crate::metrics::client::Measuring>,
}

impl Measure {
    /// Nothing measured: a request that bypassed the gate.
    pub(crate) fn none() -> Measure {
        Measure {
            #[cfg(feature = "metrics")]
            measuring: None,
        }
    }

    /// Whether the response is being measured: while it is not, the body
    /// asks nothing of it.
    #[inline(always)]
    pub(crate) fn is_on(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.measuring.is_some();
        #[cfg(not(feature = "metrics"))]
        false
    }

    /// The response's head: a server error (5xx) never meets its
    /// objectives.
    pub(crate) fn on_response(&mut self, head: &response::Parts) {
        #[cfg(feature = "metrics")]
        if let Some(measuring) = &mut self.measuring {
            measuring.server_error(head.status.is_server_error());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = head;
    }

    /// A content chunk passed on to the client: the first token, or one
    /// after it.
    #[inline]
    pub(crate) fn chunk(&mut self) {
        #[cfg(feature = "metrics")]
        if let Some(measuring) = &mut self.measuring {
            measuring.chunk();
        }
    }

    /// The response ended: `completed` if it reached its end, not if it
    /// failed. Measured once; later calls (and the drop) do nothing.
    #[inline(never)]
    pub(crate) fn end(&mut self, completed: bool) {
        #[cfg(feature = "metrics")]
        if let Some(measuring) = self.measuring.take() {
            measuring.finish(completed);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = completed;
    }
}

impl Drop for Measure {
    fn drop(&mut self) {
        self.end(false);
    }
}
