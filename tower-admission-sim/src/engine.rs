//! [`SimEngine`]: a simulated continuous-batching engine, one tokio task per
//! data-parallel rank, each driving a [`scheduler`](super::scheduler).

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::mpsc;

use super::config::{EngineConfig, Token};
use super::scheduler::{Batch, Scheduler};
use super::time;
use tower_admission::{EngineCapacity, Gate};

/// A request for the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Prompt length in tokens (0 counts as 1).
    pub prompt_tokens: usize,
    /// Tokens to generate (0 counts as 1: a request always samples at least
    /// one token).
    pub output_tokens: usize,
    /// The data-parallel rank to run on; `None` lets the engine pick the
    /// rank with the fewest unfinished requests.
    pub rank: Option<u32>,
}

/// Why the engine did not take a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    /// Prompt and output together need more KV blocks than one rank has.
    TooLong {
        /// Prompt plus output tokens of the request.
        tokens: usize,
        /// Tokens the KV cache of one rank holds.
        kv_tokens: usize,
    },
    /// The rank does not exist.
    UnknownRank(u32),
    /// The engine's tasks have stopped (their runtime shut down).
    Stopped,
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitError::TooLong { tokens, kv_tokens } => write!(
                f,
                "request of {tokens} tokens does not fit a KV cache of {kv_tokens} tokens"
            ),
            SubmitError::UnknownRank(rank) => write!(f, "no data-parallel rank {rank}"),
            SubmitError::Stopped => f.write_str("the simulated engine has stopped"),
        }
    }
}

impl std::error::Error for SubmitError {}

/// Counters and occupancy of an engine (or one of its ranks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Steps run.
    pub steps: u64,
    /// Time spent running steps (simulated, unscaled).
    pub busy: Duration,
    /// Requests preempted (each preemption counts once).
    pub preemptions: u64,
    /// Requests that generated all their tokens.
    pub completed: u64,
    /// Requests cancelled before they completed.
    pub cancelled: u64,
    /// Requests in the running batch now.
    pub running: usize,
    /// Requests in the engine's waiting queue now.
    pub waiting: usize,
    /// KV blocks in use now.
    pub kv_blocks_used: usize,
}

impl EngineStats {
    fn add(mut self, other: EngineStats) -> EngineStats {
        self.steps += other.steps;
        self.busy += other.busy;
        self.preemptions += other.preemptions;
        self.completed += other.completed;
        self.cancelled += other.cancelled;
        self.running += other.running;
        self.waiting += other.waiting;
        self.kv_blocks_used += other.kv_blocks_used;
        self
    }
}

/// A simulated continuous-batching engine: one task per data-parallel rank.
/// Cheap to clone; clones share the engine. Its tasks end when the handle
/// and every [`TokenStream`] have been dropped.
///
/// The engine takes every request it is given into its own unbounded
/// waiting queue, as an engine does without admission control in front of
/// it. Made inside a [`VirtualRuntime`](super::VirtualRuntime) it runs in
/// virtual time and is deterministic: no wall clock, no randomness; made
/// on a tokio runtime it runs in real time (scaled by
/// [`EngineConfig::time_scale`]), on tokio's timer.
///
/// Implements [`tower::Service`]: the response
/// future resolves as soon as the engine has queued the request, like
/// the response headers of a streaming HTTP answer.
///
/// ```
/// use std::time::Duration;
/// use tower_admission_sim::{self as sim, EngineConfig, Request, SimEngine, VirtualRuntime};
///
/// VirtualRuntime::new().block_on(async {
///     let engine = SimEngine::new(EngineConfig::default());
///     let start = sim::now();
///     let mut stream = engine
///         .submit(Request { prompt_tokens: 100, output_tokens: 3, rank: None })
///         .unwrap();
///     let first = stream.next_token().await.unwrap();
///     // One step: 5753 µs + 100 × 17.25 µs.
///     assert_eq!(sim::now() - start, Duration::from_micros(7478));
///     assert_eq!(first.index, 0);
///     while let Some(token) = stream.next_token().await {
///         if token.last {
///             assert_eq!(token.index, 2);
///         }
///     }
/// });
/// ```
#[derive(Clone)]
pub struct SimEngine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    config: EngineConfig,
    ranks: Vec<RankHandle>,
    next_id: AtomicU64,
    /// The step-time factor's bits (an `f64`), shared with every rank.
    slowdown: Arc<AtomicU64>,
}

