//! Which requests pass the gate, decided on the path as the engine will
//! route it (behaviour §11.1), fail-closed.
//!
//! The engines decode a request path before they route it (uvicorn for vLLM
//! and SGLang, cpp-httplib for llama.cpp, axum for TGI), so the sidecar
//! cannot compare the raw bytes: `/v1/chat/%63ompletions` and
//! `/v1%2Fchat%2Fcompletions` are both a chat completion to the engine.
//! The sidecar decodes the path once, resolves dot segments and repeated
//! slashes, decides on the result, and forwards the result (never the raw
//! path) so the engine routes exactly what was decided on. A path it cannot
//! normalise safely is refused `400` before the engine.
//!
//! The decision itself is fail-closed: every `POST` passes the gate except
//! a short list of routes known to be cheap ([`DEFAULT_PASS_PATHS`]), so a
//! generation route the sidecar has never heard of is admitted.

use http::uri::{PathAndQuery, Uri};
use http::{Method, Response, StatusCode};

use super::answer::json_error;
use super::body::Body;

/// The routes whose `POST`s pass straight through by default: cheap ones
/// that start no generation, on any of the engine families (an engine that
/// does not serve one answers `404` itself).
///
/// | Route | Engines | What it does |
/// |---|---|---|
/// | `/health`, `/ping` | all; vLLM (SageMaker) | liveness |
/// | `/v1/models`, `/models` | all; llama.cpp | model listing |
/// | `/metrics` | all | the engine's metrics |
/// | `/tokenize`, `/detokenize` | vLLM, SGLang, llama.cpp, TGI (`/tokenize`) | tokenizer only |
/// | `/chat_tokenize` | TGI | chat template and tokenizer |
/// | `/apply-template` | llama.cpp | chat template only |
/// | `/props` | llama.cpp | reads or sets server properties |
/// | `/lora-adapters` | llama.cpp | adapter scales |
/// | `/v1/load_lora_adapter`, `/v1/unload_lora_adapter` | vLLM | adapter loading |
/// | `/load_lora_adapter`, `/unload_lora_adapter` | SGLang | adapter loading |
///
/// The binary narrows this list to the engine family's own rows
/// ([`EngineKind::pass_paths`](crate::EngineKind::pass_paths)) when the
/// engine says what it is at start, and keeps the whole list while it does
/// not.
///
/// Compared with the normalised path, exactly (case included: none of the
/// engines ignores case, and a spelling that misses this list is admitted,
/// which is the safe side).
pub const DEFAULT_PASS_PATHS: &[&str] = &[
    "/health",
    "/ping",
    "/v1/models",
    "/models",
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/chat_tokenize",
    "/apply-template",
    "/props",
    "/lora-adapters",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/load_lora_adapter",
    "/unload_lora_adapter",
];

/// The admit and pass lists, and the decision on one request.
#[derive(Debug, Clone)]
pub(crate) struct Routes {
    /// Always admitted, even when the pass list names them.
    pub(crate) admit: Vec<String>,
    /// Passed straight through unless the admit list names them.
    pub(crate) pass: Vec<String>,
}

impl Routes {
    /// Whether `req` passes the gate. A `POST`'s path is normalised
    /// ([`normalise_path`]) and the request rewritten to it; one that cannot
    /// be normalised is answered here (`400`). Other methods start no
    /// generation on any engine: forwarded as they are.
    pub(crate) fn admits<B>(&self, req: &mut http::Request<B>) -> Result<bool, Unroutable> {
        if *req.method() != Method::POST {
            return Ok(false);
        }
        // Most paths are normal already, and sent as they came: decided on
        // as they are, with nothing allocated.
        let raw = req.uri().path();
        if is_normal(raw) {
            return Ok(self.admits_path(raw));
        }
        let path = normalise_path(raw).map_err(|refusal| {
            tracing::debug!("refused a request path: {refusal}");
            Unroutable(refusal.to_string())
        })?;
        let admitted = self.admits_path(&path);
        let forwarded = match req.uri().query() {
            Some(query) => format!("{}?{query}", encode(&path)),
            None => encode(&path),
        };
        let mut parts = req.uri().clone().into_parts();
        parts.path_and_query =
            Some(PathAndQuery::try_from(forwarded).map_err(|error| Unroutable(error.to_string()))?);
        *req.uri_mut() = Uri::from_parts(parts).map_err(|error| Unroutable(error.to_string()))?;
        Ok(admitted)
    }

    /// Whether a normalised path passes the gate.
    fn admits_path(&self, path: &str) -> bool {
        self.admit
            .iter()
            .any(|admit| admit.eq_ignore_ascii_case(path))
            || !self.pass.iter().any(|pass| pass == path)
    }
}

