//! The continuous-batching scheduler of one data-parallel rank: a pure,
//! synchronous state machine in the shape of vLLM's v1 scheduler. The
//! engine task in [`engine`](super::engine) is its driver: it feeds requests
//! and cancellations in, asks for a batch, waits out the batch's step time,
//! then completes the batch and delivers the tokens.
//!
//! One step:
//!
//! 1. Running requests, oldest first, each get their next chunk: one token
//!    for a decoding request, up to the remaining token budget for one that
//!    is (re)computing its prompt (and up to the long-prefill threshold, if
//!    one is set and more than one request is running or waiting). A chunk first needs KV blocks for every
//!    token it computes; when there are not enough, the newest running
//!    request is preempted (it loses its KV and goes back to the front of
//!    the waiting queue, to be recomputed), until the chunk fits or the
//!    request itself was the newest.
//! 2. If nothing was preempted, waiting requests, oldest first, join while
//!    there is a free slot (`max_num_seqs`), token budget, and KV for their
//!    first chunk (capped at the threshold like the others).
//!
//! When a request's last prefill chunk completes it samples its first token;
//! every later step samples one more. A request ends when it has sampled
//! `output_tokens` tokens.

use std::collections::VecDeque;

use super::config::{EngineConfig, Token};

/// One request inside the engine.
#[derive(Debug)]
struct Seq<P> {
    id: u64,
    prompt_tokens: usize,
    output_tokens: usize,
    /// Tokens sampled so far (they survive a preemption: they were streamed).
    generated: usize,
    /// Tokens whose KV has been computed (reset to 0 by a preemption).
    computed: usize,
    /// KV blocks held.
    blocks: usize,
    /// Tokens scheduled in the current step; 0 outside a step.
    scheduled: usize,
    /// Computing its context (prompt, plus earlier output after a
    /// preemption), as opposed to decoding one token per step.
    prefilling: bool,
    payload: P,
}

impl<P> Seq<P> {
    /// Tokens of context: the prompt and every token sampled so far.
    fn tokens(&self) -> usize {
        self.prompt_tokens + self.generated
    }

    /// Tokens the next step could compute: the rest of the context.
    fn uncomputed(&self) -> usize {
        self.tokens() - self.computed
    }
}

/// What one step computes, for its step time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Batch {
    /// Prompt (or recomputed) tokens in the step, over all chunks.
    pub(crate) prefill_tokens: usize,
    /// Decoding requests in the step: one token each.
    pub(crate) decode_tokens: usize,
    /// Requests preempted to make room for this step.
    pub(crate) preempted: usize,
}

impl Batch {
    /// Whether the step computes nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.prefill_tokens == 0 && self.decode_tokens == 0
    }
}

/// Occupancy of one rank, for [`EngineStats`](super::EngineStats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Occupancy {
    pub(crate) running: usize,
    pub(crate) waiting: usize,
    pub(crate) kv_blocks_used: usize,
}

/// The scheduler of one rank. `P` is what the driver keeps per request
/// (the sending half of its token stream).
#[derive(Debug)]
pub(crate) struct Scheduler<P> {
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    /// [`EngineConfig::long_prefill_token_threshold`]: 0 for no cap.
    long_prefill_token_threshold: usize,
    block_size: usize,
    kv_blocks: usize,
    free_blocks: usize,
    /// In admission order: the last is the first to be preempted.
    running: Vec<Seq<P>>,
    /// The engine's own queue, unbounded: what an engine does without
    /// admission control in front of it. Preempted requests go to its front.
    waiting: VecDeque<Seq<P>>,
}

impl<P> Scheduler<P> {
    pub(crate) fn new(config: &EngineConfig) -> Self {
        Scheduler {
            max_num_seqs: config.max_num_seqs,
            max_num_batched_tokens: config.max_num_batched_tokens,
            long_prefill_token_threshold: config.long_prefill_token_threshold,
            block_size: config.block_size,
            kv_blocks: config.kv_blocks,
            free_blocks: config.kv_blocks,
            running: Vec::new(),
            waiting: VecDeque::new(),
        }
    }

    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Whether a request could ever complete here: its whole context must
    /// fit the KV cache on its own.
    pub(crate) fn fits(&self, prompt_tokens: usize, output_tokens: usize) -> bool {
        self.blocks_for(prompt_tokens + output_tokens) <= self.kv_blocks
    }

    /// A new request joins the back of the waiting queue. Both lengths must
    /// be at least 1 and the request must [fit](Self::fits).
    pub(crate) fn add(&mut self, id: u64, prompt_tokens: usize, output_tokens: usize, payload: P) {
        debug_assert!(prompt_tokens >= 1 && output_tokens >= 1);
        debug_assert!(self.fits(prompt_tokens, output_tokens));
        self.waiting.push_back(Seq {
            id,
            prompt_tokens,
            output_tokens,
            generated: 0,
            computed: 0,
            blocks: 0,
            scheduled: 0,
            prefilling: true,
            payload,
        });
    }

