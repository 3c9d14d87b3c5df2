//! The judgement of a *plain* document in one tight pass, before the full
//! scan: the common chunk, whose strings are printable ASCII without
//! escapes, whose numbers are integers of at most 20 characters, and which
//! is nested at most [`MAX_DEPTH`] deep.
//!
//! On such a document every check the full scan makes beyond JSON's
//! grammar (lone surrogates, UTF-8, numbers that must fit an `f64`, escaped
//! names) passes by construction, and a string means what is written. So
//! the judgement is the full scan's, read off the raw bytes: the same
//! members, each one's last occurrence winning. Anything else (an escape, a
//! byte outside printable ASCII, a fraction or an exponent, deeper nesting,
//! or a document that is not valid JSON at all) is left to the full scan:
//! [`judge`] returns `None` and has decided nothing.

use super::{Kind, OUTPUT_DELTA_MEMBERS, kind_of};

/// Containers deeper than this are left to the full scan.
const MAX_DEPTH: u32 = 32;

/// The bytes a plain string holds: printable ASCII and DEL, but for `"`
/// and `\`.
static PLAIN_IN_STRING: [bool; 256] = {
    let mut plain = [false; 256];
    let mut byte = b' ';
    while byte < 0x80 {
        plain[byte as usize] = byte != b'"' && byte != b'\\';
        byte += 1;
    }
    plain
};

/// The judgement of `data` when it is a plain JSON object, as
/// [`object_ends_waiting`](super::object_ends_waiting) would give it;
/// `None` when the full scan must decide.
pub(super) fn judge(data: &[u8]) -> Option<bool> {
    let mut plain = Plain {
        bytes: data,
        at: 0,
        depth: 0,
    };
    if plain.value()? != Start::Object {
        return None;
    }
    let judged = plain.event()?;
    plain.skip_whitespace();
    (plain.at == data.len()).then_some(judged)
}

/// The start of a value, its scalar read whole or its opening bracket
/// taken.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start<'a> {
    Null,
    /// `true`, `false` or an integer.
    Scalar,
    /// The string between its quotes (plain: it means what it says).
    String(&'a [u8]),
    Array,
    Object,
}

/// A position in a document; each method returns `None` where the document
/// is not plain (or not valid).
struct Plain<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Containers open around the position.
    depth: u32,
}

