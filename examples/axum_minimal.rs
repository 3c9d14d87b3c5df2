//! The smallest useful server: an axum route streaming server-sent events
//! behind admission control, with the crate's default features only.
//!
//! Run: `cargo run --example axum_minimal [ADDRESS]` (default
//! `127.0.0.1:3000`), then `curl -N -X POST localhost:3000/v1/chat/completions`. At most 4 requests
//! generate at once and 8 wait; the 13th gets `529 Site is overloaded`.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, Sse};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures::stream::{self, Stream, StreamExt};
use tower_admission::http::FirstToken;
use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};

/// A streamed answer: a role chunk (waiting goes on), five tokens, the end.
async fn chat() -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let role = r#"{"choices":[{"delta":{"role":"assistant"}}]}"#.to_owned();
    let tokens = (0..5).map(|n| format!(r#"{{"choices":[{{"delta":{{"content":"word{n} "}}}}]}}"#));
    let events = std::iter::once(role)
        .chain(tokens)
        .chain(["[DONE]".to_owned()]);
    Sse::new(stream::iter(events).then(|data| async move {
        tokio::time::sleep(Duration::from_millis(200)).await; // "generating"
        Ok(Event::default().data(data))
    }))
}

/// A whole JSON answer: the handler says when its first token exists.
async fn complete(Extension(first_token): Extension<FirstToken>) -> Json<serde_json::Value> {
    tokio::time::sleep(Duration::from_millis(100)).await; // prefill
    first_token.mark(); // waiting ends here, not when the whole answer is sent
    tokio::time::sleep(Duration::from_millis(500)).await; // decode
    Json(serde_json::json!({"choices": [{"text": "a whole answer"}]}))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    // One gate per worker, shared by every admitted route.
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(4)
            .request_queue_limit(8),
    );
    // On each route's method router: 404s and 405s take no admission capacity.
    let limits = gate.limits_in_force();
    let admitted = AdmissionLayer::new(gate);
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(chat).route_layer(admitted.clone()),
        )
        .route("/v1/completions", post(complete).route_layer(admitted))
        .route("/health", get(|| async { "ok" })); // not admitted
    let address = std::env::args().nth(1).unwrap_or("127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(address).await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!("admission: {limits}");
    axum::serve(listener, app).await
}
