//! Scripted workers for the frontend's virtual-time tests
//! (`tests/route_worker.rs`, `tests/route_retry.rs`): services answering
//! what the gate answers (the same headers, statuses and gRPC trailers-only
//! form), from a script, noting when each request arrived.

#![allow(dead_code)] // each test binary uses part of it

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

pub type Body = Full<Bytes>;

/// What a scripted worker answers to its `n`th request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Ok,
    /// `529`, worker scope, with this `Retry-After` (if any).
    WorkerOverloaded(Option<&'static str>),
    /// `529`, rank scope.
    RankOverloaded(u32),
    /// gRPC trailers-only `UNAVAILABLE` with this pushback (if any).
    GrpcUnavailable(Option<&'static str>),
}

pub fn response(answer: Answer) -> Response<Body> {
    let builder = Response::builder();
    let builder = match answer {
        Answer::Ok => builder.status(200),
        Answer::WorkerOverloaded(retry_after) => {
            let builder = builder
                .status(529)
                .header("content-type", "application/json")
                .header("x-admission-rejection-scope", "worker");
            match retry_after {
                Some(value) => builder.header("retry-after", value),
                None => builder,
            }
        }
        Answer::RankOverloaded(rank) => builder
            .status(529)
            .header("x-admission-rejection-scope", "rank")
            .header("x-admission-rank", rank),
        Answer::GrpcUnavailable(pushback) => {
            let builder = builder
                .status(200)
                .header("content-type", "application/grpc")
                .header("grpc-status", "14")
                .header("x-admission-rejection-scope", "worker");
            match pushback {
                Some(value) => builder.header("grpc-retry-pushback-ms", value),
                None => builder,
            }
        }
    };
    let body = match answer {
        Answer::Ok => "ok",
        _ => r#"{"error":{"type":"overloaded"}}"#,
    };
    builder.body(Full::new(Bytes::from(body))).unwrap()
}

/// A worker that answers from a script (the last answer repeats) and notes
/// when each request arrived.
#[derive(Clone)]
pub struct Scripted {
    pub script: Arc<Mutex<VecDeque<Answer>>>,
    pub arrivals: Arc<Mutex<Vec<Instant>>>,
}

impl Scripted {
    pub fn new(script: &[Answer]) -> Scripted {
        Scripted {
            script: Arc::new(Mutex::new(script.iter().copied().collect())),
            arrivals: Arc::default(),
        }
    }

    pub fn always(answer: Answer) -> Scripted {
        Scripted::new(&[answer])
    }

    pub fn arrivals(&self) -> Vec<Instant> {
        self.arrivals.lock().unwrap().clone()
    }

    pub fn received(&self) -> usize {
        self.arrivals.lock().unwrap().len()
    }
}

impl Service<Request<Body>> for Scripted {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        self.arrivals.lock().unwrap().push(Instant::now());
        let mut script = self.script.lock().unwrap();
        let answer = if script.len() > 1 {
            script.pop_front().unwrap()
        } else {
            script[0]
        };
        std::future::ready(Ok(response(answer)))
    }
}

pub fn request() -> Request<Body> {
    Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"prompt":"Hi"}"#)))
        .unwrap()
}

/// Whether a worker is ready now, polled from a task that records wake-ups.
pub fn poll_ready<S: Service<Request<Body>>>(
    task: &mut tokio_test::task::Spawn<()>,
    worker: &mut S,
) -> bool
where
    S::Error: std::fmt::Debug,
{
    match task.enter(|cx, _| worker.poll_ready(cx)) {
        Poll::Ready(result) => {
            result.unwrap();
            true
        }
        Poll::Pending => false,
    }
}

/// Sends one request through a ready worker and reads the answer's status.
pub async fn send<S>(worker: &mut S) -> StatusCode
where
    S: Service<Request<Body>, Response = Response<tower_admission_route::ResponseBody<Body>>>,
    S::Error: std::fmt::Debug,
{
    let response = worker.ready().await.unwrap().call(request()).await.unwrap();
    let status = response.status();
    response.into_body().collect().await.unwrap();
    status
}
