//! Reading an admitted request's body before the gate sees the request
//! (issue 35, cases 3 and 6).
//!
//! Admission at the request head let a client that sends its body slowly
//! hold a queue place, then an engine slot, for as long as it liked: four
//! clients sending 12 bytes of a 100 kB body each filled a gate of two
//! slots and two queue places while the engine sat idle. So the body of
//! every request bound for the gate is read whole first, bounded in size
//! and in time: a slow sender holds a connection and a bounded buffer,
//! never a queue place or a slot, and is answered `408` when its time is
//! up; a body over the bound is `413`. A fully read body also lets the
//! HTTP server see the client's close while the request is queued,
//! whatever the body's size (hyper stops reading a socket once its body
//! buffer is full, so a queued client with a large unread body that left
//! was admitted and sent to the engine).
//!
//! Reading bodies whole costs memory, and the number of bodies a client can
//! have read at once is bounded only by its connections and streams: so the
//! bodies read or held (queued, on their way to the engine) share one
//! budget of bytes ([`RequestBodyLimits::max_total_bytes`]). A body whose
//! bytes find the budget spent is answered at once with the gate's overload
//! answer, reason `body_reads` (worker scope, counted in
//! `rejection_total`): like every overload answer, it never reached the
//! engine and may be sent again.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_admission::{Gate, RejectionReason};

use super::answer::json_error;
use super::body::Body;
use super::upstream::Replayable;

/// The default bound on an admitted request's body: 32 MiB (a few images
/// inline in a chat request).
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: usize = 32 << 20;

/// The default time a client has to send an admitted request's whole body,
/// from the moment its head is read.
pub const DEFAULT_REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// The default bound on the bytes of every body read or held at once: 256
/// MiB (eight of the largest bodies).
pub const DEFAULT_MAX_TOTAL_REQUEST_BODY_BYTES: usize = 256 << 20;

/// How an admitted request's body is read before admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestBodyLimits {
    /// The largest body; a larger one is answered `413`.
    pub max_bytes: usize,
    /// The time the whole body may take to arrive; a slower one is
    /// answered `408`.
    pub timeout: Duration,
    /// The bytes of every body being read, or read and not yet sent to the
    /// engine, at once; a body that finds them spent gets the overload
    /// answer with reason `body_reads`.
    pub max_total_bytes: usize,
}

impl Default for RequestBodyLimits {
    fn default() -> Self {
        RequestBodyLimits {
            max_bytes: DEFAULT_MAX_REQUEST_BODY_BYTES,
            timeout: DEFAULT_REQUEST_BODY_TIMEOUT,
            max_total_bytes: DEFAULT_MAX_TOTAL_REQUEST_BODY_BYTES,
        }
    }
}

impl RequestBodyLimits {
    /// Bodies up to `max_bytes`, whole within `timeout`, and the default
    /// bound on all of them at once.
    pub fn new(max_bytes: usize, timeout: Duration) -> Self {
        RequestBodyLimits {
            max_bytes,
            timeout,
            ..RequestBodyLimits::default()
        }
    }

    /// These limits, with `bytes` as the bound on the bytes of every body
    /// read or held at once.
    pub fn max_total_bytes(mut self, bytes: usize) -> Self {
        self.max_total_bytes = bytes;
        self
    }
}

/// The bodies' shared budget of bytes, and how a body that finds it spent
/// is answered.
#[derive(Debug, Clone)]
pub(crate) struct Intake {
    limits: RequestBodyLimits,
    budget: Arc<Semaphore>,
    gate: Gate,
    overload_status: StatusCode,
}

