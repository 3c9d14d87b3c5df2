//! Saturation: one number for how full a rank, or the whole worker, is —
//! demand over what the gate can hold, in the engine and in its queue.
//!
//! For counts `c` against limits `L` (a rank's own, or the worker's
//! combined: `ranks ×` each per-rank limit):
//!
//! ```text
//! engine fill  e = max(c.engine_requests / L.engine_request_limit,
//!                      c.engine_waiting  / L.engine_request_waiting_limit,
//!                      token counts / token limits, where set)      ≤ 1
//! queue fill   q = max(c.queued / L.request_queue_limit,
//!                      c.queued_tokens / L.request_queue_token_limit) ≤ 1
//! saturation     = (e × E + q × Q) / (E + Q)
//!                  with E = L.engine_request_limit, Q = L.request_queue_limit
//! ```
//!
//! It is 0 when idle, `E / (E + Q)` when the engine is full and nothing
//! waits, and 1 when the engine and the queue are both full: the next
//! request would be rejected. A rank's saturation is the larger of its own
//! and the worker's, since a ranked request needs room in both; the
//! worker's (and the unranked requests', which draw on the combined
//! capacity) is the combined counts over the combined limits.
//!
//! # Invariants
//!
//! * The value is in `[0, 1]` whatever the counts (counts above a limit
//!   that shrank count as full).
//! * It is computed from counts and limits alone, under the gate's lock:
//!   observers get it as a plain value.

use super::State;
use super::buckets::BucketKey;
use crate::config::Limits;
use crate::gate::types::Counts;

/// The saturation of `counts` against `limits` scaled by `ranks`.
fn fill(counts: &Counts, limits: &Limits, ranks: usize) -> f64 {
    let ratio = |count: usize, limit: usize| -> f64 {
        let limit = limit.saturating_mul(ranks);
        if limit == 0 {
            return 0.0;
        }
        (count as f64 / limit as f64).min(1.0)
    };
    let tokens =
        |count: usize, limit: Option<usize>| limit.map_or(0.0, |limit| ratio(count, limit));
    let engine = ratio(counts.engine_requests, limits.engine_request_limit)
        .max(ratio(
            counts.engine_waiting,
            limits.engine_request_waiting_limit,
        ))
        .max(tokens(counts.engine_tokens, limits.engine_token_limit))
        .max(tokens(
            counts.engine_waiting_tokens,
            limits.engine_waiting_token_limit,
        ));
    let queue = ratio(counts.queued, limits.request_queue_limit).max(tokens(
        counts.queued_tokens,
        limits.request_queue_token_limit,
    ));
    let engine_room = limits.engine_request_limit.saturating_mul(ranks) as f64;
    let queue_room = limits.request_queue_limit.saturating_mul(ranks) as f64;
    let room = engine_room + queue_room;
    if room <= 0.0 {
        return 0.0;
    }
    ((engine * engine_room + queue * queue_room) / room).clamp(0.0, 1.0)
}

impl<T> State<T> {
    /// The saturation of `rank` (see the module docs); `None`, or a rank
    /// the gate does not recognise: the whole worker's.
    pub(crate) fn saturation(&self, rank: Option<u32>) -> f64 {
        let ranks = self.recognised_ranks().max(1);
        let worker = fill(&self.total, &self.limits, ranks);
        match self.recognise(rank) {
            BucketKey::Unranked => worker,
            key => fill(&self.bucket(key).counts, &self.limits, 1).max(worker),
        }
    }

    /// [`saturation`](Self::saturation) for observers: 0 unless the
    /// saturation gauge is recorded (its only reader), so that an event's
    /// observation does not compute a number nobody reads.
    #[inline]
    pub(crate) fn observed_saturation(&self, rank: Option<u32>) -> f64 {
        match self.config.explicit_saturation_metric() {
            true => self.saturation(rank),
            false => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(requests: usize, waiting: usize, queue: usize) -> Limits {
        Limits {
            engine_request_limit: requests,
            engine_request_waiting_limit: waiting,
            request_queue_limit: queue,
            engine_waiting_token_limit: None,
            engine_token_limit: None,
            request_queue_token_limit: None,
        }
    }

    #[test]
    fn zero_when_idle_one_when_engine_and_queue_are_full() {
        let limits = limits(4, 4, 4);
        assert_eq!(fill(&Counts::new(0, 0, 0), &limits, 1), 0.0);
        assert_eq!(fill(&Counts::new(4, 4, 0), &limits, 1), 0.5);
        assert_eq!(fill(&Counts::new(4, 0, 2), &limits, 1), 0.75);
        assert_eq!(fill(&Counts::new(4, 4, 4), &limits, 1), 1.0);
        // Counts above a limit that shrank count as full.
        assert_eq!(fill(&Counts::new(9, 9, 9), &limits, 1), 1.0);
        // The binding engine limit decides the engine's fill.
        assert_eq!(
            fill(&Counts::new(1, 1, 0), &super::tests::limits(4, 1, 4), 1),
            0.5
        );
        // No queue: a full engine is saturation 1.
        assert_eq!(
            fill(&Counts::new(4, 4, 0), &super::tests::limits(4, 4, 0), 1),
            1.0
        );
        // Combined capacity: two ranks.
        assert_eq!(fill(&Counts::new(4, 4, 0), &limits, 2), 0.25);
    }
}
