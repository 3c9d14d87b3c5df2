//! The router view in front of the real vLLM (issue 36): a router scraping
//! the sidecar every 50 ms during a burst of three times vLLM's capacity
//! reads `vllm:num_requests_waiting` as vLLM's own waiting plus the gate's
//! queue, at every sample, and gets its answer in a few milliseconds.

use super::*;

/// One scrape of the sidecar, timed, and one of vLLM right after it.
struct Sample {
    took: Duration,
    served: f64,
    gate_queue: f64,
    vllm_waiting: f64,
}

fn served_waiting(text: &str) -> f64 {
    VllmMetrics::parse(text).waiting(None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_burst_the_router_view_serves_vllm_s_waiting_plus_the_gate_s_queue() {
    let args = [
        "--max-num-seqs",
        "4",
        "--request-queue-limit",
        "8",
        "--router-view",
    ];
    let Some(rig) = rig(&[], &args, false).await else {
        return;
    };
    // Three times capacity: 12 streams of 200 tokens at once.
    let sent: Vec<_> = (0..3 * SEQS)
        .map(|_| {
            let (client, url) = (rig.client.clone(), rig.sidecar.url.clone());
            tokio::spawn(async move {
                let response = post(&client, &url, &chat(200, true), &[]).await;
                let status = response.status().as_u16();
                if status == 200 {
                    Sse::new(response)
                        .patience(Duration::from_secs(120))
                        .rest()
                        .await;
                }
                status
            })
        })
        .collect();
    let done = Arc::new(AtomicBool::new(false));
    // The router's side: a thread of its own, ahead of ordinary processes
    // where allowed, as the rig's vLLM reader (the clients' 12 streams
    // would otherwise hold up its ticks and time it too).
    let sampler = std::thread::spawn({
        let (sidecar, engine, done) = (
            rig.sidecar.url.clone(),
            rig.engine.clone(),
            Arc::clone(&done),
        );
        move || {
            raise_priority_of_this_thread();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let client = client();
                // Each sample in a task of its own: a slow scrape delays no
                // other tick.
                let mut every = tokio::time::interval(Duration::from_millis(50));
                let mut taken = Vec::new();
                while !done.load(Ordering::SeqCst) {
                    every.tick().await;
                    let (client, sidecar, engine) =
                        (client.clone(), sidecar.clone(), engine.clone());
                    taken.push(tokio::spawn(async move {
                        let began = Instant::now();
                        let text = vllm::scrape_text(&client, &sidecar).await;
                        let took = began.elapsed();
                        let vllm_waiting = vllm::scrape(&client, &engine).await.waiting(None);
                        let gate = Exposition::parse(&text);
                        Sample {
                            took,
                            served: served_waiting(&text),
                            gate_queue: gate_sum(&gate, "request_queue_count", None),
                            vllm_waiting,
                        }
                    }));
                }
                let mut samples = Vec::new();
                for sample in taken {
                    samples.push(sample.await.unwrap());
                }
                samples
            })
        }
    });
    let mut statuses = Vec::new();
    for answer in sent {
        statuses.push(within(answer).await.unwrap_or(0));
    }
    done.store(true, Ordering::SeqCst);
    let samples = within(tokio::task::spawn_blocking(move || sampler.join().unwrap()))
        .await
        .unwrap();
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert!(samples.len() >= 10, "{} samples", samples.len());
    assert!(
        samples.iter().any(|sample| sample.gate_queue > 0.0),
        "the burst queued in the gate"
    );
    // Within one event: the gate's queue is read at the scrape, vLLM's
    // waiting is its last background scrape (50 ms). The scrape reads the
    // gate twice (its gauge, then the view's live count): while the burst
    // arrives (12 requests within a few milliseconds) a scrape can span
    // many events, so samples are judged from the first whose gauge shows
    // the queue formed; from then on an event is a request finishing.
    let formed = samples
        .iter()
        .position(|sample| sample.gate_queue > 0.0)
        .unwrap_or(samples.len());
    let judged = &samples[formed..];
    let off: Vec<(f64, f64, f64)> = judged
        .iter()
        .filter(|s| (s.served - (s.gate_queue + s.vllm_waiting)).abs() > 1.0)
        .map(|s| (s.served, s.gate_queue, s.vllm_waiting))
        .collect();
    let judged = judged.len();
    assert!(
        off.is_empty(),
        "(served, gate queue, vLLM waiting): {off:?}"
    );
    let mut took: Vec<Duration> = samples.iter().map(|sample| sample.took).collect();
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize];
    eprintln!(
        "router view: {} scrapes of the sidecar every 50 ms during a 3x burst on vLLM: \
         p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; served waiting = vLLM's + the gate's \
         queue at each of the {judged} samples from the queue's forming",
        took.len(),
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        took.last().unwrap().as_secs_f64() * 1e3,
    );
    rig.idle().await;
}