/// Whether `raw` is its own normal form, sent as it is: `/` and then
/// segments of bytes [`encode`] leaves plain (no `%`, so nothing to
/// decode), none empty (no `//`, no trailing `/`), `.` or `..`. Then
/// `encode(&normalise_path(raw)?) == raw`.
fn is_normal(raw: &str) -> bool {
    if raw == "/" {
        return true;
    }
    let Some(rest) = raw.strip_prefix('/') else {
        return false;
    };
    rest.split('/')
        .all(|segment| !matches!(segment, "" | "." | "..") && segment.bytes().all(plain))
}

/// A byte of RFC 3986's `pchar` that needs no escape (unreserved,
/// sub-delims, `:` and `@`).
fn plain(byte: u8) -> bool {
    byte.is_ascii_alphanumeric()
        || matches!(
            byte,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

/// A request whose path cannot be normalised safely: answered `400`
/// before the engine.
#[derive(Debug)]
pub(crate) struct Unroutable(String);

impl Unroutable {
    pub(crate) fn answer(self) -> Response<Body> {
        json_error(
            StatusCode::BAD_REQUEST,
            &format!("the request path cannot be routed safely: {}", self.0),
            "invalid_request_error",
        )
    }
}

/// Why a path cannot be normalised safely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathRefusal {
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// The decoded path is not UTF-8.
    NotUtf8,
    /// The decoded path holds a character engines disagree on: `%` (a
    /// second level of encoding), `?`, `#`, `\`, or a control character.
    Ambiguous(char),
    /// The path does not start with `/`.
    NotAbsolute,
}

impl std::fmt::Display for PathRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathRefusal::BadEscape => f.write_str("a '%' not followed by two hex digits"),
            PathRefusal::NotUtf8 => f.write_str("the decoded path is not UTF-8"),
            PathRefusal::Ambiguous(c) => write!(f, "the decoded path holds {c:?}"),
            PathRefusal::NotAbsolute => f.write_str("the path does not start with '/'"),
        }
    }
}

impl std::error::Error for PathRefusal {}

/// The path as an engine routes it: percent-decoded once (`%2F` included),
/// repeated slashes merged, `.` and `..` segments resolved (`..` at the
/// root stays there), no trailing slash. Decoded, so the result is to be
/// compared, not sent; the sidecar sends it percent-encoded again.
///
/// ```
/// use tower_admission_sidecar::normalise_path;
/// assert_eq!(normalise_path("/v1%2Fchat/./%63ompletions/").unwrap(), "/v1/chat/completions");
/// assert_eq!(normalise_path("//tokenize/../v1//completions").unwrap(), "/v1/completions");
/// assert!(normalise_path("/v1/chat/%2563ompletions").is_err());
/// ```
pub fn normalise_path(raw: &str) -> Result<String, PathRefusal> {
    if !raw.starts_with('/') {
        return Err(PathRefusal::NotAbsolute);
    }
    let bytes = raw.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let high = bytes.get(at + 1).and_then(|&b| hex(b));
            let low = bytes.get(at + 2).and_then(|&b| hex(b));
            match (high, low) {
                (Some(high), Some(low)) => decoded.push(high << 4 | low),
                _ => return Err(PathRefusal::BadEscape),
            }
            at += 3;
        } else {
            decoded.push(bytes[at]);
            at += 1;
        }
    }
    let decoded = String::from_utf8(decoded).map_err(|_| PathRefusal::NotUtf8)?;
    if let Some(c) = decoded
        .chars()
        .find(|&c| matches!(c, '%' | '?' | '#' | '\\') || c.is_control())
    {
        return Err(PathRefusal::Ambiguous(c));
    }
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            segment => segments.push(segment),
        }
    }
    Ok(format!("/{}", segments.join("/")))
}

fn hex(byte: u8) -> Option<u8> {
    (byte as char).to_digit(16).map(|digit| digit as u8)
}

