//! The overload answer: what a rejected request receives instead of
//! reaching the inner service. It is decided before any response header is
//! sent, so a client never sees a `200` followed by an in-stream error.
//!
//! Every OpenAI-style JSON error this workspace writes — the layer's
//! overload answers, [`OpenAiCostLayer`](super::OpenAiCostLayer)'s, the
//! sidecar's `502`, `504` and shutdown `503` — is written here, by
//! [`ErrorObject`]: one shape, one member order.

use std::fmt::{self, Write as _};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, request};

use crate::gate::{Overloaded, RejectionReason, RejectionScope};

/// Response header naming the rejection scope: `rank`, `worker` or
/// `tenant`.
pub const REJECTION_SCOPE: HeaderName = HeaderName::from_static("x-admission-rejection-scope");

/// Response header naming the rejected request's rank, on rank-scoped
/// rejections.
pub const REJECTED_RANK: HeaderName = HeaderName::from_static("x-admission-rank");

/// Response header naming why the request was rejected: `queue_full`,
/// `deadline`, `displaced`, `queue_delay`, `shutdown`, `body_reads` or
/// `tenant_limit` ([`RejectionReason::as_str`](crate::RejectionReason::as_str)).
pub const REJECTION_REASON: HeaderName = HeaderName::from_static("x-admission-rejection-reason");

/// Response header naming who wrote an error answer that a sidecar (the
/// `proxy` feature) passed on: `engine` for the engine's own (its `503`
/// while loading, a `429`), `proxy` for the sidecar's `502`, `504` and
/// shutdown `503`. The gate's own overload answers carry
/// [`REJECTION_SCOPE`] instead.
pub const ORIGIN: HeaderName = HeaderName::from_static("x-admission-origin");

/// gRPC `DEADLINE_EXCEEDED`: the answer when the client's own deadline
/// passed in the queue.
const GRPC_DEADLINE_EXCEEDED: u16 = 4;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The reason phrase HTTP/1 clients see with status 529.
#[cfg(feature = "hyper")]
const SITE_IS_OVERLOADED: &[u8] = b"Site is overloaded";

/// How long a frontend should stop routing to a worker that rejected a
/// request with worker scope, by default.
const WORKER_BACKOFF_SECONDS: u32 = 1;

/// Builds the whole overload response, for [`AdmissionLayer::overload_response`](super::AdmissionLayer::overload_response).
pub(crate) type BuildResponse =
    Arc<dyn Fn(&Overloaded, &request::Parts) -> Response<Bytes> + Send + Sync + 'static>;

/// How rejections are answered; part of the layer's configuration.
#[derive(Clone)]
pub(crate) struct OverloadResponder {
    pub(crate) status: StatusCode,
    /// The status of tenant-scoped answers (429 by default).
    pub(crate) tenant_status: StatusCode,
    pub(crate) grpc_code: u16,
    /// `Retry-After` (gRPC: `grpc-retry-pushback-ms`) on worker-scoped
    /// rejections, in seconds, unless the gate estimated one
    /// ([`Overloaded::retry_after`]); `None` sends none.
    pub(crate) retry_after: Option<u32>,
    /// The user's own answer, replacing everything above.
    pub(crate) build: Option<BuildResponse>,
}

impl fmt::Debug for OverloadResponder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverloadResponder")
            .field("status", &self.status)
            .field("tenant_status", &self.tenant_status)
            .field("grpc_code", &self.grpc_code)
            .field("retry_after", &self.retry_after)
            .field("custom", &self.build.is_some())
            .finish()
    }
}

/// `529 Site is overloaded`: not registered with IANA, but what LLM API
/// clients (Anthropic's, OpenAI-compatible retry loops) already treat as
/// "overloaded, retry later", unlike a 503 that load balancers may read as
/// "this backend is broken".
pub(crate) const SITE_OVERLOADED: u16 = 529;

