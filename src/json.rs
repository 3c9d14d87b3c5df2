//! What the streaming JSON scans share (the first-token judge of
//! [`detect`](crate::detect) and the cost estimate of
//! [`OpenAiCostLayer`](crate::http::OpenAiCostLayer)): the serde visitor
//! methods of the values a visitor does not look into, and the seed that
//! visits any value. Each scan keeps a few values and builds nothing of
//! what it skips.

/// Visitor methods answering `$answer` for each kind of JSON value named:
/// `numbers` (booleans and numbers), `unit` (`null`), `str` (strings),
/// `arrays` and `objects` (skipped whole, element by element, without
/// being built).
macro_rules! answer_json {
    ($answer:expr; $($kind:ident),+) => {
        $(answer_json!(@ $kind, $answer);)+
    };
    (@ numbers, $answer:expr) => {
        answer_json!(@ values, $answer; visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64);
    };
    (@ str, $answer:expr) => {
        answer_json!(@ values, $answer; visit_str: &str);
    };
    (@ values, $answer:expr; $($visit:ident: $value:ty),+) => {
        $(
            fn $visit<E: ::serde::de::Error>(self, _: $value) -> Result<Self::Value, E> {
                Ok($answer)
            }
        )+
    };
    (@ unit, $answer:expr) => {
        fn visit_unit<E: ::serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($answer)
        }
    };
    (@ arrays, $answer:expr) => {
        answer_json!(@ skipped, $answer; visit_seq: SeqAccess);
    };
    (@ objects, $answer:expr) => {
        answer_json!(@ skipped, $answer; visit_map: MapAccess);
    };
    // `IgnoredAny` visits the elements or entries one by one and keeps none.
    (@ skipped, $answer:expr; $visit:ident: $access:ident) => {
        fn $visit<A: ::serde::de::$access<'de>>(self, access: A) -> Result<Self::Value, A::Error> {
            ::serde::de::Visitor::$visit(::serde::de::IgnoredAny, access)?;
            Ok($answer)
        }
    };
}

/// A visitor as its own seed: `DeserializeSeed` for each type named, with
/// the visitor's value, by `deserialize_any`.
macro_rules! seed_any {
    ($($visitor:ty),+ $(,)?) => {
        $(
            impl<'de> ::serde::de::DeserializeSeed<'de> for $visitor {
                type Value = <$visitor as ::serde::de::Visitor<'de>>::Value;

                fn deserialize<D: ::serde::de::Deserializer<'de>>(
                    self,
                    deserializer: D,
                ) -> Result<Self::Value, D::Error> {
                    deserializer.deserialize_any(self)
                }
            }
        )+
    };
}

pub(crate) use {answer_json, seed_any};
