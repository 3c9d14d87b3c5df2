//! `OpenAiCostLayer` over real sockets: a client's `max_tokens` clamped to
//! the context its prompt leaves, a prompt beyond the context answered `400`
//! before admission, prompts as token IDs, a bound on concurrent body reads
//! shared by every clone of the layer, and a read timeout.
#![cfg(feature = "http")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::routing::post;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use tower_admission::http::OpenAiCostLayer;
use tower_admission::{AdmissionConfig, Cost, Gate};

const PATIENCE: Duration = Duration::from_secs(10);

/// Serves two routes behind `layer`; each answers the cost it was given as
/// `[prompt, output]` and counts its calls.
async fn serve(layer: OpenAiCostLayer) -> (SocketAddr, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let calls = calls.clone();
        move |req: Request| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let cost = req.extensions().get::<Cost>().copied();
                axum::Json(json!(
                    cost.map(|cost| json!([cost.prompt_tokens, cost.max_output_tokens]))
                ))
            }
        }
    };
    let app = Router::new()
        .route("/v1/completions", post(handler.clone()))
        .route("/v1/chat/completions", post(handler))
        .route_layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, calls)
}

async fn post_json(
    addr: SocketAddr,
    path: &str,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let response = timeout(
        PATIENCE,
        reqwest::Client::new()
            .post(format!("http://{addr}{path}"))
            .json(body)
            .send(),
    )
    .await
    .expect("no answer")
    .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap();
    (status, headers, body)
}

#[tokio::test]
async fn a_clients_max_tokens_is_clamped_to_the_context_its_prompt_leaves() {
    let (addr, _) = serve(OpenAiCostLayer::new().max_model_len(100)).await;
    // 10 tokens of prompt (4 bytes each): 90 left for the output.
    let huge = json!({"prompt": "word".repeat(10), "max_tokens": 1_000_000_000_000u64});
    let (status, _, cost) = post_json(addr, "/v1/completions", &huge).await;
    assert_eq!((status, cost), (200, json!([10, 90])));
    let small = json!({"prompt": "word".repeat(10), "max_tokens": 5});
    let (_, _, cost) = post_json(addr, "/v1/completions", &small).await;
    assert_eq!(cost, json!([10, 5]));
    // Without a limit, the client's figure is taken as sent (the default).
    let (addr, _) = serve(OpenAiCostLayer::new()).await;
    let (_, _, cost) = post_json(addr, "/v1/completions", &huge).await;
    assert_eq!(cost, json!([10, 1_000_000_000_000u64]));
}

#[tokio::test]
async fn a_prompt_beyond_the_context_is_answered_400_before_admission() {
    let (addr, calls) = serve(OpenAiCostLayer::new().max_model_len(100)).await;
    let long = json!({"prompt": "word".repeat(101), "max_tokens": 1});
    let (status, _, body) = post_json(addr, "/v1/completions", &long).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["code"], 400);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("101") && message.contains("100"),
        "{message}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler was called");
    // Exactly at the limit is accepted, with no output left.
    let full = json!({"prompt": "word".repeat(100), "max_tokens": 7});
    let (status, _, cost) = post_json(addr, "/v1/completions", &full).await;
    assert_eq!((status, cost), (200, json!([100, 0])));
}

