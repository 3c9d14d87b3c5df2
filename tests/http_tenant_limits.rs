//! The HTTP answer to a tenant over its limit: status 429 by default (the
//! worker has room for other tenants), scope `tenant`, reason
//! `tenant_limit`, a `Retry-After`, and an OpenAI-style JSON body; the
//! status is configurable.
#![cfg(feature = "http")]

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio_test::{assert_pending, assert_ready, assert_ready_ok, task};
use tower_admission::{AdmissionConfig, AdmissionLayer, Descriptor, Gate, Tenant};
use tower_test::mock;

type Reply = Response<Full<Bytes>>;

/// A request of the tenant named in its `x-tenant` header.
fn of(tenant: &str) -> Request<()> {
    Request::builder()
        .header("x-tenant", tenant)
        .body(())
        .unwrap()
}

fn tenant_of(request: &Request<()>, descriptor: &mut Descriptor) {
    if let Some(name) = request
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
    {
        descriptor.tenant = Some(Tenant::new(name));
    }
}

/// One engine slot, tenants limited to one request and none queued.
fn gate() -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(2)
            .request_queue_limit(10)
            .tenant_request_limit(1)
            .tenant_queue_limit(0),
    )
}

async fn body_json<B>(response: Response<B>) -> serde_json::Value
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn a_tenant_over_its_limit_gets_429_scoped_to_the_tenant() {
    let gate = gate();
    let layer = AdmissionLayer::new(gate.clone()).describe(tenant_of);
    let (mut service, mut engine) = mock::spawn_layer::<Request<()>, Reply, _>(layer);

    assert_ready_ok!(service.poll_ready());
    let mut first = task::spawn(service.call(of("a")));
    assert_pending!(first.poll());
    assert_ready!(engine.poll_request()).expect("a's first request reaches the engine");

    assert_ready_ok!(service.poll_ready());
    let refused = service
        .call(of("a"))
        .await
        .expect("an answer, not an error");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let headers = refused.headers();
    assert_eq!(headers["x-admission-rejection-scope"], "tenant");
    assert_eq!(headers["x-admission-rejection-reason"], "tenant_limit");
    assert_eq!(headers["retry-after"], "1");
    assert!(headers.get("x-admission-rank").is_none());
    let json = body_json(refused).await;
    assert_eq!(json["error"]["code"], 429);
    assert_eq!(json["error"]["scope"], "tenant");
    assert_eq!(json["error"]["reason"], "tenant_limit");
    assert_eq!(json["error"]["type"], "overloaded");

    // Another tenant still gets in: the worker has room.
    assert_ready_ok!(service.poll_ready());
    let mut other = task::spawn(service.call(of("b")));
    assert_pending!(other.poll());
    assert_ready!(engine.poll_request()).expect("b reaches the engine");
    assert_eq!(gate.snapshot().tally.rejected_tenant, 1);
}

#[tokio::test]
async fn the_tenant_status_is_configurable_apart_from_the_overload_status() {
    let gate = gate();
    let layer = AdmissionLayer::new(gate.clone())
        .describe(tenant_of)
        .overload_status(StatusCode::SERVICE_UNAVAILABLE)
        .tenant_overload_status(StatusCode::FORBIDDEN);
    let (mut service, mut engine) = mock::spawn_layer::<Request<()>, Reply, _>(layer);

    assert_ready_ok!(service.poll_ready());
    let mut first = task::spawn(service.call(of("a")));
    assert_pending!(first.poll());
    assert_ready!(engine.poll_request()).expect("admitted");
    assert_ready_ok!(service.poll_ready());
    let refused = service.call(of("a")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(body_json(refused).await["error"]["code"], 403);
}

#[tokio::test]
async fn a_layer_that_sends_no_retry_after_sends_none_to_a_tenant_either() {
    let gate = gate();
    let layer = AdmissionLayer::new(gate.clone())
        .describe(tenant_of)
        .retry_after(None);
    let (mut service, mut engine) = mock::spawn_layer::<Request<()>, Reply, _>(layer);

    assert_ready_ok!(service.poll_ready());
    let mut first = task::spawn(service.call(of("a")));
    assert_pending!(first.poll());
    assert_ready!(engine.poll_request()).expect("admitted");
    assert_ready_ok!(service.poll_ready());
    let refused = service.call(of("a")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers().get("retry-after").is_none());
}
