//! One worker as a frontend sees it: a client service wrapped so that the
//! overload answers it returns steer the balancer.
//!
//! A worker-scoped rejection makes the worker report itself not ready until
//! its cooldown ends; `tower::balance` keeps a not-ready endpoint in its
//! pending set, polls it again when it wakes its task, and meanwhile routes
//! elsewhere. A rank-scoped rejection leaves the worker ready and marks the
//! rank busy. The in-flight count is the worker's [`Load`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use http::{HeaderName, Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::load::Load;
use tower_layer::Layer;
use tower_service::Service;

use super::answer::OverloadAnswer;
use tower_admission::{MAX_DP_RANKS, RejectionScope};

/// The longest a worker stays out of rotation after one rejection, and the
/// cooldown of an overload answer that names no `Retry-After`.
pub const MAX_COOLDOWN: Duration = Duration::from_secs(1);

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// Wraps each worker's client service in a [`Worker`].
#[derive(Debug, Clone, Copy)]
pub struct WorkerLayer {
    max_cooldown: Duration,
}

impl WorkerLayer {
    /// Cooldowns of at most [`MAX_COOLDOWN`] (one second).
    pub fn new() -> WorkerLayer {
        WorkerLayer {
            max_cooldown: MAX_COOLDOWN,
        }
    }

    /// Caps the cooldown after a rejection (and the time a rank stays busy)
    /// at `max`, which is also the cooldown when an overload answer names
    /// no `Retry-After`. Zero turns cooldowns off: the worker stays in
    /// rotation and only its load steers the balancer.
    pub fn max_cooldown(self, max: Duration) -> WorkerLayer {
        WorkerLayer { max_cooldown: max }
    }
}

impl Default for WorkerLayer {
    fn default() -> WorkerLayer {
        WorkerLayer::new()
    }
}

impl<S> Layer<S> for WorkerLayer {
    type Service = Worker<S>;

    fn layer(&self, inner: S) -> Worker<S> {
        Worker {
            inner,
            shared: Arc::new(Shared::new(self.max_cooldown)),
            sleep: None,
        }
    }
}

/// A worker's client service that reads the worker's overload answers.
///
/// - After a **worker-scoped** rejection it is not ready (`poll_ready` is
///   `Pending`, with a timer that wakes the task) until the cooldown ends:
///   the answer's `Retry-After` (or `grpc-retry-pushback-ms`), at most the
///   layer's maximum, one second by default. A later successful answer, or
///   [`WorkerHandle::mark_healthy`], ends it early.
/// - After a **rank-scoped** rejection it stays ready and records the rank
///   as busy for as long ([`WorkerHandle::busy_ranks`]), so that a
///   rank-aware router can pick another rank.
/// - Its [`Load`] is the number of requests in flight: called, and whose
///   response has not ended (the count falls when the response body ends
///   or is dropped, not when the head arrives: a streamed answer keeps the
///   engine busy until its last token).
///
/// One `Worker` is polled by one task (the balancer's, or a `Buffer`'s): it
/// is not `Clone`. [`WorkerHandle`]s observe it from anywhere.
#[derive(Debug)]
pub struct Worker<S> {
    inner: S,
    shared: Arc<Shared>,
    /// The cooldown timer, kept between polls so its registration holds.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S> Worker<S> {
    /// Wraps `inner` with the default cooldown cap ([`MAX_COOLDOWN`]).
    pub fn new(inner: S) -> Worker<S> {
        WorkerLayer::new().layer(inner)
    }

