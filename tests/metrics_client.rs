//! The client's view of behaviour §6, over real TCP: the HTTP layer measures
//! each admitted request from its arrival to its first content token (the
//! queue wait included), the gaps between its content chunks, and its whole
//! duration, and counts it finished — and as goodput when it met the TTFT
//! objective, the inter-token objective and its own deadline. Labels are
//! the configured priority bands and tenant classes only, whatever tenants
//! clients send.
//!
//! The clock is tokio's, paused, and given to the gate: time passes only
//! when the test advances it, between explicit steps (a frame read by the
//! client, a request counted by the gate), so every duration is exact.
#![cfg(all(feature = "metrics", feature = "http"))]

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use futures::StreamExt;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::advance;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tower::{Layer, ServiceExt};
use tower_admission::http::QosHeaders;
use tower_admission::metrics::SECONDS_BUCKETS;
use tower_admission::{AdmissionConfig, AdmissionLayer, Gate, TenantLimits};
use tower_admission_testkit::exposition::Exposition;

const TOKEN_CHUNK: &str = r#"{"choices":[{"index":0,"delta":{"content":"Hello"}}]}"#;
const ROLE_CHUNK: &str = r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#;
const MS: Duration = Duration::from_millis(1);

/// The stand-in engine: each admitted request hands the test a sender for
/// its SSE events and streams until the test drops it; a request with
/// `x-fail` is answered `500` at once.
#[derive(Clone)]
struct Engine {
    started: mpsc::UnboundedSender<mpsc::UnboundedSender<String>>,
}

async fn generate(State(engine): State<Engine>, headers: HeaderMap) -> Response {
    if headers.contains_key("x-fail") {
        return (StatusCode::INTERNAL_SERVER_ERROR, "the engine failed").into_response();
    }
    let (events, rx) = mpsc::unbounded_channel();
    engine.started.send(events).unwrap();
    let stream = UnboundedReceiverStream::new(rx)
        .map(|data| Ok::<_, Infallible>(Event::default().data(data)));
    Sse::new(stream).into_response()
}

struct Worker {
    addr: std::net::SocketAddr,
    gate: Gate,
    recorder: PrometheusRecorder,
    started: mpsc::UnboundedReceiver<mpsc::UnboundedSender<String>>,
}

/// A configuration on tokio's paused clock.
fn config() -> AdmissionConfig {
    AdmissionConfig::new()
        .clock(|| tokio::time::Instant::now().into_std())
        .metrics_prefix("svc")
}

impl Worker {
    /// Serves one generation route behind the layer, whose gate and series
    /// are registered with a fresh Prometheus recorder.
    async fn start(config: AdmissionConfig) -> Worker {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
            .unwrap()
            .build_recorder();
        let (gate, layer) = metrics::with_local_recorder(&recorder, || {
            let gate = Gate::new(config);
            (gate.clone(), AdmissionLayer::new(gate))
        });
        let layer = layer
            .qos_headers(QosHeaders::default())
            .deadline_header("x-deadline-ms");
        let (started_tx, started) = mpsc::unbounded_channel();
        let app = Router::new()
            .route("/v1/chat/completions", post(generate).route_layer(layer))
            .with_state(Engine {
                started: started_tx,
            });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Worker {
            addr,
            gate,
            recorder,
            started,
        }
    }

    /// Sends a request on a connection of its own, with `headers`, and
    /// waits for the response head.
    async fn send(&self, headers: &[(&str, &str)]) -> http::Response<Incoming> {
        self.client().send(headers).await
    }

    /// A client of the worker, for a task of its own.
    fn client(&self) -> Client {
        Client { addr: self.addr }
    }

    /// The next admitted request's event sender.
    async fn next_started(&mut self) -> mpsc::UnboundedSender<String> {
        self.started
            .recv()
            .await
            .expect("a request reached the engine")
    }

