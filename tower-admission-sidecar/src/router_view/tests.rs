use std::pin::Pin;

use tower_admission::{Acquire, AdmissionConfig, Descriptor, EngineCapacity, Permit};

use super::*;

const VLLM: &str = "\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"tiny\"} 2.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"tiny\"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"tiny\"} 0.5
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine=\"0\",model_name=\"tiny\"} 0.0
";

/// A gate of one slot per rank (`ranks` ranks) and a queue of 8.
fn gate(ranks: usize) -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .capacity(EngineCapacity::new(1, ranks))
            .request_queue_limit(8),
    )
}

/// `n` requests of `request` queued (polled once, pending).
async fn queue(gate: &Gate, n: usize, request: Descriptor) -> Vec<Pin<Box<Acquire>>> {
    let mut queued = Vec::new();
    for _ in 0..n {
        let mut acquire = Box::pin(gate.acquire_with(request));
        assert!(futures::poll!(&mut acquire).is_pending());
        queued.push(acquire);
    }
    queued
}

async fn admitted(gate: &Gate, request: Descriptor) -> Permit {
    gate.acquire_with(request).await.expect("admitted")
}

fn view_of(gate: &Gate, engine: Option<&str>) -> RouterView {
    let view = RouterView::manual(gate.clone(), RouterViewOptions::default());
    if let Some(text) = engine {
        view.shared.record(text.to_owned(), Instant::now());
    }
    view
}

/// The value of the one sample of `name` with exactly `labels`.
fn value(text: &str, name: &str, labels: &str) -> f64 {
    let found: Vec<Sample> = samples(text, &[name])
        .into_iter()
        .filter(|sample| sample.labels == labels)
        .collect();
    assert_eq!(found.len(), 1, "one {name}{{{labels}}} in:\n{text}");
    found[0].value
}

#[tokio::test]
async fn vllm_s_waiting_gauge_counts_the_gate_s_queue_in_and_keeps_its_labels() {
    let gate = gate(1);
    let _running = admitted(&gate, Descriptor::new()).await;
    let _queued = queue(&gate, 3, Descriptor::new()).await;
    let text = view_of(&gate, Some(VLLM)).render(false);
    let labels = "engine=\"0\",model_name=\"tiny\"";
    assert_eq!(value(&text, "vllm:num_requests_waiting", labels), 5.0);
    assert_eq!(value(&text, "vllm:num_requests_running", labels), 4.0);
    assert_eq!(value(&text, "vllm:kv_cache_usage_perc", labels), 0.5);
    assert!(!text.contains("num_preemptions"), "no merge asked:\n{text}");
}

#[tokio::test]
async fn merged_engine_series_never_serve_two_values_under_one_name() {
    let gate = gate(1);
    let _queued = queue(&gate, 0, Descriptor::new()).await;
    let text = view_of(&gate, Some(VLLM)).render(true);
    for name in [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    ] {
        assert_eq!(samples(&text, &[name]).len(), 1, "{name} in:\n{text}");
        assert_eq!(
            text.matches(&format!("# TYPE {name} ")).count(),
            1,
            "{name} typed once:\n{text}"
        );
    }
    // The engine's other series are merged as they are.
    assert_eq!(
        value(
            &text,
            "vllm:num_preemptions_total",
            "engine=\"0\",model_name=\"tiny\""
        ),
        0.0
    );
}