    /// Removes request `id` wherever it is and frees its slot and KV.
    /// Returns its payload, or `None` if it is not here (it has finished).
    /// Must not be called between [`schedule`](Self::schedule) and
    /// [`complete`](Self::complete).
    pub(crate) fn cancel(&mut self, id: u64) -> Option<P> {
        let seq = if let Some(index) = self.running.iter().position(|seq| seq.id == id) {
            self.running.remove(index)
        } else {
            let index = self.waiting.iter().position(|seq| seq.id == id)?;
            self.waiting.remove(index)?
        };
        self.free_blocks += seq.blocks;
        Some(seq.payload)
    }

    /// Whether there is nothing to run.
    pub(crate) fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    pub(crate) fn occupancy(&self) -> Occupancy {
        Occupancy {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_blocks_used: self.kv_blocks - self.free_blocks,
        }
    }

    /// Plans the next step: picks each scheduled request's chunk, allocates
    /// its KV, and preempts when KV runs out.
    pub(crate) fn schedule(&mut self) -> Batch {
        let mut batch = Batch::default();
        let mut budget = self.max_num_batched_tokens;
        // vLLM's V1 scheduler counts the requests once, before the step:
        // alone, a request may take the whole budget, as nobody starves.
        let max_chunk = if self.long_prefill_token_threshold > 0
            && self.running.len() + self.waiting.len() > 1
        {
            self.long_prefill_token_threshold
        } else {
            usize::MAX
        };

        let mut index = 0;
        while index < self.running.len() && budget > 0 {
            let seq = &self.running[index];
            let chunk = seq.uncomputed().min(max_chunk).min(budget);
            let needed = self.blocks_for(seq.computed + chunk) - seq.blocks;
            while needed > self.free_blocks && self.running.len() > index {
                self.preempt_newest();
                batch.preempted += 1;
            }
            if self.running.len() == index {
                // The request was itself the newest: it went back to wait.
                break;
            }
            self.free_blocks -= needed;
            let seq = &mut self.running[index];
            seq.blocks += needed;
            seq.scheduled = chunk;
            budget -= chunk;
            if seq.prefilling {
                batch.prefill_tokens += chunk;
            } else {
                batch.decode_tokens += 1;
            }
            index += 1;
        }

        // Like vLLM: a step that had to preempt admits nobody new.
        if batch.preempted == 0 {
            while budget > 0 && self.running.len() < self.max_num_seqs {
                let Some(seq) = self.waiting.front() else {
                    break;
                };
                let chunk = seq.uncomputed().min(max_chunk).min(budget);
                let needed = self.blocks_for(chunk);
                if needed > self.free_blocks {
                    break;
                }
                let mut seq = self.waiting.pop_front().expect("front exists");
                self.free_blocks -= needed;
                seq.blocks = needed;
                seq.scheduled = chunk;
                budget -= chunk;
                batch.prefill_tokens += chunk;
                self.running.push(seq);
            }
        }
        batch
    }

    /// Recompute preemption of the newest running request: it loses its KV
    /// and waits at the front of the queue; the tokens it already sampled
    /// stay sampled and are recomputed with its prompt.
    fn preempt_newest(&mut self) {
        let mut seq = self.running.pop().expect("a running request to preempt");
        self.free_blocks += seq.blocks;
        seq.blocks = 0;
        seq.computed = 0;
        seq.scheduled = 0;
        seq.prefilling = true;
        self.waiting.push_front(seq);
    }

    /// Completes the step planned by [`schedule`](Self::schedule): every
    /// request whose context is now computed samples a token, handed to
    /// `on_token` with its payload. Finished requests leave and free their
    /// KV. Returns how many finished.
    pub(crate) fn complete(&mut self, mut on_token: impl FnMut(&mut P, Token)) -> usize {
        let mut freed = 0;
        let mut finished = 0;
        self.running.retain_mut(|seq| {
            if seq.scheduled == 0 {
                return true;
            }
            seq.computed += seq.scheduled;
            seq.scheduled = 0;
            if seq.computed < seq.tokens() {
                return true; // a prefill chunk that was not the last
            }
            seq.generated += 1;
            seq.prefilling = false;
            let last = seq.generated >= seq.output_tokens;
            on_token(
                &mut seq.payload,
                Token {
                    index: seq.generated - 1,
                    last,
                },
            );
            if last {
                freed += seq.blocks;
                finished += 1;
            }
            !last
        });
        self.free_blocks += freed;
        finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_num_seqs: usize, budget: usize, kv_blocks: usize) -> EngineConfig {
        EngineConfig {
            max_num_seqs,
            max_num_batched_tokens: budget,
            kv_blocks,
            ..EngineConfig::default()
        }
    }

