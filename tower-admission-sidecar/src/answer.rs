//! The answers the sidecar writes itself: the engine unreachable (`502`),
//! too slow (`504`), a request it cannot forward (`400`); all in the
//! OpenAI error format the gate's own overload answers use, by the core's
//! one writer ([`error_response`]).

use http::header::HeaderValue;
use http::{Response, StatusCode};

use super::body::Body;
use tower_admission::http::{ORIGIN, error_response};

/// An OpenAI-style error answer written by the sidecar.
pub(crate) fn json_error(status: StatusCode, message: &str, kind: &str) -> Response<Body> {
    let mut response = error_response(status, kind, message).map(Body::from);
    mark_as_the_proxy_s(&mut response);
    response
}

/// Marks an answer as the sidecar's own, not the engine's.
pub(crate) fn mark_as_the_proxy_s(response: &mut Response<Body>) {
    response
        .headers_mut()
        .insert(ORIGIN, HeaderValue::from_static("proxy"));
}
