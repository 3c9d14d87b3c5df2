//! [`OpenAiSse`]: waiting ends at the first event of an OpenAI-compatible
//! event stream that carries output.

use super::FirstTokenDetector;
use super::media_type::media_type;
use super::openai_json::object_ends_waiting;

/// Waiting ends at the first event of an OpenAI-compatible
/// `text/event-stream` that carries generated output, or that says the
/// answer is over.
///
/// The body is read as [server-sent events]: lines end with `\n`, `\r\n` or
/// `\r` (also when a `\r\n` is split between two frames), `data:` lines of
/// one event are joined with `\n`, and a blank line dispatches the event.
/// Each dispatched event's data is then judged:
///
/// **Interim metadata** — waiting goes on:
///
/// * `:` comments, blank keep-alives, events with empty data, and `id:`,
///   `retry:` or `event:` fields on their own;
/// * a chat chunk whose delta has only a `role`, `content` that is `""` or
///   `null`, or an empty `tool_calls`;
/// * a usage-only chunk (`"choices": []`);
/// * any other JSON object that no rule below matches (a Responses API
///   `response.created`, say).
///
/// **Output, or the end of the answer** — waiting ends:
///
/// * a delta with non-empty `content`, `reasoning_content`, `reasoning`,
///   `refusal`, `tool_calls`, or legacy `function_call`;
/// * a completion chunk with non-empty `choices[].text`;
/// * any choice with a `finish_reason` (the answer may end without a token);
/// * `[DONE]`;
/// * an error: an `"error"` member, `"object": "error"`, or an
///   `event: error` with data;
/// * a Responses API `*.delta` event with a non-empty `delta`, or
///   `response.completed`, `response.incomplete`, `response.failed`;
/// * data that is not a JSON object: not JSON, not UTF-8, an array, a bare
///   value.
///
/// Data that is not a JSON object ends waiting because the detector
/// recognises interim metadata, not output: whatever it cannot recognise is
/// something the client sees. A server speaking another dialect so ends
/// waiting at its first event, as with [`AnyData`](super::AnyData), rather
/// than holding waiting capacity until the whole answer is generated.
///
/// # Where waiting ends
///
/// [`on_data`](FirstTokenDetector::on_data) reports the byte that dispatches
/// the deciding event: the first byte of the blank line's line end (the `\r`
/// of a `\r\n`, which is already known to end the line). The decision thus
/// falls on the same byte of the stream however it is split into frames. A
/// stream that ends without dispatching such an event ends waiting by
/// completing, which the layer sees without the detector.
///
/// # Other content types
///
/// When the response head has a `content-type` other than
/// `text/event-stream` — a non-streaming JSON answer, an error page — waiting
/// ends at the first non-empty data frame, as with `AnyData`. A response
/// without `content-type` is read as an event stream.
///
/// # Memory
///
/// Only the `data` of the event being read is buffered, up to
/// [`max_event_bytes`](OpenAiSse::max_event_bytes) (64 KiB by default,
/// counting the `\n` that joins data lines). No role, keep-alive or usage
/// chunk comes near that size, so an event whose data grows past the bound
/// is taken as output: waiting ends at the byte that crosses the bound.
/// Comments and other fields are never buffered, whatever their length.
/// A configured detector holds no buffer, so cloning it does not allocate;
/// the buffer is freed once waiting ends.
///
/// After it has reported the first token the detector reports nothing more.
///
/// ```
/// use tower_admission::FirstTokenDetector;
/// use tower_admission::detect::OpenAiSse;
///
/// let mut detector = OpenAiSse::new();
/// let interim = b": keep-alive\n\ndata: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
/// assert_eq!(detector.on_data(interim), None);
///
/// let token = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
/// assert_eq!(detector.on_data(token), Some(token.len()));
/// ```
///
/// [server-sent events]: https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation
#[derive(Debug, Clone)]
pub struct OpenAiSse {
    max_event_bytes: usize,
    mode: Mode,
    parser: EventParser,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Parse server-sent events.
    EventStream,
    /// Not an event stream: the first non-empty frame ends waiting.
    AnyData,
    /// Waiting has ended; nothing more to report.
    Done,
}

impl OpenAiSse {
    /// The default bound on one event's buffered data: 64 KiB.
    pub const DEFAULT_MAX_EVENT_BYTES: usize = 64 * 1024;

