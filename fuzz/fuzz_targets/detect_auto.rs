//! `Auto` on arbitrary bytes split anywhere, under any content type:
//! decisions lie within their frame, split and whole streams are decided on
//! the same byte, and the decision is the one of the detector the content
//! type chooses (`OpenAiSse`, `Grpc`, else the first byte).

#![no_main]

mod common;

use common::{Input, check, decide, first_byte};
use libfuzzer_sys::fuzz_target;
use tower_admission::detect::{Auto, Grpc, OpenAiSse};

/// The media type of `head`, lowercase, without parameters; empty when it
/// has no `content-type`.
fn essence(head: &http::response::Parts) -> Vec<u8> {
    let Some(value) = head.headers.get(http::header::CONTENT_TYPE) else {
        return Vec::new();
    };
    let value = value.as_bytes();
    let essence = value.split(|&byte| byte == b';').next().unwrap_or(value);
    essence.trim_ascii().to_ascii_lowercase()
}

fuzz_target!(|input: Input<'_>| {
    let Some((head, decided)) = check(&Auto::default(), &input, false) else {
        return;
    };
    let essence = essence(&head);
    let chosen = if essence == b"text/event-stream" {
        decide(&OpenAiSse::default(), &head, &[input.stream], false)
    } else if essence.starts_with(b"application/grpc") {
        decide(&Grpc::default(), &head, &[input.stream], false)
    } else {
        first_byte(input.stream)
    };
    assert_eq!(decided, chosen);
});