/// gRPC `UNAVAILABLE`: retryable, and what gRPC clients and proxies expect
/// from a server that sheds load.
pub(crate) const GRPC_UNAVAILABLE: u16 = 14;

impl Default for OverloadResponder {
    fn default() -> Self {
        OverloadResponder {
            status: StatusCode::from_u16(SITE_OVERLOADED).expect("529 is a valid status code"),
            tenant_status: StatusCode::TOO_MANY_REQUESTS,
            grpc_code: GRPC_UNAVAILABLE,
            retry_after: Some(WORKER_BACKOFF_SECONDS),
            build: None,
        }
    }
}

impl OverloadResponder {
    /// The status of the HTTP answer to `overloaded`: the layer's overload
    /// status, except for a shutdown, which is not an overload but a
    /// worker going away: `503`, which load balancers and clients already
    /// read as "try another".
    fn status_for(&self, overloaded: &Overloaded) -> StatusCode {
        match (overloaded.reason(), overloaded.scope()) {
            (RejectionReason::Shutdown, _) => StatusCode::SERVICE_UNAVAILABLE,
            (_, RejectionScope::Tenant) => self.tenant_status,
            _ => self.status,
        }
    }

    /// The answer to the rejected request whose head is `request`.
    pub(crate) fn respond(
        &self,
        overloaded: Overloaded,
        request: &request::Parts,
    ) -> Response<Bytes> {
        if let Some(build) = &self.build {
            return build(&overloaded, request);
        }
        // The gate's estimate, when it made one, replaces the fixed value;
        // a layer that sends none sends none.
        let retry_after = self
            .retry_after
            .map(|fixed| overloaded.retry_after().map_or(fixed, whole_seconds));
        match Protocol::of(&request.headers) {
            Protocol::Http => http_answer(overloaded, self.status_for(&overloaded), retry_after),
            Protocol::Grpc(content_type) => {
                grpc_answer(overloaded, self.grpc_code, retry_after, content_type)
            }
        }
    }
}

/// Which protocol a rejected request must be answered in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Protocol {
    Http,
    /// gRPC or gRPC-Web, with the content type to answer with.
    Grpc(HeaderValue),
}

impl Protocol {
    /// gRPC (and gRPC-Web) requests carry `application/grpc…`; a gRPC client
    /// reads anything but a `200` with a `grpc-status` as `UNKNOWN`. A
    /// gRPC-Web client (`application/grpc-web…`) gets its own content type
    /// back: it may read the body only in the encoding it asked for.
    pub(crate) fn of(headers: &HeaderMap) -> Protocol {
        const GRPC: &[u8] = b"application/grpc";
        const WEB: &[u8] = b"application/grpc-web";
        let Some(value) = headers.get(CONTENT_TYPE) else {
            return Protocol::Http;
        };
        let starts = |prefix: &[u8]| {
            value.len() >= prefix.len()
                && value.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix)
        };
        if starts(WEB) {
            Protocol::Grpc(value.clone())
        } else if starts(GRPC) {
            Protocol::Grpc(HeaderValue::from_static("application/grpc"))
        } else {
            Protocol::Http
        }
    }
}

/// The rejection-scope and reason headers shared by both answers.
fn scope_headers(headers: &mut HeaderMap, overloaded: &Overloaded) {
    let scope = overloaded.scope();
    headers.insert(REJECTION_SCOPE, HeaderValue::from_static(scope.as_str()));
    headers.insert(
        REJECTION_REASON,
        HeaderValue::from_static(overloaded.reason().as_str()),
    );
    if let RejectionScope::Rank(rank) = scope {
        headers.insert(REJECTED_RANK, HeaderValue::from(rank));
    }
}

/// The `code` member of an error object: the status, or a name.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Code<'a> {
    Number(u16),
    Name(&'a str),
}

