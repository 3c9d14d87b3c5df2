//! The streaming estimate against the whole-parse estimate it replaced.

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
fn texts_are_joined_by_newlines_after_the_first_non_empty_one() {
    for (texts, joined) in [
        (vec![], ""),
        (vec![""], ""),
        (vec!["", "ab"], "ab"),
        (vec!["", "", "ab", "c"], "ab\nc"),
        (vec!["ab", "", "c"], "ab\n\nc"),
        (vec!["a", "b"], "a\nb"),
    ] {
        let mut prompt = Prompt::new(true);
        for text in &texts {
            prompt.push(Cow::Borrowed(text));
        }
        assert_eq!(prompt.joined(), joined, "{texts:?}");
    }
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
fn only_the_objects_of_messages_are_messages() {
    for body in [
        &br#"{"messages": [[{"content": "abcd"}]]}"#[..],
        br#"{"messages": [[[{"content": "abcd"}]]]}"#,
        br#"{"messages": {"content": "abcd"}}"#,
        br#"{"messages": ["abcd", {"content": "efgh"}]}"#,
    ] {
        assert_eq!(estimate(body, None), reference(body, None));
    }
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
/// tokenizer asks for one text. The texts go into the estimate's own
/// [`Prompt`], so that what is compared is the two ways of reading a body
/// (how a prompt's texts are joined is pinned by
/// `texts_are_joined_by_newlines_after_the_first_non_empty_one`).
fn reference(body: &[u8], tokenizer: Option<&CountTokens>) -> Option<Cost> {
    let Ok(Value::Object(request)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    let mut prompt = Prompt::new(true);
    if let Some(messages) = request.get("messages").and_then(Value::as_array) {
        for message in messages {
            collect(&mut prompt, message.get("content"));
        }
    }
    for field in ["prompt", "input", "instructions"] {
        collect(&mut prompt, request.get(field));
    }
    let max_output_tokens = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
        .iter()
        .find_map(|field| request.get(*field)?.as_u64())
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    Some(Cost::new(prompt.tokens(tokenizer), max_output_tokens))
}

/// Takes the text of a prompt field into `prompt`: a string, an array of
/// strings or token IDs (numbers, one token each, nested lists summed), or
/// an array of content parts (`{"type":"text","text":…}`) or input items
/// (`{"role":…,"content":…}`).
fn collect<'a>(prompt: &mut Prompt<'a>, value: Option<&'a Value>) {
    match value {
        Some(Value::String(text)) => prompt.push(Cow::Borrowed(text)),
        Some(Value::Array(items)) => {
            for item in items {
                match item {
                    Value::Object(part) => {
                        collect(prompt, part.get("text"));
                        collect(prompt, part.get("content"));
                    }
                    Value::Number(_) => prompt.token_ids = prompt.token_ids.saturating_add(1),
                    other => collect(prompt, Some(other)),
                }
            }
        }
        _ => {}
    }
}

fn json() -> impl Strategy<Value = Value> {
    let name = prop::sample::select(&[
        "messages",
        "prompt",
        "input",
        "instructions",
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "text",
        "content",
        "role",
        "type",
    ])
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
        Value::Object(members) => {
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
            // With repeats, the first member again, first: the later one counts.
            match members.iter().next() {
                Some((k, _)) if repeat => {
                    let shadow = if k.starts_with("max") {
                        "12345"
                    } else {
                        "\"shadowed text\""
                    };
                    parts.insert(0, format!("{}:{}", Value::from(k.as_str()), shadow));
                }
                _ => {}
            }
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(|v| text_with_repeats(v, repeat)).collect();
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
