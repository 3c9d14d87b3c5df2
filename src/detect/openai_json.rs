//! Judging one OpenAI-compatible event's JSON without building it: one pass
//! over the bytes that reads the few members the judgement needs, skips the
//! rest, keeps a few booleans and copies nothing. This runs on every event
//! before the first token, so it is on every request's path.
//!
//! The scan accepts exactly the documents the `serde_json` pass it replaced
//! accepted (kept as the test-only [`reference`] it is checked against),
//! and reads them alike:
//!
//! * a value the judgement reads (a member it looks for, an element of
//!   `choices`) is checked as serde_json checks a value it visits: its
//!   strings may not hold a lone surrogate escape, its numbers must fit an
//!   `f64`, and an object's member names are read as strings;
//! * a value the judgement skips is checked as serde_json checks a value it
//!   ignores: JSON's grammar only, with lone surrogates and numbers of any
//!   size let through, nested to any depth;
//! * duplicate members are judged as `serde_json::Value` would keep them:
//!   the last one wins.

mod lex;
mod plain;

use std::borrow::Cow;

use self::lex::Scan;

/// Whether the data of one event is output or the end of the answer:
/// `Some(true)`/`Some(false)` for a JSON object, `None` for anything else
/// (another JSON value, or not JSON at all).
pub(super) fn object_ends_waiting(data: &[u8]) -> Option<bool> {
    // Most chunks are plain: judged in one tight pass.
    if let Some(judged) = plain::judge(data) {
        return Some(judged);
    }
    scanned(data)
}

/// The full scan: [`object_ends_waiting`] for any document.
fn scanned(data: &[u8]) -> Option<bool> {
    // Invalid UTF-8 anywhere makes the document invalid JSON. Outside
    // strings JSON is ASCII, which the scan checks byte by byte; a string
    // with other bytes is checked as UTF-8 when it is read.
    let mut scan = Scan::new(data);
    // Any value but an object is `None`, whether or not it is valid JSON.
    scan.take(b'{')?;
    let judged = event(&mut scan)?;
    scan.at_end().then_some(judged)
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

impl Kind {
    /// Whether an event of this kind ends waiting, given whether its
    /// `delta` carries a payload and what its `choices` say.
    fn ends_waiting(self, delta: bool, choices: Option<bool>) -> bool {
        match self {
            // Events named in `type` (the Responses API, Anthropic's
            // Messages API): interim when listed as such, or a delta
            // without payload; any other event ends waiting.
            Kind::Interim => false,
            Kind::Delta => delta,
            Kind::Other => true,
            // A chat or completion chunk: its choices decide. Anything else
            // is not recognisably interim.
            Kind::Unnamed => choices.unwrap_or(true),
        }
    }
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

/// The start of a value as a [`Reader`] reads it: a scalar read whole, or
/// the opening bracket of an array or object, whose contents the caller
/// reads next (or drains).
#[derive(Clone, Copy)]
enum Start<S> {
    Null,
    /// `true`, `false` or a number.
    Scalar,
    /// A string, as the reader read it.
    String(S),
    Array,
    Object,
}

/// A string a [`Reader`] read, known to be valid.
trait Text<'a>: Copy {
    /// The string meant, as UTF-8.
    fn meaning(self) -> Cow<'a, [u8]>;

    /// Whether the string meant is empty.
    fn is_empty(self) -> bool;
}

/// A reader of one document's JSON: the full scan ([`Scan`]) or the plain
/// pass ([`plain`]). The judgement below is written once over it, so both
/// passes judge alike; each reader decides which documents it accepts and
/// how it checks them. Every method returns `None` where the reader refuses
/// the document.
trait Reader<'a>: Sized {
    /// A string as this reader reads it.
    type Str: Text<'a>;

    /// Reads the start of a value the judgement reads.
    fn value(&mut self) -> Option<Start<Self::Str>>;

    /// The elements of an array, after its `[`: `element` reads each.
    fn elements(&mut self, element: impl FnMut(&mut Self) -> Option<()>) -> Option<()>;

    /// The members of an object, after its `{`: `member` reads the value of
    /// each, given its name.
    fn members(&mut self, member: impl FnMut(&mut Self, Self::Str) -> Option<()>) -> Option<()>;

    /// The members of an object, after its `{`: `read` reads the value of
    /// each member named `names[i]`, given `i`; the others are skipped.
    fn named_members(
        &mut self,
        names: &[&[u8]],
        read: impl FnMut(&mut Self, usize) -> Option<()>,
    ) -> Option<()>;

    /// Skips a value the judgement does not read.
    fn skip_value(&mut self) -> Option<()>;

    /// Reads to its end a value whose start was read, but which the
    /// judgement does not look into (a `type` that is an object, say): an
    /// array's elements are skipped, an object's member names read and its
    /// values skipped.
    #[inline]
    fn drain(&mut self, start: Start<Self::Str>) -> Option<()> {
        match start {
            Start::Array => self.elements(Self::skip_value),
            Start::Object => self.members(|reader, _| reader.skip_value()),
            Start::Null | Start::Scalar | Start::String(_) => Some(()),
        }
    }
}