    /// A handle on this worker's state: cooldown, busy ranks, counts.
    pub fn handle(&self) -> WorkerHandle {
        WorkerHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S> Load for Worker<S> {
    type Metric = usize;

    fn load(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Worker<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        // Loops because a cooldown may be extended while its timer runs.
        while let Some(until) = self.shared.cooling_until(cx.waker()) {
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
            if sleep.deadline() != until {
                sleep.as_mut().reset(until);
            }
            ready!(sleep.as_mut().poll(cx));
        }
        self.sleep = None;
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        self.shared.requests.fetch_add(1, Ordering::Relaxed);
        let in_flight = InFlight::new(Arc::clone(&self.shared));
        ResponseFuture {
            inner: self.inner.call(request),
            in_flight: Some(in_flight),
        }
    }
}

pin_project! {
    /// The response future of a [`Worker`].
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        in_flight: Option<InFlight>,
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.inner.poll(cx))?;
        let in_flight = this
            .in_flight
            .take()
            .expect("ResponseFuture polled after completion");
        if in_flight.shared.observe(&response) {
            // The cooldown stands for the answer's Retry-After: a retry
            // policy need not wait for it as well.
            response.extensions_mut().insert(CooldownApplied);
        }
        let response = response.map(|body| ResponseBody {
            inner: body,
            in_flight: Some(in_flight),
        });
        Poll::Ready(Ok(response))
    }
}

/// Marks an overload answer whose `Retry-After` a [`Worker`] has already
/// turned into a cooldown.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CooldownApplied;

pin_project! {
    /// The response body of a [`Worker`]: the request counts as in flight
    /// until it ends or is dropped.
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        inner: B,
        in_flight: Option<InFlight>,
    }
}

