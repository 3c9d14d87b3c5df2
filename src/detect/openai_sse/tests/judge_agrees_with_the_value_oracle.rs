//! The allocation-free judge agrees with the value oracle on generated
//! JSON, Chat Completions chunks and arbitrary bytes.

use proptest::prelude::*;
use serde_json::{Map, Value};

fn json() -> impl Strategy<Value = Value> {
    let names = prop::sample::select(
        &[
            "choices",
            "delta",
            "content",
            "role",
            "reasoning_content",
            "reasoning",
            "refusal",
            "tool_calls",
            "function_call",
            "finish_reason",
            "text",
            "error",
            "object",
            "type",
            "usage",
            "index",
            "partial_json",
            "thinking",
        ][..],
    );
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        prop_oneof![
            Just(String::new()),
            Just("x".to_owned()),
            Just("error".to_owned()),
            Just("response.completed".to_owned()),
            Just("response.output_text.delta".to_owned()),
            Just("response.created".to_owned()),
            Just("response.output_item.added".to_owned()),
            Just("response.web_search_call.searching".to_owned()),
            Just("message_start".to_owned()),
            Just("content_block_start".to_owned()),
            Just("content_block_delta".to_owned()),
            Just("message_stop".to_owned()),
            Just("ping".to_owned()),
            Just("text_delta".to_owned()),
            Just("chat.completion.chunk".to_owned()),
            Just("stop".to_owned()),
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 5, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((names.clone(), inner), 0..5).prop_map(|members| {
                Value::Object(
                    members
                        .into_iter()
                        .map(|(name, value)| (name.to_owned(), value))
                        .collect::<Map<String, Value>>(),
                )
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn on_generated_json(value in json()) {
        let data = serde_json::to_vec(&value).unwrap();
        prop_assert_eq!(
            super::super::event_ends_waiting(&data),
            super::value_oracle::event_ends_waiting(&data),
            "{}", String::from_utf8_lossy(&data)
        );
    }

    #[test]
    fn on_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..64)) {
        prop_assert_eq!(
            super::super::event_ends_waiting(&data),
            super::value_oracle::event_ends_waiting(&data)
        );
    }
}

#[test]
fn duplicate_members_count_as_their_last_occurrence() {
    for data in [
        &br#"{"choices":[{"delta":{"content":"x","content":""}}]}"#[..],
        br#"{"choices":[{"delta":{"content":"","content":"x"}}]}"#,
        br#"{"error":{"message":"x"},"error":null}"#,
        br#"{"type":"response.output_text.delta","delta":"x","delta":""}"#,
    ] {
        assert_eq!(
            super::super::event_ends_waiting(data),
            super::value_oracle::event_ends_waiting(data),
            "{}",
            String::from_utf8_lossy(data)
        );
    }
}
