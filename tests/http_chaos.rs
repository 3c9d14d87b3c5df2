//! Chaos soak over real sockets: an axum worker with the admission layer,
//! served over loopback TCP (HTTP/1.1 and HTTP/2), and 64 clients sharing
//! pooled connections (reqwest over HTTP/1.1, hyper's pooled client over
//! HTTP/2) sending tens of thousands of streaming requests while everything
//! that can go wrong does:
//!
//! * clients go away at random points — before the gate sees the request
//!   (a half-written head), while it waits in the queue or for its response
//!   head, after the head but before the first token, mid-stream, or while
//!   uploading the request body;
//! * the handler answers 500, fails its body mid-stream, panics before
//!   answering or mid-stream (its task dies), returns an
//!   already-finished body, or ends with trailers;
//! * the engine reports new capacities meanwhile (ranks and `max_num_seqs`
//!   change every few milliseconds), and requests carry random, invalid or
//!   repeated `x-data-parallel-rank` headers.
//!
//! Over HTTP/1.1 a client that goes away closes its connection, and a panic
//! kills the connection's task; over HTTP/2 the client resets its stream
//! (`RST_STREAM`), and a panic kills only that stream's task.
//!
//! Afterwards every count is zero, `received = admitted + rejected +
//! cancelled`, no client task is stuck (each request is bounded by a
//! liveness timeout, which is a failure, not a synchronisation), and a
//! second run on the same gate and server leaves the resident memory within
//! 10% of what the first left.
//!
//! The server counts its open connections and HTTP/2 stream tasks; the test
//! waits on that count (not on a clock) until all of them — and with them
//! every response future and body — are gone before it reads the gate.
//!
//! `chaos_soak` is ignored by default:
//!
//! ```sh
//! CHAOS_REQUESTS=20000 cargo test --release --test chaos -- --ignored --nocapture
//! ```
//!
//! `CHAOS_SEED` replays a run's random choices (the seed is printed; the
//! interleaving of a real server is not replayable). `chaos_smoke` runs a
//! few hundred requests in the default test run.
#![cfg(feature = "http")]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as PooledClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::time::timeout;
use tower_admission::detect::OpenAiSse;
use tower_admission::{
    AdmissionConfig, AdmissionLayer, Counts, EngineCapacity, Gate, RankHeader, Snapshot, Tally,
};

use rng::Rng;
use tower_admission_testkit::rng;

#[path = "support/panics.rs"]
mod panics_hook;
use panics_hook::quiet_injected_panics;

/// Clients sending at once.
const CONCURRENCY: usize = 64;
/// Longest any one request may take before the test calls it stuck.
const REQUEST_LIVENESS: Duration = Duration::from_secs(60);
/// Longest the server may take to close every connection once the clients
/// are gone.
const DRAIN_LIVENESS: Duration = Duration::from_secs(60);
const ROUTE: &str = "/v1/chat/completions";

const ROLE_CHUNK: &[u8] =
    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n";
const TOKEN_CHUNK: &[u8] =
    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"},\"finish_reason\":null}]}\n\n";
const DONE_CHUNK: &[u8] = b"data: [DONE]\n\n";

/// Panics raised on purpose say so; the hook keeps them off stderr.
const INJECTED: &str = "injected chaos panic";

#[path = "support/chaos_plan.rs"]
mod plan;
use plan::*;
#[path = "support/chaos_server.rs"]
mod server;
use server::*;
#[path = "support/chaos_client.rs"]
mod client;
use client::*;

// ---- one run ----

struct RunFigures {
    clients: ClientFigures,
    reporter: ReporterFigures,
    tally: Tally,
    handled: u64,
    panics_in_handler: u64,
    panics_mid_stream: u64,
    server_errors: u64,
    body_errors: u64,
    empty_bodies: u64,
    trailers: u64,
    streams_finished: u64,
    elapsed: Duration,
    end: Snapshot,
}

