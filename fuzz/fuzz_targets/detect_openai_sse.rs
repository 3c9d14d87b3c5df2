//! `OpenAiSse` on arbitrary bytes split anywhere, with the default and with
//! tiny bounds on buffered event data: decisions lie within their frame,
//! split and whole streams are decided on the same byte, and any content
//! type other than an event stream ends waiting at the first byte.

#![no_main]

mod common;

use arbitrary::Arbitrary;
use common::{Input, check, first_byte};
use libfuzzer_sys::fuzz_target;
use tower_admission::detect::OpenAiSse;

#[derive(Arbitrary, Debug)]
struct SseInput<'a> {
    /// `None`: the default bound (64 KiB); else a small one, so the
    /// fuzzer reaches the bound.
    max_event_bytes: Option<u8>,
    input: Input<'a>,
}

fn is_event_stream(head: &http::response::Parts) -> bool {
    let Some(value) = head.headers.get(http::header::CONTENT_TYPE) else {
        return true; // no content type is read as an event stream
    };
    let value = value.as_bytes();
    let essence = value.split(|&byte| byte == b';').next().unwrap_or(value);
    essence
        .trim_ascii()
        .eq_ignore_ascii_case(b"text/event-stream")
}

fuzz_target!(|sse: SseInput<'_>| {
    let detector = match sse.max_event_bytes {
        None => OpenAiSse::default(),
        Some(bytes) => OpenAiSse::default().max_event_bytes(usize::from(bytes)),
    };
    if let Some((head, decided)) = check(&detector, &sse.input, true)
        && !is_event_stream(&head)
    {
        assert_eq!(decided, first_byte(sse.input.stream));
    }
});
