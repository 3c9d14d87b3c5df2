//! What every detector target checks: a decision lies within its frame
//! (`1..=frame.len()` bytes), the same stream split anywhere is decided on the
//! same byte, and a detector documented to fall silent once it has decided
//! (`OpenAiSse`, `Grpc`) reports nothing more. The layer never feeds a
//! detector after its decision, so `AnyData` need not.

#![allow(dead_code)] // each target uses part of it

use arbitrary::Arbitrary;
use tower_admission::FirstTokenDetector;

/// The response's `content-type`, from the ones the detectors tell apart
/// to arbitrary bytes.
#[derive(Arbitrary, Debug)]
pub enum ContentType<'a> {
    Missing,
    EventStream,
    EventStreamWithCharset,
    Grpc,
    GrpcWebProto,
    GrpcWebText,
    Json,
    Raw(&'a [u8]),
}

impl ContentType<'_> {
    /// A response head with this content type; `None` when the bytes are
    /// not a valid header value (no response could carry them).
    pub fn head(&self) -> Option<http::response::Parts> {
        let value: &[u8] = match self {
            ContentType::Missing => {
                return Some(http::Response::new(()).into_parts().0);
            }
            ContentType::EventStream => b"text/event-stream",
            ContentType::EventStreamWithCharset => b"Text/Event-Stream ; charset=utf-8",
            ContentType::Grpc => b"application/grpc",
            ContentType::GrpcWebProto => b"application/grpc-web+proto",
            ContentType::GrpcWebText => b"application/grpc-web-text",
            ContentType::Json => b"application/json",
            ContentType::Raw(bytes) => bytes,
        };
        let value = http::HeaderValue::from_bytes(value).ok()?;
        let mut response = http::Response::new(());
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
        Some(response.into_parts().0)
    }
}

/// A response: its content type, where its body is cut into frames, and
/// the body's bytes.
#[derive(Arbitrary, Debug)]
pub struct Input<'a> {
    pub content_type: ContentType<'a>,
    /// Cut points, taken modulo `stream.len() + 1`; repeats give empty frames.
    pub cuts: Vec<u16>,
    pub stream: &'a [u8],
}

impl<'a> Input<'a> {
    /// The body split at the cut points, in order.
    pub fn frames(&self) -> Vec<&'a [u8]> {
        let stream = self.stream;
        let mut points: Vec<usize> = self
            .cuts
            .iter()
            .map(|&cut| usize::from(cut) % (stream.len() + 1))
            .collect();
        points.sort_unstable();
        let mut frames = Vec::with_capacity(points.len() + 1);
        let mut start = 0;
        for point in points {
            frames.push(&stream[start..point]);
            start = point;
        }
        frames.push(&stream[start..]);
        frames
    }
}

/// Feeds `frames` to a fresh clone of `detector`, shown `head` first;
/// returns the absolute offset of the byte where waiting ended. With
/// `silent_after`, the frames after the decision are fed too and must get
/// no answer.
pub fn decide<D: FirstTokenDetector>(
    detector: &D,
    head: &http::response::Parts,
    frames: &[&[u8]],
    silent_after: bool,
) -> Option<usize> {
    let mut detector = detector.clone();
    detector.on_response(head);
    let mut before = 0;
    let mut decided = None;
    for frame in frames {
        if decided.is_some() && !silent_after {
            break;
        }
        let answer = detector.on_data(frame);
        if decided.is_some() {
            assert_eq!(answer, None, "a detector reported a second first token");
            continue;
        }
        if let Some(n) = answer {
            assert!(
                (1..=frame.len()).contains(&n),
                "decided after {n} bytes of a {}-byte frame",
                frame.len()
            );
            decided = Some(before + n);
        }
        before += frame.len();
    }
    decided
}

/// Checks `detector` on `input`: bounds, split invariance and, with
/// `silent_after`, silence after the decision. Returns the head used and
/// the decision, for oracles; `None` if no response could have this head.
pub fn check<D: FirstTokenDetector>(
    detector: &D,
    input: &Input<'_>,
    silent_after: bool,
) -> Option<(http::response::Parts, Option<usize>)> {
    let head = input.content_type.head()?;
    let whole = decide(detector, &head, &[input.stream], silent_after);
    let split = decide(detector, &head, &input.frames(), silent_after);
    assert_eq!(split, whole, "the split stream was decided elsewhere");
    Some((head, whole))
}

/// The `AnyData` answer: the first byte of a non-empty stream.
pub fn first_byte(stream: &[u8]) -> Option<usize> {
    (!stream.is_empty()).then_some(1)
}