    /// Runs one step and returns the batch and the `(request, token)` pairs
    /// it emitted.
    /// The token `index` of request `id`, as the scheduler reports it.
    fn token(id: u64, index: usize, last: bool) -> (u64, Token) {
        (id, Token { index, last })
    }

    fn step(scheduler: &mut Scheduler<u64>) -> (Batch, Vec<(u64, Token)>) {
        let batch = scheduler.schedule();
        let mut tokens = Vec::new();
        scheduler.complete(|id, token| tokens.push((*id, token)));
        (batch, tokens)
    }

    #[test]
    fn the_first_token_comes_after_the_last_prefill_chunk() {
        let mut scheduler = Scheduler::new(&config(8, 100, 1000));
        scheduler.add(1, 250, 3, 1);

        let (batch, tokens) = step(&mut scheduler);
        assert_eq!(batch.prefill_tokens, 100);
        assert!(tokens.is_empty());
        let (batch, tokens) = step(&mut scheduler);
        assert_eq!(batch.prefill_tokens, 100);
        assert!(tokens.is_empty());
        let (batch, tokens) = step(&mut scheduler);
        assert_eq!((batch.prefill_tokens, batch.decode_tokens), (50, 0));
        assert_eq!(tokens, [token(1, 0, false)]);
        // Then one token per step, as decode work.
        let (batch, tokens) = step(&mut scheduler);
        assert_eq!((batch.prefill_tokens, batch.decode_tokens), (0, 1));
        assert_eq!(tokens[0].1.index, 1);
        let (_, tokens) = step(&mut scheduler);
        assert_eq!(tokens, [token(1, 2, true)]);
        assert!(scheduler.is_idle());
        assert_eq!(scheduler.occupancy().kv_blocks_used, 0);
    }

    #[test]
    fn the_token_budget_is_shared_by_decodes_and_prefill_chunks() {
        let mut scheduler = Scheduler::new(&config(8, 64, 1000));
        scheduler.add(1, 10, 5, 1);
        step(&mut scheduler); // prefill of request 1, first token
        scheduler.add(2, 200, 5, 2);
        let (batch, _) = step(&mut scheduler);
        assert_eq!(batch.decode_tokens, 1);
        assert_eq!(batch.prefill_tokens, 63);
    }

    /// [`config`] with vLLM's `long_prefill_token_threshold`.
    fn capped(budget: usize, threshold: usize) -> EngineConfig {
        EngineConfig {
            long_prefill_token_threshold: threshold,
            ..config(8, budget, 1000)
        }
    }

    /// One decoding request (10-token prompt, prefilled alone), then a
    /// 200-token prompt beside it: the prefill tokens of the next two steps.
    fn long_prompt_beside_a_decode(threshold: usize) -> [usize; 2] {
        let mut scheduler = Scheduler::new(&capped(64, threshold));
        scheduler.add(1, 10, 5, 1);
        step(&mut scheduler);
        scheduler.add(2, 200, 5, 2);
        [0, 1].map(|_| {
            let (batch, _) = step(&mut scheduler);
            assert_eq!(batch.decode_tokens, 1);
            batch.prefill_tokens
        })
    }

    #[test]
    fn the_long_prefill_threshold_caps_a_prompt_chunk_while_another_request_is_present() {
        // The new request's first chunk, then its next one while running.
        assert_eq!(long_prompt_beside_a_decode(16), [16, 16]);
        // Two long prompts waiting together: each chunk is capped, and the
        // budget is left unused rather than given to either.
        let mut scheduler = Scheduler::new(&capped(100, 30));
        scheduler.add(1, 200, 5, 1);
        scheduler.add(2, 200, 5, 2);
        for _ in 0..2 {
            let (batch, tokens) = step(&mut scheduler);
            assert_eq!((batch.prefill_tokens, batch.decode_tokens), (60, 0));
            assert!(tokens.is_empty());
        }
        // A prompt shorter than the threshold is not split.
        let mut scheduler = Scheduler::new(&capped(100, 30));
        scheduler.add(1, 200, 5, 1);
        scheduler.add(2, 20, 5, 2);
        let (batch, tokens) = step(&mut scheduler);
        assert_eq!(batch.prefill_tokens, 50);
        assert_eq!(tokens, [token(2, 0, false)]);
    }

    #[test]
    fn the_long_prefill_threshold_does_not_cap_a_request_alone() {
        // As vLLM: a lone request has nobody to starve, and takes the
        // whole budget.
        let mut scheduler = Scheduler::new(&capped(100, 30));
        scheduler.add(1, 250, 3, 1);
        let prefill: Vec<usize> = (0..3)
            .map(|_| step(&mut scheduler).0.prefill_tokens)
            .collect();
        assert_eq!(prefill, [100, 100, 50]);
        // A second request arriving makes the next step capped.
        scheduler.add(2, 100, 3, 2);
        step(&mut scheduler); // 1 decodes, 2 is capped at 30
        let (batch, _) = step(&mut scheduler);
        assert_eq!((batch.prefill_tokens, batch.decode_tokens), (30, 1));
    }

