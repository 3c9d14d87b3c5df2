use super::super::media_type::tests::head;
use super::*;

fn detector_for(content_type: Option<&str>) -> Auto {
    let mut detector = Auto::default();
    detector.on_response(&head(content_type));
    detector
}

const ROLE_CHUNK: &[u8] = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
const CONTENT_CHUNK: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";

#[test]
fn an_event_stream_is_read_as_openai_events() {
    let mut detector = detector_for(Some("Text/Event-Stream; charset=utf-8"));
    assert_eq!(detector.on_data(b": keep-alive\n\n"), None);
    assert_eq!(detector.on_data(ROLE_CHUNK), None);
    assert_eq!(detector.on_data(CONTENT_CHUNK), Some(CONTENT_CHUNK.len()));
}

#[test]
fn grpc_content_types_are_read_as_messages() {
    for content_type in [
        "application/grpc",
        "application/grpc+proto",
        "application/grpc-web",
        "APPLICATION/GRPC-WEB+proto",
    ] {
        let mut detector = detector_for(Some(content_type));
        assert_eq!(
            detector.on_data(&[0, 0, 0, 0, 2, b'a']),
            None,
            "{content_type}"
        );
        assert_eq!(detector.on_data(b"b"), Some(1), "{content_type}");
    }
}

#[test]
fn grpc_web_text_is_read_as_any_data() {
    let mut detector = detector_for(Some("application/grpc-web-text"));
    assert_eq!(detector.on_data(b"AAAA"), Some(1));
}

#[test]
fn anything_else_ends_waiting_at_the_first_non_empty_frame() {
    for content_type in [Some("application/json"), Some("text/plain"), None] {
        let mut detector = detector_for(content_type);
        assert_eq!(detector.on_data(b""), None, "{content_type:?}");
        assert_eq!(detector.on_data(ROLE_CHUNK), Some(1), "{content_type:?}");
    }
}

#[test]
fn the_sse_detector_is_configurable() {
    let mut detector = Auto::default().sse(OpenAiSse::default().max_event_bytes(4));
    detector.on_response(&head(Some("text/event-stream")));
    assert_eq!(detector.on_data(b"data: 12345"), Some(11));
}

#[test]
fn each_response_starts_afresh() {
    let configured = Auto::default();
    let mut first = configured.clone();
    first.on_response(&head(Some("text/event-stream")));
    assert_eq!(
        first.on_data(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n"),
        None
    );
    let mut second = configured.clone();
    second.on_response(&head(Some("text/event-stream")));
    assert_eq!(
        second.on_data(b"\n"),
        None,
        "the first response's event leaked"
    );
}