    /// A detector with the default bound on buffered event data.
    pub fn new() -> Self {
        OpenAiSse {
            max_event_bytes: Self::DEFAULT_MAX_EVENT_BYTES,
            mode: Mode::EventStream,
            parser: EventParser::default(),
        }
    }

    /// Bounds the data buffered for one event to `bytes`; an event whose
    /// data (with the `\n` joining its lines) grows past the bound ends
    /// waiting. `0` makes every `data` line end waiting.
    pub fn max_event_bytes(mut self, bytes: usize) -> Self {
        self.max_event_bytes = bytes;
        self
    }

    fn finish(&mut self) {
        self.mode = Mode::Done;
        self.parser = EventParser::default();
    }
}

impl Default for OpenAiSse {
    fn default() -> Self {
        Self::new()
    }
}

impl FirstTokenDetector for OpenAiSse {
    fn on_response(&mut self, head: &http::response::Parts) {
        if self.mode == Mode::Done {
            return;
        }
        self.mode = match media_type(head) {
            Some(essence) if !essence.eq_ignore_ascii_case(b"text/event-stream") => Mode::AnyData,
            _ => Mode::EventStream,
        };
    }

    fn on_data(&mut self, data: &[u8]) -> Option<usize> {
        let decided = match self.mode {
            Mode::Done => None,
            Mode::AnyData => (!data.is_empty()).then_some(1),
            Mode::EventStream => self.parser.feed(data, self.max_event_bytes),
        };
        if decided.is_some() {
            self.finish();
        }
        decided
    }
}

/// Incremental server-sent-events parser: it keeps only the position in the
/// current line, the field name (a few bytes), and the current event's data.
#[derive(Debug, Clone, Default)]
struct EventParser {
    position: LinePosition,
    /// Name of the current line's field, while it is read.
    name: ShortBytes<{ DATA_AFTER_BOM.len() }>,
    field: Field,
    /// Value of the current `event` field, while it is read.
    event_value: ShortBytes<{ b"error".len() }>,
    /// The last byte was a `\r`: a `\n` right after it ends no line.
    after_cr: bool,
    /// Some line has ended: a byte order mark can no longer come.
    past_first_line: bool,
    /// The current event's data: `data` values, each followed by `\n`.
    data: Vec<u8>,
    /// The current event's type is `error`.
    error_event: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum LinePosition {
    /// Nothing of the current line read yet.
    #[default]
    Start,
    /// Reading the field name.
    Name,
    /// Just past the `:`; a single space here is not part of the value.
    ValueStart,
    /// Reading the value.
    Value,
}

/// The fields the detector listens to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Field {
    Data,
    Event,
    #[default]
    Other,
}

/// A UTF-8 byte order mark, which the stream may start with, then `data`.
const DATA_AFTER_BOM: &[u8] = b"\xEF\xBB\xBFdata";

impl EventParser {
    /// Reads one frame; returns how many of its bytes it took to complete
    /// an event that ends waiting.
    fn feed(&mut self, frame: &[u8], max_event_bytes: usize) -> Option<usize> {
        let mut index = 0;
        while index < frame.len() {
            let byte = frame[index];
            if std::mem::take(&mut self.after_cr) && byte == b'\n' {
                index += 1;
                continue;
            }
            if byte == b'\r' || byte == b'\n' {
                self.after_cr = byte == b'\r';
                index += 1;
                if self.end_line(max_event_bytes) {
                    return Some(index);
                }
                continue;
            }
            match self.position {
                LinePosition::Start | LinePosition::Name => {
                    if byte == b':' {
                        self.field = self.field_named();
                        self.position = LinePosition::ValueStart;
                    } else {
                        self.name.push(&[byte]);
                        self.position = LinePosition::Name;
                    }
                    index += 1;
                }
                LinePosition::ValueStart => {
                    self.position = LinePosition::Value;
                    if byte == b' ' {
                        index += 1;
                    }
                }
                LinePosition::Value => {
                    let rest = &frame[index..];
                    let len = rest
                        .iter()
                        .position(|&byte| byte == b'\r' || byte == b'\n')
                        .unwrap_or(rest.len());
                    let value = &rest[..len];
                    match self.field {
                        Field::Data => {
                            let room = max_event_bytes.saturating_sub(self.data.len());
                            if value.len() > room {
                                // The byte after `room` more is the one that
                                // crosses the bound.
                                return Some(index + room + 1);
                            }
                            self.append_data(value, max_event_bytes);
                        }
                        Field::Event => self.event_value.push(value),
                        Field::Other => {}
                    }
                    index += len;
                }
            }
        }
        None
    }