#[tokio::test]
async fn per_rank_the_ranked_queue_counts_in_its_rank_and_the_unranked_in_each() {
    let gate = gate(2);
    let _one = admitted(&gate, Descriptor::new().with_rank(Some(1))).await;
    let _ranked = queue(&gate, 2, Descriptor::new().with_rank(Some(1))).await;
    let _zero = admitted(&gate, Descriptor::new().with_rank(Some(0))).await;
    let _unranked = queue(&gate, 1, Descriptor::new()).await;
    let engine = "\
vllm:num_requests_waiting{engine=\"0\",model_name=\"tiny\"} 0
vllm:num_requests_waiting{engine=\"1\",model_name=\"tiny\"} 1
";
    let text = view_of(&gate, Some(engine)).render(false);
    assert_eq!(
        value(
            &text,
            "vllm:num_requests_waiting",
            "engine=\"0\",model_name=\"tiny\""
        ),
        1.0,
        "rank 0: the unranked request"
    );
    assert_eq!(
        value(
            &text,
            "vllm:num_requests_waiting",
            "engine=\"1\",model_name=\"tiny\""
        ),
        4.0,
        "rank 1: vLLM's one, its two, the unranked one"
    );
}

#[tokio::test]
async fn sglang_gets_its_own_names() {
    let gate = gate(1);
    let _running = admitted(&gate, Descriptor::new()).await;
    let _queued = queue(&gate, 2, Descriptor::new()).await;
    let engine = "\
sglang:num_queue_reqs{model_name=\"m\"} 1
sglang:num_running_reqs{model_name=\"m\"} 3
sglang:token_usage{model_name=\"m\"} 0.25
";
    let text = view_of(&gate, Some(engine)).render(false);
    assert_eq!(
        value(&text, "sglang:num_queue_reqs", "model_name=\"m\""),
        3.0
    );
    assert_eq!(
        value(&text, "sglang:num_running_reqs", "model_name=\"m\""),
        3.0
    );
    assert_eq!(value(&text, "sglang:token_usage", "model_name=\"m\""), 0.25);
    assert!(!text.contains("vllm:"), "{text}");
}

#[tokio::test]
async fn llama_cpp_gets_vllm_s_names_from_its_own_gauges_and_the_gate() {
    let gate = gate(1);
    let _running = admitted(&gate, Descriptor::new()).await;
    let _queued = queue(&gate, 2, Descriptor::new()).await;
    let engine = "\
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
llamacpp:requests_processing 1
";
    let text = view_of(&gate, Some(engine)).render(false);
    assert_eq!(value(&text, "vllm:num_requests_waiting", ""), 3.0);
    assert_eq!(value(&text, "vllm:num_requests_running", ""), 1.0);
    assert_eq!(
        value(&text, "vllm:kv_cache_usage_perc", ""),
        1.0,
        "no cache gauge: the gate's one slot of one taken"
    );
}

#[tokio::test]
async fn before_any_engine_scrape_the_gate_alone_is_served_and_the_age_says_so() {
    let gate = gate(1);
    let _running = admitted(&gate, Descriptor::new()).await;
    let _queued = queue(&gate, 1, Descriptor::new()).await;
    let text = view_of(&gate, None).render(true);
    assert_eq!(value(&text, "vllm:num_requests_waiting", ""), 1.0);
    assert_eq!(value(&text, "vllm:num_requests_running", ""), 1.0);
    let age = format!(
        "{}_engine_scrape_age_seconds",
        tower_admission::metrics::DEFAULT_PREFIX
    );
    assert_eq!(value(&text, &age, ""), -1.0);
}

#[tokio::test(start_paused = true)]
async fn the_age_gauge_is_the_time_since_the_engine_s_last_scrape() {
    let gate = gate(1);
    let view = view_of(&gate, Some(VLLM));
    tokio::time::advance(Duration::from_millis(120)).await;
    let age = format!(
        "{}_engine_scrape_age_seconds",
        tower_admission::metrics::DEFAULT_PREFIX
    );
    let served = value(&view.render(false), &age, "");
    assert!((served - 0.12).abs() < 1e-9, "{served}");
}

#[test]
fn labels_are_read_whole_whatever_they_quote() {
    let text = "vllm:num_requests_waiting{model_name=\"a}b,c=\\\"d\",engine=\"1\"} 7\n";
    let found = samples(text, &["vllm:num_requests_waiting"]);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].value, 7.0);
    assert_eq!(label(&found[0].labels, "engine"), Some("1"));
    assert_eq!(label(&found[0].labels, "model_name"), Some("a}b,c=\\\"d"));
}
