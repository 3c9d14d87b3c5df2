//! A gRPC token-streaming service on the simulated engine, behind the gate,
//! and a client for it.
//!
//! ```text
//! cargo run -p tower-admission-sim --example tonic_server -- serve --max-num-seqs 2 --request-queue-limit 0
//! cargo run -p tower-admission-sim --example tonic_server -- client --prompt "Hello" --max-tokens 16
//! cargo run -p tower-admission-sim --example tonic_server -- client --concurrent 8 --max-tokens 500
//! ```
//!
//! The service is what `tonic-build` would generate for
//!
//! ```proto
//! package llm;
//! service Generator { rpc Generate(GenerateRequest) returns (stream GenerateResponse); }
//! message GenerateRequest { string prompt = 1; optional uint32 max_tokens = 2; }
//! message GenerateResponse { string text = 1; uint32 index = 2; string finish_reason = 3; }
//! ```
//!
//! written by hand (prost messages derived in place, a
//! `ServerStreamingService` served through `tonic::server::Grpc`), so no
//! `protoc` is needed. The gate's waiting capacity ends at the first
//! streamed message ([`Grpc`] detector); the rank comes from the
//! `x-data-parallel-rank` metadata, the priority and tenant (behaviour §8) from
//! `x-admission-priority` and `x-admission-tenant`, as the OpenAI example's
//! headers. A rejected call gets a trailers-only
//! `UNAVAILABLE`, never an HTTP 529 that a gRPC client would read as
//! `UNKNOWN`.
//!
//! With `--metrics-listen ADDRESS`, `serve` also answers `GET /metrics`
//! (Prometheus text: the gate's series, named with `--metrics-prefix`) on
//! that separate address, outside the gRPC server and its gate: an
//! overloaded worker still answers its scrapes. It needs the crate's
//! `metrics` feature (on by default).
//!
//! ```text
//! cargo run -p tower-admission-sim --example tonic_server -- serve --metrics-listen 127.0.0.1:9100
//! curl localhost:9100/metrics
//! ```
//!
//! `serve` prints `listening on http://ADDRESS` as its first line (and,
//! with `--metrics-listen`, `metrics on http://ADDRESS/metrics` after the
//! banner) and stops on Ctrl-C or SIGTERM. `client` prints the tokens on stdout as they
//! arrive and a summary on stderr; it exits with 3 when the server was
//! overloaded, 1 on any other failure. With `--concurrent N` it sends N
//! calls at once and prints one line per call.

mod common;

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::io::Write as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use futures::{Stream, StreamExt};
use http::uri::PathAndQuery;
use tonic::codec::Streaming;
use tonic::metadata::MetadataValue;
use tonic::server::{Grpc as GrpcServer, NamedService, ServerStreamingService};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower_admission::detect::Grpc;
use tower_admission::{AdmissionArgs, AdmissionLayer, Describe, Gate, QosHeaders, RankHeader};
use tower_admission_sim::{Request as EngineRequest, SimEngine};

use common::EngineArgs;

const SERVICE: &str = "llm.Generator";
const GENERATE: &str = "/llm.Generator/Generate";

/// Exit status of a client whose call the server rejected as overloaded.
const EXIT_OVERLOADED: u8 = 3;

