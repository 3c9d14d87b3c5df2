//! Issue 35, cases 4 and 5: connections that send nothing, connections
//! left idle, too many connections, and one HTTP/2 connection fanning out
//! to the engine. Over real sockets.

mod hostile;

use std::time::Duration;

use bytes::Bytes;
use hostile::{
    CHAT, gate, h2c, patiently, post_raw, read_head, recording_engine, sidecar, sidecar_with,
    status_of, until,
};
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower_admission_sidecar::ConnectionLimits;

/// Whether the peer closes `stream` within `within`, reading (and
/// dropping) whatever comes before.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buffer = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

fn short(head: u64, idle: u64, connections: usize) -> ConnectionLimits {
    ConnectionLimits::new(
        connections,
        Duration::from_millis(head),
        Duration::from_millis(idle),
        16,
    )
}

#[tokio::test]
async fn a_connection_that_sends_no_head_is_closed_whatever_its_protocol() {
    let engine = recording_engine().await;
    let sidecar = sidecar_with(gate(1, 1), &engine.url, |b| b, short(300, 10_000, 100)).await;
    // Nothing at all: the protocol is never known.
    let mut silent = TcpStream::connect(sidecar.address).await.unwrap();
    // Too little to tell HTTP/1.1 from HTTP/2.
    let mut few = TcpStream::connect(sidecar.address).await.unwrap();
    few.write_all(b"PO").await.unwrap();
    // Most of an HTTP/1.1 head.
    let mut partial = TcpStream::connect(sidecar.address).await.unwrap();
    partial
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    for (what, stream) in [
        ("silent", &mut silent),
        ("two bytes", &mut few),
        ("partial head", &mut partial),
    ] {
        assert!(
            closed_within(stream, Duration::from_secs(5)).await,
            "the {what} connection stayed open"
        );
    }
    assert!(engine.seen.all().is_empty());
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_but_one_streaming_is_not() {
    let engine = recording_engine().await;
    let sidecar = sidecar_with(gate(1, 1), &engine.url, |b| b, short(10_000, 300, 100)).await;
    let mut idle = TcpStream::connect(sidecar.address).await.unwrap();
    idle.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let head = patiently(read_head(&mut idle)).await;
    assert_eq!(status_of(&head), 200, "{head}");
    let (status, _, mut streaming) = post_raw(sidecar.address, "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);
    assert!(
        closed_within(&mut idle, Duration::from_secs(5)).await,
        "the idle connection stayed open"
    );
    // A response in progress is not idleness, however long it takes.
    assert!(!closed_within(&mut streaming, Duration::from_secs(1)).await);
}

#[tokio::test]
async fn connections_over_the_cap_are_answered_503_and_closed() {
    let engine = recording_engine().await;
    let sidecar = sidecar_with(gate(1, 1), &engine.url, |b| b, short(10_000, 10_000, 3)).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(TcpStream::connect(sidecar.address).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut extra = TcpStream::connect(sidecar.address).await.unwrap();
    let head = patiently(read_head(&mut extra)).await;
    assert_eq!(status_of(&head), 503, "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert!(closed_within(&mut extra, Duration::from_secs(5)).await);
    // One leaves: a newcomer is served again.
    drop(open.pop());
    let mut served = false;
    for _ in 0..100 {
        let mut next = TcpStream::connect(sidecar.address).await.unwrap();
        next.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        if status_of(&patiently(read_head(&mut next)).await) == 200 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "no connection was served after one closed");
}

#[tokio::test]
async fn one_h2c_connection_cannot_fan_out_to_the_engine() {
    let engine = recording_engine().await;
    let sidecar = sidecar(gate(1, 1), &engine.url, |b| b).await;
    let send = h2c(sidecar.address).await;
    // 200 passthrough streams the engine holds open.
    let streams: Vec<_> = (0..200)
        .map(|_| {
            let mut send = send.clone();
            let request = http::Request::post(format!("http://{}/tokenize", sidecar.address))
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            tokio::spawn(async move { send.send_request(request).await.map(|r| r.status()) })
        })
        .collect();
    let mut statuses = Vec::new();
    let mut held = Vec::new();
    for stream in streams {
        match patiently(stream).await.unwrap() {
            Ok(status) => statuses.push(status.as_u16()),
            Err(error) => held.push(error.to_string()),
        }
    }
    let passed = statuses.iter().filter(|&&status| status == 200).count();
    assert_eq!(
        passed,
        tower_admission_sidecar::DEFAULT_MAX_PASSTHROUGH_REQUESTS,
        "{statuses:?} {held:?}"
    );
    assert!(
        statuses
            .iter()
            .all(|&status| status == 200 || status == 503)
    );
    until("the engine saw each one passed", || {
        engine.seen.all().len() == passed
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(engine.seen.all().len(), passed);
}

#[test]
fn the_binary_raises_the_open_file_limit_and_prints_the_limits_in_force() {
    let hard: String = std::fs::read_to_string("/proc/self/limits")
        .unwrap()
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .and_then(|line| line.split_whitespace().nth(4).map(str::to_owned))
        .unwrap();
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_tower-admission"));
    let sidecar = tower_admission_testkit::Process::spawn(
        binary,
        &[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:1",
            "--max-num-seqs",
            "2",
        ],
        &[],
    );
    let line = sidecar.wait_for_stdout("the connection limits", |text| {
        text.lines()
            .find(|line| line.starts_with("connections:"))
            .map(str::to_owned)
    });
    sidecar.terminate();
    let expected = if hard == "unlimited" {
        "open-file limit".to_owned()
    } else {
        format!("open-file limit {hard})")
    };
    assert!(line.contains(&expected), "{line} (hard limit {hard})");
    for part in ["HTTP/2 streams", "passthrough", "idle"] {
        assert!(line.contains(part), "{line}");
    }
}
