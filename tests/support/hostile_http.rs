//! Raw HTTP for the hostile-input tests: one request written byte for byte
//! over TCP, and header values as a router might get them wrong.

#![allow(dead_code)] // each test binary uses part of it

use std::net::SocketAddr;
use std::time::Duration;

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

pub const PATIENCE: Duration = Duration::from_secs(10);

/// Sends `head_lines` (raw header lines, no line ends) as one HTTP/1.1
/// request and reads the whole answer; returns its status and body, or
/// `None` if the connection was reset before an answer could be read (a
/// server refusing a huge head may close before reading the rest).
pub async fn raw_request(addr: SocketAddr, head_lines: &[Vec<u8>]) -> Option<(u16, String)> {
    let mut request = b"POST /v1/completions HTTP/1.1\r\nhost: worker\r\nconnection: close\r\ncontent-length: 0\r\n".to_vec();
    for line in head_lines {
        request.extend_from_slice(line);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"\r\n");
    let exchange = async {
        let mut socket = TcpStream::connect(addr).await.unwrap();
        let _ = socket.write_all(&request).await;
        let mut answer = Vec::new();
        let _ = socket.read_to_end(&mut answer).await;
        answer
    };
    let answer = timeout(PATIENCE, exchange).await.expect("the server hangs");
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    Some((status, body.to_owned()))
}

/// Header values as a router might get them wrong: digits, signs, spaces,
/// any byte a header value may hold, very long runs.
pub fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(b'0'..=b'9', 0..12),
        proptest::collection::vec(
            prop_oneof![b'0'..=b'9', Just(b' '), Just(b'-'), Just(b'+'), Just(b'\t')],
            0..12
        ),
        proptest::collection::vec(any::<u8>(), 0..24),
        (1usize..4096).prop_map(|len| vec![b'1'; len]),
    ]
}
