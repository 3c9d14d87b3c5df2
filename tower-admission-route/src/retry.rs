//! A `tower::retry::Policy` for overload answers: polite retries.
//!
//! A rejected request never reached the engine, so it is safe to send again;
//! what is not safe is sending it again *at once, everywhere, every time*:
//! synchronized retries multiply the overload they answer. So a retry waits
//! a jittered exponential backoff (and at least the server's `Retry-After`
//! or `grpc-retry-pushback-ms` when no [`Worker`](super::Worker) took the
//! server out of rotation for that long already), spends a retry budget
//! shared by every request, and never runs past the request's deadline.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use tokio::time::{Instant, Sleep};
use tower::retry::Policy;
use tower::retry::budget::{Budget, TpsBudget};
use tower::util::rng::{HasherRng, Rng};

use super::answer::{OverloadAnswer, grpc_timeout};
use super::clock::later;
use super::worker::CooldownApplied;

/// The end-to-end deadline of a request, as a request extension: no retry
/// is sent (or waited for) past it. A request without one gets its deadline
/// from a `grpc-timeout` header, when it has one, counted from its first
/// send; otherwise only the budget and the retry limit bound its retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(pub Instant);

impl Deadline {
    /// The deadline `timeout` from now; a timeout past what the clock can
    /// count (`Duration::MAX`, say) is a deadline a century away.
    pub fn after(timeout: Duration) -> Deadline {
        Deadline(later(Instant::now(), timeout))
    }
}

/// A request body that can be sent again. A body that cannot (a stream
/// already being read) answers `None`, and its request is never retried.
pub trait ReplayBody: Sized {
    /// A copy to send again, or `None` when the body cannot be replayed.
    fn replay(&self) -> Option<Self>;
}

impl ReplayBody for Bytes {
    fn replay(&self) -> Option<Bytes> {
        Some(self.clone())
    }
}

impl ReplayBody for String {
    fn replay(&self) -> Option<String> {
        Some(self.clone())
    }
}

impl ReplayBody for Vec<u8> {
    fn replay(&self) -> Option<Vec<u8>> {
        Some(self.clone())
    }
}

impl ReplayBody for () {
    fn replay(&self) -> Option<()> {
        Some(())
    }
}

impl<D: Clone> ReplayBody for http_body_util::Full<D> {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}

impl<D> ReplayBody for http_body_util::Empty<D> {
    fn replay(&self) -> Option<Self> {
        Some(http_body_util::Empty::new())
    }
}

/// A streaming body: read once, so never replayed.
impl<D, E> ReplayBody for http_body_util::combinators::BoxBody<D, E> {
    fn replay(&self) -> Option<Self> {
        None
    }
}

/// A streaming body: read once, so never replayed.
impl<D, E> ReplayBody for http_body_util::combinators::UnsyncBoxBody<D, E> {
    fn replay(&self) -> Option<Self> {
        None
    }
}

/// A frontend that buffers small bodies (replayable) and streams large
/// ones (not) chooses per request.
impl<L: ReplayBody, R: ReplayBody> ReplayBody for http_body_util::Either<L, R> {
    fn replay(&self) -> Option<Self> {
        Some(match self {
            http_body_util::Either::Left(body) => http_body_util::Either::Left(body.replay()?),
            http_body_util::Either::Right(body) => http_body_util::Either::Right(body.replay()?),
        })
    }
}

/// The first retry waits at least this long (plus jitter); each further one
/// twice as long as the one before.
pub const DEFAULT_MIN_BACKOFF: Duration = Duration::from_millis(25);

/// The base of the backoff stops doubling here: no wait is longer than
/// twice this.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Retries of one request, whatever the budget still allows.
pub const DEFAULT_MAX_RETRIES: u32 = 3;

