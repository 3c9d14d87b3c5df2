//! Reading request and response headers: the one place where a header's
//! value is found (present exactly once, or not at all) and where the
//! header formats the crate shares between its sides are parsed. A leaf:
//! it imports nothing of the crate, so every part that reads headers ([`http`](crate::http))
//! stands on it.

use std::fmt;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

/// gRPC's request header carrying the client's deadline.
pub(crate) const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// `name` as a header name, for the setters that take one (a `&str`,
/// `String` or [`HeaderName`]). Header names are configuration, so one
/// that is not valid is a programming error: it panics, naming `setter`.
#[track_caller]
pub(crate) fn header_name<N>(name: N, setter: &str) -> HeaderName
where
    N: TryInto<HeaderName>,
    N::Error: fmt::Debug,
{
    match name.try_into() {
        Ok(name) => name,
        Err(error) => panic!("{setter}: not a valid header name: {error:?}"),
    }
}

/// The value of header `name` when it is present exactly once: a repeated
/// header is ambiguous, and every header this crate reads (rank, cost,
/// deadline, priority, tenant) then falls back to its default.
pub(crate) fn single_value<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> Option<&'a HeaderValue> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    values.next().is_none().then_some(value)
}

/// A `grpc-timeout` value: one to eight ASCII digits and a unit (`H`, `M`,
/// `S`, `m`, `u`, `n`), as the gRPC over HTTP/2 protocol defines it;
/// `None` for anything else.
pub(crate) fn parse_grpc_timeout(value: impl AsRef<[u8]>) -> Option<Duration> {
    let (&unit, digits) = value.as_ref().split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount = digits
        .iter()
        .fold(0u64, |amount, digit| amount * 10 + u64::from(digit - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(amount * 3600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_header_has_no_single_value() {
        let name = HeaderName::from_static("x-dp-rank");
        let mut headers = HeaderMap::new();
        assert_eq!(single_value(&headers, &name), None);
        headers.insert(&name, HeaderValue::from_static("1"));
        assert_eq!(
            single_value(&headers, &name),
            Some(&HeaderValue::from_static("1"))
        );
        headers.append(&name, HeaderValue::from_static("2"));
        assert_eq!(single_value(&headers, &name), None);
    }

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
}
