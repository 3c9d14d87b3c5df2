//! What the sidecar costs on the path of every token, against the reverse
//! proxy people already put in front of an engine: the same workloads,
//! in one run, straight to an engine, through nginx as a plain streaming
//! reverse proxy, through the sidecar with its defaults, and through the
//! sidecar with threads of its own (`--workers 2`, nginx's shape).
//!
//! ```sh
//! cargo bench -p tower-admission-sidecar --bench proxy_overhead
//! ```
//!
//! The engine is this benchmark's own: a Rust event-stream server with no
//! model, which sends a request's chunks at the pace the request asks for
//! (headers `x-chunks` and `x-chunk-interval-us`), so that the proxies,
//! not the engine, are measured. nginx is the distribution's package
//! (`apt-get install nginx`), started on a loopback port with a
//! configuration written here: `proxy_buffering off`, HTTP/1.1 and
//! keep-alive to the engine. Without nginx on the `PATH` its column says
//! so and the rest runs.
//!
//! Workloads:
//! 1. sequential requests: time to the first content chunk, p50 and p99,
//!    and the time each proxy adds to it over going direct;
//! 2. short requests at the highest rate each setup sustains with a p99
//!    under 50 ms (open-loop arrivals on a rising ladder of rates);
//! 3. 256 concurrent streams of 200 chunks at 50 chunks/s each: CPU seconds
//!    of the proxy's processes per 100,000 chunks, and its resident memory
//!    per open stream.
//!
//! `PROXY_BENCH_QUICK=1` shortens every workload (a smoke run);
//! `PROXY_BENCH_SIDECAR_ARGS="--workers 1"` passes flags to the sidecar;
//! `PROXY_BENCH_BASELINE=path/to/tower-admission` adds a column for another
//! build of it (a commit before a change), in the same run.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// One streamed chunk, as an OpenAI-compatible engine writes a token.
const CHUNK: &[u8] = b"data: {\"id\":\"b\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"},\"finish_reason\":null}]}\n\n";
const DONE: &[u8] = b"data: [DONE]\n\n";

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

fn main() {
    // `cargo bench` passes `--bench`; a filter that is not ours skips the run
    // (so `cargo bench -- zzz` over the workspace does not start servers).
    let filter = std::env::args().skip(1).find(|arg| !arg.starts_with('-'));
    if filter.is_some_and(|filter| !"proxy_overhead".contains(filter.as_str())) {
        return;
    }
    let quick = std::env::var_os("PROXY_BENCH_QUICK").is_some_and(|v| v == "1");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(run(quick));
}