impl<B: Body> Body for ResponseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        let ended = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(frame)) => frame.is_trailers(),
        };
        if ended {
            *this.in_flight = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// One request in flight; dropping it takes it off the worker's load.
#[derive(Debug)]
pub(crate) struct InFlight {
    shared: Arc<Shared>,
}

impl InFlight {
    fn new(shared: Arc<Shared>) -> InFlight {
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight { shared }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Observes a [`Worker`] from outside: for metrics, for a rank-aware
/// router, and to feed it health signals. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WorkerHandle {
    shared: Arc<Shared>,
}

impl WorkerHandle {
    /// Whether the worker is out of rotation after a worker-scoped
    /// rejection.
    pub fn is_cooling(&self) -> bool {
        self.cooldown_remaining().is_some()
    }

    /// How much of the current cooldown is left.
    pub fn cooldown_remaining(&self) -> Option<Duration> {
        let now = Instant::now();
        self.shared
            .state()
            .cooling_until
            .filter(|&until| until > now)
            .map(|until| until - now)
    }

    /// A health signal (a passing probe, say): ends the cooldown and
    /// forgets the busy ranks at once.
    pub fn mark_healthy(&self) {
        let mut state = self.shared.state();
        state.busy_ranks.clear();
        state.end_cooldown();
    }

    /// The ranks that rejected a request with rank scope and are still
    /// within their busy time, in increasing order.
    pub fn busy_ranks(&self) -> Vec<u32> {
        let now = Instant::now();
        let mut state = self.shared.state();
        state.busy_ranks.retain(|&(_, until)| until > now);
        let mut ranks: Vec<u32> = state.busy_ranks.iter().map(|&(rank, _)| rank).collect();
        ranks.sort_unstable();
        ranks
    }

    /// Whether `rank` rejected a request with rank scope within its busy
    /// time.
    pub fn is_rank_busy(&self, rank: u32) -> bool {
        let now = Instant::now();
        self.shared
            .state()
            .busy_ranks
            .iter()
            .any(|&(busy, until)| busy == rank && until > now)
    }

    /// Requests called and not yet ended: the worker's load.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// Counts since the worker was wrapped.
    pub fn stats(&self) -> WorkerStats {
        let shared = &self.shared;
        WorkerStats {
            requests: shared.requests.load(Ordering::Relaxed),
            worker_rejections: shared.worker_rejections.load(Ordering::Relaxed),
            rank_rejections: shared.rank_rejections.load(Ordering::Relaxed),
            cooldowns: shared.cooldowns.load(Ordering::Relaxed),
        }
    }
}

/// What a [`Worker`] has seen, counted since it was wrapped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerStats {
    /// Requests sent to the worker.
    pub requests: u64,
    /// Overload answers with worker scope.
    pub worker_rejections: u64,
    /// Overload answers with rank scope.
    pub rank_rejections: u64,
    /// Times the worker left rotation (a rejection while already cooling
    /// extends the cooldown and is not counted again).
    pub cooldowns: u64,
}

#[derive(Debug)]
struct Shared {
    max_cooldown: Duration,
    in_flight: AtomicUsize,
    requests: AtomicU64,
    worker_rejections: AtomicU64,
    rank_rejections: AtomicU64,
    cooldowns: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    cooling_until: Option<Instant>,
    /// At most `MAX_DP_RANKS` entries: ranks beyond are not recorded.
    busy_ranks: Vec<(u32, Instant)>,
    /// The task waiting in `poll_ready` for the cooldown to end.
    waker: Option<Waker>,
}

impl State {
    fn end_cooldown(&mut self) {
        if self.cooling_until.take().is_some() {
            if let Some(waker) = self.waker.take() {
                waker.wake();
            }
        }
    }
}

impl Shared {
    fn new(max_cooldown: Duration) -> Shared {
        Shared {
            max_cooldown,
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            worker_rejections: AtomicU64::new(0),
            rank_rejections: AtomicU64::new(0),
            cooldowns: AtomicU64::new(0),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state stays consistent at every step: a panic elsewhere
        // cannot leave it half-updated.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The end of the current cooldown, with `waker` registered to hear of
    /// an early end; `None` (and no cooldown left) once it is over.
    /// Registering under the lock means an early end cannot slip between
    /// the check and the registration.
    fn cooling_until(&self, waker: &Waker) -> Option<Instant> {
        let mut state = self.state();
        match state.cooling_until {
            Some(until) if until > Instant::now() => {
                match &state.waker {
                    Some(registered) if registered.will_wake(waker) => {}
                    _ => state.waker = Some(waker.clone()),
                }
                Some(until)
            }
            Some(_) => {
                state.cooling_until = None;
                state.waker = None;
                None
            }
            None => None,
        }
    }

    /// Acts on one answer; `true` when it started or extended a cooldown.
    fn observe<B>(&self, response: &Response<B>) -> bool {
        let Some(answer) = OverloadAnswer::read(response) else {
            if is_success(response) {
                self.state().end_cooldown();
            }
            return false;
        };
        let hold = answer
            .retry_after
            .unwrap_or(self.max_cooldown)
            .min(self.max_cooldown);
        let until = super::clock::later(Instant::now(), hold);
        match answer.scope {
            RejectionScope::Worker => {
                self.worker_rejections.fetch_add(1, Ordering::Relaxed);
                if hold.is_zero() {
                    return false;
                }
                let mut state = self.state();
                let was_cooling = state
                    .cooling_until
                    .is_some_and(|current| current > Instant::now());
                if state.cooling_until.is_none_or(|current| current < until) {
                    state.cooling_until = Some(until);
                }
                drop(state);
                if !was_cooling {
                    self.cooldowns.fetch_add(1, Ordering::Relaxed);
                }
                true
            }
            RejectionScope::Rank(rank) => {
                self.rank_rejections.fetch_add(1, Ordering::Relaxed);
                if hold.is_zero() || rank as usize >= MAX_DP_RANKS {
                    return false;
                }
                let now = Instant::now();
                let mut state = self.state();
                state
                    .busy_ranks
                    .retain(|&(busy, end)| busy != rank && end > now);
                state.busy_ranks.push((rank, until));
                false
            }
            // A scope this frontend does not know (a later gate's) keeps the
            // worker in rotation: only a worker-scoped answer takes it out.
            _ => false,
        }
    }
}

/// A `2xx` that is not a gRPC error in trailers-only form.
fn is_success<B>(response: &Response<B>) -> bool {
    response.status().is_success()
        && response
            .headers()
            .get(GRPC_STATUS)
            .is_none_or(|code| code.as_bytes() == b"0")
}
