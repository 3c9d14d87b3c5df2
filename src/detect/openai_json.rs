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

use std::borrow::Cow;

/// Whether the data of one event is output or the end of the answer:
/// `Some(true)`/`Some(false)` for a JSON object, `None` for anything else
/// (another JSON value, or not JSON at all).
pub(super) fn object_ends_waiting(data: &[u8]) -> Option<bool> {
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

/// The start of a value the judgement reads: a scalar read whole (and
/// checked as serde_json checks a value it visits), or the opening bracket
/// of an array or object, whose contents the caller reads.
enum Value<'a> {
    Null,
    /// `true`, `false` or a number.
    Scalar,
    String(JsonStr<'a>),
    Array,
    Object,
}

/// A string as written between its quotes, known to be valid.
#[derive(Clone, Copy)]
struct JsonStr<'a> {
    raw: &'a [u8],
    /// Whether `raw` holds an escape, so differs from the string it means.
    escaped: bool,
}

impl<'a> JsonStr<'a> {
    /// The string meant, as UTF-8; copied only when written with escapes.
    #[inline]
    fn meaning(self) -> Cow<'a, [u8]> {
        if self.escaped {
            Cow::Owned(unescape(self.raw))
        } else {
            Cow::Borrowed(self.raw)
        }
    }

    /// Whether the string meant is empty: every escape means a character.
    #[inline]
    fn is_empty(self) -> bool {
        self.raw.is_empty()
    }
}

/// The string, as UTF-8, that a checked string's raw text means (lone
/// surrogates, which a checked string cannot hold, would become U+FFFD).
fn unescape(raw: &[u8]) -> Vec<u8> {
    let mut text = Vec::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(backslash) = rest.iter().position(|&byte| byte == b'\\') {
        text.extend_from_slice(&rest[..backslash]);
        let escape = &rest[backslash + 1..];
        let (meant, len) = match escape.first() {
            Some(b'u') => {
                let unit = hex_unit(escape.get(1..5)).unwrap_or(0xFFFD);
                match (unit, escape.get(5..7), hex_unit(escape.get(7..11))) {
                    (0xD800..=0xDBFF, Some(b"\\u"), Some(low @ 0xDC00..=0xDFFF)) => {
                        let high = u32::from(unit - 0xD800) << 10;
                        (
                            char::from_u32(0x1_0000 + high + u32::from(low - 0xDC00)),
                            11,
                        )
                    }
                    _ => (char::from_u32(u32::from(unit)), 5),
                }
            }
            Some(b'b') => (Some('\u{8}'), 1),
            Some(b'f') => (Some('\u{c}'), 1),
            Some(b'n') => (Some('\n'), 1),
            Some(b'r') => (Some('\r'), 1),
            Some(b't') => (Some('\t'), 1),
            // `"`, `\` and `/` mean themselves.
            Some(&byte) => (Some(char::from(byte)), 1),
            None => (None, 0),
        };
        let meant = meant.unwrap_or(char::REPLACEMENT_CHARACTER);
        text.extend_from_slice(meant.encode_utf8(&mut [0; 4]).as_bytes());
        rest = escape.get(len..).unwrap_or_default();
    }
    text.extend_from_slice(rest);
    text
}

/// The UTF-16 unit four hex digits write.
fn hex_unit(digits: Option<&[u8]>) -> Option<u16> {
    let digits = digits?;
    if digits.len() != 4 {
        return None;
    }
    digits.iter().try_fold(0u16, |unit, &digit| {
        let value = char::from(digit).to_digit(16)?;
        Some(unit << 4 | value as u16)
    })
}

