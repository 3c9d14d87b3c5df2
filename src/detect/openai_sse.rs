//! [`OpenAiSse`]: waiting ends at the first event of an OpenAI-compatible
//! event stream that carries output.

use std::ops::Range;

use super::detector::FirstTokenDetector;
use super::media_type::{is_event_stream, media_type};
use super::openai_json::object_ends_waiting;
use super::swar;

/// Waiting ends at the first event of an LLM event stream that carries
/// generated output, or that says the answer is over: the OpenAI Chat
/// Completions, Completions and Responses APIs, Anthropic's Messages API,
/// and servers compatible with them.
///
/// The body is read as [server-sent events]: lines end with `\n`, `\r\n` or
/// `\r` (also when a `\r\n` is split between two frames), `data:` lines of
/// one event are joined with `\n`, and a blank line dispatches the event.
/// Each dispatched event's data is then judged. The detector lists what is
/// **interim metadata**; every other event ends waiting, so that a server
/// speaking a dialect it does not know ends waiting at its first event
/// rather than holding waiting capacity until the whole answer is generated.
///
/// **Interim metadata** — waiting goes on:
///
/// * `:` comments, blank keep-alives, events with empty data, and `id:`,
///   `retry:` or `event:` fields on their own;
/// * a chat or completion chunk (an object with a `choices` array and no
///   `type`) none of whose choices carries output or a `finish_reason`:
///   a delta with only a `role`, `content` that is `""` or `null`, an empty
///   `tool_calls`; a usage-only chunk (`"choices": []`);
/// * Anthropic's `message_start`, `content_block_start` and `ping` events;
/// * the Responses API's `response.created`, `response.in_progress` and
///   `response.queued`, and its `response.….added`, `….in_progress`,
///   `….searching`, `….generating` and `….interpreting` events (an output
///   item or content part announced empty, a built-in tool at work);
/// * a delta event (`content_block_delta`, or a `type` ending in `.delta`)
///   whose `delta` carries nothing: `""`, or an object whose members other
///   than `type` are all empty (Anthropic's first `input_json_delta` of a
///   tool call has `"partial_json": ""`).
///
/// **Everything else** ends waiting, for example:
///
/// * a chat delta with non-empty `content`, `reasoning_content`,
///   `reasoning`, `refusal`, `tool_calls`, or legacy `function_call`; a
///   completion choice with non-empty `text`; any `finish_reason`;
/// * `[DONE]`;
/// * an error: an `"error"` member, `"object": "error"`, `"type": "error"`,
///   or an `event: error` with data;
/// * a delta event with a payload; Anthropic's `content_block_stop`,
///   `message_delta` and `message_stop`; the Responses API's
///   `response.completed`, `response.incomplete`, `response.failed`, and
///   its `….done` events;
/// * a JSON object of any other shape, and data that is not a JSON object
///   (not JSON, not UTF-8, an array, a bare value).
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
/// let mut detector = OpenAiSse::default();
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

    /// Bounds the data buffered for one event to `bytes`; an event whose
    /// data (with the `\n` joining its lines) grows past the bound ends
    /// waiting. `0` makes every `data` line end waiting.
    pub fn max_event_bytes(mut self, bytes: usize) -> Self {
        self.max_event_bytes = bytes;
        self
    }

    /// Reads the body by the response's media type (`None`: no
    /// `content-type`), as [`on_response`](FirstTokenDetector::on_response)
    /// does; for a caller that has read it already.
    pub(super) fn read_media_type(&mut self, essence: Option<&[u8]>) {
        if self.mode == Mode::Done {
            return;
        }
        self.mode = match essence {
            Some(essence) if !is_event_stream(essence) => Mode::AnyData,
            _ => Mode::EventStream,
        };
    }

    fn finish(&mut self) {
        self.mode = Mode::Done;
        self.parser = EventParser::default();
    }
}

/// A detector with the default bound on buffered event data.
impl Default for OpenAiSse {
    fn default() -> Self {
        OpenAiSse {
            max_event_bytes: Self::DEFAULT_MAX_EVENT_BYTES,
            mode: Mode::EventStream,
            parser: EventParser::default(),
        }
    }
}

