//! The judge as it was before the scanner: a streaming `serde_json` pass
//! with one visitor per kind of value. It is the reference the scanner is
//! tested against: what serde_json accepts, and what it reads, is what the
//! scanner must accept and read.

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

use super::{Kind, OUTPUT_DELTA_MEMBERS, kind_of};
use crate::json::{answer_json, seed_any};

/// `Some(true)`/`Some(false)` for a JSON object, `None` for anything else.
pub(super) fn object_ends_waiting(data: &[u8]) -> Option<bool> {
    let data = std::str::from_utf8(data).ok()?;
    let mut deserializer = serde_json::Deserializer::from_str(data);
    let judged = deserializer.deserialize_any(TopLevel).ok()?;
    deserializer.end().ok()?;
    judged
}

/// A unit visitor judging one kind of value, with what every visitor says
/// it expects.
macro_rules! judge {
    ($(#[$doc:meta])* $name:ident -> $value:ty { $($body:tt)* }) => {
        $(#[$doc])*
        struct $name;

        impl<'de> Visitor<'de> for $name {
            type Value = $value;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }

            $($body)*
        }
    };
}

/// Drains whatever value is next; used where a value's content does not matter.
fn skip<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    map.next_value::<IgnoredAny>().map(drop)
}

judge!(
    /// The document: an object is judged, anything else is `None`.
    TopLevel -> Option<bool> {
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<bool>, A::Error> {
            let mut error = false;
            let mut object_is_error = false;
            let mut choices = None;
            let mut kind = Kind::default();
            let mut delta = false;
            while let Some(key) = map.next_key_seed(KeyIs(&[
                "error", "object", "choices", "type", "delta",
            ]))? {
                match key {
                    Some(0) => error = map.next_value_seed(Something)?,
                    Some(1) => object_is_error = map.next_value_seed(IsError)?,
                    Some(2) => choices = map.next_value_seed(Choices)?,
                    Some(3) => kind = map.next_value_seed(KindOf)?,
                    Some(4) => delta = map.next_value_seed(Payload)?,
                    _ => skip(&mut map)?,
                }
            }
            Ok(Some(error || object_is_error || kind.ends_waiting(delta, choices)))
        }

        answer_json!(None; numbers, unit, str, arrays);
    }
);

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

/// The visitor methods of a judge of whether a value carries something,
/// for scalars: a number or boolean does, `null` does not, a string does
/// when not empty.
macro_rules! scalars_carry {
    () => {
        answer_json!(true; numbers);
        answer_json!(false; unit);
        fn visit_str<E>(self, text: &str) -> Result<bool, E> {
            Ok(!text.is_empty())
        }
    };
}

judge!(
    /// Whether a value is more than a placeholder: not `null`, and not an
    /// empty string, array or object.
    Something -> bool {
        scalars_carry!();

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
);

judge!(
    /// Whether a value is the string `error`.
    IsError -> bool {
        fn visit_str<E>(self, text: &str) -> Result<bool, E> {
            Ok(text == "error")
        }
        answer_json!(false; numbers, unit, arrays, objects);
    }
);

judge!(
    /// What an event's `type` says.
    KindOf -> Kind {
        fn visit_str<E>(self, kind: &str) -> Result<Kind, E> {
            Ok(kind_of(kind))
        }
        answer_json!(Kind::Unnamed; numbers, unit, arrays, objects);
    }
);

judge!(
    /// An event's `delta`: whether it carries a payload.
    Payload -> bool {
        scalars_carry!();
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
);

judge!(
    /// `choices`: for an array, whether any choice carries output or a
    /// finish reason; `None` for any other value.
    Choices -> Option<bool> {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<bool>, A::Error> {
            let mut any = false;
            while let Some(ends) = seq.next_element_seed(Choice)? {
                any |= ends;
            }
            Ok(Some(any))
        }

        answer_json!(None; numbers, unit, str, objects);
    }
);

judge!(
    /// One choice: a `finish_reason`, completion `text`, or an output
    /// member of its `delta`.
    Choice -> bool {
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
);

judge!(
    /// A chat `delta`: whether any output member carries something (each
    /// member's last occurrence counts).
    Delta -> bool {
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
);

seed_any!(Something, IsError, KindOf, Payload, Choices, Choice, Delta);
