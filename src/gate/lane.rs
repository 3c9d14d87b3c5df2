//! The lock-free lane: admits a plain unranked request, and takes back
//! its capacity at its first token and its end, with one atomic operation
//! each, while nothing is queued; everything else goes through the
//! state under the gate's lock.
//!
//! A request is *plain* when it has no rank and no cost: the state would
//! admit it on arrival if the unranked bucket's two engine limits have
//! room and no queue holds a request, and would count nothing but its
//! capacity and its `received` and `admitted_direct` tallies. The lane
//! does exactly that, in one word:
//!
//! ```text
//!  63   62..49        48..35        34..21    20..7     6..0
//! open  room_waiting  room_requests waiting   requests  admitted
//! ```
//!
//! `requests` and `waiting` are the capacity the lane's grants hold;
//! `admitted` counts its admissions since the state last heard of them;
//! the rooms are how much the lane may hold in all, set by the state when
//! the lane is opened ([`Slots`]).
//!
//! # Invariants
//!
//! * **Only the lock opens and closes the lane.** Every critical section
//!   of the gate starts by closing it ([`Lane::close`]) and folding what it
//!   holds into the state ([`State::fold_outside`](super::state::State)),
//!   and ends by opening it again when the state offers room
//!   ([`Lane::open`]). So while the lane is open the state does not change,
//!   and the rooms it was opened with are still exact: an admission that
//!   sees `requests < room_requests` and `waiting < room_waiting` in the
//!   word it swaps is one the state would have made.
//! * **Closed, the lane admits nothing**, so the holdings a critical
//!   section folds in can only fall while it runs (grants giving back).
//!   A decision made on them is at worst the decision of an instant
//!   before the give-back.
//! * **A give-back to a closed lane is followed by a critical section**
//!   of the one who gave it back: capacity freed while something may be
//!   queued reaches the queue ([`Lane::give_back`] says so). A give-back to
//!   an open lane needs none: nothing was queued, and the next critical
//!   section folds it in before anything can queue.
//! * **Fields never carry into each other.** An admission increments
//!   `requests` and `waiting` only below their rooms (at most
//!   [`FIELD_MAX`]) and `admitted` only below its maximum; a give-back
//!   decrements only what a grant of the lane holds.

// Model-checked under `--cfg loom` (see `loom_tests.rs`).
#[cfg(loom)]
use ::loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

use super::state::Slots;

const ADMITTED: u32 = 0;
const REQUESTS: u32 = 7;
const WAITING: u32 = 21;
const ROOM_REQUESTS: u32 = 35;
const ROOM_WAITING: u32 = 49;
const OPEN: u64 = 1 << 63;

/// The largest holding and room of the lane; a larger room is taken as
/// this (past it, requests take the lock).
const FIELD_MAX: u64 = (1 << 14) - 1;
/// Admissions the lane makes before the state must hear of them.
const ADMITTED_MAX: u64 = (1 << 7) - 1;

const fn field(word: u64, shift: u32) -> u64 {
    (word >> shift) & FIELD_MAX
}

const fn mask(shift: u32) -> u64 {
    FIELD_MAX << shift
}

/// One admission: the count and one of each capacity.
const ONE_ADMISSION: u64 = (1 << ADMITTED) | (1 << REQUESTS) | (1 << WAITING);

/// The lane of one gate; see the module docs.
#[derive(Debug)]
pub(super) struct Lane {
    word: AtomicU64,
}

impl Lane {
    /// A closed lane that holds nothing.
    pub(super) fn new() -> Lane {
        Lane {
            word: AtomicU64::new(0),
        }
    }

