//! Hostile input through the real layer: rank headers no router should
//! send (huge, signed, non-numeric, non-UTF-8, repeated, padded, too large
//! for the server) written byte for byte to a real axum server over TCP,
//! and inner services whose bodies fail at once, carry nothing but
//! trailers, or trickle a million tiny frames. Each request is treated as
//! documented (`RankHeader`: one plain decimal number of a reported rank,
//! else unranked), nothing panics, and the gate ends empty with every
//! request accounted for.
//!
//! Priority and tenant headers (`QosHeaders`) get the same treatment: a
//! malformed value is the default (priority 0, no tenant), never an error
//! answer.
//!
//! The fuzz targets in `fuzz/` (`.ci/fuzz.sh`) go further on the detectors
//! and the rank header alone; the property test here sends arbitrary header
//! values through the layer.
#![cfg(feature = "http")]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use futures::{FutureExt, stream};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use tower::{BoxError, Layer, Service, ServiceExt, service_fn};
use tower_admission::detect::OpenAiSse;
use tower_admission::http::Priority;
use tower_admission::{
    AdmissionConfig, AdmissionLayer, Descriptor, EngineCapacity, Gate, QosHeaders, RankHeader,
    Snapshot, Tenant,
};

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::{admitted_with, assert_idle, counts};

const PATIENCE: Duration = Duration::from_secs(10);
const RANKS: usize = 4;

/// Where the gate counted the one request in flight.
fn bucket_in_flight(snapshot: &Snapshot) -> String {
    if snapshot.unranked.engine_requests == 1 {
        return "unranked".to_owned();
    }
    match snapshot
        .ranks
        .iter()
        .position(|counts| counts.engine_requests == 1)
    {
        Some(rank) => format!("rank {rank}"),
        None => format!("nowhere: {snapshot:?}"),
    }
}

// ---- rank headers over a real socket ----

