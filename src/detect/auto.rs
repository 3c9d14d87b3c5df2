//! [`Auto`]: the detector chosen by the response's content type.

use super::any_data::AnyData;
use super::detector::FirstTokenDetector;
use super::grpc::Grpc;
use super::media_type::{is_event_stream, media_type};
use super::openai_sse::OpenAiSse;

/// Chooses the detector by the response's `content-type`; the layer's
/// default.
///
/// * `text/event-stream` → [`OpenAiSse`]: role-only chunks, empty deltas,
///   comments, keep-alives and the other interim events of the OpenAI Chat
///   Completions, Completions and Responses APIs and of Anthropic's Messages
///   API do not end waiting;
/// * `application/grpc`, `application/grpc+proto`, `application/grpc-web`,
///   … → [`Grpc`]: the first complete message ends waiting;
/// * anything else, or no `content-type` → [`AnyData`]: the first non-empty
///   data frame ends waiting (a non-streaming JSON answer, say; its handler
///   can end waiting sooner with [`FirstToken`](crate::http::FirstToken)).
///
/// ```
/// use tower_admission::FirstTokenDetector;
/// use tower_admission::detect::Auto;
///
/// let head = http::Response::builder()
///     .header("content-type", "text/event-stream")
///     .body(())
///     .unwrap()
///     .into_parts()
///     .0;
/// let mut detector = Auto::default();
/// detector.on_response(&head);
/// let role = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
/// assert_eq!(detector.on_data(role), None);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Auto {
    sse: OpenAiSse,
    chosen: Chosen,
}

#[derive(Debug, Clone, Default)]
enum Chosen {
    /// No response head seen yet: read the body as `AnyData` would.
    #[default]
    Undecided,
    Sse(OpenAiSse),
    Grpc(Grpc),
    AnyData,
}

impl Auto {
    /// The detector used for `text/event-stream` responses, e.g. with
    /// another [`max_event_bytes`](OpenAiSse::max_event_bytes).
    pub fn sse(mut self, detector: OpenAiSse) -> Self {
        self.sse = detector;
        self
    }
}

impl FirstTokenDetector for Auto {
    fn on_response(&mut self, head: &http::response::Parts) {
        self.chosen = match media_type(head) {
            Some(essence) if is_event_stream(essence) => {
                let mut detector = self.sse.clone();
                // An event stream, as for a response without media type:
                // the media type is not compared a second time.
                detector.read_media_type(None);
                Chosen::Sse(detector)
            }
            Some(essence) if is_grpc(essence) => {
                let mut detector = Grpc::default();
                detector.on_response(head);
                Chosen::Grpc(detector)
            }
            _ => Chosen::AnyData,
        };
    }

    fn on_data(&mut self, data: &[u8]) -> Option<usize> {
        match &mut self.chosen {
            Chosen::Sse(detector) => detector.on_data(data),
            Chosen::Grpc(detector) => detector.on_data(data),
            Chosen::Undecided | Chosen::AnyData => AnyData.on_data(data),
        }
    }
}

/// `application/grpc` and everything that starts with it (`+proto`, `-web`,
/// `-web-text`, …), whatever the case.
fn is_grpc(essence: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    essence.len() >= GRPC.len() && essence[..GRPC.len()].eq_ignore_ascii_case(GRPC)
}

#[cfg(test)]
mod tests;
