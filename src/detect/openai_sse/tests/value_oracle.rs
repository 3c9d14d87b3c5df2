//! The judgement as first written, over a `serde_json::Value`: the oracle
//! the allocation-free judge is checked against.

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
