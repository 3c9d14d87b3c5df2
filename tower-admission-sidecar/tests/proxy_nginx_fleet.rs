//! nginx, the balancer fleets already run, in front of two sidecar binaries,
//! over real sockets: the configuration of `docs/deployment.md` ("nginx in
//! front of sidecars"), run as written with its ports replaced, sends a
//! request the gate rejected (`--overload-status 503`) to the other worker,
//! so a burst that fits the free worker completes in full while the other
//! is full; without `http_503` in `proxy_next_upstream` it loses about half.
//!
//! nginx is the distribution's (`apt-get install nginx-light`). Without it
//! the tests print why and pass, unless `REQUIRE_NGINX=1` (CI), which makes
//! its absence a failure.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body as AxumBody;
use axum::response::Response;
use axum::routing::{get, post};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{oneshot, watch};
use tower_admission_testkit::exposition::scrape;
use tower_admission_testkit::{PATIENCE, Process, within};

mod docs;

/// Each sidecar's capacity: engine slots and queue places.
const SLOTS: usize = 2;
const QUEUE: usize = 2;
/// A burst that fits the free worker exactly.
const BURST: usize = SLOTS + QUEUE;

const ROLE: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n";
const TOKEN: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_docs_config_a_burst_beside_a_full_worker_completes_on_the_other() {
    let Some(nginx) = nginx_binary() else { return };
    let config = docs_config();
    let outcome = burst_beside_a_full_worker(&nginx, &config).await;

    for (marker, answer) in &outcome.burst {
        assert_eq!(answer.status, 200, "{marker}: {answer:?}");
        assert!(
            answer.body.starts_with(ROLE) && answer.body.ends_with(DONE),
            "{marker} not streamed to the end: {:?}",
            answer.body
        );
    }
    let mut on_free = outcome.seen_by_free.clone();
    on_free.sort();
    let mut burst: Vec<String> = outcome.burst.iter().map(|(m, _)| m.clone()).collect();
    burst.sort();
    assert_eq!(on_free, burst, "the whole burst ran on the free worker");
    assert!(
        outcome.seen_by_full.iter().all(|m| m.starts_with("bypass")),
        "a burst request reached the full worker's engine: {:?}",
        outcome.seen_by_full
    );
    // Round robin sent part of the burst to the full worker first: its
    // sidecar answered 503 and nginx resent those to the other.
    assert!(
        outcome.resent >= 1,
        "no request was resent (the test proves nothing):\n{}",
        outcome.access_log
    );
    println!(
        "{} of {BURST} burst requests were resent after a 503; the run took {:?}",
        outcome.resent, outcome.took
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_http_503_in_proxy_next_upstream_the_burst_loses_about_half() {
    let Some(nginx) = nginx_binary() else { return };
    let with_retry = docs_config();
    let config = with_retry.replace(" http_503", "");
    assert_ne!(config, with_retry, "the docs config names http_503");
    let outcome = burst_beside_a_full_worker(&nginx, &config).await;

    let rejected: Vec<&Answer> = outcome
        .burst
        .iter()
        .map(|(_, answer)| answer)
        .filter(|answer| answer.status == 503)
        .collect();
    assert!(
        rejected.len() * 4 >= BURST,
        "at least a quarter of the burst answered 503: {:?}",
        outcome.burst
    );
    for answer in &rejected {
        // The gate's answer, passed on by nginx.
        assert_eq!(answer.reason.as_deref(), Some("queue_full"), "{answer:?}");
    }
    for (marker, answer) in &outcome.burst {
        assert!(
            answer.status == 503 || answer.body.ends_with(DONE),
            "{marker}: {answer:?}"
        );
    }
    assert!(
        outcome.seen_by_full.iter().all(|m| m.starts_with("bypass")),
        "the gate let a burst request through to the full engine: {:?}",
        outcome.seen_by_full
    );
    assert_eq!(outcome.resent, 0, "{}", outcome.access_log);
    println!(
        "{} of {BURST} burst requests answered 503; the run took {:?}",
        rejected.len(),
        outcome.took
    );
}

// ---------------------------------------------------------------------------
// The scenario.

/// What one client got.
#[derive(Debug)]
struct Answer {
    status: u16,
    reason: Option<String>,
    body: String,
}

struct Outcome {
    /// Each burst request's marker and answer.
    burst: Vec<(String, Answer)>,
    /// The markers of the requests that reached each engine.
    seen_by_full: Vec<String>,
    seen_by_free: Vec<String>,
    /// Requests nginx sent to a second worker after a 503.
    resent: usize,
    access_log: String,
    took: Duration,
}

/// Two workers (stand-in engine and sidecar binary) behind nginx running
/// `config`; the first worker filled straight through its sidecar, then a
/// burst of `BURST` through nginx; every stream released once the burst
/// has settled (each request rejected, running or queued).
async fn burst_beside_a_full_worker(nginx: &Path, config: &str) -> Outcome {
    let started = Instant::now();
    let full = StandIn::start().await;
    let free = StandIn::start().await;
    let full_sidecar = sidecar(&full.url);
    let free_sidecar = sidecar(&free.url);
    let (full_url, free_url) = (full_sidecar.listening_url(), free_sidecar.listening_url());
    let nginx = Nginx::start(nginx, config, [&full_url, &free_url]);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();

    // Fill the first worker without nginx: its slots, then its queue.
    let bypass: Vec<_> = (0..SLOTS + QUEUE)
        .map(|i| {
            tokio::spawn(chat(
                client.clone(),
                full_url.clone(),
                format!("bypass-{i}"),
            ))
        })
        .collect();
    until("the full worker's slots and queue are taken", || {
        let (client, url, full) = (&client, &full_url, &full);
        async move { full.seen().len() == SLOTS && queued(client, url).await == QUEUE }
    })
    .await;

    let rejected = Arc::new(AtomicUsize::new(0));
    let burst: Vec<_> = (0..BURST)
        .map(|i| {
            let marker = format!("burst-{i}");
            let task = tokio::spawn({
                let (client, url, rejected) = (client.clone(), nginx.url.clone(), rejected.clone());
                let marker = marker.clone();
                async move {
                    let answer = chat(client, url, marker).await;
                    if answer.status == 503 {
                        rejected.fetch_add(1, Ordering::SeqCst);
                    }
                    answer
                }
            });
            (marker, task)
        })
        .collect();
    // Settled: every burst request is rejected, or running on or queued
    // at a worker (the full one takes none: its queue is full).
    until("the burst is rejected, running or queued", || {
        let (client, url, free, rejected) = (&client, &free_url, &free, &rejected);
        async move {
            rejected.load(Ordering::SeqCst) + free.seen().len() + queued(client, url).await == BURST
        }
    })
    .await;
    let seen_by_full_while_full = full.seen();

    free.release();
    let mut answers = Vec::new();
    for (marker, task) in burst {
        answers.push((marker, within(task).await.unwrap()));
    }
    full.release();
    for task in bypass {
        let answer = within(task).await.unwrap();
        assert_eq!(answer.status, 200, "a request sent straight: {answer:?}");
        assert!(answer.body.ends_with(DONE), "{answer:?}");
    }
    let seen_by_full = full.seen();
    assert_eq!(seen_by_full.len(), SLOTS + QUEUE, "{seen_by_full:?}");
    assert!(
        seen_by_full_while_full
            .iter()
            .all(|m| m.starts_with("bypass"))
    );

    let access_log = nginx.access_log();
    let resent = access_log
        .lines()
        .filter(|line| line.contains("statuses=503, 200"))
        .count();
    Outcome {
        burst: answers,
        seen_by_full,
        seen_by_free: free.seen(),
        resent,
        access_log,
        took: started.elapsed(),
    }
}

/// A streamed chat completion whose one message is `marker`; the body read
/// to the end.
async fn chat(client: reqwest::Client, url: String, marker: String) -> Answer {
    let body = serde_json::json!({
        "model": "m",
        "stream": true,
        "messages": [{"role": "user", "content": marker}],
    });
    let response = within(
        client
            .post(format!("{url}/v1/chat/completions"))
            .json(&body)
            .send(),
    )
    .await
    .unwrap_or_else(|error| panic!("{marker}: {error}"));
    let status = response.status().as_u16();
    let reason = response
        .headers()
        .get("x-admission-rejection-reason")
        .map(|value| value.to_str().unwrap().to_owned());
    let body = within(response.text()).await.unwrap();
    Answer {
        status,
        reason,
        body,
    }
}

/// The sidecar's queue, from its `/metrics`.
async fn queued(client: &reqwest::Client, url: &str) -> usize {
    let name = format!(
        "{}_request_queue_count",
        tower_admission::metrics::DEFAULT_PREFIX
    );
    scrape(client, url)
        .await
        .value(&name, &[("dp_rank", "unspecified")]) as usize
}

/// Polls `condition` until it holds; fails the test after `PATIENCE`.
async fn until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The sidecar binary in front of `engine`: small capacity, the overload
/// answer `503`, as the docs start it.
fn sidecar(engine: &str) -> Process {
    let (slots, queue) = (SLOTS.to_string(), QUEUE.to_string());
    Process::spawn(
        env!("CARGO_BIN_EXE_tower-admission").as_ref(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            engine,
            "--max-num-seqs",
            &slots,
            "--request-queue-limit",
            &queue,
            "--overload-status",
            "503",
            "--capacity-poll-interval-ms",
            "600000",
        ],
        &[],
    )
}

// ---------------------------------------------------------------------------
// The stand-in engine.

/// An OpenAI-style engine that records every chat request that reaches it
/// (by its message) and holds each stream open, after a first event,
/// until the test releases them all.
struct StandIn {
    url: String,
    seen: Arc<Mutex<Vec<String>>>,
    released: watch::Sender<bool>,
    _stop: oneshot::Sender<()>,
}

impl StandIn {
    async fn start() -> StandIn {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (released, _) = watch::channel(false);
        let app = Router::new()
            .route(
                "/v1/chat/completions",
                post({
                    let (seen, released) = (seen.clone(), released.clone());
                    move |axum::Json(body): axum::Json<serde_json::Value>| {
                        let marker = body["messages"][0]["content"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned();
                        seen.lock().unwrap().push(marker);
                        let mut released = released.subscribe();
                        async move {
                            stream_until_released(async move {
                                let _ = released.wait_for(|released| *released).await;
                            })
                        }
                    }
                }),
            )
            .route("/health", get(|| async { "" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        StandIn {
            url,
            seen,
            released,
            _stop: stop,
        }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    /// Ends every stream, held or still to come.
    fn release(&self) {
        self.released.send_replace(true);
    }
}

/// An event stream: its first event now, the rest once `released` is done.
fn stream_until_released(
    released: impl std::future::Future<Output = ()> + Send + 'static,
) -> Response {
    let first = futures::stream::once(async { Bytes::from_static(ROLE.as_bytes()) });
    let rest = futures::stream::once(async move {
        released.await;
        futures::stream::iter([TOKEN, DONE].map(|event| Bytes::from_static(event.as_bytes())))
    })
    .flatten();
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(AxumBody::from_stream(
            first.chain(rest).map(Ok::<_, Infallible>),
        ))
        .unwrap()
}

// ---------------------------------------------------------------------------
// nginx.

/// The nginx binary, or `None` (the reason printed) when it is absent and
/// not required.
fn nginx_binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|candidate| candidate.is_file());
    if found.is_none() {
        assert!(
            std::env::var("REQUIRE_NGINX").as_deref() != Ok("1"),
            "REQUIRE_NGINX=1 and no nginx on the PATH or in /usr/sbin \
             (apt-get install nginx-light)"
        );
        eprintln!("skipped: no nginx on the PATH or in /usr/sbin (apt-get install nginx-light)");
    }
    found
}

/// The one ```nginx block of the docs' nginx section.
fn docs_config() -> String {
    docs::only_block(
        docs::section(docs::DEPLOYMENT, "nginx in front of sidecars"),
        "nginx",
    )
    .to_owned()
}

/// nginx in the foreground, running `config` (an http-level file, as the
/// docs' `conf.d` file is) inside an `nginx.conf` that keeps its logs, pid
/// and temporary files under a directory of its own in the target dir.
struct Nginx {
    process: Process,
    url: String,
    prefix: PathBuf,
}

impl Nginx {
    /// `config` with the docs' placeholder addresses replaced: the two
    /// sidecars' (`127.0.0.1:9001`, `127.0.0.1:9002`) and a free port to
    /// listen on (`127.0.0.1:8080`).
    fn start(binary: &Path, config: &str, sidecars: [&str; 2]) -> Nginx {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let mut config = config.to_owned();
        for (placeholder, address) in [
            ("127.0.0.1:9001", sidecars[0].trim_start_matches("http://")),
            ("127.0.0.1:9002", sidecars[1].trim_start_matches("http://")),
            ("listen 127.0.0.1:8080", &format!("listen {listen}")),
        ] {
            assert!(config.contains(placeholder), "{placeholder} in:\n{config}");
            config = config.replace(placeholder, address);
        }

        static RUN: AtomicUsize = AtomicUsize::new(0);
        let prefix = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "nginx-fleet-{}-{}",
            std::process::id(),
            RUN.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&prefix);
        std::fs::create_dir_all(prefix.join("logs")).unwrap();
        std::fs::create_dir_all(prefix.join("conf.d")).unwrap();
        let workers = prefix.join("conf.d/llm-workers.conf");
        std::fs::write(&workers, &config).unwrap();
        let p = prefix.display();
        let main = format!(
            "events {{ worker_connections 256; }}
http {{
    log_format fleet '$request_uri $status upstreams=$upstream_addr statuses=$upstream_status';
    access_log {p}/logs/access.log fleet;
    client_body_temp_path {p}/temp/body;
    proxy_temp_path {p}/temp/proxy;
    fastcgi_temp_path {p}/temp/fastcgi;
    uwsgi_temp_path {p}/temp/uwsgi;
    scgi_temp_path {p}/temp/scgi;
    include {workers};
}}
",
            workers = workers.display()
        );
        std::fs::create_dir_all(prefix.join("temp")).unwrap();
        let conf = prefix.join("nginx.conf");
        std::fs::write(&conf, main).unwrap();
        // One process: the test kit kills it with SIGKILL on drop, and a
        // master killed so would leave its workers running.
        let globals = format!("daemon off; master_process off; pid {p}/nginx.pid;");
        let error_log = format!("{p}/logs/error.log");
        let process = Process::spawn(
            binary,
            &[
                "-p",
                &format!("{p}/"),
                "-c",
                conf.to_str().unwrap(),
                "-e",
                &error_log,
                "-g",
                &globals,
            ],
            &[],
        );
        let nginx = Nginx {
            process,
            url: format!("http://{listen}"),
            prefix,
        };
        // Ready when it accepts: poll the port, bounded.
        let deadline = Instant::now() + PATIENCE;
        while std::net::TcpStream::connect(&listen).is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx never listened on {listen}; stderr:\n{}\nerror.log:\n{}",
                nginx.process.stderr(),
                std::fs::read_to_string(&error_log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        nginx
    }

    fn access_log(&self) -> String {
        std::fs::read_to_string(self.prefix.join("logs/access.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    /// Its directory goes with it, unless the test failed (its logs tell why).
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.prefix);
        }
    }
}
