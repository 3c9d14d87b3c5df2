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

use self::lex::{JsonStr, Value};

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
    let mut scan = Scan { bytes: data, at: 0 };
    // Any value but an object is `None`, whether or not it is valid JSON.
    if scan.peek()? != b'{' {
        return None;
    }
    let judged = scan.event()?;
    scan.skip_whitespace();
    (scan.at == data.len()).then_some(judged)
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

/// A position in a document; each method reads one piece of JSON and
/// returns `None` where the document is not valid JSON.
struct Scan<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Scan<'a> {
    #[inline]
    fn byte(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    #[inline]
    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.byte() {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not taken.
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.byte()
    }

    /// Takes `expected` as the next byte after whitespace.
    fn take(&mut self, expected: u8) -> Option<()> {
        (self.peek()? == expected).then(|| self.at += 1)
    }

    /// The event, at its `{`: whether it ends waiting.
    fn event(&mut self) -> Option<bool> {
        self.at += 1;
        let mut error = false;
        let mut object_is_error = false;
        let mut choices = None;
        let mut kind = Kind::default();
        let mut delta = false;
        let names: [&[u8]; 5] = [b"error", b"object", b"choices", b"type", b"delta"];
        self.named_members(&names, |scan, member| {
            match member {
                0 => error = scan.something()?,
                1 => object_is_error = scan.is_str(b"error")?,
                2 => choices = scan.choices()?,
                3 => kind = scan.kind()?,
                _ => delta = scan.payload()?,
            }
            Some(())
        })?;
        Some(error || object_is_error || kind.ends_waiting(delta, choices))
    }

    /// Whether a value is more than a placeholder: not `null`, and not an
    /// empty string, array or object.
    fn something(&mut self) -> Option<bool> {
        self.carries(|scan| scan.any_member(|scan, _| scan.skip_value().map(|()| true)))
    }

    /// Whether a value carries something: a scalar other than `null` or
    /// `""`, an array with an element; an object as `object` (called after
    /// its `{`) says.
    fn carries(&mut self, object: impl FnOnce(&mut Self) -> Option<bool>) -> Option<bool> {
        Some(match self.value()? {
            Value::Null => false,
            Value::Scalar => true,
            Value::String(text) => !text.is_empty(),
            Value::Array => {
                let mut any = false;
                self.elements(|scan| {
                    any = true;
                    scan.skip_value()
                })?;
                any
            }
            Value::Object => object(self)?,
        })
    }

    /// Whether `member` says yes of any member of an object, after its `{`.
    /// It reads every member's value, as serde_json does.
    fn any_member(
        &mut self,
        mut member: impl FnMut(&mut Self, JsonStr<'a>) -> Option<bool>,
    ) -> Option<bool> {
        let mut any = false;
        self.members(|scan, name| {
            any |= member(scan, name)?;
            Some(())
        })?;
        Some(any)
    }

    /// Whether a value is the string `expected`.
    fn is_str(&mut self, expected: &[u8]) -> Option<bool> {
        match self.value()? {
            Value::String(text) => Some(*text.meaning() == *expected),
            other => self.drain(other).map(|()| false),
        }
    }

    /// What an event's `type` says.
    fn kind(&mut self) -> Option<Kind> {
        match self.value()? {
            // The meaning of a valid string is UTF-8.
            Value::String(kind) => {
                Some(std::str::from_utf8(&kind.meaning()).map_or(Kind::Other, kind_of))
            }
            other => self.drain(other).map(|()| Kind::Unnamed),
        }
    }

    /// An event's `delta`: whether it carries a payload. A string or array
    /// does when not empty; an object (Anthropic's `{"type":"text_delta",
    /// "text":"…"}`) when a member other than `type` carries something.
    fn payload(&mut self) -> Option<bool> {
        self.carries(|scan| {
            scan.any_member(|scan, name| {
                if *name.meaning() == *b"type" {
                    scan.skip_value().map(|()| false)
                } else {
                    scan.something()
                }
            })
        })
    }

    /// `choices`: for an array, whether any choice carries output or a
    /// finish reason; `None` for any other value.
    fn choices(&mut self) -> Option<Option<bool>> {
        match self.value()? {
            Value::Array => {
                let mut any = false;
                self.elements(|scan| {
                    any |= scan.choice()?;
                    Some(())
                })?;
                Some(Some(any))
            }
            other => self.drain(other).map(|()| None),
        }
    }

    /// One choice: a `finish_reason`, completion `text`, or an output
    /// member of its `delta`. Only an object can say yes.
    fn choice(&mut self) -> Option<bool> {
        let value = self.value()?;
        if !matches!(value, Value::Object) {
            return self.drain(value).map(|()| false);
        }
        let mut finished = false;
        let mut text = false;
        let mut delta = false;
        let names: [&[u8]; 3] = [b"finish_reason", b"text", b"delta"];
        self.named_members(&names, |scan, member| {
            match member {
                0 => finished = scan.something()?,
                1 => text = scan.something()?,
                _ => delta = scan.delta()?,
            }
            Some(())
        })?;
        Some(finished || text || delta)
    }

    /// A chat `delta`: whether any output member carries something (each
    /// member's last occurrence counts). Only an object can say yes.
    fn delta(&mut self) -> Option<bool> {
        let value = self.value()?;
        if !matches!(value, Value::Object) {
            return self.drain(value).map(|()| false);
        }
        let mut carries = [false; OUTPUT_DELTA_MEMBERS.len()];
        let names = OUTPUT_DELTA_MEMBERS.map(str::as_bytes);
        self.named_members(&names, |scan, member| {
            carries[member] = scan.something()?;
            Some(())
        })?;
        Some(carries.contains(&true))
    }
}

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