/// An axum worker of four ranks whose handler answers with the bucket the
/// gate counted its request in.
async fn bucket_server(gate: &Gate) -> SocketAddr {
    let app = Router::new()
        .route(
            "/v1/completions",
            post(|State(gate): State<Gate>| async move { bucket_in_flight(&gate.snapshot()) }),
        )
        .layer(AdmissionLayer::new(gate.clone()).rank(RankHeader::default()))
        .with_state(gate.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Sends `head_lines` (raw header lines, no line ends) as one HTTP/1.1
/// request and reads the whole answer; returns its status and body, or
/// `None` if the connection was reset before an answer could be read (a
/// server refusing a huge head may close before reading the rest).
async fn raw_request(addr: SocketAddr, head_lines: &[Vec<u8>]) -> Option<(u16, String)> {
    let mut request = b"POST /v1/completions HTTP/1.1\r\nhost: worker\r\nconnection: close\r\ncontent-length: 0\r\n".to_vec();
    for line in head_lines {
        request.extend_from_slice(line);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"\r\n");
    let exchange = async {
        let mut socket = TcpStream::connect(addr).await.unwrap();
        let _ = socket.write_all(&request).await;
        let mut answer = Vec::new();
        let _ = socket.read_to_end(&mut answer).await;
        answer
    };
    let answer = timeout(PATIENCE, exchange).await.expect("the server hangs");
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    Some((status, body.to_owned()))
}

fn rank_line(value: &[u8]) -> Vec<u8> {
    [b"x-data-parallel-rank: ".as_slice(), value].concat()
}

/// How the worker must treat a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Rank(usize),
    Unranked,
    /// Refused by the HTTP server before the layer sees it.
    RefusedBeforeTheGate(u16),
}

fn hostile_cases() -> Vec<(&'static str, Vec<Vec<u8>>, Expect)> {
    use Expect::*;
    let one = |value: &[u8]| vec![rank_line(value)];
    vec![
        ("no header", vec![], Unranked),
        ("a reported rank", one(b"2"), Rank(2)),
        ("leading zeros", one(b"0003"), Rank(3)),
        (
            "another spelling of the name",
            vec![b"X-Data-Parallel-RANK: 1".to_vec()],
            Rank(1),
        ),
        // Whitespace around a field value is not part of it (RFC 9110 §5.5).
        ("padded with spaces", one(b"   1   "), Rank(1)),
        ("padded with tabs", one(b"\t0\t"), Rank(0)),
        ("space inside", one(b"1 2"), Unranked),
        ("empty", one(b""), Unranked),
        ("negative", one(b"-1"), Unranked),
        ("plus sign", one(b"+1"), Unranked),
        ("hexadecimal", one(b"0x1"), Unranked),
        ("exponent", one(b"1e0"), Unranked),
        ("decimal point", one(b"1.0"), Unranked),
        ("words", one(b"rank one"), Unranked),
        ("a rank the engine does not have", one(b"4"), Unranked),
        ("u32::MAX", one(b"4294967295"), Unranked),
        ("u32::MAX + 1", one(b"4294967296"), Unranked),
        ("u64 overflow", one(b"18446744073709551616"), Unranked),
        ("a thousand digits", one(&[b'9'; 1000]), Unranked),
        ("sixty thousand digits", one(&[b'1'; 60_000]), Unranked),
        ("non-UTF-8 bytes", one(b"\xff\xfe"), Unranked),
        ("a digit and a non-ASCII byte", one(b"1\x80"), Unranked),
        ("an Arabic-Indic digit", one("٣".as_bytes()), Unranked),
        (
            "repeated, equal",
            vec![rank_line(b"1"), rank_line(b"1")],
            Unranked,
        ),
        (
            "repeated, different",
            vec![rank_line(b"1"), rank_line(b"2")],
            Unranked,
        ),
        (
            "repeated fifty times",
            (0..50).map(|_| rank_line(b"3")).collect(),
            Unranked,
        ),
        (
            "repeated, one empty",
            vec![rank_line(b"2"), rank_line(b"")],
            Unranked,
        ),
        ("comma-separated list", one(b"1,2"), Unranked),
        // The HTTP server refuses these; the gate never sees them.
        ("a NUL byte", one(b"1\x002"), RefusedBeforeTheGate(400)),
        (
            "a bare carriage return",
            one(b"1\r2"),
            RefusedBeforeTheGate(400),
        ),
        (
            "a folded line",
            vec![rank_line(b"1"), b" 2".to_vec()],
            RefusedBeforeTheGate(400),
        ),
        (
            "a megabyte of digits",
            one(&vec![b'7'; 1 << 20]),
            RefusedBeforeTheGate(431),
        ),
        (
            "two hundred headers",
            (0..200).map(|_| rank_line(b"0")).collect(),
            RefusedBeforeTheGate(431),
        ),
    ]
}

#[tokio::test]
async fn hostile_rank_headers_over_a_real_socket_are_treated_as_documented() {
    let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(2, RANKS)));
    let addr = bucket_server(&gate).await;

    let mut reached = 0;
    let mut unranked = 0;
    let mut per_rank = [0u64; RANKS];
    for (name, lines, expect) in hostile_cases() {
        let before = gate.snapshot().tally.received;
        let answer = raw_request(addr, &lines).await;
        let after = gate.snapshot();
        let shown = answer
            .as_ref()
            .map(|(status, body)| (status, &body[..body.len().min(40)]));
        println!("{name}: {shown:?}");
        let answered = |expected: &str| {
            let (status, body) = answer
                .clone()
                .unwrap_or_else(|| panic!("{name}: the connection was reset"));
            assert_eq!((status, body.as_str()), (200, expected), "{name}");
            assert_eq!(after.tally.received, before + 1, "{name}");
        };
        match expect {
            Expect::Rank(rank) => {
                answered(&format!("rank {rank}"));
                per_rank[rank] += 1;
                reached += 1;
            }
            Expect::Unranked => {
                answered("unranked");
                unranked += 1;
                reached += 1;
            }
            Expect::RefusedBeforeTheGate(refused) => {
                if let Some((status, body)) = &answer {
                    assert_eq!(*status, refused, "{name}: {body}");
                }
                assert_eq!(after.tally.received, before, "{name} reached the gate");
            }
        }
        // The answer was read to its end: everything is released.
        assert_idle(&after);
    }

    let snapshot = gate.snapshot();
    assert_eq!(snapshot.tally.received, reached);
    assert_eq!(snapshot.tally.admitted_direct, reached);
    assert_eq!(snapshot.unranked_tally.received, unranked);
    for (rank, expected) in per_rank.iter().enumerate() {
        assert_eq!(
            snapshot.rank_tallies[rank].received, *expected,
            "rank {rank}"
        );
    }
}

