//! The sidecar (`tower-admission`) in front of a real vLLM: the CPU build
//! of vLLM 0.32 serving a tiny random-weight Llama (`scripts/vllm/`), over
//! real sockets, with real clients.
//!
//! On its own, vLLM queues every request beyond `--max-num-seqs` inside
//! itself, without bound (`vllm:num_requests_waiting`). Through the
//! sidecar the excess waits outside the engine in a bounded queue, the rest
//! is answered `529` at once, and vLLM's own queue stays empty.
//!
//! vLLM comes from `VLLM_BIN` and `VLLM_TINY_MODEL` (and `VLLM_PYTHON`, the
//! virtualenv's Python, for the `openai` SDK), which
//! `eval "$(bash scripts/vllm/setup.sh)"` exports. Without them each test
//! is skipped, saying so; `REQUIRE_VLLM=1` (set by `.ci/run`) makes their
//! absence a failure, so CI never skips.
//!
//! vLLM takes about a minute to start, so the tests of one engine
//! configuration share one server ([`vllm::engine`]), one test at a time;
//! the modules group them by configuration (`kv_reservation`, `one_rank`,
//! `queue_cap`, `two_ranks`: libtest runs them in name order), so each configuration
//! starts once. Each test starts its own sidecar (milliseconds).

#[path = "support/vllm.rs"]
mod vllm;

use tower_admission_testkit as support;
use tower_admission_testkit::exposition;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use support::{PATIENCE, Process, within};
use tokio::time::Instant;

use exposition::Exposition;
use vllm::VllmMetrics;

// The rig: processes, SSE reads, metrics polls.
include!("support/vllm_rig.rs");

/// Against a vLLM with a KV cache smaller than four requests need.
#[path = "vllm/kv_reservation.rs"]
mod kv_reservation;

/// The router view, against the same server as `one_rank` (libtest runs
/// `one_rank::` before `one_rank_router_view::`).
#[path = "vllm/router_view.rs"]
mod one_rank_router_view;

/// Tests against one vLLM server with `--max-num-seqs 4`.
mod one_rank {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_16_streams_8_stream_8_get_529_at_once_and_vllm_never_queues() {
        let Some(rig) = rig(&[], &SIDECAR_ONE_RANK, false).await else {
            return;
        };
        let (n, queue, tokens) = (16, 4, 200);
        // Through the sidecar.
        let before = queue_times(&rig.vllm().await);
        let (answers, polls) = burst(&rig.client, &rig.sidecar.url, &rig.engine, n, tokens).await;
        let statuses: Vec<u16> = answers.iter().map(|answer| answer.status).collect();
        let streamed: Vec<&Answer> = answers.iter().filter(|a| a.status == 200).collect();
        let rejected: Vec<&Answer> = answers.iter().filter(|a| a.status == 529).collect();
        assert_eq!(streamed.len(), SEQS + queue, "{statuses:?}");
        assert_eq!(rejected.len(), n - SEQS - queue, "{statuses:?}");
        for answer in &streamed {
            assert_whole(&answer.events, tokens);
        }
        // "At once": every rejection was answered before any stream ended.
        let first_end = streamed.iter().map(|answer| answer.ended).min().unwrap();
        for answer in &rejected {
            assert!(
                answer.answered < first_end,
                "a 529 waited for a stream to end"
            );
            let json: serde_json::Value = serde_json::from_str(&answer.events[0]).unwrap();
            assert_eq!(json["error"]["type"], "overloaded", "{json}");
        }
        // vLLM's own queue stayed empty at every read, reads 50 ms apart,
        // while it ran all it could.
        assert_on_schedule(&polls);
        let waiting_max = polls.iter().map(|poll| poll.waiting).fold(0.0, f64::max);
        let running_max = polls.iter().map(|poll| poll.running).fold(0.0, f64::max);
        eprintln!(
            "through the sidecar: {} reads, {} over 100 ms after the one before; vLLM running at most {running_max}, waiting at most {waiting_max}",
            polls.len(),
            late_reads(&polls).len()
        );
        assert_eq!(waiting_max, 0.0, "requests waited inside vLLM: {polls:?}");
        assert_eq!(running_max, SEQS as f64, "vLLM never ran {SEQS} at once");
        // And by vLLM's own account, none of the eight waited in its queue.
        let streams = (SEQS + queue) as f64;
        eventually("vLLM has recorded the eight", PATIENCE, || async {
            queue_times(&rig.vllm().await).0 == before.0 + streams
        })
        .await;
        let after = queue_times(&rig.vllm().await);
        assert_eq!(
            after.1 - before.1,
            streams,
            "requests waited over 0.3 s in vLLM's queue"
        );
        rig.idle().await;

