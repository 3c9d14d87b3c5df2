//! Judging one OpenAI-compatible event's JSON without building it: a
//! streaming pass over the document that keeps a few booleans and allocates
//! nothing. This runs on every event before the first token, so it is on
//! every request's path.
//!
//! Duplicate members are judged as `serde_json::Value` would keep them: the
//! last one wins.

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

use crate::json::{answer_json, seed_any};

/// Whether the data of one event is output or the end of the answer:
/// `Some(true)`/`Some(false)` for a JSON object, `None` for anything else
/// (another JSON value, or not JSON at all).
pub(super) fn object_ends_waiting(data: &[u8]) -> Option<bool> {
    // Invalid UTF-8 anywhere makes the document invalid JSON. Checking it
    // once up front is cheaper than `from_slice` checking every string.
    let data = std::str::from_utf8(data).ok()?;
    let mut deserializer = serde_json::Deserializer::from_str(data);
    let judged = deserializer.deserialize_any(TopLevel).ok()?;
    deserializer.end().ok()?;
    judged
}

/// The delta members that carry generated output.
pub(super) const OUTPUT_DELTA_MEMBERS: [&str; 6] = [
    "content",
    "reasoning_content",
    "reasoning",
    "refusal",
    "tool_calls",
    "function_call",
];

/// Drains whatever value is next; used where a value's content does not matter.
fn skip<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    map.next_value::<IgnoredAny>().map(drop)
}

/// The document: an object is judged, anything else is `None`.
struct TopLevel;

impl<'de> Visitor<'de> for TopLevel {
    type Value = Option<bool>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<bool>, A::Error> {
        let mut error = false;
        let mut object_is_error = false;
        let mut choices = None;
        let mut kind = Kind::default();
        let mut delta = false;
        while let Some(key) =
            map.next_key_seed(KeyIs(&["error", "object", "choices", "type", "delta"]))?
        {
            match key {
                Some(0) => error = map.next_value_seed(Something)?,
                Some(1) => object_is_error = map.next_value_seed(StrIs("error"))?,
                Some(2) => choices = map.next_value_seed(Choices)?,
                Some(3) => kind = map.next_value_seed(KindOf)?,
                Some(4) => delta = map.next_value_seed(Payload)?,
                _ => skip(&mut map)?,
            }
        }
        let ends = match kind {
            // Events named in `type` (the Responses API, Anthropic's
            // Messages API): interim when listed as such, or a delta
            // without payload; any other event ends waiting.
            Kind::Interim => false,
            Kind::Delta => delta,
            Kind::Other => true,
            // A chat or completion chunk: its choices decide. Anything else
            // is not recognisably interim.
            Kind::Unnamed => choices.unwrap_or(true),
        };
        Ok(Some(error || object_is_error || ends))
    }

    answer_json!(None; numbers, unit, str, arrays);
}

/// A member name: `Some(i)` when it is `names[i]`, else `None`.
struct KeyIs(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for KeyIs {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<usize>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|candidate| *candidate == name))
    }
}

/// Whether a value is more than a placeholder: not `null`, and not an empty
/// string, array or object.
struct Something;

impl<'de> Visitor<'de> for Something {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    answer_json!(true; numbers);
    answer_json!(false; unit);
    fn visit_str<E>(self, text: &str) -> Result<bool, E> {
        Ok(!text.is_empty())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let mut any = false;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            any = true;
        }
        Ok(any)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut any = false;
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
            any = true;
        }
        Ok(any)
    }
}

/// Whether a value is the string given.
struct StrIs(&'static str);

impl<'de> Visitor<'de> for StrIs {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E>(self, text: &str) -> Result<bool, E> {
        Ok(text == self.0)
    }
    answer_json!(false; numbers, unit, arrays, objects);
}

/// What an event's `type` says.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// No `type`, or one that is not a string.
    #[default]
    Unnamed,
    /// An event listed as interim metadata.
    Interim,
    /// A delta event: output if its `delta` carries a payload.
    Delta,
    /// Any other event.
    Other,
}

