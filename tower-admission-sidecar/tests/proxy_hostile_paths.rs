//! Issue 35, cases 1 and 2: no path spelling and no route the sidecar has
//! not heard of gets a generation past a full gate. Over real sockets, with
//! the bytes a hostile client sends (no URL library in between), HTTP/1.1
//! and h2c alike.

mod hostile;

use bytes::Bytes;
use hostile::{CHAT, gate, h2c, patiently, post_raw, recording_engine, sidecar, until};
use http_body_util::{BodyExt, Full};

/// Spellings the engines route as `/v1/chat/completions` (uvicorn and
/// cpp-httplib decode the path before they route it).
const SPELLINGS: [&str; 6] = [
    "/v1/chat/%63ompletions",
    "/v1%2Fchat%2Fcompletions",
    "//v1//chat/completions",
    "/v1/./chat/x/../completions",
    "/v1/chat/completions/",
    "/%2e%2e/v1/chat/completions",
];

/// Generation and encoding routes the engines serve besides the eight
/// admitted by name (llama.cpp, TGI, vLLM; the `openai` SDK without `/v1`).
const OTHER_GENERATION_ROUTES: [&str; 17] = [
    "/chat/completions",
    "/completions",
    "/responses",
    "/infill",
    "/embedding",
    "/embeddings",
    "/rerank",
    "/reranking",
    "/v1/rerank",
    "/",
    "/invocations",
    "/pooling",
    "/classify",
    "/score",
    "/v1/score",
    "/v2/rerank",
    "/v1/some/route/of/next/year",
];

#[tokio::test]
async fn spelled_otherwise_a_generation_route_still_meets_the_full_gate_over_http1() {
    let engine = recording_engine().await;
    let sidecar = sidecar(gate(1, 0), &engine.url, |b| b).await;
    let (status, _, _held) = post_raw(sidecar.address, "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);
    for path in SPELLINGS {
        let (status, head, _) = post_raw(sidecar.address, path, CHAT).await;
        assert_eq!(status, 529, "{path} got past the full gate: {head}");
    }
    assert_eq!(engine.seen.all(), ["POST /v1/chat/completions"]);
}

#[tokio::test]
async fn spelled_otherwise_a_generation_route_still_meets_the_full_gate_over_h2c() {
    let engine = recording_engine().await;
    let sidecar = sidecar(gate(1, 0), &engine.url, |b| b).await;
    let mut send = h2c(sidecar.address).await;
    let request = |path: &str| {
        http::Request::post(format!("http://{}{path}", sidecar.address))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(CHAT.as_bytes())))
            .unwrap()
    };
    let held = patiently(send.send_request(request("/v1/chat/completions")))
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    for path in SPELLINGS {
        let response = patiently(send.send_request(request(path))).await.unwrap();
        assert_eq!(response.status(), 529, "{path} got past the full gate");
    }
    assert_eq!(engine.seen.all(), ["POST /v1/chat/completions"]);
}

#[tokio::test]
async fn every_post_but_the_cheap_routes_meets_the_gate() {
    let engine = recording_engine().await;
    let sidecar = sidecar(gate(1, 0), &engine.url, |b| b).await;
    let (status, _, _held) = post_raw(sidecar.address, "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);
    for path in OTHER_GENERATION_ROUTES {
        let (status, head, _) = post_raw(sidecar.address, path, CHAT).await;
        assert_eq!(status, 529, "{path} got past the full gate: {head}");
    }
    // The cheap routes pass, as the engine routes them, while the gate is
    // full; the engine receives the normalised path.
    for (path, reached) in [
        ("/tokenize", "POST /tokenize"),
        ("/x/..//detokenize/", "POST /detokenize"),
        ("/v1/load_lora%5Fadapter", "POST /v1/load_lora_adapter"),
        ("/health", "POST /health"),
    ] {
        let (status, head, _) = post_raw(sidecar.address, path, "{}").await;
        assert_eq!(status, 200, "{path}: {head}");
        until(reached, || {
            engine.seen.all().iter().any(|seen| seen == reached)
        })
        .await;
    }
    assert_eq!(engine.seen.all().len(), 5);
}

#[tokio::test]
async fn the_pass_and_admit_lists_replace_the_defaults() {
    let engine = recording_engine().await;
    let sidecar = sidecar(gate(1, 0), &engine.url, |b| {
        b.pass_paths(["/cheap", "/v1/completions"])
            .admit_paths(["/tokenize", "/v1/Completions"])
    })
    .await;
    let (status, _, _held) = post_raw(sidecar.address, "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);
    assert_eq!(post_raw(sidecar.address, "/ch%65ap", "{}").await.0, 200);
    // Off the pass list now, and on the admit list: the gate is full.
    assert_eq!(post_raw(sidecar.address, "/tokenize", "{}").await.0, 529);
    assert_eq!(post_raw(sidecar.address, "/health", "{}").await.0, 529);
    // The admit list wins over the pass list, case ignored (fail-closed).
    assert_eq!(
        post_raw(sidecar.address, "/v1/completions", "{}").await.0,
        529
    );
    until("the cheap route reached the engine", || {
        engine.seen.all().len() == 2
    })
    .await;
    assert_eq!(
        engine.seen.all(),
        ["POST /v1/chat/completions", "POST /cheap"]
    );
}

#[tokio::test]
async fn a_path_that_cannot_be_normalised_is_400_before_the_engine() {
    let engine = recording_engine().await;
    let sidecar = sidecar(gate(4, 4), &engine.url, |b| b).await;
    for path in [
        "/v1/chat/%2563ompletions",
        "/v1/chat/completions%00",
        "/v1/chat/completions%3Fx",
        "/v1%5Cchat%5Ccompletions",
        "/v1/chat/%zzompletions",
        "/v1/chat/%ff",
    ] {
        let (status, head, _) = post_raw(sidecar.address, path, CHAT).await;
        assert_eq!(status, 400, "{path}: {head}");
        assert!(head.contains("x-admission-origin: proxy"), "{path}: {head}");
    }
    // The answer is in OpenAI's error shape; over h2c too.
    let mut send = h2c(sidecar.address).await;
    let request = http::Request::post(format!(
        "http://{}/v1/chat/%2563ompletions",
        sidecar.address
    ))
    .body(Full::new(Bytes::from_static(CHAT.as_bytes())))
    .unwrap();
    let response = patiently(send.send_request(request)).await.unwrap();
    assert_eq!(response.status(), 400);
    let body = patiently(response.into_body().collect()).await.unwrap();
    let json: serde_json::Value = serde_json::from_slice(&body.to_bytes()).unwrap();
    assert_eq!(json["error"]["type"], "invalid_request_error");
    assert_eq!(json["error"]["code"], 400);
    assert!(engine.seen.all().is_empty(), "{:?}", engine.seen.all());
    assert_eq!(hostile::totals(&sidecar.gate).engine_requests, 0);
}

#[test]
fn help_lists_the_pass_and_admit_path_flags_and_both_refuse_a_non_path() {
    let binary = env!("CARGO_BIN_EXE_tower-admission");
    let help = std::process::Command::new(binary)
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--admit-path"), "{help}");
    assert!(help.contains("--pass-path"), "{help}");
    for flag in ["--admit-path", "--pass-path"] {
        for bad in ["tokenize", "/a%zz"] {
            let output = std::process::Command::new(binary)
                .args(["--upstream", "http://127.0.0.1:1", flag, bad])
                .output()
                .unwrap();
            assert!(!output.status.success());
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(stderr.contains(flag) && stderr.contains(bad), "{stderr}");
        }
    }
}