// ---- rank headers through the layer, property-tested ----

/// The documented rule, written independently of the crate's parser, with
/// the worker's ranks: one value, ASCII digits only, a reported rank.
fn documented_rank(values: &[Vec<u8>]) -> Option<usize> {
    let [value] = values else { return None };
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let rank: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    (rank < RANKS as u64).then_some(rank as usize)
}

/// Header values as a router might get them wrong: digits, signs, spaces,
/// any byte a header value may hold, very long runs.
fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(b'0'..=b'9', 0..12),
        proptest::collection::vec(
            prop_oneof![b'0'..=b'9', Just(b' '), Just(b'-'), Just(b'+'), Just(b'\t')],
            0..12
        ),
        proptest::collection::vec(any::<u8>(), 0..24),
        (1usize..4096).prop_map(|len| vec![b'1'; len]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn any_rank_header_through_the_layer_is_ranked_only_as_documented(
        values in proptest::collection::vec(header_value(), 0..4),
    ) {
        let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(2, RANKS)));
        let inner = service_fn({
            let gate = gate.clone();
            move |_: Request<()>| {
                let bucket = bucket_in_flight(&gate.snapshot());
                std::future::ready(Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                    Bytes::from(bucket),
                ))))
            }
        });
        let mut service = AdmissionLayer::new(gate.clone())
            .rank(RankHeader::default())
            .layer(inner);
        let mut request = Request::new(());
        let mut sent = Vec::new();
        for value in values {
            // A value no header may hold never reaches a service.
            if let Ok(header) = HeaderValue::from_bytes(&value) {
                request.headers_mut().append(RankHeader::DEFAULT_NAME, header);
                sent.push(value);
            }
        }
        let answered = async {
            service.ready().await?;
            let response = service.call(request).await?;
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, Infallible>(String::from_utf8(body.to_vec()).unwrap())
        }
        .now_or_never()
        .expect("answered at once")
        .unwrap();
        let expected = match documented_rank(&sent) {
            Some(rank) => format!("rank {rank}"),
            None => "unranked".to_owned(),
        };
        prop_assert_eq!(answered, expected, "values {:?}", sent);
        assert_idle(&gate.snapshot());
    }
}

// ---- priority and tenant headers over a real socket ----

/// What the inner service was told about a request's quality of service,
/// the extensions the gate's descriptor is built from: `"<priority>
/// <tenant id or none>"`.
fn qos_seen<B>(req: &Request<B>) -> String {
    let priority = req.extensions().get::<Priority>().map_or(0, |p| p.0);
    match req.extensions().get::<Tenant>() {
        Some(tenant) => format!("{priority} {}", tenant.id()),
        None => format!("{priority} none"),
    }
}

