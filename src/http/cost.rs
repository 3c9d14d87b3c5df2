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
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use serde_json::Value;
use tower_layer::Layer;
use tower_service::Service;

use crate::gate::Cost;
use crate::headers::single_value;

/// Reads the cost of a request, if it can tell.
pub trait CostExtractor<B> {
    /// The request's cost; `None` leaves it unknown (0 tokens).
    fn cost(&self, req: &Request<B>) -> Option<Cost>;
}

impl<B, F> CostExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<Cost>,
{
    fn cost(&self, req: &Request<B>) -> Option<Cost> {
        self(req)
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

/// Sets each request's [`Cost`] extension with a [`CostExtractor`].
#[derive(Debug, Clone)]
pub struct CostLayer<E> {
    extractor: E,
}

impl<E> CostLayer<E> {
    /// A layer that asks `extractor` for each request's cost.
    pub fn new(extractor: E) -> Self {
        CostLayer { extractor }
    }
}

impl<S, E: Clone> Layer<S> for CostLayer<E> {
    type Service = SetCost<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        SetCost {
            inner,
            extractor: self.extractor.clone(),
        }
    }
}

/// The service of [`CostLayer`].
#[derive(Debug, Clone)]
pub struct SetCost<S, E> {
    inner: S,
    extractor: E,
}

impl<S, E, B> Service<Request<B>> for SetCost<S, E>
where
    S: Service<Request<B>>,
    E: CostExtractor<B>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Some(cost) = self.extractor.cost(&req) {
            req.extensions_mut().insert(cost);
        }
        self.inner.call(req)
    }
}

/// Counts the tokens of a prompt text.
type Tokenizer = Arc<dyn Fn(&str) -> usize + Send + Sync>;

/// The default body bound of [`OpenAiCostLayer`]: 4 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// Reads an OpenAI request body before admission and sets the request's
/// [`Cost`]: prompt tokens estimated from the prompt text (`messages[].content`
/// of a chat completion, `prompt` of a completion, `input` and
/// `instructions` of a response), by a tokenizer function you supply or
/// bytes / 4; maximum output tokens from `max_completion_tokens`,
/// `max_tokens` or `max_output_tokens`. The body is handed on unchanged.
///
/// * A body larger than the bound (4 MiB unless set) is answered `413`
///   with an OpenAI-style JSON error before admission: it costs the gate
///   nothing. A `content-length` above the bound is answered without
///   reading the body.
/// * A body that is not JSON, or not an object, passes through with no
///   cost, for the handler to reject as it would have anyway.
/// * A body that fails while being read is answered `400`.
#[derive(Clone)]
pub struct OpenAiCostLayer {
    max_body_bytes: usize,
    tokenizer: Option<Tokenizer>,
}

impl std::fmt::Debug for OpenAiCostLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiCostLayer")
            .field("max_body_bytes", &self.max_body_bytes)
            .field("tokenizer", &self.tokenizer.as_ref().map(|_| "custom"))
            .finish()
    }
}

impl Default for OpenAiCostLayer {
    fn default() -> Self {
        OpenAiCostLayer {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            tokenizer: None,
        }
    }
}

impl OpenAiCostLayer {
    /// Bytes / 4 as the token estimate, a 4 MiB body bound.
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
        self.tokenizer = Some(Arc::new(tokenizer));
        self
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
                    "request_too_large",
                ));
            }
            let bytes = match read_bounded(body, layer.max_body_bytes).await {
                Ok(bytes) => bytes,
                Err(ReadError::TooLarge) => {
                    return Ok(error_response(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        &too_large_message(layer.max_body_bytes),
                        "request_too_large",
                    ));
                }
                Err(ReadError::Body(error)) => {
                    let message = format!("could not read the request body: {error}");
                    return Ok(error_response(
                        StatusCode::BAD_REQUEST,
                        &message,
                        "invalid_body",
                    ));
                }
            };
            if let Some(cost) = estimate(&bytes, layer.tokenizer.as_deref()) {
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

/// The cost an OpenAI request body declares, or `None` when it is not a
/// JSON object.
fn estimate(
    body: &[u8],
    tokenizer: Option<&(dyn Fn(&str) -> usize + Send + Sync)>,
) -> Option<Cost> {
    let Ok(Value::Object(request)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    let mut prompt = String::new();
    if let Some(messages) = request.get("messages").and_then(Value::as_array) {
        for message in messages {
            collect_text(message.get("content"), &mut prompt);
        }
    }
    for field in ["prompt", "input", "instructions"] {
        collect_text(request.get(field), &mut prompt);
    }
    let prompt_tokens = match tokenizer {
        Some(count) => count(&prompt),
        None => prompt.len().div_ceil(4),
    };
    let max_output_tokens = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
        .iter()
        .find_map(|field| request.get(*field)?.as_u64())
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    Some(Cost::new(prompt_tokens, max_output_tokens))
}

/// Appends the text of a prompt field: a string, an array of strings, or
/// an array of content parts (`{"type":"text","text":…}`) or input items
/// (`{"role":…,"content":…}`).
fn collect_text(value: Option<&Value>, out: &mut String) {
    match value {
        Some(Value::String(text)) => {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(text);
        }
        Some(Value::Array(items)) => {
            for item in items {
                match item {
                    Value::Object(part) => {
                        collect_text(part.get("text"), out);
                        collect_text(part.get("content"), out);
                    }
                    other => collect_text(Some(other), out),
                }
            }
        }
        _ => {}
    }
}

/// An OpenAI-style error response.
fn error_response<B>(status: StatusCode, message: &str, code: &str) -> Response<CostBody<B>> {
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
    fn malformed_json_has_no_cost() {
        assert_eq!(estimate(b"{\"messages\": [", None), None);
        assert_eq!(estimate(b"[1, 2]", None), None);
        assert_eq!(
            estimate(b"{\"max_tokens\": -1}", None),
            Some(Cost::new(0, None))
        );
    }

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
