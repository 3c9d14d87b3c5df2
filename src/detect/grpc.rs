//! [`Grpc`]: waiting ends at the first complete length-prefixed gRPC message.

use super::detector::FirstTokenDetector;
use super::media_type::media_type;

/// Waiting ends at the first complete length-prefixed gRPC message.
///
/// A gRPC response body is a sequence of messages, each behind a 5-byte
/// header: a compressed flag, then the message length as a 4-byte
/// big-endian integer. Response headers are interim metadata; the first
/// complete message is the first answer the client can use, so waiting
/// ends at its last byte — however the body is split into frames.
///
/// * An empty message (length `0`) counts: it ends waiting at the last byte
///   of its header. gRPC servers send no empty keep-alive messages, so an
///   empty message is an answer (every field at its default).
/// * The flag byte is not inspected: a compressed message counts like any
///   other, and a gRPC-Web trailers frame (flag `0x80`) ends waiting too,
///   which is right since it ends the answer.
/// * A trailers-only response (an error, typically) has no body: it ends
///   waiting by completing, which the layer sees without the detector.
///
/// Memory is constant: the detector counts the message's bytes without
/// keeping them, whatever length the header announces.
///
/// When the response head has a `content-type` that is not gRPC or
/// gRPC-Web framing (`application/grpc`, `application/grpc+proto`,
/// `application/grpc-web`, ...) — an HTTP error page, or base64
/// `application/grpc-web-text` — waiting ends at the first non-empty data
/// frame, as with [`AnyData`](super::AnyData). A response without
/// `content-type` is read as gRPC.
///
/// After it has reported the first message the detector reports nothing
/// more.
///
/// ```
/// use tower_admission::FirstTokenDetector;
/// use tower_admission::detect::Grpc;
///
/// let mut detector = Grpc::default();
/// assert_eq!(detector.on_data(&[0, 0, 0, 0, 3, b'a']), None);
/// assert_eq!(detector.on_data(&[b'b', b'c', 0, 0, 0, 0, 1]), Some(2));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Grpc {
    mode: Mode,
    /// Bytes of the first message's header read so far, up to
    /// [`HEADER_LEN`].
    header_read: u8,
    /// While the header is read: the length read so far. Then: the bytes
    /// of the message still to come.
    remaining: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Mode {
    /// Count the first message's bytes.
    #[default]
    Messages,
    /// Not gRPC framing: the first non-empty frame ends waiting.
    AnyData,
    /// Waiting has ended; nothing more to report.
    Done,
}

/// A compressed flag and a 4-byte length.
const HEADER_LEN: u8 = 5;

impl Grpc {
    /// Reads one frame of gRPC messages; returns how many of its bytes
    /// completed the first message.
    fn count(&mut self, frame: &[u8]) -> Option<usize> {
        let mut index = 0;
        while self.header_read < HEADER_LEN {
            let &byte = frame.get(index)?;
            index += 1;
            if self.header_read > 0 {
                self.remaining = (self.remaining << 8) | u64::from(byte);
            }
            self.header_read += 1;
        }
        let available = frame.len() - index;
        // `remaining` is below 2^32; if it does not fit a usize it is
        // larger than any frame.
        let taken =
            usize::try_from(self.remaining).map_or(available, |remaining| remaining.min(available));
        index += taken;
        self.remaining -= taken as u64;
        (self.remaining == 0).then_some(index)
    }
}

impl FirstTokenDetector for Grpc {
    fn on_response(&mut self, head: &http::response::Parts) {
        if self.mode == Mode::Done {
            return;
        }
        self.mode = match media_type(head) {
            Some(essence) if !is_grpc_framing(essence) => Mode::AnyData,
            _ => Mode::Messages,
        };
    }

    fn on_data(&mut self, data: &[u8]) -> Option<usize> {
        let decided = match self.mode {
            Mode::Done => None,
            Mode::AnyData => (!data.is_empty()).then_some(1),
            Mode::Messages => self.count(data),
        };
        if decided.is_some() {
            self.mode = Mode::Done;
        }
        decided
    }
}

/// Whether a media type announces length-prefixed gRPC messages:
/// `application/grpc` and `application/grpc-web`, each alone or with a
/// `+format` suffix. `application/grpc-web-text` is base64 and does not.
fn is_grpc_framing(media_type: &[u8]) -> bool {
    let media_type = media_type.to_ascii_lowercase();
    ["application/grpc", "application/grpc-web"]
        .iter()
        .any(
            |framing| match media_type.strip_prefix(framing.as_bytes()) {
                Some(rest) => rest.is_empty() || rest.starts_with(b"+"),
                None => false,
            },
        )
}

#[cfg(test)]
mod tests;