async fn run(quick: bool) {
    let engine = start_engine().await;
    let scratch = std::env::temp_dir().join(format!("proxy-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("a scratch folder");

    let nginx = Nginx::start(&scratch, engine);
    let sidecar = Sidecar::start(engine, env!("CARGO_BIN_EXE_tower-admission").as_ref());
    // Another build of the sidecar beside this one, in the same run (say,
    // the commit before a change): PROXY_BENCH_BASELINE=path/to/tower-admission.
    let baseline = std::env::var_os("PROXY_BENCH_BASELINE")
        .map(|binary| Sidecar::start(engine, Path::new(&binary)));
    // The sidecar with threads of its own (nginx's shape), beside its
    // default runtime.
    let threads = Sidecar::start_with(
        engine,
        env!("CARGO_BIN_EXE_tower-admission").as_ref(),
        &["--workers", "2"],
    );
    let mut setups: Vec<Setup> = vec![Setup {
        name: "direct",
        address: engine,
        processes: None,
    }];
    match &nginx {
        Ok(nginx) => setups.push(Setup {
            name: "nginx",
            address: nginx.address,
            processes: Some(nginx.child.id()),
        }),
        Err(why) => eprintln!("nginx left out: {why}"),
    }
    if let Some(baseline) = &baseline {
        setups.push(Setup {
            name: "sidecar (baseline)",
            address: baseline.address,
            processes: Some(baseline.child.id()),
        });
    }
    setups.push(Setup {
        name: "sidecar",
        address: sidecar.address,
        processes: Some(sidecar.child.id()),
    });
    setups.push(Setup {
        name: "sidecar --workers 2",
        address: threads.address,
        processes: Some(threads.child.id()),
    });

    let client = client();
    for setup in &setups {
        wait_until_serving(&client, setup.address).await;
    }

    let sequential = if quick { 200 } else { 2_000 };
    println!("\n1. sequential requests ({sequential} each, 4 chunks): time to first content chunk");
    println!("| setup | p50 | p99 | added p50 over direct | added p99 over direct |");
    println!("|---|---|---|---|---|");
    let mut direct = None;
    for setup in &setups {
        let mut times = Vec::with_capacity(sequential);
        for _ in 0..sequential / 10 {
            let _ = first_chunk(&client, setup.address, 4, 0).await; // warm-up
        }
        for _ in 0..sequential {
            times.push(first_chunk(&client, setup.address, 4, 0).await);
        }
        let (p50, p99) = (percentile(&mut times, 0.50), percentile(&mut times, 0.99));
        let (added50, added99) = match direct {
            None => {
                direct = Some((p50, p99));
                ("—".to_owned(), "—".to_owned())
            }
            Some((d50, d99)) => (
                micros(p50.saturating_sub(d50)),
                micros(p99.saturating_sub(d99)),
            ),
        };
        println!(
            "| {} | {} | {} | {added50} | {added99} |",
            setup.name,
            micros(p50),
            micros(p99)
        );
    }

    println!("\n2. short requests (1 chunk) at the highest rate with p99 < 50 ms, open loop");
    println!("| setup | sustained rate | p99 at that rate |");
    println!("|---|---|---|");
    let step = if quick {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(2)
    };
    for setup in &setups {
        let mut best = None;
        let mut rate = 500.0;
        loop {
            // A rate counts as sustained when one of two tries holds it: a
            // single stall of a loaded machine does not end the ladder.
            let mut outcome = open_loop(&client, setup.address, rate, step).await;
            if !outcome.held() {
                outcome = open_loop(&client, setup.address, rate, step).await;
            }
            if !outcome.held() {
                eprintln!(
                    "{}: {rate:.0} requests/s not held: {} failed, p99 {}",
                    setup.name,
                    outcome.failed,
                    micros(outcome.p99)
                );
                break;
            }
            best = Some((rate, outcome.p99));
            rate *= 1.25;
            if rate > 60_000.0 {
                break;
            }
        }
        match best {
            Some((rate, p99)) => {
                println!(
                    "| {} | {rate:.0} requests/s | {} |",
                    setup.name,
                    micros(p99)
                )
            }
            None => println!("| {} | below 500 requests/s | — |", setup.name),
        }
    }

    let (streams, chunks, interval) = if quick {
        (64, 50, 20_000)
    } else {
        (256, 200, 20_000)
    };
    println!(
        "\n3. {streams} concurrent streams of {chunks} chunks at 50 chunks/s: the proxy's CPU and memory"
    );
    println!("| setup | CPU s per 100,000 chunks | resident memory per open stream |");
    println!("|---|---|---|");
    for setup in &setups {
        let Some(pid) = setup.processes else {
            continue;
        };
        let before_cpu = cpu_seconds(pid);
        let before_rss = resident_bytes(pid);
        let peak = Arc::new(AtomicU64::new(before_rss));
        let sampler = {
            let peak = peak.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    peak.fetch_max(resident_bytes(pid), Ordering::Relaxed);
                }
            })
        };
        let mut tasks = Vec::with_capacity(streams);
        for _ in 0..streams {
            let client = client.clone();
            let address = setup.address;
            tasks.push(tokio::spawn(async move {
                stream_all(&client, address, chunks, interval).await
            }));
        }
        let mut received = 0;
        for task in tasks {
            received += task.await.expect("a stream task");
        }
        sampler.abort();
        let cpu = cpu_seconds(pid) - before_cpu;
        let per_stream = peak.load(Ordering::Relaxed).saturating_sub(before_rss) / streams as u64;
        assert_eq!(received, streams * chunks, "{}: chunks lost", setup.name);
        println!(
            "| {} | {:.3} | {:.1} KiB |",
            setup.name,
            cpu * 100_000.0 / received as f64,
            per_stream as f64 / 1024.0
        );
    }
    drop(nginx);
    drop(sidecar);
    drop(baseline);
    drop(threads);
    let _ = std::fs::remove_dir_all(&scratch);
}

/// Where requests go, and the processes to measure (nginx's master and its
/// workers, the sidecar's one process).
struct Setup {
    name: &'static str,
    address: SocketAddr,
    processes: Option<u32>,
}

fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(512)
        .build(connector)
}

fn request(address: SocketAddr, chunks: usize, interval_us: u64) -> Request<Empty<Bytes>> {
    Request::post(format!("http://{address}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-chunks", chunks.to_string())
        .header("x-chunk-interval-us", interval_us.to_string())
        .body(Empty::new())
        .expect("a request")
}

/// The time from sending a request to its first content chunk; reads the
/// rest of the stream so the connection is reused.
async fn first_chunk(
    client: &HttpClient,
    address: SocketAddr,
    chunks: usize,
    interval_us: u64,
) -> Duration {
    let start = Instant::now();
    let response = client
        .request(request(address, chunks, interval_us))
        .await
        .expect("an answer");
    assert!(
        response.status().is_success(),
        "status {}",
        response.status()
    );
    let mut body = response.into_body();
    let mut first = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("a frame");
        if first.is_none() && frame.data_ref().is_some_and(|data| !data.is_empty()) {
            first = Some(start.elapsed());
        }
    }
    first.expect("a content chunk")
}

