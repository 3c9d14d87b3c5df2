//! `Grpc` on arbitrary bytes split anywhere: with gRPC framing, waiting ends
//! at the last byte of the first length-prefixed message; with any other
//! content type, at the first byte.

#![no_main]

mod common;

use common::{Input, check, first_byte};
use libfuzzer_sys::fuzz_target;
use tower_admission::detect::Grpc;

/// Where the first message of a gRPC stream ends: a flag byte, a 4-byte
/// big-endian length, then that many bytes.
fn first_message_end(stream: &[u8]) -> Option<usize> {
    let header = stream.get(..5)?;
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    let end = 5usize.checked_add(usize::try_from(length).ok()?)?;
    (end <= stream.len()).then_some(end)
}

fn is_grpc_framing(head: &http::response::Parts) -> bool {
    let Some(value) = head.headers.get(http::header::CONTENT_TYPE) else {
        return true; // no content type is read as gRPC
    };
    let value = value.as_bytes();
    let essence = value.split(|&byte| byte == b';').next().unwrap_or(value);
    let essence = essence.trim_ascii().to_ascii_lowercase();
    ["application/grpc", "application/grpc-web"]
        .iter()
        .any(|framing| {
            essence
                .strip_prefix(framing.as_bytes())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"+"))
        })
}

fuzz_target!(|input: Input<'_>| {
    if let Some((head, decided)) = check(&Grpc::default(), &input, true) {
        let expected = if is_grpc_framing(&head) {
            first_message_end(input.stream)
        } else {
            first_byte(input.stream)
        };
        assert_eq!(decided, expected);
    }
});