/// `requests` requests through `server` from a fresh pool of clients, the
/// engine reporting capacities meanwhile; returns once every connection has
/// ended, with the gate checked empty.
async fn run(gate: &Gate, server: &mut Server, requests: usize, seed: u64) -> RunFigures {
    let started = Instant::now();
    let before = gate.snapshot().tally;
    let events = server.events.clone();
    let server_before: Vec<u64> = [
        &events.handled,
        &events.panics_in_handler,
        &events.panics_mid_stream,
        &events.server_errors,
        &events.body_errors,
        &events.empty_bodies,
        &events.trailers,
        &events.streams_finished,
    ]
    .iter()
    .map(|counter| read(counter))
    .collect();

    let (stop, stopped) = oneshot::channel();
    let reporter = tokio::spawn(report_capacities(gate.clone(), seed, stopped));
    let pool = Clients::new();
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            tokio::spawn(client_task(
                pool.clone(),
                server.addr,
                seed,
                next.clone(),
                requests,
            ))
        })
        .collect();
    let mut clients = ClientFigures::default();
    for task in tasks {
        // Each request is bounded; a panic here is a stuck request or a
        // broken expectation, with its plan in the message.
        clients.add(&task.await.expect("client task"));
    }
    drop(pool);
    stop.send(()).unwrap();
    let reporter = reporter.await.unwrap();
    server.drained().await;
    let elapsed = started.elapsed();

    let end = gate.snapshot();
    assert_eq!(end.total, Counts::default(), "held after the run: {end:?}");
    assert_eq!(end.unranked, Counts::default());
    for (rank, counts) in end.ranks.iter().enumerate() {
        assert_eq!(*counts, Counts::default(), "rank {rank}");
    }
    let tally = end.tally;
    assert_eq!(
        tally.received,
        tally.admitted_direct + tally.admitted_queue + tally.rejected() + tally.cancelled,
        "every request ends one way: {tally:?}"
    );
    let mut unranked_and_ranks = end.unranked_tally;
    for rank in &end.rank_tallies {
        unranked_and_ranks.received += rank.received;
    }
    assert_eq!(unranked_and_ranks.received, tally.received);

    let server_now: Vec<u64> = [
        &events.handled,
        &events.panics_in_handler,
        &events.panics_mid_stream,
        &events.server_errors,
        &events.body_errors,
        &events.empty_bodies,
        &events.trailers,
        &events.streams_finished,
    ]
    .iter()
    .map(|counter| read(counter))
    .collect();
    let delta = |index: usize| server_now[index] - server_before[index];
    let figures = RunFigures {
        clients,
        reporter,
        tally: tally.since(&before),
        handled: delta(0),
        panics_in_handler: delta(1),
        panics_mid_stream: delta(2),
        server_errors: delta(3),
        body_errors: delta(4),
        empty_bodies: delta(5),
        trailers: delta(6),
        streams_finished: delta(7),
        elapsed,
        end,
    };
    // Every admitted request reached the handler, and nothing else did.
    assert_eq!(figures.handled, figures.tally.admitted());
    figures
}

fn print_run(label: &str, figures: &RunFigures) {
    let clients = &figures.clients;
    let tally = &figures.tally;
    println!(
        "{label}: {} requests ({} over HTTP/2) in {:.1} s ({:.0}/s)\n\
         \x20 clients: completed {}, overloaded (529) {}, 500 {}, cut by the server {}\n\
         \x20 disconnects injected: {} (half head, before the gate {}; half body {}; \
         gave up waiting for the head {}; after the head, before the first token {}; mid-stream {})\n\
         \x20 server: handled {}, panics injected {} (in the handler {}, mid-stream {}), \
         500s {}, body errors {}, empty bodies {}, trailers {}, streams finished {}\n\
         \x20 engine: {} capacity reports; peak in engine {}, peak queued {}\n\
         \x20 gate tally: received {}, admitted {} (direct {}, from the queue {}), \
         rejected {} (rank {}, worker {}), cancelled {}\n\
         \x20 counts at the end: total {:?}, unranked {:?}, ranks {:?}",
        clients.requests,
        clients.http2,
        figures.elapsed.as_secs_f64(),
        clients.requests as f64 / figures.elapsed.as_secs_f64(),
        clients.completed,
        clients.overloaded,
        clients.server_errors,
        clients.cut_by_server,
        clients.disconnects(),
        clients.half_heads,
        clients.half_bodies,
        clients.gave_up_waiting,
        clients.dropped_after_head,
        clients.dropped_mid_stream,
        figures.handled,
        figures.panics_in_handler + figures.panics_mid_stream,
        figures.panics_in_handler,
        figures.panics_mid_stream,
        figures.server_errors,
        figures.body_errors,
        figures.empty_bodies,
        figures.trailers,
        figures.streams_finished,
        figures.reporter.reports,
        figures.reporter.most_in_engine,
        figures.reporter.most_queued,
        tally.received,
        tally.admitted(),
        tally.admitted_direct,
        tally.admitted_queue,
        tally.rejected(),
        tally.rejected_rank,
        tally.rejected_worker,
        tally.cancelled,
        figures.end.total,
        figures.end.unranked,
        figures.end.ranks,
    );
}

