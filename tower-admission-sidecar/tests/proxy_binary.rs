//! The sidecar's binary (`tower-admission`) as a child process: its flags
//! fail at startup naming the flag and the value, its help, its capacity
//! from the flag or the engine, and its drain on SIGTERM; in front of a
//! real HTTP engine written here. The proxy in this process is in
//! `proxy_sidecar.rs`.

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use tokio::sync::oneshot;
use tower_admission_sidecar::{self as proxy, Upstream, UpstreamUrl};

mod support;
use support::*;

// ---------------------------------------------------------------------------
// The binary's flags.

fn sidecar_binary(args: &[&str]) -> (std::process::ExitStatus, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tower-admission"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn invalid_flags_fail_at_startup_naming_the_flag_and_the_value() {
    for (args, flag, value) in [
        (
            &["--upstream", "https://engine:8000"][..],
            "--upstream",
            "https://engine:8000",
        ),
        (
            &["--upstream", "engine:8000"][..],
            "--upstream",
            "engine:8000",
        ),
        (
            &["--upstream", "http://e", "--engine-request-limit", "0"][..],
            "--engine-request-limit",
            "0",
        ),
        (
            &["--upstream", "http://e", "--max-num-seqs", "-4"][..],
            "--max-num-seqs",
            "-4",
        ),
        (
            &["--upstream", "http://e", "--admit-path", "v1/chat"][..],
            "--admit-path",
            "v1/chat",
        ),
        (
            &["--upstream", "http://e", "--overload-status", "200"][..],
            "--overload-status",
            "200",
        ),
        (
            &["--upstream", "http://e", "--workers", "0"][..],
            "--workers",
            "0",
        ),
    ] {
        let (status, stderr) = sidecar_binary(args);
        assert!(!status.success(), "{args:?} started");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(stderr.contains(value), "{args:?}: {stderr}");
    }
    let (status, stderr) = sidecar_binary(&[]);
    assert!(!status.success());
    assert!(stderr.contains("--upstream"), "{stderr}");
}

#[test]
fn help_lists_the_sidecar_and_admission_flags() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tower-admission"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--listen",
        "--upstream",
        "--max-num-seqs",
        "--data-parallel-size",
        "--admit-path",
        "--trust-router-headers",
        "--merge-engine-metrics",
        "--engine-request-limit",
        "--request-queue-limit",
        "--ttft-objective-ms",
        "--max-total-request-body-bytes",
        "--tenant-limit",
        "--router-view",
        "--engine-scrape-interval-ms",
        "--workers",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_takes_its_capacity_from_the_flag_and_drains_on_sigterm() {
    let mut engine = engine(1).await;
    let mut process = support::Process::spawn(
        env!("CARGO_BIN_EXE_tower-admission").as_ref(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &engine.url,
            "--max-num-seqs",
            "1",
            "--request-queue-limit",
            "1",
            "--capacity-poll-interval-ms",
            "600000",
            "--workers",
            "2",
        ],
        &[],
    );
    let url = process.listening_url();
    let banner = process.wait_for_stdout("banner", |text| {
        text.contains("connections: served by")
            .then(|| text.to_owned())
    });
    assert!(
        banner.contains("served by 2 threads of their own (--workers)"),
        "{banner}"
    );
    assert!(
        banner.contains("capacity: from --max-num-seqs 1 and 1 rank(s)"),
        "{banner}"
    );
    assert!(banner.contains("engine request limit 1,"), "{banner}");
    assert!(
        banner.contains("(pass list: the llama.cpp routes)"),
        "the engine's /props says llama.cpp: {banner}"
    );

    let client = client();
    let first = within(chat(&client, &url)).await;
    let running = within(engine.arrivals.recv()).await.unwrap();
    let queued = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { chat(&client, &url).await }
    });
    // The engine never reports: /props here says one slot, and the flag
    // wins anyway. Wait for the queue through the sidecar's own metrics.
    let deadline = tokio::time::Instant::now() + support::PATIENCE;
    let text = loop {
        let text = within(client.get(format!("{url}/metrics")).send())
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let queued_line = format!(
            "{}_request_queue_count{{dp_rank=\"unspecified\"}} 1",
            tower_admission::metrics::DEFAULT_PREFIX
        );
        if text.contains(&queued_line) {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never queued:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The sidecar records the saturation gauge for routers and autoscalers:
    // with its one slot taken and a request queued the worker is busy.
    let saturation = text
        .lines()
        .find_map(|line| {
            line.strip_prefix(&format!(
                "{}_saturation{{dp_rank=\"unspecified\"}} ",
                tower_admission::metrics::DEFAULT_PREFIX
            ))
        })
        .unwrap_or_else(|| panic!("no saturation gauge:\n{text}"));
    let saturation: f64 = saturation.parse().unwrap();
    assert!(saturation > 0.0 && saturation <= 1.0, "{saturation}");

    process.terminate();
    let queued = within(queued).await.unwrap();
    assert_eq!(queued.status(), 503);
    assert_eq!(queued.headers()["x-admission-rejection-reason"], "shutdown");
    running
        .stream
        .send(Bytes::from_static(DONE.as_bytes()))
        .unwrap();
    drop(running.stream);
    assert_eq!(within(first.bytes()).await.unwrap(), DONE.as_bytes());
    let (status, _, stderr) = tokio::task::spawn_blocking(move || process.wait())
        .await
        .unwrap();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("shutting down"), "{stderr}");
}

/// An engine that answers as vLLM's OpenAI server does to a client asking
/// for its capacity: models `owned_by` vllm, and no capacity route.
async fn vllm_like() -> (String, oneshot::Sender<()>) {
    let app = Router::new().route(
        "/v1/models",
        get(|| async {
            axum::Json(serde_json::json!({
                "object": "list",
                "data": [{"id": "m", "object": "model", "owned_by": "vllm", "max_model_len": 4096}],
            }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    (url, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_front_of_vllm_the_binary_requires_max_num_seqs() {
    let (url, _stop) = vllm_like().await;
    let upstream = Upstream::new(UpstreamUrl::parse(&url).unwrap(), options());
    assert_eq!(
        proxy::ask_engine(&upstream, Duration::from_secs(2)).await,
        proxy::EngineReport::Silent(proxy::EngineKind::Vllm)
    );

    let binary = env!("CARGO_BIN_EXE_tower-admission");
    let mut refused = support::Process::spawn(
        binary.as_ref(),
        &["--listen", "127.0.0.1:0", "--upstream", &url],
        &[],
    );
    let (status, _, stderr) = tokio::task::spawn_blocking(move || refused.wait())
        .await
        .unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("vLLM") && stderr.contains("--max-num-seqs"),
        "{stderr}"
    );

    let started = support::Process::spawn(
        binary.as_ref(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &url,
            "--max-num-seqs",
            "8",
        ],
        &[],
    );
    let banner = started.wait_for_stdout("banner", |text| {
        text.contains("admitted: POST").then(|| text.to_owned())
    });
    assert!(
        banner.contains("capacity: from --max-num-seqs 8"),
        "{banner}"
    );
    // The pass list is learned from the engine at start: vLLM's own cheap
    // routes, not llama.cpp's `/props` (a route vLLM does not serve is
    // admitted, the fail-closed side).
    let admitted = banner
        .lines()
        .find(|line| line.starts_with("admitted: POST"))
        .unwrap();
    assert!(
        admitted.contains("pass list: the vLLM routes"),
        "{admitted}"
    );
    assert!(admitted.contains("/v1/load_lora_adapter"), "{admitted}");
    assert!(!admitted.contains("/props"), "{admitted}");
}