/// The bytes a request's body holds of the budget: an extension of the
/// request, given back when the request is dropped (answered, or sent).
#[derive(Debug, Clone)]
struct Held(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

/// A body's bytes found the budget spent.
struct Spent;

impl Intake {
    pub(crate) fn new(limits: RequestBodyLimits, gate: Gate, overload_status: StatusCode) -> Self {
        let permits = limits.max_total_bytes.min(Semaphore::MAX_PERMITS);
        Intake {
            limits,
            budget: Arc::new(Semaphore::new(permits)),
            gate,
            overload_status,
        }
    }

    /// Bytes of the budget free now (for tests).
    #[cfg(test)]
    fn free(&self) -> usize {
        self.budget.available_permits()
    }

    /// Reads `body` whole, up to `max_bytes`, taking each frame's bytes from
    /// the budget.
    async fn collect(
        &self,
        mut body: Body,
        held: &mut Option<OwnedSemaphorePermit>,
    ) -> Result<Result<Bytes, Spent>, ReadError> {
        let mut bytes = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|error| ReadError::Broken(error.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers: nothing the engine needs of them
            };
            if data.is_empty() {
                continue;
            }
            if bytes.len() + data.len() > self.limits.max_bytes {
                return Err(ReadError::TooLarge);
            }
            let taken = u32::try_from(data.len())
                .ok()
                .and_then(|n| Arc::clone(&self.budget).try_acquire_many_owned(n).ok());
            match (taken, held.as_mut()) {
                (None, _) => return Ok(Err(Spent)),
                (Some(taken), Some(held)) => held.merge(taken),
                (Some(taken), None) => *held = Some(taken),
            }
            bytes.extend_from_slice(&data);
        }
        Ok(Ok(bytes.freeze()))
    }

    /// `req` with its body read whole, or the answer to a body too large,
    /// too slow, broken off, or finding the budget spent.
    pub(crate) async fn read(&self, req: Request<Body>) -> Result<Request<Body>, Response<Body>> {
        let (parts, body) = req.into_parts();
        let mut held = None;
        let collected =
            match tokio::time::timeout(self.limits.timeout, self.collect(body, &mut held)).await {
                Ok(collected) => collected,
                Err(_) => {
                    tracing::debug!(
                        "a request body did not arrive within {:?}: 408",
                        self.limits.timeout
                    );
                    let mut answer = json_error(
                        StatusCode::REQUEST_TIMEOUT,
                        &format!(
                            "the request body did not arrive within {} s",
                            self.limits.timeout.as_secs_f64()
                        ),
                        "invalid_request_error",
                    );
                    answer.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                    return Err(answer);
                }
            };
        match collected {
            Ok(Ok(bytes)) => {
                let mut req = Request::from_parts(parts, Body::new(Full::new(bytes.clone())));
                req.extensions_mut().insert(Replayable(bytes));
                if let Some(held) = held {
                    req.extensions_mut().insert(Held(Arc::new(held)));
                }
                Ok(req)
            }
            Ok(Err(Spent)) => {
                tracing::warn!(
                    "request bodies hold {} bytes, the bound: a body answered with reason \
                     body_reads",
                    self.limits.max_total_bytes
                );
                let overloaded = self.gate.reject(RejectionReason::BodyReads);
                let answer =
                    tower_admission::http::overload_response(&overloaded, self.overload_status);
                Err(answer.map(Body::from))
            }
            Err(ReadError::TooLarge) => Err(json_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "the request body is larger than {} bytes",
                    self.limits.max_bytes
                ),
                "invalid_request_error",
            )),
            Err(ReadError::Broken(error)) => Err(json_error(
                StatusCode::BAD_REQUEST,
                &format!("the request body could not be read: {error}"),
                "invalid_request_error",
            )),
        }
    }
}

/// Why a body could not be read.
enum ReadError {
    TooLarge,
    Broken(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_admission::AdmissionConfig;

    fn intake(total: usize) -> Intake {
        let limits = RequestBodyLimits::new(1_000, Duration::from_secs(5)).max_total_bytes(total);
        let status = StatusCode::from_u16(529).unwrap();
        Intake::new(limits, Gate::new(AdmissionConfig::new()), status)
    }

    fn request(bytes: usize) -> Request<Body> {
        Request::post("/v1/chat/completions")
            .body(Body::from(Bytes::from(vec![b' '; bytes])))
            .unwrap()
    }

    #[tokio::test]
    async fn a_body_holds_its_bytes_of_the_bound_until_its_request_is_dropped() {
        let intake = intake(100);
        let first = intake.read(request(60)).await.unwrap();
        assert_eq!(intake.free(), 40);
        let refused = intake.read(request(60)).await.unwrap_err();
        assert_eq!(refused.status(), 529);
        assert_eq!(
            refused.headers()[tower_admission::http::REJECTION_REASON],
            "body_reads"
        );
        assert_eq!(intake.free(), 40, "a refused body gives back what it took");
        drop(first);
        assert_eq!(intake.free(), 100);
        let _again = intake.read(request(100)).await.unwrap();
        assert_eq!(intake.free(), 0);
    }

    #[tokio::test]
    async fn the_largest_bound_is_taken_as_the_most_a_semaphore_holds() {
        let intake = intake(usize::MAX);
        assert_eq!(intake.free(), Semaphore::MAX_PERMITS);
        let _read = intake.read(request(1_000)).await.unwrap();
    }
}
