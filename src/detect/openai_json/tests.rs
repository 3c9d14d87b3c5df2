//! The scan against the serde_json judge it replaced ([`reference`]): the
//! same answer on every document, valid or not.

use proptest::prelude::*;
use proptest::sample::Index;

use super::{object_ends_waiting, plain, reference, scanned};

fn assert_agrees(data: &[u8]) {
    assert_eq!(
        object_ends_waiting(data),
        reference::object_ends_waiting(data),
        "{}",
        String::from_utf8_lossy(data)
    );
}

/// Member names: those the judge looks for, plainly and with escapes, and
/// names that are not valid strings, or valid only where unchecked.
const NAMES: &[&str] = &[
    r#""choices""#,
    r#""delta""#,
    r#""content""#,
    r#""role""#,
    r#""reasoning_content""#,
    r#""tool_calls""#,
    r#""function_call""#,
    r#""finish_reason""#,
    r#""text""#,
    r#""error""#,
    r#""object""#,
    r#""type""#,
    r#""usage""#,
    r#""index""#,
    r#""partial_json""#,
    r#""\u0063ontent""#,
    r#""typ\u0065""#,
    r#""d\u0065lta""#,
    r#""\u0065rror""#,
    r#""choic\u0065s""#,
    r#""finish\u005freason""#,
    r#""t\u0079pe\u0000""#,
    r#""\ud800""#,
    r#""\udc00""#,
    r#""\ud83d\ude00""#,
    r#""\ud800\u0041""#,
    r#""\ud800x""#,
    r#""é""#,
    r#""\q""#,
    r#""\u12g4""#,
    "\"\u{1}\"",
    r#""""#,
    r#"choices"#,
    r#""type"#,
];

/// Scalars: strings the judge compares or measures, hostile strings,
/// numbers in and out of `f64`'s range, malformed numbers and literals.
const SCALARS: &[&str] = &[
    "null",
    "true",
    "false",
    "nul",
    "nulll",
    "tru",
    "0",
    "-0",
    "7",
    "-12",
    "01",
    "-01",
    "1.",
    "1.5",
    ".5",
    "2.e3",
    "1e5",
    "1E+5",
    "1e-5",
    "1e",
    "1e+",
    "-",
    "1e308",
    "1e309",
    "-1e400",
    "1.7976931348623157e308",
    "1.7976931348623159e308",
    "0e999999999999",
    "1e-99999999999",
    "123456789012345678901",
    "12345678901234567890",
    "18446744073709551616",
    r#""""#,
    r#""x""#,
    r#""error""#,
    r#""\u0065rror""#,
    r#""err\u006fr""#,
    r#""stop""#,
    r#""response.completed""#,
    r#""response.output_text.delta""#,
    r#""response.output_text\u002edelta""#,
    r#""response.created""#,
    r#""response.output_item.added""#,
    r#""message_start""#,
    r#""content_block_delta""#,
    r#""ping""#,
    r#""p\u0069ng""#,
    r#""\ud800""#,
    r#""\udfff""#,
    r#""a\ud83d\ude00""#,
    r#""\ud83d\u0041""#,
    r#""\ud83d""#,
    r#""\ud83d\""#,
    r#""\u00e9""#,
    r#""é""#,
    r#""\n\t\"\\\/\b\f\r""#,
    r#""\x""#,
    r#""\u12""#,
    "\"a\u{1}b\"",
    "\"a\u{7f}b\"",
    r#""unterminated"#,
];

/// Spacing: mostly none, now and then a form feed (which JSON refuses).
fn space() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        120 => Just(""),
        40 => prop::sample::select(&[" ", "\n", "\t", "\r", " \r\n "][..]),
        1 => Just("\u{c}"),
    ]
}

/// Between two elements or members: mostly a comma.
fn separator() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        200 => prop::sample::select(&[",", ", ", " ,\n"][..]),
        1 => prop::sample::select(&[",,", "", ":"][..]),
    ]
}

/// The end of an array or object: mostly there, now and then missing or
/// after a trailing comma.
fn close(bracket: &'static str, after_comma: &'static str) -> impl Strategy<Value = &'static str> {
    prop_oneof![200 => Just(bracket), 1 => Just(""), 1 => Just(after_comma)]
}

