//! Time, queue-wait budgets and drain-rate prediction.
//!
//! The state never reads a clock and stores no present: time is an
//! argument. Every event that may read time takes `now: Option<Instant>`,
//! the time the driver read for it (`None` when the gate keeps no time),
//! and passes it down to whatever records or compares a time. A gate that
//! keeps no time (deadlines, aging and the adaptive limit off) treats any
//! `now` as `None` ([`State::gate_time`]), except that an arrival's own
//! time still starts the client's deadline.
//!
//! # Invariants
//!
//! * A request's budget is the smallest of the client's deadline, the
//!   queue wait limit and the first-token objective less the mean engine
//!   waiting time; a gate that keeps no time honours the client's deadline
//!   alone, from the arrival's own time.
//! * A bucket's drain interval is measured only between queue admissions
//!   while its queue is not empty (the mark is reset when the queue starts
//!   to fill), so an idle queue does not look slow.
//! * A prediction counts only the requests that would go before the
//!   arrival (its band and higher ones), and is `None` until a rate was
//!   measured: an arrival is never rejected on a guess.

use std::time::{Duration, Instant};

use super::State;
use super::buckets::Bucket;

/// A moving average that weighs the latest sample by a fifth.
pub(super) fn moving_average(average: Option<f64>, sample: f64) -> f64 {
    const WEIGHT: f64 = 0.2;
    match average {
        Some(average) => average + WEIGHT * (sample - average),
        None => sample,
    }
}

impl<T> State<T> {
    /// The time an event gives, as the gate's time: `None` for a gate
    /// that keeps no time (deadlines, aging and the adaptive limit off),
    /// whatever the driver read.
    #[inline]
    pub(super) fn gate_time(&self, now: Option<Instant>) -> Option<Instant> {
        now.filter(|_| self.keeps_time)
    }

    /// A request's queue wait budget, the smallest of the client's own
    /// deadline, the queue wait limit, and the time-to-first-token objective
    /// less the mean engine waiting time; and whether the client's deadline
    /// is the smallest. A gate that keeps no time honours the client's
    /// deadline alone, and only when the driver gave the arrival its time
    /// `at`.
    pub(super) fn budget(
        &self,
        deadline: Option<Duration>,
        at: Option<Instant>,
    ) -> Option<(Duration, bool)> {
        let mut budget = deadline.map(|deadline| (deadline, true));
        if !self.keeps_time {
            // Only the client's deadline, timed from this arrival.
            return budget.filter(|_| at.is_some());
        }
        let mut consider = |server: Duration| {
            if budget.is_none_or(|(smallest, _)| server < smallest) {
                budget = Some((server, false));
            }
        };
        if let Some(limit) = self.config.request_queue_wait_limit {
            consider(limit);
        }
        if let Some(objective) = self.config.ttft_objective {
            let waiting = Duration::from_secs_f64(self.mean_wait.unwrap_or(0.0));
            consider(objective.saturating_sub(waiting));
        }
        budget
    }

    /// When the worker should have room, for a worker-scoped rejection now:
    /// every queued request over the worker's drain rate (the sum of its
    /// queues' measured rates), in whole seconds rounded up, within `[1 s,
    /// max]`. `None` unless the estimate is on and some queue has drained
    /// at a measured rate.
    pub(super) fn drain_estimate(&self) -> Option<Duration> {
        let max = self.config.retry_after_from_drain_rate?;
        let rate: f64 = std::iter::once(&self.buckets.unranked)
            .chain(self.active_buckets())
            .filter_map(|bucket| bucket.drain_interval)
            .filter(|interval| *interval > 0.0)
            .map(|interval| 1.0 / interval)
            .sum();
        if !(rate > 0.0 && rate.is_finite()) {
            return None;
        }
        let seconds = (self.total.queued as f64 / rate).ceil();
        let max = max.as_secs().max(1);
        // `as` saturates: a huge estimate is the maximum.
        Some(Duration::from_secs((seconds as u64).clamp(1, max)))
    }
}

impl Bucket {
    /// How long a request joining this bucket's queue at `rung` now would
    /// wait: the requests ahead of it (those of its band and higher ones;
    /// lower bands wait behind it) and itself, at the rate the queue has
    /// drained. `None` before a rate has been measured.
    pub(super) fn predicted_wait(&self, rung: i64) -> Option<Duration> {
        let interval = self.drain_interval?;
        let ahead = self.queue.at_or_above(rung) as f64;
        Some(Duration::from_secs_f64((ahead + 1.0) * interval))
    }

    /// A request was admitted from the queue at `now`: the interval since
    /// the last mark is a sample of the drain rate, and `now` the next mark.
    pub(super) fn drained_at(&mut self, now: Instant) {
        if let Some(mark) = self.drain_mark {
            let interval = now.saturating_duration_since(mark).as_secs_f64();
            self.drain_interval = Some(moving_average(self.drain_interval, interval));
        }
        self.drain_mark = Some(now);
    }
}
