//! The overload answer (SPEC §4): what a rejected request receives instead of
//! reaching the inner service. It is decided before any response header is
//! sent, so a client never sees a `200` followed by an in-stream error.

use std::fmt::Write as _;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};

use crate::{Overloaded, RejectionScope};

/// Response header naming the rejection scope: `rank` or `worker`.
pub const REJECTION_SCOPE: HeaderName = HeaderName::from_static("x-admission-rejection-scope");

/// Response header naming the rejected request's rank, on rank-scoped
/// rejections.
pub const REJECTED_RANK: HeaderName = HeaderName::from_static("x-admission-rank");

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The reason phrase HTTP/1 clients see with status 529.
#[cfg(feature = "hyper")]
const SITE_IS_OVERLOADED: &[u8] = b"Site is overloaded";

/// How long a frontend should stop routing to a worker that rejected a
/// request with worker scope.
const WORKER_BACKOFF_SECONDS: u64 = 1;

/// How rejections are answered; part of the layer's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OverloadAnswer {
    pub(crate) status: StatusCode,
    pub(crate) grpc_code: u16,
}

/// `529 Site is overloaded`: not registered with IANA, but what LLM API
/// clients (Anthropic's, OpenAI-compatible retry loops) already treat as
/// "overloaded, retry later", unlike a 503 that load balancers may read as
/// "this backend is broken".
pub(crate) const SITE_OVERLOADED: u16 = 529;

/// gRPC `UNAVAILABLE`: retryable, and what gRPC clients and proxies expect
/// from a server that sheds load.
pub(crate) const GRPC_UNAVAILABLE: u16 = 14;

impl Default for OverloadAnswer {
    fn default() -> Self {
        OverloadAnswer {
            status: StatusCode::from_u16(SITE_OVERLOADED).expect("529 is a valid status code"),
            grpc_code: GRPC_UNAVAILABLE,
        }
    }
}

/// Which protocol a rejected request must be answered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    Http,
    Grpc,
}

impl Protocol {
    /// gRPC (and gRPC-Web) requests carry `application/grpc…`; a gRPC client
    /// reads anything but a `200` with a `grpc-status` as `UNKNOWN`.
    pub(crate) fn of<B>(req: &Request<B>) -> Protocol {
        const GRPC: &[u8] = b"application/grpc";
        match req.headers().get(CONTENT_TYPE) {
            Some(value)
                if value.len() >= GRPC.len()
                    && value.as_bytes()[..GRPC.len()].eq_ignore_ascii_case(GRPC) =>
            {
                Protocol::Grpc
            }
            _ => Protocol::Http,
        }
    }
}

/// A rejected request: enough to build its answer when the response future
/// is polled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rejection {
    pub(crate) overloaded: Overloaded,
    pub(crate) protocol: Protocol,
    pub(crate) answer: OverloadAnswer,
}

impl Rejection {
    /// The response head and body of the overload answer.
    pub(crate) fn into_response(self) -> Response<Bytes> {
        match self.protocol {
            Protocol::Http => http_answer(self.overloaded, self.answer.status),
            Protocol::Grpc => grpc_answer(self.overloaded, self.answer.grpc_code),
        }
    }
}

/// The rejection-scope headers shared by both answers.
fn scope_headers(headers: &mut HeaderMap, scope: RejectionScope) {
    headers.insert(REJECTION_SCOPE, HeaderValue::from_static(scope.as_str()));
    if let RejectionScope::Rank(rank) = scope {
        headers.insert(REJECTED_RANK, HeaderValue::from(rank));
    }
}

/// An OpenAI-style JSON error:
/// `{"error":{"message":…,"type":"overloaded","code":529,"scope":"rank","rank":3}}`.
fn http_answer(overloaded: Overloaded, status: StatusCode) -> Response<Bytes> {
    let scope = overloaded.scope();
    let rank = match scope {
        RejectionScope::Rank(rank) => rank.to_string(),
        RejectionScope::Worker => "null".to_owned(),
    };
    let mut json = String::with_capacity(192);
    json.push_str(r#"{"error":{"message":"#);
    push_json_string(&mut json, &overloaded.to_string());
    let _ = write!(
        json,
        r#","type":"overloaded","code":{},"scope":"{}","rank":{}}}}}"#,
        status.as_u16(),
        scope.as_str(),
        rank,
    );

    let mut response = Response::new(Bytes::from(json));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    scope_headers(headers, scope);
    if scope == RejectionScope::Worker {
        headers.insert(RETRY_AFTER, HeaderValue::from(WORKER_BACKOFF_SECONDS));
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
fn grpc_answer(overloaded: Overloaded, code: u16) -> Response<Bytes> {
    let scope = overloaded.scope();
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS, HeaderValue::from(code));
    let message = percent_encode_grpc_message(&overloaded.to_string());
    if let Ok(message) = HeaderValue::from_str(&message) {
        headers.insert(GRPC_MESSAGE, message);
    }
    scope_headers(headers, scope);
    if scope == RejectionScope::Worker {
        headers.insert(
            GRPC_RETRY_PUSHBACK_MS,
            HeaderValue::from(WORKER_BACKOFF_SECONDS * 1000),
        );
    }
    response
}

/// Appends `text` as a JSON string literal.
fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
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
    fn json_strings_escape_quotes_backslashes_and_controls() {
        let mut out = String::new();
        push_json_string(&mut out, "a\"b\\c\nd é");
        assert_eq!(out, r#""a\"b\\c\u000ad é""#);
    }

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
            let mut req = Request::new(());
            req.headers_mut()
                .insert(CONTENT_TYPE, content_type.parse().unwrap());
            Protocol::of(&req)
        };
        assert_eq!(with("application/grpc"), Protocol::Grpc);
        assert_eq!(with("application/grpc+proto"), Protocol::Grpc);
        assert_eq!(with("Application/GRPC-web"), Protocol::Grpc);
        assert_eq!(with("application/json"), Protocol::Http);
        assert_eq!(with("application/grp"), Protocol::Http);
        assert_eq!(Protocol::of(&Request::new(())), Protocol::Http);
    }
}
