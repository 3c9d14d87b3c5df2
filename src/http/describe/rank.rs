//! [`RankHeader`]: which data-parallel rank a request asks for, read from a
//! header.
//!
//! A rank decides whose queue and limits a request uses. It is only
//! as trustworthy as whatever supplied it: a client that may pick its own rank
//! can crowd one rank's queue on purpose. Take ranks from your own router (a
//! header it sets after stripping the client's, or a describer of your own
//! that decides from an authenticated route), never straight from end users.

use std::fmt;

use http::{HeaderName, Request};

use super::Describe;
use crate::gate::Descriptor;
use crate::headers::{header_name, single_value};

/// Reads the rank from a request header holding a decimal number.
///
/// [`RankHeader::default()`] reads `x-data-parallel-rank`, the header vLLM
/// honours. The value must be exactly one header holding only ASCII digits
/// that fit a `u32`; anything else — no header, an empty value, a sign,
/// spaces inside, a number too large, non-ASCII bytes, or the header
/// **repeated** (even with equal values) — makes the request unranked. A
/// repeated rank header means two parties disagree about who sets it, and
/// an unranked request can never take more than its share of the worker.
///
/// The header must be set by a trusted router, which should remove any copy
/// sent by the client: an end user who picks the rank can aim all their
/// requests at one rank's queue.
///
/// ```
/// use tower_admission::{AdmissionConfig, AdmissionLayer, Gate, RankHeader};
///
/// let gate = Gate::new(AdmissionConfig::new());
/// let layer = AdmissionLayer::new(gate).rank(RankHeader::new("x-dp-rank"));
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankHeader {
    name: HeaderName,
}

impl RankHeader {
    /// The header vLLM reads the data-parallel rank from.
    pub const DEFAULT_NAME: &'static str = "x-data-parallel-rank";

    /// Reads the rank from the header `name` (a `&str`, `String` or
    /// [`HeaderName`]).
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name. Header names are configuration,
    /// so this is a programming error, found at startup.
    pub fn new<N>(name: N) -> Self
    where
        N: TryInto<HeaderName>,
        N::Error: fmt::Debug,
    {
        RankHeader {
            name: header_name(name, "RankHeader::new"),
        }
    }

    /// The rank `req` asks for: `None` (unranked) unless the header is
    /// there exactly once and holds a plain decimal `u32`.
    fn read<B>(&self, req: &Request<B>) -> Option<u32> {
        parse_rank(single_value(req.headers(), &self.name)?.as_bytes())
    }
}

impl Default for RankHeader {
    fn default() -> Self {
        RankHeader {
            name: HeaderName::from_static(Self::DEFAULT_NAME),
        }
    }
}

/// The rank from the header, replacing any filled in before: a request
/// without a valid one is unranked.
impl<B> Describe<B> for RankHeader {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        descriptor.rank = self.read(req);
    }
}

/// A rank is one or more ASCII digits that fit a `u32`; nothing else.
fn parse_rank(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u32, |rank, &byte| {
        if !byte.is_ascii_digit() {
            return None;
        }
        rank.checked_mul(10)?.checked_add(u32::from(byte - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_headers(values: &[&[u8]]) -> Request<()> {
        let mut req = Request::new(());
        for value in values {
            req.headers_mut().append(
                RankHeader::DEFAULT_NAME,
                http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        req
    }

    fn rank_of(values: &[&[u8]]) -> Option<u32> {
        RankHeader::default().descriptor(&with_headers(values)).rank
    }

    #[test]
    fn a_single_decimal_header_names_the_rank() {
        assert_eq!(rank_of(&[b"0"]), Some(0));
        assert_eq!(rank_of(&[b"7"]), Some(7));
        assert_eq!(rank_of(&[b"007"]), Some(7));
        assert_eq!(rank_of(&[b"4294967295"]), Some(u32::MAX));
    }

    #[test]
    fn anything_but_one_plain_number_is_unranked() {
        assert_eq!(rank_of(&[]), None);
        assert_eq!(rank_of(&[b""]), None);
        assert_eq!(rank_of(&[b"-1"]), None);
        assert_eq!(rank_of(&[b"+1"]), None);
        assert_eq!(rank_of(&[b"1 2"]), None);
        assert_eq!(rank_of(&[b"0x1"]), None);
        assert_eq!(rank_of(&[b"1.0"]), None);
        assert_eq!(rank_of(&[b"4294967296"]), None);
        assert_eq!(rank_of(&[b"99999999999999999999999999999999"]), None);
        assert_eq!(rank_of(&[b"\xff\xfe"]), None);
        assert_eq!(rank_of(&[b"1", b"1"]), None);
        assert_eq!(rank_of(&[b"1", b"2"]), None);
    }

    #[test]
    fn header_names_are_case_insensitive_and_configurable() {
        let header = RankHeader::new("X-DP-Rank");
        let mut req = Request::new(());
        req.headers_mut().insert("x-dp-rank", "3".parse().unwrap());
        assert_eq!(header.descriptor(&req).rank, Some(3));
        assert_eq!(RankHeader::default().descriptor(&req).rank, None);
    }

    #[test]
    fn the_header_replaces_a_rank_filled_in_before_even_when_it_has_none() {
        let mut descriptor = Descriptor::new().with_rank(Some(4));
        RankHeader::default().describe(&with_headers(&[b"2"]), &mut descriptor);
        assert_eq!(descriptor.rank, Some(2));
        RankHeader::default().describe(&with_headers(&[]), &mut descriptor);
        assert_eq!(descriptor.rank, None);
    }
}