async fn qos_server(gate: &Gate) -> SocketAddr {
    let app = Router::new()
        .route(
            "/v1/completions",
            post(|req: Request<AxumBody>| async move { qos_seen(&req) }),
        )
        .layer(AdmissionLayer::new(gate.clone()).qos_headers(QosHeaders::default()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn line(name: &str, value: &[u8]) -> Vec<u8> {
    [name.as_bytes(), b": ", value].concat()
}

fn priority_line(value: &[u8]) -> Vec<u8> {
    line(QosHeaders::DEFAULT_PRIORITY_NAME, value)
}

fn tenant_line(value: &[u8]) -> Vec<u8> {
    line(QosHeaders::DEFAULT_TENANT_NAME, value)
}

/// How the worker must treat a request's priority and tenant headers:
/// `Ok((priority, tenant name))`, or refused before the layer sees it.
type QosExpect = Result<(i32, Option<String>), u16>;

fn hostile_qos_cases() -> Vec<(&'static str, Vec<Vec<u8>>, QosExpect)> {
    let plain = Ok((0, None));
    let one = |value: &[u8]| vec![priority_line(value)];
    let named = |name: &str| Ok((0, Some(name.to_owned())));
    let long_name = "t".repeat(QosHeaders::MAX_TENANT_BYTES);
    vec![
        ("no headers", vec![], plain.clone()),
        ("a priority", one(b"5"), Ok((5, None))),
        ("a negative priority", one(b"-1"), Ok((-1, None))),
        ("padded with spaces", one(b"   7   "), Ok((7, None))),
        ("i32::MIN", one(b"-2147483648"), Ok((i32::MIN, None))),
        ("i32::MAX + 1", one(b"2147483648"), plain.clone()),
        ("a thousand digits", one(&[b'9'; 1000]), plain.clone()),
        ("plus sign", one(b"+5"), plain.clone()),
        ("two minus signs", one(b"--5"), plain.clone()),
        ("a lone minus sign", one(b"-"), plain.clone()),
        ("decimal point", one(b"5.0"), plain.clone()),
        ("words", one(b"high"), plain.clone()),
        ("empty", one(b""), plain.clone()),
        ("non-UTF-8 bytes", one(b"\xff\xfe"), plain.clone()),
        (
            "an Arabic-Indic digit",
            one("\u{663}".as_bytes()),
            plain.clone(),
        ),
        (
            "repeated, equal",
            vec![priority_line(b"5"), priority_line(b"5")],
            plain.clone(),
        ),
        ("a tenant", vec![tenant_line(b"acme")], named("acme")),
        (
            "a UTF-8 tenant",
            vec![tenant_line("caf\u{e9}".as_bytes())],
            named("caf\u{e9}"),
        ),
        (
            "the longest tenant",
            vec![tenant_line(long_name.as_bytes())],
            named(&long_name),
        ),
        (
            "a tenant one byte too long",
            vec![tenant_line(format!("{long_name}t").as_bytes())],
            plain.clone(),
        ),
        (
            "a non-UTF-8 tenant",
            vec![tenant_line(b"\xc3acme")],
            plain.clone(),
        ),
        ("an empty tenant", vec![tenant_line(b"")], plain.clone()),
        (
            "a tenant with a tab inside",
            vec![tenant_line(b"ac\tme")],
            plain.clone(),
        ),
        (
            "two tenants",
            vec![tenant_line(b"acme"), tenant_line(b"globex")],
            plain.clone(),
        ),
        (
            "a bad priority leaves the tenant",
            vec![priority_line(b"x"), tenant_line(b"acme")],
            named("acme"),
        ),
        ("a NUL byte", vec![tenant_line(b"ac\x00me")], Err(400)),
        (
            "a megabyte of tenant",
            vec![tenant_line(&vec![b'a'; 1 << 20])],
            Err(431),
        ),
    ]
}

#[tokio::test]
async fn hostile_priority_and_tenant_headers_over_a_real_socket_are_treated_as_documented() {
    let gate = Gate::new(AdmissionConfig::new());
    let addr = qos_server(&gate).await;
    let mut reached = 0;
    for (name, lines, expect) in hostile_qos_cases() {
        let before = gate.snapshot().tally.received;
        let answer = raw_request(addr, &lines).await;
        let after = gate.snapshot();
        match expect {
            Ok((priority, tenant)) => {
                let tenant = tenant.map_or("none".to_owned(), |name| {
                    Tenant::new(&name).id().to_string()
                });
                let (status, body) =
                    answer.unwrap_or_else(|| panic!("{name}: the connection was reset"));
                assert_eq!(
                    (status, body),
                    (200, format!("{priority} {tenant}")),
                    "{name}"
                );
                assert_eq!(after.tally.received, before + 1, "{name}");
                reached += 1;
            }
            Err(refused) => {
                if let Some((status, body)) = &answer {
                    assert_eq!(*status, refused, "{name}: {body}");
                }
                assert_eq!(after.tally.received, before, "{name} reached the gate");
            }
        }
        assert_idle(&after);
    }
    let tally = gate.snapshot().tally;
    assert_eq!((tally.received, tally.admitted_direct), (reached, reached));
}

/// The documented priority rule, written independently of the crate's
/// parser: one value, an optional `-` and ASCII digits, within `i32`.
fn documented_priority(values: &[Vec<u8>]) -> i32 {
    let [value] = values else { return 0 };
    let digits = value.strip_prefix(b"-").unwrap_or(value);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return 0;
    }
    std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse::<i32>().ok())
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_priority_header_through_the_layer_is_read_only_as_documented(
        values in proptest::collection::vec(header_value(), 0..3),
        tenants in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..3),
    ) {
        let gate = Gate::new(AdmissionConfig::new());
        let inner = service_fn(|req: Request<()>| {
            std::future::ready(Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                Bytes::from(qos_seen(&req)),
            ))))
        });
        let mut service = AdmissionLayer::new(gate.clone())
            .qos_headers(QosHeaders::default())
            .layer(inner);
        let mut request = Request::new(());
        let mut sent = Vec::new();
        for value in values {
            if let Ok(header) = HeaderValue::from_bytes(&value) {
                request.headers_mut().append(QosHeaders::DEFAULT_PRIORITY_NAME, header);
                sent.push(value);
            }
        }
        let mut sent_tenants = Vec::new();
        for value in tenants {
            if let Ok(header) = HeaderValue::from_bytes(&value) {
                request.headers_mut().append(QosHeaders::DEFAULT_TENANT_NAME, header);
                sent_tenants.push(value);
            }
        }
        let answered = async {
            service.ready().await?;
            let response = service.call(request).await?;
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, Infallible>(String::from_utf8(body.to_vec()).unwrap())
        }
        .now_or_never()
        .expect("answered at once")
        .unwrap();
        let tenant = match &sent_tenants[..] {
            [one] if !one.is_empty() && one.len() <= QosHeaders::MAX_TENANT_BYTES => {
                std::str::from_utf8(one)
                    .ok()
                    .filter(|name| !name.chars().any(char::is_control))
                    .map_or("none".to_owned(), |name| Tenant::new(name).id().to_string())
            }
            _ => "none".to_owned(),
        };
        let expected = format!("{} {tenant}", documented_priority(&sent));
        prop_assert_eq!(answered, expected, "priorities {:?}, tenants {:?}", sent, sent_tenants);
        assert_idle(&gate.snapshot());
    }
}