/// A scalar: mostly one that is valid everywhere.
fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        24 => prop::sample::select(&["null", "\"\"", "\"x\"", "0", "true", "[]", "{}"][..]),
        2 => prop::sample::select(SCALARS),
    ]
    .prop_map(str::to_owned)
}

/// A name: mostly one the judge looks for.
fn name(names: &'static [&'static str]) -> impl Strategy<Value = &'static str> {
    prop_oneof![8 => prop::sample::select(names), 1 => prop::sample::select(NAMES)]
}

fn array(elements: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    (
        prop::collection::vec((space(), elements, separator()), 0..4),
        space(),
        close("]", ",]"),
    )
        .prop_map(|(elements, space, close)| {
            let written: Vec<(String, &str)> = elements
                .into_iter()
                .map(|(space, element, separator)| (format!("{space}{element}"), separator))
                .collect();
            joined("[", &written, space, close)
        })
}

fn object(members: impl Strategy<Value = (&'static str, String)>) -> impl Strategy<Value = String> {
    let colon = prop_oneof![200 => Just(":"), 1 => Just(""), 1 => Just(",")];
    (
        prop::collection::vec((space(), members, colon, space(), separator()), 0..5),
        space(),
        close("}", ",}"),
    )
        .prop_map(|(members, space, close)| {
            let written: Vec<(String, &str)> = members
                .into_iter()
                .map(|(before, (name, value), colon, after, separator)| {
                    (format!("{before}{name}{after}{colon}{value}"), separator)
                })
                .collect();
            joined("{", &written, space, close)
        })
}

/// `open`, the items with the separators between them, `space`, `close`.
fn joined(open: &str, items: &[(String, &str)], space: &str, close: &str) -> String {
    let mut text = String::from(open);
    for (index, (item, separator)) in items.iter().enumerate() {
        if index > 0 {
            text.push_str(separator);
        }
        text.push_str(item);
    }
    text.push_str(space);
    text.push_str(close);
    text
}

/// Any value, nested a few levels.
fn value() -> impl Strategy<Value = String> {
    scalar().prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            array(inner.clone()),
            object((prop::sample::select(NAMES), inner)),
        ]
    })
}

/// A document of the shapes chunks have: a `choices` array of choices with
/// a `delta`, a `type`, a top-level `delta`, other members, any values.
fn document() -> impl Strategy<Value = String> {
    const DELTA: &[&str] = &[
        "\"content\"",
        "\"role\"",
        "\"reasoning\"",
        "\"refusal\"",
        "\"tool_calls\"",
        "\"type\"",
    ];
    const CHOICE: &[&str] = &["\"finish_reason\"", "\"text\"", "\"index\"", "\"logprobs\""];
    let delta = prop_oneof![
        3 => object((name(DELTA), value())),
        1 => value(),
    ];
    let choice = object(prop_oneof![
        (Just("\"delta\""), delta.clone()),
        (name(CHOICE), value()),
    ]);
    let choices = prop_oneof![4 => array(prop_oneof![6 => choice, 1 => value()]), 1 => value()];
    let kind =
        prop_oneof![3 => prop::sample::select(SCALARS).prop_map(str::to_owned), 1 => value()];
    object(prop_oneof![
        3 => (Just("\"choices\""), choices),
        1 => (Just("\"type\""), kind),
        1 => (Just("\"delta\""), delta),
        2 => (name(&["\"error\"", "\"object\"", "\"id\"", "\"usage\""]), value()),
    ])
}