struct RankHandle {
    commands: mpsc::UnboundedSender<Command>,
    shared: Arc<RankShared>,
}

/// What a rank's task and its handles share.
#[derive(Default)]
struct RankShared {
    /// Submitted requests that have neither finished nor been cancelled:
    /// the load that picks a rank for an unranked request.
    unfinished: AtomicUsize,
    stats: Mutex<EngineStats>,
}

enum Command {
    Submit {
        id: u64,
        prompt_tokens: usize,
        output_tokens: usize,
        tokens: mpsc::UnboundedSender<Token>,
    },
    Cancel {
        id: u64,
    },
}

impl fmt::Debug for SimEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimEngine")
            .field("config", &self.inner.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl SimEngine {
    /// Starts the engine's tasks on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, or if a count in `config` is 0 or
    /// `time_scale` is not positive.
    #[track_caller]
    pub fn new(config: EngineConfig) -> SimEngine {
        config.validate();
        let slowdown = Arc::new(AtomicU64::new(1.0f64.to_bits()));
        let ranks = (0..config.dp_ranks)
            .map(|_| {
                let (commands, receiver) = mpsc::unbounded_channel();
                let shared = Arc::new(RankShared::default());
                time::spawn(run_rank(
                    config.clone(),
                    receiver,
                    Arc::clone(&shared),
                    Arc::clone(&slowdown),
                ));
                RankHandle { commands, shared }
            })
            .collect();
        SimEngine {
            inner: Arc::new(EngineInner {
                config,
                ranks,
                next_id: AtomicU64::new(0),
                slowdown,
            }),
        }
    }

    /// The engine's configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Slows every rank down (or speeds it up) from its next step on:
    /// each step takes `factor ×` the time of [`EngineConfig::step_time`]
    /// (2.0: half speed, as a longer decode or a throttled GPU; 1.0: as
    /// configured). What the engine reports does not change: a gate learns
    /// of it only by what it measures.
    ///
    /// # Panics
    ///
    /// If `factor` is not a positive, finite number.
    pub fn set_slowdown(&self, factor: f64) {
        assert!(
            factor.is_finite() && factor > 0.0,
            "the slowdown factor must be positive, not {factor}"
        );
        self.inner
            .slowdown
            .store(factor.to_bits(), Ordering::Relaxed);
    }

    /// What the engine reports to a gate.
    pub fn capacity(&self) -> EngineCapacity {
        self.inner.config.capacity()
    }

    /// Reports the engine's capacity to `gate`, as a real engine does when
    /// it starts: the gate's defaults follow it.
    pub fn report_to(&self, gate: &Gate) {
        gate.report_capacity(self.capacity());
    }

    /// Hands a request to the engine; it joins the back of its rank's
    /// waiting queue. Tokens arrive on the returned stream; dropping the
    /// stream before its last token cancels the request in the engine and
    /// frees its slot and KV.
    pub fn submit(&self, request: Request) -> Result<TokenStream, SubmitError> {
        let config = &self.inner.config;
        let prompt_tokens = request.prompt_tokens.max(1);
        let output_tokens = request.output_tokens.max(1);
        let tokens = prompt_tokens + output_tokens;
        if tokens.div_ceil(config.block_size) > config.kv_blocks {
            return Err(SubmitError::TooLong {
                tokens,
                kv_tokens: config.kv_blocks * config.block_size,
            });
        }
        let rank = match request.rank {
            Some(rank) if (rank as usize) < self.inner.ranks.len() => rank,
            Some(rank) => return Err(SubmitError::UnknownRank(rank)),
            None => self.least_loaded_rank(),
        };
        let handle = &self.inner.ranks[rank as usize];
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = mpsc::unbounded_channel();
        handle.shared.unfinished.fetch_add(1, Ordering::Relaxed);
        let submitted = handle.commands.send(Command::Submit {
            id,
            prompt_tokens,
            output_tokens,
            tokens: sender,
        });
        if submitted.is_err() {
            handle.shared.unfinished.fetch_sub(1, Ordering::Relaxed);
            return Err(SubmitError::Stopped);
        }
        Ok(TokenStream {
            tokens: receiver,
            cancel: Some((handle.commands.clone(), id)),
            rank,
        })
    }

    fn least_loaded_rank(&self) -> u32 {
        let (rank, _) = self
            .inner
            .ranks
            .iter()
            .enumerate()
            .min_by_key(|(_, handle)| handle.shared.unfinished.load(Ordering::Relaxed))
            .expect("at least one rank");
        rank as u32
    }

    /// Counters and occupancy over all ranks, as of the last step.
    pub fn stats(&self) -> EngineStats {
        (0..self.inner.ranks.len())
            .map(|rank| self.rank_stats(rank as u32))
            .fold(EngineStats::default(), EngineStats::add)
    }

    /// Counters and occupancy of one rank, as of its last step.
    ///
    /// # Panics
    ///
    /// If the rank does not exist.
    pub fn rank_stats(&self, rank: u32) -> EngineStats {
        *self.inner.ranks[rank as usize]
            .shared
            .stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl tower::Service<Request> for SimEngine {
    type Response = TokenStream;
    type Error = SubmitError;
    type Future = std::future::Ready<Result<TokenStream, SubmitError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SubmitError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        std::future::ready(self.submit(request))
    }
}

/// The tokens of one request, as the engine samples them; ends after the
/// token marked [`last`](Token::last). Dropping it earlier cancels the
/// request in the engine.
pub struct TokenStream {
    tokens: mpsc::UnboundedReceiver<Token>,
    /// Where to send the cancellation, until the last token arrived.
    cancel: Option<(mpsc::UnboundedSender<Command>, u64)>,
    rank: u32,
}

impl fmt::Debug for TokenStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenStream")
            .field("rank", &self.rank)
            .field("finished", &self.cancel.is_none())
            .finish()
    }
}

