//! Controlled delay (CoDel) for the request queues: bursts in, standing
//! queues out (opt-in, [`AdmissionConfig::queue_delay_target`](crate::AdmissionConfig::queue_delay_target)).
//!
//! A queue exists to absorb bursts. A queue that stands — whose requests
//! all wait longer than they should, event after event — only adds delay:
//! the engine is busy either way, and every admitted request starts later.
//! CoDel (Nichols and Jacobson, 2012) tells the two apart by the *minimum*
//! wait over an interval: a burst drains, and its last requests wait
//! little; a standing queue never does. Applied to request queues (as RPC
//! servers do), the queue's old requests are answered as overload instead
//! of being admitted late.
//!
//! # The rule, per queue (each rank's, and the unranked one)
//!
//! With `target` and `interval` (default 100 ms), at each of the gate's
//! events, at time `now`, with the queue's oldest request queued at
//! `oldest`:
//!
//! * An empty queue, or one whose oldest request has waited at most
//!   `target`, is *below*: nothing is shed, and the queue is not above.
//! * Otherwise the queue is *above* since `oldest + target`, the moment
//!   its oldest request's wait passed the target, unless it was above
//!   already (then since then). Every request served from it meanwhile
//!   was queued before the oldest one, so it waited longer than `target`
//!   too: the minimum wait since then is above the target.
//! * Once a queue has been above for `interval`, it *sheds*: every request
//!   older than `target` leaves it, rejected (worker scope, reason
//!   `queue_delay`). It keeps shedding, at each event, until the standing
//!   queue has drained: until it has stayed empty for a whole `interval`
//!   (a queue that empties for a moment under a sustained overload still
//!   stands, and one whose requests are young only because the old ones
//!   were shed has not drained).
//!
//! So a burst that the queue absorbs within `target + interval` is never
//! shed (its oldest request never waits that long), and a sustained
//! overload keeps the wait of admitted requests near `target`: once
//! shedding, no request older than `target` is left to be admitted at the
//! next event.
//!
//! # Invariants
//!
//! * [`Codel`] is sans-IO: the time and the oldest request's arrival are
//!   arguments; it never reads a clock and knows nothing of the queue.
//! * Nothing is shed without a target, or by a gate that keeps no time.
//! * Shedding only removes queued requests: it never revokes admitted
//!   work, and the capacity they did not hold stays where it is (the
//!   driver wakes the shed requests' waiters as it does displaced ones).

use std::time::{Duration, Instant};

use super::{BucketKey, State};
use crate::gate::types::RejectionReason;

/// The settings of controlled delay, when it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) target: Duration,
    pub(crate) interval: Duration,
}

/// Controlled delay's state for one queue.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Codel {
    /// Since when every request the queue served or holds has waited longer
    /// than the target; `None` while below.
    above_since: Option<Instant>,
    /// While shedding: since when the queue has been empty; `None` while
    /// it holds requests.
    below_since: Option<Instant>,
    /// Whether the queue is shedding requests older than the target.
    shedding: bool,
}

impl Codel {
    /// Looks at the queue at `now`, its oldest request queued at `oldest`
    /// (`None`: the queue is empty). Returns whether its requests older
    /// than the target are to be shed now.
    pub(crate) fn check(
        &mut self,
        settings: Settings,
        now: Instant,
        oldest: Option<Instant>,
    ) -> bool {
        if self.shedding {
            // The standing queue has drained once the queue stayed empty
            // for a whole interval: one that empties for a moment under a
            // sustained overload still stands.
            let Some(oldest) = oldest else {
                let since = *self.below_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= settings.interval {
                    *self = Codel::default();
                }
                return false;
            };
            self.below_since = None;
            return now.saturating_duration_since(oldest) > settings.target;
        }
        let Some(oldest) =
            oldest.filter(|&oldest| now.saturating_duration_since(oldest) > settings.target)
        else {
            self.above_since = None;
            return false;
        };
        let since = *self.above_since.get_or_insert(oldest + settings.target);
        if now.saturating_duration_since(since) >= settings.interval {
            self.shedding = true;
        }
        self.shedding
    }

