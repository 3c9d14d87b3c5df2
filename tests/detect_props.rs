//! First-token detectors decide on a byte of the stream, not on a frame:
//! wherever the body is split, waiting ends at the same absolute offset
//! (behaviour §2.5). Realistic streams check where that is; arbitrary bytes check
//! that nothing panics and every answer lies within its frame.
#![cfg(feature = "http")]

use proptest::prelude::*;
use proptest::sample::{Index, select};
use tower_admission::FirstTokenDetector;
use tower_admission::detect::{AnyData, Auto, Grpc, OpenAiSse};

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(512)
}

/// Cut points into a stream of `len` bytes: any number, repeated ones
/// giving empty frames.
fn cuts() -> impl Strategy<Value = Vec<Index>> {
    prop::collection::vec(any::<Index>(), 0..48)
}

/// `stream` split at `cuts`, in order.
fn frames<'a>(stream: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|cut| cut.index(stream.len() + 1)).collect();
    points.sort_unstable();
    let mut frames = Vec::with_capacity(points.len() + 1);
    let mut start = 0;
    for point in points {
        frames.push(&stream[start..point]);
        start = point;
    }
    frames.push(&stream[start..]);
    frames
}

/// Feeds `frames` to a fresh clone of `detector` (shown `head` first, if
/// any); returns the absolute offset where waiting ended.
fn decide<D: FirstTokenDetector>(
    detector: &D,
    head: Option<&http::response::Parts>,
    frames: &[&[u8]],
) -> Result<Option<usize>, TestCaseError> {
    let mut detector = detector.clone();
    if let Some(head) = head {
        detector.on_response(head);
    }
    let mut before = 0;
    for frame in frames {
        if let Some(n) = detector.on_data(frame) {
            prop_assert!(n > 0, "a decision takes at least one byte");
            prop_assert!(
                n <= frame.len(),
                "{n} bytes of a {}-byte frame",
                frame.len()
            );
            return Ok(Some(before + n));
        }
        before += frame.len();
    }
    Ok(None)
}

/// The decision on `stream` whole, checked to be the same split at `cuts`.
fn decide_split<D: FirstTokenDetector>(
    detector: &D,
    head: Option<&http::response::Parts>,
    stream: &[u8],
    cuts: &[Index],
) -> Result<Option<usize>, TestCaseError> {
    let whole = decide(detector, head, &[stream])?;
    let split = decide(detector, head, &frames(stream, cuts))?;
    prop_assert_eq!(split, whole, "split decision differs from whole");
    Ok(whole)
}

fn head(content_type: &str) -> http::response::Parts {
    http::Response::builder()
        .header(http::header::CONTENT_TYPE, content_type)
        .body(())
        .expect("valid head")
        .into_parts()
        .0
}

// ---- OpenAI-compatible event streams ----

/// One server-sent event: its lines, without line ends, and whether its
/// dispatch ends waiting.
#[derive(Debug, Clone)]
struct Event {
    lines: Vec<String>,
    ends_waiting: bool,
}

/// A stream of events with the line ends to use, in turn.
#[derive(Debug, Clone)]
struct SseStream {
    byte_order_mark: bool,
    events: Vec<Event>,
    line_ends: Vec<&'static str>,
}

fn chat(delta: &str, finish_reason: &str) -> String {
    format!(
        r#"{{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish_reason}}}]}}"#
    )
}

