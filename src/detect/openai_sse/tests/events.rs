//! What ends waiting, event by event: Chat Completions chunks (content,
//! reasoning, refusals, tool calls, completions, finish reasons, `[DONE]`,
//! errors) and the Responses API's lifecycle, output and terminal events.

use super::*;

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
