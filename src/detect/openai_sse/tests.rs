use super::super::media_type::tests::head;
use super::*;

fn chat_delta(delta: &str) -> String {
    format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":null}}]}}"#
    )
}

fn event(data: &str) -> Vec<u8> {
    format!("data: {data}\n\n").into_bytes()
}

/// Feeds `frames` in order; returns the absolute offset of the decision.
fn decide(detector: &mut OpenAiSse, frames: &[&[u8]]) -> Option<usize> {
    let mut before = 0;
    for frame in frames {
        if let Some(n) = detector.on_data(frame) {
            assert!(n > 0 && n <= frame.len(), "{n} outside 1..={}", frame.len());
            return Some(before + n);
        }
        before += frame.len();
    }
    None
}

/// The decision on `stream` in one frame, checked to be the same when
/// the stream arrives byte by byte and split at every single byte.
#[track_caller]
fn decide_any_split(detector: &OpenAiSse, stream: &[u8]) -> Option<usize> {
    let whole = decide(&mut detector.clone(), &[stream]);
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(decide(&mut detector.clone(), &bytes), whole, "byte by byte");
    for split in 0..=stream.len() {
        let (head, tail) = stream.split_at(split);
        let decided = decide(&mut detector.clone(), &[head, tail]);
        assert_eq!(decided, whole, "split at {split}");
    }
    whole
}

#[track_caller]
fn assert_interim(stream: &[u8]) {
    assert_eq!(decide_any_split(&OpenAiSse::new(), stream), None);
}