    /// Admits a plain unranked request if the lane is open and has room
    /// for it; `false` sends it to the state.
    #[inline]
    pub(super) fn try_admit(&self) -> bool {
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            let admits = word & OPEN != 0
                && (word >> ADMITTED) & ADMITTED_MAX < ADMITTED_MAX
                && field(word, REQUESTS) < field(word, ROOM_REQUESTS)
                && field(word, WAITING) < field(word, ROOM_WAITING);
            if !admits {
                return false;
            }
            match self.word.compare_exchange_weak(
                word,
                word + ONE_ADMISSION,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    /// A grant of the lane gives back `released`. Returns whether the lane
    /// was closed: then the state must hear of it, under the lock, and
    /// pass the capacity on to the queue.
    #[inline]
    pub(super) fn give_back(&self, released: Slots) -> bool {
        let delta =
            ((released.requests as u64) << REQUESTS) | ((released.waiting as u64) << WAITING);
        if delta == 0 {
            return false;
        }
        self.word.fetch_sub(delta, Ordering::AcqRel) & OPEN == 0
    }

    /// Closes the lane, under the gate's lock: returns what it holds and
    /// how many requests it admitted since it was last closed, which the
    /// caller now counts.
    #[inline]
    pub(super) fn close(&self) -> (Slots, u64) {
        let mut word = self.word.load(Ordering::Acquire);
        if word & OPEN != 0 {
            // Open: admissions may race this; take the word as it is
            // closed. (Closed, only give-backs change it, which lower the
            // holdings and lock after: the loaded word is as good.)
            word = self
                .word
                .fetch_and(!(OPEN | (ADMITTED_MAX << ADMITTED)), Ordering::AcqRel);
        }
        let held = Slots {
            requests: field(word, REQUESTS) as usize,
            waiting: field(word, WAITING) as usize,
        };
        (held, (word >> ADMITTED) & ADMITTED_MAX)
    }

    /// Opens the closed lane with `room`, under the gate's lock.
    #[inline]
    pub(super) fn open(&self, room: Slots) {
        let clamp = |room: usize| (room as u64).min(FIELD_MAX);
        let rooms = (clamp(room.requests) << ROOM_REQUESTS) | (clamp(room.waiting) << ROOM_WAITING);
        let keep = mask(REQUESTS) | mask(WAITING) | (ADMITTED_MAX << ADMITTED);
        // Closed, only give-backs race this: swap until one does not.
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            match self.word.compare_exchange_weak(
                word,
                (word & keep) | rooms | OPEN,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => word = now,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn slots(requests: usize, waiting: usize) -> Slots {
        Slots { requests, waiting }
    }

    #[test]
    fn a_closed_lane_admits_nothing() {
        let lane = Lane::new();
        assert!(!lane.try_admit());
        lane.open(slots(1, 1));
        let _ = lane.close();
        assert!(!lane.try_admit());
    }

    #[test]
    fn an_open_lane_admits_up_to_its_rooms_and_no_further() {
        let lane = Lane::new();
        lane.open(slots(3, 2));
        assert!(lane.try_admit());
        assert!(lane.try_admit());
        assert!(!lane.try_admit(), "the waiting room is full");
        // A first token frees a waiting place; the request room still has one.
        assert!(!lane.give_back(slots(0, 1)));
        assert!(lane.try_admit());
        assert!(!lane.try_admit(), "the request room is full");
        assert_eq!(lane.close(), (slots(3, 2), 3));
    }

    #[test]
    fn closing_hands_over_the_admissions_once() {
        let lane = Lane::new();
        lane.open(slots(10, 10));
        assert!(lane.try_admit());
        assert_eq!(lane.close(), (slots(1, 1), 1));
        assert_eq!(lane.close(), (slots(1, 1), 0), "counted once");
        lane.open(slots(10, 10));
        assert_eq!(lane.close(), (slots(1, 1), 0));
    }

    #[test]
    fn a_give_back_says_whether_the_lane_was_closed() {
        let lane = Lane::new();
        lane.open(slots(10, 10));
        assert!(lane.try_admit() && lane.try_admit());
        assert!(!lane.give_back(slots(1, 1)), "open: nothing queued");
        let _ = lane.close();
        assert!(lane.give_back(slots(0, 1)), "closed: the state must hear");
        assert!(!lane.give_back(slots(0, 0)), "nothing given back");
        assert_eq!(lane.close(), (slots(1, 0), 0));
    }

    #[test]
    fn the_admission_count_stops_the_lane_before_it_carries() {
        let lane = Lane::new();
        lane.open(slots(usize::MAX, usize::MAX));
        let mut admitted = 0;
        while lane.try_admit() {
            assert!(!lane.give_back(slots(1, 1)));
            admitted += 1;
        }
        assert_eq!(admitted, ADMITTED_MAX);
        assert_eq!(lane.close(), (slots(0, 0), ADMITTED_MAX));
        lane.open(slots(usize::MAX, usize::MAX));
        assert!(lane.try_admit(), "the count starts again once handed over");
    }

    #[test]
    fn a_room_past_the_field_is_taken_as_the_field() {
        let lane = Lane::new();
        lane.open(slots(usize::MAX, usize::MAX));
        for _ in 0..FIELD_MAX {
            assert!(
                lane.try_admit() || {
                    // The admission count is full: hand it over and go on.
                    let _ = lane.close();
                    lane.open(slots(usize::MAX, usize::MAX));
                    lane.try_admit()
                }
            );
        }
        let (holding, _) = lane.close();
        assert_eq!(holding, slots(FIELD_MAX as usize, FIELD_MAX as usize));
        lane.open(slots(usize::MAX, usize::MAX));
        assert!(!lane.try_admit(), "the holdings are at the field's largest");
    }
}
