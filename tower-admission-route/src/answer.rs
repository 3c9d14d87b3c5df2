//! Reading an overload answer from the response head: is it one, what is its
//! scope, and how long does the server ask the client to stay away.
//!
//! Only the status and the headers are read, never the body: the JSON of an
//! overload answer may change shape, its headers are the contract. Optional
//! headers may be absent; a malformed one is ignored rather than trusted.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, Response, StatusCode};

use tower_admission::RejectionScope;
use tower_admission::http::GrpcTimeout;
use tower_admission::http::{ORIGIN, REJECTED_RANK, REJECTION_SCOPE};

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// `529 Site is overloaded`, the gate's default overload status.
const SITE_OVERLOADED: u16 = 529;

/// gRPC `UNAVAILABLE`, the gate's overload code for gRPC requests.
const GRPC_UNAVAILABLE: &[u8] = b"14";

/// gRPC `OK`.
const GRPC_OK: &[u8] = b"0";

/// gRPC `DEADLINE_EXCEEDED`: the gate's answer when the client's own
/// deadline passed in the queue. The client has given up: not an overload
/// to retry elsewhere.
const GRPC_DEADLINE_EXCEEDED: &[u8] = b"4";

/// An overload answer, as read from a response head.
///
/// A response is an overload answer when it is
/// - an HTTP error status carrying `x-admission-rejection-scope` (whatever
///   status the worker's gate was configured with: 529, 503, 429…),
/// - or a `529` or `503` without it (a server or proxy without the gate),
/// - or a gRPC trailers-only response with `grpc-status: 14`
///   (`UNAVAILABLE`), or with any other error code carrying
///   `x-admission-rejection-scope` (whatever code the worker's gate was
///   configured with, e.g. `RESOURCE_EXHAUSTED`) except
///   `DEADLINE_EXCEEDED`, the answer for a client whose own deadline
///   passed.
///
/// A request that got such an answer from the gate never reached the engine,
/// so sending it again elsewhere cannot run it twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct OverloadAnswer {
    /// Whom the rejection concerns: one rank of the worker, or all of it.
    /// An answer without a readable scope concerns the whole worker: a
    /// rejection of an unranked request is always worker-scoped, and so is
    /// an overload answer from a server without the gate.
    pub scope: RejectionScope,
    /// How long the server asks to be left alone: `Retry-After` (seconds or
    /// an HTTP date), or for gRPC `grpc-retry-pushback-ms`. `None` when
    /// absent or unreadable.
    pub retry_after: Option<Duration>,
    /// `false` when the server asked not to be retried at all: a negative or
    /// unreadable `grpc-retry-pushback-ms`, as gRPC's retry design defines.
    pub retry_allowed: bool,
    /// The answer carries the gate's `x-admission-rejection-scope`: the
    /// request never reached the engine.
    pub from_gate: bool,
    /// The answer is an engine's own, passed on by the sidecar
    /// (`x-admission-origin: engine`, [`ORIGIN`](tower_admission::http::ORIGIN)): the engine saw
    /// the request, and may have done some of its work.
    pub from_engine: bool,
}

impl OverloadAnswer {
    /// Reads the answer from a response head; `None` when the response is
    /// not an overload answer.
    pub fn read<B>(response: &Response<B>) -> Option<OverloadAnswer> {
        OverloadAnswer::from_head(response.status(), response.headers())
    }

    /// [`OverloadAnswer::read`] from a status and headers.
    pub fn from_head(status: StatusCode, headers: &HeaderMap) -> Option<OverloadAnswer> {
        let scoped = headers.contains_key(REJECTION_SCOPE);
        let from_engine = !scoped
            && headers
                .get(ORIGIN)
                .is_some_and(|origin| origin.as_bytes().eq_ignore_ascii_case(b"engine"));
        if let Some(code) = headers.get(GRPC_STATUS) {
            // Trailers-only: the status is in the head. Other codes are the
            // call's own outcome, unless the gate says it answered.
            let code = code.as_bytes();
            let gate_error = scoped && code != GRPC_OK && code != GRPC_DEADLINE_EXCEEDED;
            if code != GRPC_UNAVAILABLE && !gate_error {
                return None;
            }
            let (retry_after, retry_allowed) = match headers.get(GRPC_RETRY_PUSHBACK_MS) {
                None => (None, true),
                Some(value) => match parse_pushback(value.as_bytes()) {
                    Some(pushback) => (Some(pushback), true),
                    None => (None, false),
                },
            };
            return Some(OverloadAnswer {
                scope: scope(headers),
                retry_after,
                retry_allowed,
                from_gate: scoped,
                from_engine,
            });
        }
        let overload_status = matches!(
            status.as_u16(),
            SITE_OVERLOADED | 503 // 503: Service Unavailable
        );
        let error_status = status.is_client_error() || status.is_server_error();
        if !(overload_status || (scoped && error_status)) {
            return None;
        }
        Some(OverloadAnswer {
            scope: scope(headers),
            retry_after: headers
                .get(RETRY_AFTER)
                .and_then(|value| parse_retry_after(value.as_bytes(), SystemTime::now())),
            retry_allowed: true,
            from_gate: scoped,
            from_engine,
        })
    }
}

