//! The judgement of a *plain* document in one tight pass, before the full
//! scan: the common chunk, whose strings are printable ASCII without
//! escapes, whose numbers are integers of at most 20 characters, and which
//! is nested at most [`MAX_DEPTH`] deep.
//!
//! On such a document every check the full scan makes beyond JSON's
//! grammar (lone surrogates, UTF-8, numbers that must fit an `f64`, escaped
//! names) passes by construction, and a string means what is written. So
//! the judgement is the full scan's, the same code over a reader of the raw
//! bytes: the same members, each one's last occurrence winning. Anything else (an escape, a
//! byte outside printable ASCII, a fraction or an exponent, deeper nesting,
//! or a document that is not valid JSON at all) is left to the full scan:
//! [`judge`] returns `None` and has decided nothing.

use std::borrow::Cow;

use super::lex::{self, Cursor};
use super::{Reader, Start, Text, event};
use crate::detect::swar;

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

/// The high bit of each byte of `word` (read little-endian) that is not
/// plain in a string: [`PLAIN_IN_STRING`] eight at a time, exact up to the
/// first marked byte.
#[inline]
fn stops_in(word: u64) -> u64 {
    lex::stops_in(word) | word & swar::HIGH_BITS
}

/// The length of the run of plain bytes at the start of `text`, eight at a
/// time while eight are left; `None` when it runs to the end.
#[inline]
fn plain_run(text: &[u8]) -> Option<usize> {
    let mut rest = text;
    while let Some((eight, after)) = rest.split_first_chunk::<8>() {
        let stops = stops_in(u64::from_le_bytes(*eight));
        if stops != 0 {
            return Some(text.len() - rest.len() + swar::first(stops));
        }
        rest = after;
    }
    let plain = rest
        .iter()
        .position(|&byte| !PLAIN_IN_STRING[usize::from(byte)])?;
    Some(text.len() - rest.len() + plain)
}

/// The judgement of `data` when it is a plain JSON object, as
/// [`object_ends_waiting`](super::object_ends_waiting) would give it;
/// `None` when the full scan must decide.
pub(super) fn judge(data: &[u8]) -> Option<bool> {
    let mut plain = Plain {
        cursor: Cursor::new(data),
        depth: 0,
    };
    if !matches!(plain.value()?, Start::Object) {
        return None;
    }
    let judged = event(&mut plain)?;
    plain.cursor.at_end().then_some(judged)
}

/// A plain string is the text between its quotes: it means what it says.
impl<'a> Text<'a> for &'a [u8] {
    #[inline]
    fn meaning(self) -> Cow<'a, [u8]> {
        Cow::Borrowed(self)
    }

    #[inline]
    fn is_empty(self) -> bool {
        <[u8]>::is_empty(self)
    }
}

/// A position in a document; each method returns `None` where the document
/// is not plain (or not valid).
struct Plain<'a> {
    cursor: Cursor<'a>,
    /// Containers open around the position.
    depth: u32,
}

impl<'a> Plain<'a> {
    /// An integer of at most 20 characters: what any reading of JSON takes
    /// as it is written.
    #[inline(always)]
    fn integer(&mut self) -> Option<()> {
        let bytes = self.cursor.bytes;
        let start = self.cursor.at;
        let mut at = start;
        if bytes.get(at) == Some(&b'-') {
            at += 1;
        }
        match *bytes.get(at)? {
            b'0' => at += 1,
            b'1'..=b'9' => {
                at += 1;
                while let Some(b'0'..=b'9') = bytes.get(at) {
                    at += 1;
                }
            }
            _ => return None,
        }
        self.cursor.at = at;
        let fraction_or_exponent = matches!(bytes.get(at), Some(b'.' | b'e' | b'E'));
        (!fraction_or_exponent && at - start <= 20).then_some(())
    }

    /// A string at its opening quote, through its closing one: printable
    /// ASCII (or DEL) without escapes. Its bytes are tested eight at a time
    /// while eight are left in the document (a word may run past the
    /// string's end: only its first stop counts), the last few one at a
    /// time. The first word, the whole of most strings, is tested here.
    #[inline(always)]
    fn string(&mut self) -> Option<&'a [u8]> {
        let bytes = self.cursor.bytes;
        let start = self.cursor.at + 1;
        let text = bytes.get(start..)?;
        let len = match text.first_chunk::<8>() {
            Some(eight) => {
                let stops = stops_in(u64::from_le_bytes(*eight));
                if stops != 0 {
                    swar::first(stops)
                } else {
                    8 + plain_run(&text[8..])?
                }
            }
            None => plain_run(text)?,
        };
        if *text.get(len)? != b'"' {
            return None;
        }
        self.cursor.at = start + len + 1;
        text.get(..len)
    }

    /// Skips a value the judgement does not read: a string, an integer or
    /// `null` here (most are), anything else by [`Reader::skip_value`].
    #[inline(always)]
    fn skip_unread(&mut self) -> Option<()> {
        match self.cursor.byte()? {
            b'"' => self.string().map(drop),
            b'-' | b'0'..=b'9' => self.integer(),
            b'n' => self.cursor.literal(b"null"),
            _ => self.skip_value(),
        }
    }

    /// Items up to `close`, after the opening bracket: `item` reads each,
    /// and this the commas between them and `close`.
    #[inline]
    fn items(&mut self, close: u8, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if self.cursor.peek()? != close {
            loop {
                item(self)?;
                match self.cursor.peek()? {
                    b',' => self.cursor.at += 1,
                    byte if byte == close => break,
                    _ => return None,
                }
            }
        }
        self.cursor.at += 1;
        self.depth -= 1;
        Some(())
    }
}

impl<'a> Reader<'a> for Plain<'a> {
    type Str = &'a [u8];

    /// Reads the start of a value: a plain string, `null`, `true`,
    /// `false`, a plain integer, or a bracket within [`MAX_DEPTH`].
    #[inline(always)]
    fn value(&mut self) -> Option<Start<&'a [u8]>> {
        let start = match self.cursor.peek()? {
            b'"' => return self.string().map(Start::String),
            b'{' => Start::Object,
            b'[' => Start::Array,
            b'n' => return self.cursor.literal(b"null").map(|()| Start::Null),
            b't' => return self.cursor.literal(b"true").map(|()| Start::Scalar),
            b'f' => return self.cursor.literal(b"false").map(|()| Start::Scalar),
            _ => return self.integer().map(|()| Start::Scalar),
        };
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        self.cursor.at += 1;
        Some(start)
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
            if plain.cursor.peek()? != b'"' {
                return None;
            }
            let name = plain.string()?;
            if plain.cursor.peek()? != b':' {
                return None;
            }
            plain.cursor.at += 1;
            member(plain, name)
        })
    }

    #[inline]
    fn named_members(
        &mut self,
        names: &[&[u8]],
        mut read: impl FnMut(&mut Self, usize) -> Option<()>,
    ) -> Option<()> {
        self.members(
            |plain, name| match names.iter().position(|candidate| *candidate == name) {
                Some(member) => read(plain, member),
                None => plain.skip_unread(),
            },
        )
    }

    fn skip_value(&mut self) -> Option<()> {
        let start = self.value()?;
        self.drain(start)
    }
}
