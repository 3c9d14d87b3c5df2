//! The Anthropic Messages API's events: which are interim, which end
//! waiting.

use super::*;

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
        decide_any_split(&OpenAiSse::default(), &with_token),
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