    /// Whether the queue is shedding.
    #[cfg(test)]
    pub(crate) fn is_shedding(&self) -> bool {
        self.shedding
    }
}

impl<T> State<T> {
    /// Applies controlled delay to every queue at the time of the event
    /// being applied: a queue that has stood above the target for an
    /// interval sheds its requests older than the target. Their waiters
    /// hear of it when the driver drains, as displaced ones do. Does
    /// nothing unless a target is set and the gate keeps time.
    #[inline]
    pub(super) fn control_delay(&mut self, now: Option<Instant>) {
        if let Some(settings) = self.codel {
            // An empty queue that sheds must still be watched, to see it
            // stay below for an interval.
            if self.total.queued > 0 || self.codel_shedding {
                self.control_delay_slow(settings, now);
            }
        }
    }

    fn control_delay_slow(&mut self, settings: Settings, now: Option<Instant>) {
        let Some(now) = now else {
            return;
        };
        let mut shedding = false;
        for index in 0..=self.recognised_ranks() {
            let key = match index {
                0 => BucketKey::Unranked,
                rank => BucketKey::Rank(rank as u32 - 1),
            };
            let oldest = self.oldest_queued_at(key);
            let shed = self.bucket_mut(key).codel.check(settings, now, oldest);
            shedding |= self.bucket(key).codel.shedding;
            if !shed {
                continue;
            }
            while let Some(slot) = self.bucket(key).queue.oldest(&self.entries) {
                let queued_at = self.entries[slot].node.queued_at;
                if queued_at.is_none_or(|at| now.saturating_duration_since(at) <= settings.target) {
                    break;
                }
                self.shed(key, slot);
            }
        }
        self.codel_shedding = shedding;
        // A head that left uncovers the next, which may fit: the caller
        // (`dequeue`) offers capacity next.
    }

    /// When the oldest request of `key`'s queue was queued; `None` when
    /// the queue is empty (or the gate kept no time when it was queued).
    fn oldest_queued_at(&self, key: BucketKey) -> Option<Instant> {
        let bucket = self.bucket(key);
        let slot = bucket.queue.oldest(&self.entries)?;
        self.entries[slot].node.queued_at
    }

    /// Takes the queued request at `slot` out of `key`'s queue and rejects
    /// it for its queue delay; its waiter hears of it when the driver
    /// drains.
    fn shed(&mut self, key: BucketKey, slot: usize) {
        debug_assert_eq!(self.entries[slot].bucket, key);
        self.turn_away(slot, RejectionReason::QueueDelay);
        self.shed = true;
    }
}

#[cfg(test)]
mod tests {
    //! Controlled delay driven through the state machine by a small
    //! discrete-event simulation: an engine of `slots` slots, each request
    //! holding one for `service`, arrivals at given times.

    use std::cmp::Reverse;
    use std::collections::{BinaryHeap, HashMap};

    use proptest::prelude::*;

    use super::super::{Arrival, Demand, Grant, Polled, State, Ticket};
    use super::*;
    use crate::config::AdmissionConfig;

    const TARGET: Duration = Duration::from_millis(50);
    const INTERVAL: Duration = Duration::from_millis(100);

