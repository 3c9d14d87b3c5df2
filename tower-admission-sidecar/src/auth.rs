//! API keys checked before admission (issue 35, case 8).
//!
//! Without them anyone who can reach the port takes a queue place that the
//! engine's own `401` frees only once the request reaches it: a client
//! without a key could fill the queue. With [`ApiKeys`] the sidecar answers
//! `401` first, in OpenAI's error shape, and the request never meets the
//! gate. Keys are never logged.

use std::sync::Arc;

use http::header::{AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use http::{Method, Request, Response, StatusCode};

use super::answer::json_error;
use super::body::Body;

/// The API keys a client must present, as `Authorization: Bearer <key>`
/// (OpenAI) or `x-api-key: <key>` (Anthropic), on every request except the
/// health probes (`GET` or `HEAD` of `/health` and `/ping`).
#[derive(Clone)]
pub struct ApiKeys(Arc<[Vec<u8>]>, std::collections::hash_map::RandomState);

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.0.len())
    }
}

impl ApiKeys {
    /// The keys a client may present; empty ones are ignored.
    pub fn new<I, K>(keys: I) -> Self
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        ApiKeys(
            keys.into_iter()
                .map(|key| key.as_ref().trim().as_bytes().to_vec())
                .filter(|key| !key.is_empty())
                .collect(),
            std::collections::hash_map::RandomState::new(),
        )
    }

    /// The tenant a valid key of `req` stands for: the key hashed with this
    /// process's secret seed (`key-` and 16 hex digits), so no log or
    /// header holds the key. `None` for a request without a valid key.
    pub(crate) fn tenant_of<B>(&self, req: &Request<B>) -> Option<HeaderValue> {
        use std::hash::BuildHasher;
        let key = self.key_of(req)?;
        let hash = self.1.hash_one(key);
        HeaderValue::from_str(&format!("key-{hash:016x}")).ok()
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no key (then every request is refused).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The key `req` presents, if it is one of these.
    pub(crate) fn key_of<'r, B>(&self, req: &'r Request<B>) -> Option<&'r [u8]> {
        let presented = presented(req)?;
        // Every key compared in full, whatever matched: the time taken
        // tells nothing of which key, or how much of it, was right.
        let mut matched = false;
        for key in self.0.iter() {
            matched |= constant_time_eq(key, presented);
        }
        matched.then_some(presented)
    }

    /// The `401` for `req`, unless it may go on: a health probe, or a
    /// valid key.
    pub(crate) fn refusal<B>(&self, req: &Request<B>) -> Option<Response<Body>> {
        let probe = matches!(*req.method(), Method::GET | Method::HEAD)
            && matches!(req.uri().path(), "/health" | "/ping");
        if probe || self.key_of(req).is_some() {
            return None;
        }
        let mut answer = json_error(
            StatusCode::UNAUTHORIZED,
            "invalid or missing API key: send it as 'Authorization: Bearer <key>'",
            "invalid_request_error",
        );
        answer
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        Some(answer)
    }
}

/// The key a request presents: `Authorization: Bearer <key>`, else
/// `x-api-key: <key>`.
fn presented<B>(req: &Request<B>) -> Option<&[u8]> {
    if let Some(value) = req.headers().get(AUTHORIZATION) {
        let value = value.as_bytes();
        let scheme = b"bearer ";
        if value.len() > scheme.len() && value[..scheme.len()].eq_ignore_ascii_case(scheme) {
            return Some(value[scheme.len()..].trim_ascii());
        }
        return None;
    }
    req.headers()
        .get("x-api-key")
        .map(|value| value.as_bytes().trim_ascii())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &str, value: &str) -> Request<()> {
        Request::post("/v1/chat/completions")
            .header(name, value)
            .body(())
            .unwrap()
    }

    #[test]
    fn a_key_counts_as_bearer_or_x_api_key_and_only_if_known() {
        let keys = ApiKeys::new(["k1", "secret-2", ""]);
        assert_eq!(keys.len(), 2);
        assert!(keys.refusal(&with("authorization", "Bearer k1")).is_none());
        assert!(
            keys.refusal(&with("authorization", "bearer secret-2"))
                .is_none()
        );
        assert!(keys.refusal(&with("x-api-key", "k1")).is_none());
        for (name, value) in [
            ("authorization", "Bearer k2"),
            ("authorization", "Basic k1"),
            ("authorization", "Bearer "),
            ("x-api-key", "k"),
        ] {
            let answer = keys.refusal(&with(name, value)).unwrap();
            assert_eq!(answer.status(), StatusCode::UNAUTHORIZED, "{name}: {value}");
        }
        let probe = Request::get("/health").body(()).unwrap();
        assert!(keys.refusal(&probe).is_none());
        assert!(!format!("{keys:?}").contains("k1"));
    }
}