    /// The line just ended; returns whether it ended waiting.
    fn end_line(&mut self, max_event_bytes: usize) -> bool {
        let position = std::mem::take(&mut self.position);
        if position == LinePosition::Start {
            return self.dispatch();
        }
        if position == LinePosition::Name {
            // A line without `:` is a field name with an empty value.
            self.field = self.field_named();
        }
        match std::mem::take(&mut self.field) {
            Field::Data => {
                if self.data.len() >= max_event_bytes {
                    return true;
                }
                self.append_data(b"\n", max_event_bytes);
            }
            Field::Event => {
                self.error_event = self.event_value.as_slice() == Some(&b"error"[..]);
            }
            Field::Other => {}
        }
        self.name.clear();
        self.event_value.clear();
        self.past_first_line = true;
        false
    }

    fn field_named(&self) -> Field {
        match self.name.as_slice() {
            Some(b"data") => Field::Data,
            Some(DATA_AFTER_BOM) if !self.past_first_line => Field::Data,
            Some(b"event") => Field::Event,
            _ => Field::Other,
        }
    }

    /// Appends to the event data, which the caller has checked stays within
    /// `max_event_bytes`. Capacity grows geometrically but never past the
    /// bound, so the bound holds for memory, not only for length.
    fn append_data(&mut self, bytes: &[u8], max_event_bytes: usize) {
        let needed = self.data.len() + bytes.len();
        if needed > self.data.capacity() {
            let target = needed.max(self.data.capacity() * 2).min(max_event_bytes);
            self.data
                .reserve_exact(target.max(needed) - self.data.len());
        }
        self.data.extend_from_slice(bytes);
    }

    /// A blank line: dispatch the event read so far; returns whether it
    /// ends waiting.
    fn dispatch(&mut self) -> bool {
        self.past_first_line = true;
        let error_event = std::mem::take(&mut self.error_event);
        if self.data.is_empty() {
            // No `data` line: nothing is dispatched (a keep-alive).
            return false;
        }
        let data = self.data.strip_suffix(b"\n").unwrap_or(&self.data);
        let ends = error_event || event_ends_waiting(data);
        self.data.clear();
        ends
    }
}

/// Whether the data of one dispatched event is output or the end of the
/// answer, rather than interim metadata.
fn event_ends_waiting(data: &[u8]) -> bool {
    let data = data.trim_ascii();
    if data.is_empty() {
        return false;
    }
    if data == b"[DONE]" {
        return true;
    }
    // Not a JSON object: not recognisably metadata, so the client sees it
    // as output.
    object_ends_waiting(data).unwrap_or(true)
}

/// Up to `N` bytes; longer contents are remembered only as "too long".
#[derive(Debug, Clone, Copy)]
struct ShortBytes<const N: usize> {
    bytes: [u8; N],
    /// Bytes pushed so far; past `N` only `as_slice` returning `None` tells.
    len: usize,
}

impl<const N: usize> Default for ShortBytes<N> {
    fn default() -> Self {
        ShortBytes {
            bytes: [0; N],
            len: 0,
        }
    }
}

impl<const N: usize> ShortBytes<N> {
    fn push(&mut self, more: &[u8]) {
        if let Some(free) = self.bytes.get_mut(self.len..) {
            let copied = free.len().min(more.len());
            free[..copied].copy_from_slice(&more[..copied]);
        }
        self.len = self.len.saturating_add(more.len());
    }

    /// The contents, or `None` when they were longer than `N` bytes.
    fn as_slice(&self) -> Option<&[u8]> {
        self.bytes.get(..self.len)
    }