    #[test]
    fn a_long_prefill_threshold_of_zero_caps_nothing() {
        // The rest of the budget after the decode, as without the setting.
        assert_eq!(long_prompt_beside_a_decode(0), [63, 63]);
        assert_eq!(EngineConfig::default().long_prefill_token_threshold, 0);
    }

    #[test]
    fn at_most_max_num_seqs_run_and_the_rest_wait_inside_the_engine() {
        let mut scheduler = Scheduler::new(&config(2, 1000, 1000));
        for id in 0..5 {
            scheduler.add(id, 10, 100, id);
        }
        step(&mut scheduler);
        let occupancy = scheduler.occupancy();
        assert_eq!((occupancy.running, occupancy.waiting), (2, 3));
    }

    #[test]
    fn running_out_of_kv_preempts_the_newest_request_to_the_front_of_the_queue() {
        // 4 blocks of 16 tokens. Two requests of 16-token prompts take one
        // block each; each needs a second block for its first decode.
        let mut scheduler = Scheduler::new(&config(8, 1000, 3));
        scheduler.add(1, 16, 10, 1);
        scheduler.add(2, 16, 10, 2);
        scheduler.add(3, 8, 10, 3);
        let (batch, tokens) = step(&mut scheduler);
        assert_eq!(batch.prefill_tokens, 40);
        assert_eq!(tokens.len(), 3);
        assert_eq!(scheduler.occupancy().kv_blocks_used, 3);

        // Request 1 decodes its 17th token: it needs a second block, and
        // the newest (3) gives its KV up; then request 2 needs one too,
        // which leaves nothing.
        let (batch, tokens) = step(&mut scheduler);
        assert_eq!(batch.preempted, 2);
        assert_eq!(batch.decode_tokens, 1);
        assert_eq!(tokens.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1]);
        let occupancy = scheduler.occupancy();
        assert_eq!((occupancy.running, occupancy.waiting), (1, 2));
        // The preempted requests wait at the front, oldest first.
        let front: Vec<u64> = scheduler.waiting.iter().map(|seq| seq.id).collect();
        assert_eq!(front, [2, 3]);
        assert_eq!(scheduler.waiting[0].computed, 0);
        assert_eq!(scheduler.waiting[0].generated, 1);
    }

    #[test]
    fn a_preempted_request_recomputes_its_context_then_continues_its_output() {
        let mut scheduler = Scheduler::new(&config(8, 1000, 3));
        scheduler.add(1, 16, 3, 1);
        scheduler.add(2, 16, 3, 2);
        step(&mut scheduler); // both sample token 0
        let (batch, _) = step(&mut scheduler); // 1 needs a block: 2 is preempted
        assert_eq!(batch.preempted, 1);
        // Request 1 finishes (its 3rd token) and frees its blocks.
        let (_, tokens) = step(&mut scheduler);
        assert_eq!(tokens, [token(1, 2, true)]);
        // Request 2 recomputes prompt + its one sampled token (17 tokens)
        // as prefill, then samples its *second* token: nothing is repeated.
        let (batch, tokens) = step(&mut scheduler);
        assert_eq!((batch.prefill_tokens, batch.decode_tokens), (17, 0));
        assert_eq!(tokens, [token(2, 1, false)]);
    }

    #[test]
    fn cancelling_frees_the_slot_and_the_kv() {
        let mut scheduler = Scheduler::new(&config(1, 1000, 100));
        scheduler.add(1, 100, 50, 1);
        scheduler.add(2, 100, 50, 2);
        step(&mut scheduler);
        assert_eq!(scheduler.occupancy().kv_blocks_used, 7);
        assert_eq!(scheduler.cancel(1), Some(1));
        assert_eq!(scheduler.occupancy().kv_blocks_used, 0);
        // The slot is free: the waiting request runs in the next step.
        let (_, tokens) = step(&mut scheduler);
        assert_eq!(tokens[0].0, 2);
        // A waiting request can be cancelled too; a finished one is gone.
        scheduler.add(3, 10, 10, 3);
        assert_eq!(scheduler.cancel(3), Some(3));
        assert_eq!(scheduler.cancel(1), None);
    }

    #[test]
    fn a_request_larger_than_the_kv_cache_does_not_fit() {
        let scheduler: Scheduler<u64> = Scheduler::new(&config(8, 1000, 4));
        assert!(scheduler.fits(60, 4));
        assert!(!scheduler.fits(60, 5));
    }
}
