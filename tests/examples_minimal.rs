//! `examples/axum_minimal.rs` and `examples/tonic_minimal.rs`, built with
//! the default features only and run as the user would, over real sockets.

use tower_admission_testkit as support;

use std::path::PathBuf;

use support::{Process, within};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Builds `name` with the default features (as `cargo run --example …`
/// does) and returns its binary.
fn built(name: &str) -> PathBuf {
    let mut built = support::cargo_build_examples(
        concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        None,
        &[name],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    built.remove(name).expect("checked by cargo_build_examples")
}

/// Starts `name` on a free port; returns it and its `http://` address.
fn start(name: &str) -> (Process, String) {
    let process = Process::spawn(&built(name), &["127.0.0.1:0"], &[]);
    let url = process.wait_for_stdout("its address", |text| {
        let line = text.lines().next()?;
        text.contains('\n')
            .then(|| line.strip_prefix("listening on ").map(str::to_owned))
            .flatten()
    });
    (process, url)
}

#[tokio::test]
async fn axum_minimal_streams_and_answers_whole_and_wrong_method_requests() {
    let (_server, url) = start("axum_minimal");
    let client = reqwest::Client::new();

    let stream = within(client.post(format!("{url}/v1/chat/completions")).send())
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let text = within(stream.text()).await.unwrap();
    assert!(text.contains("word4") && text.contains("[DONE]"), "{text}");

    let whole = within(client.post(format!("{url}/v1/completions")).send())
        .await
        .unwrap();
    let json: serde_json::Value = within(whole.json()).await.unwrap();
    assert_eq!(json["choices"][0]["text"], "a whole answer");

    let wrong_method = within(client.get(format!("{url}/v1/completions")).send())
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);
    let health = within(client.get(format!("{url}/health")).send())
        .await
        .unwrap();
    assert_eq!(within(health.text()).await.unwrap(), "ok");
}

#[tokio::test]
async fn tonic_minimal_answers_health_checks() {
    let (_server, url) = start("tonic_minimal");
    let channel = within(
        tonic::transport::Endpoint::from_shared(url)
            .unwrap()
            .connect(),
    )
    .await
    .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "demo.Completer"] {
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        let status = within(health.check(request)).await.unwrap().into_inner();
        assert_eq!(status.status(), ServingStatus::Serving, "{service:?}");
    }
}
