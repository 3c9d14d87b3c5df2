//! The adaptive engine request waiting limit over the public API: it shrinks
//! when the engine waiting time rises and grows back when it falls, on
//! tokio's paused clock with explicit steps; shrinking revokes nothing; and
//! its switch from the builder, the environment and the command line.

#[path = "support/logs.rs"]
mod logs;

use std::collections::VecDeque;
use std::time::Duration;

use futures::FutureExt;
use tower_admission::{
    Acquire, AdaptiveWaitingLimit, AdmissionConfig, EngineCapacity, Gate, LimitSource, Permit,
};

const VARIABLE: &str = "DYN_BACKEND_ADMISSION_ADAPTIVE_WAITING_LIMIT";
const TICK: Duration = Duration::from_millis(10);

/// A toy engine on tokio's paused clock: every tick it gives the first
/// token to the oldest `parallel` waiting requests admitted before the
/// tick, and they end at once. With at most `parallel` waiting, every
/// request waits one tick (the baseline); with more, the rest wait longer.
struct Engine {
    gate: Gate,
    parallel: usize,
    waiting: VecDeque<Permit>,
    queued: Vec<Acquire>,
}

impl Engine {
    fn new(gate: Gate) -> Self {
        Engine {
            gate,
            parallel: 16,
            waiting: VecDeque::new(),
            queued: Vec::new(),
        }
    }

    /// One tick: serve, take in what the gate admitted, and keep four
    /// requests queued so the limit binds. Returns the limit and the
    /// waiting count after it.
    async fn tick(&mut self) -> (usize, usize) {
        tokio::time::advance(TICK).await;
        for _ in 0..self.parallel.min(self.waiting.len()) {
            let mut permit = self.waiting.pop_front().expect("counted");
            permit.first_token();
            drop(permit);
        }
        let mut still = Vec::new();
        for mut acquire in self.queued.drain(..) {
            match (&mut acquire).now_or_never() {
                Some(Ok(permit)) => self.waiting.push_back(permit),
                Some(Err(overloaded)) => panic!("rejected: {overloaded:?}"),
                None => still.push(acquire),
            }
        }
        self.queued = still;
        while self.queued.len() < 4 {
            let mut acquire = self.gate.acquire(Some(0));
            match (&mut acquire).now_or_never() {
                Some(Ok(permit)) => self.waiting.push_back(permit),
                Some(Err(overloaded)) => panic!("rejected: {overloaded:?}"),
                None => self.queued.push(acquire),
            }
        }
        let snapshot = self.gate.snapshot();
        (
            snapshot.limits.engine_request_waiting_limit,
            snapshot.total.engine_waiting,
        )
    }

    /// Runs `ticks` ticks; returns the last limit, and whether the waiting
    /// count was ever above the limit.
    async fn run(&mut self, ticks: usize) -> (usize, bool) {
        let mut limit = 0;
        let mut above = false;
        for _ in 0..ticks {
            let (now, waiting) = self.tick().await;
            limit = now;
            above |= waiting > now;
        }
        (limit, above)
    }
}

fn adaptive_gate() -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .adaptive_waiting_limit(true)
            .request_queue_limit(64)
            .capacity(EngineCapacity::new(256, 1))
            .clock(|| tokio::time::Instant::now().into_std()),
    )
}

#[tokio::test(start_paused = true)]
async fn the_limit_shrinks_when_waiting_time_rises_and_grows_back() {
    let gate = adaptive_gate();
    assert_eq!(
        gate.limits_in_force().per_rank.engine_request_waiting_limit,
        1,
        "starts at the floor"
    );
    let mut engine = Engine::new(gate.clone());

    // 20 s at one tick per request while up to 16 wait: the limit grows
    // past 16, where waiting times start to rise.
    let (grown, _) = engine.run(2000).await;
    assert!((12..=40).contains(&grown), "grew to {grown}");

    // The engine serves 2 per tick now: waiting times rise, the limit
    // shrinks, and nothing admitted is revoked: the waiting count stays
    // above the new limit until it drains.
    engine.parallel = 2;
    let (shrunk, above) = engine.run(500).await;
    assert!(shrunk <= 6, "shrank only to {shrunk} (from {grown})");
    assert!(above, "admitted requests were kept while the limit shrank");

    // Back to 16 per tick: it grows back.
    engine.parallel = 16;
    let (recovered, _) = engine.run(2000).await;
    assert!(recovered >= 12, "recovered only to {recovered}");
}

#[tokio::test(start_paused = true)]
async fn a_lightly_loaded_gate_grows_its_limit_no_further_than_the_load_fills_it() {
    let gate = adaptive_gate();
    let mut engine = Engine::new(gate.clone());
    // One request at a time, answered in a tick: fast, but one request
    // fills only a limit of 1. Once the limit is 2 it no longer binds, and
    // 20 s of fast answers do not make it grow.
    for _ in 0..2000 {
        tokio::time::advance(TICK).await;
        if let Some(mut permit) = engine.waiting.pop_front() {
            permit.first_token();
        }
        if engine.waiting.is_empty() {
            let permit = gate.acquire(Some(0)).await.expect("room");
            engine.waiting.push_back(permit);
        }
    }
    assert_eq!(
        gate.limits_in_force().per_rank.engine_request_waiting_limit,
        2
    );
}

