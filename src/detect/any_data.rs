//! [`AnyData`]: waiting ends at the first non-empty data frame.

use super::detector::FirstTokenDetector;

/// Waiting ends at the first non-empty data frame of the response.
///
/// Right for services whose body carries nothing before the first generated
/// token. Services that send interim bytes first (SSE role chunks,
/// keep-alives) want [`OpenAiSse`](super::OpenAiSse) or a detector of their own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnyData;

impl FirstTokenDetector for AnyData {
    fn on_data(&mut self, data: &[u8]) -> Option<usize> {
        if data.is_empty() { None } else { Some(1) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_non_empty_frame_ends_waiting_at_its_first_byte() {
        let mut detector = AnyData;
        assert_eq!(detector.on_data(b""), None);
        assert_eq!(detector.on_data(b"x"), Some(1));
    }
}
