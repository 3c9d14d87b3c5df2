//! The event stream's framing: data that is no JSON object, line endings
//! however they arrive, joined data lines, the byte order mark, the bound
//! on a buffered event, the response's content type, and what the detector
//! holds once it has decided.

use super::*;

#[test]
fn data_that_is_not_a_json_object_ends_waiting() {
    assert_ends_waiting(b"data: Hello\n\n");
    assert_ends_waiting(b"data: [1, 2]\n\n");
    assert_ends_waiting(b"data: {\"choices\": [\n\n");
}

#[test]
fn invalid_utf8_data_ends_waiting_and_an_invalid_utf8_comment_does_not() {
    assert_interim(b": \xff\xfe\xc3\n\n");
    assert_ends_waiting(b"data: \xff\xfe\xc3(\n\n");
}

#[test]
fn waiting_does_not_end_before_the_dispatching_blank_line() {
    let mut detector = OpenAiSse::default();
    let token = format!("data: {}\n", chat_delta(r#"{"content":"Hi"}"#));
    assert_eq!(detector.on_data(token.as_bytes()), None);
    assert_eq!(detector.on_data(b"\n"), Some(1));
}

#[test]
fn crlf_line_endings_are_understood() {
    let interim = format!("data: {}\r\n\r\n", chat_delta(r#"{"role":"assistant"}"#));
    let token = format!(": c\r\ndata: {}\r\n\r\n", chat_delta(r#"{"content":"Hi"}"#));
    let stream = format!("{interim}{token}");
    // The `\r` of the blank line dispatches; its `\n` is not needed.
    let expected = stream.len() - 1;
    assert_eq!(
        decide_any_split(&OpenAiSse::default(), stream.as_bytes()),
        Some(expected)
    );
}

#[test]
fn cr_line_endings_are_understood() {
    let interim = format!("data: {}\r\r", chat_delta(r#"{"role":"assistant"}"#));
    let token = format!(": c\rdata: {}\r\r", chat_delta(r#"{"content":"Hi"}"#));
    let stream = format!("{interim}{token}");
    assert_eq!(
        decide_any_split(&OpenAiSse::default(), stream.as_bytes()),
        Some(stream.len())
    );
}

#[test]
fn a_crlf_split_between_frames_ends_one_line() {
    let mut detector = OpenAiSse::default();
    let token = format!("data: {}\r", chat_delta(r#"{"content":"Hi"}"#));
    assert_eq!(detector.on_data(token.as_bytes()), None);
    // The `\n` completes the `\r\n` above; it is not a blank line.
    assert_eq!(detector.on_data(b"\n"), None);
    assert_eq!(detector.on_data(b"\r\n"), Some(1));
}

#[test]
fn data_lines_of_one_event_are_joined_with_newlines() {
    let stream =
        b"data: {\"choices\":[{\"index\":0,\r\ndata:\"delta\":{\"content\":\ndata: \"Hi\"}}]}\n\n";
    assert_eq!(
        decide_any_split(&OpenAiSse::default(), stream),
        Some(stream.len())
    );
    // Joined, the lines form a role-only chunk: not output.
    assert_interim(
        b"data: {\"choices\":[{\"index\":0,\ndata: \"delta\":{\"role\":\"assistant\"}}]}\n\n",
    );
}

#[test]
fn only_one_space_after_the_colon_is_dropped() {
    // The value is ` [DONE]`, still `[DONE]` once trimmed.
    assert_ends_waiting(b"data:  [DONE]\n\n");
}

#[test]
fn a_byte_order_mark_at_the_start_is_ignored() {
    let stream = b"\xEF\xBB\xBFdata: [DONE]\n\n";
    assert_eq!(
        decide_any_split(&OpenAiSse::default(), stream),
        Some(stream.len())
    );
    // Elsewhere it makes the field name unknown.
    assert_interim(b": hi\n\xEF\xBB\xBFdata: [DONE]\n\n");
}

#[test]
fn an_oversized_event_ends_waiting_where_it_crosses_the_bound() {
    let detector = OpenAiSse::default().max_event_bytes(16);
    // 16 bytes of data fit; the 17th byte crosses the bound.
    let stream = b"data: 0123456789abcdef0123\n\n";
    assert_eq!(decide_any_split(&detector, stream), Some(6 + 17));
    // The `\n` that joins data lines counts too.
    let stream = b"data: 0123456789abcde\ndata: x\n\n";
    assert_eq!(
        decide_any_split(&detector, stream),
        Some(6 + 15 + 1 + 6 + 1)
    );
    let stream = b"data: 0123456789abcdef\n\n";
    assert_eq!(decide_any_split(&detector, stream), Some(6 + 16 + 1));
}

#[test]
fn data_within_the_bound_is_judged_normally() {
    let detector = OpenAiSse::default().max_event_bytes(16);
    assert_eq!(
        decide_any_split(&detector, b"data: 0123456789abcde\n\n"),
        Some(23)
    );
    assert_eq!(
        decide_any_split(&detector, b"data: {\"choices\":[]}\n\n"),
        None
    );
}

#[test]
fn the_default_bound_is_64_kib() {
    let mut detector = OpenAiSse::default();
    let mut stream = b"data: \"".to_vec();
    stream.resize(6 + 64 * 1024, b'a');
    assert_eq!(detector.on_data(&stream), None);
    assert!(detector.parser.data.capacity() <= 64 * 1024);
    assert_eq!(detector.on_data(b"a"), Some(1));
}

#[test]
fn long_comments_are_not_buffered() {
    let mut detector = OpenAiSse::default().max_event_bytes(16);
    let mut comment = b":".to_vec();
    comment.resize(1 << 20, b'x');
    assert_eq!(detector.on_data(&comment), None);
    assert_eq!(detector.on_data(b"\nid: 12345678901234567890\n\n"), None);
    assert_eq!(detector.parser.data.capacity(), 0);
}

#[test]
fn a_response_of_another_content_type_ends_waiting_at_its_first_byte() {
    let mut detector = OpenAiSse::default();
    detector.on_response(&head(Some("application/json")));
    assert_eq!(detector.on_data(b""), None);
    assert_eq!(
        detector.on_data(br#"{"choices":[{"message":{"role":"assistant"}}]}"#),
        Some(1)
    );
}

#[test]
fn an_event_stream_content_type_is_parsed_whatever_its_case_and_parameters() {
    for content_type in [
        Some("text/event-stream"),
        Some("Text/Event-Stream; charset=utf-8"),
        None,
    ] {
        let mut detector = OpenAiSse::default();
        detector.on_response(&head(content_type));
        let role = event(&chat_delta(r#"{"role":"assistant"}"#));
        assert_eq!(detector.on_data(&role), None, "{content_type:?}");
    }
}

#[test]
fn nothing_more_is_reported_once_waiting_has_ended() {
    let mut detector = OpenAiSse::default();
    assert_eq!(detector.on_data(b"data: [DONE]\n\n"), Some(14));
    assert_eq!(detector.on_data(b"data: [DONE]\n\n"), None);
    assert_eq!(detector.parser.data.capacity(), 0);
}

#[test]
fn a_configured_detector_holds_no_buffer() {
    let detector = OpenAiSse::default().max_event_bytes(1024);
    let clone = detector.clone();
    assert_eq!(clone.parser.data.capacity(), 0);
    assert_eq!(clone.max_event_bytes, 1024);
}

#[test]
fn short_bytes_remember_only_that_long_contents_were_long() {
    let mut bytes = ShortBytes::<4>::default();
    bytes.push(b"da");
    bytes.push(b"ta");
    assert_eq!(bytes.as_slice(), Some(&b"data"[..]));
    bytes.push(b"x");
    assert_eq!(bytes.as_slice(), None);
    bytes.clear();
    assert_eq!(bytes.as_slice(), Some(&b""[..]));
}
