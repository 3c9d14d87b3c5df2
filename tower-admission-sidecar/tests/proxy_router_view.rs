//! The router view (issue 36) over real sockets: the sidecar's binary with
//! `--router-view` in front of an engine of this test that speaks vLLM's
//! metrics. A router scraping the sidecar reads vLLM's own series names,
//! with the gate's queue counted in the waiting gauge, each series once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use tokio::sync::Semaphore;
use tower_admission_testkit::{PATIENCE, Process, within};

/// An engine that says it is vLLM, whose `/metrics` states `waiting`
/// requests waiting, and whose chat completions hold until `release` has
/// a permit.
struct Engine {
    url: String,
    waiting: Arc<AtomicUsize>,
    arrived: Arc<AtomicUsize>,
    release: Arc<Semaphore>,
}

async fn engine() -> Engine {
    let waiting = Arc::new(AtomicUsize::new(2));
    let arrived = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(Semaphore::new(0));
    let app = Router::new()
        .route(
            "/v1/models",
            get(|| async {
                axum::Json(serde_json::json!({
                    "object": "list",
                    "data": [{"id": "tiny", "object": "model", "owned_by": "vllm"}],
                }))
            }),
        )
        .route(
            "/metrics",
            get({
                let waiting = Arc::clone(&waiting);
                move || async move {
                    let waiting = waiting.load(Ordering::SeqCst);
                    format!(
                        "# HELP vllm:num_requests_waiting Number of requests waiting.\n\
                         # TYPE vllm:num_requests_waiting gauge\n\
                         vllm:num_requests_waiting{{engine=\"0\",model_name=\"tiny\"}} {waiting}.0\n\
                         # TYPE vllm:num_requests_running gauge\n\
                         vllm:num_requests_running{{engine=\"0\",model_name=\"tiny\"}} 1.0\n\
                         # TYPE vllm:kv_cache_usage_perc gauge\n\
                         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"tiny\"}} 0.25\n\
                         # TYPE vllm:num_preemptions_total counter\n\
                         vllm:num_preemptions_total{{engine=\"0\",model_name=\"tiny\"}} 0.0\n"
                    )
                }
            }),
        )
        .route(
            "/v1/chat/completions",
            post({
                let (arrived, release) = (Arc::clone(&arrived), Arc::clone(&release));
                move || async move {
                    arrived.fetch_add(1, Ordering::SeqCst);
                    release.acquire().await.unwrap().forget();
                    axum::Json(serde_json::json!({"choices": []}))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Engine {
        url,
        waiting,
        arrived,
        release,
    }
}

fn sidecar(engine: &str, more: &[&str]) -> (Process, String) {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        engine,
        "--max-num-seqs",
        "1",
        "--request-queue-limit",
        "4",
        "--router-view",
    ];
    args.extend_from_slice(more);
    let process = Process::spawn(env!("CARGO_BIN_EXE_tower-admission").as_ref(), &args, &[]);
    let url = process.listening_url();
    (process, url)
}

/// The samples of `name` in an exposition text: (labels, value).
fn samples(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(rest) => rest.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            Some((labels.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

async fn scrape(client: &reqwest::Client, url: &str) -> String {
    within(async {
        client
            .get(format!("{url}/metrics"))
            .send()
            .await?
            .text()
            .await
    })
    .await
    .unwrap()
}

fn queued_in_gate(text: &str) -> f64 {
    let name = format!(
        "{}_request_queue_count",
        tower_admission::metrics::DEFAULT_PREFIX
    );
    samples(text, &name).iter().map(|(_, value)| value).sum()
}

/// Scrapes until `condition` holds of the text (bounded by the tests'
/// patience).
async fn scrape_until(
    client: &reqwest::Client,
    url: &str,
    what: &str,
    condition: impl Fn(&str) -> bool,
) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = scrape(client, url).await;
        if condition(&text) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never: {what}\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_gauge_a_router_reads_counts_the_gate_s_queue_in() {
    let engine = engine().await;
    let (_process, url) = sidecar(&engine.url, &["--merge-engine-metrics"]);
    let client = reqwest::Client::new();
    // One request runs in the engine, three wait in the gate.
    let sent: Vec<_> = (0..4)
        .map(|_| {
            let request = client
                .post(format!("{url}/v1/chat/completions"))
                .json(&serde_json::json!({"model": "tiny", "messages": []}));
            tokio::spawn(async move { request.send().await.map(|r| r.status().as_u16()) })
        })
        .collect();
    let labels = "engine=\"0\",model_name=\"tiny\"";
    let waiting = |text: &str| samples(text, "vllm:num_requests_waiting");
    let text = scrape_until(&client, &url, "three queued in the gate", |text| {
        queued_in_gate(text) == 3.0 && waiting(text).first().is_some_and(|(_, v)| *v == 5.0)
    })
    .await;
    // vLLM's two, the gate's three; vLLM's own labels; one value only,
    // though the engine's series are merged.
    assert_eq!(waiting(&text), [(labels.to_owned(), 5.0)], "{text}");
    assert_eq!(
        samples(&text, "vllm:num_requests_running"),
        [(labels.to_owned(), 1.0)]
    );
    assert_eq!(
        samples(&text, "vllm:kv_cache_usage_perc"),
        [(labels.to_owned(), 0.25)]
    );
    assert_eq!(
        samples(&text, "vllm:num_preemptions_total"),
        [(labels.to_owned(), 0.0)],
        "the engine's other series, merged"
    );
    assert_eq!(text.matches("# TYPE vllm:num_requests_waiting ").count(), 1);
    let age = format!(
        "{}_engine_scrape_age_seconds",
        tower_admission::metrics::DEFAULT_PREFIX
    );
    let age = samples(&text, &age)[0].1;
    assert!((0.0..=1.0).contains(&age), "a recent engine scrape: {age}");

    // The engine's own queue changes: the view follows its next scrape.
    engine.waiting.store(0, Ordering::SeqCst);
    scrape_until(&client, &url, "the engine's queue emptied", |text| {
        waiting(text).first().is_some_and(|(_, v)| *v == 3.0)
    })
    .await;

    // As the gate's queue drains into the engine, the waiting gauge falls.
    engine.release.add_permits(4);
    for answer in sent {
        assert_eq!(within(answer).await.unwrap().unwrap(), 200);
    }
    assert_eq!(engine.arrived.load(Ordering::SeqCst), 4);
    let text = scrape(&client, &url).await;
    assert_eq!(waiting(&text), [(labels.to_owned(), 0.0)], "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_metrics_are_as_before() {
    let engine = engine().await;
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &engine.url,
        "--max-num-seqs",
        "1",
    ];
    let process = Process::spawn(env!("CARGO_BIN_EXE_tower-admission").as_ref(), &args, &[]);
    let url = process.listening_url();
    let text = scrape(&reqwest::Client::new(), &url).await;
    assert!(!text.contains("vllm:"), "{text}");
    assert!(!text.contains("engine_scrape_age"), "{text}");
}
