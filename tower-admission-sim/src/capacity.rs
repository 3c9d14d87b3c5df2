//! The engine's capacity, measured closed-loop in virtual time: what the
//! experiments (the sweep, the QoS runs) calibrate their loads against.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::config::EngineConfig;
use super::engine::{Request, SimEngine};
use super::measure::lock;
use super::time::{self, VirtualRuntime};
use super::workload::Workload;

/// Measures the engine's capacity in requests per second: `max_num_seqs`
/// closed-loop clients per rank keep it full with the sweep's request
/// lengths, and completions are counted over three windows after the
/// warm-up (virtual time is cheap; a longer count is a steadier one).
pub(super) fn measure(
    engine: &EngineConfig,
    workload: &Workload,
    seed: u64,
    warmup: Duration,
    window: Duration,
) -> f64 {
    VirtualRuntime::new().block_on(async {
        let ranks = engine.dp_ranks;
        let clients = engine.max_num_seqs * ranks;
        let engine = SimEngine::new(engine.clone());
        let requests = Arc::new(Mutex::new(workload.arrivals(seed)));
        let completed = Arc::new(AtomicUsize::new(0));
        let window = window * 3;
        let window_start = time::now() + warmup;
        let window_end = window_start + window;
        for client in 0..clients {
            let engine = engine.clone();
            let requests = Arc::clone(&requests);
            let completed = Arc::clone(&completed);
            time::spawn(async move {
                loop {
                    let next = lock(&requests).next().expect("arrivals never end");
                    let request = Request {
                        prompt_tokens: next.prompt_tokens,
                        output_tokens: next.output_tokens,
                        rank: Some((client % ranks) as u32),
                    };
                    let Ok(mut stream) = engine.submit(request) else {
                        return;
                    };
                    while let Some(token) = stream.next_token().await {
                        let now = time::now();
                        if token.last && now >= window_start && now < window_end {
                            completed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
        time::sleep_until(window_end).await;
        completed.load(Ordering::Relaxed) as f64 / window.as_secs_f64()
    })
}
