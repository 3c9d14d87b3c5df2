//! What a request will cost, known before it is admitted: the seam between
//! whatever knows a request's tokens and the gate's token budgets.
//!
//! [`Admission`](super::Admission) reads a [`Cost`] from the request's
//! extensions; a request without one counts 0 tokens. Three ways to put it
//! there, all layers that go **outside** (before) the admission layer:
//!
//! * [`CostLayer`] with a closure, or with [`CostHeader`] for a cost a
//!   trusted router already computed and sent in headers;
//! * [`OpenAiCostLayer`], which reads an OpenAI request body (bounded),
//!   estimates its prompt tokens and reads `max_tokens` /
//!   `max_completion_tokens`, then hands the body on unchanged;
//! * any middleware of your own that inserts a `Cost` extension.
//!
//! ```
//! use axum::{Router, routing::post};
//! use tower_admission::http::OpenAiCostLayer;
//! use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};
//!
//! let gate = Gate::new(AdmissionConfig::new().engine_waiting_token_limit(1_800));
//! let app: Router = Router::new()
//!     .route("/v1/chat/completions", post(|| async { "…" }))
//!     .route_layer(AdmissionLayer::new(gate))
//!     // Added last, so it runs first: the cost is known before admission.
//!     .route_layer(OpenAiCostLayer::new());
//! # let _ = app;
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use serde_json::Value;
use tower_layer::Layer;
use tower_service::Service;

use super::estimate::{CountTokens, estimate};
use super::extension::{SetExtension, SetExtensionLayer, SetsCost};
use super::reader::request_reader;
use crate::gate::Cost;
use crate::headers::single_value;

request_reader! {
    /// Reads the cost of a request, if it can tell.
    pub trait CostExtractor<B> {
        /// The request's cost; `None` leaves it unknown (0 tokens).
        fn cost(&self, req: &Request<B>) -> Option<Cost>;
    }
}

/// A cost sent by a trusted router in request headers: prompt tokens in
/// one header, optionally the maximum output tokens in another. A missing
/// or malformed prompt header leaves the cost unknown; a malformed output
/// header leaves the output unknown. Take it from your router, never from
/// end users: a client could claim any size.
#[derive(Debug, Clone)]
pub struct CostHeader {
    prompt_tokens: HeaderName,
    max_output_tokens: Option<HeaderName>,
}

impl CostHeader {
    /// Prompt tokens from header `name`.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn new(name: &str) -> Self {
        CostHeader {
            prompt_tokens: HeaderName::from_bytes(name.as_bytes())
                .unwrap_or_else(|_| panic!("invalid cost header name: {name:?}")),
            max_output_tokens: None,
        }
    }

    /// Maximum output tokens from header `name` too.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn max_output_tokens(mut self, name: &str) -> Self {
        self.max_output_tokens = Some(
            HeaderName::from_bytes(name.as_bytes())
                .unwrap_or_else(|_| panic!("invalid cost header name: {name:?}")),
        );
        self
    }
}

fn header_number<B>(req: &Request<B>, name: &HeaderName) -> Option<usize> {
    single_value(req.headers(), name)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl<B> CostExtractor<B> for CostHeader {
    fn cost(&self, req: &Request<B>) -> Option<Cost> {
        let prompt = header_number(req, &self.prompt_tokens)?;
        let output = self
            .max_output_tokens
            .as_ref()
            .and_then(|name| header_number(req, name));
        Some(Cost::new(prompt, output))
    }
}

/// Sets each request's [`Cost`] extension with a [`CostExtractor`]; goes
/// outside (before) the admission layer. What the extractor cannot tell
/// leaves the extension as it was. `CostLayer::new(extractor)`.
pub type CostLayer<E> = SetExtensionLayer<E, SetsCost>;

/// The service of [`CostLayer`].
pub type SetCost<S, E> = SetExtension<S, E, SetsCost>;

/// Counts the tokens of a prompt text.
#[derive(Clone)]
struct Tokenizer(Arc<CountTokens>);

/// `"custom"`: a closure has nothing else to show.
impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt("custom", f)
    }
}

/// The default body bound of [`OpenAiCostLayer`]: 4 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// The default bound on concurrent body reads of one [`OpenAiCostLayer`]
/// (and all its clones): 64.
pub const DEFAULT_MAX_CONCURRENT_READS: usize = 64;