#[derive(Clone, PartialEq, prost::Message)]
struct GenerateRequest {
    #[prost(string, tag = "1")]
    prompt: String,
    /// Tokens to generate; unset: the server's default (finish reason
    /// "stop").
    #[prost(uint32, optional, tag = "2")]
    max_tokens: Option<u32>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct GenerateResponse {
    #[prost(string, tag = "1")]
    text: String,
    #[prost(uint32, tag = "2")]
    index: u32,
    /// Empty except on the last message: "stop" or "length".
    #[prost(string, tag = "3")]
    finish_reason: String,
}

/// A gRPC token-streaming service on a simulated engine, behind
/// tower-admission's gate, and its client.
#[derive(Debug, Parser)]
#[command(name = "tonic_server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
// Parsed once at start-up: the size of the admission flags does not matter.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Serve llm.Generator/Generate
    Serve(ServeArgs),
    /// Call a running server and stream its tokens
    Client(ClientArgs),
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Address to listen on; port 0 picks a free port (printed on the
    /// first line of stdout)
    #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,

    #[command(flatten)]
    engine: EngineArgs,

    #[command(flatten)]
    admission: AdmissionArgs,

    /// Serve without the gate, to compare
    #[arg(long)]
    no_admission: bool,

    /// Also serve GET /metrics (Prometheus text) on this separate address;
    /// port 0 picks a free port (printed after the banner)
    #[arg(long, value_name = "ADDRESS")]
    metrics_listen: Option<SocketAddr>,

    /// Prefix of the gate's metric names (dynamo_backend_admission gives the
    /// source system's names)
    #[arg(long, value_name = "PREFIX", default_value = exporter::DEFAULT_PREFIX)]
    metrics_prefix: String,
}

#[derive(Debug, Clone, clap::Args)]
struct ClientArgs {
    /// The server's URL
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:50051")]
    addr: String,

    /// The prompt
    #[arg(long, default_value = "Hello")]
    prompt: String,

    /// Tokens to generate [default: the server's]
    #[arg(long, value_name = "N")]
    max_tokens: Option<u32>,

    /// Data-parallel rank to ask for (x-data-parallel-rank metadata)
    #[arg(long, value_name = "RANK")]
    rank: Option<u32>,

    /// Calls to make at once; above 1, one summary line per call instead of
    /// the tokens
    #[arg(long, value_name = "N", default_value = "1")]
    concurrent: std::num::NonZeroUsize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Serve(args) => {
            common::init_logging();
            runtime.block_on(serve(args))
        }
        Command::Client(args) => runtime.block_on(client(args)),
    }
}

// ---------------------------------------------------------------------------
// Server

/// One call's view of the engine.
#[derive(Clone)]
struct Generator {
    engine: SimEngine,
    engine_args: Arc<EngineArgs>,
    /// The rank the gate counted the call on, if the engine has it.
    rank: Option<u32>,
}

type TokenMessages = Pin<Box<dyn Stream<Item = Result<GenerateResponse, Status>> + Send>>;

impl ServerStreamingService<GenerateRequest> for Generator {
    type Response = GenerateResponse;
    type ResponseStream = TokenMessages;
    type Future = Ready<Result<tonic::Response<TokenMessages>, Status>>;

    fn call(&mut self, request: tonic::Request<GenerateRequest>) -> Self::Future {
        ready(self.generate(request.into_inner()))
    }
}

impl Generator {
    fn generate(&self, request: GenerateRequest) -> Result<tonic::Response<TokenMessages>, Status> {
        let prompt_tokens = common::estimate_tokens(&request.prompt);
        let plan = self
            .engine_args
            .plan(prompt_tokens, request.max_tokens.map(u64::from))
            .map_err(Status::invalid_argument)?;
        let tokens = self
            .engine
            .submit(EngineRequest {
                prompt_tokens: plan.prompt_tokens,
                output_tokens: plan.output_tokens,
                rank: self.rank,
            })
            .map_err(|error| Status::unavailable(error.to_string()))?;
        let finish_reason = plan.finish_reason.as_str();
        // Dropping the stream (the client went away) cancels the request in
        // the engine.
        let messages = tokens.map(move |token| {
            Ok(GenerateResponse {
                text: common::token_text(token.index),
                index: u32::try_from(token.index).unwrap_or(u32::MAX),
                finish_reason: if token.last { finish_reason } else { "" }.to_owned(),
            })
        });
        Ok(tonic::Response::new(Box::pin(messages)))
    }
}