    fn clear(&mut self) {
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::super::media_type::tests::head;
    use super::*;

    fn chat_delta(delta: &str) -> String {
        format!(
            r#"{{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":null}}]}}"#
        )
    }

    fn event(data: &str) -> Vec<u8> {
        format!("data: {data}\n\n").into_bytes()
    }

    /// Feeds `frames` in order; returns the absolute offset of the decision.
    fn decide(detector: &mut OpenAiSse, frames: &[&[u8]]) -> Option<usize> {
        let mut before = 0;
        for frame in frames {
            if let Some(n) = detector.on_data(frame) {
                assert!(n > 0 && n <= frame.len(), "{n} outside 1..={}", frame.len());
                return Some(before + n);
            }
            before += frame.len();
        }
        None
    }

    /// The decision on `stream` in one frame, checked to be the same when
    /// the stream arrives byte by byte and split at every single byte.
    #[track_caller]
    fn decide_any_split(detector: &OpenAiSse, stream: &[u8]) -> Option<usize> {
        let whole = decide(&mut detector.clone(), &[stream]);
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(decide(&mut detector.clone(), &bytes), whole, "byte by byte");
        for split in 0..=stream.len() {
            let (head, tail) = stream.split_at(split);
            let decided = decide(&mut detector.clone(), &[head, tail]);
            assert_eq!(decided, whole, "split at {split}");
        }
        whole
    }

    #[track_caller]
    fn assert_interim(stream: &[u8]) {
        assert_eq!(decide_any_split(&OpenAiSse::new(), stream), None);
    }

    /// `token`, one event after an interim one, ends waiting at the first
    /// byte of its dispatching blank line's line end.
    #[track_caller]
    fn assert_ends_waiting(token: &[u8]) {
        let mut stream = event(&chat_delta(r#"{"role":"assistant","content":""}"#));
        let lf_after_cr = usize::from(token.ends_with(b"\r\n"));
        let expected = stream.len() + token.len() - lf_after_cr;
        stream.extend_from_slice(token);
        stream.extend_from_slice(&event(&chat_delta(r#"{"content":"later"}"#)));
        assert_eq!(decide_any_split(&OpenAiSse::new(), &stream), Some(expected));
    }

    #[test]
    fn comments_and_keep_alives_do_not_end_waiting() {
        assert_interim(b": ping\n\n:\n\n\n\n\r\n\r");
    }

    #[test]
    fn a_role_only_chunk_does_not_end_waiting() {
        assert_interim(&event(&chat_delta(r#"{"role":"assistant"}"#)));
    }

    #[test]
    fn empty_or_null_content_does_not_end_waiting() {
        assert_interim(&event(&chat_delta(r#"{"content":""}"#)));
        assert_interim(&event(&chat_delta(
            r#"{"role":"assistant","content":null,"reasoning_content":null,"tool_calls":[]}"#,
        )));
        assert_interim(&event(&chat_delta("{}")));
    }

    #[test]
    fn a_usage_only_chunk_does_not_end_waiting() {
        assert_interim(&event(
            r#"{"id":"1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":0,"total_tokens":9}}"#,
        ));
    }

    #[test]
    fn an_event_with_empty_data_does_not_end_waiting() {
        assert_interim(b"data:\n\ndata: \n\ndata\n\ndata:  \r\n\r\n");
    }

    #[test]
    fn fields_other_than_data_do_not_end_waiting() {
        assert_interim(b"id: 7\nretry: 1000\nevent: message\ndatum: [DONE]\n\nevent: error\n\n");
    }

    #[test]
    fn a_json_object_with_no_output_does_not_end_waiting() {
        assert_interim(&event(r#"{"type":"response.created","response":{}}"#));
        assert_interim(&event(r#"{"ping":true}"#));
    }

    #[test]
    fn a_content_delta_ends_waiting_at_the_blank_line_that_dispatches_it() {
        assert_ends_waiting(&event(&chat_delta(r#"{"content":"Hello"}"#)));
    }

    #[test]
    fn a_reasoning_delta_ends_waiting() {
        assert_ends_waiting(&event(&chat_delta(r#"{"reasoning_content":"Hmm"}"#)));
        assert_ends_waiting(&event(&chat_delta(r#"{"reasoning":"Hmm"}"#)));
    }

    #[test]
    fn a_refusal_delta_ends_waiting() {
        assert_ends_waiting(&event(&chat_delta(r#"{"refusal":"No."}"#)));
    }

    #[test]
    fn a_tool_call_delta_ends_waiting() {
        assert_ends_waiting(&event(&chat_delta(
            r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}"#,
        )));
    }

    #[test]
    fn a_legacy_function_call_delta_ends_waiting() {
        assert_ends_waiting(&event(&chat_delta(
            r#"{"function_call":{"name":"get_weather","arguments":""}}"#,
        )));
    }

    #[test]
    fn a_completion_chunk_with_text_ends_waiting() {
        assert_interim(&event(
            r#"{"object":"text_completion","choices":[{"index":0,"text":"","finish_reason":null}]}"#,
        ));
        assert_ends_waiting(&event(
            r#"{"object":"text_completion","choices":[{"index":0,"text":" Paris","finish_reason":null}]}"#,
        ));
    }

    #[test]
    fn a_finish_reason_ends_waiting_without_any_token() {
        assert_ends_waiting(&event(
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
        ));
    }

    #[test]
    fn done_ends_waiting() {
        assert_ends_waiting(b"data: [DONE]\n\n");
        assert_ends_waiting(b"data:[DONE]\r\n\r\n");
    }

    #[test]
    fn an_error_ends_waiting() {
        assert_ends_waiting(&event(
            r#"{"error":{"message":"out of memory","type":"InternalServerError","code":500}}"#,
        ));
        assert_ends_waiting(&event(
            r#"{"object":"error","message":"bad","type":"BadRequestError","code":400}"#,
        ));
        assert_ends_waiting(b"event: error\ndata: {\"message\":\"bad\"}\n\n");
    }

    #[test]
    fn responses_api_output_and_terminal_events_end_waiting() {
        assert_interim(&event(
            r#"{"type":"response.output_text.delta","item_id":"1","delta":""}"#,
        ));
        assert_ends_waiting(&event(
            r#"{"type":"response.output_text.delta","item_id":"1","delta":"Hi"}"#,
        ));
        assert_ends_waiting(&event(r#"{"type":"response.failed","response":{}}"#));
    }

    #[test]
    fn data_that_is_not_a_json_object_ends_waiting() {
        assert_ends_waiting(b"data: Hello\n\n");
        assert_ends_waiting(b"data: [1, 2]\n\n");
        assert_ends_waiting(b"data: {\"choices\": [\n\n");
    }

    #[test]
    fn invalid_utf8_data_ends_waiting_and_an_invalid_utf8_comment_does_not() {
        assert_interim(b": \xff\xfe\xc3\n\n");
        assert_ends_waiting(b"data: \xff\xfe\xc3(\n\n");
    }

    #[test]
    fn waiting_does_not_end_before_the_dispatching_blank_line() {
        let mut detector = OpenAiSse::new();
        let token = format!("data: {}\n", chat_delta(r#"{"content":"Hi"}"#));
        assert_eq!(detector.on_data(token.as_bytes()), None);
        assert_eq!(detector.on_data(b"\n"), Some(1));
    }

    #[test]
    fn crlf_line_endings_are_understood() {
        let interim = format!("data: {}\r\n\r\n", chat_delta(r#"{"role":"assistant"}"#));
        let token = format!(": c\r\ndata: {}\r\n\r\n", chat_delta(r#"{"content":"Hi"}"#));
        let stream = format!("{interim}{token}");
        // The `\r` of the blank line dispatches; its `\n` is not needed.
        let expected = stream.len() - 1;
        assert_eq!(
            decide_any_split(&OpenAiSse::new(), stream.as_bytes()),
            Some(expected)
        );
    }

    #[test]
    fn cr_line_endings_are_understood() {
        let interim = format!("data: {}\r\r", chat_delta(r#"{"role":"assistant"}"#));
        let token = format!(": c\rdata: {}\r\r", chat_delta(r#"{"content":"Hi"}"#));
        let stream = format!("{interim}{token}");
        assert_eq!(
            decide_any_split(&OpenAiSse::new(), stream.as_bytes()),
            Some(stream.len())
        );
    }

    #[test]
    fn a_crlf_split_between_frames_ends_one_line() {
        let mut detector = OpenAiSse::new();
        let token = format!("data: {}\r", chat_delta(r#"{"content":"Hi"}"#));
        assert_eq!(detector.on_data(token.as_bytes()), None);
        // The `\n` completes the `\r\n` above; it is not a blank line.
        assert_eq!(detector.on_data(b"\n"), None);
        assert_eq!(detector.on_data(b"\r\n"), Some(1));
    }

    #[test]
    fn data_lines_of_one_event_are_joined_with_newlines() {
        let stream = b"data: {\"choices\":[{\"index\":0,\r\ndata:\"delta\":{\"content\":\ndata: \"Hi\"}}]}\n\n";
        assert_eq!(
            decide_any_split(&OpenAiSse::new(), stream),
            Some(stream.len())
        );
        // Joined, the lines form a role-only chunk: not output.
        assert_interim(
            b"data: {\"choices\":[{\"index\":0,\ndata: \"delta\":{\"role\":\"assistant\"}}]}\n\n",
        );
    }

    #[test]
    fn only_one_space_after_the_colon_is_dropped() {
        // The value is ` [DONE]`, still `[DONE]` once trimmed.
        assert_ends_waiting(b"data:  [DONE]\n\n");
    }

    #[test]
    fn a_byte_order_mark_at_the_start_is_ignored() {
        let stream = b"\xEF\xBB\xBFdata: [DONE]\n\n";
        assert_eq!(
            decide_any_split(&OpenAiSse::new(), stream),
            Some(stream.len())
        );
        // Elsewhere it makes the field name unknown.
        assert_interim(b": hi\n\xEF\xBB\xBFdata: [DONE]\n\n");
    }

    #[test]
    fn an_oversized_event_ends_waiting_where_it_crosses_the_bound() {
        let detector = OpenAiSse::new().max_event_bytes(16);
        // 16 bytes of data fit; the 17th byte crosses the bound.
        let stream = b"data: 0123456789abcdef0123\n\n";
        assert_eq!(decide_any_split(&detector, stream), Some(6 + 17));
        // The `\n` that joins data lines counts too.
        let stream = b"data: 0123456789abcde\ndata: x\n\n";
        assert_eq!(
            decide_any_split(&detector, stream),
            Some(6 + 15 + 1 + 6 + 1)
        );
        let stream = b"data: 0123456789abcdef\n\n";
        assert_eq!(decide_any_split(&detector, stream), Some(6 + 16 + 1));
    }

    #[test]
    fn data_within_the_bound_is_judged_normally() {
        let detector = OpenAiSse::new().max_event_bytes(16);
        assert_eq!(
            decide_any_split(&detector, b"data: 0123456789abcde\n\n"),
            Some(23)
        );
        assert_eq!(decide_any_split(&detector, b"data: {         }\n\n"), None);
    }

    #[test]
    fn the_default_bound_is_64_kib() {
        let mut detector = OpenAiSse::default();
        let mut stream = b"data: \"".to_vec();
        stream.resize(6 + 64 * 1024, b'a');
        assert_eq!(detector.on_data(&stream), None);
        assert!(detector.parser.data.capacity() <= 64 * 1024);
        assert_eq!(detector.on_data(b"a"), Some(1));
    }

    #[test]
    fn long_comments_are_not_buffered() {
        let mut detector = OpenAiSse::new().max_event_bytes(16);
        let mut comment = b":".to_vec();
        comment.resize(1 << 20, b'x');
        assert_eq!(detector.on_data(&comment), None);
        assert_eq!(detector.on_data(b"\nid: 12345678901234567890\n\n"), None);
        assert_eq!(detector.parser.data.capacity(), 0);
    }

    #[test]
    fn a_response_of_another_content_type_ends_waiting_at_its_first_byte() {
        let mut detector = OpenAiSse::new();
        detector.on_response(&head(Some("application/json")));
        assert_eq!(detector.on_data(b""), None);
        assert_eq!(
            detector.on_data(br#"{"choices":[{"message":{"role":"assistant"}}]}"#),
            Some(1)
        );
    }

    #[test]
    fn an_event_stream_content_type_is_parsed_whatever_its_case_and_parameters() {
        for content_type in [
            Some("text/event-stream"),
            Some("Text/Event-Stream; charset=utf-8"),
            None,
        ] {
            let mut detector = OpenAiSse::new();
            detector.on_response(&head(content_type));
            let role = event(&chat_delta(r#"{"role":"assistant"}"#));
            assert_eq!(detector.on_data(&role), None, "{content_type:?}");
        }
    }

    #[test]
    fn nothing_more_is_reported_once_waiting_has_ended() {
        let mut detector = OpenAiSse::new();
        assert_eq!(detector.on_data(b"data: [DONE]\n\n"), Some(14));
        assert_eq!(detector.on_data(b"data: [DONE]\n\n"), None);
        assert_eq!(detector.parser.data.capacity(), 0);
    }

    #[test]
    fn a_configured_detector_holds_no_buffer() {
        let detector = OpenAiSse::new().max_event_bytes(1024);
        let clone = detector.clone();
        assert_eq!(clone.parser.data.capacity(), 0);
        assert_eq!(clone.max_event_bytes, 1024);
    }

    #[test]
    fn short_bytes_remember_only_that_long_contents_were_long() {
        let mut bytes = ShortBytes::<4>::default();
        bytes.push(b"da");
        bytes.push(b"ta");
        assert_eq!(bytes.as_slice(), Some(&b"data"[..]));
        bytes.push(b"x");
        assert_eq!(bytes.as_slice(), None);
        bytes.clear();
        assert_eq!(bytes.as_slice(), Some(&b""[..]));
    }
}

/// The judgement as first written, over a `serde_json::Value`: the oracle
/// the allocation-free judge is checked against.
#[cfg(test)]
mod value_oracle {
    use serde_json::{Map, Value};

    /// Whether the data of one dispatched event is output or the end of the
    /// answer, rather than interim metadata.
    pub(super) fn event_ends_waiting(data: &[u8]) -> bool {
        let data = data.trim_ascii();
        if data.is_empty() {
            return false;
        }
        if data == b"[DONE]" {
            return true;
        }
        match serde_json::from_slice::<Value>(data) {
            Ok(Value::Object(chunk)) => chunk_ends_waiting(&chunk),
            // Not recognisably metadata: the client sees it as output.
            _ => true,
        }
    }

    /// The delta members that carry generated output.
    const OUTPUT_DELTA_MEMBERS: [&str; 6] = [
        "content",
        "reasoning_content",
        "reasoning",
        "refusal",
        "tool_calls",
        "function_call",
    ];

    fn chunk_ends_waiting(chunk: &Map<String, Value>) -> bool {
        let is_error = chunk.get("error").is_some_and(carries_something)
            || chunk.get("object").and_then(Value::as_str) == Some("error");
        let choices_end_waiting = chunk
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(|choices| choices.iter().any(choice_ends_waiting));
        let response_event_ends_waiting = chunk
            .get("type")
            .and_then(Value::as_str)
            .is_some_and(|kind| response_event_ends_waiting(kind, chunk));
        is_error || choices_end_waiting || response_event_ends_waiting
    }

    fn choice_ends_waiting(choice: &Value) -> bool {
        let Some(choice) = choice.as_object() else {
            return false;
        };
        let finished = choice.get("finish_reason").is_some_and(carries_something);
        let text = choice.get("text").is_some_and(carries_something);
        let delta = choice
            .get("delta")
            .and_then(Value::as_object)
            .is_some_and(|delta| {
                OUTPUT_DELTA_MEMBERS
                    .iter()
                    .any(|member| delta.get(*member).is_some_and(carries_something))
            });
        finished || text || delta
    }

    /// An event of the Responses API (`/v1/responses`), which names its kind in
    /// `type`: output arrives in `*.delta` events, the answer ends in one of
    /// the terminal events.
    fn response_event_ends_waiting(kind: &str, event: &Map<String, Value>) -> bool {
        match kind {
            "response.completed" | "response.incomplete" | "response.failed" | "error" => true,
            _ => kind.ends_with(".delta") && event.get("delta").is_some_and(carries_something),
        }
    }

    /// Whether a member's value is more than a placeholder: not `null`, and
    /// not an empty string, array or object.
    fn carries_something(value: &Value) -> bool {
        match value {
            Value::Null => false,
            Value::String(text) => !text.is_empty(),
            Value::Array(items) => !items.is_empty(),
            Value::Object(members) => !members.is_empty(),
            Value::Bool(_) | Value::Number(_) => true,
        }
    }
}

#[cfg(test)]
mod judge_agrees_with_the_value_oracle {
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    fn json() -> impl Strategy<Value = Value> {
        let names = prop_oneof![
            Just("choices"),
            Just("delta"),
            Just("content"),
            Just("role"),
            Just("reasoning_content"),
            Just("reasoning"),
            Just("refusal"),
            Just("tool_calls"),
            Just("function_call"),
            Just("finish_reason"),
            Just("text"),
            Just("error"),
            Just("object"),
            Just("type"),
            Just("usage"),
            Just("index"),
        ];
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
                super::event_ends_waiting(&data),
                super::value_oracle::event_ends_waiting(&data),
                "{}", String::from_utf8_lossy(&data)
            );
        }

        #[test]
        fn on_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(
                super::event_ends_waiting(&data),
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
                super::event_ends_waiting(data),
                super::value_oracle::event_ends_waiting(data),
                "{}",
                String::from_utf8_lossy(data)
            );
        }
    }
}