/// The longest `Retry-After` (or `grpc-retry-pushback-ms`) a retry waits
/// for: a server asking for an hour gets its retry after this long.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// A retry policy for overload answers (`529`, `503`, any error status with
/// the gate's scope header, gRPC `UNAVAILABLE` or any gRPC error but
/// `DEADLINE_EXCEEDED` with the scope header; see
/// [`OverloadAnswer`](super::OverloadAnswer)), for
/// `tower::retry::Retry` in front of a balancer of [`Worker`](super::Worker)s (so that
/// the retry goes to another worker) or of a single upstream.
///
/// - **Backoff**: exponential from [`DEFAULT_MIN_BACKOFF`] to
///   [`DEFAULT_MAX_BACKOFF`], each wait drawn uniformly between one and two
///   times its base, per request and to the nanosecond, so that requests
///   rejected together do not come back together — also once the base has
///   reached its maximum.
/// - **The server's word**: when the answer names `Retry-After` or
///   `grpc-retry-pushback-ms`, the retry waits at least that long, unless a
///   [`Worker`](super::Worker) already took the rejecting worker out of
///   rotation for that time (then the retry goes elsewhere after its
///   backoff). A negative pushback means "do not retry".
/// - **Budget**: every request deposits into a shared
///   `tower::retry::budget::TpsBudget`; every retry withdraws, and a retry
///   the budget cannot pay is not sent: the overload answer goes back to the
///   caller. [`OverloadRetry::default_budget`] allows retries of 5% of
///   requests plus one a second: under sustained overload the workers
///   receive at most `1.05 + 1 / (requests a second)` sends per request
///   (1.08 at 36 requests a second).
/// - **Deadline**: a retry that could not start before the request's
///   [`Deadline`] is not made.
/// - **Replay**: a request whose body cannot be replayed
///   ([`ReplayBody`] answers `None`) is sent once.
/// - **Only what never ran**: an answer with the gate's
///   `x-admission-rejection-scope` header was decided before the engine saw
///   the request, so it is retried whatever the method. Any other overload
///   answer (a `529` or `503` without the header, a gRPC `UNAVAILABLE`
///   without it, an engine's own answer passed on by the sidecar) is retried
///   only for idempotent methods (`GET`, `HEAD`, `PUT`, `DELETE`, …): a
///   `POST` whose handler failed after doing the work is not run twice. A
///   proxy that knows a request never left it (a worker it could not
///   connect to) says so with the scope header.
///
/// Transport errors are not retried: the request may have reached the
/// engine.
#[derive(Debug)]
pub struct OverloadRetry<G = TpsBudget> {
    budget: Arc<G>,
    min_backoff: Duration,
    max_backoff: Duration,
    max_retries: u32,
    max_retry_after: Duration,
    /// Sends of this request so far (the template's stays 0).
    sends: u32,
    /// This request's source of jitter, made at its first retry.
    rng: Option<HasherRng>,
}

impl<G> Clone for OverloadRetry<G> {
    /// A fresh policy for the next request: the same budget and settings,
    /// no sends yet.
    fn clone(&self) -> Self {
        OverloadRetry {
            budget: Arc::clone(&self.budget),
            min_backoff: self.min_backoff,
            max_backoff: self.max_backoff,
            max_retries: self.max_retries,
            max_retry_after: self.max_retry_after,
            sends: self.sends,
            rng: self.rng.clone(),
        }
    }
}

impl OverloadRetry {
    /// The budget [`OverloadRetry::new`] is usually given: over any ten
    /// seconds, retries worth 5% of the requests, plus one a second (so
    /// the first rejections of a quiet frontend can be retried too).
    pub fn default_budget() -> TpsBudget {
        TpsBudget::new(Duration::from_secs(10), 1, 0.05)
    }
}

impl<G: Budget> OverloadRetry<G> {
    /// A policy spending `budget`, shared with every clone (every request
    /// of the service, and any other service given the same budget).
    pub fn new(budget: Arc<G>) -> OverloadRetry<G> {
        OverloadRetry {
            budget,
            min_backoff: DEFAULT_MIN_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            max_retries: DEFAULT_MAX_RETRIES,
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
            sends: 0,
            rng: None,
        }
    }

    /// Sets the backoff's bounds: the first retry waits between `min` and
    /// twice `min`, each later one from a base twice as long, the base
    /// never more than `max` (so no wait is longer than twice `max`).
    ///
    /// # Panics
    ///
    /// When `min` is longer than `max`, or `max` is zero; the message names
    /// both values.
    pub fn backoff(self, min: Duration, max: Duration) -> OverloadRetry<G> {
        assert!(
            min <= max && !max.is_zero(),
            "OverloadRetry::backoff: min ({min:?}) must not exceed max ({max:?}), and max must be positive"
        );
        OverloadRetry {
            min_backoff: min,
            max_backoff: max,
            ..self
        }
    }

