//! Hostile rank headers through the real layer: values no router should
//! send (huge, signed, non-numeric, non-UTF-8, repeated, padded, too large
//! for the server) written byte for byte to a real axum server over TCP,
//! and arbitrary values property-tested through the layer. Each request is
//! treated as documented (`RankHeader`: one plain decimal number of a
//! reported rank, else unranked), nothing panics, and the gate ends empty
//! with every request accounted for.
//!
//! The fuzz targets in `fuzz/` (`.ci/fuzz.sh`) go further on the detectors
//! and the rank header alone. Priority and tenant headers are in
//! `http_hostile_qos.rs`, hostile bodies in `http_hostile_bodies.rs`.

#![cfg(feature = "http")]

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use futures::FutureExt;
use http::{HeaderValue, Request, Response};
use http_body_util::BodyExt;
use proptest::prelude::*;
use tokio::net::TcpListener;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_admission::{
    AdmissionConfig, AdmissionLayer, EngineCapacity, Gate, RankHeader, Snapshot,
};

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::assert_idle;

#[path = "support/hostile_http.rs"]
mod hostile_http;
use hostile_http::{header_value, raw_request};

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