/// Events that are interim metadata, by their `type`: Anthropic's
/// `message_start`, `content_block_start` and `ping`, and the Responses
/// API's lifecycle events.
pub(super) const INTERIM_EVENTS: [&str; 6] = [
    "message_start",
    "content_block_start",
    "ping",
    "response.created",
    "response.in_progress",
    "response.queued",
];

/// Responses API events (`response.…`) that are interim metadata, by the
/// end of their `type`: an output item or content part announced empty, a
/// built-in tool's progress.
pub(super) const INTERIM_RESPONSE_SUFFIXES: [&str; 5] = [
    ".added",
    ".in_progress",
    ".searching",
    ".generating",
    ".interpreting",
];

/// What the event named `kind` is.
fn kind_of(kind: &str) -> Kind {
    if INTERIM_EVENTS.contains(&kind)
        || (kind.starts_with("response.")
            && INTERIM_RESPONSE_SUFFIXES
                .iter()
                .any(|suffix| kind.ends_with(suffix)))
    {
        Kind::Interim
    } else if kind == "content_block_delta" || kind.ends_with(".delta") {
        Kind::Delta
    } else {
        Kind::Other
    }
}

struct KindOf;

impl<'de> Visitor<'de> for KindOf {
    type Value = Kind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E>(self, kind: &str) -> Result<Kind, E> {
        Ok(kind_of(kind))
    }
    answer_json!(Kind::Unnamed; numbers, unit, arrays, objects);
}

/// An event's `delta`: whether it carries a payload. A string or array
/// does when not empty; an object (Anthropic's `{"type":"text_delta",
/// "text":"…"}`) when a member other than `type` carries something.
struct Payload;

impl<'de> Visitor<'de> for Payload {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    answer_json!(true; numbers);
    answer_json!(false; unit);
    fn visit_str<E>(self, text: &str) -> Result<bool, E> {
        Ok(!text.is_empty())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<bool, A::Error> {
        Something.visit_seq(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut any = false;
        while let Some(key) = map.next_key_seed(KeyIs(&["type"]))? {
            match key {
                Some(_) => skip(&mut map)?,
                None => any |= map.next_value_seed(Something)?,
            }
        }
        Ok(any)
    }
}

/// `choices`: for an array, whether any choice carries output or a finish
/// reason; `None` for any other value, which is drained.
struct Choices;

impl<'de> Visitor<'de> for Choices {
    type Value = Option<bool>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<bool>, A::Error> {
        let mut any = false;
        while let Some(ends) = seq.next_element_seed(Choice)? {
            any |= ends;
        }
        Ok(Some(any))
    }

    answer_json!(None; numbers, unit, str, objects);
}

/// One choice: a `finish_reason`, completion `text`, or an output member of
/// its `delta`. Only an object can say yes.
struct Choice;

impl<'de> Visitor<'de> for Choice {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut finished = false;
        let mut text = false;
        let mut delta = false;
        while let Some(key) = map.next_key_seed(KeyIs(&["finish_reason", "text", "delta"]))? {
            match key {
                Some(0) => finished = map.next_value_seed(Something)?,
                Some(1) => text = map.next_value_seed(Something)?,
                Some(2) => delta = map.next_value_seed(Delta)?,
                _ => skip(&mut map)?,
            }
        }
        Ok(finished || text || delta)
    }

    answer_json!(false; numbers, unit, str, arrays);
}

/// A chat `delta`: whether any output member carries something (each
/// member's last occurrence counts). Only an object can say yes.
struct Delta;

impl<'de> Visitor<'de> for Delta {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut carries = [false; OUTPUT_DELTA_MEMBERS.len()];
        while let Some(key) = map.next_key_seed(KeyIs(&OUTPUT_DELTA_MEMBERS))? {
            match key {
                Some(member) => carries[member] = map.next_value_seed(Something)?,
                None => skip(&mut map)?,
            }
        }
        Ok(carries.iter().any(|&carries| carries))
    }

    answer_json!(false; numbers, unit, str, arrays);
}

seed_any!(Something, StrIs, KindOf, Payload, Choices, Choice, Delta);