/// Every chunk of one stream; returns how many arrived.
async fn stream_all(
    client: &HttpClient,
    address: SocketAddr,
    chunks: usize,
    interval_us: u64,
) -> usize {
    let response = client
        .request(request(address, chunks, interval_us))
        .await
        .expect("an answer");
    assert!(
        response.status().is_success(),
        "status {}",
        response.status()
    );
    let mut body = response.into_body();
    let mut bytes = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("a frame").into_data() {
            bytes += data.len();
        }
    }
    (bytes - DONE.len()) / CHUNK.len()
}

struct Outcome {
    p99: Duration,
    failed: usize,
}

impl Outcome {
    /// Every request answered, with a p99 under 50 ms.
    fn held(&self) -> bool {
        self.failed == 0 && self.p99 < Duration::from_millis(50)
    }
}

/// Short requests arriving at `rate` per second for `length`, each timed
/// from its planned arrival (so a backlog counts against the setup).
async fn open_loop(
    client: &HttpClient,
    address: SocketAddr,
    rate: f64,
    length: Duration,
) -> Outcome {
    let count = (rate * length.as_secs_f64()) as usize;
    let gap = Duration::from_secs_f64(1.0 / rate);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        let planned = start + gap * i as u32;
        tokio::time::sleep_until(planned).await;
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let outcome = tokio::time::timeout(Duration::from_secs(5), async {
                let response = match client.request(request(address, 1, 0)).await {
                    Ok(response) => response,
                    Err(error) => {
                        if std::env::var_os("PROXY_BENCH_DEBUG").is_some() {
                            eprintln!("request failed: {error:?}");
                        }
                        return None;
                    }
                };
                if !response.status().is_success() {
                    if std::env::var_os("PROXY_BENCH_DEBUG").is_some() {
                        eprintln!("answered {}", response.status());
                    }
                    return None;
                }
                response.into_body().collect().await.ok()?;
                Some(())
            })
            .await;
            match outcome {
                Ok(Some(())) => Some(planned.elapsed()),
                _ => None,
            }
        }));
    }
    let mut times = Vec::with_capacity(count);
    let mut failed = 0;
    for task in tasks {
        match task.await.expect("a request task") {
            Some(time) => times.push(time),
            None => failed += 1,
        }
    }
    let p99 = if times.is_empty() {
        Duration::MAX
    } else {
        percentile(&mut times, 0.99)
    };
    Outcome { p99, failed }
}

async fn wait_until_serving(client: &HttpClient, address: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match client.request(request(address, 1, 0)).await {
            Ok(response) if response.status().is_success() => {
                let _ = response.into_body().collect().await;
                return;
            }
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            outcome => panic!(
                "{address} is not serving: {:?}",
                outcome.map(|r| r.status())
            ),
        }
    }
}

fn percentile(times: &mut [Duration], q: f64) -> Duration {
    times.sort_unstable();
    let index = ((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1;
    times[index]
}

fn micros(time: Duration) -> String {
    format!("{:.0} µs", time.as_secs_f64() * 1e6)
}

// ---------------------------------------------------------------------------
// The engine: chunks at a pace, no model.

async fn start_engine() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let address = listener.local_addr().expect("an address");
    // Its own thread and runtime, so the client's tasks do not delay it.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let listener = TcpListener::from_std(listener.into_std().expect("std")).expect("tokio");
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let _ = socket.set_nodelay(true);
                tokio::spawn(async move {
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service_fn(engine))
                        .await;
                });
            }
        });
    });
    address
}

fn header<B>(request: &Request<B>, name: &str) -> Option<u64> {
    request.headers().get(name)?.to_str().ok()?.parse().ok()
}

async fn engine(
    request: Request<hyper::body::Incoming>,
) -> Result<Response<StreamBody<tokio_stream_shim::Chunks>>, Infallible> {
    let chunks = header(&request, "x-chunks").unwrap_or(1) as usize;
    let interval = Duration::from_micros(header(&request, "x-chunk-interval-us").unwrap_or(0));
    Ok(Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(StreamBody::new(tokio_stream_shim::Chunks::new(
            chunks, interval,
        )))
        .expect("a response"))
}