/// The OpenAI error object (`message`, `type`, `param`, `code`) and, for
/// an overload answer, the rejection's `scope`, `rank` and `reason` as
/// extra members, in that order, inside `{"error": …}`. Serialised field
/// by field, so the order is the documented one whatever features
/// `serde_json` is built with (`preserve_order` or not).
pub(crate) struct ErrorObject<'a> {
    pub(crate) message: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) code: Code<'a>,
    pub(crate) overloaded: Option<&'a Overloaded>,
}

impl ErrorObject<'_> {
    /// The whole answer: `status`, `content-type: application/json`, this
    /// object as the body.
    pub(crate) fn respond(&self, status: StatusCode) -> Response<Bytes> {
        let json =
            serde_json::to_vec(&Wrapped(self)).expect("strings and numbers always serialise");
        let mut response = Response::new(Bytes::from(json));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}

/// `{"error": object}`.
struct Wrapped<'a>(&'a ErrorObject<'a>);

impl serde::Serialize for Wrapped<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut body = serializer.serialize_struct("ErrorBody", 1)?;
        body.serialize_field("error", self.0)?;
        body.end()
    }
}

impl serde::Serialize for ErrorObject<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let members = if self.overloaded.is_some() { 7 } else { 4 };
        let mut error = serializer.serialize_struct("ErrorObject", members)?;
        error.serialize_field("message", self.message)?;
        error.serialize_field("type", self.kind)?;
        error.serialize_field("param", &())?;
        match self.code {
            Code::Number(code) => error.serialize_field("code", &code)?,
            Code::Name(code) => error.serialize_field("code", code)?,
        }
        if let Some(overloaded) = self.overloaded {
            let scope = overloaded.scope();
            let rank = match scope {
                RejectionScope::Rank(rank) => Some(rank),
                RejectionScope::Worker | RejectionScope::Tenant => None,
            };
            error.serialize_field("scope", scope.as_str())?;
            error.serialize_field("rank", &rank)?;
            error.serialize_field("reason", overloaded.reason().as_str())?;
        }
        error.end()
    }
}

/// An OpenAI-style JSON error answer that is not an overload: `status`,
/// `content-type: application/json` and the body
/// `{"error":{"message":…,"type":…,"param":null,"code":<status>}}` (what
/// the sidecar answers when the engine is unreachable or too slow).
///
/// ```
/// use http::StatusCode;
/// use tower_admission::http::error_response;
///
/// let response = error_response(StatusCode::BAD_GATEWAY, "upstream_unreachable", "no engine");
/// assert_eq!(
///     response.body().as_ref(),
///     br#"{"error":{"message":"no engine","type":"upstream_unreachable","param":null,"code":502}}"#
/// );
/// ```
pub fn error_response(status: StatusCode, kind: &str, message: &str) -> Response<Bytes> {
    ErrorObject {
        message,
        kind,
        code: Code::Number(status.as_u16()),
        overloaded: None,
    }
    .respond(status)
}

/// The overload answer to `overloaded` over HTTP with `status`, for a
/// rejection made in front of the gate (the
/// [`OpenAiCostLayer`](super::OpenAiCostLayer)'s, the sidecar's): the
/// layer's OpenAI-style body with the scope, the rank and the reason, their
/// headers, and `Retry-After` the gate's estimate, else 1 s. Count the
/// rejection with [`Gate::reject`](crate::Gate::reject), which gives the
/// `overloaded` to answer.
///
/// ```
/// use http::StatusCode;
/// use tower_admission::http::{REJECTION_REASON, overload_response};
/// use tower_admission::{AdmissionConfig, Gate, RejectionReason};
///
/// let gate = Gate::new(AdmissionConfig::new());
/// let overloaded = gate.reject(RejectionReason::BodyReads);
/// let response = overload_response(&overloaded, StatusCode::SERVICE_UNAVAILABLE);
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()[REJECTION_REASON], "body_reads");
/// assert_eq!(response.headers()["retry-after"], "1");
/// ```
pub fn overload_response(overloaded: &Overloaded, status: StatusCode) -> Response<Bytes> {
    let retry_after = overloaded
        .retry_after()
        .map_or(WORKER_BACKOFF_SECONDS, whole_seconds);
    http_answer(*overloaded, status, Some(retry_after))
}