/// Payloads that are interim metadata. None has a comma inside a string, so
/// the stream may cut them into data lines after any comma.
fn interim_payload() -> impl Strategy<Value = String> {
    select(vec![
        chat(r#"{"role":"assistant"}"#, "null"),
        chat(r#"{"role":"assistant","content":""}"#, "null"),
        chat(r#"{"content":null,"reasoning_content":null}"#, "null"),
        chat(r#"{"tool_calls":[]}"#, "null"),
        chat("{}", "null"),
        r#"{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":0,"total_tokens":12}}"#.to_owned(),
        r#"{"id":"c","object":"text_completion","choices":[{"index":0,"text":"","finish_reason":null}]}"#.to_owned(),
        r#"{"type":"response.created","response":{"id":"r","status":"in_progress"}}"#.to_owned(),
        r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"message","content":[]}}"#.to_owned(),
        r#"{"type":"response.output_text.delta","item_id":"m","delta":""}"#.to_owned(),
        r#"{"type":"message_start","message":{"id":"msg","role":"assistant","content":[]}}"#.to_owned(),
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.to_owned(),
        r#"{"type":"ping"}"#.to_owned(),
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}"#.to_owned(),
        String::new(),
    ])
}

/// Payloads that end waiting.
fn token_payload() -> impl Strategy<Value = String> {
    let fixed = select(vec![
        chat(r#"{"reasoning_content":"Let me think"}"#, "null"),
        chat(r#"{"reasoning":"Hmm"}"#, "null"),
        chat(r#"{"refusal":"No"}"#, "null"),
        chat(
            r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}"#,
            "null",
        ),
        chat(r#"{"function_call":{"name":"f","arguments":""}}"#, "null"),
        chat("{}", r#""stop""#),
        r#"{"id":"c","object":"text_completion","choices":[{"index":0,"text":" Paris","finish_reason":null}]}"#.to_owned(),
        r#"{"error":{"message":"engine failed","type":"InternalServerError","code":500}}"#.to_owned(),
        r#"{"object":"error","message":"bad","type":"BadRequestError","code":400}"#.to_owned(),
        r#"{"type":"response.output_text.delta","item_id":"m","delta":"Hi"}"#.to_owned(),
        r#"{"type":"response.completed","response":{"id":"r","status":"completed"}}"#.to_owned(),
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#.to_owned(),
        r#"{"type":"message_stop"}"#.to_owned(),
        r#"{"token":{"id":1,"text":"Hi"}}"#.to_owned(),
        "[DONE]".to_owned(),
        "plain text".to_owned(),
    ]);
    let content =
        "[a-zA-Z !?]{1,8}".prop_map(|word| chat(&format!(r#"{{"content":"{word}"}}"#), "null"));
    prop_oneof![fixed, content]
}

/// Lines an event may carry besides its data, none of which ends waiting.
fn other_line() -> impl Strategy<Value = &'static str> {
    select(vec![
        ": keep-alive",
        ":",
        "id: 42",
        "event: message",
        "retry: 3000",
        "datum: [DONE]",
    ])
}

/// `payload` as `data` lines, cut after the commas `cut_after` selects.
fn data_lines(payload: &str, cut_after: u64, space: bool) -> Vec<String> {
    let prefix = if space { "data: " } else { "data:" };
    let mut lines = Vec::new();
    let mut piece = String::new();
    for (comma, text) in payload.split_inclusive(',').enumerate() {
        piece.push_str(text);
        if text.ends_with(',') && cut_after >> (comma % 64) & 1 == 1 {
            lines.push(format!("{prefix}{}", std::mem::take(&mut piece)));
        }
    }
    lines.push(format!("{prefix}{piece}"));
    lines
}

fn event() -> impl Strategy<Value = Event> {
    let data_event = (
        prop_oneof![
            3 => interim_payload().prop_map(|payload| (payload, false)),
            1 => token_payload().prop_map(|payload| (payload, true)),
        ],
        any::<u64>(),
        any::<bool>(),
        prop::collection::vec((any::<Index>(), other_line()), 0..3),
        prop::bool::weighted(0.05),
    )
        .prop_map(
            |((payload, ends_waiting), cut_after, space, others, error_type)| {
                let mut lines = data_lines(&payload, cut_after, space);
                for (at, line) in others {
                    lines.insert(at.index(lines.len() + 1), line.to_owned());
                }
                if error_type {
                    // Last, so that no `event: message` overrides it.
                    lines.push("event: error".to_owned());
                }
                // An empty payload is still a `data` line: an event, interim.
                Event {
                    lines,
                    ends_waiting: ends_waiting || error_type,
                }
            },
        );
    let without_data = prop::collection::vec(other_line(), 0..3).prop_map(|lines| Event {
        lines: lines.into_iter().map(str::to_owned).collect(),
        ends_waiting: false,
    });
    prop_oneof![4 => data_event, 1 => without_data]
}

fn sse_stream() -> impl Strategy<Value = SseStream> {
    (
        prop::bool::weighted(0.1),
        prop::collection::vec(event(), 0..10),
        prop::collection::vec(select(vec!["\n", "\r\n", "\r"]), 1..6),
    )
        .prop_map(|(byte_order_mark, events, line_ends)| SseStream {
            byte_order_mark,
            events,
            line_ends,
        })
}

impl SseStream {
    /// The bytes, and the offset at which waiting must end: just past the
    /// first byte of the line end of the blank line that dispatches the
    /// first event that ends waiting.
    fn render(&self) -> (Vec<u8>, Option<usize>) {
        let mut bytes = Vec::new();
        if self.byte_order_mark {
            bytes.extend_from_slice("\u{FEFF}".as_bytes());
        }
        let mut line_ends = self.line_ends.iter().copied().cycle();
        let mut after_cr = false;
        let mut expected = None;
        for event in &self.events {
            for line in &event.lines {
                bytes.extend_from_slice(line.as_bytes());
                let line_end = line_ends.next().unwrap_or("\n");
                bytes.extend_from_slice(line_end.as_bytes());
                after_cr = line_end == "\r";
            }
            let mut blank = line_ends.next().unwrap_or("\n");
            if after_cr && blank == "\n" {
                // `\r` then `\n` is one line end, not a blank line.
                blank = "\r\n";
            }
            if event.ends_waiting && expected.is_none() {
                expected = Some(bytes.len() + 1);
            }
            bytes.extend_from_slice(blank.as_bytes());
            after_cr = blank == "\r";
        }
        (bytes, expected)
    }
}

/// Bytes that look like an event stream, often malformed.
fn sse_like_bytes() -> impl Strategy<Value = Vec<u8>> {
    let fragment = prop_oneof![
        select(vec![
            &b"data:"[..],
            b"data: ",
            b"event: error",
            b"\xEF\xBB\xBF",
            b"\r",
            b"\n",
            b"\r\n",
            b":",
            b" ",
            b"[DONE]",
            b"{",
            b"}",
            b"[]",
            br#"{"choices":[{"delta":{"role":"assistant"}}]}"#,
            br#"{"choices":[{"delta":{"content":"x"}}]}"#,
            br#""content":"#,
            b"\xff\xc3",
        ])
        .prop_map(<[u8]>::to_vec),
        prop::collection::vec(any::<u8>(), 1..8),
    ];
    prop::collection::vec(fragment, 0..40).prop_map(|fragments| fragments.concat())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn openai_sse_ends_waiting_where_the_first_output_event_is_dispatched(
        stream in sse_stream(),
        cuts in cuts(),
    ) {
        let (bytes, expected) = stream.render();
        let decided = decide_split(&OpenAiSse::default(), None, &bytes, &cuts)?;
        prop_assert_eq!(decided, expected, "stream {:?}", String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn openai_sse_decides_on_the_same_byte_however_any_bytes_are_split(
        bytes in sse_like_bytes(),
        cuts in cuts(),
        max_event_bytes in prop_oneof![Just(OpenAiSse::DEFAULT_MAX_EVENT_BYTES), 0..64usize],
        content_type in prop::option::of(select(vec!["text/event-stream", "application/json"])),
    ) {
        let detector = OpenAiSse::default().max_event_bytes(max_event_bytes);
        let head = content_type.map(head);
        decide_split(&detector, head.as_ref(), &bytes, &cuts)?;
    }

    #[test]
    fn any_data_ends_waiting_at_the_first_byte_however_split(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
        cuts in cuts(),
    ) {
        let decided = decide_split(&AnyData, None, &bytes, &cuts)?;
        prop_assert_eq!(decided, (!bytes.is_empty()).then_some(1));
    }

    #[test]
    fn grpc_ends_waiting_at_the_last_byte_of_the_first_message(
        lengths in prop::collection::vec(prop_oneof![4 => 0..64u32, 1 => 0..5000u32], 1..5),
        flags in prop::collection::vec(any::<u8>(), 5),
        truncate in any::<Index>(),
        truncated in prop::bool::weighted(0.2),
        cuts in cuts(),
    ) {
        let mut bytes = Vec::new();
        for (length, flag) in lengths.iter().zip(flags.iter().cycle()) {
            bytes.push(*flag);
            bytes.extend_from_slice(&length.to_be_bytes());
            bytes.extend((0..*length).map(|i| i as u8));
        }
        let first_message_end = 5 + lengths[0] as usize;
        if truncated {
            bytes.truncate(truncate.index(bytes.len() + 1));
        }
        let expected = (bytes.len() >= first_message_end).then_some(first_message_end);
        prop_assert_eq!(decide_split(&Grpc::default(), None, &bytes, &cuts)?, expected);
    }

    #[test]
    fn grpc_decides_on_the_same_byte_however_any_bytes_are_split(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        cuts in cuts(),
        content_type in prop::option::of(select(vec!["application/grpc", "text/plain"])),
    ) {
        let head = content_type.map(head);
        decide_split(&Grpc::default(), head.as_ref(), &bytes, &cuts)?;
    }

    #[test]
    fn auto_decides_as_the_detector_its_content_type_chooses(
        bytes in sse_like_bytes(),
        cuts in cuts(),
        content_type in select(vec![
            "text/event-stream",
            "text/event-stream; charset=utf-8",
            "application/grpc",
            "application/grpc-web+proto",
            "application/json",
            "text/plain",
        ]),
    ) {
        let head = head(content_type);
        let auto = decide_split(&Auto::default(), Some(&head), &bytes, &cuts)?;
        let chosen = if content_type.starts_with("text/event-stream") {
            decide(&OpenAiSse::default(), Some(&head), &[&bytes])?
        } else if content_type.starts_with("application/grpc") {
            decide(&Grpc::default(), Some(&head), &[&bytes])?
        } else {
            decide(&AnyData, Some(&head), &[&bytes])?
        };
        prop_assert_eq!(auto, chosen);
    }
}
