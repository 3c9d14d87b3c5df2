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
    fn a_response_without_content_type_has_no_media_type() {
        assert_eq!(media_type(&head(None)), None);
    }
}
