//! Events whole in their frame are judged in place, without the
//! byte-wise walk, and decided as when split.

use super::*;

#[test]
fn an_event_whole_in_its_frame_is_judged_in_place() {
    let mut detector = OpenAiSse::default();
    let role = event(&chat_delta(r#"{"role":"assistant"}"#));
    assert_eq!(detector.on_data(&role), None);
    assert_eq!(detector.parser.data.capacity(), 0, "nothing was copied");
    // Split, its first part is buffered until the rest comes.
    let (head, tail) = role.split_at(role.len() / 2);
    assert_eq!(detector.on_data(head), None);
    assert!(detector.parser.data.capacity() > 0, "the head was kept");
    assert_eq!(detector.on_data(tail), None);
    let token = event(&chat_delta(r#"{"content":"Hi"}"#));
    assert_eq!(detector.on_data(&token), Some(token.len()));
}

#[test]
fn several_data_lines_in_one_frame_are_joined_as_when_split() {
    // The first line is judged in place until the second comes.
    let role = b"data: {\"choices\":\ndata: [{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    assert_interim(role);
    // An empty data line after one in place adds its `\n`.
    assert_interim(b"data: {\"choices\":[]}\ndata:\n\n");
    assert_interim(b"data: {\"choices\":[]}\ndata\nid: 7\n\n");
    let mut stream = role.to_vec();
    stream.extend_from_slice(b"data: {\"choices\":\ndata: [{\"delta\":{\"content\":\"x\"}}]}\n\n");
    assert_eq!(
        decide_any_split(&OpenAiSse::default(), &stream),
        Some(stream.len())
    );
}

/// A data line kept in its frame counts its `\n` toward the bound, as the
/// same line copied into the buffer does (a case the fuzzer found: a
/// 9-byte data line, then an empty `data` line, against a bound of 10).
#[test]
fn a_data_line_meets_the_bound_alike_in_its_frame_and_buffered() {
    let mut detector = OpenAiSse::default().max_event_bytes(10);
    detector.on_response(&head(Some("text/event-stream")));
    let decided = decide_any_split(&detector, b"data:123456789\ndata\n+");
    assert_eq!(decided, Some(20), "the empty data line crosses the bound");
}

/// An empty data line (`data: ` and its line end) after a data line kept in
/// its frame adds its `\n` too: it is not the kept line's value (a case the
/// fuzzer found: the whole stream crossed the bound one byte later than
/// the same stream split before the first line's end).
#[test]
fn an_empty_data_line_after_one_in_its_frame_counts_toward_the_bound() {
    let detector = OpenAiSse::default().max_event_bytes(10);
    assert_eq!(
        decide_any_split(&detector, b"data:123456789\ndata: \n+"),
        Some(22),
        "the empty data line's newline crosses the bound"
    );
}

/// An event whole in its frame takes a shorter way than one read across
/// frames; both decide on the same byte, whatever the line ends, the fields
/// around the data line, the bound, and wherever the stream is cut.
#[test]
fn events_whole_in_their_frame_are_decided_as_when_split() {
    let role = chat_delta(r#"{"role":"assistant"}"#);
    let token = chat_delta(r#"{"content":"Hi"}"#);
    for end in ["\n", "\r\n", "\r"] {
        let events = [
            format!("data: {role}{end}{end}"),
            format!("data:{role}{end}{end}"),
            format!("data:{end}{end}"),
            format!("data: {end}{end}"),
            format!("data:  {role}{end}{end}"),
            format!(": ping{end}data: {role}{end}{end}"),
            format!("event: message{end}id: 1{end}data: {role}{end}{end}"),
            format!("data: {role}{end}id: 1{end}{end}"),
            format!("data: {{\"choices\":{end}data: []}}{end}{end}"),
            format!("{end}data: {role}{end}{end}"),
            format!("\u{FEFF}data: {role}{end}{end}"),
            format!("event: error{end}data: {role}{end}{end}"),
            format!("data: [DONE]{end}{end}"),
            format!("data: {token}{end}{end}"),
        ];
        for first in &events {
            for second in &events {
                let stream = format!("{first}{second}data: {token}{end}{end}");
                for bound in [
                    OpenAiSse::DEFAULT_MAX_EVENT_BYTES,
                    0,
                    1,
                    role.len(),
                    role.len() + 1,
                ] {
                    let detector = OpenAiSse::default().max_event_bytes(bound);
                    let decided = decide_any_split(&detector, stream.as_bytes());
                    assert!(decided.is_some(), "{stream:?} with bound {bound}");
                }
            }
        }
        // Where the decision falls: the first byte of the blank line's end.
        let stream = format!("data: {role}{end}{end}data: {token}{end}{end}");
        let lf_after_cr = if end == "\r\n" { 1 } else { 0 };
        assert_eq!(
            decide_any_split(&OpenAiSse::default(), stream.as_bytes()),
            Some(stream.len() - lf_after_cr),
            "{end:?}"
        );
        let interim = format!("data: {role}{end}{end}: ping{end}{end}");
        assert_eq!(
            decide_any_split(&OpenAiSse::default(), interim.as_bytes()),
            None,
            "{end:?}"
        );
    }
}
