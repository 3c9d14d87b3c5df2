//! The example servers as their users run them: separate processes, real
//! sockets, real clients. `examples/openai_server.rs` must split a burst
//! into exactly the admissions, queue places and overload answers its
//! limits allow, answer each rejection as behaviour §4 says, show it all on
//! `/metrics`, turn bad requests into OpenAI-style `400`s and stop cleanly
//! on SIGTERM; `examples/tonic_server.rs` must stream tokens to its own
//! client and answer overload with `UNAVAILABLE`.
//!
//! Requests are held in flight by asking for far more tokens than the test
//! lasts (the server is killed at the end); every wait is for an event
//! (a response, an exit, a line of output) with a deadline.

use tower_admission_testkit::exposition;
#[path = "support/openai.rs"]
mod openai;
mod support;

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use exposition::FAMILIES;
use openai::*;
use support::{PATIENCE, within};

#[tokio::test]
async fn a_burst_gets_exactly_the_admissions_queue_places_and_overload_answers_the_limits_allow() {
    // Two ranks, one running request and one queue place each.
    let server = support::server(
        "openai_server",
        &[
            "--dp-ranks",
            "2",
            "--max-num-seqs",
            "4",
            "--engine-request-limit",
            "1",
            "--engine-request-waiting-limit",
            "1",
            "--request-queue-limit",
            "1",
            "--max-model-len",
            "1000000",
            "--metrics-prefix",
            "example",
        ],
        &[],
    );
    assert!(
        server.banner.contains(
            "per rank engine request limit 1, engine request waiting limit 1, request queue limit 1"
        ),
        "{}",
        server.banner
    );
    let client = Client::new(&server);
    let (answers_tx, mut answers) = mpsc::unbounded_channel();
    let burst = |rank: Option<u32>, requests: usize| {
        for _ in 0..requests {
            let answer = client.post("/v1/chat/completions", rank, &chat(4, true));
            let answers = answers_tx.clone();
            tokio::spawn(async move { answers.send((rank, answer.await)).unwrap() });
        }
    };

    // Rank 0 runs one request; of a burst of five more on rank 0, one
    // takes the queue place and four are rejected for the rank alone
    // (rank 1 has room).
    let hold_rank0 = client.hold(Some(0)).await;
    burst(Some(0), 5);
    for _ in 0..4 {
        let (_, answer) = within(answers.recv()).await.unwrap();
        assert_rank_rejection(&answer, 0);
    }
    // Four rejections mean the fifth request had taken the queue place.
    let metrics = client.metrics().await;
    assert_eq!(
        metrics.value("example_request_queue_count", &[("dp_rank", "0")]),
        1.0
    );
    assert!(answers.try_recv().is_err(), "a queued request was answered");

    // Rank 1 runs one request too: the worker's combined engine capacity
    // is used up, one queue place is left. Of three unranked requests one
    // takes it; the other two, and then a rank 1 request (its own queue
    // has room, the worker's has not), are rejected for the whole worker.
    let hold_rank1 = client.hold(Some(1)).await;
    burst(None, 3);
    for _ in 0..2 {
        let (_, answer) = within(answers.recv()).await.unwrap();
        assert_worker_rejection(&answer);
    }
    let answer = within(client.post("/v1/chat/completions", Some(1), &chat(4, true))).await;
    assert_worker_rejection(&answer);
    // Unranked-style clients of the other API get the same answer.
    let answer = within(client.post(
        "/v1/completions",
        None,
        &json!({"model": "sim", "prompt": "Hi", "max_tokens": 4}),
    ))
    .await;
    assert_worker_rejection(&answer);
    // A full worker still answers a wrong method as such: the gate wraps
    // the routes' methods, not their 405s.
    let answer = within(
        client
            .http
            .get(format!("{}/v1/chat/completions", client.url))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(answer.status(), 405);

    let metrics = client.metrics().await;
    let count =
        |suffix: &str, labels: &[(&str, &str)]| metrics.value(&format!("example_{suffix}"), labels);
    for (rank, engine, queued) in [("0", 1.0, 1.0), ("1", 1.0, 0.0), ("unspecified", 0.0, 1.0)] {
        let rank = [("dp_rank", rank)];
        assert_eq!(count("engine_request_count", &rank), engine, "{rank:?}");
        assert_eq!(
            count("engine_request_waiting_count", &rank),
            0.0,
            "{rank:?}"
        );
        assert_eq!(count("request_queue_count", &rank), queued, "{rank:?}");
    }
    assert_eq!(count("engine_request_limit", &[("dp_rank", "0")]), 1.0);
    assert_eq!(
        count("engine_request_limit", &[("dp_rank", "unspecified")]),
        2.0
    );
    assert_eq!(count("request_queue_limit", &[("dp_rank", "1")]), 1.0);
    assert!(answers.try_recv().is_err(), "a queued request was answered");

    // Rank 0's stream ends (its client goes away): the oldest queued
    // request that fits, rank 0's, runs and completes; then the unranked
    // one. Then rank 1's stream ends too.
    drop(hold_rank0);
    let (rank, answer) = within(answers.recv()).await.unwrap();
    assert_eq!(rank, Some(0));
    assert_streamed_chat(&answer, 4);
    let (rank, answer) = within(answers.recv()).await.unwrap();
    assert_eq!(rank, None);
    assert_streamed_chat(&answer, 4);
    drop(hold_rank1);

    // Every request is accounted for, under the rank it came with, once
    // the server has seen both held clients go.
    let deadline = std::time::Instant::now() + PATIENCE;
    let metrics = loop {
        let metrics = client.metrics().await;
        let engine = |rank| metrics.value("example_engine_request_count", &[("dp_rank", rank)]);
        let completed = |rank| metrics.value("sim_engine_completed_total", &[("dp_rank", rank)]);
        if engine("0") + engine("1") + engine("unspecified") == 0.0
            && completed("0") + completed("1") == 2.0
        {
            break metrics;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "requests still in flight:\n{}",
            metrics.text
        );
        // The poll interval; the condition above is what the test waits for.
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let count =
        |suffix: &str, labels: &[(&str, &str)]| metrics.value(&format!("example_{suffix}"), labels);
    let expected = [
        // rank, received, direct, queue, rank-scoped, worker-scoped
        ("0", 6.0, 1.0, 1.0, 4.0, 0.0),
        ("1", 2.0, 1.0, 0.0, 0.0, 1.0),
        ("unspecified", 4.0, 0.0, 1.0, 0.0, 3.0),
    ];
    for (rank, received, direct, queue, rank_scoped, worker_scoped) in expected {
        let dp_rank = ("dp_rank", rank);
        assert_eq!(
            count("request_receive_total", &[dp_rank]),
            received,
            "{rank}"
        );
        assert_eq!(
            count("request_admit_total", &[dp_rank, ("source", "direct")]),
            direct,
            "{rank}"
        );
        assert_eq!(
            count("request_admit_total", &[dp_rank, ("source", "queue")]),
            queue,
            "{rank}"
        );
        if rank != "unspecified" {
            assert_eq!(
                count("rejection_total", &[dp_rank, ("scope", "rank")]),
                rank_scoped,
                "{rank}"
            );
        }
        assert_eq!(
            count("rejection_total", &[dp_rank, ("scope", "worker")]),
            worker_scoped,
            "{rank}"
        );
        assert_eq!(count("cancellation_total", &[dp_rank]), 0.0, "{rank}");
        assert_eq!(count("request_queue_count", &[dp_rank]), 0.0, "{rank}");
    }
    // Every family of behaviour §6, typed; histograms with buckets per rank.
    for (suffix, kind) in FAMILIES {
        let family = format!("example_{suffix}");
        assert_eq!(
            metrics.types.get(&family).map(String::as_str),
            Some(kind),
            "{family}"
        );
        assert!(
            metrics.text.contains(&format!("# HELP {family} ")),
            "{family}"
        );
    }
    assert_eq!(
        count("request_queue_wait_seconds_count", &[("dp_rank", "0")]),
        1.0
    );
    assert_eq!(
        count(
            "engine_request_waiting_seconds_bucket",
            &[("dp_rank", "1"), ("le", "+Inf")]
        ),
        1.0
    );
    // The engine's own series, next to the gate's.
    assert_eq!(metrics.types["sim_engine_waiting_requests"], "gauge");
    assert_eq!(metrics.types["sim_engine_completed_total"], "counter");
}

// Multi-threaded: the blocking wait for the child's exit must not stop
// the client's connection tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_style_errors_and_sigterm_stops_the_server() {
    let mut server = support::server("openai_server", &["--max-model-len", "4096"], &[]);
    let client = Client::new(&server);
    let chat_path = "/v1/chat/completions";

    let cases: [(&str, &str, &str, u16, &str); 12] = [
        (
            chat_path,
            "application/json",
            "{not json",
            400,
            "invalid request body",
        ),
        (
            chat_path,
            "application/json",
            "",
            400,
            "invalid request body",
        ),
        (
            chat_path,
            "application/json",
            "[1, 2]",
            400,
            "invalid request body",
        ),
        (
            chat_path,
            "application/json",
            r#"{"model":"sim"}"#,
            400,
            "messages",
        ),
        (
            chat_path,
            "text/plain",
            r#"{"model":"sim","messages":[{"role":"user","content":"Hi"}]}"#,
            400,
            "Content-Type",
        ),
        (
            chat_path,
            "application/json",
            r#"{"model":"sim","messages":[{"role":"user","content":"Hi"}],"max_tokens":18446744073709551616}"#,
            400,
            "invalid request body",
        ),
        (
            chat_path,
            "application/json",
            r#"{"model":"sim","messages":[{"role":"user","content":"Hi"}],"max_tokens":-1}"#,
            400,
            "invalid request body",
        ),
        (
            chat_path,
            "application/json",
            r#"{"model":"sim","messages":[{"role":"user","content":"Hi"}],"max_tokens":0}"#,
            400,
            "max_tokens",
        ),
        (
            chat_path,
            "application/json",
            r#"{"model":"sim","messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":5000}"#,
            400,
            "maximum context length is 4096 tokens",
        ),
        (
            chat_path,
            "application/json",
            r#"{"model":"sim","messages":[]}"#,
            400,
            "at least one message",
        ),
        (
            chat_path,
            "application/json",
            r#"{"model":"sim","messages":[{"role":"user","content":"Hi"}],"n":2}"#,
            400,
            "one choice",
        ),
        (
            "/v1/completions",
            "application/json",
            r#"{"model":"sim","prompt":["a","b"]}"#,
            400,
            "one prompt",
        ),
    ];
    for (path, content_type, body, status, message) in cases {
        let answer = client.post_raw(path, content_type, body).await;
        assert_eq!(answer.status, status, "{body}: {answer:?}");
        assert_eq!(answer.header("content-type"), Some("application/json"));
        let error = &answer.json()["error"];
        assert_eq!(error["type"], "invalid_request_error", "{body}");
        assert!(
            error["message"].as_str().unwrap().contains(message),
            "{body}: {error}"
        );
    }
    let answer = within(client.http.get(format!("{}{chat_path}", client.url)).send())
        .await
        .unwrap();
    assert_eq!(answer.status(), 405);
    let answer = within(client.http.get(format!("{}/health", client.url)).send())
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);

    // Whole answers, both APIs.
    let answer = within(client.post(chat_path, None, &chat(5, false))).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let whole = answer.json();
    assert_eq!(whole["object"], "chat.completion");
    assert!(whole["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text.split_whitespace().count(), 5, "{text:?}");
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    let usage = &whole["usage"];
    assert_eq!(usage["completion_tokens"], 5);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().unwrap() + 5)
    );

    let answer = within(client.post(
        "/v1/completions",
        None,
        &json!({"model": "sim", "prompt": "Once upon a time", "stream": true,
                "stream_options": {"include_usage": true}}),
    ))
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let events = answer.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    // The default length (64 tokens, ended by the "model"), a finish
    // chunk, a usage chunk.
    assert_eq!(chunks.len(), 64 + 2, "{events:?}");
    assert!(
        chunks
            .iter()
            .all(|chunk| chunk["object"] == "text_completion")
    );
    assert_eq!(chunks[64]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[65]["choices"], json!([]));
    assert_eq!(chunks[65]["usage"]["completion_tokens"], 64);
    assert_eq!(chunks[65]["usage"]["prompt_tokens"], 4);

    // SIGTERM: the server stops taking connections and exits cleanly.
    server.process.terminate();
    let (status, _, stderr) = server.process.wait();
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
}

