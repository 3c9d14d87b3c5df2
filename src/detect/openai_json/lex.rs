//! The full scan's reading of JSON under the chunk judge: reading a value
//! the judgement visits, skipping one it ignores, strings with their
//! escapes checked as serde_json checks them, and numbers; all without
//! building anything.

use std::borrow::Cow;

use super::{Reader, Start, Text};
use crate::detect::swar;

/// A position in a document, and the reading of bytes both passes share.
pub(super) struct Cursor<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) at: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `bytes`.
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, at: 0 }
    }

    #[inline]
    pub(super) fn byte(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    #[inline]
    pub(super) fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.byte() {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not taken.
    #[inline]
    pub(super) fn peek(&mut self) -> Option<u8> {
        match self.byte()? {
            // Chunks are mostly written without whitespace.
            byte if byte > b' ' => Some(byte),
            _ => {
                self.skip_whitespace();
                self.byte()
            }
        }
    }

    /// Takes `word` if the bytes at the position spell it.
    pub(super) fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// Whether only whitespace is left.
    pub(super) fn at_end(&mut self) -> bool {
        self.skip_whitespace();
        self.at == self.bytes.len()
    }
}

/// The full scan: each method reads one piece of JSON and returns `None`
/// where the document is not valid JSON.
pub(super) struct Scan<'a> {
    cursor: Cursor<'a>,
}

/// A string as written between its quotes, known to be valid.
#[derive(Clone, Copy)]
pub(super) struct JsonStr<'a> {
    raw: &'a [u8],
    /// Whether `raw` holds an escape, so differs from the string it means.
    escaped: bool,
}

