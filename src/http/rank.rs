//! Which data-parallel rank a request asks for: [`RankExtractor`] and the
//! extractors that ship with the crate.
//!
//! A rank decides whose queue and limits a request uses. It is only
//! as trustworthy as whatever supplied it: a client that may pick its own rank
//! can crowd one rank's queue on purpose. Take ranks from your own router (a
//! header it sets after stripping the client's, or an extension set by an
//! inner layer), never straight from end users.

use std::fmt;

use http::{HeaderName, Request};

use super::reader::request_reader;
use crate::headers::{header_name, single_value};

request_reader! {
    /// Reads the data-parallel rank a request asks for.
    ///
    /// `None` means *unranked*: the request draws on the combined capacity of
    /// all ranks. A rank the engine has not reported is treated the same way by
    /// the [`Gate`](crate::Gate), so an extractor need not know how many ranks
    /// exist.
    ///
    /// Closures `Fn(&Request<B>) -> Option<u32>` are extractors too:
    ///
    /// ```
    /// use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};
    ///
    /// let layer = AdmissionLayer::new(Gate::new(AdmissionConfig::new()))
    ///     .rank(|req: &http::Request<axum::body::Body>| {
    ///         req.uri().path().strip_prefix("/rank/")?.parse::<u32>().ok()
    ///     });
    /// # let _ = layer;
    /// ```
    pub trait RankExtractor<B> {
        /// The rank `req` asks for, or `None` for an unranked request. Must not
        /// panic, whatever the request carries.
        fn rank(&self, req: &Request<B>) -> Option<u32>;
    }
}

/// Every request is unranked. The default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoRank;

impl<B> RankExtractor<B> for NoRank {
    fn rank(&self, _req: &Request<B>) -> Option<u32> {
        None
    }
}

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

    /// The header read.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl Default for RankHeader {
    fn default() -> Self {
        RankHeader {
            name: HeaderName::from_static(Self::DEFAULT_NAME),
        }
    }
}

impl<B> RankExtractor<B> for RankHeader {
    fn rank(&self, req: &Request<B>) -> Option<u32> {
        parse_rank(single_value(req.headers(), &self.name)?.as_bytes())
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

/// A request extension naming the request's data-parallel rank, read by
/// [`RankExtension`].
///
/// Set it in an inner layer or a router that already decided the rank
/// (from an authenticated route, a session table, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataParallelRank(pub u32);

/// Reads the rank from a [`DataParallelRank`] request extension; no
/// extension means unranked.
///
/// ```
/// use tower_admission::{AdmissionConfig, AdmissionLayer, DataParallelRank, Gate, RankExtension};
///
/// let layer = AdmissionLayer::new(Gate::new(AdmissionConfig::new())).rank(RankExtension);
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(DataParallelRank(3));
/// # let _ = (layer, req);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankExtension;

impl<B> RankExtractor<B> for RankExtension {
    fn rank(&self, req: &Request<B>) -> Option<u32> {
        req.extensions()
            .get::<DataParallelRank>()
            .map(|rank| rank.0)
    }
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
        RankHeader::default().rank(&with_headers(values))
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
        let extractor = RankHeader::new("X-DP-Rank");
        let mut req = Request::new(());
        req.headers_mut().insert("x-dp-rank", "3".parse().unwrap());
        assert_eq!(extractor.rank(&req), Some(3));
        assert_eq!(RankHeader::default().rank(&req), None);
    }

    #[test]
    fn extensions_and_closures_are_extractors() {
        let mut req = Request::new(());
        assert_eq!(RankExtension.rank(&req), None);
        req.extensions_mut().insert(DataParallelRank(5));
        assert_eq!(RankExtension.rank(&req), Some(5));
        let closure = |_: &Request<()>| Some(9);
        assert_eq!(closure.rank(&req), Some(9));
        assert_eq!(NoRank.rank(&req), None);
    }
}
