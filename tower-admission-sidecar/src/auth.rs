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
///
/// A key may stand for a named tenant ([`ApiKeys::named`]): with
/// [`tenant_from_api_key`](crate::SidecarBuilder::tenant_from_api_key) its
/// requests are that tenant's, so per-tenant limits and weights set by name
/// apply to them and the client-view metrics label them with the name. A
/// key without a name is a tenant of its own, named by the key's hash.
#[derive(Clone)]
pub struct ApiKeys {
    keys: Arc<[Key]>,
    seed: std::collections::hash_map::RandomState,
}

#[derive(Clone)]
pub(crate) struct Key {
    secret: Vec<u8>,
    /// The tenant it stands for, when named.
    tenant: Option<HeaderValue>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let named = self.keys.iter().filter(|key| key.tenant.is_some()).count();
        write!(f, "ApiKeys({} keys, {named} named)", self.keys.len())
    }
}

/// A tenant name [`ApiKeys::named`] cannot use: empty, longer than
/// [`QosHeaders::MAX_TENANT_BYTES`](tower_admission::http::QosHeaders::MAX_TENANT_BYTES)
/// bytes, or holding a control character (the rules of the tenant header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidTenantName(String);

impl std::fmt::Display for InvalidTenantName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid tenant name {:?} for an API key: 1 to {} bytes of UTF-8 without control \
             characters",
            self.0,
            tower_admission::http::QosHeaders::MAX_TENANT_BYTES
        )
    }
}

impl std::error::Error for InvalidTenantName {}

impl ApiKeys {
    /// The keys a client may present; empty ones are ignored.
    pub fn new<I, K>(keys: I) -> Self
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        ApiKeys::from_keys(keys.into_iter().map(|key| Key {
            secret: key.as_ref().trim().as_bytes().to_vec(),
            tenant: None,
        }))
    }

    /// Keys that each stand for a named tenant: `(tenant, key)` pairs
    /// (several keys may name one tenant); empty keys are ignored. Fails on
    /// the first name that is not a valid tenant name.
    pub fn named<I, T, K>(pairs: I) -> Result<Self, InvalidTenantName>
    where
        I: IntoIterator<Item = (T, K)>,
        T: AsRef<str>,
        K: AsRef<str>,
    {
        let keys = pairs
            .into_iter()
            .map(|(tenant, key)| {
                Ok(Key {
                    secret: key.as_ref().trim().as_bytes().to_vec(),
                    tenant: Some(tenant_value(tenant.as_ref())?),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ApiKeys::from_keys(keys))
    }

    /// These keys and `other`'s.
    pub fn and(self, other: ApiKeys) -> Self {
        ApiKeys::from_keys(self.keys.iter().chain(other.keys.iter()).cloned())
    }

    fn from_keys(keys: impl IntoIterator<Item = Key>) -> Self {
        ApiKeys {
            keys: keys
                .into_iter()
                .filter(|key| !key.secret.is_empty())
                .collect(),
            seed: std::collections::hash_map::RandomState::new(),
        }
    }

    /// The tenant `key` stands for: its name, or the key hashed with this
    /// process's secret seed (`key-` and 16 hex digits), so no log or
    /// header holds the key.
    pub(crate) fn tenant(&self, key: &Key) -> Option<HeaderValue> {
        use std::hash::BuildHasher;
        if let Some(tenant) = &key.tenant {
            return Some(tenant.clone());
        }
        let hash = self.seed.hash_one(&key.secret);
        HeaderValue::from_str(&format!("key-{hash:016x}")).ok()
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there is no key (then every request is refused).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key `req` presents, if it is one of these.
    fn key_of<B>(&self, req: &Request<B>) -> Option<&Key> {
        let presented = presented(req)?;
        // Every key compared in full, whatever matched: the time taken
        // tells nothing of which key, or how much of it, was right.
        let mut matched = None;
        for key in self.keys.iter() {
            if constant_time_eq(&key.secret, presented) {
                matched = Some(key);
            }
        }
        matched
    }

    /// Whether `req` may go on: `Ok` with the key it presents (`None` for
    /// a health probe without one), or `Err` for the `401`. Every key is
    /// compared once per request.
    pub(crate) fn check<B>(&self, req: &Request<B>) -> Result<Option<&Key>, Unauthorized> {
        if let Some(key) = self.key_of(req) {
            return Ok(Some(key));
        }
        let probe = matches!(*req.method(), Method::GET | Method::HEAD)
            && matches!(req.uri().path(), "/health" | "/ping");
        if probe { Ok(None) } else { Err(Unauthorized) }
    }
}

/// A request without a valid key.
#[derive(Debug)]
pub(crate) struct Unauthorized;

impl Unauthorized {
    /// The `401` that says so.
    pub(crate) fn answer(self) -> Response<Body> {
        let mut answer = json_error(
            StatusCode::UNAUTHORIZED,
            "invalid or missing API key: send it as 'Authorization: Bearer <key>'",
            "invalid_request_error",
        );
        answer
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        answer
    }
}

/// `name` as the tenant header's value, if the gate would read it as a
/// tenant.
fn tenant_value(name: &str) -> Result<HeaderValue, InvalidTenantName> {
    let invalid = || InvalidTenantName(name.to_owned());
    if name.is_empty()
        || name.len() > tower_admission::http::QosHeaders::MAX_TENANT_BYTES
        || name.chars().any(char::is_control)
    {
        return Err(invalid());
    }
    HeaderValue::from_bytes(name.as_bytes()).map_err(|_| invalid())
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

    impl ApiKeys {
        fn refusal<B>(&self, req: &Request<B>) -> Option<Response<Body>> {
            self.check(req).err().map(Unauthorized::answer)
        }

        fn tenant_of<B>(&self, req: &Request<B>) -> Option<HeaderValue> {
            self.tenant(self.check(req).ok()??)
        }
    }

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

    #[test]
    fn a_named_key_stands_for_its_tenant_and_another_for_its_hash() {
        let keys = ApiKeys::new(["anonymous"]).and(
            ApiKeys::named([("acme", "k-acme"), ("acme", "k-acme-2"), ("beta", "k-b")]).unwrap(),
        );
        assert_eq!(keys.len(), 4);
        let tenant = |key: &str| keys.tenant_of(&with("authorization", &format!("Bearer {key}")));
        assert_eq!(tenant("k-acme").unwrap(), "acme");
        assert_eq!(tenant("k-acme-2").unwrap(), "acme");
        assert_eq!(tenant("k-b").unwrap(), "beta");
        let hashed = tenant("anonymous").unwrap();
        assert!(hashed.to_str().unwrap().starts_with("key-"), "{hashed:?}");
        assert!(!hashed.to_str().unwrap().contains("anonymous"));
        assert_eq!(tenant("k-c"), None);
        let said = format!("{keys:?}");
        assert_eq!(said, "ApiKeys(4 keys, 3 named)");
    }

    #[test]
    fn a_tenant_name_the_gate_would_not_read_is_refused() {
        let longest = "t".repeat(tower_admission::http::QosHeaders::MAX_TENANT_BYTES);
        assert!(ApiKeys::named([(longest.as_str(), "k")]).is_ok());
        assert!(
            ApiKeys::named([("équipe", "k")]).is_ok(),
            "UTF-8 names are names"
        );
        for name in [
            String::new(),
            format!("{longest}t"),
            "a\nb".to_owned(),
            "a\u{7f}".to_owned(),
        ] {
            let error = ApiKeys::named([(name.as_str(), "k")]).unwrap_err();
            assert!(error.to_string().contains("invalid tenant name"), "{error}");
        }
    }
}