    /// What became of one request.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Fate {
        Admitted { waited: Duration },
        Shed { waited: Duration },
        Rejected,
    }

    /// Runs `arrivals` (offsets from the start) through a gate of `slots`
    /// engine slots, a queue of `queue`, controlled delay at `TARGET` and
    /// `INTERVAL`, each admitted request finishing `service` after its
    /// admission. Returns each request's fate, in arrival order.
    fn run(arrivals: &[Duration], slots: usize, queue: usize, service: Duration) -> Vec<Fate> {
        let config = AdmissionConfig::new()
            .engine_request_limit(slots)
            .engine_request_waiting_limit(slots)
            .request_queue_limit(queue)
            .queue_delay_target(TARGET)
            .queue_delay_interval(INTERVAL);
        let mut state: State<usize> = State::new(config);
        let start = Instant::now();
        let mut fates = vec![Fate::Rejected; arrivals.len()];
        // (time, 0 = finish before 1 = arrival, request)
        let mut events: BinaryHeap<Reverse<(Duration, u8, usize)>> = arrivals
            .iter()
            .enumerate()
            .map(|(index, &at)| Reverse((at, 1, index)))
            .collect();
        let mut tickets: HashMap<usize, Ticket> = HashMap::new();
        let mut grants: HashMap<usize, Grant> = HashMap::new();
        while let Some(Reverse((at, kind, index))) = events.pop() {
            let now = start + at;
            let now = Some(now);
            if kind == 1 {
                match state.arrive(None, Demand::default(), None, index, now) {
                    Arrival::Admitted(grant) => {
                        fates[index] = Fate::Admitted {
                            waited: Duration::ZERO,
                        };
                        grants.insert(index, grant);
                        events.push(Reverse((at + service, 0, index)));
                    }
                    Arrival::Queued(ticket, _) => {
                        tickets.insert(index, ticket);
                    }
                    Arrival::Rejected(_) => fates[index] = Fate::Rejected,
                }
            } else {
                let mut grant = grants
                    .remove(&index)
                    .expect("a finish of an admitted request");
                state.finish(&mut grant, now);
            }
            let mut decided = Vec::new();
            state.drain_offered(|_, &mut index| decided.push(index));
            for index in decided {
                let ticket = tickets.remove(&index).expect("a queued request");
                let waited = at - arrivals[index];
                match state.poll(ticket) {
                    Polled::Admitted(grant, _) => {
                        fates[index] = Fate::Admitted { waited };
                        grants.insert(index, grant);
                        events.push(Reverse((at + service, 0, index)));
                    }
                    Polled::Rejected(overloaded, _) => {
                        assert_eq!(overloaded.reason(), RejectionReason::QueueDelay);
                        assert_eq!(overloaded.scope(), crate::RejectionScope::Worker);
                        fates[index] = Fate::Shed { waited };
                    }
                    other => panic!("an offer or a rejection, not {other:?}"),
                }
            }
        }
        assert!(tickets.is_empty(), "every queued request was decided");
        fates
    }

    #[test]
    fn the_rule_sheds_only_after_a_whole_interval_above_the_target() {
        let settings = Settings {
            target: TARGET,
            interval: INTERVAL,
        };
        let start = Instant::now();
        let ms = |n: u64| start + Duration::from_millis(n);
        let mut codel = Codel::default();
        // The oldest request, queued at 0, passes the target at 50 ms.
        assert!(!codel.check(settings, ms(10), Some(ms(0))));
        assert!(!codel.check(settings, ms(60), Some(ms(0))));
        assert!(!codel.check(settings, ms(149), Some(ms(0))));
        assert!(codel.check(settings, ms(150), Some(ms(0))));
        // It sheds while above, and until the queue has stayed empty for a
        // whole interval, however briefly it empties.
        assert!(codel.check(settings, ms(151), Some(ms(100))));
        assert!(!codel.check(settings, ms(152), None));
        assert!(codel.is_shedding());
        assert!(codel.check(settings, ms(200), Some(ms(140))));
        assert!(!codel.check(settings, ms(210), Some(ms(200))));
        assert!(!codel.check(settings, ms(220), None));
        assert!(!codel.check(settings, ms(319), None));
        assert!(codel.is_shedding());
        assert!(!codel.check(settings, ms(320), None));
        assert!(!codel.is_shedding());
        // Drained: the next standing queue waits a whole interval again.
        assert!(!codel.check(settings, ms(400), Some(ms(300))));
        assert!(!codel.check(settings, ms(449), Some(ms(300))));
        assert!(codel.check(settings, ms(450), Some(ms(300))));
    }

    #[test]
    fn without_a_target_nothing_is_shed() {
        let config = AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(10)
            .request_queue_wait_limit(Duration::from_secs(60));
        let mut state: State<usize> = State::new(config);
        let start = Instant::now();
        let now = Some(start);
        let Arrival::Admitted(mut grant) = state.arrive(None, Demand::default(), None, 0, now)
        else {
            panic!("admitted");
        };
        let queued: Vec<Ticket> = (1..5)
            .map(
                |id| match state.arrive(None, Demand::default(), None, id, now) {
                    Arrival::Queued(ticket, _) => ticket,
                    other => panic!("queued, not {other:?}"),
                },
            )
            .collect();
        let now = Some(start + Duration::from_secs(30));
        state.finish(&mut grant, now);
        let mut offered = Vec::new();
        state.drain_offered(|_, &mut id| offered.push(id));
        assert_eq!(offered, [1], "the oldest is admitted, nothing shed");
        assert!(matches!(state.poll(queued[0]), Polled::Admitted(..)));
        assert_eq!(state.view().tally().shed_worker, 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// A burst the queue absorbs within `TARGET + INTERVAL` is never
        /// shed: every request of it is admitted.
        #[test]
        fn a_burst_shorter_than_the_interval_is_never_shed(
            slots in 1usize..8,
            service_ms in 1u64..60,
            offsets in proptest::collection::vec(0u64..100, 1..64),
        ) {
            let service = Duration::from_millis(service_ms);
            let n = offsets.len();
            // Request j waits at most floor(j / slots) services.
            let waves = n.div_ceil(slots) as u32;
            prop_assume!(service * waves.saturating_sub(1) < TARGET + INTERVAL);
            let mut arrivals: Vec<Duration> =
                offsets.iter().map(|&ms| Duration::from_millis(ms)).collect();
            arrivals.sort();
            let fates = run(&arrivals, slots, 1000, service);
            for fate in &fates {
                prop_assert!(matches!(fate, Fate::Admitted { .. }), "{fates:?}");
            }
        }

        /// Under a sustained overload (1.5× to 8× the engine), once the
        /// first interval has passed the admitted requests wait about the
        /// target and no longer; the engine stays busy, and the rest is
        /// shed.
        #[test]
        fn a_sustained_overload_keeps_the_queue_wait_near_the_target(
            slots in 1usize..8,
            service_ms in 20u64..200,
            overload in 1.5f64..8.0,
        ) {
            let service = Duration::from_millis(service_ms);
            let gap = service.div_f64(slots as f64 * overload);
            let run_for = Duration::from_secs(5);
            let arrivals: Vec<Duration> = (0u32..)
                .map(|i| gap * i)
                .take_while(|at| *at < run_for)
                .collect();
            let fates = run(&arrivals, slots, 100_000, service);
            // Shedding starts once the queue has stood above the target
            // for an interval, and under a mild overload the queue takes a
            // while to build that wait: from the first shed on (not from
            // `TARGET + INTERVAL`), every admission waited about the target.
            let first_shed = fates
                .iter()
                .zip(&arrivals)
                .filter_map(|(fate, &at)| match *fate {
                    Fate::Shed { waited } => Some(at + waited),
                    _ => None,
                })
                .min();
            let mut admitted = 0usize;
            let mut shed = 0usize;
            for (fate, &at) in fates.iter().zip(&arrivals) {
                match *fate {
                    Fate::Admitted { waited } => {
                        admitted += 1;
                        if first_shed.is_some_and(|first| at + waited >= first) {
                            // An event comes at least every gap.
                            prop_assert!(
                                waited <= TARGET + gap,
                                "admitted at {:?}, shedding since {first_shed:?}, waited {waited:?}",
                                at + waited
                            );
                        }
                    }
                    Fate::Shed { waited } => {
                        shed += 1;
                        prop_assert!(waited > TARGET);
                    }
                    Fate::Rejected => prop_assert!(false, "the queue never fills"),
                }
            }
            prop_assert!(shed > 0);
            // The engine never idles for want of queued work, when the
            // target holds a few arrivals (with arrivals further apart
            // than the target, a queue held to it is mostly empty: the
            // price of the target, not of the rule).
            if gap * 3 <= TARGET {
                let capacity = run_for.as_secs_f64() / service.as_secs_f64() * slots as f64;
                prop_assert!(admitted as f64 >= 0.95 * (capacity - slots as f64), "{admitted} of {capacity}");
            }
        }
    }
}
