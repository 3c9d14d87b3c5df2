//! What the state answers: the [`Ticket`] a queued request waits under,
//! the [`Grant`] an admitted one holds, and the decisions on an arrival
//! ([`Arrival`]), an expired budget ([`Expiry`]) and a waiter's look at its
//! request ([`Polled`]).
//!
//! # Invariants
//!
//! * A ticket's `seq` is its slot's generation: a stale ticket never
//!   matches the request that reuses its slot.
//! * A grant releases its waiting and its request capacity at most once
//!   each (its `holds_*` flags), and only through the state.

use std::time::Instant;

#[cfg(doc)]
use super::State;
use super::accounting::Demand;
use super::buckets::{BucketKey, Held};
use super::outside::Slots;
use crate::gate::types::{AdmitSource, Overloaded, Tenant};

/// Identifies a queued request while it waits: its slot in the entry slab
/// and its arrival number. The arrival number is the slot's generation: a
/// stale ticket (one whose request already left) never matches the request
/// that reuses its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(super) slot: usize,
    pub(super) seq: u64,
}

/// Capacity held by one admitted request. Dropping a `Grant` without
/// passing it to [`State::finish`] leaks its capacity: the driver wraps it in
/// an RAII type.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(super) held: Held,
    pub(super) demand: Demand,
    /// When it was admitted, if the gate keeps time.
    pub(super) admitted_at: Option<Instant>,
    pub(super) rank: Option<u32>,
    pub(super) source: AdmitSource,
    pub(super) holds_request: bool,
    pub(super) holds_waiting: bool,
    /// Whether the driver's lock-free lane holds its capacity, not the
    /// state (see [`outside`](super::outside)).
    pub(super) in_lane: bool,
    /// The request's tenant, when it is limited: what it releases for.
    pub(super) tenant: Option<Tenant>,
}

impl Grant {
    /// The grant of a plain unranked request the driver's lock-free lane
    /// admitted on arrival: the lane, not the state, holds its capacity.
    pub(crate) fn in_lane() -> Grant {
        Grant {
            held: Held {
                bucket: BucketKey::Unranked,
                generation: 0,
            },
            demand: Demand::default(),
            admitted_at: None,
            rank: None,
            source: AdmitSource::Direct,
            holds_request: true,
            holds_waiting: true,
            in_lane: true,
            tenant: None,
        }
    }

    /// Whether the lane holds the grant's capacity.
    #[inline]
    pub(crate) fn is_in_lane(&self) -> bool {
        self.in_lane
    }

    /// Gives up what a lane grant still holds of its waiting capacity and,
    /// with `finished`, of its request capacity: what the lane takes back.
    #[inline]
    pub(crate) fn leave_lane(&mut self, finished: bool) -> Slots {
        debug_assert!(
            self.in_lane,
            "a grant of the state leaves through the state"
        );
        let waiting = std::mem::take(&mut self.holds_waiting);
        let request = finished && std::mem::take(&mut self.holds_request);
        Slots {
            requests: usize::from(request),
            waiting: usize::from(waiting),
        }
    }

    /// The rank the request was admitted on (`None` when unranked).
    pub(crate) fn rank(&self) -> Option<u32> {
        self.rank
    }

    pub(crate) fn source(&self) -> AdmitSource {
        self.source
    }

    /// Whether the grant still holds waiting capacity.
    pub(crate) fn is_waiting(&self) -> bool {
        self.holds_waiting
    }

    /// Whether the grant still holds anything.
    pub(crate) fn is_released(&self) -> bool {
        !self.holds_request && !self.holds_waiting
    }
}

/// The gate's answer to an arrival.
#[derive(Debug)]
pub(crate) enum Arrival {
    /// Admitted at once; the grant holds its capacity.
    Admitted(Grant),
    /// Waiting in a queue, until the instant its queue wait budget ends, if
    /// it has one. Poll it with [`State::poll`], cancel it with
    /// [`State::cancel`], expire it with [`State::expire`].
    Queued(Ticket, Option<Instant>),
    /// Rejected: its queue was full, or it could not be admitted within its
    /// queue wait budget.
    Rejected(Overloaded),
}

/// What became of a request whose queue wait budget ran out.
#[derive(Debug)]
pub(crate) enum Expiry {
    /// It left the queue, rejected for its deadline; counted under this
    /// rank (`None`: unranked).
    Rejected(Overloaded, Option<u32>),
    /// It had been offered an admission, or displaced, already: that
    /// decision stands.
    Decided,
    /// The ticket is stale.
    Stale,
}

/// The state of a queued request, as seen by its waiter.
#[derive(Debug)]
pub(crate) enum Polled<'a, T> {
    /// Admitted from the queue; the ticket is spent and its payload given
    /// back.
    Admitted(Grant, T),
    /// Displaced from its queue (counted as rejected already); the ticket is
    /// spent and its payload given back.
    Rejected(Overloaded, T),
    /// Still queued (or offered, when the offer has not been drained yet).
    Waiting(&'a mut T),
    /// The ticket is stale: its request already left the queue.
    Stale,
}
