//! Where a request's own deadline comes from: a gRPC `grpc-timeout`, or a
//! header the user names. Off unless asked for: by default a queued request
//! waits as long as the queue takes.

use std::time::Duration;

use http::{HeaderMap, HeaderName};

use crate::headers::{GRPC_TIMEOUT, parse_grpc_timeout, single_value};

/// The request headers that carry a client's deadline; see
/// [`AdmissionLayer::grpc_timeout`](super::AdmissionLayer::grpc_timeout) and
/// [`AdmissionLayer::deadline_header`](super::AdmissionLayer::deadline_header).
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestDeadlines {
    pub(crate) grpc_timeout: bool,
    pub(crate) header: Option<HeaderName>,
}

impl RequestDeadlines {
    /// The client's deadline from arrival, if a header carries a valid one
    /// (the smallest, when both do).
    pub(crate) fn of(&self, headers: &HeaderMap) -> Option<Duration> {
        let grpc = self
            .grpc_timeout
            .then(|| single(headers, &GRPC_TIMEOUT).and_then(parse_grpc_timeout))
            .flatten();
        let header = self
            .header
            .as_ref()
            .and_then(|name| single(headers, name))
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_millis);
        match (grpc, header) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The value of a header present exactly once, as text.
fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    single_value(headers, name)?.to_str().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_protocol_defines_them() {
        assert_eq!(parse_grpc_timeout("1S"), Some(Duration::from_secs(1)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in [
            "",
            "S",
            "100",
            "123456789S",
            "1s",
            "-1S",
            "1.5S",
            "ü",
            "1 S",
        ] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_smallest_of_the_headers_asked_for_wins() {
        let deadlines = RequestDeadlines {
            grpc_timeout: true,
            header: Some(HeaderName::from_static("x-request-timeout-ms")),
        };
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", "2S".parse().unwrap());
        headers.insert("x-request-timeout-ms", " 1500 ".parse().unwrap());
        assert_eq!(deadlines.of(&headers), Some(Duration::from_millis(1500)));
        assert_eq!(RequestDeadlines::default().of(&headers), None);
        headers.append("x-request-timeout-ms", "10".parse().unwrap());
        assert_eq!(
            deadlines.of(&headers),
            Some(Duration::from_secs(2)),
            "ambiguous header ignored"
        );
    }
}