#[tokio::test]
async fn prompts_as_token_ids_count_their_length() {
    let (addr, _) = serve(OpenAiCostLayer::new()).await;
    let ids = json!({"prompt": [1, 2, 3]});
    assert_eq!(
        post_json(addr, "/v1/completions", &ids).await.2,
        json!([3, null])
    );
    let lists = json!({"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 4});
    assert_eq!(
        post_json(addr, "/v1/completions", &lists).await.2,
        json!([5, 4])
    );
}

/// Opens a connection that sends its headers and half its body, then stalls.
async fn stall(addr: SocketAddr, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         content-length: 100\r\n\r\n{{\"prompt\": \"half"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

#[tokio::test]
async fn reads_beyond_the_bound_are_overloaded_at_once_and_a_stalled_body_times_out() {
    let layer = OpenAiCostLayer::new()
        .max_concurrent_reads(1)
        .read_timeout(Duration::from_millis(200));
    let (addr, calls) = serve(layer).await;
    let mut stalled = stall(addr, "/v1/completions").await;
    // The stalled read holds the only slot, on another route: the layer's
    // clones share one count. The next body is not read but answered.
    let ok = json!({"prompt": "word"});
    let mut answered = None;
    for _ in 0..100 {
        let (status, headers, body) = post_json(addr, "/v1/chat/completions", &ok).await;
        if status == 529 {
            answered = Some((headers, body));
            break;
        }
        // The stalled request's head may not have been read yet.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (headers, body) = answered.expect("never overloaded");
    assert_eq!(headers["x-admission-rejection-scope"], "worker");
    assert_eq!(headers["x-admission-rejection-reason"], "body_reads");
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(body["error"]["type"], "overloaded");
    assert_eq!(body["error"]["code"], 529);
    assert_eq!(body["error"]["scope"], "worker");
    assert_eq!(body["error"]["reason"], "body_reads");

    // The stalled body gets 408 after the timeout, not before.
    let mut answer = Vec::new();
    timeout(PATIENCE, async {
        let mut buf = [0u8; 4096];
        loop {
            let n = stalled.read(&mut buf).await.unwrap();
            answer.extend_from_slice(&buf[..n]);
            if n == 0 || String::from_utf8_lossy(&answer).contains("}}") {
                break;
            }
        }
    })
    .await
    .expect("the stalled body was never answered");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("\"type\":\"invalid_request_error\""),
        "{answer}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // The slot is free again.
    let (status, _, cost) = post_json(addr, "/v1/chat/completions", &ok).await;
    assert_eq!((status, cost), (200, json!([1, null])));
}

#[tokio::test]
async fn the_body_reads_answer_has_the_status_the_layer_was_given() {
    let layer = OpenAiCostLayer::new()
        .max_concurrent_reads(1)
        .overload_status(http::StatusCode::SERVICE_UNAVAILABLE);
    let (addr, calls) = serve(layer).await;
    let _stalled = stall(addr, "/v1/completions").await;
    let ok = json!({"prompt": "word"});
    let mut answered = None;
    for _ in 0..100 {
        let (status, headers, body) = post_json(addr, "/v1/chat/completions", &ok).await;
        if status != 200 {
            answered = Some((status, headers, body));
            break;
        }
        // The stalled request's head may not have been read yet.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (status, headers, body) = answered.expect("never overloaded");
    assert_eq!(status, 503);
    assert_eq!(headers["x-admission-rejection-reason"], "body_reads");
    assert_eq!(body["error"]["code"], 503);
    assert_eq!(body["error"]["type"], "overloaded");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn members_the_estimate_skips_cost_nothing_however_large_or_deep() {
    let (addr, _) = serve(OpenAiCostLayer::new()).await;
    // 50,000 tool definitions (2.6 MB) beside a 2-token prompt: skipped,
    // not built.
    let tools: Vec<Value> = (0..50_000)
        .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
        .collect();
    let big = json!({"prompt": "12345678", "tools": tools, "max_tokens": 3});
    assert_eq!(
        post_json(addr, "/v1/completions", &big).await.2,
        json!([2, 3])
    );
    // Nesting 100,000 deep: in a skipped member it is skipped too; in the
    // prompt it passes the parser's recursion limit, so the body has no
    // estimate (no cost, for the handler to judge). Never a stack overflow.
    for (body, cost) in [
        (
            format!(
                "{{\"prompt\": \"abcd\", \"x\": {}{}}}",
                "[".repeat(100_000),
                "]".repeat(100_000)
            ),
            json!([1, null]),
        ),
        (
            format!(
                "{{\"prompt\": {}\"abcd\"{}}}",
                "[".repeat(100_000),
                "]".repeat(100_000)
            ),
            Value::Null,
        ),
    ] {
        let response = reqwest::Client::new()
            .post(format!("http://{addr}/v1/completions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.json::<Value>().await.unwrap(), cost);
    }
}

#[tokio::test]
async fn the_body_reads_answers_are_counted_by_the_gate_given() {
    let gate = Gate::new(AdmissionConfig::new());
    let layer = OpenAiCostLayer::new()
        .max_concurrent_reads(1)
        .gate(gate.clone());
    let (addr, calls) = serve(layer).await;
    let _stalled = stall(addr, "/v1/completions").await;
    let ok = json!({"prompt": "word"});
    let mut overloaded = 0;
    for _ in 0..100 {
        let (status, headers, body) = post_json(addr, "/v1/chat/completions", &ok).await;
        if status == 529 {
            assert_eq!(headers["x-admission-rejection-reason"], "body_reads");
            assert_eq!(body["error"]["reason"], "body_reads");
            overloaded += 1;
            break;
        }
        // The stalled request's head may not have been read yet.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(overloaded, 1, "never overloaded");
    let tally = gate.snapshot().tally;
    // Each answer is one rejection; the requests admitted before the
    // stalled read took the slot never reached this gate.
    assert_eq!(
        (
            tally.received,
            tally.rejected_worker,
            tally.body_reads_worker
        ),
        (1, 1, 1)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}
