//! tonic's own health service (`tonic-health`) behind admission, over real
//! sockets: added per service (`Admission` is a `NamedService`, feature
//! `tonic`), health checks pass while the gate has room and get
//! `UNAVAILABLE` when it is full; wrapping the whole server, health checks
//! can bypass the gate.
#![cfg(feature = "tonic")]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::timeout;
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::server::health_reporter;
use tower::Layer;
use tower_admission::http::BypassPaths;
use tower_admission::{AdmissionConfig, AdmissionLayer, Gate, Permit};

const PATIENCE: Duration = Duration::from_secs(10);

fn one_at_a_time() -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .engine_request_waiting_limit(1)
            .request_queue_limit(0),
    )
}

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = timeout(
        PATIENCE,
        Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect(),
    )
    .await
    .expect("timed out connecting")
    .unwrap();
    HealthClient::new(channel)
}

async fn check(client: &mut HealthClient<Channel>) -> Result<ServingStatus, tonic::Status> {
    let request = HealthCheckRequest {
        service: String::new(),
    };
    let response = timeout(PATIENCE, client.check(request))
        .await
        .expect("timed out waiting for the health check")?;
    Ok(response.into_inner().status())
}

/// Takes the gate's only place, as a running request would.
async fn fill(gate: &Gate) -> Permit {
    gate.acquire(None).await.expect("the gate had room")
}

#[tokio::test]
async fn an_admitted_service_is_added_by_its_own_name() {
    let gate = one_at_a_time();
    let (_reporter, health) = health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Compiles only if `Admission<HealthServer<_>>` is a `NamedService`.
    let router = Server::builder().add_service(AdmissionLayer::new(gate.clone()).layer(health));
    tokio::spawn(router.serve_with_incoming(TcpIncoming::from(listener)));
    let mut client = client(addr).await;

    assert_eq!(check(&mut client).await.unwrap(), ServingStatus::Serving);
    assert_eq!(gate.snapshot().tally.admitted_direct, 1);
    assert_eq!(
        gate.snapshot().total.engine_requests,
        0,
        "released at the end"
    );

    let permit = fill(&gate).await;
    let status = check(&mut client).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(
        status
            .metadata()
            .get("x-admission-rejection-scope")
            .unwrap(),
        "worker"
    );
    drop(permit);
    assert_eq!(check(&mut client).await.unwrap(), ServingStatus::Serving);
}

#[tokio::test]
async fn health_checks_bypass_a_gate_around_the_whole_server() {
    for bypass in [true, false] {
        let gate = one_at_a_time();
        let (_reporter, health) = health_reporter();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let layer = AdmissionLayer::new(gate.clone()).bypass(if bypass {
            BypassPaths::grpc_health_and_reflection()
        } else {
            BypassPaths::new(Vec::<String>::new())
        });
        let router = Server::builder().layer(layer).add_service(health);
        tokio::spawn(router.serve_with_incoming(TcpIncoming::from(listener)));
        let mut client = client(addr).await;

        let _permit = fill(&gate).await;
        let checked = check(&mut client).await;
        if bypass {
            assert_eq!(checked.unwrap(), ServingStatus::Serving);
            assert_eq!(
                gate.snapshot().tally.received,
                1,
                "only the filling request"
            );
        } else {
            assert_eq!(checked.unwrap_err().code(), Code::Unavailable);
        }
    }
}