/// A stream of `n` chunks `interval` apart (the first at once), then
/// `[DONE]`, without a dependency on a stream crate.
mod tokio_stream_shim {
    use std::convert::Infallible;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use bytes::Bytes;
    use hyper::body::Frame;

    use super::{CHUNK, DONE};

    pub struct Chunks {
        left: usize,
        done: bool,
        interval: Duration,
        timer: Option<Pin<Box<tokio::time::Sleep>>>,
    }

    impl Chunks {
        pub fn new(left: usize, interval: Duration) -> Chunks {
            Chunks {
                left,
                done: false,
                interval,
                timer: None,
            }
        }
    }

    impl futures_core::Stream for Chunks {
        type Item = Result<Frame<Bytes>, Infallible>;

        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            if self.left == 0 {
                if self.done {
                    return Poll::Ready(None);
                }
                self.done = true;
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(DONE)))));
            }
            if let Some(timer) = self.timer.as_mut() {
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.timer = None;
            }
            self.left -= 1;
            if self.left > 0 && !self.interval.is_zero() {
                self.timer = Some(Box::pin(tokio::time::sleep(self.interval)));
            }
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(CHUNK)))))
        }
    }
}

// ---------------------------------------------------------------------------
// The proxies, as processes.

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a port")
        .local_addr()
        .expect("an address")
        .port()
}

struct Nginx {
    child: Child,
    address: SocketAddr,
}

impl Nginx {
    fn start(scratch: &Path, engine: SocketAddr) -> Result<Nginx, String> {
        let binary = which("nginx").ok_or("no nginx on the PATH (apt-get install nginx)")?;
        let port = free_port();
        let prefix = scratch.join("nginx");
        std::fs::create_dir_all(prefix.join("logs")).map_err(|e| e.to_string())?;
        let config = prefix.join("nginx.conf");
        std::fs::write(&config, nginx_config(&prefix, port, engine)).map_err(|e| e.to_string())?;
        // A process group of its own: dropping it stops the workers too
        // (killing the master alone leaves them running).
        let child = Command::new(binary)
            .process_group(0)
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start nginx: {e}"))?;
        Ok(Nginx {
            child,
            address: SocketAddr::from(([127, 0, 0, 1], port)),
        })
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// nginx as a plain streaming reverse proxy: as many workers as cores,
/// no buffering either way, HTTP/1.1 with keep-alive to the engine.
fn nginx_config(prefix: &Path, port: u16, engine: SocketAddr) -> String {
    let prefix = prefix.display();
    format!(
        "daemon off;
master_process on;
worker_processes auto;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    upstream engine {{
        server {engine};
        keepalive 512;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"
    )
}

struct Sidecar {
    child: Child,
    address: SocketAddr,
}

impl Sidecar {
    /// The sidecar with its defaults; the engine reports no capacity, so it
    /// is told one large enough for every workload here.
    fn start(engine: SocketAddr, binary: &Path) -> Sidecar {
        Sidecar::start_with(engine, binary, &[])
    }

    /// As [`start`](Sidecar::start), with more flags.
    fn start_with(engine: SocketAddr, binary: &Path, flags: &[&str]) -> Sidecar {
        let port = free_port();
        let child = Command::new(binary)
            .args(["--upstream", &format!("http://{engine}")])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--max-num-seqs", "1024"])
            .args(
                std::env::var("PROXY_BENCH_SIDECAR_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .args(flags)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the sidecar");
        Sidecar {
            child,
            address: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

// ---------------------------------------------------------------------------
// /proc: CPU and memory of a process and its children (nginx's workers).

fn family(pid: u32) -> Vec<u32> {
    let mut members = vec![pid];
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if stat_fields(child).and_then(|fields| fields.get(1)?.parse::<u32>().ok()) == Some(pid)
            {
                members.push(child);
            }
        }
    }
    members
}

/// The fields of /proc/PID/stat after the command name (state first).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    Some(after.split_whitespace().map(str::to_owned).collect())
}

fn cpu_seconds(pid: u32) -> f64 {
    // utime and stime, fields 14 and 15 of stat (11 and 12 after the name).
    let ticks = 100.0; // USER_HZ on Linux
    family(pid)
        .into_iter()
        .filter_map(stat_fields)
        .map(|fields| {
            let user: f64 = fields[11].parse().unwrap_or(0.0);
            let system: f64 = fields[12].parse().unwrap_or(0.0);
            (user + system) / ticks
        })
        .sum()
}

fn resident_bytes(pid: u32) -> u64 {
    family(pid)
        .into_iter()
        .filter_map(|member| {
            let status = std::fs::read_to_string(format!("/proc/{member}/status")).ok()?;
            let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .sum()
}