/// A `Retry-After` in whole seconds.
fn whole_seconds(after: std::time::Duration) -> u32 {
    u32::try_from(after.as_secs()).unwrap_or(u32::MAX)
}

/// `{"error":{"message":…,"type":"overloaded","param":null,"code":529,"scope":"rank","rank":3,"reason":"queue_full"}}`.
fn http_answer(
    overloaded: Overloaded,
    status: StatusCode,
    retry_after: Option<u32>,
) -> Response<Bytes> {
    let scope = overloaded.scope();
    let message = overloaded.to_string();
    let mut response = ErrorObject {
        message: &message,
        kind: "overloaded",
        code: Code::Number(status.as_u16()),
        overloaded: Some(&overloaded),
    }
    .respond(status);
    let headers = response.headers_mut();
    scope_headers(headers, &overloaded);
    if let (RejectionScope::Worker | RejectionScope::Tenant, Some(seconds)) = (scope, retry_after) {
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    #[cfg(feature = "hyper")]
    if status.as_u16() == SITE_OVERLOADED {
        // hyper writes this instead of the (absent) canonical reason on
        // HTTP/1; HTTP/2 has no reason phrase.
        response
            .extensions_mut()
            .insert(hyper::ext::ReasonPhrase::from_static(SITE_IS_OVERLOADED));
    }
    response
}

/// A trailers-only gRPC response: `200`, every status field in the headers,
/// an empty body.
fn grpc_answer(
    overloaded: Overloaded,
    code: u16,
    retry_after: Option<u32>,
    content_type: HeaderValue,
) -> Response<Bytes> {
    let scope = overloaded.scope();
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, content_type);
    let code = if overloaded.client_deadline_passed() {
        GRPC_DEADLINE_EXCEEDED
    } else {
        code
    };
    headers.insert(GRPC_STATUS, HeaderValue::from(code));
    let message = percent_encode_grpc_message(&overloaded.to_string());
    if let Ok(message) = HeaderValue::from_str(&message) {
        headers.insert(GRPC_MESSAGE, message);
    }
    scope_headers(headers, &overloaded);
    if let (RejectionScope::Worker | RejectionScope::Tenant, Some(seconds)) = (scope, retry_after) {
        headers.insert(
            GRPC_RETRY_PUSHBACK_MS,
            HeaderValue::from(u64::from(seconds) * 1000),
        );
    }
    response
}

/// Percent-encodes a `grpc-message` as the gRPC HTTP/2 protocol asks: every
/// byte outside printable ASCII, and `%` itself, becomes `%XX`.
fn percent_encode_grpc_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &byte in message.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_escape_percent_and_non_ascii() {
        assert_eq!(
            percent_encode_grpc_message("50% full: ü\n"),
            "50%25 full: %C3%BC%0A"
        );
    }

    #[test]
    fn only_grpc_content_types_get_grpc_answers() {
        let with = |content_type: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, content_type.parse().unwrap());
            Protocol::of(&headers)
        };
        let grpc =
            |content_type: &'static str| Protocol::Grpc(HeaderValue::from_static(content_type));
        assert_eq!(with("application/grpc"), grpc("application/grpc"));
        assert_eq!(with("application/grpc+proto"), grpc("application/grpc"));
        assert_eq!(with("Application/GRPC-web"), grpc("Application/GRPC-web"));
        assert_eq!(
            with("application/grpc-web-text+proto"),
            grpc("application/grpc-web-text+proto")
        );
        assert_eq!(with("application/json"), Protocol::Http);
        assert_eq!(with("application/grp"), Protocol::Http);
        assert_eq!(Protocol::of(&HeaderMap::new()), Protocol::Http);
    }
}
