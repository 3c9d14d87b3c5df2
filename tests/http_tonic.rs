//! The layer in front of a tonic server, over real TCP with a tonic client:
//! a gRPC client sees an overload as `UNAVAILABLE` (never the HTTP 529 it
//! would read as `UNKNOWN`), waiting capacity comes back at the first
//! streamed message, and a client that cancels frees what it held.
//!
//! There is no `protoc` here, so the service is written by hand with the
//! codegen-free tonic APIs: prost messages derived in place, a
//! `ServerStreamingService` served through `tonic::server::Grpc`, and a
//! client built on `tonic::client::Grpc`.
#![cfg(feature = "http")]

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::codec::Streaming;
use tonic::server::{Grpc, NamedService, ServerStreamingService};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower_admission::detect;
use tower_admission::{AdmissionLayer, Counts, Gate};

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::counts;

const PATIENCE: Duration = Duration::from_secs(10);
const GENERATE: &str = "/llm.Generator/Generate";

#[derive(Clone, PartialEq, prost::Message)]
struct GenerateRequest {
    #[prost(string, tag = "1")]
    prompt: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Token {
    #[prost(string, tag = "1")]
    text: String,
}

type Tokens = mpsc::UnboundedSender<Result<Token, Status>>;

/// The stand-in engine: each call hands the test the sender of its token
/// stream; dropping the sender ends the stream with `OK`.
#[derive(Clone)]
struct Generator {
    started: mpsc::UnboundedSender<Tokens>,
}

impl ServerStreamingService<GenerateRequest> for Generator {
    type Response = Token;
    type ResponseStream = UnboundedReceiverStream<Result<Token, Status>>;
    type Future = Ready<Result<tonic::Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, _request: tonic::Request<GenerateRequest>) -> Self::Future {
        let (tokens, stream) = mpsc::unbounded_channel();
        let _ = self.started.send(tokens);
        ready(Ok(tonic::Response::new(UnboundedReceiverStream::new(
            stream,
        ))))
    }
}

/// What `tonic-build` would generate for `service Generator { rpc
/// Generate(GenerateRequest) returns (stream Token); }`.
#[derive(Clone)]
struct GeneratorServer {
    generator: Generator,
}

impl NamedService for GeneratorServer {
    const NAME: &'static str = "llm.Generator";
}

impl tower::Service<http::Request<tonic::body::Body>> for GeneratorServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() != GENERATE {
            return Box::pin(ready(Ok(
                Status::unimplemented("no such method").into_http()
            )));
        }
        let generator = self.generator.clone();
        Box::pin(async move {
            let mut grpc = Grpc::new(ProstCodec::<Token, GenerateRequest>::default());
            Ok(grpc.server_streaming(generator, req).await)
        })
    }
}

struct Worker {
    gate: Gate,
    client: tonic::client::Grpc<Channel>,
    started: mpsc::UnboundedReceiver<Tokens>,
}

impl Worker {
    async fn start(layer: AdmissionLayer<detect::Grpc>) -> Worker {
        let gate = layer.gate().clone();
        let (started_tx, started) = mpsc::unbounded_channel();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let router = Server::builder().layer(layer).add_service(GeneratorServer {
            generator: Generator {
                started: started_tx,
            },
        });
        tokio::spawn(router.serve_with_incoming(TcpIncoming::from(listener)));

        let channel = within(
            Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect(),
        )
        .await
        .unwrap();
        Worker {
            gate,
            client: tonic::client::Grpc::new(channel),
            started,
        }
    }

    async fn generate(&self, prompt: &str) -> Result<Streaming<Token>, Status> {
        let mut client = self.client.clone();
        within(client.ready()).await.unwrap();
        let request = tonic::Request::new(GenerateRequest {
            prompt: prompt.to_owned(),
        });
        let codec = ProstCodec::<GenerateRequest, Token>::default();
        let response =
            within(client.server_streaming(request, PathAndQuery::from_static(GENERATE), codec))
                .await?;
        Ok(response.into_inner())
    }

    async fn next_started(&mut self) -> Tokens {
        within(self.started.recv())
            .await
            .expect("the server is gone")
    }

    fn total(&self) -> Counts {
        self.gate.snapshot().total
    }
}

async fn within<F: Future>(future: F) -> F::Output {
    timeout(PATIENCE, future)
        .await
        .expect("timed out waiting for the server")
}

fn grpc_layer(gate: Gate) -> AdmissionLayer<detect::Grpc> {
    AdmissionLayer::new(gate).detector(detect::Grpc::default())
}

fn token(text: &str) -> Result<Token, Status> {
    Ok(Token {
        text: text.to_owned(),
    })
}

fn one_at_a_time() -> Gate {
    gate_support::gate(1, 1, 0)
}

#[tokio::test]
async fn an_overloaded_worker_answers_grpc_clients_with_unavailable() {
    let mut worker = Worker::start(grpc_layer(one_at_a_time())).await;

    let mut stream = worker.generate("first").await.unwrap();
    let tokens = worker.next_started().await;
    // Response headers have reached the client; they are not a token.
    assert_eq!(worker.total(), counts(1, 1, 0));

    let status = worker.generate("second").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("overloaded"), "{status:?}");
    let metadata = status.metadata();
    assert_eq!(
        metadata.get("x-admission-rejection-scope").unwrap(),
        "worker"
    );
    assert_eq!(metadata.get("grpc-retry-pushback-ms").unwrap(), "1000");

    // The first message ends waiting; the request is still running.
    tokens.send(token("Hello")).unwrap();
    let message = within(stream.message()).await.unwrap().unwrap();
    assert_eq!(message.text, "Hello");
    assert_eq!(worker.total(), counts(1, 0, 0));

    // The stream ends with trailers (`grpc-status: 0`): released.
    drop(tokens);
    assert!(within(stream.message()).await.unwrap().is_none());
    assert_eq!(worker.total(), counts(0, 0, 0));

    let tally = worker.gate.snapshot().tally;
    assert_eq!((tally.admitted_direct, tally.rejected_worker), (1, 1));
}

#[tokio::test]
async fn the_grpc_overload_code_reaches_the_client() {
    let layer = AdmissionLayer::new(one_at_a_time())
        .detector(detect::Grpc::default())
        .grpc_overload_code(Code::ResourceExhausted as i32);
    let mut worker = Worker::start(layer).await;

    let _first = worker.generate("first").await.unwrap();
    let _tokens = worker.next_started().await;
    let status = worker.generate("second").await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
}

#[tokio::test]
async fn a_grpc_client_that_cancels_frees_its_capacity() {
    let mut worker = Worker::start(grpc_layer(one_at_a_time())).await;

    let stream = worker.generate("first").await.unwrap();
    let tokens = worker.next_started().await;
    assert_eq!(worker.total(), counts(1, 1, 0));

    // Dropping the stream resets the HTTP/2 stream; the server drops the
    // response body, which closes the engine's token channel.
    drop(stream);
    within(tokens.closed()).await;
    assert_eq!(worker.total(), counts(0, 0, 0));

    // The freed capacity admits the next call.
    let mut stream = worker.generate("second").await.unwrap();
    let tokens = worker.next_started().await;
    tokens.send(token("again")).unwrap();
    assert_eq!(
        within(stream.message()).await.unwrap().unwrap().text,
        "again"
    );
}
