//! The sidecar (the `tower-admission` binary) in front of a real
//! engine: llama.cpp's `llama-server` on a tiny random-weight model
//! (`scripts/llama/`), over real sockets, with real clients.
//!
//! On its own, llama.cpp queues every request beyond its slots inside
//! itself, without bound and without a response head
//! (`llamacpp:requests_deferred`). Through the sidecar the excess waits
//! outside the engine in a bounded queue, the rest is answered `529` at
//! once, and the engine's hidden queue stays empty.
//!
//! The engine comes from `LLAMA_SERVER` (the binary) and `LLAMA_TINY_MODEL`
//! (the model), which `eval "$(bash scripts/llama/setup.sh)"` exports.
//! Without them each test is skipped, saying so; `REQUIRE_LLAMA_SERVER=1`
//! (set by `.ci/run`) makes their absence a failure, so CI never skips.

use tower_admission_testkit as support;
use tower_admission_testkit::exposition;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use support::{PATIENCE, Process, within};

use exposition::Exposition;

const REQUIRE: &str = "REQUIRE_LLAMA_SERVER";

/// Slots of every engine started here (`--parallel`).
const SLOTS: usize = 2;

/// Context of the engine, split between its slots: 32,768 tokens a slot,
/// so a request for [`LONG`] tokens runs for many seconds (the tiny model
/// writes about 2,000 tokens a second on one thread).
const CONTEXT: usize = 65_536;

/// Output tokens of a request that outlives any step of a test.
const LONG: usize = 30_000;

