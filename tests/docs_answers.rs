//! The overload answers the docs show are the ones the layer sends: every
//! block marked `<!-- checked: tests/documented_answers.rs -->` in
//! README.md and docs/ is compared, status line, headers and body, with a
//! worker-scoped rejection read off a real socket.
#![cfg(feature = "hyper")]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};

const MARKER: &str = "<!-- checked: tests/documented_answers.rs -->";
const PATIENCE: Duration = Duration::from_secs(20);

async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .expect("nothing happened in time")
}

/// A documented answer: its status line, headers and body.
#[derive(Debug)]
struct Answer {
    status_line: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn parse(text: &str) -> Answer {
        let (head, body) = text
            .split_once("\r\n\r\n")
            .or_else(|| text.split_once("\n\n"))
            .unwrap_or_else(|| panic!("no blank line after the head: {text:?}"));
        let mut lines = head.lines().map(|line| line.trim_end_matches('\r'));
        let status_line = lines.next().expect("a status line").to_owned();
        let headers = lines
            .map(|line| {
                let (name, value) = line.split_once(':').expect("name: value");
                (name.trim().to_ascii_lowercase(), value.trim().to_owned())
            })
            .collect();
        Answer {
            status_line,
            headers,
            body: body.trim_end().to_owned(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        let mut values = self.headers.iter().filter(|(n, _)| n == name);
        let value = values.next().map(|(_, value)| value.as_str());
        assert!(values.next().is_none(), "{name} twice in {self:?}");
        value
    }
}

/// Every checked block of the file at `path` (relative to the crate).
fn documented(path: &str) -> Vec<Answer> {
    let text = std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|error| panic!("{path}: {error}"));
    text.split(MARKER)
        .skip(1)
        .map(|after| {
            let block = after
                .trim_start()
                .strip_prefix("```http\n")
                .unwrap_or_else(|| panic!("{path}: no ```http block after the marker"));
            let end = block.find("\n```").expect("the block ends");
            Answer::parse(&block[..end])
        })
        .collect()
}

/// Serves a route whose responses never end behind a gate of one engine
/// request and no queue.
async fn full_worker() -> (SocketAddr, Gate) {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_limit(0),
    );
    let forever = || async {
        Body::from_stream(futures::stream::pending::<Result<String, std::io::Error>>())
    };
    let app = Router::new().route(
        "/v1/chat/completions",
        post(forever).route_layer(AdmissionLayer::new(gate.clone())),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (address, gate)
}

const REQUEST: &[u8] =
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: worker\r\ncontent-length: 0\r\n\r\n";

/// Sends a request on a connection of its own and reads until `done`.
async fn exchange(address: SocketAddr, done: impl Fn(&[u8]) -> bool) -> (TcpStream, String) {
    let mut connection = TcpStream::connect(address).await.unwrap();
    connection.write_all(REQUEST).await.unwrap();
    let mut received = Vec::new();
    let mut buffer = [0; 4096];
    while !done(&received) {
        let n = within(connection.read(&mut buffer)).await.unwrap();
        assert!(
            n > 0,
            "closed after {:?}",
            String::from_utf8_lossy(&received)
        );
        received.extend_from_slice(&buffer[..n]);
    }
    (connection, String::from_utf8(received).unwrap())
}

/// The worker-scoped rejection the layer sends, as it reaches a client.
async fn sent() -> Answer {
    let (address, gate) = full_worker().await;
    let head_ends = |bytes: &[u8]| bytes.windows(4).any(|w| w == b"\r\n\r\n");
    // The first request holds the engine's one place; its head arrives.
    let (_holding, _) = exchange(address, head_ends).await;
    assert_eq!(gate.snapshot().total.engine_requests, 1);
    // The second is rejected: read its head and its whole body.
    let (_, text) = exchange(address, |bytes| {
        let text = String::from_utf8_lossy(bytes);
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            return false;
        };
        let length = head.lines().find_map(|line| {
            line.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|n| n.trim().parse::<usize>().unwrap())
        });
        length.is_some_and(|length| body.len() >= length)
    })
    .await;
    assert_eq!(gate.snapshot().tally.rejected_worker, 1);
    Answer::parse(&text)
}

#[tokio::test]
async fn the_documented_overload_answers_are_the_ones_sent() {
    let sent = sent().await;
    let mut checked = 0;
    for path in ["README.md", "docs/examples.md"] {
        for doc in documented(path) {
            assert_eq!(doc.status_line, sent.status_line, "{path}");
            assert_eq!(doc.body, sent.body, "{path}: the body, byte for byte");
            for (name, value) in &doc.headers {
                assert_eq!(sent.header(name), Some(value.as_str()), "{path}: {name}");
            }
            // Everything the layer says is documented (the connection's
            // own headers aside).
            for (name, _) in &sent.headers {
                if !["content-length", "date", "connection"].contains(&name.as_str()) {
                    assert!(doc.header(name).is_some(), "{path} does not show {name}");
                }
            }
            checked += 1;
        }
    }
    assert_eq!(
        checked, 2,
        "one block in README.md, one in docs/examples.md"
    );
}