    /// At most `retries` retries of one request (default
    /// [`DEFAULT_MAX_RETRIES`]), however much budget is left.
    pub fn max_retries(self, retries: u32) -> OverloadRetry<G> {
        OverloadRetry {
            max_retries: retries,
            ..self
        }
    }

    /// The longest `Retry-After` honoured; [`DEFAULT_MAX_RETRY_AFTER`] by
    /// default. A longer one is waited for this long only, so a worker's
    /// header (or a hostile one) cannot park a request for an hour.
    pub fn max_retry_after(self, max: Duration) -> OverloadRetry<G> {
        OverloadRetry {
            max_retry_after: max,
            ..self
        }
    }

    /// The shared budget.
    pub fn budget(&self) -> &Arc<G> {
        &self.budget
    }

    /// The next backoff sleep of this request: its base is `min` doubled
    /// for each retry so far, at most `max`; the wait is drawn uniformly
    /// between the base and twice the base.
    ///
    /// (tower's `ExponentialBackoff` is not used: it draws whole seconds
    /// of a base of whole seconds, and no jitter at all once the base
    /// reaches its maximum, so requests rejected together would come back
    /// together.)
    fn next_backoff(&mut self) -> Sleep {
        let retries_before = self.sends.saturating_sub(1);
        let base = self
            .min_backoff
            .checked_mul(2u32.saturating_pow(retries_before))
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff);
        // A fresh generator per request: tower's HasherRng repeats its
        // sequence when cloned, and requests rejected together must not
        // wait alike.
        let jitter = self.rng.get_or_insert_with(HasherRng::default).next_f64();
        tokio::time::sleep(base.mul_f64(1.0 + jitter))
    }
}

impl<G, B, ResBody, E> Policy<Request<B>, Response<ResBody>, E> for OverloadRetry<G>
where
    G: Budget,
    B: ReplayBody,
{
    type Future = RetryDelay;

    fn retry(
        &mut self,
        request: &mut Request<B>,
        result: &mut Result<Response<ResBody>, E>,
    ) -> Option<RetryDelay> {
        if self.sends == 0 {
            self.budget.deposit();
        }
        self.sends += 1;
        let response = result.as_ref().ok()?;
        let answer = OverloadAnswer::read(response)?;
        // Only the gate's own answer says the request never reached the
        // engine. Any other overload status (a plain 503 from a handler that
        // did the work, an engine's own through the sidecar) may follow work
        // done: sent again, a request that is not idempotent might run twice.
        if !answer.from_gate && !request.method().is_idempotent() {
            return None;
        }
        if !answer.retry_allowed || self.sends > self.max_retries {
            return None;
        }
        let mut sleep = Box::pin(self.next_backoff());
        let mut at = sleep.deadline();
        if response.extensions().get::<CooldownApplied>().is_none() {
            if let Some(retry_after) = answer.retry_after {
                let retry_after = retry_after.min(self.max_retry_after);
                at = at.max(later(Instant::now(), retry_after));
            }
        }
        if let Some(Deadline(deadline)) = request.extensions().get::<Deadline>() {
            if at >= *deadline {
                return None;
            }
        }
        // Last: a retry refused for another reason spends nothing.
        if !self.budget.withdraw() {
            return None;
        }
        sleep.as_mut().reset(at);
        Some(RetryDelay { sleep })
    }

    fn clone_request(&mut self, request: &Request<B>) -> Option<Request<B>> {
        let body = request.body().replay()?;
        let mut clone = Request::new(body);
        *clone.method_mut() = request.method().clone();
        *clone.uri_mut() = request.uri().clone();
        *clone.version_mut() = request.version();
        *clone.headers_mut() = request.headers().clone();
        *clone.extensions_mut() = request.extensions().clone();
        if clone.extensions().get::<Deadline>().is_none() {
            // First send: a gRPC deadline counts from now.
            if let Some(timeout) = grpc_timeout(request.headers()) {
                clone.extensions_mut().insert(Deadline::after(timeout));
            }
        }
        Some(clone)
    }
}

/// The wait before a retry (a `tower::retry::Policy` future).
#[derive(Debug)]
pub struct RetryDelay {
    sleep: Pin<Box<Sleep>>,
}

impl RetryDelay {
    /// When the retry will be sent.
    pub fn deadline(&self) -> Instant {
        self.sleep.deadline()
    }
}

impl Future for RetryDelay {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.sleep.as_mut().poll(cx)
    }
}