/// The default time a body has to arrive whole: 30 seconds.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads an OpenAI request body before admission and sets the request's
/// [`Cost`]: prompt tokens estimated from the prompt text (`messages[].content`
/// of a chat completion, `prompt` of a completion, `input` and
/// `instructions` of a response), by a tokenizer function you supply or
/// bytes / 4; maximum output tokens from `max_completion_tokens`,
/// `max_tokens` or `max_output_tokens`. The body is handed on unchanged.
///
/// What is counted:
///
/// * text: strings, arrays of strings (each string's estimate, joined by
///   newlines for the tokenizer), and content parts or input items
///   (`{"type":"text","text":…}`, `{"role":…,"content":…}`);
/// * token IDs: each number in a prompt array is one token, so
///   `"prompt": [1, 2, 3]` counts 3 and a list of lists counts the sum
///   (added to the text estimate, never passed to the tokenizer);
/// * **nothing else**: images, audio, files, tool definitions and tool
///   calls, `response_format` schemas and every other part the estimator
///   cannot see count 0 tokens. A trusted router that knows better can set
///   the [`Cost`] itself ([`CostLayer`]).
///
/// Before admission, in this order:
///
/// * At most [`max_concurrent_reads`](Self::max_concurrent_reads) bodies
///   (64 unless set) are read at once, counted across every clone of the
///   layer (clones share the count). A request beyond that is answered at
///   once, never left waiting unseen, with the gate's worker-scoped
///   overload answer: `529` (or the
///   [`overload_status`](Self::overload_status) you set, as on the
///   admission layer), `x-admission-rejection-scope: worker`,
///   `x-admission-rejection-reason: body_reads`, `retry-after: 1` and an
///   OpenAI-style JSON body (`"type": "overloaded"`, `"code": 529`,
///   `"reason": "body_reads"`).
/// * A body larger than the bound (4 MiB unless set) is answered `413`
///   with an OpenAI-style JSON error: it costs the gate nothing. A
///   `content-length` above the bound is answered without reading the body.
/// * A body that has not arrived whole within the
///   [`read_timeout`](Self::read_timeout) (30 s unless set) is answered
///   `408` with an OpenAI-style JSON error. The timer is tokio's: the
///   server must run on a tokio runtime with its time driver enabled (as
///   axum and hyper servers do).
/// * A body that is not JSON, or not an object, passes through with no
///   cost, for the handler to reject as it would have anyway.
/// * The estimate scans the JSON once and keeps only the prompt's strings
///   (borrowed from the body) and the output-token fields: every other
///   member (tools, images, schemas) is skipped without being built, so an
///   estimate costs one slice per prompt string, not a parsed document.
/// * A body that fails while being read is answered `400`.
/// * With a [`max_model_len`](Self::max_model_len), a prompt whose estimate
///   alone exceeds it is answered `400` (`invalid_request_error`, code
///   400, naming the estimate and the limit), as engines answer it.
#[derive(Clone, Debug)]
pub struct OpenAiCostLayer {
    max_body_bytes: usize,
    tokenizer: Option<Tokenizer>,
    max_model_len: Option<usize>,
    max_concurrent_reads: usize,
    read_timeout: Duration,
    overload_status: StatusCode,
    /// Bodies being read now, by this layer and all its clones.
    reading: Arc<AtomicUsize>,
}