        // The same burst straight to vLLM: it queues them itself.
        let before = queue_times(&rig.vllm().await);
        let (answers, polls) = burst(&rig.client, &rig.engine, &rig.engine, n, tokens).await;
        for answer in &answers {
            assert_eq!(answer.status, 200);
            assert_whole(&answer.events, tokens);
        }
        assert_on_schedule(&polls);
        let waiting_max = polls.iter().map(|poll| poll.waiting).fold(0.0, f64::max);
        eventually("vLLM has recorded the sixteen", PATIENCE, || async {
            queue_times(&rig.vllm().await).0 == before.0 + n as f64
        })
        .await;
        let after = queue_times(&rig.vllm().await);
        let waited = n as f64 - (after.1 - before.1);
        eprintln!(
            "straight to vLLM: {} reads, {} late; vLLM waiting at most {waiting_max}; {waited} of {n} waited over 0.3 s in its queue",
            polls.len(),
            late_reads(&polls).len()
        );
        assert!(waiting_max > 0.0, "vLLM never queued: {polls:?}");
        assert!(
            waited >= 8.0,
            "only {waited} waited over 0.3 s in vLLM's queue"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_streaming_client_that_leaves_is_aborted_in_vllm_and_frees_the_gate_at_once() {
        let Some(rig) = rig(&[], &SIDECAR_ONE_RANK, false).await else {
            return;
        };
        let stream = running_stream(&rig.client, &rig.sidecar.url, &[]).await;
        eventually("vLLM runs it", PATIENCE, || async {
            rig.vllm().await.running(None) == 1.0
        })
        .await;
        let gate = rig.gate().await;
        assert_eq!(gate_sum(&gate, "engine_request_count", None), 1.0);
        assert_eq!(
            gate_sum(&gate, "engine_request_waiting_count", None),
            0.0,
            "text seen"
        );

        let left = Instant::now();
        drop(stream);
        // Both read every 20 ms from the moment the client left.
        let (mut gate_free, mut vllm_free) = (None, None);
        while gate_free.is_none() || vllm_free.is_none() {
            let elapsed = left.elapsed();
            assert!(
                elapsed <= Duration::from_secs(1),
                "after {elapsed:?}: the gate free after {gate_free:?}, vLLM running 0 after {vllm_free:?}"
            );
            if gate_free.is_none()
                && gate_sum(&rig.gate().await, "engine_request_count", None) == 0.0
            {
                gate_free = Some(left.elapsed());
            }
            if vllm_free.is_none() && rig.vllm().await.running(None) == 0.0 {
                vllm_free = Some(left.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!(
            "left mid-stream: the gate free after {gate_free:?}, vLLM running 0 after {vllm_free:?}"
        );
        // And the freed slot admits the next request at once.
        let next = running_stream(&rig.client, &rig.sidecar.url, &[]).await;
        drop(next);
        rig.idle().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_leaves_while_queued_in_the_sidecar_never_reaches_vllm() {
        let Some(rig) = rig(&[], &SIDECAR_ONE_RANK, false).await else {
            return;
        };
        let before = rig.vllm().await;
        let mut running = Vec::new();
        for _ in 0..SEQS {
            running.push(running_stream(&rig.client, &rig.sidecar.url, &[]).await);
        }
        let queued = tokio::spawn({
            let (client, url) = (rig.client.clone(), rig.sidecar.url.clone());
            async move { post(&client, &url, &chat(8, true), &[]).await.status() }
        });
        eventually("the fifth is queued in the sidecar", PATIENCE, || async {
            gate_sum(&rig.gate().await, "request_queue_count", None) == 1.0
        })
        .await;
        let vllm_now = rig.vllm().await;
        assert_eq!(
            (vllm_now.running(None), vllm_now.waiting(None)),
            (SEQS as f64, 0.0)
        );
        queued.abort(); // the client gives up
        eventually("its queue place is freed", PATIENCE, || async {
            let gate = rig.gate().await;
            gate_sum(&gate, "request_queue_count", None) == 0.0
                && gate_sum(&gate, "cancellation_total", None) == 1.0
        })
        .await;

        // The slots free. Had the fifth been forwarded, vLLM would have
        // queued it behind the four and then run it.
        drop(running);
        rig.idle().await;
        let expected = before.chat_requests() + SEQS as f64;
        eventually("vLLM has counted the four", PATIENCE, || async {
            rig.vllm().await.chat_requests() == expected
        })
        .await;
        // A second of quiet reads: nothing more arrives.
        let quiet = Instant::now();
        while quiet.elapsed() < Duration::from_secs(1) {
            let now = rig.vllm().await;
            assert_eq!(
                now.chat_requests(),
                expected,
                "a fifth request reached vLLM"
            );
            assert_eq!((now.running(None), now.waiting(None)), (0.0, 0.0));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let after = rig.vllm().await;
        assert_eq!(
            after.finished(None),
            before.finished(None),
            "vLLM finished none of them (the four were aborted)"
        );
        let gate = rig.gate().await;
        assert_eq!(gate_sum(&gate, "request_receive_total", None), 5.0);
        assert_eq!(gate_sum(&gate, "request_admit_total", None), 4.0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_non_streaming_client_that_leaves_is_aborted_in_vllm() {
        let Some(rig) = rig(&[], &SIDECAR_ONE_RANK, false).await else {
            return;
        };
        // A client that sends its request and hangs up before the answer:
        // over a plain socket, so that leaving means closing the connection.
        let body = chat(LONG, false).to_string();
        let address = rig.sidecar.url.strip_prefix("http://").unwrap();
        let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {address}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        use tokio::io::AsyncWriteExt;
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(body.as_bytes()).await.unwrap();
        eventually("vLLM runs it", PATIENCE, || async {
            rig.vllm().await.running(None) == 1.0
        })
        .await;
        assert_eq!(
            gate_sum(&rig.gate().await, "engine_request_count", None),
            1.0
        );
        let before = rig.vllm().await.finished(None);
        drop(socket); // the client leaves before the answer
        let stopped = eventually("vLLM aborts it", Duration::from_secs(2), || async {
            rig.vllm().await.running(None) == 0.0
        })
        .await;
        eprintln!("left before a non-streaming answer: vLLM running 0 after {stopped:?}");
        eventually(
            "the gate frees its slot",
            Duration::from_secs(1),
            || async { gate_sum(&rig.gate().await, "engine_request_count", None) == 0.0 },
        )
        .await;
        // Aborted, not finished: LONG tokens would take many seconds.
        assert_eq!(rig.vllm().await.finished(None), before);
        rig.idle().await;
    }

    /// The official `openai` Python SDK (a dependency vLLM pins, in the
    /// virtualenv of `scripts/vllm/setup.sh`): streamed, whole, and a 529 it
    /// reports as an `APIStatusError`.
    const OPENAI_SCRIPT: &str = r#"
import sys
import openai

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=60.0)
messages = [{"role": "user", "content": "Say something about admission control."}]
extra = {"ignore_eos": True}

# Streamed: vLLM sends a role-only first chunk, text chunks (one or more
# tokens each), a finish chunk, the usage chunk asked for, then [DONE].
stream = client.chat.completions.create(
    model="tiny", messages=messages, max_tokens=16, stream=True,
    stream_options={"include_usage": True}, extra_body=extra,
)
chunks = list(stream)
assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
assert text, chunks
assert finish == ["length"], finish
assert chunks[-1].usage.completion_tokens == 16, chunks[-1]
print(f"ok stream: {len(chunks)} chunks, {len(text)} characters")

whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, extra_body=extra)
assert whole.choices[0].message.content, whole
assert whole.usage.completion_tokens == 8, whole.usage
assert whole.choices[0].finish_reason == "length", whole
print("ok whole: 8 completion tokens")

# Every sequence busy, no queue: the next is an overload, at once.
held = []
try:
    for _ in range(int(sys.argv[2])):
        s = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=1500, stream=True, extra_body=extra
        )
        next(iter(s))
        held.append(s)
    try:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, extra_body=extra)
    except openai.APIStatusError as error:
        assert error.status_code == 529, error.status_code
        assert error.response.headers["x-admission-rejection-scope"] == "worker"
        assert error.response.headers["retry-after"] == "1"
        assert "x-admission-origin" not in error.response.headers, dict(error.response.headers)
        body = error.response.json()
        assert body["error"]["type"] == "overloaded", body
        print("ok overload: 529, worker scope, Retry-After 1")
    else:
        raise AssertionError("the request beyond the sequences was not rejected")
finally:
    for s in held:
        s.close()
"#;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_openai_python_sdk_streams_and_not_through_the_sidecar() {
        let Some(rig) = rig(
            &[],
            &["--max-num-seqs", "4", "--request-queue-limit", "0"],
            false,
        )
        .await
        else {
            return;
        };
        let python = rig.kit.python.clone();
        let imports = std::process::Command::new(&python)
            .args(["-c", "import openai"])
            .stdin(std::process::Stdio::null())
            .output();
        if !imports.as_ref().is_ok_and(|output| output.status.success()) {
            vllm::skip(&format!(
                "{} cannot import openai (a pinned package of scripts/vllm/requirements.txt)",
                python.display()
            ));
            return;
        }
        let base = format!("{}/v1", rig.sidecar.url);
        let seqs = SEQS.to_string();
        let mut process = Process::spawn(&python, &["-c", OPENAI_SCRIPT, &base, &seqs], &[]);
        let (status, stdout, stderr) = process.wait();
        assert!(status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
        for check in ["ok stream", "ok whole", "ok overload"] {
            assert!(stdout.contains(check), "{check} missing:\n{stdout}");
        }
        rig.idle().await;
    }
}

/// What one request of a burst against vLLM's own queue cap came to.
enum Outcome {
    /// Streaming text: vLLM runs it.
    Running(Sse),
    /// `200` whose stream carried vLLM's error event, then ended.
    ErrorEvent(Vec<String>),
    /// An error answer: status, `x-admission-origin`, body.
    Refused(u16, String, String),
}

/// Tests against vLLM with `--max-num-queued-reqs 2`: it takes two
/// requests (running and waiting together) and refuses the rest, below the
/// sidecar's limits (four running, four queued).
mod queue_cap {
    use super::*;

    const CAP: usize = 2;

    async fn send(client: &reqwest::Client, url: &str) -> Outcome {
        let response = post(client, url, &chat(LONG, true), &[]).await;
        let status = response.status().as_u16();
        let origin = response
            .headers()
            .get("x-admission-origin")
            .map(|value| value.to_str().unwrap().to_owned())
            .unwrap_or_default();
        if status != 200 {
            return Outcome::Refused(status, origin, within(response.text()).await.unwrap());
        }
        let mut sse = Sse::new(response);
        let mut events = Vec::new();
        loop {
            match sse.next().await {
                Some(event) if has_content(&event) => return Outcome::Running(sse),
                Some(event) => events.push(event),
                None => return Outcome::ErrorEvent(events),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn vllm_s_own_refusals_reach_the_client_as_the_engine_s_and_release_the_gate() {
        let cap = CAP.to_string();
        let Some(rig) = rig(&["--max-num-queued-reqs", &cap], &SIDECAR_ONE_RANK, false).await
        else {
            return;
        };
        let rejections = |metrics: &VllmMetrics| {
            metrics.sum(
                "vllm:admission_rejections_total",
                &[("reason", "max_num_queued_reqs")],
            )
        };
        let refused_before = rejections(&rig.vllm().await);

        // Four arrive together: the gate admits all four (its limit is
        // four), vLLM takes two and refuses two, usually after its stream
        // has begun: 200, then `data: {"error": …}` and `data: [DONE]`.
        // Sent again (at most three times) until a refusal came that way.
        let mut refused = 0;
        let mut running = Vec::new();
        let mut error_events = Vec::new();
        for attempt in 1..=3 {
            let sent: Vec<_> = (0..SEQS)
                .map(|_| {
                    let (client, url) = (rig.client.clone(), rig.sidecar.url.clone());
                    tokio::spawn(async move { send(&client, &url).await })
                })
                .collect();
            let mut described = Vec::new();
            for handle in sent {
                match within(handle).await.unwrap() {
                    Outcome::Running(sse) => {
                        described.push("running".to_owned());
                        running.push(sse);
                    }
                    Outcome::ErrorEvent(events) => {
                        described.push(format!("200 + {events:?}"));
                        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
                        let error = events.iter().find(|event| is_error(event));
                        let error: serde_json::Value =
                            serde_json::from_str(error.expect("an error event")).unwrap();
                        assert_eq!(error["error"]["code"], 503, "{error}");
                        error_events.push(error);
                        refused += 1;
                    }
                    Outcome::Refused(status, origin, body) => {
                        described.push(format!("{status} {origin} {body}"));
                        assert_eq!((status, origin.as_str()), (503, "engine"), "{body}");
                        refused += 1;
                    }
                }
            }
            eprintln!("attempt {attempt}: {described:?}");
            assert_eq!(running.len(), CAP, "{described:?}");
            assert_eq!(described.len() - CAP, SEQS - CAP, "{described:?}");
            if !error_events.is_empty() {
                break;
            }
            assert!(
                attempt < 3,
                "vLLM never refused with an in-stream error event"
            );
            running.clear();
            rig.idle().await;
        }

        // The refused streams ended waiting at their error event and were
        // released at their end: the gate holds the two running, neither
        // waiting.
        eventually("the gate holds only the running two", PATIENCE, || async {
            let gate = rig.gate().await;
            gate_sum(&gate, "engine_request_count", None) == CAP as f64
                && gate_sum(&gate, "engine_request_waiting_count", None) == 0.0
                && gate_sum(&gate, "request_queue_count", None) == 0.0
        })
        .await;

        // vLLM at its cap, the gate not at its limits: a request is
        // admitted, and vLLM answers 503 before any stream, which the client
        // gets as the engine's answer.
        match send(&rig.client, &rig.sidecar.url).await {
            Outcome::Refused(status, origin, body) => {
                assert_eq!(status, 503, "{body}");
                assert_eq!(origin, "engine", "marked as the engine's answer");
                let json: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert_eq!(json["error"]["code"], 503, "{json}");
                refused += 1;
            }
            Outcome::Running(_) => panic!("vLLM ran a third request past its cap"),
            Outcome::ErrorEvent(events) => {
                // Acceptable to vLLM, but not what a request arriving alone
                // at a full engine gets: worth knowing.
                panic!("expected a plain 503, got 200 + {events:?}")
            }
        }
        eventually("vLLM counted every refusal", PATIENCE, || async {
            rejections(&rig.vllm().await) == refused_before + refused as f64
        })
        .await;

        drop(running);
        eventually("the gate's gauges return to 0", PATIENCE, || async {
            let gate = rig.gate().await;
            gate_sum(&gate, "engine_request_count", None) == 0.0
                && gate_sum(&gate, "engine_request_waiting_count", None) == 0.0
                && gate_sum(&gate, "request_queue_count", None) == 0.0
        })
        .await;
        rig.idle().await;
        let gate = rig.gate().await;
        assert_eq!(
            gate_sum(&gate, "rejection_total", None),
            0.0,
            "the gate refused none"
        );
    }
}

/// Tests against vLLM with `--data-parallel-size 2` (two engine cores of
/// four sequences each); the sidecar knows the two ranks and trusts the
/// `x-data-parallel-rank` a router sets.
mod two_ranks {
    use super::*;

    const SIDECAR: [&str; 7] = [
        "--max-num-seqs",
        "4",
        "--data-parallel-size",
        "2",
        "--request-queue-limit",
        "4",
        "--trust-router-headers",
    ];

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ranked_requests_run_on_their_vllm_rank_and_unranked_ones_share_both() {
        let Some(rig) = rig(&["--data-parallel-size", "2"], &SIDECAR, true).await else {
            return;
        };
        let rank1 = [("x-data-parallel-rank", "1")];
        let rank0 = [("x-data-parallel-rank", "0")];

        // Four on rank 1: vLLM runs them on engine "1", the gate counts
        // them on rank 1.
        let mut streams = Vec::new();
        for _ in 0..SEQS {
            streams.push(running_stream(&rig.client, &rig.sidecar.url, &rank1).await);
        }
        eventually("vLLM's rank 1 runs the four", PATIENCE, || async {
            let vllm = rig.vllm().await;
            vllm.running(Some("1")) == SEQS as f64 && vllm.running(Some("0")) == 0.0
        })
        .await;
        let gate = rig.gate().await;
        assert_eq!(
            gate_sum(&gate, "engine_request_count", Some("1")),
            SEQS as f64
        );
        assert_eq!(gate_sum(&gate, "engine_request_count", Some("0")), 0.0);

        // A fifth for rank 1 waits in the gate, not in vLLM's rank 1.
        let queued = tokio::spawn({
            let (client, url) = (rig.client.clone(), rig.sidecar.url.clone());
            async move { post(&client, &url, &chat(8, true), &rank1).await.status() }
        });
        eventually(
            "the fifth for rank 1 is queued in the gate",
            PATIENCE,
            || async { gate_sum(&rig.gate().await, "request_queue_count", Some("1")) == 1.0 },
        )
        .await;
        assert_eq!(rig.vllm().await.waiting(None), 0.0);

        // Rank 1 busy does not hold back rank 0.
        let other = running_stream(&rig.client, &rig.sidecar.url, &rank0).await;
        eventually("vLLM's rank 0 runs it", PATIENCE, || async {
            let vllm = rig.vllm().await;
            vllm.running(Some("0")) == 1.0 && vllm.running(Some("1")) == SEQS as f64
        })
        .await;
        let gate = rig.gate().await;
        assert_eq!(gate_sum(&gate, "engine_request_count", Some("0")), 1.0);
        assert_eq!(gate_sum(&gate, "request_queue_count", Some("1")), 1.0);
        assert_eq!(rig.vllm().await.waiting(None), 0.0);

        queued.abort();
        drop(other);
        drop(streams);
        rig.idle().await;

        // Unranked: twice one rank's sequences are admitted at once, and
        // vLLM spreads them over both of its ranks (below: running on each;
        // how many on which is vLLM's choice, and one may wait there).
        let sent: Vec<_> = (0..2 * SEQS)
            .map(|_| {
                let (client, url) = (rig.client.clone(), rig.sidecar.url.clone());
                tokio::spawn(async move { admitted_stream(&client, &url, &[]).await })
            })
            .collect();
        let mut streams = Vec::new();
        for handle in sent {
            let admitted = tokio::time::timeout(FIRST_TOKEN_PATIENCE, handle).await;
            streams.push(admitted.expect("no answer within the patience").unwrap());
        }
        let gate = rig.gate().await;
        assert_eq!(
            gate_sum(&gate, "engine_request_count", Some("unspecified")),
            (2 * SEQS) as f64
        );
        assert_eq!(gate_sum(&gate, "request_queue_count", None), 0.0);
        eventually("vLLM holds the eight on both ranks", PATIENCE, || async {
            let vllm = rig.vllm().await;
            vllm.running(None) + vllm.waiting(None) == (2 * SEQS) as f64
                && vllm.running(Some("0")) > 0.0
                && vllm.running(Some("1")) > 0.0
        })
        .await;
        let vllm = rig.vllm().await;
        eprintln!(
            "eight unranked: vLLM engine 0 running {} waiting {}, engine 1 running {} waiting {}",
            vllm.running(Some("0")),
            vllm.waiting(Some("0")),
            vllm.running(Some("1")),
            vllm.waiting(Some("1"))
        );
        // A ninth is queued in the gate: the combined capacity is full.
        let ninth = tokio::spawn({
            let (client, url) = (rig.client.clone(), rig.sidecar.url.clone());
            async move { post(&client, &url, &chat(8, true), &[]).await.status() }
        });
        eventually("the ninth is queued in the gate", PATIENCE, || async {
            gate_sum(
                &rig.gate().await,
                "request_queue_count",
                Some("unspecified"),
            ) == 1.0
        })
        .await;
        ninth.abort();
        drop(streams);
        rig.idle().await;
        // Where they finished: vLLM's per-engine counters saw both ranks.
        let vllm = rig.vllm().await;
        assert_eq!(gate_sum(&rig.gate().await, "rejection_total", None), 0.0);
        assert!(vllm.chat_requests() >= (3 * SEQS + 1) as f64);
    }
}