    fn scrape(&self) -> Exposition {
        Exposition::parse(&self.recorder.handle().render())
    }

    /// Yields until `done` holds of the gate: an explicit step, not a sleep.
    async fn until(&self, what: &str, done: impl Fn(&Gate) -> bool) {
        for _ in 0..100_000 {
            if done(&self.gate) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("never: {what}; {:?}", self.gate.snapshot());
    }
}

/// Streams one event and waits for the client to read it: by then the
/// layer has passed it on, and measured it.
async fn stream(events: &mpsc::UnboundedSender<String>, body: &mut Incoming, data: &str) {
    events.send(data.to_owned()).unwrap();
    let frame = body.frame().await.expect("a frame").unwrap();
    let text = String::from_utf8_lossy(frame.data_ref().expect("data"));
    assert!(text.contains(data), "{text}");
}

/// Ends a response (the engine drops its stream) and reads it to its end.
async fn finish(events: mpsc::UnboundedSender<String>, mut body: Incoming) {
    drop(events);
    while let Some(frame) = body.frame().await {
        frame.unwrap();
    }
}

fn seconds(exposition: &Exposition, family: &str, labels: &[(&str, &str)]) -> (f64, f64) {
    (
        exposition.value(&format!("svc_client_{family}_count"), labels),
        exposition.value(&format!("svc_client_{family}_sum"), labels),
    )
}

fn close(measured: f64, expected: Duration) -> bool {
    (measured - expected.as_secs_f64()).abs() < 1e-9
}

#[tokio::test(start_paused = true)]
async fn a_queued_requests_time_to_first_token_includes_its_queue_wait() {
    let mut worker = Worker::start(
        config()
            .engine_request_limit(1)
            .request_queue_limit(4)
            .tenant_weight("first", 1)
            .tenant_weight("second", 1),
    )
    .await;
    let mut first = worker.send(&[("x-admission-tenant", "first")]).await;
    let first_events = worker.next_started().await;

    // The second waits in the gate's queue while the first runs.
    let client = worker.client();
    let second =
        tokio::spawn(async move { client.send(&[("x-admission-tenant", "second")]).await });
    worker
        .until("the second is queued", |gate| {
            gate.snapshot().total.queued == 1
        })
        .await;
    advance(300 * MS).await;
    stream(&first_events, first.body_mut(), ROLE_CHUNK).await;
    stream(&first_events, first.body_mut(), TOKEN_CHUNK).await;
    finish(first_events, first.into_body()).await;

    // Its end admits the second, 300 ms after it arrived.
    let second_events = worker.next_started().await;
    let mut second = second.await.unwrap();
    advance(50 * MS).await;
    stream(&second_events, second.body_mut(), TOKEN_CHUNK).await;
    finish(second_events, second.into_body()).await;

    let exposition = worker.scrape();
    let ttft = |tenant| {
        seconds(
            &exposition,
            "time_to_first_token_seconds",
            &[("tenant_class", tenant)],
        )
    };
    let (count, sum) = ttft("first");
    assert_eq!(count, 1.0);
    assert!(close(sum, 300 * MS), "the role chunk is not a token: {sum}");
    let (count, sum) = ttft("second");
    assert_eq!(count, 1.0);
    assert!(
        close(sum, 350 * MS),
        "300 ms in the queue and 50 ms to its token, as the client felt them: {sum}"
    );
    assert_eq!(worker.gate.snapshot().tally.admitted_queue, 1);
    // Both ended whole, with no objective set: finished, and goodput.
    for tenant in ["first", "second"] {
        let labels = [("tenant_class", tenant)];
        assert_eq!(
            exposition.value("svc_finished_requests_total", &labels),
            1.0
        );
        assert_eq!(exposition.value("svc_goodput_requests_total", &labels), 1.0);
    }
}

/// Sends requests to a worker, from another task.
struct Client {
    addr: std::net::SocketAddr,
}

impl Client {
    async fn send(&self, headers: &[(&str, &str)]) -> http::Response<Incoming> {
        let stream = TcpStream::connect(self.addr).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut request = Request::post("/v1/chat/completions").header("host", "worker");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        sender
            .send_request(request.body(Empty::<Bytes>::new()).unwrap())
            .await
            .unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn the_inter_token_latency_is_recorded_for_each_gap_between_chunks() {
    let mut worker = Worker::start(config()).await;
    let mut response = worker.send(&[]).await;
    let events = worker.next_started().await;
    advance(10 * MS).await;
    stream(&events, response.body_mut(), ROLE_CHUNK).await;
    stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    for gap in [20, 70, 3] {
        advance(gap * MS).await;
        stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    }
    finish(events, response.into_body()).await;

    let exposition = worker.scrape();
    let other = [("tenant_class", "other")];
    let (count, sum) = seconds(&exposition, "inter_token_latency_seconds", &other);
    assert_eq!(count, 3.0, "three gaps after the first token");
    assert!(close(sum, 93 * MS), "{sum}");
    let bucket = |le: &str| {
        exposition.value(
            "svc_client_inter_token_latency_seconds_bucket",
            &[("tenant_class", "other"), ("le", le)],
        )
    };
    assert_eq!(bucket("0.005"), 1.0);
    assert_eq!(bucket("0.025"), 2.0);
    assert_eq!(bucket("0.1"), 3.0);
    let (count, sum) = seconds(&exposition, "time_to_first_token_seconds", &other);
    assert_eq!(count, 1.0);
    assert!(close(sum, 10 * MS), "{sum}");
    let (count, sum) = seconds(&exposition, "request_duration_seconds", &other);
    assert_eq!(count, 1.0);
    assert!(close(sum, 103 * MS), "{sum}");
}

#[tokio::test(start_paused = true)]
async fn goodput_counts_only_the_requests_that_met_every_objective() {
    let mut worker = Worker::start(
        config()
            .ttft_objective(100 * MS)
            .inter_token_objective(50 * MS)
            .engine_request_limit(1)
            .request_queue_limit(0),
    )
    .await;
    let counters = |worker: &Worker| {
        let exposition = worker.scrape();
        let other = [("tenant_class", "other")];
        (
            exposition.value("svc_finished_requests_total", &other),
            exposition.value("svc_goodput_requests_total", &other),
        )
    };
    assert_eq!(counters(&worker), (0.0, 0.0));

    // Within every objective: a token at 10 ms, gaps of 50 ms at most, no
    // deadline.
    let mut response = worker.send(&[]).await;
    let events = worker.next_started().await;
    advance(10 * MS).await;
    stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    for _ in 0..3 {
        advance(50 * MS).await;
        stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    }
    finish(events, response.into_body()).await;
    assert_eq!(counters(&worker), (1.0, 1.0), "met");

    // A first token after 150 ms: past the TTFT objective.
    let mut response = worker.send(&[]).await;
    let events = worker.next_started().await;
    advance(150 * MS).await;
    stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    finish(events, response.into_body()).await;
    assert_eq!(counters(&worker), (2.0, 1.0), "late first token");

    // A gap of 51 ms: past the inter-token objective.
    let mut response = worker.send(&[]).await;
    let events = worker.next_started().await;
    stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    advance(51 * MS).await;
    stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    finish(events, response.into_body()).await;
    assert_eq!(counters(&worker), (3.0, 1.0), "a long gap");

    // Every token in time, but the whole answer past its own deadline.
    let mut response = worker.send(&[("x-deadline-ms", "120")]).await;
    let events = worker.next_started().await;
    stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    for _ in 0..3 {
        advance(45 * MS).await;
        stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    }
    finish(events, response.into_body()).await;
    assert_eq!(counters(&worker), (4.0, 1.0), "past its deadline");

    // Within its deadline, it counts.
    let mut response = worker.send(&[("x-deadline-ms", "120")]).await;
    let events = worker.next_started().await;
    advance(20 * MS).await;
    stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    advance(20 * MS).await;
    finish(events, response.into_body()).await;
    assert_eq!(counters(&worker), (5.0, 2.0), "within its deadline");

    // The engine fails: finished, not goodput.
    let response = worker.send(&[("x-fail", "1")]).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    response.into_body().collect().await.unwrap();
    assert_eq!(counters(&worker), (6.0, 2.0), "a server error");

    // The client goes away mid-stream: finished (cut off), not goodput.
    let mut response = worker.send(&[]).await;
    let events = worker.next_started().await;
    stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    drop(response);
    // Each event the server writes to the closed connection brings its
    // end nearer; the gate's count says when the layer saw it.
    for _ in 0..1000 {
        if worker.gate.snapshot().total.engine_requests == 0 {
            break;
        }
        let _ = events.send(TOKEN_CHUNK.to_owned());
        tokio::task::yield_now().await;
    }
    worker
        .until("the cut-off response ended", |gate| {
            gate.snapshot().total.engine_requests == 0
        })
        .await;
    assert_eq!(counters(&worker), (7.0, 2.0), "cut off");

    // A request the gate turns away never started: in neither counter.
    let mut running = worker.send(&[]).await;
    let events = worker.next_started().await;
    let rejected = worker.send(&[]).await;
    assert_eq!(rejected.status().as_u16(), 529);
    rejected.into_body().collect().await.unwrap();
    stream(&events, running.body_mut(), TOKEN_CHUNK).await;
    finish(events, running.into_body()).await;
    assert_eq!(counters(&worker), (8.0, 3.0), "the rejection is in neither");
    assert_eq!(worker.gate.snapshot().tally.rejected_worker, 1);
}

#[tokio::test(start_paused = true)]
async fn the_inter_token_objective_is_on_the_mean_gap_as_benchmark_clients_judge_it() {
    let mut worker = Worker::start(config().inter_token_objective(50 * MS)).await;
    let goodput = |worker: &Worker| {
        worker
            .scrape()
            .value("svc_goodput_requests_total", &[("tenant_class", "other")])
    };
    // One stall of 90 ms, but 50 ms a token on average: aiperf's
    // inter-token latency and vLLM's time per output token are 50 ms.
    tokens_after(&mut worker, &[90, 10]).await;
    assert_eq!(goodput(&worker), 1.0, "a mean of 50 ms meets 50 ms");
    // Every gap near the objective, the mean over it.
    tokens_after(&mut worker, &[55, 50]).await;
    assert_eq!(goodput(&worker), 1.0, "a mean of 52.5 ms misses 50 ms");
    // One token, no gap: nothing to miss.
    tokens_after(&mut worker, &[]).await;
    assert_eq!(goodput(&worker), 2.0);
}

/// One response: a token at once, then one after each gap (ms), then its end.
async fn tokens_after(worker: &mut Worker, gaps: &[u32]) {
    let mut response = worker.send(&[]).await;
    let events = worker.next_started().await;
    stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    for &gap in gaps {
        advance(gap * MS).await;
        stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    }
    finish(events, response.into_body()).await;
}

#[tokio::test(start_paused = true)]
async fn an_event_streams_trailers_are_not_content_chunks() {
    let mut worker = Worker::start(config().inter_token_objective(24 * MS)).await;
    let mut response = worker.send(&[]).await;
    let events = worker.next_started().await;
    stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    for gap in [20, 30] {
        advance(gap * MS).await;
        stream(&events, response.body_mut(), TOKEN_CHUNK).await;
    }
    // vLLM's usage chunk (`stream_options.include_usage`) and the end of
    // the stream, right after the last token.
    advance(MS).await;
    let usage = r#"{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}"#;
    stream(&events, response.body_mut(), usage).await;
    stream(&events, response.body_mut(), "[DONE]").await;
    finish(events, response.into_body()).await;

    let exposition = worker.scrape();
    let other = [("tenant_class", "other")];
    let (count, sum) = seconds(&exposition, "inter_token_latency_seconds", &other);
    assert_eq!(count, 2.0, "the gaps between the three tokens, no trailer");
    assert!(close(sum, 50 * MS), "{sum}");
    // The mean gap is 25 ms, over the 24 ms objective; were the trailers
    // chunks, it would be 51 ms over four gaps.
    assert_eq!(exposition.value("svc_finished_requests_total", &other), 1.0);
    assert_eq!(exposition.value("svc_goodput_requests_total", &other), 0.0);
}

/// The label sets of the five client families, as rendered: histograms by
/// their `_count` sample.
fn client_label_sets(exposition: &Exposition) -> BTreeSet<(String, Vec<(String, String)>)> {
    let names = [
        "svc_client_time_to_first_token_seconds_count",
        "svc_client_inter_token_latency_seconds_count",
        "svc_client_request_duration_seconds_count",
        "svc_goodput_requests_total",
        "svc_finished_requests_total",
    ];
    names
        .iter()
        .flat_map(|name| {
            exposition
                .label_sets(name)
                .into_iter()
                .map(|labels| (name.to_string(), labels.into_iter().collect()))
        })
        .collect()
}

#[tokio::test]
async fn a_fresh_tenant_per_request_adds_no_series() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let bands = [0, 10];
    let named = ["batch", "chat"];
    let (gate, layer) = metrics::with_local_recorder(&recorder, || {
        let gate = Gate::new(
            AdmissionConfig::new()
                .metrics_prefix("svc")
                .priority_bands(bands)
                .tenant_weight("chat", 4)
                .tenant_limits("batch", TenantLimits::new().requests(10_000)),
        );
        (gate.clone(), AdmissionLayer::new(gate))
    });
    let service = layer
        .qos_headers(QosHeaders::default())
        .layer(tower::service_fn(|_: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"token"))))
        }));
    let expected_sets = (named.len() + 1) * bands.len();
    let families = 5;
    let requests = 10_000;
    for i in 0..requests {
        let tenant = match i % 10 {
            0 => "chat".to_owned(),
            1 => "batch".to_owned(),
            _ => format!("tenant-{i}"),
        };
        let priority = ["-5", "0", "7", "10", "99"][i % 5];
        let request = Request::post("/v1/completions")
            .header("x-admission-tenant", tenant)
            .header("x-admission-priority", priority)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = service.clone().oneshot(request).await.unwrap();
        response.into_body().collect().await.unwrap();
    }
    let exposition = Exposition::parse(&recorder.handle().render());
    let sets = client_label_sets(&exposition);
    assert_eq!(sets.len(), families * expected_sets, "{sets:#?}");
    let classes: BTreeSet<String> = exposition
        .label_sets("svc_finished_requests_total")
        .into_iter()
        .map(|labels| labels["tenant_class"].clone())
        .collect();
    assert_eq!(
        classes,
        BTreeSet::from(["batch", "chat", "other"].map(String::from))
    );
    let priorities: BTreeSet<String> = exposition
        .label_sets("svc_finished_requests_total")
        .into_iter()
        .map(|labels| labels["priority"].clone())
        .collect();
    assert_eq!(priorities, BTreeSet::from(["0", "10"].map(String::from)));
    let finished = exposition.sum("svc_finished_requests_total", &[]);
    assert_eq!(finished, requests as f64);
    assert_eq!(
        exposition.sum("svc_finished_requests_total", &[("tenant_class", "chat")]),
        (requests / 10) as f64
    );
    // Priority -5 is below every band: it counts in the lowest.
    assert_eq!(
        exposition.sum("svc_finished_requests_total", &[("priority", "0")]),
        (requests * 3 / 5) as f64
    );
    assert_eq!(gate.snapshot().tally.received, requests as u64);
}