// ---- hostile bodies through the layer ----

type BoxBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// One request at a time, `queue` more waiting.
fn one_at_a_time(queue: usize) -> Gate {
    gate_support::gate(1, 1, queue)
}

/// A body that fails on its first poll.
struct FailsAtOnce;

impl Body for FailsAtOnce {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(Some(Err("the engine failed before any token".into())))
    }
}

/// The response body of a service that answers every request with `body()`.
async fn answer_with<B>(gate: &Gate, body: fn() -> B) -> tower_admission::http::ResponseBody<B>
where
    B: Body<Data = Bytes> + Send + 'static,
{
    let mut service = AdmissionLayer::new(gate.clone()).layer(service_fn(move |_: Request<()>| {
        std::future::ready(Ok::<_, Infallible>(Response::new(body())))
    }));
    service.ready().await.unwrap();
    service.call(Request::new(())).await.unwrap().into_body()
}

#[tokio::test]
async fn a_body_that_fails_on_its_first_poll_releases_the_capacity_at_once() {
    let gate = one_at_a_time(0);
    let mut body = answer_with(&gate, || FailsAtOnce).await;
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    let frame = body.frame().await.expect("an error frame");
    assert!(frame.is_err());
    // Released when the error surfaced, before the body is dropped.
    assert_idle(&gate.snapshot());
    drop(body);
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.tally.admitted_direct, 1);
    assert_idle(&snapshot);
}