impl TokenStream {
    /// The rank the request runs on.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The next token; `None` once the last one was taken (or the engine
    /// stopped).
    pub async fn next_token(&mut self) -> Option<Token> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }
}

impl Stream for TokenStream {
    type Item = Token;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Token>> {
        let this = self.get_mut();
        let polled = this.tokens.poll_recv(cx);
        if let Poll::Ready(Some(Token { last: true, .. })) = polled {
            this.cancel = None;
        }
        polled
    }
}

impl Drop for TokenStream {
    fn drop(&mut self) {
        if let Some((commands, id)) = self.cancel.take() {
            // The engine may be gone already; then there is nothing to free.
            let _ = commands.send(Command::Cancel { id });
        }
    }
}

/// The task of one rank: takes in commands between steps, runs steps back
/// to back while there is work, and sleeps on its command channel when
/// there is none.
///
/// The rank keeps its own clock in exact model time (`clock`, since
/// `epoch`): tokio's timer has a 1 ms grid, so on tokio a step wakes up to
/// 1 ms late, but the next step starts from the exact end of this one and
/// the error never accumulates. (The virtual clock has no grid.)
async fn run_rank(
    config: EngineConfig,
    mut commands: mpsc::UnboundedReceiver<Command>,
    shared: Arc<RankShared>,
    slowdown: Arc<AtomicU64>,
) {
    let mut scheduler = Scheduler::new(&config);
    let epoch = time::now();
    let mut clock = Duration::ZERO;
    let mut stats = EngineStats::default();
    loop {
        while let Ok(command) = commands.try_recv() {
            apply(&mut scheduler, &shared, &mut stats, command);
        }
        if scheduler.is_idle() {
            publish(&scheduler, &shared, &mut stats);
            match commands.recv().await {
                Some(command) => apply(&mut scheduler, &shared, &mut stats, command),
                None => return,
            }
            // Idle until now: the next step starts now, not when the
            // last one ended.
            clock = clock.max((time::now() - epoch).div_f64(config.time_scale));
            continue;
        }
        let batch: Batch = scheduler.schedule();
        let step = config
            .step_time
            .of(batch.prefill_tokens, batch.decode_tokens);
        let factor = f64::from_bits(slowdown.load(Ordering::Relaxed));
        // Exact when unchanged: no rounding through f64 by default.
        let step = if factor == 1.0 {
            step
        } else {
            step.mul_f64(factor)
        };
        clock += step;
        time::sleep_until(epoch + clock.mul_f64(config.time_scale)).await;
        let finished = scheduler.complete(|sender, token| {
            // A receiver that is gone has sent its cancellation, which
            // is taken in before the next step.
            let _ = sender.send(token);
        });
        shared.unfinished.fetch_sub(finished, Ordering::Relaxed);
        stats.steps += 1;
        stats.busy += step;
        stats.preemptions += batch.preempted as u64;
        stats.completed += finished as u64;
        debug_assert!(!batch.is_empty() || batch.preempted > 0);
        publish(&scheduler, &shared, &mut stats);
    }
}