/// The scope the headers name; worker scope when they name none, or a rank
/// that cannot be read. A tenant-scoped answer keeps the worker in
/// rotation: only the tenant is over its limit.
fn scope(headers: &HeaderMap) -> RejectionScope {
    let named_tenant = headers
        .get(REJECTION_SCOPE)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"tenant"));
    if named_tenant {
        return RejectionScope::Tenant;
    }
    let named_rank = headers
        .get(REJECTION_SCOPE)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"rank"));
    if !named_rank {
        return RejectionScope::Worker;
    }
    headers
        .get(REJECTED_RANK)
        .and_then(|value| parse_decimal(value.as_bytes()))
        .and_then(|rank| u32::try_from(rank).ok())
        .map_or(RejectionScope::Worker, RejectionScope::Rank)
}

/// `grpc-retry-pushback-ms`: a non-negative integer of milliseconds; `None`
/// (do not retry) for anything else.
fn parse_pushback(value: &[u8]) -> Option<Duration> {
    parse_decimal(value.trim_ascii()).map(Duration::from_millis)
}

/// `Retry-After`: delay-seconds, or an HTTP date (IMF-fixdate), which is
/// read relative to `now` (a date in the past is no delay). Fractional
/// seconds (`0.5`), which some servers send, are accepted too.
pub(crate) fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let value = value.trim_ascii();
    if let Some(seconds) = parse_decimal(value) {
        return Some(Duration::from_secs(seconds));
    }
    if let Some(seconds) = std::str::from_utf8(value)
        .ok()
        .filter(|text| {
            text.bytes()
                .all(|byte| byte.is_ascii_digit() || byte == b'.')
        })
        .and_then(|text| text.parse::<f64>().ok())
    {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let date = parse_imf_fixdate(value)?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The request's `grpc-timeout`, when its (first) value is a valid one.
pub(crate) fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    GrpcTimeout::parse(headers.get("grpc-timeout")?.as_bytes())
}

/// ASCII digits only, no sign, at most 18 of them (no overflow).
fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        digits
            .iter()
            .fold(0, |value, digit| value * 10 + u64::from(digit - b'0')),
    )
}