#[tokio::test]
async fn a_body_of_trailers_only_ends_the_response_without_a_token() {
    fn trailers_only() -> BoxBody {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("13"));
        http_body_util::StreamBody::new(stream::iter([Ok::<_, BoxError>(Frame::trailers(
            trailers,
        ))]))
        .boxed_unsync()
    }
    let gate = one_at_a_time(0);
    let mut body = answer_with(&gate, trailers_only).await;
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.trailers_ref().unwrap()["grpc-status"], "13");
    assert_idle(&gate.snapshot());
    assert!(body.frame().await.is_none());
}

#[tokio::test]
async fn an_inner_error_of_a_queued_request_releases_what_it_was_given() {
    let gate = one_at_a_time(1);
    let mut service = AdmissionLayer::new(gate.clone()).layer(service_fn(|_: Request<()>| {
        std::future::ready(Err::<Response<BoxBody>, BoxError>("engine refused".into()))
    }));
    let holder = gate.acquire(None).await.unwrap();
    service.ready().await.unwrap();
    let queued = service.call(Request::new(()));
    assert_eq!(gate.snapshot().total, counts(1, 1, 1));
    drop(holder);
    let error = queued.await.expect_err("the inner service failed");
    assert_eq!(error.to_string(), "engine refused");
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.tally.admitted_queue, 1);
    assert_idle(&snapshot);
    admitted_with(&gate, Descriptor::new());
}

/// `bytes` one byte per frame, each first preceded by `empty` empty frames.
struct Trickle {
    bytes: Bytes,
    empty: usize,
    sent: usize,
}

impl Body for Trickle {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if this.empty > 0 {
            this.empty -= 1;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::new()))));
        }
        if this.sent == this.bytes.len() {
            return Poll::Ready(None);
        }
        this.sent += 1;
        Poll::Ready(Some(Ok(Frame::data(
            this.bytes.slice(this.sent - 1..this.sent),
        ))))
    }
}

const ROLE_EVENT: &[u8] =
    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
const TOKEN_EVENT: &[u8] =
    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";

#[tokio::test]
async fn a_million_one_byte_frames_end_waiting_on_the_right_byte_and_release_at_the_end() {
    const FRAMES: usize = 1_000_000;
    // Interim events, the first token at a known offset, then filler.
    let mut stream = ROLE_EVENT.repeat(1000);
    let first_token_ends = stream.len() + TOKEN_EVENT.len();
    while stream.len() < FRAMES {
        stream.extend_from_slice(TOKEN_EVENT);
    }
    let stream = Bytes::from(stream);
    let len = stream.len();

    let gate = one_at_a_time(0);
    let mut service = AdmissionLayer::new(gate.clone())
        .detector(OpenAiSse::default())
        .layer(service_fn(move |_: Request<()>| {
            let mut response = Response::new(Trickle {
                bytes: stream.clone(),
                empty: 0,
                sent: 0,
            });
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            std::future::ready(Ok::<_, Infallible>(response))
        }));
    service.ready().await.unwrap();
    let mut body = service.call(Request::new(())).await.unwrap().into_body();

    let mut read = 0;
    while let Some(frame) = body.frame().await {
        read += frame.unwrap().into_data().unwrap().len();
        // Waiting ends on the token event's last byte; the request, when
        // the body says it has ended.
        let expected = if read < first_token_ends {
            counts(1, 1, 0)
        } else {
            counts(1, 0, 0)
        };
        assert_eq!(gate.snapshot().total, expected, "after {read} bytes");
    }
    assert_eq!(read, len);
    assert_idle(&gate.snapshot());
}

