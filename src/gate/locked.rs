//! The gate's lock, held ([`Locked`]): the state, with the lock-free lane
//! closed and folded in, opened again when the guard drops; what the gate
//! keeps for each queued request ([`Waiter`]); and the work done on the
//! way out of a critical section: taking the wakers of admitted requests
//! (woken after the lock, [`wake_all`]) and reading plain values for the
//! observer ([`Observed`]).

use std::ops::{Deref, DerefMut};
use std::task::Waker;

// Model-checked under `--cfg loom` (see `loom_tests.rs`).
#[cfg(loom)]
use ::loom::sync::MutexGuard;
#[cfg(not(loom))]
use std::sync::MutexGuard;

use super::lane::Lane;
use super::observe::{Arrived, BucketView, Observed, Observer, Stamp};
use super::state::{State, Ticket};
use crate::DefaultObserver;
use crate::config::Limits;

/// What the gate keeps for each queued request.
#[derive(Debug)]
pub(crate) struct Waiter {
    pub(super) waker: Option<Waker>,
    pub(super) queued_at: Stamp,
    /// When the request was offered an admission (its arrival until then):
    /// its time in the queue ends and its engine waiting time begins.
    pub(super) offered_at: Stamp,
}

/// The gate's lock, held: the state, with the lane closed and folded in.
/// Dropping it opens the lane again when the state offers it room and no
/// observer wants to hear of each event, then releases the lock.
pub(super) struct Locked<'a> {
    state: MutexGuard<'a, State<Waiter>>,
    lane: &'a Lane,
    observer: &'a DefaultObserver,
}

impl<'a> Locked<'a> {
    /// The state, just locked: closes the lane and folds what it holds
    /// and admitted into the state, which may admit queued requests (the
    /// caller ends that as an event of its own).
    #[inline]
    pub(super) fn new(
        mut state: MutexGuard<'a, State<Waiter>>,
        lane: &'a Lane,
        observer: &'a DefaultObserver,
    ) -> Self {
        let (held, admitted) = lane.close();
        state.fold_outside(held, admitted);
        Locked {
            state,
            lane,
            observer,
        }
    }
}

impl Deref for Locked<'_> {
    type Target = State<Waiter>;

    #[inline]
    fn deref(&self) -> &State<Waiter> {
        &self.state
    }
}

impl DerefMut for Locked<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut State<Waiter> {
        &mut self.state
    }
}

impl Drop for Locked<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(room) = self.state.outside_room() {
            if !self.observer.records() {
                self.lane.open(room);
            }
        }
    }
}

impl Observed for State<Waiter> {
    #[inline]
    fn next_event(&mut self) -> u64 {
        State::next_event(self)
    }

    #[inline]
    fn view(&self, rank: Option<u32>) -> BucketView {
        self.view().bucket(rank)
    }

    fn worker_saturation(&self) -> f64 {
        self.observed_saturation(None)
    }

    #[inline]
    fn oldest_arrival(&self, rank: Option<u32>) -> Option<Arrived> {
        self.view()
            .oldest_queued(rank)
            .map(|(queued_at, waiter)| match queued_at {
                Some(at) => Arrived::Gate(at),
                None => Arrived::Stamp(waiter.queued_at),
            })
    }

    fn limits(&self) -> Limits {
        self.view().limits()
    }

    fn recognised_ranks(&self) -> usize {
        self.view().recognised_ranks()
    }

    fn known_ranks(&self) -> usize {
        self.view().known_ranks()
    }
}

/// Marks the requests an event admitted from the queue as offered now, and
/// takes their wakers and (for the observer) their ranks.
pub(super) fn take_offers(
    state: &mut State<Waiter>,
    wakers: &mut Vec<Waker>,
    offered_ranks: &mut Vec<Option<u32>>,
    observing: bool,
) {
    // Stamped even while nothing observes: a recorder installed while the
    // request runs records its waiting time from here.
    let now = Stamp::now();
    state.drain_offered(|rank, waiter| {
        waiter.offered_at = now;
        if let Some(waker) = waiter.waker.take() {
            wakers.push(waker);
        }
        if observing && !offered_ranks.contains(&rank) {
            offered_ranks.push(rank);
        }
    });
}

/// Stamps the arrival of the queued request of `ticket`, whose arrival
/// was not stamped (nothing observed it).
#[cold]
pub(super) fn stamp_queued(state: &mut State<Waiter>, ticket: Ticket) {
    if let Some(waiter) = state.payload_mut(ticket) {
        let now = Stamp::now();
        waiter.queued_at = now;
        waiter.offered_at = now;
    }
}

/// Wakes every waker; should one panic, the rest are still woken while
/// the panic unwinds.
pub(super) fn wake_all(wakers: Vec<Waker>) {
    let mut pending = WakeOnDrop(wakers.into_iter());
    for waker in &mut pending.0 {
        waker.wake();
    }
}

/// Wakes whatever wakers are left when dropped.
struct WakeOnDrop(std::vec::IntoIter<Waker>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        for waker in &mut self.0 {
            waker.wake();
        }
    }
}
