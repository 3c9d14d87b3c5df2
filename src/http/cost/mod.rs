//! What a request will cost, known before it is admitted, read from its
//! body: [`OpenAiCostLayer`].
//!
//! The admission layer's describer gives each request its [`Cost`]; a
//! request without one counts 0 tokens. Three ways to give it:
//!
//! * [`OpenAiCostLayer`], a layer that goes **outside** (before) the
//!   admission layer: it reads an OpenAI request body (bounded), estimates
//!   its prompt tokens and reads `max_tokens` / `max_completion_tokens`,
//!   sets the request's [`Cost`] extension, then hands the body on
//!   unchanged. The admission layer always reads that extension. (A body
//!   is read before admission, so this one cannot be a describer.)
//! * a describer given to
//!   [`AdmissionLayer::describe`](super::AdmissionLayer::describe):
//!   [`CostHeader`](super::CostHeader) for a cost a trusted router already
//!   computed and sent in headers, or a closure that sets
//!   `descriptor.cost`;
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
use http::header::CONTENT_LENGTH;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

// The answers this layer writes, by the crate's one writer.
use super::reject::{Code, ErrorObject, overload_response};
use crate::gate::{Gate, Overloaded, RejectionReason};

use super::estimate::{CountTokens, estimate};
use crate::gate::Cost;

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
pub(crate) const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// The default bound on concurrent body reads of one [`OpenAiCostLayer`]
/// (and all its clones): 64.
pub(crate) const DEFAULT_MAX_CONCURRENT_READS: usize = 64;

/// The default time a body has to arrive whole: 30 seconds.
pub(crate) const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

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
///   cannot see count 0 tokens. A trusted router that knows better can give
///   the [`Cost`] itself, to a describer on the admission layer
///   ([`CostHeader`](super::CostHeader) or a closure), whose cost replaces
///   this layer's.
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
///   `"reason": "body_reads"`), counted in the gate's `rejection_total`
///   with `reason="body_reads"` when the layer is given the
///   [`gate`](Self::gate).
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
    /// Counts the overload answers, when given.
    gate: Option<Gate>,
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
            gate: None,
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
    /// larger than a token limit still runs alone (behaviour §7). Default: no
    /// limit, the client's `max_tokens` taken as sent.
    pub fn max_model_len(mut self, tokens: usize) -> Self {
        self.max_model_len = Some(tokens);
        self
    }

    /// How many bodies this layer and its clones read at once; a request
    /// beyond that is answered `529` (reason `body_reads`) at once.
    /// Default 64.
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
    /// Default 30 seconds.
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

    /// Counts each overload answer (reason `body_reads`) in `gate`'s
    /// tallies and `rejection_total`, like the gate's own rejections
    /// ([`Gate::reject`]): give it the gate the admission layer behind this
    /// one admits through. Without it the answers are sent but not counted.
    pub fn gate(mut self, gate: Gate) -> Self {
        self.gate = Some(gate);
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
                    Code::Name("request_too_large"),
                ));
            }
            let Some(slot) = ReadSlot::take(&layer.reading, layer.max_concurrent_reads) else {
                return Ok(overloaded_response(&layer));
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
                        Code::Number(408),
                    ));
                }
                Ok(Err(ReadError::TooLarge)) => {
                    return Ok(error_response(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        &too_large_message(layer.max_body_bytes),
                        Code::Name("request_too_large"),
                    ));
                }
                Ok(Err(ReadError::Body(error))) => {
                    let message = format!("could not read the request body: {error}");
                    return Ok(error_response(
                        StatusCode::BAD_REQUEST,
                        &message,
                        Code::Name("invalid_body"),
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
                            Code::Number(400),
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

/// An OpenAI-style error response (`invalid_request_error`).
fn error_response<B>(status: StatusCode, message: &str, code: Code<'_>) -> Response<CostBody<B>> {
    let error = ErrorObject {
        message,
        kind: "invalid_request_error",
        code,
        overloaded: None,
    };
    error.respond(status).map(CostBody::answer)
}

/// The gate's worker-scoped overload answer (reason `body_reads`), for a
/// request beyond the concurrent body reads, counted by the layer's gate.
fn overloaded_response<B>(layer: &OpenAiCostLayer) -> Response<CostBody<B>> {
    let reason = RejectionReason::BodyReads;
    let overloaded = match &layer.gate {
        Some(gate) => gate.reject(reason),
        None => Overloaded::worker(reason),
    };
    overload_response(&overloaded, layer.overload_status).map(CostBody::answer)
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
