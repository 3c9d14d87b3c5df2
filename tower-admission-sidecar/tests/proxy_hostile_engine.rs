//! Issue 35, case 7: engine connections are reused where the engine keeps
//! them, and an engine that closes its connection after each response
//! (llama.cpp after a stream) costs no client a `502`. Over real sockets.

mod hostile;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hostile::{gate, post_raw, read_head, recording_engine, sidecar, status_of};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn get_raw(address: std::net::SocketAddr, path: &str) -> u16 {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: sidecar\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    status_of(&hostile::patiently(read_head(&mut stream)).await)
}

#[tokio::test]
async fn engine_connections_are_reused_where_the_engine_keeps_them() {
    let engine = recording_engine().await;
    let sidecar = sidecar(gate(4, 4), &engine.url, |b| b).await;
    for _ in 0..20 {
        let (status, head, _) = post_raw(sidecar.address, "/quick/generate", "{}").await;
        assert_eq!(status, 200, "{head}");
        assert_eq!(get_raw(sidecar.address, "/v1/models").await, 200);
    }
    assert_eq!(engine.seen.all().len(), 40);
    let opened = engine.connections.load(Ordering::SeqCst);
    assert!(
        opened <= 2,
        "40 requests opened {opened} engine connections"
    );
}

/// An engine that answers one request per connection and then closes it,
/// without saying so (no `connection: close`) and a moment late: the worst
/// case of llama.cpp's close after a stream. Counts the requests it read.
async fn closing_engine() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let answered = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&answered);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let mut read = Vec::new();
                let mut buffer = [0u8; 4096];
                let body_start = loop {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read.extend_from_slice(&buffer[..n]),
                    }
                    if let Some(at) = read.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                };
                let head = String::from_utf8_lossy(&read[..body_start]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .map_or(0, |value| value.trim().parse().unwrap());
                while read.len() < body_start + length {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read.extend_from_slice(&buffer[..n]),
                    }
                }
                count.fetch_add(1, Ordering::SeqCst);
                let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                              content-length: 2\r\n\r\n{}";
                let _ = stream.write_all(answer.as_bytes()).await;
                // Closed a moment later, unread what came meanwhile: no
                // `connection: close` said, so the sidecar may send the next
                // request on this connection as it closes.
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            });
        }
    });
    (url, answered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_closes_after_each_answer_costs_no_502() {
    let (url, answered) = closing_engine().await;
    let sidecar = sidecar(gate(4, 4), &url, |b| b).await;
    let mut statuses = Vec::new();
    for _ in 0..100 {
        statuses.push(
            post_raw(sidecar.address, "/v1/chat/completions", "{}")
                .await
                .0,
        );
        statuses.push(get_raw(sidecar.address, "/v1/models").await);
    }
    assert!(statuses.iter().all(|&status| status == 200), "{statuses:?}");
    // Each request ran once: a request sent again was one the engine never read.
    assert_eq!(answered.load(Ordering::SeqCst), 200);
}
