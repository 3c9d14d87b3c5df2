//! Issue 35, cases 3 and 6: a client that sends its body slowly holds no
//! queue place and no engine slot, and a queued client that leaves is
//! cancelled whatever the size of its body. Over real sockets.

mod hostile;

use std::time::Duration;

use hostile::{
    CHAT, gate, post_raw, read_head, recording_engine, sidecar, status_of, totals, until,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tower_admission::Counts;
use tower_admission_sidecar::RequestBodyLimits;

/// Sends a request head announcing `length` body bytes, and `sent` of them.
async fn slow_sender(address: std::net::SocketAddr, length: usize, sent: usize) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: sidecar\r\n\
         content-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&vec![b' '; sent]).await.unwrap();
    stream
}

#[tokio::test]
async fn slow_senders_hold_no_queue_place_and_no_engine_slot() {
    let engine = recording_engine().await;
    let sidecar = sidecar(gate(2, 2), &engine.url, |b| b).await;
    let mut slow = Vec::new();
    for _ in 0..4 {
        slow.push(slow_sender(sidecar.address, 100_000, 12).await);
    }
    // Time for the sidecar to read every head.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(totals(&sidecar.gate), Counts::new(0, 0, 0));
    // Everyone else is served, and the engine sees only them.
    let (first, _, _held) = post_raw(sidecar.address, "/v1/chat/completions", CHAT).await;
    let (second, _, _held_too) = post_raw(sidecar.address, "/v1/chat/completions", CHAT).await;
    assert_eq!((first, second), (200, 200));
    assert_eq!(engine.seen.all().len(), 2);
    drop(slow);
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_408_and_one_too_large_413() {
    let engine = recording_engine().await;
    let sidecar = sidecar(gate(2, 2), &engine.url, |b| {
        b.request_body_limits(RequestBodyLimits::new(1_000, Duration::from_millis(300)))
    })
    .await;
    let mut slow = slow_sender(sidecar.address, 900, 12).await;
    let head = hostile::patiently(read_head(&mut slow)).await;
    assert_eq!(status_of(&head), 408, "{head}");
    assert!(head.contains("connection: close"), "{head}");

    let large = "x".repeat(1_001);
    let (status, head, _) = post_raw(sidecar.address, "/v1/chat/completions", &large).await;
    assert_eq!(status, 413, "{head}");
    // A body within the bound passes, and reaches the engine whole.
    let (status, _, _held) = post_raw(sidecar.address, "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);
    assert_eq!(engine.seen.all(), ["POST /v1/chat/completions"]);
    assert_eq!(sidecar.gate.snapshot().tally.admitted_direct, 1);
}

#[tokio::test]
async fn a_queued_client_with_a_large_body_that_leaves_never_reaches_the_engine() {
    let engine = recording_engine().await;
    let sidecar = sidecar(gate(1, 1), &engine.url, |b| b).await;
    let (status, _, held) = post_raw(sidecar.address, "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);

    // 256 KiB: far beyond what hyper buffers before it stops reading.
    let padding = " ".repeat(256 << 10);
    let large = format!("{}{padding}", CHAT);
    let mut queued = TcpStream::connect(sidecar.address).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: sidecar\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        large.len()
    );
    queued.write_all(head.as_bytes()).await.unwrap();
    // Written from a task: the sidecar may not read all of it yet.
    let writer = tokio::spawn(async move {
        let _ = queued.write_all(large.as_bytes()).await;
        queued
    });
    until("the large request is queued", || {
        totals(&sidecar.gate).queued == 1
    })
    .await;
    let queued = hostile::patiently(writer).await.unwrap();
    drop(queued);
    until("the client that left is no longer queued", || {
        totals(&sidecar.gate).queued == 0
    })
    .await;
    // The slot frees: nothing is left to reach the engine.
    drop(held);
    until("everything released", || {
        totals(&sidecar.gate) == Counts::new(0, 0, 0)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(engine.seen.all(), ["POST /v1/chat/completions"]);
}

#[tokio::test]
async fn bodies_beyond_the_memory_bound_get_the_overload_answer_and_never_reach_the_engine() {
    let engine = recording_engine().await;
    let limits = RequestBodyLimits::new(1_000, Duration::from_secs(30)).max_total_bytes(1_000);
    let sidecar = sidecar(gate(8, 8), &engine.url, |b| b.request_body_limits(limits)).await;
    // A slow sender holds 950 of the 1,000 bytes: every other body (75
    // bytes) finds the bound spent, once the sidecar has read them.
    let slow = slow_sender(sidecar.address, 1_000, 950).await;
    let mut served = Vec::new();
    let refused = loop {
        let (status, head, held) = post_raw(sidecar.address, "/v1/chat/completions", CHAT).await;
        if status == 200 {
            served.push(held); // before the sidecar had read the slow bytes
            assert!(served.len() < 100, "the bound never held");
            tokio::task::yield_now().await;
            continue;
        }
        break (status, head);
    };
    let (status, head) = refused;
    assert_eq!(status, 529, "{head}");
    assert!(
        head.contains("x-admission-rejection-reason: body_reads"),
        "{head}"
    );
    assert!(
        head.contains("x-admission-rejection-scope: worker"),
        "{head}"
    );
    assert!(head.contains("retry-after: 1"), "{head}");
    assert_eq!(sidecar.gate.snapshot().tally.body_reads_worker, 1);
    assert_eq!(
        engine.seen.all().len(),
        served.len(),
        "the refused body never reached the engine"
    );

    // The slow sender leaves: its bytes go back to the bound.
    drop(slow);
    let deadline = tokio::time::Instant::now() + tower_admission_testkit::PATIENCE;
    loop {
        let (status, head, held) = post_raw(sidecar.address, "/v1/chat/completions", CHAT).await;
        if status == 200 {
            drop(held);
            break;
        }
        assert_eq!(status, 529, "{head}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the bytes never came back"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(served);
}
