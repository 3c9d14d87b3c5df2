//! The README's quick start, whole: an axum route streaming OpenAI-style
//! server-sent events behind the gate, and Prometheus metrics on `/metrics`.
//!
//! Run: `cargo run --example axum_quickstart [ADDRESS]` (default
//! `127.0.0.1:3000`), then `curl -N -X POST localhost:3000/v1/chat/completions`
//! and `curl localhost:3000/metrics`. Limits come from the
//! `DYN_BACKEND_ADMISSION_*` variables, else follow the engine's capacity.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::response::sse::{Event, Sse};
use axum::routing::{get, post};
use futures::stream::{self, Stream, StreamExt};
use metrics_exporter_prometheus::PrometheusBuilder;
use tower_admission::{AdmissionConfig, AdmissionLayer, EngineCapacity, Gate, RankHeader};

/// An OpenAI chat completion stream: a role-only chunk (interim: the request
/// still waits for its first token), content chunks, then `[DONE]`.
async fn chat() -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let chunk = |delta: &str| format!(r#"{{"choices":[{{"index":0,"delta":{delta}}}]}}"#);
    let role = chunk(r#"{"role":"assistant"}"#);
    let words = ["Hello", ",", " world"].map(|word| chunk(&format!(r#"{{"content":"{word}"}}"#)));
    let events = std::iter::once(role)
        .chain(words)
        .chain(["[DONE]".to_owned()]);
    Sse::new(stream::iter(events).then(|data| async move {
        tokio::time::sleep(Duration::from_millis(100)).await; // "generating"
        Ok(Event::default().data(data))
    }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The exporter, before the gate (a gate built earlier still registers its
    // series, at its first event after the exporter is installed).
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let upkeep = prometheus.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep(); // bounds the histograms' memory between scrapes
        }
    });

    // One gate per worker, shared by every route; never create it inside a layer.
    let gate = Gate::new(AdmissionConfig::from_env());
    // What the engine says about itself (max_num_seqs per rank, data-parallel
    // ranks), once it is up; report again whenever it changes.
    gate.report_capacity(EngineCapacity::new(256, 2));
    let limits = gate.limits_in_force(); // per rank and combined, and where each comes from

    // On each route's method router, so that 404s and 405s take no capacity.
    let admitted = AdmissionLayer::new(gate.clone()).rank(RankHeader::default()); // x-data-parallel-rank, from your router
    let metrics = move || async move {
        gate.refresh_metrics(); // gauges as of now, not of the gate's last event
        prometheus.render()
    };
    let app = Router::new()
        .route("/v1/chat/completions", post(chat).route_layer(admitted))
        .route("/metrics", get(metrics)) // not admitted
        .route("/health", get(|| async { "ok" }));

    let address = std::env::args().nth(1).unwrap_or("127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(address).await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!("admission: {limits}");
    axum::serve(listener, app).await?;
    Ok(())
}
