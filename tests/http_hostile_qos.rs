//! Hostile priority and tenant headers (`QosHeaders`) through the real
//! layer, over a real socket and property-tested: a malformed value is the
//! default (priority 0, no tenant), never an error answer; nothing panics,
//! and the gate ends empty.

#![cfg(feature = "http")]

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::Router;
use axum::body::Body as AxumBody;
use axum::routing::post;
use bytes::Bytes;
use futures::FutureExt;
use http::{HeaderValue, Request, Response};
use http_body_util::BodyExt;
use proptest::prelude::*;
use tokio::net::TcpListener;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_admission::http::Priority;
use tower_admission::{AdmissionConfig, AdmissionLayer, Gate, QosHeaders, Tenant};

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::assert_idle;

#[path = "support/hostile_http.rs"]
mod hostile_http;
use hostile_http::{header_value, raw_request};

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
