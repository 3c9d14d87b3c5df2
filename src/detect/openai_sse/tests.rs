//! The SSE detector's unit tests, by area, and the helpers they share:
//! feeding frames, and a decision checked to be the same at every split.

use super::super::media_type::tests::head;
use super::*;

fn chat_delta(delta: &str) -> String {
    format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":null}}]}}"#
    )
}

fn event(data: &str) -> Vec<u8> {
    format!("data: {data}\n\n").into_bytes()
}

/// Feeds `frames` in order; returns the absolute offset of the decision.
fn decide(detector: &mut OpenAiSse, frames: &[&[u8]]) -> Option<usize> {
    let mut before = 0;
    for frame in frames {
        if let Some(n) = detector.on_data(frame) {
            assert!(n > 0 && n <= frame.len(), "{n} outside 1..={}", frame.len());
            return Some(before + n);
        }
        before += frame.len();
    }
    None
}

/// The decision on `stream` in one frame, checked to be the same when
/// the stream arrives byte by byte and split at every single byte.
#[track_caller]
fn decide_any_split(detector: &OpenAiSse, stream: &[u8]) -> Option<usize> {
    let whole = decide(&mut detector.clone(), &[stream]);
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(decide(&mut detector.clone(), &bytes), whole, "byte by byte");
    for split in 0..=stream.len() {
        let (head, tail) = stream.split_at(split);
        let decided = decide(&mut detector.clone(), &[head, tail]);
        assert_eq!(decided, whole, "split at {split}");
    }
    whole
}

#[track_caller]
fn assert_interim(stream: &[u8]) {
    assert_eq!(decide_any_split(&OpenAiSse::default(), stream), None);
}

/// `token`, one event after an interim one, ends waiting at the first
/// byte of its dispatching blank line's line end.
#[track_caller]
fn assert_ends_waiting(token: &[u8]) {
    let mut stream = event(&chat_delta(r#"{"role":"assistant","content":""}"#));
    let lf_after_cr = usize::from(token.ends_with(b"\r\n"));
    let expected = stream.len() + token.len() - lf_after_cr;
    stream.extend_from_slice(token);
    stream.extend_from_slice(&event(&chat_delta(r#"{"content":"later"}"#)));
    assert_eq!(
        decide_any_split(&OpenAiSse::default(), &stream),
        Some(expected)
    );
}

mod anthropic;
mod events;
mod framing;
mod in_frame;
mod judge_agrees_with_the_value_oracle;
mod value_oracle;
