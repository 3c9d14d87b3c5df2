//! The media type of a response head, for detectors that choose how to read
//! a body by it.

use http::header::CONTENT_TYPE;

/// The media type of `head`'s `content-type`, without parameters and
/// surrounding whitespace (`text/event-stream; charset=utf-8` gives
/// `text/event-stream`); `None` when the response has no `content-type`.
/// Compare it case-insensitively: media types are.
pub(super) fn media_type(head: &http::response::Parts) -> Option<&[u8]> {
    let value = head.headers.get(CONTENT_TYPE)?.as_bytes();
    let essence = value.split(|&byte| byte == b';').next().unwrap_or(value);
    Some(essence.trim_ascii())
}

/// The event stream's media type, lower case.
const EVENT_STREAM: &[u8; 17] = b"text/event-stream";

/// Whether `essence` is `text/event-stream`, whatever the case.
pub(super) fn is_event_stream(essence: &[u8]) -> bool {
    essence.eq_ignore_ascii_case(EVENT_STREAM)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A response head with the given `content-type`, or none.
    pub(crate) fn head(content_type: Option<&str>) -> http::response::Parts {
        let mut response = http::Response::builder();
        if let Some(content_type) = content_type {
            response = response.header(CONTENT_TYPE, content_type);
        }
        response.body(()).expect("valid head").into_parts().0
    }

    #[test]
    fn parameters_and_whitespace_are_not_part_of_the_media_type() {
        let head = head(Some(" text/event-stream ; charset=utf-8"));
        assert_eq!(media_type(&head), Some(&b"text/event-stream"[..]));
    }

    #[test]
    fn the_event_stream_type_is_compared_as_eq_ignore_ascii_case_would() {
        let mut candidates: Vec<Vec<u8>> = vec![
            b"text/event-stream".to_vec(),
            b"TEXT/EVENT-STREAM".to_vec(),
            b"Text/Event-Stream".to_vec(),
            b"text/event-strea".to_vec(),
            b"text/event-streams".to_vec(),
            b"text/event_stream".to_vec(),
            Vec::new(),
        ];
        // Every byte value at every position.
        for at in 0..EVENT_STREAM.len() {
            for byte in 0..=u8::MAX {
                let mut candidate = EVENT_STREAM.to_vec();
                candidate[at] = byte;
                candidates.push(candidate);
            }
        }
        for candidate in candidates {
            assert_eq!(
                is_event_stream(&candidate),
                candidate.eq_ignore_ascii_case(EVENT_STREAM),
                "{candidate:?}"
            );
        }
    }

    #[test]
    fn an_event_stream_with_parameters_or_whitespace_has_the_same_media_type() {
        for content_type in [
            "text/event-stream",
            "Text/Event-Stream",
            "text/event-stream;charset=utf-8",
            "\ttext/event-stream ",
        ] {
            let head = head(Some(content_type));
            let media_type = media_type(&head).expect("a content-type");
            assert!(is_event_stream(media_type), "{content_type}");
        }
    }

    #[test]
    fn a_response_without_content_type_has_no_media_type() {
        assert_eq!(media_type(&head(None)), None);
    }
}