#[test]
fn off_by_default_and_the_limits_in_force_say_so_when_on() {
    let off = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(256, 1)));
    assert_eq!(
        off.limits_in_force().per_rank.engine_request_waiting_limit,
        256
    );
    assert_eq!(
        AdmissionConfig::new().explicit().adaptive_waiting_limit,
        None
    );

    let on = Gate::new(
        AdmissionConfig::new()
            .adaptive_waiting_limit_with(AdaptiveWaitingLimit::default().floor(4))
            .capacity(EngineCapacity::new(256, 1)),
    );
    let in_force = on.limits_in_force();
    assert_eq!(in_force.per_rank.engine_request_waiting_limit, 4);
    assert_eq!(
        in_force.sources.engine_request_waiting_limit,
        LimitSource::Adaptive {
            floor: 4,
            ceiling: 256
        }
    );
    assert!(
        in_force
            .to_string()
            .contains("engine request waiting limit 4 (adaptive: between 4 and 256)"),
        "{in_force}"
    );
    // The ceiling is the configured waiting limit when there is one.
    let capped = Gate::new(
        AdmissionConfig::new()
            .adaptive_waiting_limit(true)
            .engine_request_waiting_limit(32),
    );
    assert_eq!(
        capped
            .limits_in_force()
            .sources
            .engine_request_waiting_limit,
        LimitSource::Adaptive {
            floor: 1,
            ceiling: 32
        }
    );
    // Turned off again by the builder.
    let config = AdmissionConfig::new()
        .adaptive_waiting_limit(true)
        .adaptive_waiting_limit(false);
    assert_eq!(config.explicit().adaptive_waiting_limit, None);
}

fn lookup(value: Option<&'static str>) -> impl Fn(&str) -> Option<String> {
    move |variable| {
        (variable == VARIABLE)
            .then(|| value.map(str::to_owned))
            .flatten()
    }
}

#[test]
fn the_variable_turns_it_on_and_an_invalid_value_warns_and_leaves_it_off() {
    for (value, on) in [
        (Some("true"), true),
        (Some(" 1 "), true),
        (Some("ON"), true),
        (Some("false"), false),
        (Some("0"), false),
        (None, false),
    ] {
        let config = AdmissionConfig::from_lookup(lookup(value));
        assert_eq!(
            config.explicit().adaptive_waiting_limit.is_some(),
            on,
            "{value:?}"
        );
    }
    let logs = logs::Logs::at(tracing::Level::WARN);
    let config = logs.capture(|| AdmissionConfig::from_lookup(lookup(Some("maybe"))));
    assert_eq!(config.explicit().adaptive_waiting_limit, None);
    let text = logs.text();
    assert!(
        text.contains(VARIABLE) && text.contains("\"maybe\"") && text.contains("off"),
        "{text}"
    );
}

#[test]
#[should_panic(expected = "invalid adaptive waiting limit floor: 0")]
fn a_zero_floor_panics_naming_the_setting() {
    let _ = AdaptiveWaitingLimit::default().floor(0);
}

#[cfg(feature = "clap")]
mod flags {
    use clap::Parser;
    use tower_admission::AdmissionArgs;

    use super::*;

    #[derive(Debug, Parser)]
    struct Worker {
        #[command(flatten)]
        admission: AdmissionArgs,
    }

    fn parse(args: &[&str]) -> Result<Worker, clap::Error> {
        Worker::try_parse_from(std::iter::once("worker").chain(args.iter().copied()))
    }

    #[test]
    fn the_flag_beats_the_variable() {
        let on = parse(&["--adaptive-waiting-limit"]).unwrap();
        let config = on.admission.resolve_with(lookup(Some("false")));
        assert!(config.explicit().adaptive_waiting_limit.is_some());

        let off = parse(&["--adaptive-waiting-limit=false"]).unwrap();
        let config = off.admission.resolve_with(lookup(Some("true")));
        assert_eq!(config.explicit().adaptive_waiting_limit, None);

        let unset = parse(&[]).unwrap();
        let config = unset.admission.resolve_with(lookup(Some("true")));
        assert!(config.explicit().adaptive_waiting_limit.is_some());
        let config = unset.admission.resolve_with(lookup(None));
        assert_eq!(config.explicit().adaptive_waiting_limit, None);
    }

    #[test]
    fn an_invalid_flag_value_fails_naming_the_flag_and_the_value() {
        let error = parse(&["--adaptive-waiting-limit=maybe"])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--adaptive-waiting-limit") && error.contains("'maybe'"),
            "{error}"
        );
    }
}
