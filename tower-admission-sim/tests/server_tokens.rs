//! Token budgets end to end: the example OpenAI server reads each request's
//! prompt from its body before admission (`OpenAiCostLayer`) and weighs it
//! against `--engine-waiting-token-limit`, over a real socket.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use tower_admission_testkit::exposition;
mod support;

use exposition::Exposition;

/// A streamed chat completion of about `prompt_tokens` tokens (4 bytes of
/// text each, the layer's default estimate).
fn chat(prompt_tokens: usize, max_tokens: u64) -> Value {
    json!({
        "model": "sim",
        "messages": [{"role": "user", "content": "word".repeat(prompt_tokens)}],
        "max_tokens": max_tokens,
        "stream": true,
    })
}

struct Client {
    http: reqwest::Client,
    url: String,
}

impl Client {
    async fn metrics(&self) -> Exposition {
        exposition::scrape(&self.http, &self.url).await
    }

    /// Polls the metrics until `done` holds (each poll is a real scrape;
    /// the deadline only bounds a broken server).
    async fn until(&self, what: &str, done: impl Fn(&Exposition) -> bool) {
        let deadline = Instant::now() + support::PATIENCE;
        loop {
            if done(&self.metrics().await) {
                return;
            }
            assert!(Instant::now() < deadline, "never saw {what}");
            tokio::task::yield_now().await;
        }
    }

    /// Starts a streamed request; resolves to (status, when its first
    /// content arrived, the whole stream).
    fn stream(&self, body: &Value) -> tokio::task::JoinHandle<(u16, Option<Instant>, String)> {
        let request = self
            .http
            .post(format!("{}/v1/chat/completions", self.url))
            .json(body);
        tokio::spawn(async move {
            let mut response = request.send().await.expect("the request failed");
            let status = response.status().as_u16();
            let mut text = String::new();
            let mut first_content = None;
            while let Some(chunk) = response.chunk().await.expect("the stream failed") {
                text.push_str(&String::from_utf8_lossy(&chunk));
                if first_content.is_none() && has_content(&text) {
                    first_content = Some(Instant::now());
                }
            }
            (status, first_content, text)
        })
    }
}

/// Whether an SSE stream so far carries a chunk with generated content.
fn has_content(stream: &str) -> bool {
    stream
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .any(|chunk| {
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|content| !content.is_empty())
        })
}

fn admitted(metrics: &Exposition, source: &str) -> f64 {
    metrics.value(
        "admission_request_admit_total",
        &[("dp_rank", "unspecified"), ("source", source)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompts_beyond_the_waiting_token_budget_queue_and_enter_in_order() {
    let server = support::server(
        "openai_server",
        &[
            "--max-num-seqs",
            "64",
            "--engine-waiting-token-limit",
            "1000",
            "--max-model-len",
            "1000000",
            "--time-scale",
            "4",
        ],
        &[],
    );
    assert!(
        server
            .banner
            .contains("token limits: engine waiting 1000, engine off, queue off"),
        "{}",
        server.banner
    );
    let client = Client {
        http: reqwest::Client::new(),
        url: server.url.clone(),
    };

    // Three prompts of 800 tokens (3,200 bytes), one after the other: the
    // first is admitted at once, the next two wait for the budget.
    let first = client.stream(&chat(800, 16));
    client
        .until("the first request admitted", |m| {
            admitted(m, "direct") == 1.0
        })
        .await;
    let second = client.stream(&chat(800, 16));
    client
        .until("the second request queued", |m| {
            m.value(
                "admission_request_queue_count",
                &[("dp_rank", "unspecified")],
            ) >= 1.0
                || admitted(m, "queue") >= 1.0
        })
        .await;
    let third = client.stream(&chat(800, 16));

    let (status_a, first_a, _) = first.await.unwrap();
    let (status_b, first_b, _) = second.await.unwrap();
    let (status_c, first_c, stream_c) = third.await.unwrap();
    assert_eq!(
        (status_a, status_b, status_c),
        (200, 200, 200),
        "{stream_c}"
    );
    let (a, b, c) = (first_a.unwrap(), first_b.unwrap(), first_c.unwrap());
    assert!(a <= b && b <= c, "first tokens in arrival order");

    let metrics = client.metrics().await;
    assert_eq!(admitted(&metrics, "direct"), 1.0);
    assert_eq!(admitted(&metrics, "queue"), 2.0);
    // The queued ones held the budget in turn, never together.
    assert_eq!(
        metrics.value(
            "admission_engine_waiting_token_count",
            &[("dp_rank", "unspecified")]
        ),
        0.0
    );

    // A prompt of 1,500 tokens, larger than the whole budget, runs alone
    // rather than being refused.
    let (status, first_token, stream) = client.stream(&chat(1500, 4)).await.unwrap();
    assert_eq!(status, 200, "{stream}");
    assert!(first_token.is_some(), "{stream}");
    let metrics = client.metrics().await;
    assert_eq!(admitted(&metrics, "direct"), 2.0);
    assert_eq!(
        metrics.value(
            "admission_rejection_total",
            &[("dp_rank", "unspecified"), ("scope", "worker")]
        ),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_bound_is_answered_413_before_admission() {
    let server = support::server("openai_server", &["--max-num-seqs", "4"], &[]);
    let http = reqwest::Client::new();
    // A head declaring 5 MiB, over the layer's 4 MiB bound: answered before
    // a byte of the body is sent (over a raw socket, since a client that
    // insists on sending the body would see the connection close under it).
    let address = server.url.strip_prefix("http://").unwrap();
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {address}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        5 << 20
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0; 4096];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(20), socket.read(&mut buffer))
            .await
            .expect("answered without the body")
            .unwrap();
        answer.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&answer);
        if read == 0 || text.contains("}}") {
            break;
        }
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    let error: Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(error["error"]["code"], "request_too_large");
    assert_eq!(error["error"]["param"], Value::Null);
    let client = Client {
        http,
        url: server.url.clone(),
    };
    let metrics = client.metrics().await;
    assert_eq!(
        metrics.value(
            "admission_request_receive_total",
            &[("dp_rank", "unspecified")]
        ),
        0.0,
        "the gate never saw it"
    );
    // Malformed JSON passes through to the handler, which answers 400.
    let response = client
        .http
        .post(format!("{}/v1/chat/completions", server.url))
        .header("content-type", "application/json")
        .body("{\"messages\": [")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    let metrics = client.metrics().await;
    assert_eq!(admitted(&metrics, "direct"), 1.0, "admitted with no cost");
}
