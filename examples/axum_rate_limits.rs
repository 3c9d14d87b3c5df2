//! Admission control composed with rate limiters of both kinds, on one
//! streaming route.
//!
//! * A limiter that **rejects** (`429`) per key — here `tower_governor` 0.8
//!   (for axum 0.8: `default-features = false, features = ["axum"]`), a
//!   quota per API key — goes **outside** the admission layer: a request it
//!   turns away never reaches the gate, so it takes no capacity and is not
//!   even counted as received.
//! * A limiter that **delays** — tower's `RateLimit`, pacing requests into the
//!   engine — goes **inside**, behind a `Buffer`: the gate decides first
//!   (admit, queue, or `529`), and only admitted requests wait for the pacer,
//!   counted as admitted while they do. Never put it outside the gate: there
//!   it is a queue the gate cannot see, with no bound, no FIFO across
//!   connections and no overload answer.
//!
//! Two things the types do not show:
//! * `Buffer` turns errors into `BoxError`, and an axum route must be
//!   infallible: a `HandleErrorLayer` answers them (`503` here).
//! * axum builds a `route_layer`'s stack once per *connection* unless the
//!   router is built once, with `with_state(())` before `serve`; otherwise
//!   each connection gets a `Buffer` and a `RateLimit` of its own and the
//!   pacing limits nothing (axum issues #2582, #2634).
//!
//! Run: `cargo run --example axum_rate_limits [ADDRESS]` (default
//! `127.0.0.1:3000`), then
//! `curl -N -X POST -H 'x-api-key: alice' localhost:3000/v1/chat/completions`.
//! At most 2 requests a second reach the handler, over all connections; each
//! API key gets a burst of 5, then one more a second, and `429` beyond.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::routing::post;
use axum::{BoxError, Router};
use futures::stream::{self, Stream, StreamExt};
use tower::ServiceBuilder;
use tower::buffer::BufferLayer;
use tower::limit::RateLimitLayer;
use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};
use tower_governor::GovernorError;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;

/// How hard each limiter holds back.
#[derive(Debug, Clone)]
pub struct RateLimits {
    /// Requests the pacer lets through per `pace_period`, over all
    /// connections.
    pub paced: u64,
    pub pace_period: Duration,
    /// Requests an API key may send at once, and the time it takes to earn
    /// one more.
    pub quota_burst: u32,
    pub quota_period: Duration,
}

/// The quota's key: the `x-api-key` header. A request without one is refused
/// (`401`) before the gate, like one over its quota.
#[derive(Debug, Clone, Copy)]
pub struct ApiKey;

impl KeyExtractor for ApiKey {
    type Key = String;

    fn extract<B>(&self, request: &Request<B>) -> Result<String, GovernorError> {
        let key = request
            .headers()
            .get("x-api-key")
            .and_then(|key| key.to_str().ok());
        key.map(str::to_owned).ok_or(GovernorError::Other {
            code: StatusCode::UNAUTHORIZED,
            msg: Some("an x-api-key header is required".to_owned()),
            headers: None,
        })
    }
}

/// A streamed answer: a role chunk, three words, the end.
async fn chat() -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let chunk = |delta: &str| format!(r#"{{"choices":[{{"index":0,"delta":{delta}}}]}}"#);
    let words = ["Hello", ",", " world"].map(|word| chunk(&format!(r#"{{"content":"{word}"}}"#)));
    let events = std::iter::once(chunk(r#"{"role":"assistant"}"#))
        .chain(words)
        .chain(["[DONE]".to_owned()]);
    Sse::new(stream::iter(events).then(|data| async move {
        tokio::time::sleep(Duration::from_millis(100)).await; // "generating"
        Ok(Event::default().data(data))
    }))
}

/// The pacer failed (its `Buffer` worker is gone): an admitted request gets
/// a `503`, and its admission ends with the response.
async fn pacer_failed(error: BoxError) -> (StatusCode, HeaderMap, String) {
    let message = format!("the pacer failed: {error}");
    (StatusCode::SERVICE_UNAVAILABLE, HeaderMap::new(), message)
}

/// The routes, not yet built: call `.with_state(())` on the result once,
/// before serving it.
pub fn routes(gate: Gate, limits: &RateLimits) -> Router {
    // One limiter for every connection and route: the state lives in the
    // configuration, so build it once and share it.
    let quota = Arc::new(
        GovernorConfigBuilder::default()
            .key_extractor(ApiKey)
            .period(limits.quota_period)
            .burst_size(limits.quota_burst)
            .finish()
            .expect("a positive period and burst"),
    );
    // Outermost first: the gate decides, then admitted requests wait for
    // the pacer. Each request drives its own clone of what is inside the
    // gate, and `RateLimit` is not `Clone`: the `Buffer` shares one.
    let admitted_and_paced = ServiceBuilder::new()
        .layer(AdmissionLayer::new(gate))
        .layer(HandleErrorLayer::new(pacer_failed))
        .layer(BufferLayer::new(1024)) // at least the engine request limit
        .layer(RateLimitLayer::new(limits.paced, limits.pace_period));
    Router::new().route(
        "/v1/chat/completions",
        post(chat)
            .route_layer(admitted_and_paced)
            // Outside the gate: a 429 (or 401) takes no admission capacity.
            .route_layer(tower_governor::GovernorLayer::new(quota)),
    )
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    // One gate per worker; limits set in code (the engine never reports here).
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(4)
            .request_queue_limit(8),
    );
    let limits = RateLimits {
        paced: 2,
        pace_period: Duration::from_secs(1),
        quota_burst: 5,
        quota_period: Duration::from_secs(1),
    };
    let in_force = gate.limits_in_force();
    // Built once, here: every connection shares one Buffer and RateLimit.
    let app = routes(gate, &limits).with_state(());
    let address = std::env::args().nth(1).unwrap_or("127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(address).await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!("admission: {in_force}");
    println!(
        "rate limits: {} request(s) per {:?} into the engine; per x-api-key a burst of {}, one more every {:?}",
        limits.paced, limits.pace_period, limits.quota_burst, limits.quota_period
    );
    axum::serve(listener, app).await
}