/// What `tonic-build` would generate for the service: routes the one
/// method, answers others with `UNIMPLEMENTED`.
#[derive(Clone)]
struct GeneratorServer {
    engine: SimEngine,
    engine_args: Arc<EngineArgs>,
    rank: RankHeader,
}

impl NamedService for GeneratorServer {
    const NAME: &'static str = SERVICE;
}

impl tower::Service<http::Request<tonic::body::Body>> for GeneratorServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != GENERATE {
            let status = Status::unimplemented(format!("no method {}", request.uri().path()));
            return Box::pin(ready(Ok(status.into_http())));
        }
        // The gate's describer: the engine runs the call on the rank the
        // gate counted it on (an unknown rank is unranked for both).
        let ranks = self.engine.config().dp_ranks;
        let rank = self
            .rank
            .descriptor(&request)
            .rank
            .filter(|&rank| (rank as usize) < ranks);
        let generator = Generator {
            engine: self.engine.clone(),
            engine_args: Arc::clone(&self.engine_args),
            rank,
        };
        Box::pin(async move {
            let mut grpc =
                GrpcServer::new(ProstCodec::<GenerateResponse, GenerateRequest>::default());
            Ok(grpc.server_streaming(generator, request).await)
        })
    }
}

async fn serve(args: ServeArgs) -> ExitCode {
    // The recorder must be installed before the gate registers its series.
    let metrics = match args.metrics_listen {
        Some(address) => match exporter::MetricsEndpoint::bind(address).await {
            Ok(endpoint) => Some(endpoint),
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let engine = args.engine.start();
    let rank = RankHeader::default();
    let service = GeneratorServer {
        engine: engine.clone(),
        engine_args: Arc::new(args.engine.clone()),
        rank: rank.clone(),
    };
    let (layer, admission, gate) = if args.no_admission {
        (None, "admission: off (--no-admission)".to_owned(), None)
    } else {
        let config = exporter::with_prefix(args.admission.resolve(), &args.metrics_prefix);
        let gate = Gate::new(config);
        engine.report_to(&gate);
        let limits = gate.limits_in_force().per_rank;
        let layer = AdmissionLayer::new(gate.clone())
            .detector(Grpc::default())
            .rank(rank)
            .qos_headers(QosHeaders::default())
            // A call whose own deadline passes while it waits in the queue
            // is answered DEADLINE_EXCEEDED at once.
            .grpc_timeout();
        let banner = format!(
            "admission: per rank engine request limit {}, engine request waiting limit {}, \
             request queue limit {}; overload answer UNAVAILABLE\n\
             admission limits in force: {}",
            limits.engine_request_limit,
            limits.engine_request_waiting_limit,
            limits.request_queue_limit,
            gate.limits_in_force(),
        );
        (Some(layer), banner, Some(gate))
    };

    let (listener, address, shutdown) = match common::bind(args.listen).await {
        Ok(bound) => bound,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("listening on http://{address}");
    println!("{}", args.engine.describe());
    println!("{admission}");
    println!("service: {GENERATE} (server streaming)");
    if let Some(metrics) = metrics {
        println!("metrics on http://{}/metrics", metrics.address());
        tokio::spawn(metrics.serve(gate));
    }

    let incoming = TcpIncoming::from(listener);
    let served = common::serve_until_shutdown(shutdown, |signal| async move {
        match layer {
            Some(layer) => {
                Server::builder()
                    .layer(layer)
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, signal)
                    .await
            }
            None => {
                Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, signal)
                    .await
            }
        }
    })
    .await;
    match served {
        Ok(()) => {
            eprintln!("stopped");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: the server failed: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `GET /metrics` on its own address, outside the gRPC server and its
/// gate.
mod exporter {
    use std::net::SocketAddr;
    use std::time::Duration;

    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
    use tower_admission::{AdmissionConfig, Gate};

    pub use tower_admission::metrics::DEFAULT_PREFIX;

    /// The gate's metric names start with `prefix`.
    pub fn with_prefix(config: AdmissionConfig, prefix: &str) -> AdmissionConfig {
        config.metrics_prefix(prefix)
    }

    pub struct MetricsEndpoint {
        listener: tokio::net::TcpListener,
        address: SocketAddr,
        handle: PrometheusHandle,
    }

    impl MetricsEndpoint {
        /// Binds `address` and installs the Prometheus recorder (before the
        /// gate is built, so that it registers its series there).
        pub async fn bind(address: SocketAddr) -> Result<MetricsEndpoint, String> {
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .map_err(|error| {
                    format!("cannot listen on {address} (--metrics-listen): {error}")
                })?;
            let address = listener
                .local_addr()
                .map_err(|error| format!("no local address for --metrics-listen: {error}"))?;
            // Histograms (not summaries) for the `_seconds` series, with the
            // buckets of the OpenAI example.
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("_seconds".into()),
                    &tower_admission::metrics::SECONDS_BUCKETS,
                )
                .and_then(PrometheusBuilder::install_recorder)
                .map_err(|error| format!("cannot install the Prometheus recorder: {error}"))?;
            let upkeep = handle.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_secs(5));
                loop {
                    every.tick().await;
                    upkeep.run_upkeep();
                }
            });
            Ok(MetricsEndpoint {
                listener,
                address,
                handle,
            })
        }

        /// The address it listens on.
        pub fn address(&self) -> SocketAddr {
            self.address
        }

        /// Answers scrapes until the process ends; refreshes the
        /// time-dependent gauges of `gate` (if admission is on) first.
        pub async fn serve(self, gate: Option<Gate>) {
            let handle = self.handle;
            let router = axum::Router::new().route(
                "/metrics",
                axum::routing::get(move || {
                    if let Some(gate) = &gate {
                        gate.refresh_metrics();
                    }
                    let text = handle.render();
                    async move {
                        (
                            [(
                                http::header::CONTENT_TYPE,
                                "text/plain; version=0.0.4; charset=utf-8",
                            )],
                            text,
                        )
                    }
                }),
            );
            if let Err(error) = axum::serve(self.listener, router).await {
                eprintln!("error: the metrics endpoint failed: {error}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Client

/// How one call ended.
enum Outcome {
    Completed {
        tokens: usize,
        finish_reason: String,
        first_token: Option<Duration>,
        total: Duration,
    },
    Overloaded(Status),
    Failed(Status),
}

impl Outcome {
    fn of(status: Status) -> Outcome {
        if status.code() == Code::Unavailable
            && status
                .metadata()
                .contains_key("x-admission-rejection-scope")
        {
            Outcome::Overloaded(status)
        } else {
            Outcome::Failed(status)
        }
    }

    fn describe(&self) -> String {
        match self {
            Outcome::Completed {
                tokens,
                finish_reason,
                first_token,
                total,
            } => {
                let first = first_token.map_or("-".to_owned(), |t| format!("{t:.2?}"));
                format!(
                    "completed: {tokens} tokens, finish_reason {finish_reason:?}, \
                     first token after {first}, total {total:.2?}"
                )
            }
            Outcome::Overloaded(status) => {
                let metadata = status.metadata();
                let header = |name: &str| {
                    metadata
                        .get(name)
                        .and_then(|value| value.to_str().ok())
                        .map(str::to_owned)
                };
                let mut text = format!(
                    "overloaded (UNAVAILABLE, {} scope",
                    header("x-admission-rejection-scope").unwrap_or_default()
                );
                if let Some(rank) = header("x-admission-rank") {
                    text.push_str(&format!(", rank {rank}"));
                }
                text.push_str(&format!("): {}", status.message()));
                if let Some(pushback) = header("grpc-retry-pushback-ms") {
                    text.push_str(&format!("; retry after {pushback} ms"));
                }
                text
            }
            Outcome::Failed(status) => {
                format!("failed: {:?}: {}", status.code(), status.message())
            }
        }
    }
}

async fn client(args: ClientArgs) -> ExitCode {
    let endpoint = match Endpoint::from_shared(args.addr.clone()) {
        Ok(endpoint) => endpoint.connect_timeout(Duration::from_secs(5)),
        Err(error) => {
            eprintln!("error: {:?} is not a valid URL: {error}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    let channel = match endpoint.connect().await {
        Ok(channel) => channel,
        Err(error) => {
            eprintln!("error: cannot connect to {}: {error}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    let client = tonic::client::Grpc::new(channel);

    let outcomes = if args.concurrent.get() == 1 {
        let outcome = call(client, &args, true).await;
        if matches!(outcome, Outcome::Completed { .. }) {
            println!();
        }
        eprintln!("{}", outcome.describe());
        vec![outcome]
    } else {
        let calls = (0..args.concurrent.get()).map(|_| call(client.clone(), &args, false));
        let outcomes = futures::future::join_all(calls).await;
        for (number, outcome) in outcomes.iter().enumerate() {
            println!("call {number}: {}", outcome.describe());
        }
        let count = |f: fn(&Outcome) -> bool| outcomes.iter().filter(|o| f(o)).count();
        println!(
            "{} completed, {} overloaded, {} failed",
            count(|o| matches!(o, Outcome::Completed { .. })),
            count(|o| matches!(o, Outcome::Overloaded(_))),
            count(|o| matches!(o, Outcome::Failed(_))),
        );
        outcomes
    };
    if outcomes.iter().any(|o| matches!(o, Outcome::Failed(_))) {
        ExitCode::FAILURE
    } else if outcomes.iter().any(|o| matches!(o, Outcome::Overloaded(_))) {
        ExitCode::from(EXIT_OVERLOADED)
    } else {
        ExitCode::SUCCESS
    }
}

/// Makes one call and reads its stream to the end, printing each token
/// as it arrives when `print` is set.
async fn call(mut client: tonic::client::Grpc<Channel>, args: &ClientArgs, print: bool) -> Outcome {
    let start = Instant::now();
    let mut stream = match open(&mut client, args).await {
        Ok(stream) => stream,
        Err(status) => return Outcome::of(status),
    };
    let mut tokens = 0;
    let mut first_token = None;
    let mut finish_reason = String::new();
    loop {
        match stream.message().await {
            Ok(Some(message)) => {
                first_token.get_or_insert_with(|| start.elapsed());
                tokens += 1;
                if print {
                    let mut stdout = std::io::stdout().lock();
                    let _ = stdout.write_all(message.text.as_bytes());
                    let _ = stdout.flush();
                }
                if !message.finish_reason.is_empty() {
                    finish_reason = message.finish_reason;
                }
            }
            Ok(None) => break,
            Err(status) => return Outcome::of(status),
        }
    }
    Outcome::Completed {
        tokens,
        finish_reason,
        first_token,
        total: start.elapsed(),
    }
}

async fn open(
    client: &mut tonic::client::Grpc<Channel>,
    args: &ClientArgs,
) -> Result<Streaming<GenerateResponse>, Status> {
    client
        .ready()
        .await
        .map_err(|error| Status::unavailable(format!("the connection failed: {error}")))?;
    let mut request = tonic::Request::new(GenerateRequest {
        prompt: args.prompt.clone(),
        max_tokens: args.max_tokens,
    });
    if let Some(rank) = args.rank {
        request
            .metadata_mut()
            .insert(RankHeader::DEFAULT_NAME, MetadataValue::from(rank));
    }
    let codec = ProstCodec::<GenerateRequest, GenerateResponse>::default();
    let response = client
        .server_streaming(request, PathAndQuery::from_static(GENERATE), codec)
        .await?;
    Ok(response.into_inner())
}