/// `Sun, 06 Nov 1994 08:49:37 GMT`, the HTTP date format servers must send.
/// (The two obsolete formats recipients should also accept are not read:
/// such a `Retry-After` is ignored.)
fn parse_imf_fixdate(value: &[u8]) -> Option<SystemTime> {
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    // "Sun, 06 Nov 1994 08:49:37 GMT": 29 bytes at fixed places.
    if value.len() != 29
        || &value[3..5] != b", "
        || value[7] != b' '
        || value[11] != b' '
        || value[16] != b' '
        || value[19] != b':'
        || value[22] != b':'
        || &value[25..] != b" GMT"
    {
        return None;
    }
    let day = parse_decimal(&value[5..7])?;
    let month = MONTHS.iter().position(|name| &value[8..11] == *name)? as u64 + 1;
    let year = parse_decimal(&value[12..16])?;
    let hour = parse_decimal(&value[17..19])?;
    let minute = parse_decimal(&value[20..22])?;
    let second = parse_decimal(&value[23..25])?;
    if !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 || year < 1970 {
        return None;
    }
    let days = days_since_epoch(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second;
    UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar
/// (Howard Hinnant's `days_from_civil`, for years from 1970 on).
fn days_since_epoch(year: u64, month: u64, day: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn head(status: u16, headers: &[(&str, &str)]) -> Option<OverloadAnswer> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        OverloadAnswer::from_head(StatusCode::from_u16(status).unwrap(), &map)
    }

    #[test]
    fn the_gates_worker_scoped_answer_is_read_with_its_retry_after() {
        let answer = head(
            529,
            &[
                ("x-admission-rejection-scope", "worker"),
                ("retry-after", "1"),
            ],
        )
        .unwrap();
        assert_eq!(answer.scope, RejectionScope::Worker);
        assert_eq!(answer.retry_after, Some(Duration::from_secs(1)));
        assert!(answer.retry_allowed);
    }

    #[test]
    fn a_rank_scoped_answer_names_its_rank() {
        let answer = head(
            529,
            &[
                ("x-admission-rejection-scope", "rank"),
                ("x-admission-rank", "3"),
                ("x-admission-rejection-reason", "queue_full"),
            ],
        )
        .unwrap();
        assert_eq!(answer.scope, RejectionScope::Rank(3));
        assert_eq!(answer.retry_after, None);
    }

    #[test]
    fn a_tenant_scoped_answer_is_read_as_tenant_scope() {
        let answer = head(
            429,
            &[
                ("x-admission-rejection-scope", "tenant"),
                ("x-admission-rejection-reason", "tenant_limit"),
                ("retry-after", "3"),
            ],
        )
        .unwrap();
        assert_eq!(answer.scope, RejectionScope::Tenant);
        assert_eq!(answer.retry_after, Some(Duration::from_secs(3)));
        assert!(answer.from_gate);
    }

    #[test]
    fn a_rank_scope_without_a_readable_rank_is_worker_scope() {
        for rank in [None, Some("x"), Some("-1"), Some("99999999999")] {
            let mut headers = vec![("x-admission-rejection-scope", "rank")];
            headers.extend(rank.map(|rank| ("x-admission-rank", rank)));
            assert_eq!(head(529, &headers).unwrap().scope, RejectionScope::Worker);
        }
    }

    #[test]
    fn any_error_status_with_a_scope_is_an_overload_and_529_or_503_without_one() {
        assert!(head(429, &[("x-admission-rejection-scope", "worker")]).is_some());
        assert!(head(503, &[]).is_some());
        assert!(head(529, &[]).is_some());
        assert!(head(429, &[]).is_none());
        assert!(head(500, &[]).is_none());
        assert!(head(200, &[("x-admission-rejection-scope", "worker")]).is_none());
        assert!(head(200, &[]).is_none());
    }

    #[test]
    fn grpc_unavailable_is_an_overload_and_other_codes_are_not() {
        let answer = head(
            200,
            &[
                ("grpc-status", "14"),
                ("x-admission-rejection-scope", "worker"),
                ("grpc-retry-pushback-ms", "1000"),
            ],
        )
        .unwrap();
        assert_eq!(answer.retry_after, Some(Duration::from_millis(1000)));
        assert!(answer.retry_allowed);
        assert!(head(200, &[("grpc-status", "4")]).is_none());
        assert!(head(200, &[("grpc-status", "0")]).is_none());
        assert!(head(200, &[("grpc-status", "8")]).is_none());
        let refused = head(
            200,
            &[("grpc-status", "14"), ("grpc-retry-pushback-ms", "-1")],
        )
        .unwrap();
        assert!(!refused.retry_allowed);
    }

    #[test]
    fn a_grpc_error_with_the_gates_scope_is_an_overload_unless_the_clients_deadline_passed() {
        let scoped = |code| {
            head(
                200,
                &[
                    ("grpc-status", code),
                    ("x-admission-rejection-scope", "rank"),
                    ("x-admission-rank", "2"),
                ],
            )
        };
        // RESOURCE_EXHAUSTED, as `AdmissionLayer::grpc_overload_code(8)`.
        assert_eq!(scoped("8").unwrap().scope, RejectionScope::Rank(2));
        assert!(scoped("4").is_none(), "the client's deadline passed");
        assert!(scoped("0").is_none());
    }

    #[test]
    fn retry_after_takes_seconds_fractions_and_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_770); // Sun, 06 Nov 1994 08:49:30 GMT
        let parse = |text: &str| parse_retry_after(text.as_bytes(), now);
        assert_eq!(parse("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse(" 0 "), Some(Duration::ZERO));
        assert_eq!(parse("0.25"), Some(Duration::from_millis(250)));
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(Duration::from_secs(7))
        );
        assert_eq!(parse("Sun, 06 Nov 1994 08:49:00 GMT"), Some(Duration::ZERO));
        for bad in [
            "",
            "-1",
            "soon",
            "1e3",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun, 32 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn dates_count_days_like_the_calendar() {
        assert_eq!(days_since_epoch(1970, 1, 1), 0);
        assert_eq!(days_since_epoch(2000, 3, 1), 11_017);
        assert_eq!(days_since_epoch(2024, 2, 29), 19_782);
    }

    #[test]
    fn grpc_timeouts_are_read_with_their_unit() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("grpc-timeout", HeaderValue::from_str(value).unwrap());
            grpc_timeout(&headers)
        };
        assert_eq!(with("250m"), Some(Duration::from_millis(250)));
        assert_eq!(with("2S"), Some(Duration::from_secs(2)));
        assert_eq!(with("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(with("123456789m"), None);
        assert_eq!(with("5x"), None);
        assert_eq!(with("m"), None);
    }
}