impl FirstTokenDetector for OpenAiSse {
    fn on_response(&mut self, head: &http::response::Parts) {
        self.read_media_type(media_type(head));
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
#[derive(Debug, Default)]
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

/// Cloned for every request (a configured detector holds no data): an
/// empty buffer is not copied.
impl Clone for EventParser {
    fn clone(&self) -> Self {
        EventParser {
            data: if self.data.is_empty() {
                Vec::new()
            } else {
                self.data.clone()
            },
            ..*self
        }
    }
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
    ///
    /// An event whose data is one line that begins and ends in this frame
    /// is judged where it lies in the frame, copying nothing: its data is
    /// `pending`, a range of the frame (as if followed by its `\n`), until
    /// the event is dispatched, another data line comes, or the frame ends;
    /// only then is it copied into the buffer.
    fn feed(&mut self, frame: &[u8], max_event_bytes: usize) -> Option<usize> {
        let mut pending: Option<Range<usize>> = None;
        let decided = self.feed_lines(frame, max_event_bytes, &mut pending);
        if decided.is_none() {
            self.keep(frame, &mut pending, max_event_bytes);
        }
        decided
    }

    /// Copies `pending` data of `frame`, and the `\n` after it, into the
    /// buffer.
    fn keep(&mut self, frame: &[u8], pending: &mut Option<Range<usize>>, max_event_bytes: usize) {
        if let Some(range) = pending.take() {
            self.append_data(&frame[range], max_event_bytes);
            self.append_data(b"\n", max_event_bytes);
        }
    }

    fn feed_lines(
        &mut self,
        frame: &[u8],
        max_event_bytes: usize,
        pending: &mut Option<Range<usize>>,
    ) -> Option<usize> {
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
                if self.end_line(frame, index - 1, max_event_bytes, pending) {
                    return Some(index);
                }
                continue;
            }
            match self.position {
                // Most lines are data lines: their name is taken whole.
                LinePosition::Start if frame[index..].starts_with(b"data:") => {
                    // Most events are one data line and the blank line after
                    // it, whole in one frame: judged where they lie, as the
                    // byte-wise reading below would judge them.
                    if self.data.is_empty() && pending.is_none() {
                        if let Some((value, blank)) =
                            one_line_event(&frame[index..], max_event_bytes)
                        {
                            self.past_first_line = true;
                            let error_event = std::mem::take(&mut self.error_event);
                            let dispatch = index + blank;
                            if error_event || event_ends_waiting(&frame[index..][value]) {
                                return Some(dispatch + 1);
                            }
                            self.after_cr = frame[dispatch] == b'\r';
                            index = dispatch + 1;
                            continue;
                        }
                    }
                    self.field = Field::Data;
                    self.position = LinePosition::ValueStart;
                    index += b"data:".len();
                }
                LinePosition::Start | LinePosition::Name => {
                    if byte == b':' {
                        self.field = self.field_named();
                        self.position = LinePosition::ValueStart;
                    } else {
                        self.name.push_byte(byte);
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
                    let len = line_end(rest);
                    let value = &rest[..len];
                    match self.field {
                        Field::Data => {
                            // A second data line: the first is buffered.
                            self.keep(frame, pending, max_event_bytes);
                            let room = max_event_bytes.saturating_sub(self.data.len());
                            if value.len() > room {
                                // The byte after `room` more is the one that
                                // crosses the bound.
                                return Some(index + room + 1);
                            }
                            if self.data.is_empty() && len < rest.len() {
                                // The whole line is in this frame.
                                *pending = Some(index..index + len);
                            } else {
                                self.append_data(value, max_event_bytes);
                            }
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

    /// The line that just ended at `frame[line_end]`; returns whether it
    /// ended waiting.
    fn end_line(
        &mut self,
        frame: &[u8],
        line_end: usize,
        max_event_bytes: usize,
        pending: &mut Option<Range<usize>>,
    ) -> bool {
        let position = std::mem::take(&mut self.position);
        if position == LinePosition::Start {
            return self.dispatch(frame, pending);
        }
        if position == LinePosition::Name {
            // A line without `:` is a field name with an empty value.
            self.field = self.field_named();
        }
        match std::mem::take(&mut self.field) {
            // This line's value is the `pending` data (a data line with a
            // value buffers any earlier one first; one whose value is empty
            // leaves an earlier line pending, which ended before this one):
            // it stays pending, its `\n` implied, within the bound.
            Field::Data
                if position == LinePosition::Value
                    && pending.as_ref().is_some_and(|range| {
                        range.end == line_end && range.len() < max_event_bytes
                    }) => {}
            Field::Data => {
                // Pending data counts with its implied `\n`, as it would
                // once buffered: the bound is met alike however the stream
                // was split.
                let len = pending
                    .as_ref()
                    .map_or(self.data.len(), |range| range.len() + 1);
                if len >= max_event_bytes {
                    return true;
                }
                self.keep(frame, pending, max_event_bytes);
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

    /// A blank line: dispatch the event read so far (its data `pending` in
    /// `frame`, or buffered); returns whether it ends waiting.
    fn dispatch(&mut self, frame: &[u8], pending: &mut Option<Range<usize>>) -> bool {
        self.past_first_line = true;
        let error_event = std::mem::take(&mut self.error_event);
        if let Some(range) = pending.take() {
            return error_event || event_ends_waiting(&frame[range]);
        }
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

/// An event at the start of `rest` (which starts with `data:`) that is one
/// data line, within `max_event_bytes` with its `\n`, and the blank line
/// that dispatches it: the range of its value in `rest`, and the index of
/// the blank line's line end. `None` when the frame holds less, or more
/// lines of the event.
#[inline]
fn one_line_event(rest: &[u8], max_event_bytes: usize) -> Option<(Range<usize>, usize)> {
    let mut start = b"data:".len();
    if rest.get(start) == Some(&b' ') {
        start += 1;
    }
    let end = start + line_end(rest.get(start..)?);
    if end - start >= max_event_bytes {
        return None;
    }
    // The data line's end: `\r\n`, `\r` or `\n` (none if the frame ends).
    let mut blank = end + 1;
    if rest.get(end) == Some(&b'\r') && rest.get(blank) == Some(&b'\n') {
        blank += 1;
    }
    match rest.get(blank) {
        Some(b'\r' | b'\n') => Some((start..end, blank)),
        _ => None,
    }
}

/// The index of the first `\r` or `\n` in `bytes`, or its length: eight
/// bytes at a time, since event data is most of an event stream's bytes.
fn line_end(bytes: &[u8]) -> usize {
    let mut chunks = bytes.chunks_exact(8);
    let mut start = 0;
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        // No byte below `\r` + 1 (event data rarely has a control byte):
        // neither `\r` nor `\n`, found with half the work.
        if swar::below(word, b'\r' + 1) != 0 {
            let found = swar::equal(word, b'\r') | swar::equal(word, b'\n');
            if found != 0 {
                return start + swar::first(found);
            }
        }
        start += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&byte| byte == b'\r' || byte == b'\n')
        .map_or(bytes.len(), |offset| start + offset)
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
    /// Bytes pushed so far, saturating; past `N` only `as_slice` returning
    /// `None` tells.
    len: u8,
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
        if let Some(free) = self.bytes.get_mut(usize::from(self.len)..) {
            let copied = free.len().min(more.len());
            free[..copied].copy_from_slice(&more[..copied]);
        }
        let pushed = u8::try_from(more.len()).unwrap_or(u8::MAX);
        self.len = self.len.saturating_add(pushed);
    }

    #[inline]
    fn push_byte(&mut self, byte: u8) {
        if let Some(free) = self.bytes.get_mut(usize::from(self.len)) {
            *free = byte;
        }
        self.len = self.len.saturating_add(1);
    }

    /// The contents, or `None` when they were longer than `N` bytes.
    fn as_slice(&self) -> Option<&[u8]> {
        self.bytes.get(..usize::from(self.len))
    }

    fn clear(&mut self) {
        self.len = 0;
    }
}

#[cfg(test)]
mod tests;