/// Whether a string's surrogate escapes are checked: serde_json refuses a
/// lone surrogate in a string it visits, not in one it ignores.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Surrogates {
    Checked,
    Unchecked,
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

    /// Reads to its end a value the judgement reads but does not look into
    /// (a `type` that is an object, say): an array's elements are skipped,
    /// an object's member names read as strings and its values skipped.
    fn drain(&mut self, value: Value<'a>) -> Option<()> {
        match value {
            Value::Array => self.elements(Self::skip_value),
            Value::Object => self.members(|scan, _| scan.skip_value()),
            Value::Null | Value::Scalar | Value::String(_) => Some(()),
        }
    }

    /// Reads the start of a value the judgement reads.
    fn value(&mut self) -> Option<Value<'a>> {
        let value = match self.peek()? {
            b'[' => Value::Array,
            b'{' => Value::Object,
            b'"' => return self.string(Surrogates::Checked).map(Value::String),
            b'n' => return self.literal("null").map(|()| Value::Null),
            first => return self.scalar(first, true).map(|()| Value::Scalar),
        };
        self.at += 1;
        Some(value)
    }

    /// The elements of an array, after its `[`: `element` reads each.
    fn elements(&mut self, element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.items(b']', element)
    }

    /// The members of an object, after its `{`: each name is read as a
    /// string serde_json visits, and `member` reads its value.
    fn members(
        &mut self,
        mut member: impl FnMut(&mut Self, JsonStr<'a>) -> Option<()>,
    ) -> Option<()> {
        self.items(b'}', |scan| {
            let name = scan.name(Surrogates::Checked)?;
            member(scan, name)
        })
    }

    /// Items up to `close`: `item` reads each, and this the commas between
    /// them and `close`. After a comma, `item` refuses `close`: JSON has no
    /// trailing commas.
    fn items(&mut self, close: u8, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if self.peek()? == close {
            self.at += 1;
            return Some(());
        }
        loop {
            item(self)?;
            match self.peek()? {
                b',' => self.at += 1,
                byte if byte == close => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// The members of an object, after its `{`: `read` reads the value of
    /// each member named `names[i]`, given `i`; the others are skipped.
    fn named_members(
        &mut self,
        names: &[&[u8]],
        mut read: impl FnMut(&mut Self, usize) -> Option<()>,
    ) -> Option<()> {
        self.members(|scan, name| {
            let name = name.meaning();
            match names.iter().position(|candidate| **candidate == *name) {
                Some(member) => read(scan, member),
                None => scan.skip_value(),
            }
        })
    }

    /// A member's name and the `:` after it.
    fn name(&mut self, surrogates: Surrogates) -> Option<JsonStr<'a>> {
        if self.peek()? != b'"' {
            return None;
        }
        let name = self.string(surrogates)?;
        self.take(b':')?;
        Some(name)
    }

    /// Skips a value as serde_json ignores one: to any depth, keeping a bit
    /// per level of nesting (on the heap only past 64 levels), with strings'
    /// surrogates and numbers' range unchecked.
    fn skip_value(&mut self) -> Option<()> {
        let first = self.peek()?;
        if !matches!(first, b'[' | b'{') {
            return self.skip_scalar(first);
        }
        let mut open = Nesting::default();
        loop {
            match self.peek()? {
                bracket @ (b'[' | b'{') => {
                    self.at += 1;
                    let object = bracket == b'{';
                    if self.peek()? == if object { b'}' } else { b']' } {
                        self.at += 1;
                    } else {
                        open.push(object);
                        if object {
                            self.name(Surrogates::Unchecked)?;
                        }
                        continue;
                    }
                }
                first => self.skip_scalar(first)?,
            }
            // A value has ended: close what it ends, or go on to the next.
            loop {
                let Some(object) = open.innermost() else {
                    return Some(());
                };
                match (self.peek()?, object) {
                    (b',', false) => {
                        self.at += 1;
                        break;
                    }
                    (b',', true) => {
                        self.at += 1;
                        self.name(Surrogates::Unchecked)?;
                        break;
                    }
                    (b']', false) | (b'}', true) => {
                        self.at += 1;
                        open.pop();
                    }
                    _ => return None,
                }
            }
        }
    }

    /// A string, `null`, `true`, `false` or a number, starting with
    /// `first`, as serde_json ignores one.
    fn skip_scalar(&mut self, first: u8) -> Option<()> {
        match first {
            b'"' => self.string(Surrogates::Unchecked).map(drop),
            b'n' => self.literal("null"),
            first => self.scalar(first, false),
        }
    }

    /// `true`, `false` or a number, starting with `first`. A number is
    /// `checked` as serde_json checks one it visits: it must fit an `f64`.
    fn scalar(&mut self, first: u8, checked: bool) -> Option<()> {
        match first {
            b't' => self.literal("true"),
            b'f' => self.literal("false"),
            b'-' | b'0'..=b'9' => self.number(checked),
            _ => None,
        }
    }

    fn literal(&mut self, word: &str) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word.as_bytes()).then(|| self.at = end)
    }

    /// A number, as JSON writes it.
    fn number(&mut self, checked: bool) -> Option<()> {
        let start = self.at;
        if self.byte() == Some(b'-') {
            self.at += 1;
        }
        match self.byte()? {
            // One leading zero, no more.
            b'0' => self.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        let integer = self.at;
        if self.byte() == Some(b'.') {
            self.at += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.byte() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.byte() {
                self.at += 1;
            }
            self.some_digits()?;
        }
        // An integer of up to 20 characters fits any way serde_json reads
        // it. Anything else (rare where the judgement reads) is read by
        // serde_json itself, whose features decide what is out of range.
        if checked && (self.at != integer || self.at - start > 20) {
            let number = self.bytes.get(start..self.at)?;
            let mut deserializer = serde_json::Deserializer::from_slice(number);
            serde::Deserializer::deserialize_any(&mut deserializer, serde::de::IgnoredAny).ok()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.byte() {
            self.at += 1;
        }
    }

    /// At least one digit.
    fn some_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }

    /// A string, at its opening quote, through its closing one: no control
    /// characters, only JSON's escapes, valid UTF-8. Plain bytes are passed
    /// over eight at a time, since strings are most of a chunk's bytes.
    fn string(&mut self, surrogates: Surrogates) -> Option<JsonStr<'a>> {
        const HIGH_BITS: u64 = u64::from_ne_bytes([0x80; 8]);
        let bytes = self.bytes;
        let start = self.at + 1;
        let mut at = start;
        let mut escaped = false;
        // The bytes passed over, OR-ed: their high bits say whether all
        // were ASCII.
        let mut seen = 0;
        loop {
            while let Some(&eight) = bytes.get(at..).and_then(|rest| rest.first_chunk::<8>()) {
                let word = u64::from_le_bytes(eight);
                let stops = stops_in(word);
                if stops != 0 {
                    let plain = stops.trailing_zeros() / 8;
                    seen |= word & ((1 << (plain * 8)) - 1);
                    at += plain as usize;
                    break;
                }
                seen |= word;
                at += 8;
            }
            match *bytes.get(at)? {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    self.at = at + 1;
                    self.escape(surrogates)?;
                    at = self.at;
                }
                0..=0x1F => return None,
                byte => {
                    seen |= u64::from(byte);
                    at += 1;
                }
            }
        }
        let raw = &bytes[start..at];
        self.at = at + 1;
        if seen & HIGH_BITS != 0 {
            std::str::from_utf8(raw).ok()?;
        }
        Some(JsonStr { raw, escaped })
    }

    /// An escape, after its `\`.
    fn escape(&mut self, surrogates: Surrogates) -> Option<()> {
        let letter = self.byte()?;
        self.at += 1;
        match letter {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(()),
            b'u' => {
                let unit = self.hex_unit()?;
                match (surrogates, unit) {
                    (Surrogates::Unchecked, _) => Some(()),
                    (Surrogates::Checked, 0xDC00..=0xDFFF) => None,
                    // A high surrogate: a low one must follow.
                    (Surrogates::Checked, 0xD800..=0xDBFF) => {
                        self.literal("\\u")?;
                        matches!(self.hex_unit()?, 0xDC00..=0xDFFF).then_some(())
                    }
                    (Surrogates::Checked, _) => Some(()),
                }
            }
            _ => None,
        }
    }

    fn hex_unit(&mut self) -> Option<u16> {
        let unit = hex_unit(self.bytes.get(self.at..self.at + 4))?;
        self.at += 4;
        Some(unit)
    }
}

