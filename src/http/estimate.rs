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
    let text_tokens = match tokenizer {
        Some(count) => count(&prompt.joined()),
        None => prompt.joined_len().div_ceil(4),
    };
    let prompt_tokens = text_tokens.saturating_add(prompt.token_ids);
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

impl<'de> DeserializeSeed<'de> for Request {
    type Value = Option<Fields<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
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
            let prompt = |map: &mut A| -> Result<Prompt<'de>, A::Error> {
                let mut prompt = Prompt::new(keep_text);
                map.next_value_seed(Collect::field(&mut prompt))?;
                Ok(prompt)
            };
            match key {
                Key::Messages => {
                    let mut messages = Prompt::new(keep_text);
                    map.next_value_seed(Messages(&mut messages))?;
                    fields.messages = messages;
                }
                Key::Prompt => fields.prompt = prompt(&mut map)?,
                Key::Input => fields.input = prompt(&mut map)?,
                Key::Instructions => fields.instructions = prompt(&mut map)?,
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
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// An output-token count: a non-negative integer, anything else `None`.
struct Count;

impl<'de> DeserializeSeed<'de> for Count {
    type Value = Option<u64>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

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
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
}

/// `messages`: an array whose objects' `content` is a prompt field;
/// anything else is ignored.
struct Messages<'p, 'de>(&'p mut Prompt<'de>);

impl<'de> DeserializeSeed<'de> for Messages<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Messages<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of messages")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Message(&mut *self.0))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// One element of `messages`: an object's last `content` counts.
struct Message<'p, 'de>(&'p mut Prompt<'de>);

impl<'de> DeserializeSeed<'de> for Message<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Message<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a message")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let keep_text = self.0.keep_text;
        let mut content = Prompt::new(keep_text);
        while let Some(key) = map.next_key::<Key>()? {
            if let Key::Content = key {
                content = Prompt::new(keep_text);
                map.next_value_seed(Collect::field(&mut content))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        self.0.append(content);
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// A prompt field (`prompt`, `input`, `content`, `text`, …) or an element
/// of one.
///
/// A field counts a string, or an array; an element of an array also
/// counts a number (one token ID) and an object (its last `text`, then its
/// last `content`, as content parts and input items carry them). Anything
/// else counts nothing.
struct Collect<'p, 'de> {
    prompt: &'p mut Prompt<'de>,
    element: bool,
}

impl<'p, 'de> Collect<'p, 'de> {
    fn field(prompt: &'p mut Prompt<'de>) -> Self {
        Collect {
            prompt,
            element: false,
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
        self.prompt.push(Cow::Borrowed(text));
        Ok(())
    }
    fn visit_str<E: de::Error>(self, text: &str) -> Result<(), E> {
        // A string with escapes: its text is copied only when a tokenizer
        // will read it.
        if self.prompt.keep_text {
            self.prompt.push(Cow::Owned(text.to_owned()));
        } else {
            self.prompt.texts.push(Text::Len(text.len()));
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq
            .next_element_seed(Collect {
                prompt: &mut *self.prompt,
                element: true,
            })?
            .is_some()
        {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let keep_text = self.prompt.keep_text;
        let mut text = Prompt::new(keep_text);
        let mut content = Prompt::new(keep_text);
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Text if self.element => {
                    text = Prompt::new(keep_text);
                    map.next_value_seed(Collect::field(&mut text))?;
                }
                Key::Content if self.element => {
                    content = Prompt::new(keep_text);
                    map.next_value_seed(Collect::field(&mut content))?;
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
        self.token_id();
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.token_id();
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.token_id();
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

impl Collect<'_, '_> {
    /// A number counts one token ID as an element of an array, nothing as
    /// a field of its own.
    fn token_id(self) {
        if self.element {
            self.prompt.token_ids = self.prompt.token_ids.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    #[test]
    fn a_chat_prompt_is_estimated_at_four_bytes_a_token() {
        let body = serde_json::json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "abcd"},
                {"role": "user", "content": [{"type": "text", "text": "efgh"}]},
            ],
            "max_completion_tokens": 64,
        });
        let cost = estimate(body.to_string().as_bytes(), None).unwrap();
        // "abcd\nefgh": 9 bytes, 3 tokens rounded up.
        assert_eq!(cost, Cost::new(3, Some(64)));
    }

    #[test]
    fn completions_and_responses_prompts_count_too() {
        let completion = serde_json::json!({"prompt": ["aaaa", "bbbb"], "max_tokens": 5});
        assert_eq!(
            estimate(
                completion.to_string().as_bytes(),
                Some(&|text: &str| text.len())
            ),
            Some(Cost::new(9, Some(5)))
        );
        let response = serde_json::json!({
            "instructions": "be brief",
            "input": [{"role": "user", "content": "hi"}],
            "max_output_tokens": 7,
        });
        assert_eq!(
            estimate(
                response.to_string().as_bytes(),
                Some(&|text: &str| text.len())
            ),
            Some(Cost::new("hi\nbe brief".len(), Some(7)))
        );
    }

    #[test]
    fn prompts_as_token_ids_count_one_token_each() {
        let ids = serde_json::json!({"prompt": [1, 2, 3]});
        assert_eq!(
            estimate(ids.to_string().as_bytes(), None),
            Some(Cost::prompt(3))
        );
        let lists = serde_json::json!({"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 2});
        assert_eq!(
            estimate(lists.to_string().as_bytes(), Some(&|_: &str| 0)),
            Some(Cost::new(5, Some(2)))
        );
        // A list of strings counts each string's estimate (4 bytes each here).
        let strings = serde_json::json!({"prompt": ["aaaaaaaa", "bbbb"]});
        assert_eq!(
            estimate(strings.to_string().as_bytes(), None),
            Some(Cost::prompt(4))
        );
    }

    #[test]
    fn the_joined_length_is_the_length_of_the_joined_text() {
        for texts in [
            vec![],
            vec![""],
            vec!["", "ab"],
            vec!["ab", "", "c"],
            vec!["a", "b"],
        ] {
            let mut prompt = Prompt::new(true);
            for text in &texts {
                prompt.push(Cow::Borrowed(text));
            }
            assert_eq!(prompt.joined_len(), prompt.joined().len(), "{texts:?}");
        }
    }

    #[test]
    fn malformed_json_has_no_cost() {
        assert_eq!(estimate(b"{\"messages\": [", None), None);
        assert_eq!(estimate(b"[1, 2]", None), None);
        assert_eq!(
            estimate(b"{\"max_tokens\": -1}", None),
            Some(Cost::new(0, None))
        );
    }

    #[test]
    fn members_of_an_unexpected_type_are_ignored_and_the_last_of_a_repeated_member_counts() {
        let body = br#"{"messages": {"content": "x"}, "prompt": 7, "input": [{"text": {"a": 1}}],
            "max_tokens": "lots", "max_completion_tokens": 2.5, "instructions": "abcd",
            "instructions": "abcdefgh", "max_output_tokens": 3, "max_output_tokens": 9}"#;
        assert_eq!(estimate(body, None), Some(Cost::new(2, Some(9))));
    }

    #[test]
    fn a_parts_text_comes_before_its_content_whatever_the_member_order() {
        let body = br#"{"input": [{"content": "b", "type": "text", "text": "a"}]}"#;
        let text = |text: &str| if text == "a\nb" { 1 } else { 2 };
        assert_eq!(estimate(body, Some(&text)), Some(Cost::prompt(1)));
        assert_eq!(estimate(body, Some(&text)), reference(body, Some(&text)));
    }

    #[test]
    fn escaped_strings_count_their_text() {
        let body = br#"{"prompt": "a\nb\u00e9"}"#;
        assert_eq!(
            estimate(body, Some(&|text: &str| text.chars().count())),
            Some(Cost::prompt(4))
        );
        assert_eq!(estimate(body, None), Some(Cost::prompt(2)));
    }

    /// The estimate before the streaming scan: the body parsed into a
    /// `Value`, then looked up. The scan must agree with it on every body.
    /// The cost an OpenAI request body declares, or `None` when it is not a
    /// JSON object.
    ///
    /// The body is parsed into a [`Value`] still, because a typed (streaming)
    /// parse would reject a body whose ignored fields have unexpected types,
    /// where this one estimates what it can; the prompt itself is not copied:
    /// its strings are borrowed from the parsed document and only joined when a
    /// tokenizer asks for one text.
    fn reference(
        body: &[u8],
        tokenizer: Option<&(dyn Fn(&str) -> usize + Send + Sync)>,
    ) -> Option<Cost> {
        let Ok(Value::Object(request)) = serde_json::from_slice::<Value>(body) else {
            return None;
        };
        let mut prompt = Reference::default();
        if let Some(messages) = request.get("messages").and_then(Value::as_array) {
            for message in messages {
                prompt.collect(message.get("content"));
            }
        }
        for field in ["prompt", "input", "instructions"] {
            prompt.collect(request.get(field));
        }
        let text_tokens = match tokenizer {
            Some(count) => count(&prompt.joined()),
            None => prompt.joined_len().div_ceil(4),
        };
        let prompt_tokens = text_tokens.saturating_add(prompt.token_ids);
        let max_output_tokens = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
            .iter()
            .find_map(|field| request.get(*field)?.as_u64())
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        Some(Cost::new(prompt_tokens, max_output_tokens))
    }

    /// A prompt's texts, borrowed from the parsed body, and its token IDs.
    #[derive(Default)]
    struct Reference<'a> {
        texts: Vec<&'a str>,
        token_ids: usize,
    }

    impl<'a> Reference<'a> {
        /// Takes the text of a prompt field: a string, an array of strings or
        /// token IDs (numbers, one token each, nested lists summed), or an
        /// array of content parts (`{"type":"text","text":…}`) or input items
        /// (`{"role":…,"content":…}`).
        fn collect(&mut self, value: Option<&'a Value>) {
            match value {
                Some(Value::String(text)) => self.texts.push(text),
                Some(Value::Array(items)) => {
                    for item in items {
                        match item {
                            Value::Object(part) => {
                                self.collect(part.get("text"));
                                self.collect(part.get("content"));
                            }
                            Value::Number(_) => self.token_ids = self.token_ids.saturating_add(1),
                            other => self.collect(Some(other)),
                        }
                    }
                }
                _ => {}
            }
        }

        /// The texts joined by newlines, a newline before each text that
        /// follows non-empty ones.
        fn joined(&self) -> String {
            let mut out = String::with_capacity(self.joined_len());
            for text in &self.texts {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(text);
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
    }

    fn json() -> impl Strategy<Value = Value> {
        let name = prop_oneof![
            Just("messages"),
            Just("prompt"),
            Just("input"),
            Just("instructions"),
            Just("max_tokens"),
            Just("max_completion_tokens"),
            Just("max_output_tokens"),
            Just("text"),
            Just("content"),
            Just("role"),
            Just("type"),
        ]
        .prop_map(String::from);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "[a-z\\n\"é ]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                prop::collection::vec((name.clone(), inner), 0..6)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    /// A document as text, with some members repeated (a `Value` cannot
    /// hold a repeated member, but a body can).
    fn text_with_repeats(value: &Value, repeat: bool) -> String {
        match value {
            Value::Object(members) if repeat && !members.is_empty() => {
                let mut parts: Vec<String> = members
                    .iter()
                    .map(|(k, v)| {
                        format!(
                            "{}:{}",
                            Value::from(k.as_str()),
                            text_with_repeats(v, repeat)
                        )
                    })
                    .collect();
                // The first member again, first: the later one counts.
                let (k, _) = members.iter().next().unwrap();
                let shadow = if k.starts_with("max") {
                    "12345"
                } else {
                    "\"shadowed text\""
                };
                parts.insert(0, format!("{}:{}", Value::from(k.as_str()), shadow));
                format!("{{{}}}", parts.join(","))
            }
            Value::Object(members) => {
                let parts: Vec<String> = members
                    .iter()
                    .map(|(k, v)| {
                        format!(
                            "{}:{}",
                            Value::from(k.as_str()),
                            text_with_repeats(v, repeat)
                        )
                    })
                    .collect();
                format!("{{{}}}", parts.join(","))
            }
            Value::Array(items) => {
                let parts: Vec<String> =
                    items.iter().map(|v| text_with_repeats(v, repeat)).collect();
                format!("[{}]", parts.join(","))
            }
            other => other.to_string(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn the_streaming_scan_agrees_with_parsing_the_whole_document(
            request in prop::collection::vec((json(), any::<bool>()), 0..8),
            names in prop::collection::vec(0usize..7, 8),
            repeat in any::<bool>(),
        ) {
            let fields = ["messages", "prompt", "input", "instructions",
                "max_tokens", "max_completion_tokens", "max_output_tokens"];
            let document = Value::Object(
                request
                    .into_iter()
                    .zip(names)
                    .map(|((value, _), name)| (fields[name].to_string(), value))
                    .collect(),
            );
            let body = text_with_repeats(&document, repeat);
            // Order matters to this tokenizer, as it does to a real one.
            let count = |text: &str| {
                text.bytes().fold(17usize, |hash, byte| hash.wrapping_mul(31) ^ usize::from(byte)) % 1_000_003
            };
            prop_assert_eq!(estimate(body.as_bytes(), None), reference(body.as_bytes(), None));
            prop_assert_eq!(
                estimate(body.as_bytes(), Some(&count)),
                reference(body.as_bytes(), Some(&count))
            );
        }

        #[test]
        fn any_bytes_are_estimated_as_the_parse_would(body in prop::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(estimate(&body, None), reference(&body, None));
        }
    }
}
