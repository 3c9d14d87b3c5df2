//! The KV reservation learned from the engine: with `--estimate-cost`, the
//! sidecar's engine token limit follows the KV cache the engine states in
//! `vllm:cache_config_info`, so a request whose prompt plus `max_tokens`
//! would overrun the cache beside the running ones waits in the gate
//! instead of reaching the engine (where vLLM would preempt). An explicit
//! `--engine-token-limit` wins; without `--estimate-cost` nothing changes.
//!
//! The engine here is a stand-in that states a vLLM cache of 64 blocks of
//! 128 tokens (8,192 tokens) and streams until the test lets a request end;
//! `tests/proxy_vllm.rs` runs the same against a real vLLM.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use bytes::Bytes;
use tokio::sync::{Mutex, mpsc, oneshot};
use tower_admission_testkit::exposition::scrape;
use tower_admission_testkit::{Process, within};

/// What the stand-in states of its KV cache: 64 blocks of 128 tokens.
const VLLM_METRICS: &str = "# TYPE vllm:cache_config_info gauge\n\
vllm:cache_config_info{block_size=\"128\",engine=\"0\",num_gpu_blocks=\"64\"} 1.0\n";

/// A request the engine received, held open until `finish` is sent.
struct Arrival {
    finish: oneshot::Sender<()>,
}

struct Engine {
    url: String,
    arrivals: mpsc::UnboundedReceiver<Arrival>,
}

async fn engine() -> Engine {
    let (sender, arrivals) = mpsc::unbounded_channel();
    let sender = Arc::new(Mutex::new(sender));
    let app = Router::new()
        .route("/metrics", get(|| async { VLLM_METRICS }))
        .route(
            "/v1/models",
            get(|| async { r#"{"object":"list","data":[{"id":"tiny","owned_by":"vllm"}]}"# }),
        )
        .route(
            "/v1/chat/completions",
            post(move || {
                let sender = sender.clone();
                async move {
                    let (finish, finished) = oneshot::channel::<()>();
                    let _ = sender.lock().await.send(Arrival { finish });
                    let first = Bytes::from_static(
                        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
                    );
                    let stream = futures::stream::unfold(
                        (Some(first), Some(finished)),
                        |(first, finished)| async move {
                            if let Some(first) = first {
                                return Some((Ok::<_, Infallible>(first), (None, finished)));
                            }
                            let _ = finished?.await;
                            Some((Ok(Bytes::from_static(b"data: [DONE]\n\n")), (None, None)))
                        },
                    );
                    axum::response::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(Body::from_stream(stream))
                        .unwrap()
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Engine { url, arrivals }
}

/// The sidecar binary in front of `engine`, and its start-up banner.
fn sidecar(engine: &Engine, flags: &[&str]) -> (Process, String, String) {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &engine.url,
        "--max-num-seqs",
        "4",
        "--request-queue-limit",
        "4",
    ];
    args.extend_from_slice(flags);
    let process = Process::spawn(env!("CARGO_BIN_EXE_tower-admission").as_ref(), &args, &[]);
    let url = process.listening_url();
    let banner = process.wait_for_stdout("banner", |text| {
        text.contains("admitted: POST").then(|| text.to_owned())
    });
    (process, url, banner)
}

/// A streaming chat completion asking for `max_tokens`.
async fn chat(client: &reqwest::Client, url: &str, max_tokens: u64) -> reqwest::Response {
    let body = format!(
        r#"{{"model":"tiny","stream":true,"max_tokens":{max_tokens},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

/// Both requests are at the engine together; then both end.
async fn both_reach_the_engine(engine: &mut Engine, responses: [reqwest::Response; 2]) {
    let mut arrivals = Vec::new();
    for response in &responses {
        assert_eq!(response.status(), 200);
        arrivals.push(within(engine.arrivals.recv()).await.unwrap());
    }
    for arrival in arrivals {
        arrival.finish.send(()).unwrap();
    }
    for response in responses {
        within(response.bytes()).await.unwrap();
    }
}

/// Waits until the gate's queue, as its `/metrics` says, is empty or not.
async fn queue_is_empty(client: &reqwest::Client, url: &str, empty: bool) {
    loop {
        let scrape = scrape(client, url).await;
        if (scrape.sum("admission_request_queue_count", &[]) == 0.0) == empty {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_would_overrun_the_kv_cache_waits_in_the_gate() {
    let mut engine = engine().await;
    let (_process, url, banner) = sidecar(&engine, &["--estimate-cost"]);
    assert!(
        banner.contains("engine token limit: 8192 per rank"),
        "{banner}"
    );
    let client = reqwest::Client::new();

    // 6,000 tokens fit the cache; 6,000 more beside them do not.
    let first = within(chat(&client, &url, 6_000)).await;
    assert_eq!(first.status(), 200);
    let running = within(engine.arrivals.recv()).await.unwrap();
    let second = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { chat(&client, &url, 6_000).await }
    });
    within(queue_is_empty(&client, &url, false)).await;
    assert!(
        engine.arrivals.try_recv().is_err(),
        "the second request reached the engine while the first held the cache"
    );

    // The first ends: the second is admitted and reaches the engine.
    running.finish.send(()).unwrap();
    within(first.bytes()).await.unwrap();
    let second_arrival = within(engine.arrivals.recv()).await.unwrap();
    let second = within(second).await.unwrap();
    assert_eq!(second.status(), 200);
    second_arrival.finish.send(()).unwrap();
    within(second.bytes()).await.unwrap();
    within(queue_is_empty(&client, &url, true)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cost_estimates_or_with_an_explicit_limit_the_cache_is_not_the_limit() {
    let mut engine = engine().await;

    // No --estimate-cost: costs are unknown, the cache bounds nothing, and
    // both requests reach the engine at once.
    let (process, url, banner) = sidecar(&engine, &[]);
    assert!(!banner.contains("engine token limit"), "{banner}");
    let client = reqwest::Client::new();
    let first = within(chat(&client, &url, 6_000)).await;
    let second = within(chat(&client, &url, 6_000)).await;
    both_reach_the_engine(&mut engine, [first, second]).await;
    drop(process);

    // An explicit limit wins over the cache the engine states.
    let (_process, url, banner) = sidecar(
        &engine,
        &["--estimate-cost", "--engine-token-limit", "20000"],
    );
    assert!(!banner.contains("engine token limit:"), "{banner}");
    assert!(
        banner.contains("capacity: from --max-num-seqs 4"),
        "{banner}"
    );
    let first = within(chat(&client, &url, 6_000)).await;
    let second = within(chat(&client, &url, 6_000)).await;
    both_reach_the_engine(&mut engine, [first, second]).await;
}