/// A change to a document's bytes.
#[derive(Debug, Clone)]
enum Mutation {
    Insert(Index, &'static str),
    Delete(Index, usize),
    Truncate(Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let tokens = prop_oneof![
        prop::sample::select(
            &[
                ",", "]", "}", "[", "{", ":", "\"", "\\", "\\u", "e", "-", ".", "0", " ", "\u{1}",
                "é",
            ][..]
        ),
        prop::sample::select(&["\\ud800", "\\udc00", "1e400", "null", "\"choices\":["][..]),
        Just("\"content\":\"x\""),
    ];
    prop_oneof![
        (any::<Index>(), tokens).prop_map(|(at, token)| Mutation::Insert(at, token)),
        (any::<Index>(), 1..4usize).prop_map(|(at, len)| Mutation::Delete(at, len)),
        any::<Index>().prop_map(Mutation::Truncate),
    ]
}

/// Mostly none: a generated document has flaws enough.
fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop_oneof![3 => Just(Vec::new()), 1 => prop::collection::vec(mutation(), 1..3)]
}

fn mutate(document: &str, mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = document.as_bytes().to_vec();
    for mutation in mutations {
        match mutation {
            Mutation::Insert(at, token) => {
                let at = at.index(bytes.len() + 1);
                bytes.splice(at..at, token.bytes());
            }
            Mutation::Delete(at, len) => {
                let at = at.index(bytes.len() + 1);
                bytes.drain(at..(at + len).min(bytes.len()));
            }
            Mutation::Truncate(at) => bytes.truncate(at.index(bytes.len() + 1)),
        }
    }
    bytes
}

/// Chunks as servers send them, to mutate.
const CHUNKS: &[&str] = &[
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1694268190,"model":"m","system_fingerprint":"fp","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1694268190,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.31725305,"bytes":[72,105],"top_logprobs":[]}]},"finish_reason":null}]}"#,
    r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]},"finish_reason":null}]}"#,
    r#"{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#,
    r#"{"id":"c","object":"text_completion","choices":[{"text":"","index":0,"logprobs":null,"finish_reason":null}]}"#,
    r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":25,"output_tokens":1}}}"#,
    r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}"#,
    r#"{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}"#,
    r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"msg_1","status":"in_progress","role":"assistant","content":[]}}"#,
    r#"{"error":{"message":"overloaded","type":"server_error","code":null}}"#,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn agrees_on_generated_documents(
        document in document(),
        mutations in mutations(),
    ) {
        let data = mutate(&document, &mutations);
        prop_assert_eq!(
            object_ends_waiting(&data),
            reference::object_ends_waiting(&data),
            "{}", String::from_utf8_lossy(&data)
        );
    }

    #[test]
    fn agrees_on_mutated_chunks(
        chunk in prop::sample::select(CHUNKS),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let data = mutate(chunk, &mutations);
        prop_assert_eq!(
            object_ends_waiting(&data),
            reference::object_ends_waiting(&data),
            "{}", String::from_utf8_lossy(&data)
        );
    }

    #[test]
    fn agrees_on_arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..48)) {
        prop_assert_eq!(object_ends_waiting(&data), reference::object_ends_waiting(&data));
    }
}

#[test]
fn agrees_on_every_chunk_and_every_truncation_of_it() {
    for chunk in CHUNKS {
        for end in 0..=chunk.len() {
            assert_agrees(&chunk.as_bytes()[..end]);
        }
    }
}

#[test]
fn surrogates_and_ranges_are_checked_only_where_the_judge_reads() {
    for data in [
        // Read: refused.
        r#"{"error":"\ud800"}"#,
        r#"{"object":"\udc00"}"#,
        r#"{"type":"a\ud800\u0041"}"#,
        r#"{"\ud800":1}"#,
        r#"{"usage":{"\ud800":1}}"#,
        r#"{"error":{"\ud800":1}}"#,
        r#"{"error":1e400}"#,
        r#"{"choices":[1e400]}"#,
        r#"{"choices":[{"finish_reason":-1e309}]}"#,
        r#"{"choices":[{"delta":{"content":1e999}}]}"#,
        // Skipped: let through.
        r#"{"usage":"\ud800"}"#,
        r#"{"usage":{"a":{"\ud800":1e400}}}"#,
        r#"{"error":["\ud800",1e400]}"#,
        r#"{"error":{"a":"\udc00"}}"#,
        r#"{"choices":[{"logprobs":"\ud800","delta":{"role":1e400}}]}"#,
        r#"{"type":"content_block_delta","delta":{"type":"\ud800","text":"x"}}"#,
        // Within range, in every form.
        r#"{"error":1.7976931348623157e308}"#,
        r#"{"error":123456789012345678901234567890}"#,
        r#"{"error":0e99999999999}"#,
        r#"{"error":"\ud83d\ude00"}"#,
    ] {
        assert_agrees(data.as_bytes());
    }
}