/// One engine at a time: each test starts its own, and two cores do not
/// run two engines, two sidecars and their clients without the timings of
/// each getting in the way of the other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The engine's binary and model, or why the test is skipped.
fn engine_files() -> Option<(PathBuf, PathBuf)> {
    let binary = std::env::var_os("LLAMA_SERVER").map(PathBuf::from);
    let model = std::env::var_os("LLAMA_TINY_MODEL").map(PathBuf::from);
    let install = "eval \"$(bash scripts/llama/setup.sh)\"";
    let reason = match (&binary, &model) {
        (Some(binary), Some(model)) if binary.is_file() && model.is_file() => {
            return Some((binary.clone(), model.clone()));
        }
        (None, _) | (_, None) => "LLAMA_SERVER and LLAMA_TINY_MODEL are not both set".to_owned(),
        (Some(binary), Some(model)) => {
            format!("{} or {} is not a file", binary.display(), model.display())
        }
    };
    if std::env::var_os(REQUIRE).is_some_and(|value| value == "1") {
        panic!("{reason}\n{REQUIRE}=1 requires this test: {install}");
    }
    eprintln!("skipped: {reason}; {install} to run it");
    None
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Engine {
    url: String,
    _process: Process,
}

/// Starts `llama-server` and waits until its model is loaded (`/health`
/// answers 200; it answers 503 "Loading model" before).
async fn start_engine(client: &reqwest::Client) -> Option<Engine> {
    let (binary, model) = engine_files()?;
    let port = free_port().to_string();
    let model = model.to_str().unwrap().to_owned();
    let slots = SLOTS.to_string();
    let context = CONTEXT.to_string();
    let process = Process::spawn(
        &binary,
        &[
            "-m",
            &model,
            "--host",
            "127.0.0.1",
            "--port",
            &port,
            "--parallel",
            &slots,
            "-c",
            &context,
            "--metrics",
            "-t",
            "1",
            "--ignore-eos",
            "--no-webui",
        ],
        &[],
    );
    let url = format!("http://127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Ok(response) = client.get(format!("{url}/health")).send().await {
            if response.status() == 200 {
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "llama-server never became healthy; stderr:\n{}",
            process.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Some(Engine {
        url,
        _process: process,
    })
}

struct Sidecar {
    url: String,
    process: Process,
}

/// Starts the `tower-admission` binary in front of `engine`.
fn start_sidecar(engine: &Engine, args: &[&str]) -> Sidecar {
    let mut all = vec!["--listen", "127.0.0.1:0", "--upstream", &engine.url];
    all.extend_from_slice(args);
    let process = Process::spawn(
        env!("CARGO_BIN_EXE_tower-admission").as_ref(),
        &all,
        &[("RUST_LOG", "info")],
    );
    let url = process.listening_url();
    Sidecar { url, process }
}

/// [`exposition::scrape`], within the test's patience.
async fn scrape(client: &reqwest::Client, url: &str) -> Exposition {
    within(exposition::scrape(client, url)).await
}

/// The sum of a sidecar series over its `dp_rank`s (ranked and unranked).
fn total(metrics: &Exposition, suffix: &str) -> f64 {
    let name = format!("{}_{suffix}", tower_admission::metrics::DEFAULT_PREFIX);
    metrics.sum(&name, &[])
}

/// The engine's own gauges: (`requests_processing`, `requests_deferred`).
async fn engine_load(client: &reqwest::Client, engine: &Engine) -> (f64, f64) {
    let metrics = scrape(client, &engine.url).await;
    (
        metrics.value("llamacpp:requests_processing", &[]),
        metrics.value("llamacpp:requests_deferred", &[]),
    )
}

/// Waits until the sidecar has learned the engine's slots from `/props`.
async fn capacity_learned(client: &reqwest::Client, sidecar: &Sidecar) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let metrics = scrape(client, &sidecar.url).await;
        let limit = format!(
            "{}_engine_request_limit",
            tower_admission::metrics::DEFAULT_PREFIX
        );
        if metrics
            .samples
            .get(&(limit, [("dp_rank".to_owned(), "0".to_owned())].into()))
            == Some(&(SLOTS as f64))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sidecar never learned the capacity; stderr:\n{}",
            sidecar.process.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn chat(max_tokens: usize, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": "tiny",
        "stream": stream,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Tell me about admission control."}],
    })
}

async fn post_chat(
    client: &reqwest::Client,
    url: &str,
    max_tokens: usize,
    stream: bool,
) -> reqwest::Response {
    within(
        client
            .post(format!("{url}/v1/chat/completions"))
            .json(&chat(max_tokens, stream))
            .send(),
    )
    .await
    .unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// Polls `condition` until it holds, within the test's patience.
async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads an SSE response to its end; returns the `data:` payloads.
async fn events(response: reqwest::Response) -> Vec<String> {
    let text = within(response.text()).await.unwrap();
    text.split("\n\n")
        .filter_map(|event| event.trim().strip_prefix("data: ").map(str::to_owned))
        .collect()
}

/// One engine and a sidecar in front of it that has learned its capacity,
/// for one test at a time; `None` when the engine is absent (skipped).
struct Rig {
    client: reqwest::Client,
    engine: Engine,
    sidecar: Sidecar,
    _one: tokio::sync::MutexGuard<'static, ()>,
}

async fn rig(sidecar_args: &[&str]) -> Option<Rig> {
    let one = ONE_AT_A_TIME.lock().await;
    let client = client();
    let engine = start_engine(&client).await?;
    let sidecar = start_sidecar(&engine, sidecar_args);
    capacity_learned(&client, &sidecar).await;
    Some(Rig {
        client,
        engine,
        sidecar,
        _one: one,
    })
}

/// Waits until the sidecar's gate holds no request.
async fn gate_released(client: &reqwest::Client, sidecar: &Sidecar) {
    eventually("the gate releases it", || async {
        total(&scrape(client, &sidecar.url).await, "engine_request_count") == 0.0
    })
    .await;
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capacity_is_learned_from_props() {
    let Some(Rig {
        client,
        engine: _engine,
        sidecar,
        _one,
    }) = rig(&[]).await
    else {
        return;
    };
    let metrics = scrape(&client, &sidecar.url).await;
    let rank0 = [("dp_rank", "0")];
    let prefix = tower_admission::metrics::DEFAULT_PREFIX;
    assert_eq!(
        metrics.value(&format!("{prefix}_engine_request_waiting_limit"), &rank0),
        SLOTS as f64
    );
    assert_eq!(
        metrics.value(&format!("{prefix}_request_queue_limit"), &rank0),
        (2 * SLOTS) as f64,
        "the default queue follows the reported capacity"
    );
    let stderr = sidecar.process.stderr();
    assert!(
        stderr.contains("engine capacity from llama.cpp GET /props total_slots"),
        "the log says where the capacity came from:\n{stderr}"
    );
    // Routes that are not generations pass through: the engine's own.
    let props: serde_json::Value = within(client.get(format!("{}/props", sidecar.url)).send())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(props["total_slots"], SLOTS);
    let health = within(client.get(format!("{}/health", sidecar.url)).send())
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_beyond_the_slots_streams_slots_plus_queue_and_the_rest_get_529_at_once() {
    let queue = 2;
    let Some(Rig {
        client,
        engine,
        sidecar,
        _one,
    }) = rig(&["--request-queue-limit", "2"]).await
    else {
        return;
    };

    // Long enough that the whole burst arrives while the first ones run.
    let burst = 10;
    let tokens = 600;
    let sent: Vec<_> = (0..burst)
        .map(|_| {
            let (client, url) = (client.clone(), sidecar.url.clone());
            tokio::spawn(async move {
                let response = post_chat(&client, &url, tokens, true).await;
                let status = response.status();
                let answered = tokio::time::Instant::now();
                let events = if status == 200 {
                    events(response).await
                } else {
                    vec![within(response.text()).await.unwrap()]
                };
                (status, answered, events, tokio::time::Instant::now())
            })
        })
        .collect();

    // The engine's hidden queue stays empty all along.
    let mut deferred_max = 0.0f64;
    let mut processing_max = 0.0f64;
    while !sent.iter().all(tokio::task::JoinHandle::is_finished) {
        let (processing, deferred) = engine_load(&client, &engine).await;
        deferred_max = deferred_max.max(deferred);
        processing_max = processing_max.max(processing);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut results = Vec::new();
    for handle in sent {
        results.push(handle.await.unwrap());
    }
    let streamed: Vec<_> = results.iter().filter(|r| r.0 == 200).collect();
    let rejected: Vec<_> = results.iter().filter(|r| r.0 == 529).collect();
    for (status, _, body, _) in &results {
        assert!(*status == 200 || *status == 529, "{status}: {body:?}");
    }
    assert_eq!(streamed.len(), SLOTS + queue, "{:?}", statuses(&results));
    assert_eq!(
        rejected.len(),
        burst - SLOTS - queue,
        "{:?}",
        statuses(&results)
    );
    for (_, _, events, _) in &streamed {
        assert_eq!(
            events.last().map(String::as_str),
            Some("[DONE]"),
            "streamed whole"
        );
        let content = events
            .iter()
            .filter(|event| event.contains("\"content\":\""))
            .count();
        assert_eq!(content, tokens, "every token of the answer");
    }
    // "At once": every rejection was answered before any stream ended.
    let first_end = streamed.iter().map(|r| r.3).min().unwrap();
    for (_, answered, body, _) in &rejected {
        assert!(*answered < first_end, "a 529 waited for a stream to end");
        let json: serde_json::Value = serde_json::from_str(&body[0]).unwrap();
        assert_eq!(json["error"]["type"], "overloaded");
    }
    assert_eq!(deferred_max, 0.0, "requests waited inside the engine");
    assert!(processing_max <= SLOTS as f64);
}

fn statuses(
    results: &[(
        reqwest::StatusCode,
        tokio::time::Instant,
        Vec<String>,
        tokio::time::Instant,
    )],
) -> Vec<u16> {
    results.iter().map(|r| r.0.as_u16()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_client_that_leaves_frees_its_slot_and_the_gate() {
    let Some(Rig {
        client,
        engine,
        sidecar,
        _one,
    }) = rig(&[]).await
    else {
        return;
    };

    let response = post_chat(&client, &sidecar.url, LONG, true).await;
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("\"content\":\"") {
        let chunk = within(stream.next()).await.unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert_eq!(engine_load(&client, &engine).await.0, 1.0);
    let metrics = scrape(&client, &sidecar.url).await;
    assert_eq!(total(&metrics, "engine_request_count"), 1.0);
    assert_eq!(
        total(&metrics, "engine_request_waiting_count"),
        0.0,
        "first token seen"
    );

    let left = tokio::time::Instant::now();
    drop(stream);
    eventually("the engine stops generating", || async {
        engine_load(&client, &engine).await.0 == 0.0
    })
    .await;
    // Far sooner than the answer would have taken (~15 s for LONG tokens).
    assert!(
        left.elapsed() < Duration::from_secs(5),
        "{:?}",
        left.elapsed()
    );
    gate_released(&client, &sidecar).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_client_that_leaves_never_reaches_the_engine() {
    let Some(Rig {
        client,
        engine,
        sidecar,
        _one,
    }) = rig(&[]).await
    else {
        return;
    };

    // Both slots busy with long streams.
    let mut running = Vec::new();
    for _ in 0..SLOTS {
        let response = post_chat(&client, &sidecar.url, LONG, true).await;
        running.push(response.bytes_stream());
    }
    eventually("both slots run", || async {
        engine_load(&client, &engine).await.0 == SLOTS as f64
    })
    .await;

    let queued = tokio::spawn({
        let (client, url) = (client.clone(), sidecar.url.clone());
        async move { post_chat(&client, &url, 8, true).await }
    });
    eventually("the third is queued in the sidecar", || async {
        total(&scrape(&client, &sidecar.url).await, "request_queue_count") == 1.0
    })
    .await;
    assert_eq!(engine_load(&client, &engine).await, (SLOTS as f64, 0.0));
    queued.abort(); // the client gives up
    eventually("its queue place is freed", || async {
        let metrics = scrape(&client, &sidecar.url).await;
        total(&metrics, "request_queue_count") == 0.0
            && total(&metrics, "cancellation_total") == 1.0
    })
    .await;

    // The slots free; the engine never hears of the third: had it been
    // forwarded, it would wait in llama.cpp's own queue (deferred) behind
    // the two running ones, and take a slot once they end.
    drop(running);
    let mut idle_reads = 0;
    while idle_reads < 20 {
        let (processing, deferred) = engine_load(&client, &engine).await;
        assert_eq!(deferred, 0.0, "a request reached the engine's own queue");
        assert!(processing <= SLOTS as f64);
        if processing == 0.0 {
            idle_reads += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let metrics = scrape(&client, &sidecar.url).await;
    assert_eq!(total(&metrics, "engine_request_count"), 0.0);
    assert_eq!(total(&metrics, "request_receive_total"), 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streaming_client_that_leaves_is_cancelled_upstream_at_once() {
    let Some(Rig {
        client,
        engine,
        sidecar,
        _one,
    }) = rig(&[]).await
    else {
        return;
    };

    // A client that sends its request and hangs up before the answer:
    // over a plain socket, so that leaving means closing the connection.
    let body = chat(LONG, false).to_string();
    let address = sidecar.url.strip_prefix("http://").unwrap();
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {address}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    use tokio::io::AsyncWriteExt;
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(body.as_bytes()).await.unwrap();
    eventually("the engine runs it", || async {
        engine_load(&client, &engine).await.0 == 1.0
    })
    .await;
    let left = tokio::time::Instant::now();
    drop(socket); // the client leaves before the answer's head
    // The sidecar closes its engine connection at once. llama.cpp looks at
    // the connection of a non-streaming request when it has waited a
    // second for results without any arriving, and the answer to each
    // `/metrics` read is such a result: read it every two seconds here,
    // or the engine would never look.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while engine_load(&client, &engine).await.0 != 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the engine never stopped generating"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // Far sooner than the answer would have taken (~15 s for LONG tokens).
    assert!(
        left.elapsed() < Duration::from_secs(8),
        "{:?}",
        left.elapsed()
    );
    gate_released(&client, &sidecar).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_streams_through_the_sidecar() {
    let python = Command::new("python3")
        .args(["-c", "import openai"])
        .stdin(Stdio::null())
        .output();
    if !python.as_ref().is_ok_and(|output| output.status.success()) {
        let reason = "python3 cannot import openai (pip install openai)";
        if std::env::var_os("REQUIRE_OPENAI_CLIENT").is_some_and(|value| value == "1") {
            panic!("{reason}; REQUIRE_OPENAI_CLIENT=1 requires this test");
        }
        eprintln!("skipped: {reason}");
        return;
    }
    let Some(Rig {
        sidecar,
        engine: _engine,
        _one,
        ..
    }) = rig(&["--request-queue-limit", "0"]).await
    else {
        return;
    };
    let base = format!("{}/v1", sidecar.url);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/openai_sidecar.py"
    );
    let mut process = Process::spawn("python3".as_ref(), &[script, &base], &[]);
    let (status, stdout, stderr) = process.wait();
    assert!(status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for check in ["ok stream", "ok whole", "ok overload"] {
        assert!(stdout.contains(check), "{check} missing:\n{stdout}");
    }
}