/// The high bit of each byte of `word` (read little-endian) that stops a
/// string's plain run: `"`, `\` or a control character. Bytes after the
/// first such one may be marked wrongly; they do not matter.
fn stops_in(word: u64) -> u64 {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH_BITS: u64 = u64::from_ne_bytes([0x80; 8]);
    // Bytes below `n`: a borrow only runs on from a byte that is below.
    let below = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word & HIGH_BITS;
    below(word ^ (ONES * u64::from(b'"')), 1)
        | below(word ^ (ONES * u64::from(b'\\')), 1)
        | below(word, b' ')
}

/// The containers a skipped value is nested in, innermost last: a bit each
/// (`true` for an object), in a word for the first 64 levels.
#[derive(Default)]
struct Nesting {
    depth: usize,
    objects: u64,
    deeper: Vec<bool>,
}

impl Nesting {
    fn push(&mut self, object: bool) {
        if self.depth < 64 {
            self.objects = self.objects & !(1 << self.depth) | u64::from(object) << self.depth;
        } else {
            self.deeper.push(object);
        }
        self.depth += 1;
    }

    fn pop(&mut self) {
        self.depth -= 1;
        if self.depth >= 64 {
            self.deeper.pop();
        }
    }

    /// Whether the innermost container is an object; `None` outside all.
    fn innermost(&self) -> Option<bool> {
        let level = self.depth.checked_sub(1)?;
        if level < 64 {
            Some(self.objects >> level & 1 == 1)
        } else {
            self.deeper.last().copied()
        }
    }
}

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