fn apply(
    scheduler: &mut Scheduler<mpsc::UnboundedSender<Token>>,
    shared: &RankShared,
    stats: &mut EngineStats,
    command: Command,
) {
    match command {
        Command::Submit {
            id,
            prompt_tokens,
            output_tokens,
            tokens,
        } => scheduler.add(id, prompt_tokens, output_tokens, tokens),
        Command::Cancel { id } => {
            if scheduler.cancel(id).is_some() {
                shared.unfinished.fetch_sub(1, Ordering::Relaxed);
                stats.cancelled += 1;
            }
        }
    }
}

fn publish<P>(scheduler: &Scheduler<P>, shared: &RankShared, stats: &mut EngineStats) {
    let occupancy = scheduler.occupancy();
    stats.running = occupancy.running;
    stats.waiting = occupancy.waiting;
    stats.kv_blocks_used = occupancy.kv_blocks_used;
    *shared.stats.lock().unwrap_or_else(PoisonError::into_inner) = *stats;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StepTime, VirtualRuntime};
    use tokio::time::Instant;

    fn paused() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    }

    /// Runs `test` on a paused clock with an engine of `config`.
    fn with_engine<F: Future>(config: EngineConfig, test: impl FnOnce(SimEngine) -> F) {
        paused().block_on(async { test(SimEngine::new(config)).await });
    }

    fn request(prompt_tokens: usize, output_tokens: usize) -> Request {
        Request {
            prompt_tokens,
            output_tokens,
            rank: None,
        }
    }

    #[test]
    fn step_time_is_linear_in_prefill_and_decode_tokens() {
        let step = StepTime::default();
        assert_eq!(step.of(0, 0), Duration::from_micros(5753));
        assert_eq!(
            step.of(2048, 0),
            Duration::from_nanos(5_753_000 + 2048 * 17_250)
        );
        assert_eq!(
            step.of(100, 256),
            Duration::from_nanos(5_753_000 + 1_725_000 + 1_536_000)
        );
    }

    #[test]
    fn a_request_streams_its_tokens_one_step_apart() {
        paused().block_on(async {
            let engine = SimEngine::new(EngineConfig::default());
            let start = Instant::now();
            let mut stream = engine.submit(request(16, 4)).unwrap();
            let mut times = Vec::new();
            while let Some(token) = stream.next_token().await {
                times.push((token.index, token.last, start.elapsed()));
            }
            // Prefill of 16 tokens: 5753 + 276 µs, woken on the next ms.
            assert_eq!(times[0], (0, false, Duration::from_millis(7)));
            // Decode steps of 5759 µs each, from the exact end of the
            // previous step: 6.029, 11.788, 17.547, 23.306 ms.
            let ends: Vec<_> = times.iter().map(|(_, _, at)| at.as_millis()).collect();
            assert_eq!(ends, [7, 12, 18, 24]);
            assert!(times[3].1);
            assert_eq!(engine.stats().completed, 1);
        });
    }

    /// When each token of a 16-token prompt's 4 came, in µs of virtual time
    /// from the submit, on the default engine set to `slowdown` (if any) as
    /// the first token comes.
    fn token_times(slowdown: Option<f64>) -> Vec<u128> {
        VirtualRuntime::new().block_on(async {
            let engine = SimEngine::new(EngineConfig::default());
            let start = time::now();
            let mut stream = engine.submit(request(16, 4)).unwrap();
            let mut times = Vec::new();
            while stream.next_token().await.is_some() {
                times.push((time::now() - start).as_micros());
                if let (1, Some(slowdown)) = (times.len(), slowdown) {
                    engine.set_slowdown(slowdown);
                }
            }
            times
        })
    }

    #[test]
    fn in_virtual_time_steps_end_exactly_on_the_model_clock() {
        // No timer grid: 6029 µs of prefill, then 5759 µs per decode.
        assert_eq!(token_times(None), [6029, 11788, 17547, 23306]);
    }

    #[test]
    fn a_slowdown_stretches_every_step_from_the_next_one_on() {
        // The step under way when the first token came (it started at
        // once) keeps its 5759 µs; the ones after take 2 × 5759 µs.
        assert_eq!(token_times(Some(2.0)), [6029, 11788, 23306, 34824]);
    }

    #[test]
    fn time_scale_stretches_the_clock_the_clients_see() {
        with_engine(
            EngineConfig {
                time_scale: 10.0,
                ..EngineConfig::default()
            },
            |engine| async move {
                let start = Instant::now();
                let mut stream = engine.submit(request(16, 1)).unwrap();
                stream.next_token().await.unwrap();
                // 6.029 ms of model time, 60.29 ms on the clock.
                assert_eq!(start.elapsed().as_millis(), 61);
                assert_eq!(engine.stats().busy, Duration::from_micros(6029));
            },
        );
    }

    #[test]
    fn dropping_the_stream_cancels_the_request_and_frees_its_slot() {
        with_engine(
            EngineConfig {
                max_num_seqs: 1,
                ..EngineConfig::default()
            },
            |engine| async move {
                let mut first = engine.submit(request(10, 1000)).unwrap();
                let mut second = engine.submit(request(10, 2)).unwrap();
                first.next_token().await.unwrap();
                assert_eq!(engine.stats().running, 1);
                assert_eq!(engine.stats().waiting, 1);
                drop(first);
                // The freed slot goes to the waiting request at once.
                assert_eq!(second.next_token().await.unwrap().index, 0);
                let stats = engine.stats();
                assert_eq!(stats.cancelled, 1);
                assert_eq!((stats.running, stats.waiting), (1, 0));
            },
        );
    }

    #[test]
    fn unranked_requests_go_to_the_least_loaded_rank() {
        with_engine(
            EngineConfig {
                dp_ranks: 3,
                ..EngineConfig::default()
            },
            |engine| async move {
                let pinned = engine
                    .submit(Request {
                        rank: Some(0),
                        ..request(10, 10)
                    })
                    .unwrap();
                assert_eq!(pinned.rank(), 0);
                let streams: Vec<_> = (0..2)
                    .map(|_| engine.submit(request(10, 10)).unwrap())
                    .collect();
                let ranks: Vec<_> = streams.iter().map(TokenStream::rank).collect();
                assert_eq!(ranks, [1, 2]);
                assert_eq!(
                    engine
                        .submit(Request {
                            rank: Some(3),
                            ..request(1, 1)
                        })
                        .unwrap_err(),
                    SubmitError::UnknownRank(3)
                );
                assert_eq!(engine.capacity(), EngineCapacity::new(256, 3));
            },
        );
    }

    #[test]
    fn a_request_that_can_never_fit_the_kv_cache_is_refused() {
        with_engine(
            EngineConfig {
                kv_blocks: 10,
                ..EngineConfig::default()
            },
            |engine| async move {
                assert_eq!(
                    engine.submit(request(150, 11)).unwrap_err(),
                    SubmitError::TooLong {
                        tokens: 161,
                        kv_tokens: 160
                    }
                );
                assert!(engine.submit(request(150, 10)).is_ok());
            },
        );
    }

    #[test]
    fn the_engine_preempts_when_kv_runs_out_and_still_finishes_everything() {
        with_engine(
            EngineConfig {
                kv_blocks: 64, // 1024 tokens for four requests of up to 516
                ..EngineConfig::default()
            },
            |engine| async move {
                let mut streams: Vec<_> = (0..4)
                    .map(|_| engine.submit(request(16, 500)).unwrap())
                    .collect();
                for stream in &mut streams {
                    let mut expected = 0;
                    while let Some(token) = stream.next_token().await {
                        assert_eq!(token.index, expected, "no token is lost or repeated");
                        expected += 1;
                    }
                    assert_eq!(expected, 500);
                }
                let stats = engine.stats();
                assert!(stats.preemptions > 0, "{stats:?}");
                assert_eq!(stats.completed, 4);
                assert_eq!(stats.kv_blocks_used, 0);
            },
        );
    }
}