/// A normalised path percent-encoded for the request line: every byte
/// outside RFC 3986's `pchar` and `/` is escaped (a normalised path holds
/// no `%`, so nothing is escaped twice).
fn encode(path: &str) -> String {
    let mut encoded = String::with_capacity(path.len());
    for &byte in path.as_bytes() {
        if byte == b'/' || plain(byte) {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_taken_as_normal_is_what_normalising_and_escaping_give() {
        for normal in [
            "/",
            "/v1/chat/completions",
            "/a/b.c/~d:e@f",
            "/v1/x!$&'()*+,;=",
        ] {
            assert!(is_normal(normal), "{normal}");
        }
        for not in [
            "", "v1", "//v1", "/v1/", "/v1//x", "/./v1", "/v1/..", "/v1/%63", "/v1 x", "/é",
        ] {
            assert!(!is_normal(not), "{not}");
        }
        // Every path of a small alphabet, up to five bytes: where the fast
        // path takes one, the slow path forwards it unchanged.
        let alphabet = [b'/', b'.', b'a', b'%', b'6', b'3', b'~', b' '];
        let mut paths = vec![Vec::new()];
        for _ in 0..5 {
            let longer: Vec<Vec<u8>> = paths
                .iter()
                .flat_map(|path| {
                    alphabet.iter().map(move |&byte| {
                        let mut path = path.clone();
                        path.push(byte);
                        path
                    })
                })
                .collect();
            paths.extend(longer);
        }
        let mut normal = 0;
        for path in paths {
            let path = String::from_utf8(path).unwrap();
            if is_normal(&path) {
                normal += 1;
                assert_eq!(encode(&normalise_path(&path).unwrap()), path);
            }
        }
        assert!(normal > 100, "{normal}");
    }

    #[test]
    fn spellings_of_one_route_normalise_to_it() {
        for raw in [
            "/v1/chat/completions",
            "/v1/chat/%63ompletions",
            "/v1%2Fchat%2Fcompletions",
            "/v1%2fchat%2fcompletions",
            "//v1///chat/completions/",
            "/v1/./chat/x/../completions",
            "/../../v1/chat/completions",
            "/%2E%2E/v1/chat/%2e/completions",
        ] {
            assert_eq!(
                normalise_path(raw).as_deref(),
                Ok("/v1/chat/completions"),
                "{raw}"
            );
        }
        assert_eq!(normalise_path("/").as_deref(), Ok("/"));
        assert_eq!(normalise_path("/a/..").as_deref(), Ok("/"));
    }

    #[test]
    fn paths_engines_could_read_otherwise_are_refused() {
        for (raw, refusal) in [
            ("/v1/chat/%2563ompletions", PathRefusal::Ambiguous('%')),
            ("/v1/chat/completions%3F", PathRefusal::Ambiguous('?')),
            ("/v1/chat%23x", PathRefusal::Ambiguous('#')),
            ("/v1%5Cchat", PathRefusal::Ambiguous('\\')),
            ("/v1/chat%00", PathRefusal::Ambiguous('\0')),
            ("/v1/chat%0a", PathRefusal::Ambiguous('\n')),
            ("/v1/%zzchat", PathRefusal::BadEscape),
            ("/v1/chat%2", PathRefusal::BadEscape),
            ("/v1/%ff", PathRefusal::NotUtf8),
            ("%2Fv1", PathRefusal::NotAbsolute),
        ] {
            assert_eq!(normalise_path(raw), Err(refusal), "{raw}");
        }
    }

    #[test]
    fn the_forwarded_path_is_escaped_again_where_a_request_line_needs_it() {
        assert_eq!(encode("/v1/chat/completions"), "/v1/chat/completions");
        assert_eq!(encode("/a b/é"), "/a%20b/%C3%A9");
        assert_eq!(normalise_path(&encode("/a b/é")).as_deref(), Ok("/a b/é"));
    }

    #[test]
    fn every_post_is_admitted_but_the_pass_list_and_the_admit_list_wins() {
        let routes = Routes {
            admit: vec!["/v1/chat/completions".into()],
            pass: vec!["/tokenize".into(), "/v1/chat/completions".into()],
        };
        let decide = |method: Method, path: &str| {
            let mut req = http::Request::builder()
                .method(method)
                .uri(path)
                .body(())
                .unwrap();
            let admitted = routes
                .admits(&mut req)
                .map_err(|refused| refused.answer().status());
            (admitted, req.uri().to_string())
        };
        assert_eq!(
            decide(Method::POST, "/v1/chat/%63ompletions?x=1"),
            (Ok(true), "/v1/chat/completions?x=1".into())
        );
        assert_eq!(
            decide(Method::POST, "/x/../tokenize"),
            (Ok(false), "/tokenize".into())
        );
        assert_eq!(decide(Method::POST, "/TOKENIZE").0, Ok(true));
        assert_eq!(decide(Method::POST, "/infill").0, Ok(true));
        assert_eq!(decide(Method::POST, "/V1/CHAT/COMPLETIONS").0, Ok(true));
        assert_eq!(
            decide(Method::POST, "/v1/%2563").0,
            Err(StatusCode::BAD_REQUEST)
        );
        // Other methods start no generation: forwarded untouched.
        assert_eq!(
            decide(Method::GET, "/v1/models/a%2Fb"),
            (Ok(false), "/v1/models/a%2Fb".into())
        );
    }
}
