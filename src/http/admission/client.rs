//! The client's view of an admitted request (behaviour §6): measured from
//! its arrival at the layer to the end of its response, while the gate's
//! metrics are recorded. Without feature `metrics` these types are empty
//! and every call does nothing, so the layer's code reads the same either
//! way.

use http::response;

use crate::gate::{Descriptor, Gate};

/// An HTTP layer admits through `gate`: the client's view is registered
/// with the gate's series (with feature `metrics`).
pub(crate) fn register(gate: &Gate) {
    #[cfg(feature = "metrics")]
    gate.observer().want_client();
    #[cfg(not(feature = "metrics"))]
    let _ = gate;
}

/// A request that arrived at the layer: when, and what it is measured
/// against (nothing while metrics are not recorded).
pub(crate) struct Arrival {
    #[cfg(feature = "metrics")]
    started: Option<crate::metrics::client::Started>,
}

impl Arrival {
    /// A request described by `descriptor` arrives now.
    #[inline]
    pub(crate) fn now(gate: &Gate, descriptor: &Descriptor) -> Arrival {
        #[cfg(not(feature = "metrics"))]
        let _ = (gate, descriptor);
        Arrival {
            #[cfg(feature = "metrics")]
            started: gate.observer().client_arrival(
                descriptor.priority,
                descriptor.tenant,
                descriptor.deadline,
            ),
        }
    }

    /// The request was admitted: its response is measured until it ends.
    #[inline]
    pub(crate) fn admitted(self) -> Measure {
        Measure {
            #[cfg(feature = "metrics")]
            measuring: self.started.map(crate::metrics::client::Started::admitted),
        }
    }
}

/// An admitted request's response, measured until it ends. Dropped before
/// that (the client went away, the inner service failed), the request
/// counts as finished, cut off: it did not meet its objectives.
pub(crate) struct Measure {
    #[cfg(feature = "metrics")]
    measuring: Option<crate::metrics::client::Measuring>,
}

impl Measure {
    /// Nothing measured: a request that bypassed the gate.
    pub(crate) fn none() -> Measure {
        Measure {
            #[cfg(feature = "metrics")]
            measuring: None,
        }
    }

    /// Whether the response is being measured: while it is not, the body
    /// asks nothing of it.
    #[inline(always)]
    pub(crate) fn is_on(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.measuring.is_some();
        #[cfg(not(feature = "metrics"))]
        false
    }

    /// The response's head: a server error (5xx) never meets its
    /// objectives.
    pub(crate) fn on_response(&mut self, head: &response::Parts) {
        #[cfg(feature = "metrics")]
        if let Some(measuring) = &mut self.measuring {
            measuring.server_error(head.status.is_server_error());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = head;
    }

    /// A content chunk passed on to the client: the first token, or one
    /// after it.
    #[inline]
    pub(crate) fn chunk(&mut self) {
        #[cfg(feature = "metrics")]
        if let Some(measuring) = &mut self.measuring {
            measuring.chunk();
        }
    }

    /// The response ended: `completed` if it reached its end, not if it
    /// failed. Measured once; later calls (and the drop) do nothing.
    #[inline(never)]
    pub(crate) fn end(&mut self, completed: bool) {
        #[cfg(feature = "metrics")]
        if let Some(measuring) = self.measuring.take() {
            measuring.finish(completed);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = completed;
    }
}

impl Drop for Measure {
    fn drop(&mut self) {
        self.end(false);
    }
}

/// Whether a data frame after the first token is a content chunk
/// (behaviour §6). An event stream's trailers are not: `data: [DONE]`, and
/// an OpenAI chunk whose `choices` list is empty (the usage chunk of
/// `stream_options.include_usage`), which the engine writes right after the
/// last token. A frame that holds a trailer and a choice (written at once)
/// is one; so is any frame of another format. Looks at each `[` of the
/// frame once; allocates nothing.
pub(crate) fn carries_content(frame: &[u8]) -> bool {
    let mut trailer = false;
    // `memchr` finds each `[` a word at a time: this runs on every frame
    // of every measured stream.
    for at in memchr::memchr_iter(b'[', frame) {
        let after = &frame[at + 1..];
        if after.starts_with(b"DONE]") {
            trailer = true;
        } else if names_choices(&frame[..at]) {
            if after.trim_ascii_start().starts_with(b"]") {
                trailer = true;
            } else {
                return true;
            }
        }
    }
    !trailer && !frame.is_empty()
}

/// Whether the bytes before a `[` end with the member name `"choices":`.
fn names_choices(before: &[u8]) -> bool {
    before
        .trim_ascii_end()
        .strip_suffix(b":")
        .is_some_and(|name| name.trim_ascii_end().ends_with(b"\"choices\""))
}

#[cfg(test)]
mod tests {
    use super::carries_content;

    #[test]
    fn tokens_are_content_and_the_openai_trailers_are_not() {
        let token = br#"data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#;
        assert!(carries_content(token));
        assert!(carries_content(
            b"data: {\"choices\": [ {\"text\":\"a\"}]}\n\n"
        ));
        assert!(!carries_content(b"data: [DONE]\n\n"));
        let usage = br#"data: {"id":"c","choices":[],"usage":{"prompt_tokens":3}}"#;
        assert!(!carries_content(usage));
        assert!(!carries_content(
            b"data: {\"choices\" : [ ] }\n\ndata: [DONE]\n\n"
        ));
        assert!(!carries_content(b""));
    }

    #[test]
    fn a_token_written_with_the_trailers_is_content() {
        let all = b"data: {\"choices\":[{\"delta\":{\"content\":\"!\"}}]}\n\n\
                    data: {\"choices\":[],\"usage\":{}}\n\ndata: [DONE]\n\n";
        assert!(carries_content(all));
    }

    #[test]
    fn other_formats_are_content_whatever_their_brackets() {
        assert!(carries_content(b"data: {\"token\":{\"text\":\"[\"}}\n\n"));
        assert!(carries_content(b"data: {\"ids\":[1,2],\"list\":[]}\n\n"));
        assert!(carries_content(b"[[[[["));
        assert!(carries_content(b"\x00\x00\x00\x00\x05hello"));
    }
}
