//! The one seam every first-token detector implements: shown the response
//! head, then fed its data frames until it names the byte where waiting
//! ends.

/// Decides, for one response, where waiting ends.
///
/// The layer clones the configured detector for each request (so `Clone`
/// should be cheap: configuration, not buffers), shows it the response head,
/// then feeds it every data frame in order until it reports the first token.
/// It is never called again after that.
pub trait FirstTokenDetector: Clone + Send + 'static {
    /// Called once with the response head, before any data frame. A detector
    /// can, for example, tell a streaming SSE answer from a plain JSON one.
    fn on_response(&mut self, head: &http::response::Parts) {
        let _ = head;
    }

    /// Called with each data frame, in order. Returns `Some(n)` when the first
    /// generated token is complete within this frame, `n` being the number of
    /// bytes of `data` up to and including the byte that completed it;
    /// `None` while waiting goes on.
    fn on_data(&mut self, data: &[u8]) -> Option<usize>;
}
