//! The smallest useful gRPC server: one unary method behind admission
//! control, tonic's health service beside it, bypassing the gate.
//!
//! Run: `cargo run --example tonic_minimal [ADDRESS]` (default
//! `127.0.0.1:50051`). At most 4 calls run at once
//! and 8 wait; the 13th gets `UNAVAILABLE`, while health checks
//! (`grpc.health.v1.Health`) always answer.

use std::convert::Infallible;
use std::time::Duration;

use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;
use tower_admission::http::BypassPaths;
use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};

#[derive(Clone, PartialEq, prost::Message)]
struct Prompt {
    #[prost(string, tag = "1")]
    text: String,
}

/// The `demo.Completer` service: `rpc Complete(Prompt) returns (Prompt)`.
#[derive(Clone)]
struct Completer;

impl NamedService for Completer {
    const NAME: &'static str = "demo.Completer";
}

impl UnaryService<Prompt> for Completer {
    type Response = Prompt;
    type Future = BoxFuture<Response<Prompt>, Status>;

    fn call(&mut self, request: Request<Prompt>) -> Self::Future {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(500)).await; // "generating"
            let text = format!("{} ... and so on", request.into_inner().text);
            Ok(Response::new(Prompt { text }))
        })
    }
}

impl tower::Service<http::Request<Body>> for Completer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let mut grpc = Grpc::new(ProstCodec::<Prompt, Prompt>::default());
        Box::pin(async move { Ok(grpc.unary(Completer, request).await) })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(4)
            .request_queue_limit(8),
    );
    let limits = gate.limits_in_force();
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<Completer>().await;

    let address = std::env::args().nth(1).unwrap_or("127.0.0.1:50051".into());
    let listener = tokio::net::TcpListener::bind(address).await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!("admission: {limits}");
    tonic::transport::Server::builder()
        // Around the whole server; health checks and reflection skip the gate.
        .layer(AdmissionLayer::new(gate).bypass(BypassPaths::grpc_health_and_reflection()))
        .add_service(health_service)
        .add_service(Completer)
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
        .await?;
    Ok(())
}