#[tokio::test]
async fn a_million_empty_frames_keep_waiting_until_the_first_byte() {
    const EMPTY: usize = 1_000_000;
    let gate = one_at_a_time(0);
    let mut body = answer_with(&gate, || Trickle {
        bytes: Bytes::from_static(b"tok"),
        empty: EMPTY,
        sent: 0,
    })
    .await;
    for _ in 0..EMPTY {
        let frame = body.frame().await.unwrap().unwrap();
        assert!(frame.data_ref().unwrap().is_empty());
    }
    assert_eq!(gate.snapshot().total, counts(1, 1, 0));
    body.frame().await.unwrap().unwrap();
    assert_eq!(gate.snapshot().total, counts(1, 0, 0));
    while body.frame().await.is_some() {}
    assert_idle(&gate.snapshot());
}

// ---- hostile bodies over a real socket ----

/// A worker of one request at a time (eight may queue): `/fails` answers a
/// body that fails on its first poll, `/trickle` 20,000 one-byte frames,
/// `/trailers` a chunk and trailers, `/ok` a short answer.
async fn body_server(gate: &Gate) -> SocketAddr {
    const TRICKLE: usize = 20_000;
    let app = Router::new()
        .route(
            "/fails",
            post(|| async {
                AxumBody::from_stream(stream::iter([Err::<Bytes, BoxError>(
                    "the engine failed before any token".into(),
                )]))
            }),
        )
        .route(
            "/trickle",
            post(|| async {
                AxumBody::from_stream(stream::iter(
                    (0..TRICKLE).map(|_| Ok::<_, Infallible>(Bytes::from_static(b"x"))),
                ))
            }),
        )
        .route(
            "/trailers",
            post(|| async {
                let mut trailers = HeaderMap::new();
                trailers.insert("x-finish", HeaderValue::from_static("stop"));
                AxumBody::new(http_body_util::StreamBody::new(stream::iter([
                    Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"tok"))),
                    Ok(Frame::trailers(trailers)),
                ])))
            }),
        )
        .route("/ok", post(|| async { "done" }))
        .layer(AdmissionLayer::new(gate.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn post_to(client: &reqwest::Client, addr: SocketAddr, path: &str) -> reqwest::Result<Bytes> {
    let request = async {
        client
            .post(format!("http://{addr}{path}"))
            .send()
            .await?
            .bytes()
            .await
    };
    timeout(PATIENCE, request)
        .await
        .unwrap_or_else(|_| panic!("{path} hangs"))
}

#[tokio::test]
async fn hostile_bodies_over_a_real_socket_give_their_capacity_back() {
    let gate = one_at_a_time(8);
    let addr = body_server(&gate).await;
    let client = reqwest::Client::new();

    // The failed body cuts the connection; the next request is admitted
    // only if its capacity came back (it would wait in the queue for ever).
    assert!(post_to(&client, addr, "/fails").await.is_err());
    assert_eq!(post_to(&client, addr, "/ok").await.unwrap(), "done");

    let trickled = post_to(&client, addr, "/trickle").await.unwrap();
    assert_eq!(trickled.len(), 20_000);
    assert!(trickled.iter().all(|&byte| byte == b'x'));

    assert_eq!(post_to(&client, addr, "/trailers").await.unwrap(), "tok");
    assert_eq!(post_to(&client, addr, "/ok").await.unwrap(), "done");

    let snapshot = gate.snapshot();
    assert_eq!(snapshot.tally.received, 5);
    assert_eq!(snapshot.tally.rejected(), 0);
    assert_idle(&snapshot);
}
