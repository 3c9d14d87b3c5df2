//! The token estimate of an OpenAI request body, by a streaming scan.
//!
//! [`estimate`] walks the JSON document once with serde's visitors and keeps
//! only what the estimate needs: the prompt's strings (borrowed from the
//! body where they have no escapes, and only their lengths when no
//! tokenizer asks for the text), a count of token IDs and the three
//! output-token fields. Every other member, however large or deep, is
//! skipped ([`IgnoredAny`]) without being built. So the memory an estimate
//! costs is one slice (or length) per prompt string, never a copy of the
//! document as a tree.
//!
//! The scan is tolerant in the same way a parse into a `serde_json::Value`
//! followed by lookups would be: a member of an unexpected type is
//! ignored rather than failing the whole body, and of a member given twice
//! the last counts. Only a body that is not JSON, or not an object, has no
//! estimate. A test below checks the two against each other on random
//! documents. One difference, on purpose: a skipped member nested deeper
//! than the parser's recursion limit (128) is skipped like any other,
//! where a whole parse would fail; nesting that deep inside a prompt field
//! still fails the scan (no estimate), never the stack.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::gate::Cost;
use crate::json::{answer_json, seed_any};

/// The tokenizer an estimate may call: prompt text in, tokens out.
pub(super) type CountTokens = dyn Fn(&str) -> usize + Send + Sync;

/// The cost an OpenAI request body declares, or `None` when it is not a
/// JSON object: prompt tokens from `messages[].content`, `prompt`, `input`
/// and `instructions` (texts counted by `tokenizer` on the texts joined by
/// newlines, or bytes / 4; token IDs one each), maximum output tokens from
/// `max_completion_tokens`, then `max_tokens`, then `max_output_tokens`.
pub(super) fn estimate(body: &[u8], tokenizer: Option<&CountTokens>) -> Option<Cost> {
    let keep_text = tokenizer.is_some();
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let fields = Request { keep_text }
        .deserialize(&mut deserializer)
        .ok()??;
    deserializer.end().ok()?;

    let mut prompt = Prompt::new(keep_text);
    for part in [
        fields.messages,
        fields.prompt,
        fields.input,
        fields.instructions,
    ] {
        prompt.append(part);
    }
    let prompt_tokens = prompt.tokens(tokenizer);
    let max_output_tokens = fields
        .max_completion_tokens
        .or(fields.max_tokens)
        .or(fields.max_output_tokens)
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    Some(Cost::new(prompt_tokens, max_output_tokens))
}

/// One prompt text: the text itself when a tokenizer will read it,
/// otherwise only its length.
enum Text<'de> {
    Text(Cow<'de, str>),
    Len(usize),
}

impl Text<'_> {
    fn len(&self) -> usize {
        match self {
            Text::Text(text) => text.len(),
            Text::Len(len) => *len,
        }
    }
}

/// A prompt's texts, in document order, and its token IDs.
struct Prompt<'de> {
    keep_text: bool,
    texts: Vec<Text<'de>>,
    token_ids: usize,
}

impl<'de> Prompt<'de> {
    fn new(keep_text: bool) -> Self {
        Prompt {
            keep_text,
            texts: Vec::new(),
            token_ids: 0,
        }
    }

    fn push(&mut self, text: Cow<'de, str>) {
        self.texts.push(if self.keep_text {
            Text::Text(text)
        } else {
            Text::Len(text.len())
        });
    }

    fn append(&mut self, other: Prompt<'de>) {
        self.texts.extend(other.texts);
        self.token_ids = self.token_ids.saturating_add(other.token_ids);
    }

    /// The texts joined by newlines, a newline before each text that
    /// follows non-empty ones.
    fn joined(&self) -> String {
        let mut out = String::with_capacity(self.joined_len());
        for text in &self.texts {
            if !out.is_empty() {
                out.push('\n');
            }
            if let Text::Text(text) = text {
                out.push_str(text);
            }
        }
        out
    }

    /// The length of [`joined`](Self::joined), without joining.
    fn joined_len(&self) -> usize {
        self.texts.iter().fold(0usize, |len, text| {
            let newline = usize::from(len > 0);
            len.saturating_add(newline).saturating_add(text.len())
        })
    }

    /// The prompt's tokens: `tokenizer`'s count of the joined texts, or
    /// their bytes / 4, plus one a token ID.
    fn tokens(&self, tokenizer: Option<&CountTokens>) -> usize {
        let text_tokens = match tokenizer {
            Some(count) => count(&self.joined()),
            None => self.joined_len().div_ceil(4),
        };
        text_tokens.saturating_add(self.token_ids)
    }
}

/// The members of a request the estimate reads; each is the last one given.
struct Fields<'de> {
    messages: Prompt<'de>,
    prompt: Prompt<'de>,
    input: Prompt<'de>,
    instructions: Prompt<'de>,
    max_completion_tokens: Option<u64>,
    max_tokens: Option<u64>,
    max_output_tokens: Option<u64>,
}

