//! The answers the sidecar writes itself: the engine unreachable (`502`),
//! too slow (`504`), the sidecar shutting down (`503`); all in the OpenAI
//! error format the gate's own overload answers use.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};

use super::Body;
use crate::http::{ORIGIN, REJECTION_REASON, REJECTION_SCOPE};

/// An OpenAI-style error answer written by the sidecar.
pub(crate) fn json_error(status: StatusCode, message: &str, kind: &str) -> Response<Body> {
    let body = serde_json::json!({
        "error": {
            "message": message,
            "type": kind,
            "param": null,
            "code": status.as_u16(),
        }
    });
    let mut response = Response::new(Body::from(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(ORIGIN, HeaderValue::from_static("proxy"));
    response
}

/// `503` for a request still queued when the sidecar began to shut down: it
/// never reached the engine, so a frontend may send it elsewhere at once.
pub(crate) fn shutting_down() -> Response<Body> {
    let mut response = json_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the server is shutting down; the request did not reach the engine",
        "overloaded",
    );
    let headers = response.headers_mut();
    headers.insert(REJECTION_SCOPE, HeaderValue::from_static("worker"));
    headers.insert(REJECTION_REASON, HeaderValue::from_static("shutdown"));
    headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}