impl<'a> Plain<'a> {
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
        match self.byte()? {
            // Chunks are mostly written without whitespace.
            byte if byte > b' ' => Some(byte),
            _ => {
                self.skip_whitespace();
                self.byte()
            }
        }
    }

    /// Reads the start of a value.
    #[inline(always)]
    fn value(&mut self) -> Option<Start<'a>> {
        let start = match self.peek()? {
            b'"' => return self.string().map(Start::String),
            b'{' => Start::Object,
            b'[' => Start::Array,
            b'n' => return self.literal(b"null").map(|()| Start::Null),
            b't' => return self.literal(b"true").map(|()| Start::Scalar),
            b'f' => return self.literal(b"false").map(|()| Start::Scalar),
            _ => return self.integer().map(|()| Start::Scalar),
        };
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        self.at += 1;
        Some(start)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// An integer of at most 20 characters: what any reading of JSON takes
    /// as it is written.
    fn integer(&mut self) -> Option<()> {
        let start = self.at;
        if self.byte() == Some(b'-') {
            self.at += 1;
        }
        match self.byte()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                while let Some(b'0'..=b'9') = self.byte() {
                    self.at += 1;
                }
            }
            _ => return None,
        }
        let fraction_or_exponent = matches!(self.byte(), Some(b'.' | b'e' | b'E'));
        (!fraction_or_exponent && self.at - start <= 20).then_some(())
    }

    /// A string at its opening quote, through its closing one: printable
    /// ASCII (or DEL) without escapes. Most strings of a chunk are a few
    /// bytes long: a byte at a time, by table, beats setting up words.
    #[inline(always)]
    fn string(&mut self) -> Option<&'a [u8]> {
        let bytes = self.bytes;
        let start = self.at + 1;
        let rest = bytes.get(start..)?;
        let len = rest
            .iter()
            .position(|&byte| !PLAIN_IN_STRING[usize::from(byte)])?;
        if rest[len] != b'"' {
            return None;
        }
        self.at = start + len + 1;
        Some(&rest[..len])
    }

    /// Items up to `close`, after the opening bracket: `item` reads each,
    /// and this the commas between them and `close`.
    #[inline]
    fn items(&mut self, close: u8, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if self.peek()? != close {
            loop {
                item(self)?;
                match self.peek()? {
                    b',' => self.at += 1,
                    byte if byte == close => break,
                    _ => return None,
                }
            }
        }
        self.at += 1;
        self.depth -= 1;
        Some(())
    }

    #[inline]
    fn elements(&mut self, element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.items(b']', element)
    }

    /// The members of an object, after its `{`: `member` reads the value
    /// of each, given its name.
    #[inline]
    fn members(&mut self, mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.items(b'}', |plain| {
            if plain.peek()? != b'"' {
                return None;
            }
            let name = plain.string()?;
            if plain.peek()? != b':' {
                return None;
            }
            plain.at += 1;
            member(plain, name)
        })
    }

    /// Reads to its end a value whose start was read.
    fn drain(&mut self, start: Start<'a>) -> Option<()> {
        match start {
            Start::Array => self.elements(Self::skip_value),
            Start::Object => self.members(|plain, _| plain.skip_value()),
            Start::Null | Start::Scalar | Start::String(_) => Some(()),
        }
    }

    fn skip_value(&mut self) -> Option<()> {
        let start = self.value()?;
        self.drain(start)
    }

    /// The event, after its `{`: whether it ends waiting.
    fn event(&mut self) -> Option<bool> {
        let mut error = false;
        let mut object_is_error = false;
        let mut choices = None;
        let mut kind = Kind::default();
        let mut delta = false;
        self.members(|plain, name| {
            match name {
                b"error" => error = plain.something()?,
                b"object" => object_is_error = plain.is_str(b"error")?,
                b"choices" => choices = plain.choices()?,
                b"type" => kind = plain.kind()?,
                b"delta" => delta = plain.payload()?,
                _ => plain.skip_value()?,
            }
            Some(())
        })?;
        Some(error || object_is_error || kind.ends_waiting(delta, choices))
    }

    /// Whether a value is more than a placeholder: not `null`, and not an
    /// empty string, array or object.
    fn something(&mut self) -> Option<bool> {
        self.carries(|plain| plain.any_member(|plain, _| plain.skip_value().map(|()| true)))
    }

    /// Whether a value carries something; an object as `object` (called
    /// after its `{`) says.
    fn carries(&mut self, object: impl FnOnce(&mut Self) -> Option<bool>) -> Option<bool> {
        Some(match self.value()? {
            Start::Null => false,
            Start::Scalar => true,
            Start::String(text) => !text.is_empty(),
            Start::Array => {
                let mut any = false;
                self.elements(|plain| {
                    any = true;
                    plain.skip_value()
                })?;
                any
            }
            Start::Object => object(self)?,
        })
    }

    /// Whether `member` says yes of any member of an object, after its
    /// `{`; every member's value is read.
    fn any_member(
        &mut self,
        mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<bool>,
    ) -> Option<bool> {
        let mut any = false;
        self.members(|plain, name| {
            any |= member(plain, name)?;
            Some(())
        })?;
        Some(any)
    }

    /// Whether a value is the string `expected`.
    fn is_str(&mut self, expected: &[u8]) -> Option<bool> {
        match self.value()? {
            Start::String(text) => Some(text == expected),
            other => self.drain(other).map(|()| false),
        }
    }

    /// What an event's `type` says.
    fn kind(&mut self) -> Option<Kind> {
        match self.value()? {
            Start::String(kind) => Some(std::str::from_utf8(kind).map_or(Kind::Other, kind_of)),
            other => self.drain(other).map(|()| Kind::Unnamed),
        }
    }

    /// An event's `delta`: whether it carries a payload (an object: a
    /// member other than `type` carries something).
    fn payload(&mut self) -> Option<bool> {
        self.carries(|plain| {
            plain.any_member(|plain, name| {
                if name == b"type" {
                    plain.skip_value().map(|()| false)
                } else {
                    plain.something()
                }
            })
        })
    }

    /// `choices`: for an array, whether any choice carries output or a
    /// finish reason; `None` for any other value.
    fn choices(&mut self) -> Option<Option<bool>> {
        match self.value()? {
            Start::Array => {
                let mut any = false;
                self.elements(|plain| {
                    any |= plain.choice()?;
                    Some(())
                })?;
                Some(Some(any))
            }
            other => self.drain(other).map(|()| None),
        }
    }

    /// One choice: a `finish_reason`, completion `text`, or an output
    /// member of its `delta`.
    fn choice(&mut self) -> Option<bool> {
        let start = self.value()?;
        if start != Start::Object {
            return self.drain(start).map(|()| false);
        }
        let mut finished = false;
        let mut text = false;
        let mut delta = false;
        self.members(|plain, name| {
            match name {
                b"finish_reason" => finished = plain.something()?,
                b"text" => text = plain.something()?,
                b"delta" => delta = plain.delta()?,
                _ => plain.skip_value()?,
            }
            Some(())
        })?;
        Some(finished || text || delta)
    }

    /// A chat `delta`: whether any output member carries something (each
    /// member's last occurrence counts).
    fn delta(&mut self) -> Option<bool> {
        let start = self.value()?;
        if start != Start::Object {
            return self.drain(start).map(|()| false);
        }
        let mut carries = [false; OUTPUT_DELTA_MEMBERS.len()];
        self.members(|plain, name| {
            match OUTPUT_DELTA_MEMBERS
                .iter()
                .position(|member| member.as_bytes() == name)
            {
                Some(member) => carries[member] = plain.something()?,
                None => plain.skip_value()?,
            }
            Some(())
        })?;
        Some(carries.contains(&true))
    }
}