impl<'a> Text<'a> for JsonStr<'a> {
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
pub(super) fn unescape(raw: &[u8]) -> Vec<u8> {
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
pub(super) fn hex_unit(digits: Option<&[u8]>) -> Option<u16> {
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
pub(super) enum Surrogates {
    Checked,
    Unchecked,
}

impl<'a> Reader<'a> for Scan<'a> {
    type Str = JsonStr<'a>;

    /// Reads the start of a value the judgement reads, a scalar checked as
    /// serde_json checks a value it visits.
    fn value(&mut self) -> Option<Start<JsonStr<'a>>> {
        let start = match self.cursor.peek()? {
            b'[' => Start::Array,
            b'{' => Start::Object,
            b'"' => return self.string(Surrogates::Checked).map(Start::String),
            b'n' => return self.cursor.literal(b"null").map(|()| Start::Null),
            first => return self.scalar(first, true).map(|()| Start::Scalar),
        };
        self.cursor.at += 1;
        Some(start)
    }

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

    /// Skips a value as serde_json ignores one: to any depth, keeping a bit
    /// per level of nesting (on the heap only past 64 levels), with strings'
    /// surrogates and numbers' range unchecked.
    fn skip_value(&mut self) -> Option<()> {
        let first = self.cursor.peek()?;
        if !matches!(first, b'[' | b'{') {
            return self.skip_scalar(first);
        }
        let mut open = Nesting::default();
        loop {
            match self.cursor.peek()? {
                bracket @ (b'[' | b'{') => {
                    self.cursor.at += 1;
                    let object = bracket == b'{';
                    if self.cursor.peek()? == if object { b'}' } else { b']' } {
                        self.cursor.at += 1;
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
                match (self.cursor.peek()?, object) {
                    (b',', false) => {
                        self.cursor.at += 1;
                        break;
                    }
                    (b',', true) => {
                        self.cursor.at += 1;
                        self.name(Surrogates::Unchecked)?;
                        break;
                    }
                    (b']', false) | (b'}', true) => {
                        self.cursor.at += 1;
                        open.pop();
                    }
                    _ => return None,
                }
            }
        }
    }
}

impl<'a> Scan<'a> {
    /// A scan of `bytes` from their start.
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Scan {
            cursor: Cursor::new(bytes),
        }
    }

    /// Takes `expected` as the next byte after whitespace.
    pub(super) fn take(&mut self, expected: u8) -> Option<()> {
        (self.cursor.peek()? == expected).then(|| self.cursor.at += 1)
    }

    /// Whether only whitespace is left.
    pub(super) fn at_end(&mut self) -> bool {
        self.cursor.at_end()
    }

    /// Items up to `close`: `item` reads each, and this the commas between
    /// them and `close`. After a comma, `item` refuses `close`: JSON has no
    /// trailing commas.
    fn items(&mut self, close: u8, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if self.cursor.peek()? == close {
            self.cursor.at += 1;
            return Some(());
        }
        loop {
            item(self)?;
            match self.cursor.peek()? {
                b',' => self.cursor.at += 1,
                byte if byte == close => {
                    self.cursor.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A member's name and the `:` after it.
    fn name(&mut self, surrogates: Surrogates) -> Option<JsonStr<'a>> {
        if self.cursor.peek()? != b'"' {
            return None;
        }
        let name = self.string(surrogates)?;
        self.take(b':')?;
        Some(name)
    }

    /// A string, `null`, `true`, `false` or a number, starting with
    /// `first`, as serde_json ignores one.
    fn skip_scalar(&mut self, first: u8) -> Option<()> {
        match first {
            b'"' => self.string(Surrogates::Unchecked).map(drop),
            b'n' => self.cursor.literal(b"null"),
            first => self.scalar(first, false),
        }
    }

    /// `true`, `false` or a number, starting with `first`. A number is
    /// `checked` as serde_json checks one it visits: it must fit an `f64`.
    fn scalar(&mut self, first: u8, checked: bool) -> Option<()> {
        match first {
            b't' => self.cursor.literal(b"true"),
            b'f' => self.cursor.literal(b"false"),
            b'-' | b'0'..=b'9' => self.number(checked),
            _ => None,
        }
    }

    /// A number, as JSON writes it.
    fn number(&mut self, checked: bool) -> Option<()> {
        let start = self.cursor.at;
        if self.cursor.byte() == Some(b'-') {
            self.cursor.at += 1;
        }
        match self.cursor.byte()? {
            // One leading zero, no more.
            b'0' => self.cursor.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        let integer = self.cursor.at;
        if self.cursor.byte() == Some(b'.') {
            self.cursor.at += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.cursor.byte() {
            self.cursor.at += 1;
            if let Some(b'+' | b'-') = self.cursor.byte() {
                self.cursor.at += 1;
            }
            self.some_digits()?;
        }
        // An integer of up to 20 characters fits any way serde_json reads
        // it. Anything else (rare where the judgement reads) is read by
        // serde_json itself, whose features decide what is out of range.
        if checked && (self.cursor.at != integer || self.cursor.at - start > 20) {
            let number = self.cursor.bytes.get(start..self.cursor.at)?;
            let mut deserializer = serde_json::Deserializer::from_slice(number);
            serde::Deserializer::deserialize_any(&mut deserializer, serde::de::IgnoredAny).ok()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.cursor.byte() {
            self.cursor.at += 1;
        }
    }

    /// At least one digit.
    fn some_digits(&mut self) -> Option<()> {
        let start = self.cursor.at;
        self.digits();
        (self.cursor.at > start).then_some(())
    }

    /// A string, at its opening quote, through its closing one: no control
    /// characters, only JSON's escapes, valid UTF-8. Plain bytes are passed
    /// over eight at a time, since strings are most of a chunk's bytes.
    fn string(&mut self, surrogates: Surrogates) -> Option<JsonStr<'a>> {
        let bytes = self.cursor.bytes;
        let start = self.cursor.at + 1;
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
                    let plain = swar::first(stops);
                    seen |= word & ((1 << (plain * 8)) - 1);
                    at += plain;
                    break;
                }
                seen |= word;
                at += 8;
            }
            match *bytes.get(at)? {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    self.cursor.at = at + 1;
                    self.escape(surrogates)?;
                    at = self.cursor.at;
                }
                0..=0x1F => return None,
                byte => {
                    seen |= u64::from(byte);
                    at += 1;
                }
            }
        }
        let raw = &bytes[start..at];
        self.cursor.at = at + 1;
        if seen & swar::HIGH_BITS != 0 {
            std::str::from_utf8(raw).ok()?;
        }
        Some(JsonStr { raw, escaped })
    }

    /// An escape, after its `\`.
    fn escape(&mut self, surrogates: Surrogates) -> Option<()> {
        let letter = self.cursor.byte()?;
        self.cursor.at += 1;
        match letter {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(()),
            b'u' => {
                let unit = self.hex_unit()?;
                match (surrogates, unit) {
                    (Surrogates::Unchecked, _) => Some(()),
                    (Surrogates::Checked, 0xDC00..=0xDFFF) => None,
                    // A high surrogate: a low one must follow.
                    (Surrogates::Checked, 0xD800..=0xDBFF) => {
                        self.cursor.literal(b"\\u")?;
                        matches!(self.hex_unit()?, 0xDC00..=0xDFFF).then_some(())
                    }
                    (Surrogates::Checked, _) => Some(()),
                }
            }
            _ => None,
        }
    }

    fn hex_unit(&mut self) -> Option<u16> {
        let unit = hex_unit(self.cursor.bytes.get(self.cursor.at..self.cursor.at + 4))?;
        self.cursor.at += 4;
        Some(unit)
    }
}

/// The high bit of each byte of `word` (read little-endian) that stops a
/// string's plain run: `"`, `\` or a control character. Bytes after the
/// first such one may be marked wrongly; they do not matter.
pub(super) fn stops_in(word: u64) -> u64 {
    swar::equal(word, b'"') | swar::equal(word, b'\\') | swar::below(word, b' ')
}

/// The containers a skipped value is nested in, innermost last: a bit each
/// (`true` for an object), in a word for the first 64 levels.
#[derive(Default)]
pub(super) struct Nesting {
    depth: usize,
    objects: u64,
    deeper: Vec<bool>,
}

impl Nesting {
    pub(super) fn push(&mut self, object: bool) {
        if self.depth < 64 {
            self.objects = self.objects & !(1 << self.depth) | u64::from(object) << self.depth;
        } else {
            self.deeper.push(object);
        }
        self.depth += 1;
    }

    pub(super) fn pop(&mut self) {
        self.depth -= 1;
        if self.depth >= 64 {
            self.deeper.pop();
        }
    }

    /// Whether the innermost container is an object; `None` outside all.
    pub(super) fn innermost(&self) -> Option<bool> {
        let level = self.depth.checked_sub(1)?;
        if level < 64 {
            Some(self.objects >> level & 1 == 1)
        } else {
            self.deeper.last().copied()
        }
    }
}