// Multi-threaded: the blocking wait for the child's exit must not stop
// the client's connection tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_and_environment_configure_the_gate_and_the_overload_status() {
    // The engine request limit from its alias, the queue limit from its
    // canonical variable (trimmed), an invalid waiting limit (a warning,
    // then the default), and the status from its flag.
    let mut server = support::server(
        "openai_server",
        &[
            "--max-num-seqs",
            "8",
            "--overload-status",
            "503",
            "--max-model-len",
            "1000000",
        ],
        &[
            ("DYN_ENGINE_REQUEST_LIMIT", "1"),
            ("DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT", "lots"),
            ("DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT", " 0 "),
        ],
    );
    assert!(
        server.banner.contains(
            "per rank engine request limit 1, engine request waiting limit 8, request queue limit 0; overload status 503"
        ),
        "{}",
        server.banner
    );
    // Where each came from, and what unranked requests get.
    assert!(
        server.banner.contains(
            "admission limits in force: 1 rank (reported: max_num_seqs 8, dp_ranks 1); per rank: \
             engine request limit 1 (variable DYN_ENGINE_REQUEST_LIMIT), \
             engine request waiting limit 8 (default: the reported max_num_seqs), \
             request queue limit 0 (variable DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT)"
        ),
        "{}",
        server.banner
    );
    let client = Client::new(&server);
    let held = client.hold(None).await;
    let answer = within(client.post("/v1/chat/completions", None, &chat(4, true))).await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert_eq!(answer.json()["error"]["code"], 503);

    drop(held);
    server.process.terminate();
    let (_, _, stderr) = server.process.wait();
    assert!(
        stderr.contains("DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT")
            && stderr.contains("lots"),
        "the invalid variable is named in a warning: {stderr}"
    );

    // An invalid flag fails startup, naming it.
    let (status, _, stderr) = support::run("openai_server", &["--engine-request-limit", "0"]);
    assert!(!status.success());
    assert!(stderr.contains("--engine-request-limit"), "{stderr}");
}
