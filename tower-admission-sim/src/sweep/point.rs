//! What a sweep reports: one [`Point`] per system and offered load, with
//! its prompt-length [`Class`]es, and the whole [`Sweep`].

use std::time::Duration;

use super::super::measure::Percentile;
use super::{Calibration, System};

/// The outcome of one system at one offered load. Counts are over the
/// requests that arrived in the measurement window.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The system measured.
    pub system: System,
    /// Offered load as a multiple of the engine's capacity.
    pub load: f64,
    /// Offered load, requests per second (first sends only).
    pub offered: f64,
    /// Requests that arrived in the window.
    pub arrived: usize,
    /// Sends of those requests, retries included.
    pub sends: usize,
    /// Of those requests, rejected for good (after any retries).
    pub rejected: usize,
    /// Of those, given up by their client (cancelled).
    pub abandoned: usize,
    /// Of those, completed before the run ended.
    pub completed: usize,
    /// Of those, completed within both objectives.
    pub good: usize,
    /// Good requests per second of window.
    pub goodput: f64,
    /// Goodput as a fraction of the engine's capacity.
    pub capacity_fraction: f64,
    /// Median time to first token (from the first send) of the requests
    /// that were admitted and not given up.
    pub ttft_p50: Option<Percentile>,
    /// 99th percentile of the same.
    pub ttft_p99: Option<Percentile>,
    /// Median time per output token of the completed requests.
    pub tpot_p50: Option<Duration>,
    /// 99th percentile of the same.
    pub tpot_p99: Option<Duration>,
    /// Preemptions in the engine over the whole run.
    pub preemptions: u64,
    /// Requests cancelled inside the engine over the whole run: work the
    /// engine queued or started for clients that left.
    pub engine_cancelled: u64,
    /// The longest the engine's own waiting queue got over the run (sampled
    /// at each arrival): where the excess load waits without admission
    /// control.
    pub engine_queue_peak: usize,
    /// Simulated length of the run.
    pub simulated: Duration,
    /// The requests with prompts shorter than
    /// [`SweepConfig::long_prompt_tokens`](super::SweepConfig::long_prompt_tokens).
    pub short: Class,
    /// The requests with prompts of [`SweepConfig::long_prompt_tokens`](super::SweepConfig::long_prompt_tokens) or
    /// more.
    pub long: Class,
}

/// The requests of one prompt-length class at a [`Point`]: arrivals in the
/// window, their goodput and the time to first token of the admitted ones.
#[derive(Debug, Clone, PartialEq)]
pub struct Class {
    /// Requests of the class that arrived in the window.
    pub arrived: usize,
    /// Of those, rejected for good.
    pub rejected: usize,
    /// Of those, completed within both objectives.
    pub good: usize,
    /// Good requests of the class per second of window.
    pub goodput: f64,
    /// Median time to first token of the admitted requests of the class
    /// (not given up).
    pub ttft_p50: Option<Percentile>,
    /// 99th percentile of the same.
    pub ttft_p99: Option<Percentile>,
}

impl Point {
    /// Requests rejected for good, as a fraction of arrivals.
    pub fn rejection_rate(&self) -> f64 {
        ratio(self.rejected, self.arrived)
    }

    /// Sends per request: 1 without retries.
    pub fn sends_per_request(&self) -> f64 {
        ratio(self.sends, self.arrived)
    }

    /// Requests given up by their clients, as a fraction of arrivals.
    pub fn abandon_rate(&self) -> f64 {
        ratio(self.abandoned, self.arrived)
    }
}

fn ratio(n: usize, of: usize) -> f64 {
    if of == 0 { 0.0 } else { n as f64 / of as f64 }
}

/// The result of a sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    /// The engine's measured capacity, requests per second, and the
    /// Little's-law sizes.
    pub calibration: Calibration,
    /// Every point, system by system, load by load, in configuration order.
    pub points: Vec<Point>,
}

impl Sweep {
    /// The engine's measured capacity, requests per second.
    pub fn capacity(&self) -> f64 {
        self.calibration.capacity
    }

    /// The points of one system, by increasing load.
    pub fn points_of(&self, system: System) -> impl Iterator<Item = &Point> {
        self.points
            .iter()
            .filter(move |point| point.system == system)
    }

    /// The point of `system` at `load`, if it was run.
    pub fn point(&self, system: System, load: f64) -> Option<&Point> {
        self.points_of(system).find(|point| point.load == load)
    }

    /// The highest goodput `system` reached (0 if it was not run).
    pub fn peak_goodput(&self, system: System) -> f64 {
        self.points_of(system)
            .map(|point| point.goodput)
            .fold(0.0, f64::max)
    }
}