#[test]
fn agrees_on_deep_nesting() {
    for depth in [1, 63, 64, 65, 127, 128, 129, 5000] {
        let open = "[".repeat(depth);
        let close = "]".repeat(depth);
        for member in ["usage", "error", "choices", "delta", "type"] {
            assert_agrees(format!(r#"{{"{member}":{open}{close}}}"#).as_bytes());
            assert_agrees(format!(r#"{{"{member}":{open}1{close},"x":0}}"#).as_bytes());
            assert_agrees(format!(r#"{{"{member}":{open}{close}"#).as_bytes());
            let objects = r#"{"a":"#.repeat(depth) + "null" + &"}".repeat(depth);
            assert_agrees(format!(r#"{{"{member}":{objects}}}"#).as_bytes());
            assert_agrees(format!(r#"{{"{member}":[{objects}]}}"#).as_bytes());
        }
    }
}

#[test]
fn escaped_names_and_values_are_read_as_what_they_mean() {
    for data in [
        r#"{"choices":[{"delta":{"\u0063ontent":"x"}}]}"#,
        r#"{"ch\u006fices":[{"delta":{"role":"x"}}]}"#,
        r#"{"typ\u0065":"p\u0069ng"}"#,
        r#"{"type":"response\u002eoutput_text.delta","delta":"x"}"#,
        r#"{"object":"\u0065rror"}"#,
        r#"{"object":"err\/or"}"#,
        r#"{"type":"content_block_delta","delta":{"\u0074ype":"x"}}"#,
    ] {
        assert_agrees(data.as_bytes());
    }
}

/// The plain pass, where it decides, decides as the full scan does.
fn plain_agrees(data: &[u8]) -> Result<(), TestCaseError> {
    if let Some(judged) = plain::judge(data) {
        prop_assert_eq!(
            Some(judged),
            scanned(data),
            "{}",
            String::from_utf8_lossy(data)
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn the_plain_pass_agrees_with_the_full_scan_on_generated_documents(
        document in document(),
        mutations in mutations(),
    ) {
        plain_agrees(&mutate(&document, &mutations))?;
    }

    #[test]
    fn the_plain_pass_agrees_with_the_full_scan_on_mutated_chunks(
        chunk in prop::sample::select(CHUNKS),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        plain_agrees(&mutate(chunk, &mutations))?;
    }
}

#[test]
fn the_plain_pass_agrees_with_the_full_scan_on_every_truncation_and_nesting() {
    for chunk in CHUNKS {
        for end in 0..=chunk.len() {
            plain_agrees(&chunk.as_bytes()[..end]).unwrap();
        }
    }
    for depth in [1, 31, 32, 33, 64] {
        let open = "[".repeat(depth);
        let close = "]".repeat(depth);
        for member in ["usage", "error", "choices", "delta", "type"] {
            plain_agrees(format!(r#"{{"{member}":{open}{close}}}"#).as_bytes()).unwrap();
            plain_agrees(format!(r#"{{"{member}":{open}1{close},"x":0}}"#).as_bytes()).unwrap();
            let objects = r#"{"a":"#.repeat(depth) + "null" + &"}".repeat(depth);
            plain_agrees(format!(r#"{{"{member}":[{objects}]}}"#).as_bytes()).unwrap();
        }
    }
}

#[test]
fn chunks_without_escapes_fractions_or_non_ascii_are_judged_by_the_plain_pass() {
    let judged = CHUNKS
        .iter()
        .filter(|chunk| plain::judge(chunk.as_bytes()).is_some())
        .count();
    // All but the chunk with fractional log probabilities.
    assert_eq!(judged, CHUNKS.len() - 1);
    assert_eq!(plain::judge(br#"{"error":1.5}"#), None);
    assert_eq!(plain::judge(br#"{"error":"\u0041"}"#), None);
    assert_eq!(plain::judge("{\"error\":\"\u{e9}\"}".as_bytes()), None);
}

#[test]
fn the_plain_pass_reads_strings_of_every_length_a_word_at_a_time() {
    for len in 0..=17 {
        let text = "abcdefghijklmnopq".get(..len).unwrap();
        for data in [
            format!(r#"{{"{text}":"{text}","choices":[{{"delta":{{"content":"{text}"}}}}]}}"#),
            format!(r#"{{"id":"{text}","type":"{text}"}}"#),
            format!(r#"{{"object":"{text}"}}"#),
        ] {
            assert!(plain::judge(data.as_bytes()).is_some(), "{data}");
            assert_agrees(data.as_bytes());
            plain_agrees(data.as_bytes()).unwrap();
        }
    }
}

#[test]
fn the_plain_pass_stops_at_a_quote_backslash_or_other_byte_anywhere_in_a_word() {
    // DEL is plain; every other stop leaves the document to the full scan.
    let stops: [&[u8]; 9] = [
        b"\"",
        b"\\",
        b"\\n",
        b"\\u0041",
        b"\x01",
        b"\x1f",
        b"\x7f",
        "é".as_bytes(),
        b"\xff",
    ];
    let text = b"abcdefghijklmnopq";
    for stop in stops {
        for at in 0..=text.len() {
            let mut string = text.to_vec();
            string.splice(at..at, stop.iter().copied());
            for (before, after) in [
                (&br#"{"id":""#[..], &br#"","choices":[]}"#[..]),
                (br#"{"choices":[{"delta":{"content":""#, br#""}}]}"#),
                (br#"{""#, br#"":1,"type":"ping"}"#),
            ] {
                let data = [before, &string, after].concat();
                assert_eq!(
                    plain::judge(&data).is_some(),
                    stop == b"\x7f",
                    "{}",
                    String::from_utf8_lossy(&data)
                );
                assert_agrees(&data);
                plain_agrees(&data).unwrap();
            }
        }
    }
}

#[test]
fn names_alike_in_first_byte_and_length_are_told_apart() {
    for name in [
        "errar",
        "objecx",
        "chaices",
        "choicez",
        "typo",
        "deltx",
        "finish_reasom",
        "texx",
        "contenx",
        "reasoning_contenx",
        "reasoninx",
        "refusax",
        "tool_callx",
        "function_calx",
    ] {
        for data in [
            format!(r#"{{"{name}":"x"}}"#),
            format!(r#"{{"{name}":[{{"delta":{{"content":"x"}}}}]}}"#),
            format!(r#"{{"choices":[{{"{name}":"x"}}]}}"#),
            format!(r#"{{"choices":[{{"delta":{{"{name}":"x"}}}}]}}"#),
            format!(r#"{{"type":"content_block_delta","delta":{{"{name}":"x"}}}}"#),
        ] {
            assert!(plain::judge(data.as_bytes()).is_some(), "{data}");
            assert_agrees(data.as_bytes());
            plain_agrees(data.as_bytes()).unwrap();
        }
    }
}

/// Chat chunks as the instruction counts of the plain pass are measured
/// on: short ones, and ones as engines write them. Each is judged by the
/// plain pass; the first of each pair waits, the second ends waiting.
const MEASURED_CHUNKS: [&str; 4] = [
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"}}]}"#,
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"token3"}}]}"#,
    r#"{"id":"chatcmpl-9f8e7d6c5b4a39281706f5e4d3c2b1a0","object":"chat.completion.chunk","created":1733212345,"model":"llama-3.1-8b-instruct","system_fingerprint":"fp_abc123","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
    r#"{"id":"chatcmpl-9f8e7d6c5b4a39281706f5e4d3c2b1a0","object":"chat.completion.chunk","created":1733212345,"model":"llama-3.1-8b-instruct","system_fingerprint":"fp_abc123","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}"#,
];

/// Judges one of [`MEASURED_CHUNKS`] (`JUDGE_CHUNK`, an index) again and
/// again (`JUDGE_ITERATIONS` times), to be run under callgrind:
/// `cargo test --release --lib detect::openai_json::tests::judge_repeatedly
/// -- --ignored --exact`, then the test binary under valgrind with both
/// variables set.
#[test]
#[ignore = "a measurement, run under callgrind"]
fn judge_repeatedly() {
    let variable = |name: &str, default: usize| {
        std::env::var(name).map_or(default, |value| value.parse().unwrap())
    };
    let chunk = MEASURED_CHUNKS[variable("JUDGE_CHUNK", 0)].as_bytes();
    let expected = Some(variable("JUDGE_CHUNK", 0) % 2 == 1);
    for _ in 0..variable("JUDGE_ITERATIONS", 1000) {
        assert_eq!(object_ends_waiting(std::hint::black_box(chunk)), expected);
    }
}
