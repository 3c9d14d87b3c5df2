//! The adaptive engine request waiting limit: a latency-gradient
//! controller that moves the per-rank waiting limit between a floor and a
//! ceiling by the engine waiting times the gate measures. The algorithm,
//! its parameters and their defaults are documented on
//! [`AdaptiveWaitingLimit`].
//!
//! Sans-IO: the controller reads no clock. Each measured waiting time
//! comes with its admission time and the time it ended
//! ([`Adaptive::sample`]), and whether the limit bound is told by
//! [`Adaptive::bound`]; the state calls both from its events, and the
//! driver (the [`Gate`](crate::Gate)) gives the state the time of each
//! event.
//!
//! # Invariants
//!
//! * The limit in force ([`Adaptive::limit`]) is always within `[floor,
//!   ceiling]`; the ceiling is never below the floor.
//! * The controller only sets a number: it never revokes admitted work.
//!   After it shrinks, the waiting count may exceed the limit until it
//!   drains, as after a capacity report.
//! * The limit grows only at the end of an interval in which it bound; an
//!   idle gate measures nothing, so its limit does not move.
//! * A probe's baseline counts only requests admitted during the probe,
//!   when the limit was the floor.

use std::time::Instant;

use crate::config::AdaptiveWaitingLimit;

/// The controller of one gate's adaptive waiting limit.
#[derive(Debug, Clone)]
pub(crate) struct Adaptive {
    params: AdaptiveWaitingLimit,
    ceiling: usize,
    /// The estimate, in `[floor, ceiling]`; the limit in force rounds it.
    estimate: f64,
    /// Mean waiting time at the floor, seconds; `None` before the first
    /// probe ended.
    baseline: Option<f64>,
    /// The interval being measured.
    window: Window,
    /// The probe under way, if one is.
    probe: Option<Probe>,
    /// When the next probe starts.
    next_probe: Option<Instant>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Window {
    start: Option<Instant>,
    waited: f64,
    samples: u32,
    bound: bool,
}

#[derive(Debug, Clone, Copy)]
struct Probe {
    started: Instant,
    waited: f64,
    samples: usize,
}

impl Adaptive {
    /// A controller at its floor, with the waiting limit the configuration
    /// or the engine gives (`limit`) as its ceiling unless one is set.
    pub(crate) fn new(params: AdaptiveWaitingLimit, limit: usize) -> Self {
        Adaptive {
            params,
            ceiling: params.ceiling_for(limit),
            estimate: params.floor as f64,
            baseline: None,
            window: Window::default(),
            probe: None,
            next_probe: None,
        }
    }

    /// The limit per rank in force now.
    pub(crate) fn limit(&self) -> usize {
        if self.probe.is_some() {
            return self.params.floor;
        }
        (self.estimate.floor() as usize).clamp(self.params.floor, self.ceiling)
    }

    /// The floor and the ceiling in force.
    pub(crate) fn bounds(&self) -> (usize, usize) {
        (self.params.floor, self.ceiling)
    }

    /// The configured or reported waiting limit changed to `limit`: the
    /// ceiling follows it (unless one is set), and the estimate stays below
    /// it.
    pub(crate) fn set_limit(&mut self, limit: usize) {
        self.ceiling = self.params.ceiling_for(limit);
        self.estimate = self.estimate.min(self.ceiling as f64);
    }

    /// An admission filled the waiting limit: it bound in this interval.
    pub(crate) fn bound(&mut self) {
        self.window.bound = true;
    }

    /// A request admitted at `admitted_at` stopped waiting (its first
    /// token, or its end) at `now`. Returns whether the limit in force
    /// changed.
    pub(crate) fn sample(&mut self, admitted_at: Instant, now: Instant) -> bool {
        let before = self.limit();
        let waited = now.saturating_duration_since(admitted_at).as_secs_f64();
        if let Some(probe) = &mut self.probe {
            if admitted_at >= probe.started {
                probe.waited += waited;
                probe.samples += 1;
            }
            if probe.samples >= self.params.probe_samples {
                self.baseline = Some(probe.waited / probe.samples as f64);
                self.probe = None;
                self.next_probe = now.checked_add(self.params.probe_interval);
                self.window = Window {
                    start: Some(now),
                    ..Window::default()
                };
            }
            return self.limit() != before;
        }
        if self.baseline.is_none() || self.next_probe.is_some_and(|at| now >= at) {
            self.probe = Some(Probe {
                started: now,
                waited: 0.0,
                samples: 0,
            });
            return self.limit() != before;
        }
        let window = &mut self.window;
        let start = *window.start.get_or_insert(now);
        window.waited += waited;
        window.samples += 1;
        if now.saturating_duration_since(start) >= self.params.interval {
            let short = window.waited / f64::from(window.samples);
            let bound = window.bound;
            self.window = Window {
                start: Some(now),
                ..Window::default()
            };
            self.step(short, bound);
        }
        self.limit() != before
    }

    /// Ends an interval whose mean waiting time was `short` seconds.
    fn step(&mut self, short: f64, bound: bool) {
        let Some(baseline) = self.baseline else {
            return;
        };
        // An engine that got faster is believed at once.
        let baseline = baseline.min(short);
        self.baseline = Some(baseline);
        let gradient = if short > 0.0 {
            (self.params.tolerance * baseline / short).clamp(0.5, 1.0)
        } else {
            1.0
        };
        let target = if gradient < 1.0 {
            self.estimate * gradient
        } else if bound {
            self.estimate + self.estimate.sqrt()
        } else {
            return;
        };
        let moved = self.estimate + self.params.smoothing * (target - self.estimate);
        self.estimate = moved.clamp(self.params.floor as f64, self.ceiling as f64);
    }

