//! [`GrpcTimeout`] and [`DeadlineHeader`]: how long a request may wait,
//! as its client (or a trusted router) says.

use std::time::Duration;

use http::{HeaderMap, HeaderName, Request};

use super::Describe;
use crate::gate::Descriptor;
use crate::headers::{GRPC_TIMEOUT, parse_grpc_timeout, single_value};

/// Describes the deadline with a gRPC request's `grpc-timeout` (exactly one
/// valid header), the smaller of it and any deadline filled in before.
/// Set on the layer with
/// [`AdmissionLayer::grpc_timeout`](crate::http::AdmissionLayer::grpc_timeout).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GrpcTimeout;

impl GrpcTimeout {
    /// A `grpc-timeout` value (one to eight ASCII digits and a unit, `H`,
    /// `M`, `S`, `m`, `u` or `n`, as gRPC over HTTP/2 defines it) as a
    /// duration; `None` for anything else.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_admission::http::GrpcTimeout;
    ///
    /// assert_eq!(GrpcTimeout::parse(b"250m"), Some(Duration::from_millis(250)));
    /// assert_eq!(GrpcTimeout::parse(b"123456789S"), None);
    /// ```
    pub fn parse(value: &[u8]) -> Option<Duration> {
        parse_grpc_timeout(value)
    }
}

impl<B> Describe<B> for GrpcTimeout {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        let timeout = single_text(req.headers(), &GRPC_TIMEOUT).and_then(parse_grpc_timeout);
        shorten(descriptor, timeout);
    }
}

/// Describes the deadline with a header holding milliseconds from arrival
/// (exactly one, a decimal number, spaces around it allowed), the smaller
/// of it and any deadline filled in before. Set on the layer with
/// [`AdmissionLayer::deadline_header`](crate::http::AdmissionLayer::deadline_header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadlineHeader {
    name: HeaderName,
}

impl DeadlineHeader {
    /// Reads the deadline from header `name`.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn new(name: &str) -> Self {
        DeadlineHeader {
            name: HeaderName::from_bytes(name.as_bytes())
                .unwrap_or_else(|_| panic!("invalid deadline header name: {name:?}")),
        }
    }
}

impl<B> Describe<B> for DeadlineHeader {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        let after = single_text(req.headers(), &self.name)
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_millis);
        shorten(descriptor, after);
    }
}

/// Keeps the smaller of the descriptor's deadline and `after`.
fn shorten(descriptor: &mut Descriptor, after: Option<Duration>) {
    if let Some(after) = after {
        descriptor.deadline = Some(descriptor.deadline.map_or(after, |was| was.min(after)));
    }
}

/// The value of a header present exactly once, as text.
fn single_text<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    single_value(headers, name)?.to_str().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&'static str, &'static str)]) -> Request<()> {
        let mut req = Request::new(());
        for (name, value) in headers {
            req.headers_mut().append(*name, value.parse().unwrap());
        }
        req
    }

    #[test]
    fn the_smallest_deadline_wins_and_an_ambiguous_header_is_ignored() {
        let both = (GrpcTimeout, DeadlineHeader::new("x-request-timeout-ms"));
        let mut req = request(&[("grpc-timeout", "2S"), ("x-request-timeout-ms", " 1500 ")]);
        assert_eq!(
            both.descriptor(&req).deadline,
            Some(Duration::from_millis(1500))
        );
        req.headers_mut()
            .append("x-request-timeout-ms", "10".parse().unwrap());
        assert_eq!(both.descriptor(&req).deadline, Some(Duration::from_secs(2)));
        assert_eq!(().descriptor(&req).deadline, None);
    }
}