/// `token`, one event after an interim one, ends waiting at the first
/// byte of its dispatching blank line's line end.
#[track_caller]
fn assert_ends_waiting(token: &[u8]) {
    let mut stream = event(&chat_delta(r#"{"role":"assistant","content":""}"#));
    let lf_after_cr = usize::from(token.ends_with(b"\r\n"));
    let expected = stream.len() + token.len() - lf_after_cr;
    stream.extend_from_slice(token);
    stream.extend_from_slice(&event(&chat_delta(r#"{"content":"later"}"#)));
    assert_eq!(decide_any_split(&OpenAiSse::new(), &stream), Some(expected));
}

#[test]
fn line_ends_are_found_wherever_they_are() {
    for len in 0..40 {
        for at in 0..=len {
            for (end, plain) in [(b'\r', false), (b'\n', false), (b'\r', true), (b'\n', true)] {
                let mut bytes = vec![b'a'; len];
                // Bytes that differ from CR and LF in one bit, and 0x80; or
                // no control byte but the line end.
                for (index, byte) in bytes.iter_mut().enumerate().filter(|_| !plain) {
                    *byte = [b'a', 0x0c, 0x0b, 0x8d, 0x8a, 0x80, 0x0e][index % 7];
                }
                if at < len {
                    bytes[at] = end;
                    if at + 1 < len {
                        bytes[at + 1] = b'\n';
                    }
                }
                assert_eq!(line_end(&bytes), at, "{bytes:?}");
            }
        }
    }
}

#[test]
fn comments_and_keep_alives_do_not_end_waiting() {
    assert_interim(b": ping\n\n:\n\n\n\n\r\n\r");
}

#[test]
fn a_role_only_chunk_does_not_end_waiting() {
    assert_interim(&event(&chat_delta(r#"{"role":"assistant"}"#)));
}

#[test]
fn empty_or_null_content_does_not_end_waiting() {
    assert_interim(&event(&chat_delta(r#"{"content":""}"#)));
    assert_interim(&event(&chat_delta(
        r#"{"role":"assistant","content":null,"reasoning_content":null,"tool_calls":[]}"#,
    )));
    assert_interim(&event(&chat_delta("{}")));
}

#[test]
fn a_usage_only_chunk_does_not_end_waiting() {
    assert_interim(&event(
        r#"{"id":"1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":0,"total_tokens":9}}"#,
    ));
}

#[test]
fn an_event_with_empty_data_does_not_end_waiting() {
    assert_interim(b"data:\n\ndata: \n\ndata\n\ndata:  \r\n\r\n");
}

#[test]
fn fields_other_than_data_do_not_end_waiting() {
    assert_interim(b"id: 7\nretry: 1000\nevent: message\ndatum: [DONE]\n\nevent: error\n\n");
}

#[test]
fn an_unrecognised_json_object_ends_waiting() {
    // Only what is listed as interim keeps waiting going: an unknown event
    // is something the client sees.
    assert_ends_waiting(&event(r#"{"ping":true}"#));
    assert_ends_waiting(&event(r#"{"token":{"text":"Hi"}}"#));
    assert_ends_waiting(&event(r#"{}"#));
    assert_ends_waiting(&event(r#"{"type":"some.new.event"}"#));
    assert_ends_waiting(&event(r#"{"choices":null}"#));
}

#[test]
fn a_content_delta_ends_waiting_at_the_blank_line_that_dispatches_it() {
    assert_ends_waiting(&event(&chat_delta(r#"{"content":"Hello"}"#)));
}

#[test]
fn a_reasoning_delta_ends_waiting() {
    assert_ends_waiting(&event(&chat_delta(r#"{"reasoning_content":"Hmm"}"#)));
    assert_ends_waiting(&event(&chat_delta(r#"{"reasoning":"Hmm"}"#)));
}

#[test]
fn a_refusal_delta_ends_waiting() {
    assert_ends_waiting(&event(&chat_delta(r#"{"refusal":"No."}"#)));
}

#[test]
fn a_tool_call_delta_ends_waiting() {
    assert_ends_waiting(&event(&chat_delta(
        r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}"#,
    )));
}

#[test]
fn a_legacy_function_call_delta_ends_waiting() {
    assert_ends_waiting(&event(&chat_delta(
        r#"{"function_call":{"name":"get_weather","arguments":""}}"#,
    )));
}

#[test]
fn a_completion_chunk_with_text_ends_waiting() {
    assert_interim(&event(
        r#"{"object":"text_completion","choices":[{"index":0,"text":"","finish_reason":null}]}"#,
    ));
    assert_ends_waiting(&event(
        r#"{"object":"text_completion","choices":[{"index":0,"text":" Paris","finish_reason":null}]}"#,
    ));
}

#[test]
fn a_finish_reason_ends_waiting_without_any_token() {
    assert_ends_waiting(&event(
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
    ));
}

#[test]
fn done_ends_waiting() {
    assert_ends_waiting(b"data: [DONE]\n\n");
    assert_ends_waiting(b"data:[DONE]\r\n\r\n");
}

#[test]
fn an_error_ends_waiting() {
    assert_ends_waiting(&event(
        r#"{"error":{"message":"out of memory","type":"InternalServerError","code":500}}"#,
    ));
    assert_ends_waiting(&event(
        r#"{"object":"error","message":"bad","type":"BadRequestError","code":400}"#,
    ));
    assert_ends_waiting(b"event: error\ndata: {\"message\":\"bad\"}\n\n");
}

#[test]
fn responses_api_lifecycle_events_are_interim() {
    // What `POST /v1/responses` with `stream: true` sends before its first
    // token.
    for interim in [
        r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress","output":[]}}"#,
        r#"{"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_1","status":"in_progress"}}"#,
        r#"{"type":"response.queued","response":{}}"#,
        r#"{"type":"response.output_item.added","output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","content":[],"role":"assistant"}}"#,
        r#"{"type":"response.content_part.added","item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","annotations":[],"text":""}}"#,
        r#"{"type":"response.reasoning_summary_part.added","item_id":"rs_1","output_index":0,"summary_index":0,"part":{"type":"summary_text","text":""}}"#,
        r#"{"type":"response.web_search_call.in_progress","item_id":"ws_1","output_index":0}"#,
        r#"{"type":"response.web_search_call.searching","item_id":"ws_1","output_index":0}"#,
        r#"{"type":"response.image_generation_call.generating","item_id":"ig_1","output_index":0}"#,
        r#"{"type":"response.code_interpreter_call.interpreting","item_id":"ci_1","output_index":0}"#,
        r#"{"type":"response.output_text.delta","item_id":"1","delta":""}"#,
    ] {
        assert_interim(&event(interim));
    }
}

#[test]
fn responses_api_output_and_terminal_events_end_waiting() {
    assert_ends_waiting(&event(
        r#"{"type":"response.output_text.delta","item_id":"1","delta":"Hi"}"#,
    ));
    assert_ends_waiting(&event(r#"{"type":"response.failed","response":{}}"#));
    assert_ends_waiting(&event(
        r#"{"type":"response.function_call_arguments.delta","item_id":"fc_1","delta":"{\"a"}"#,
    ));
    assert_ends_waiting(&event(
        r#"{"type":"response.reasoning_summary_text.delta","item_id":"rs_1","delta":"Thinking"}"#,
    ));
    assert_ends_waiting(&event(r#"{"type":"response.completed","response":{}}"#));
    assert_ends_waiting(&event(r#"{"type":"response.incomplete","response":{}}"#));
    assert_ends_waiting(&event(
        r#"{"type":"error","code":"server_error","message":"x"}"#,
    ));
    assert_ends_waiting(&event(r#"{"type":"response.output_item.done","item":{}}"#));
}

/// An Anthropic Messages API event as sent: `event:` then `data:`.
fn anthropic(kind: &str, data: &str) -> Vec<u8> {
    format!("event: {kind}\ndata: {data}\n\n").into_bytes()
}

#[test]
fn anthropic_message_start_content_block_start_and_ping_are_interim() {
    let mut stream = Vec::new();
    stream.extend(anthropic(
        "message_start",
        r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude","stop_reason":null,"usage":{"input_tokens":25,"output_tokens":1}}}"#,
    ));
    stream.extend(anthropic(
        "content_block_start",
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
    ));
    stream.extend(anthropic("ping", r#"{"type": "ping"}"#));
    // A tool call starts with an empty piece of its JSON input.
    stream.extend(anthropic(
        "content_block_delta",
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}"#,
    ));
    stream.extend(anthropic(
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":""}}"#,
    ));
    assert_interim(&stream);

    let token = anthropic(
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
    );
    let mut with_token = stream.clone();
    with_token.extend(&token);
    assert_eq!(
        decide_any_split(&OpenAiSse::new(), &with_token),
        Some(with_token.len())
    );
}

#[test]
fn anthropic_deltas_with_a_payload_end_waiting() {
    for delta in [
        r#"{"type":"text_delta","text":"Hi"}"#,
        r#"{"type":"input_json_delta","partial_json":"{\"city\""}"#,
        r#"{"type":"thinking_delta","thinking":"Let me"}"#,
        r#"{"type":"signature_delta","signature":"EqQB"}"#,
    ] {
        let data = format!(r#"{{"type":"content_block_delta","index":0,"delta":{delta}}}"#);
        assert_ends_waiting(&anthropic("content_block_delta", &data));
    }
}

#[test]
fn anthropic_message_stop_ends_waiting_as_completion() {
    for (kind, data) in [
        ("message_stop", r#"{"type":"message_stop"}"#),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":0}}"#,
        ),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        (
            "error",
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ),
    ] {
        assert_ends_waiting(&anthropic(kind, data));
    }
}

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
    let mut detector = OpenAiSse::new();
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
        decide_any_split(&OpenAiSse::new(), stream.as_bytes()),
        Some(expected)
    );
}

#[test]
fn cr_line_endings_are_understood() {
    let interim = format!("data: {}\r\r", chat_delta(r#"{"role":"assistant"}"#));
    let token = format!(": c\rdata: {}\r\r", chat_delta(r#"{"content":"Hi"}"#));
    let stream = format!("{interim}{token}");
    assert_eq!(
        decide_any_split(&OpenAiSse::new(), stream.as_bytes()),
        Some(stream.len())
    );
}

#[test]
fn a_crlf_split_between_frames_ends_one_line() {
    let mut detector = OpenAiSse::new();
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
        decide_any_split(&OpenAiSse::new(), stream),
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
        decide_any_split(&OpenAiSse::new(), stream),
        Some(stream.len())
    );
    // Elsewhere it makes the field name unknown.
    assert_interim(b": hi\n\xEF\xBB\xBFdata: [DONE]\n\n");
}

#[test]
fn an_oversized_event_ends_waiting_where_it_crosses_the_bound() {
    let detector = OpenAiSse::new().max_event_bytes(16);
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
    let detector = OpenAiSse::new().max_event_bytes(16);
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
    let mut detector = OpenAiSse::new().max_event_bytes(16);
    let mut comment = b":".to_vec();
    comment.resize(1 << 20, b'x');
    assert_eq!(detector.on_data(&comment), None);
    assert_eq!(detector.on_data(b"\nid: 12345678901234567890\n\n"), None);
    assert_eq!(detector.parser.data.capacity(), 0);
}

#[test]
fn a_response_of_another_content_type_ends_waiting_at_its_first_byte() {
    let mut detector = OpenAiSse::new();
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
        let mut detector = OpenAiSse::new();
        detector.on_response(&head(content_type));
        let role = event(&chat_delta(r#"{"role":"assistant"}"#));
        assert_eq!(detector.on_data(&role), None, "{content_type:?}");
    }
}

#[test]
fn nothing_more_is_reported_once_waiting_has_ended() {
    let mut detector = OpenAiSse::new();
    assert_eq!(detector.on_data(b"data: [DONE]\n\n"), Some(14));
    assert_eq!(detector.on_data(b"data: [DONE]\n\n"), None);
    assert_eq!(detector.parser.data.capacity(), 0);
}

#[test]
fn a_configured_detector_holds_no_buffer() {
    let detector = OpenAiSse::new().max_event_bytes(1024);
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

/// The judgement as first written, over a `serde_json::Value`: the oracle
/// the allocation-free judge is checked against.
mod value_oracle {
    use serde_json::{Map, Value};

    /// Whether the data of one dispatched event is output or the end of the
    /// answer, rather than interim metadata.
    pub(super) fn event_ends_waiting(data: &[u8]) -> bool {
        let data = data.trim_ascii();
        if data.is_empty() {
            return false;
        }
        if data == b"[DONE]" {
            return true;
        }
        match serde_json::from_slice::<Value>(data) {
            Ok(Value::Object(chunk)) => chunk_ends_waiting(&chunk),
            // Not recognisably metadata: the client sees it as output.
            _ => true,
        }
    }

    // The delta members that carry generated output: the judge's list
    // (what is tested is how the judge reads a document, not the list).
    use crate::detect::openai_json::OUTPUT_DELTA_MEMBERS;

    fn chunk_ends_waiting(chunk: &Map<String, Value>) -> bool {
        let is_error = chunk.get("error").is_some_and(carries_something)
            || chunk.get("object").and_then(Value::as_str) == Some("error");
        let ends = match chunk.get("type").and_then(Value::as_str) {
            Some(kind) => named_event_ends_waiting(kind, chunk),
            None => match chunk.get("choices") {
                Some(Value::Array(choices)) => choices.iter().any(choice_ends_waiting),
                // Not a chat or completion chunk: not recognisably interim.
                _ => true,
            },
        };
        is_error || ends
    }

    /// An event named in `type`: interim if listed, a delta if it carries a
    /// payload, anything else ends waiting.
    fn named_event_ends_waiting(kind: &str, event: &Map<String, Value>) -> bool {
        let interim = matches!(
            kind,
            "message_start"
                | "content_block_start"
                | "ping"
                | "response.created"
                | "response.in_progress"
                | "response.queued"
        ) || (kind.starts_with("response.")
            && [
                ".added",
                ".in_progress",
                ".searching",
                ".generating",
                ".interpreting",
            ]
            .iter()
            .any(|suffix| kind.ends_with(suffix)));
        if interim {
            false
        } else if kind == "content_block_delta" || kind.ends_with(".delta") {
            event.get("delta").is_some_and(carries_payload)
        } else {
            true
        }
    }

    /// A delta's payload: for an object, a member other than `type` that
    /// carries something.
    fn carries_payload(delta: &Value) -> bool {
        match delta {
            Value::Object(members) => members
                .iter()
                .any(|(name, value)| name != "type" && carries_something(value)),
            other => carries_something(other),
        }
    }

    /// Only an object carries anything: `Value::get` finds no member in
    /// any other value.
    fn choice_ends_waiting(choice: &Value) -> bool {
        let carries = |value: Option<&Value>| value.is_some_and(carries_something);
        let delta = choice.get("delta").and_then(Value::as_object);
        carries(choice.get("finish_reason"))
            || carries(choice.get("text"))
            || OUTPUT_DELTA_MEMBERS
                .iter()
                .any(|member| carries(delta.and_then(|delta| delta.get(*member))))
    }

    /// Whether a member's value is more than a placeholder: not `null`, and
    /// not an empty string, array or object.
    fn carries_something(value: &Value) -> bool {
        match value {
            Value::Null => false,
            Value::String(text) => !text.is_empty(),
            Value::Array(items) => !items.is_empty(),
            Value::Object(members) => !members.is_empty(),
            Value::Bool(_) | Value::Number(_) => true,
        }
    }
}

mod judge_agrees_with_the_value_oracle {
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    fn json() -> impl Strategy<Value = Value> {
        let names = prop::sample::select(
            &[
                "choices",
                "delta",
                "content",
                "role",
                "reasoning_content",
                "reasoning",
                "refusal",
                "tool_calls",
                "function_call",
                "finish_reason",
                "text",
                "error",
                "object",
                "type",
                "usage",
                "index",
                "partial_json",
                "thinking",
            ][..],
        );
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            prop_oneof![
                Just(String::new()),
                Just("x".to_owned()),
                Just("error".to_owned()),
                Just("response.completed".to_owned()),
                Just("response.output_text.delta".to_owned()),
                Just("response.created".to_owned()),
                Just("response.output_item.added".to_owned()),
                Just("response.web_search_call.searching".to_owned()),
                Just("message_start".to_owned()),
                Just("content_block_start".to_owned()),
                Just("content_block_delta".to_owned()),
                Just("message_stop".to_owned()),
                Just("ping".to_owned()),
                Just("text_delta".to_owned()),
                Just("chat.completion.chunk".to_owned()),
                Just("stop".to_owned()),
            ]
            .prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 5, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::vec((names.clone(), inner), 0..5).prop_map(|members| {
                    Value::Object(
                        members
                            .into_iter()
                            .map(|(name, value)| (name.to_owned(), value))
                            .collect::<Map<String, Value>>(),
                    )
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn on_generated_json(value in json()) {
            let data = serde_json::to_vec(&value).unwrap();
            prop_assert_eq!(
                super::super::event_ends_waiting(&data),
                super::value_oracle::event_ends_waiting(&data),
                "{}", String::from_utf8_lossy(&data)
            );
        }

        #[test]
        fn on_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(
                super::super::event_ends_waiting(&data),
                super::value_oracle::event_ends_waiting(&data)
            );
        }
    }

    #[test]
    fn duplicate_members_count_as_their_last_occurrence() {
        for data in [
            &br#"{"choices":[{"delta":{"content":"x","content":""}}]}"#[..],
            br#"{"choices":[{"delta":{"content":"","content":"x"}}]}"#,
            br#"{"error":{"message":"x"},"error":null}"#,
            br#"{"type":"response.output_text.delta","delta":"x","delta":""}"#,
        ] {
            assert_eq!(
                super::super::event_ends_waiting(data),
                super::value_oracle::event_ends_waiting(data),
                "{}",
                String::from_utf8_lossy(data)
            );
        }
    }
}

#[test]
fn an_event_whole_in_its_frame_is_judged_in_place() {
    let mut detector = OpenAiSse::new();
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
        decide_any_split(&OpenAiSse::new(), &stream),
        Some(stream.len())
    );
}

/// A data line kept in its frame counts its `\n` toward the bound, as the
/// same line copied into the buffer does (a case the fuzzer found: a
/// 9-byte data line, then an empty `data` line, against a bound of 10).
#[test]
fn a_data_line_meets_the_bound_alike_in_its_frame_and_buffered() {
    let mut detector = OpenAiSse::new().max_event_bytes(10);
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
    let detector = OpenAiSse::new().max_event_bytes(10);
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
                    let detector = OpenAiSse::new().max_event_bytes(bound);
                    let decided = decide_any_split(&detector, stream.as_bytes());
                    assert!(decided.is_some(), "{stream:?} with bound {bound}");
                }
            }
        }
        // Where the decision falls: the first byte of the blank line's end.
        let stream = format!("data: {role}{end}{end}data: {token}{end}{end}");
        let lf_after_cr = if end == "\r\n" { 1 } else { 0 };
        assert_eq!(
            decide_any_split(&OpenAiSse::new(), stream.as_bytes()),
            Some(stream.len() - lf_after_cr),
            "{end:?}"
        );
        let interim = format!("data: {role}{end}{end}: ping{end}{end}");
        assert_eq!(
            decide_any_split(&OpenAiSse::new(), interim.as_bytes()),
            None,
            "{end:?}"
        );
    }
}