impl Default for OpenAiCostLayer {
    fn default() -> Self {
        OpenAiCostLayer {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            tokenizer: None,
            max_model_len: None,
            max_concurrent_reads: DEFAULT_MAX_CONCURRENT_READS,
            read_timeout: DEFAULT_READ_TIMEOUT,
            overload_status: StatusCode::from_u16(super::reject::SITE_OVERLOADED)
                .expect("529 is a valid status code"),
            reading: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl OpenAiCostLayer {
    /// Bytes / 4 as the token estimate, a 4 MiB body bound, at most 64
    /// bodies read at once, 30 s for a body to arrive, no context limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// The largest body read; a larger one is answered `413`.
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// Counts prompt tokens with `tokenizer` (called once per request, on
    /// the prompt texts joined by newlines) instead of bytes / 4.
    pub fn tokenizer(mut self, tokenizer: impl Fn(&str) -> usize + Send + Sync + 'static) -> Self {
        self.tokenizer = Some(Tokenizer(Arc::new(tokenizer)));
        self
    }

    /// The engine's context length in tokens (vLLM's `--max-model-len`).
    /// A request's output tokens count as `min(max_tokens, tokens - prompt)`
    /// (saturating), so a client's `"max_tokens": 1e12` costs no more than
    /// the context it can fill; a request without a maximum keeps an
    /// unknown output (0 tokens). A request whose estimated prompt alone
    /// exceeds `tokens` is answered `400` before admission. An oversized
    /// request therefore costs at most `tokens` engine tokens, and one
    /// larger than a token limit still runs alone (SPEC §7). Default: no
    /// limit, the client's `max_tokens` taken as sent.
    pub fn max_model_len(mut self, tokens: usize) -> Self {
        self.max_model_len = Some(tokens);
        self
    }

    /// How many bodies this layer and its clones read at once; a request
    /// beyond that is answered `529` (reason `body_reads`) at once.
    /// Default [`DEFAULT_MAX_CONCURRENT_READS`].
    ///
    /// # Panics
    ///
    /// On `0`, which would answer every request overloaded.
    pub fn max_concurrent_reads(mut self, reads: usize) -> Self {
        assert!(
            reads > 0,
            "OpenAiCostLayer::max_concurrent_reads: 0 would answer every request overloaded; \
             give at least 1"
        );
        self.max_concurrent_reads = reads;
        self
    }

    /// How long a body has to arrive whole; a slower one is answered `408`.
    /// Default [`DEFAULT_READ_TIMEOUT`].
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout = timeout;
        self
    }

    /// The status of the overload answer to a request beyond the
    /// concurrent body reads: give it the admission layer's
    /// [`overload_status`](crate::AdmissionLayer::overload_status) so that
    /// clients see one overload status. Default `529`; the JSON body's
    /// `code` follows it.
    pub fn overload_status(mut self, status: StatusCode) -> Self {
        self.overload_status = status;
        self
    }
}

/// One body read in progress; the count goes down when it is dropped.
struct ReadSlot(Arc<AtomicUsize>);

impl ReadSlot {
    fn take(reading: &Arc<AtomicUsize>, limit: usize) -> Option<ReadSlot> {
        reading
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (now < limit).then_some(now + 1)
            })
            .ok()
            .map(|_| ReadSlot(Arc::clone(reading)))
    }
}

impl Drop for ReadSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<S> Layer<S> for OpenAiCostLayer {
    type Service = OpenAiCost<S>;

    fn layer(&self, inner: S) -> Self::Service {
        OpenAiCost {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`OpenAiCostLayer`].
#[derive(Clone, Debug)]
pub struct OpenAiCost<S> {
    inner: S,
    layer: OpenAiCostLayer,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B, ResBody> Service<Request<B>> for OpenAiCost<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    B: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<CostBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The ready service goes with the request; `self` keeps a clone.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let layer = self.layer.clone();
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let declared = parts
                .headers
                .get(CONTENT_LENGTH)
                .and_then(|value| value.to_str().ok()?.trim().parse::<u64>().ok());
            if declared.is_some_and(|length| length > layer.max_body_bytes as u64) {
                return Ok(error_response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &too_large_message(layer.max_body_bytes),
                    Value::from("request_too_large"),
                ));
            }
            let Some(slot) = ReadSlot::take(&layer.reading, layer.max_concurrent_reads) else {
                return Ok(overloaded_response(layer.overload_status));
            };
            let read =
                tokio::time::timeout(layer.read_timeout, read_bounded(body, layer.max_body_bytes))
                    .await;
            drop(slot);
            let bytes = match read {
                Ok(Ok(bytes)) => bytes,
                Err(_elapsed) => {
                    let message = format!(
                        "the request body did not arrive within {} ms",
                        layer.read_timeout.as_millis()
                    );
                    return Ok(error_response(
                        StatusCode::REQUEST_TIMEOUT,
                        &message,
                        Value::from(408),
                    ));
                }
                Ok(Err(ReadError::TooLarge)) => {
                    return Ok(error_response(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        &too_large_message(layer.max_body_bytes),
                        Value::from("request_too_large"),
                    ));
                }
                Ok(Err(ReadError::Body(error))) => {
                    let message = format!("could not read the request body: {error}");
                    return Ok(error_response(
                        StatusCode::BAD_REQUEST,
                        &message,
                        Value::from("invalid_body"),
                    ));
                }
            };
            if let Some(mut cost) = estimate(
                &bytes,
                layer.tokenizer.as_ref().map(|tokenizer| &*tokenizer.0),
            ) {
                if let Some(limit) = layer.max_model_len {
                    if cost.prompt_tokens > limit {
                        let message = format!(
                            "This model's maximum context length is {limit} tokens. However, \
                             your request has an estimated {} input tokens. Please reduce the \
                             length of the input.",
                            cost.prompt_tokens
                        );
                        return Ok(error_response(
                            StatusCode::BAD_REQUEST,
                            &message,
                            Value::from(400),
                        ));
                    }
                    let room = limit.saturating_sub(cost.prompt_tokens);
                    cost = Cost::new(
                        cost.prompt_tokens,
                        cost.max_output_tokens.map(|asked| asked.min(room)),
                    );
                }
                parts.extensions.insert(cost);
            }
            let req = Request::from_parts(parts, B::from(bytes));
            let response = inner.call(req).await?;
            Ok(response.map(CostBody::inner))
        })
    }
}

