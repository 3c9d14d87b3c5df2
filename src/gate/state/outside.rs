//! Capacity held outside the state: the driver's lock-free lane (see
//! `gate/lane.rs`) admits plain unranked requests while nothing is queued,
//! without an event of the state, and tells the state what it holds and
//! how many it admitted whenever the driver takes the lock.
//!
//! # Invariants
//!
//! * `outside` is what the lane held when the driver last folded it in
//!   ([`State::fold_outside`]); it is counted in `total` and in the
//!   unranked bucket like any grant's capacity, so every rule of
//!   [`accounting`](super::accounting) sees it.
//! * The lane is only offered room ([`State::outside_room`]) while no
//!   queue holds a request and the configuration has no policy that the
//!   lane would skip: it keeps no time, has no priority bands and no
//!   adaptive limit. Then a plain unranked request that fits is admitted
//!   at once, whoever admits it, and its only trace in the state is its
//!   capacity and its `received` and `admitted_direct` tallies.
//! * The room is the room of the unranked bucket's engine limits left by
//!   everything the state holds itself, so the lane's holdings plus the
//!   state's never pass a limit the state would not pass.
//! * Capacity the lane gave back while the state was not looking goes to
//!   the queue when it is folded in: a fold is an event like a release.

use super::State;
use super::buckets::BucketKey;

/// Engine slots of the lane: what it holds, or the room it may fill
/// (plain requests hold no tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Slots {
    /// Engine request slots.
    pub(crate) requests: usize,
    /// Engine waiting slots.
    pub(crate) waiting: usize,
}

impl<T> State<T> {
    /// Whether the configuration lets the lane admit at all: decided once,
    /// from settings fixed at build ([`State::new`]).
    pub(super) fn allows_lane(&self) -> bool {
        !self.keeps_time
            && self.codel.is_none()
            && self.adaptive.is_none()
            && self.ladder.configured_bands() == 0
            && !self.ladder.ages()
    }

    /// The lane holds `held` now, and admitted `admitted` requests since
    /// the last fold. Capacity it gave back goes to the queue at once.
    pub(crate) fn fold_outside(&mut self, held: Slots, admitted: u64) {
        let was = std::mem::replace(&mut self.outside, held);
        if was == held && admitted == 0 {
            return;
        }
        for counts in self.total_and(BucketKey::Unranked) {
            counts.engine_requests = counts.engine_requests - was.requests + held.requests;
            counts.engine_waiting = counts.engine_waiting - was.waiting + held.waiting;
        }
        let tally = &mut self.bucket_mut(BucketKey::Unranked).tally;
        tally.received += admitted;
        tally.admitted_direct += admitted;
        if held.requests < was.requests || held.waiting < was.waiting {
            // The lane only ever opens on a gate that keeps no time.
            self.dequeue(None);
        }
    }

    /// How much the lane may hold in all (the unranked bucket's engine
    /// limits less what the state holds itself), or `None` while it may admit
    /// nothing: something is queued, or the configuration has a policy
    /// the lane would skip.
    pub(crate) fn outside_room(&self) -> Option<Slots> {
        if !self.lane_allowed || self.total.queued > 0 {
            return None;
        }
        let ranks = self.active_ranks;
        let room = |limit: usize, held: usize, outside: usize| {
            limit.saturating_mul(ranks).saturating_sub(held - outside)
        };
        Some(Slots {
            requests: room(
                self.limits.engine_request_limit,
                self.total.engine_requests,
                self.outside.requests,
            ),
            waiting: room(
                self.limits.engine_request_waiting_limit,
                self.total.engine_waiting,
                self.outside.waiting,
            ),
        })
    }
}
