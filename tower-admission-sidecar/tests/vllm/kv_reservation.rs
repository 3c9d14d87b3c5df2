//! KV headroom learned from a real vLLM (`--estimate-cost`): the gate
//! admits no more prompt plus `max_tokens` than vLLM's KV cache holds, so
//! a workload that makes vLLM preempt when sent straight to it runs through
//! the sidecar without a single preemption.
//!
//! vLLM here has 4 MiB of KV cache: 2,048 tokens in 16 blocks of 128 (the
//! tiny model's 2 layers × 4 KV heads × 32 × 2 × 4 bytes is 2 KiB a
//! token). Four requests of about 830 tokens each (a short prompt and 800
//! output tokens) need 7 blocks each, 28 in all: straight to vLLM all four
//! start (`--max-num-seqs 4`) and vLLM preempts when their blocks run out.
//! Through the sidecar the engine token limit is the cache's 2,048 tokens,
//! so two run at a time and the other two wait in the sidecar.

use super::*;

/// 4 MiB of KV cache, and a context of 1,024 (vLLM wants the cache to hold
/// one whole context).
const KV_FLAGS: [&str; 4] = [
    "--kv-cache-memory-bytes",
    "4194304",
    "--max-model-len",
    "1024",
];
const KV_TOKENS: usize = 2_048;
const OUTPUT: usize = 800;

/// Longest time one of the four may take, queued behind two others at 25
/// tokens a second at worst.
const WHOLE: Duration = Duration::from_secs(240);

fn preemptions(metrics: &VllmMetrics) -> f64 {
    metrics.sum("vllm:num_preemptions_total", &[])
}

/// Four non-streaming chat completions at once to `url`; each must run to
/// its end.
async fn four(client: &reqwest::Client, url: &str) {
    let sent: Vec<_> = (0..SEQS)
        .map(|_| {
            let request = client
                .post(format!("{url}/v1/chat/completions"))
                .json(&chat(OUTPUT, false));
            tokio::spawn(async move {
                let response = tokio::time::timeout(WHOLE, request.send())
                    .await
                    .expect("answered in time")
                    .unwrap();
                let status = response.status().as_u16();
                let text = tokio::time::timeout(WHOLE, response.text())
                    .await
                    .expect("the body in time")
                    .unwrap();
                (status, text)
            })
        })
        .collect();
    for answer in sent {
        let (status, text) = answer.await.unwrap();
        assert_eq!(status, 200, "{text}");
        let body: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            body["usage"]["completion_tokens"].as_u64(),
            Some(OUTPUT as u64),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_kv_reservation_vllm_never_preempts_and_without_it_it_does() {
    let Some(rig) = rig(
        &KV_FLAGS,
        &[
            "--max-num-seqs",
            "4",
            "--request-queue-limit",
            "4",
            "--estimate-cost",
        ],
        false,
    )
    .await
    else {
        return;
    };
    let banner = rig.sidecar.process.wait_for_stdout("banner", |text| {
        text.contains("admitted: POST").then(|| text.to_owned())
    });
    assert!(
        banner.contains(&format!("engine token limit: {KV_TOKENS} per rank")),
        "the limit comes from vllm:cache_config_info:\n{banner}"
    );

    // Through the sidecar: two at a time, no preemption.
    let before = preemptions(&rig.vllm().await);
    four(&rig.client, &rig.sidecar.url).await;
    let through = rig.vllm().await;
    assert_eq!(
        preemptions(&through) - before,
        0.0,
        "vLLM preempted behind the sidecar"
    );
    let queued = gate_sum(&rig.gate().await, "request_queue_wait_seconds_count", None);
    assert!(queued >= 1.0, "some of the four waited in the sidecar");
    rig.idle().await;

    // The same four straight to vLLM: its KV cache runs out and it
    // preempts (the check that the workload can fail the first half).
    let before = preemptions(&rig.vllm().await);
    four(&rig.client, &rig.engine).await;
    let direct = preemptions(&rig.vllm().await) - before;
    assert!(direct > 0.0, "no preemption without the sidecar: {direct}");
    eprintln!("preemptions: 0 through the sidecar, {direct} straight to vLLM");
}