fn too_large_message(bound: usize) -> String {
    format!("the request body is larger than the server accepts ({bound} bytes)")
}

enum ReadError {
    TooLarge,
    Body(BoxError),
}

/// Reads a body whole, refusing more than `bound` bytes.
async fn read_bounded<B>(body: B, bound: usize) -> Result<Bytes, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut collected = BytesMut::new();
    let mut first: Option<Bytes> = None;
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|error| ReadError::Body(error.into()))?;
        let Ok(mut data) = frame.into_data() else {
            continue; // trailers carry no prompt
        };
        let so_far = first.as_ref().map_or(0, Bytes::len) + collected.len();
        if so_far + data.remaining() > bound {
            return Err(ReadError::TooLarge);
        }
        // One frame (the common case) is passed on without a copy.
        match first.take() {
            None if collected.is_empty() => first = Some(data.copy_to_bytes(data.remaining())),
            earlier => {
                if let Some(earlier) = earlier {
                    collected.extend_from_slice(&earlier);
                }
                collected.extend_from_slice(&data);
            }
        }
    }
    Ok(match first {
        Some(only) => only,
        None => collected.freeze(),
    })
}

/// An OpenAI-style error response.
fn error_response<B>(status: StatusCode, message: &str, code: Value) -> Response<CostBody<B>> {
    let json = serde_json::json!({
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": null,
            "code": code,
        }
    });
    let mut response = Response::new(CostBody::answer(Bytes::from(json.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The gate's worker-scoped overload answer, for a request beyond the
/// concurrent body reads: the same status, headers and JSON members.
fn overloaded_response<B>(status: StatusCode) -> Response<CostBody<B>> {
    let json = serde_json::json!({
        "error": {
            "message": "overloaded: too many request bodies are being read at once",
            "type": "overloaded",
            "param": null,
            "code": status.as_u16(),
            "scope": "worker",
            "rank": null,
            "reason": "body_reads",
        }
    });
    let mut response = Response::new(CostBody::answer(Bytes::from(json.to_string())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(super::REJECTION_SCOPE, HeaderValue::from_static("worker"));
    headers.insert(
        super::REJECTION_REASON,
        HeaderValue::from_static("body_reads"),
    );
    headers.insert(RETRY_AFTER, HeaderValue::from(1u32));
    #[cfg(feature = "hyper")]
    if status.as_u16() == super::reject::SITE_OVERLOADED {
        response
            .extensions_mut()
            .insert(hyper::ext::ReasonPhrase::from_static(b"Site is overloaded"));
    }
    response
}

pin_project! {
    /// The response body of [`OpenAiCost`]: the inner service's, or the
    /// layer's own error answer.
    pub struct CostBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProjection]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
        },
        // The layer's `413` or `400` answer; `None` once sent.
        Answer {
            body: Option<Bytes>,
        },
    }
}

impl<B> CostBody<B> {
    fn inner(body: B) -> Self {
        CostBody {
            kind: Kind::Inner { body },
        }
    }

    fn answer(body: Bytes) -> Self {
        CostBody {
            kind: Kind::Answer { body: Some(body) },
        }
    }
}

impl<B> Body for CostBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProjection::Inner { body } => body.poll_frame(cx),
            KindProjection::Answer { body } => Poll::Ready(body.take().map(Frame::data).map(Ok)),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Answer { body } => body.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Answer { body } => {
                SizeHint::with_exact(body.as_ref().map_or(0, |body| body.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trusted_header_gives_the_cost_and_ambiguity_gives_none() {
        let header = CostHeader::new("x-prompt-tokens").max_output_tokens("x-max-tokens");
        let req = Request::builder()
            .header("x-prompt-tokens", " 800 ")
            .header("x-max-tokens", "64")
            .body(())
            .unwrap();
        assert_eq!(header.cost(&req), Some(Cost::new(800, Some(64))));
        let twice = Request::builder()
            .header("x-prompt-tokens", "1")
            .header("x-prompt-tokens", "2")
            .body(())
            .unwrap();
        assert_eq!(header.cost(&twice), None);
        let bad_output = Request::builder()
            .header("x-prompt-tokens", "5")
            .header("x-max-tokens", "lots")
            .body(())
            .unwrap();
        assert_eq!(header.cost(&bad_output), Some(Cost::prompt(5)));
    }
}