/// A member name the scan cares about, or any other.
enum Key {
    Messages,
    Prompt,
    Input,
    Instructions,
    MaxCompletionTokens,
    MaxTokens,
    MaxOutputTokens,
    Text,
    Content,
    Other,
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Key, E> {
                Ok(match name {
                    "messages" => Key::Messages,
                    "prompt" => Key::Prompt,
                    "input" => Key::Input,
                    "instructions" => Key::Instructions,
                    "max_completion_tokens" => Key::MaxCompletionTokens,
                    "max_tokens" => Key::MaxTokens,
                    "max_output_tokens" => Key::MaxOutputTokens,
                    "text" => Key::Text,
                    "content" => Key::Content,
                    _ => Key::Other,
                })
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// The whole body: an object gives its [`Fields`], anything else `None`.
struct Request {
    keep_text: bool,
}

impl<'de> Visitor<'de> for Request {
    type Value = Option<Fields<'de>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an OpenAI request object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let keep_text = self.keep_text;
        let mut fields = Fields {
            messages: Prompt::new(keep_text),
            prompt: Prompt::new(keep_text),
            input: Prompt::new(keep_text),
            instructions: Prompt::new(keep_text),
            max_completion_tokens: None,
            max_tokens: None,
            max_output_tokens: None,
        };
        while let Some(key) = map.next_key::<Key>()? {
            let prompt = |map: &mut A, place| Collect::member(map, keep_text, place);
            match key {
                Key::Messages => fields.messages = prompt(&mut map, Place::Messages)?,
                Key::Prompt => fields.prompt = prompt(&mut map, Place::Field)?,
                Key::Input => fields.input = prompt(&mut map, Place::Field)?,
                Key::Instructions => fields.instructions = prompt(&mut map, Place::Field)?,
                Key::MaxCompletionTokens => {
                    fields.max_completion_tokens = map.next_value_seed(Count)?
                }
                Key::MaxTokens => fields.max_tokens = map.next_value_seed(Count)?,
                Key::MaxOutputTokens => fields.max_output_tokens = map.next_value_seed(Count)?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(fields))
    }
    answer_json!(None; arrays, numbers, str, unit);
}

/// An output-token count: a non-negative integer, anything else `None`.
struct Count;

impl<'de> Visitor<'de> for Count {
    type Value = Option<u64>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a token count")
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
        Ok(Some(n))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
        Ok(u64::try_from(n).ok())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    answer_json!(None; str, unit, arrays, objects);
}

/// Where a value stands, which says what in it counts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// A prompt field (`prompt`, `input`, `instructions`, a part's `text`
    /// or `content`): a string, or an array of [`Place::Element`]s.
    Field,
    /// An element of a prompt field's array: a string, a number (one
    /// token ID), an array of elements, or an object (a content part or
    /// input item: its last `text`, then its last `content`).
    Element,
    /// `messages`: an array of [`Place::Message`]s.
    Messages,
    /// One element of `messages`: an object whose last `content` is a
    /// field.
    Message,
}

/// Collects what a value at its [`Place`] adds to a prompt; anything else
/// counts nothing.
struct Collect<'p, 'de> {
    prompt: &'p mut Prompt<'de>,
    place: Place,
}

impl<'p, 'de> Collect<'p, 'de> {
    fn at(prompt: &'p mut Prompt<'de>, place: Place) -> Self {
        Collect { prompt, place }
    }

    /// The prompt collected from the value of a member at `place`.
    fn member<A: MapAccess<'de>>(
        map: &mut A,
        keep_text: bool,
        place: Place,
    ) -> Result<Prompt<'de>, A::Error> {
        let mut prompt = Prompt::new(keep_text);
        map.next_value_seed(Collect::at(&mut prompt, place))?;
        Ok(prompt)
    }

    fn text(self, text: Cow<'de, str>) {
        if let Place::Field | Place::Element = self.place {
            self.prompt.push(text);
        }
    }

    fn number(self) {
        if self.place == Place::Element {
            self.prompt.token_ids = self.prompt.token_ids.saturating_add(1);
        }
    }
}

impl<'de> DeserializeSeed<'de> for Collect<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Collect<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a prompt")
    }
    fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<(), E> {
        self.text(Cow::Borrowed(text));
        Ok(())
    }
    fn visit_str<E: de::Error>(self, text: &str) -> Result<(), E> {
        // A string with escapes: its text is copied only when a tokenizer
        // will read it.
        if self.prompt.keep_text {
            self.text(Cow::Owned(text.to_owned()));
        } else if let Place::Field | Place::Element = self.place {
            self.prompt.texts.push(Text::Len(text.len()));
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let place = match self.place {
            Place::Field | Place::Element => Place::Element,
            Place::Messages => Place::Message,
            Place::Message => {
                // An array inside `messages` is no message.
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                return Ok(());
            }
        };
        while seq
            .next_element_seed(Collect::at(&mut *self.prompt, place))?
            .is_some()
        {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let keep_text = self.prompt.keep_text;
        let mut text = Prompt::new(keep_text);
        let mut content = Prompt::new(keep_text);
        while let Some(key) = map.next_key::<Key>()? {
            match (key, self.place) {
                (Key::Text, Place::Element) => {
                    text = Collect::member(&mut map, keep_text, Place::Field)?;
                }
                (Key::Content, Place::Element | Place::Message) => {
                    content = Collect::member(&mut map, keep_text, Place::Field)?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        self.prompt.append(text);
        self.prompt.append(content);
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.number();
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.number();
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.number();
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

seed_any!(Request, Count);

#[cfg(test)]
mod tests;