    /// The estimate and baseline, for the sim's traces and tests.
    #[cfg(test)]
    pub(crate) fn estimate(&self) -> (f64, Option<f64>) {
        (self.estimate, self.baseline)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn params() -> AdaptiveWaitingLimit {
        AdaptiveWaitingLimit::default()
    }

    fn assert_baseline(adaptive: &Adaptive, seconds: f64) {
        let (_, baseline) = adaptive.estimate();
        let baseline = baseline.expect("a baseline was measured");
        assert!(
            (baseline - seconds).abs() < 1e-9,
            "baseline {baseline} s, not {seconds} s"
        );
    }

    /// Feeds `n` samples of `wait`, one every `every`, starting at `at`,
    /// the limit bound before each; returns the time after the last.
    fn feed(
        adaptive: &mut Adaptive,
        mut at: Instant,
        n: usize,
        wait: Duration,
        every: Duration,
        bound: bool,
    ) -> Instant {
        for _ in 0..n {
            at += every;
            if bound {
                adaptive.bound();
            }
            adaptive.sample(at - wait, at);
        }
        at
    }

    #[test]
    fn it_starts_at_the_floor_and_probes_the_baseline_first() {
        let mut adaptive = Adaptive::new(params(), 256);
        assert_eq!(adaptive.limit(), 1);
        feed(&mut adaptive, Instant::now(), 6, ms(20), ms(20), true);
        assert_baseline(&adaptive, 0.02);
    }

    #[test]
    fn it_grows_while_waits_stay_near_the_baseline_and_the_limit_binds() {
        let mut adaptive = Adaptive::new(params(), 256);
        let at = feed(&mut adaptive, Instant::now(), 10, ms(20), ms(10), true);
        assert_eq!(adaptive.limit(), 1);
        feed(&mut adaptive, at, 500, ms(20), ms(10), true);
        assert!(adaptive.limit() > 8, "{}", adaptive.limit());
    }

    #[test]
    fn it_does_not_grow_when_the_limit_does_not_bind() {
        let mut adaptive = Adaptive::new(params(), 256);
        let at = feed(&mut adaptive, Instant::now(), 10, ms(20), ms(10), true);
        feed(&mut adaptive, at, 500, ms(20), ms(10), false);
        assert_eq!(adaptive.limit(), 1);
    }

    #[test]
    fn it_shrinks_when_waits_rise_and_grows_back_when_they_fall() {
        let mut adaptive = Adaptive::new(params(), 256);
        let at = feed(&mut adaptive, Instant::now(), 600, ms(20), ms(10), true);
        let grown = adaptive.limit();
        assert!(grown > 8, "{grown}");
        // Waits triple, well before the next probe: the limit shrinks.
        let at = feed(&mut adaptive, at, 100, ms(60), ms(10), true);
        let shrunk = adaptive.limit();
        assert!(shrunk < grown / 2, "{shrunk} vs {grown}");
        // Fast again: it grows back.
        feed(&mut adaptive, at, 300, ms(20), ms(10), true);
        assert!(adaptive.limit() > shrunk, "{}", adaptive.limit());
    }

    /// The engine changes speed: bound samples every 10 ms, 50 waits of
    /// `before`, then `n` of `after`.
    fn speed_change(
        params: AdaptiveWaitingLimit,
        before: Duration,
        n: usize,
        after: Duration,
    ) -> Adaptive {
        let mut adaptive = Adaptive::new(params, 256);
        let at = feed(&mut adaptive, Instant::now(), 50, before, ms(10), true);
        feed(&mut adaptive, at, n, after, ms(10), true);
        adaptive
    }

    #[test]
    fn a_slower_engine_raises_the_baseline_at_the_next_probe() {
        let params = params().probe_interval(Duration::from_secs(1));
        // Three seconds of slower waits: past the next probe.
        assert_baseline(&speed_change(params, ms(20), 300, ms(40)), 0.04);
    }

    #[test]
    fn a_faster_engine_lowers_the_baseline_at_once() {
        assert_baseline(&speed_change(params(), ms(40), 30, ms(10)), 0.01);
    }

    #[test]
    fn a_lower_reported_limit_lowers_the_ceiling() {
        let mut adaptive = Adaptive::new(params(), 256);
        feed(&mut adaptive, Instant::now(), 2000, ms(20), ms(10), true);
        assert!(adaptive.limit() > 16);
        adaptive.set_limit(16);
        assert_eq!(adaptive.limit(), 16);
        assert_eq!(adaptive.bounds(), (1, 16));
    }

    proptest! {
        /// Whatever the waiting times, the limit in force stays within
        /// [floor, ceiling], also while the ceiling changes.
        #[test]
        fn the_limit_never_leaves_its_bounds(
            floor in 1usize..8,
            ceiling in 1usize..64,
            events in proptest::collection::vec((0u64..200, 0u64..50, any::<bool>(), 0usize..80), 1..400),
        ) {
            let params = params().floor(floor).probe_interval(Duration::from_millis(500));
            let mut adaptive = Adaptive::new(params, ceiling);
            let mut at = Instant::now();
            for (wait_ms, gap_ms, bound, new_limit) in events {
                at += Duration::from_millis(gap_ms);
                if bound {
                    adaptive.bound();
                }
                if new_limit > 70 {
                    adaptive.set_limit(new_limit - 70);
                }
                adaptive.sample(at.checked_sub(Duration::from_millis(wait_ms)).unwrap_or(at), at);
                let (lo, hi) = adaptive.bounds();
                prop_assert!(lo <= hi);
                prop_assert!(adaptive.limit() >= lo && adaptive.limit() <= hi);
            }
        }
    }
}