/// The event, after its `{`: whether it ends waiting.
fn event<'a>(reader: &mut impl Reader<'a>) -> Option<bool> {
    let mut error = false;
    let mut object_is_error = false;
    let mut choices = None;
    let mut kind = Kind::default();
    let mut delta = false;
    let names: [&[u8]; 5] = [b"error", b"object", b"choices", b"type", b"delta"];
    reader.named_members(&names, |reader, member| {
        match member {
            0 => error = something(reader)?,
            1 => object_is_error = is_str(reader, b"error")?,
            2 => choices = self::choices(reader)?,
            3 => kind = self::kind(reader)?,
            _ => delta = payload(reader)?,
        }
        Some(())
    })?;
    Some(error || object_is_error || kind.ends_waiting(delta, choices))
}

/// Whether a value is more than a placeholder: not `null`, and not an
/// empty string, array or object.
fn something<'a, R: Reader<'a>>(reader: &mut R) -> Option<bool> {
    carries(reader, |reader| {
        any_member(reader, |reader, _| reader.skip_value().map(|()| true))
    })
}

/// Whether a value carries something: a scalar other than `null` or `""`,
/// an array with an element; an object as `object` (called after its `{`)
/// says.
fn carries<'a, R: Reader<'a>>(
    reader: &mut R,
    object: impl FnOnce(&mut R) -> Option<bool>,
) -> Option<bool> {
    Some(match reader.value()? {
        Start::Null => false,
        Start::Scalar => true,
        Start::String(text) => !text.is_empty(),
        Start::Array => {
            let mut any = false;
            reader.elements(|reader| {
                any = true;
                reader.skip_value()
            })?;
            any
        }
        Start::Object => object(reader)?,
    })
}

/// Whether `member` says yes of any member of an object, after its `{`.
/// It reads every member's value, as serde_json does.
fn any_member<'a, R: Reader<'a>>(
    reader: &mut R,
    mut member: impl FnMut(&mut R, R::Str) -> Option<bool>,
) -> Option<bool> {
    let mut any = false;
    reader.members(|reader, name| {
        any |= member(reader, name)?;
        Some(())
    })?;
    Some(any)
}

/// Whether a value is the string `expected`.
fn is_str<'a>(reader: &mut impl Reader<'a>, expected: &[u8]) -> Option<bool> {
    match reader.value()? {
        Start::String(text) => Some(*text.meaning() == *expected),
        other => reader.drain(other).map(|()| false),
    }
}

/// What an event's `type` says.
fn kind<'a>(reader: &mut impl Reader<'a>) -> Option<Kind> {
    match reader.value()? {
        // The meaning of a valid string is UTF-8.
        Start::String(kind) => {
            Some(std::str::from_utf8(&kind.meaning()).map_or(Kind::Other, kind_of))
        }
        other => reader.drain(other).map(|()| Kind::Unnamed),
    }
}

/// An event's `delta`: whether it carries a payload. A string or array does
/// when not empty; an object (Anthropic's `{"type":"text_delta",
/// "text":"…"}`) when a member other than `type` carries something.
fn payload<'a>(reader: &mut impl Reader<'a>) -> Option<bool> {
    carries(reader, |reader| {
        any_member(reader, |reader, name| {
            if *name.meaning() == *b"type" {
                reader.skip_value().map(|()| false)
            } else {
                something(reader)
            }
        })
    })
}

/// `choices`: for an array, whether any choice carries output or a finish
/// reason; `None` for any other value.
fn choices<'a>(reader: &mut impl Reader<'a>) -> Option<Option<bool>> {
    match reader.value()? {
        Start::Array => {
            let mut any = false;
            reader.elements(|reader| {
                any |= choice(reader)?;
                Some(())
            })?;
            Some(Some(any))
        }
        other => reader.drain(other).map(|()| None),
    }
}

/// One choice: a `finish_reason`, completion `text`, or an output member of
/// its `delta`. Only an object can say yes.
fn choice<'a>(reader: &mut impl Reader<'a>) -> Option<bool> {
    let start = reader.value()?;
    if !matches!(start, Start::Object) {
        return reader.drain(start).map(|()| false);
    }
    let mut finished = false;
    let mut text = false;
    let mut delta = false;
    let names: [&[u8]; 3] = [b"finish_reason", b"text", b"delta"];
    reader.named_members(&names, |reader, member| {
        match member {
            0 => finished = something(reader)?,
            1 => text = something(reader)?,
            _ => delta = self::delta(reader)?,
        }
        Some(())
    })?;
    Some(finished || text || delta)
}

/// A chat `delta`: whether any output member carries something (each
/// member's last occurrence counts). Only an object can say yes.
fn delta<'a>(reader: &mut impl Reader<'a>) -> Option<bool> {
    let start = reader.value()?;
    if !matches!(start, Start::Object) {
        return reader.drain(start).map(|()| false);
    }
    let mut carries = [false; OUTPUT_DELTA_MEMBERS.len()];
    let names = OUTPUT_DELTA_MEMBERS.map(str::as_bytes);
    reader.named_members(&names, |reader, member| {
        carries[member] = something(reader)?;
        Some(())
    })?;
    Some(carries.contains(&true))
}

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