/// Every kind of chaos happened in a run large enough for it.
fn assert_exercised(figures: &RunFigures) {
    let clients = &figures.clients;
    let tally = &figures.tally;
    let happened = [
        ("half heads", clients.half_heads),
        ("half bodies", clients.half_bodies),
        ("give-ups while waiting", clients.gave_up_waiting),
        ("drops before the first token", clients.dropped_after_head),
        ("drops mid-stream", clients.dropped_mid_stream),
        ("panics in the handler", figures.panics_in_handler),
        ("panics mid-stream", figures.panics_mid_stream),
        ("500s", figures.server_errors),
        ("body errors", figures.body_errors),
        ("empty bodies", figures.empty_bodies),
        ("trailers", figures.trailers),
        ("admissions from the queue", tally.admitted_queue),
        ("cancellations while queued", tally.cancelled),
        ("rank-scoped rejections", tally.rejected_rank),
        ("worker-scoped rejections", tally.rejected_worker),
        ("completed streams", clients.completed),
    ];
    for (what, count) in happened {
        assert!(count > 0, "no {what} in {} requests", clients.requests);
    }
}

/// Resident memory of this process, in KiB, after the allocator has given
/// back what it holds free: what stays is what is still allocated, so the
/// comparison between runs measures retention, not the allocator's whims.
fn resident_kib() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's malloc_trim only returns free heap pages to the
        // system; it may be called at any time.
        unsafe {
            malloc_trim(0);
        }
    }
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// A worker whose defaults follow the engine (request limit `max_num_seqs`,
/// queue `2 × max_num_seqs` per rank) with an explicit waiting limit of 6
/// per rank, so that first tokens matter.
fn worker_gate() -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .engine_request_waiting_limit(6)
            .capacity(EngineCapacity::new(8, 2)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak of tens of thousands of requests: CHAOS_REQUESTS=20000 cargo test --release --test chaos -- --ignored"]
async fn chaos_soak() {
    quiet_injected_panics(INJECTED);
    let requests = env_or("CHAOS_REQUESTS", 20_000usize);
    let seed = seed();
    let gate = worker_gate();
    let mut server = serve(&gate).await;
    let rss_start = resident_kib();

    let first = run(&gate, &mut server, requests, seed).await;
    let rss_first = resident_kib();
    print_run("run 1", &first);
    let second = run(&gate, &mut server, requests, seed.wrapping_add(1)).await;
    let rss_second = resident_kib();
    print_run("run 2", &second);
    println!(
        "resident memory: {rss_start} KiB at the start, {rss_first} KiB after run 1, \
         {rss_second} KiB after run 2 ({:+.1}%)",
        (rss_second as f64 - rss_first as f64) * 100.0 / rss_first as f64
    );

    if requests >= 10_000 {
        assert_exercised(&first);
        assert_exercised(&second);
    }
    assert!(
        rss_second * 10 <= rss_first * 11,
        "resident memory grew from {rss_first} KiB to {rss_second} KiB over the second run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_smoke() {
    quiet_injected_panics(INJECTED);
    let seed = seed();
    let gate = worker_gate();
    let mut server = serve(&gate).await;
    let figures = run(
        &gate,
        &mut server,
        env_or("CHAOS_SMOKE_REQUESTS", 400),
        seed,
    )
    .await;
    print_run("smoke", &figures);
}

#[test]
fn plans_are_a_function_of_the_seed_and_index() {
    let (a, b) = (Plan::new(7, 42), Plan::new(7, 42));
    assert_eq!(
        (
            a.handler,
            a.tokens,
            a.act,
            a.ranks.clone(),
            a.http2,
            a.header()
        ),
        (
            b.handler,
            b.tokens,
            b.act,
            b.ranks.clone(),
            b.http2,
            b.header()
        )
    );
}
