//! The engine's shape and the values it hands out: a leaf module that the
//! [`scheduler`](super::scheduler) and the [`engine`](super::engine) both
//! import, and that imports neither.

use std::time::Duration;

use tower_admission::EngineCapacity;

/// Step time of the engine: `base + per_prefill_token × prefill tokens +
/// per_decode_token × decode tokens`, the linear fit that serving simulators
/// (Vidur, BLIS) make of a real engine's forward pass.
///
/// The default is a fit for an 8B model (Llama 3.1 8B) on one H100:
/// 5753 µs + 17.25 µs per prefill token + 6.0 µs per decode token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepTime {
    /// Fixed cost of a step (`beta0`): scheduling, kernel launches, sampling.
    pub base: Duration,
    /// Cost of each prompt token computed in the step (`beta1`).
    pub per_prefill_token: Duration,
    /// Cost of each decoding request in the step (`beta2`).
    pub per_decode_token: Duration,
}

impl Default for StepTime {
    fn default() -> Self {
        StepTime {
            base: Duration::from_micros(5753),
            per_prefill_token: Duration::from_nanos(17_250),
            per_decode_token: Duration::from_micros(6),
        }
    }
}

impl StepTime {
    /// How long a step computing `prefill_tokens` prompt tokens and
    /// `decode_tokens` decode tokens takes.
    pub fn of(&self, prefill_tokens: usize, decode_tokens: usize) -> Duration {
        let count = |n: usize| u32::try_from(n).expect("a step of fewer than 2^32 tokens");
        self.base
            + self.per_prefill_token * count(prefill_tokens)
            + self.per_decode_token * count(decode_tokens)
    }
}

/// The shape of a simulated engine. The default is vLLM serving an 8B model
/// on one H100 per rank:
///
/// | field | default | why |
/// |---|---|---|
/// | `max_num_seqs` | 256 | vLLM's `max_num_seqs` (BLIS's default too) |
/// | `max_num_batched_tokens` | 2048 | vLLM's chunked-prefill budget (BLIS's default); small chunks keep decodes flowing while long prompts prefill |
/// | `long_prefill_token_threshold` | 0 (off) | vLLM's default; when set, a request's prefill chunk in one step is at most this many tokens while any other request is running or waiting |
/// | `block_size` | 16 | vLLM's KV block size |
/// | `kv_blocks` | 24 000 | 384 000 tokens: Llama 3.1 8B keeps 128 KiB of KV per token (32 layers × 8 KV heads × 128 × K,V × 2 bytes), and an 80 GB H100 at `gpu_memory_utilization` 0.9 has about 47 GiB left after the weights and activations |
/// | `step_time` | [`StepTime::default`] | |
/// | `dp_ranks` | 1 | |
/// | `time_scale` | 1.0 | |
///
/// With ShareGPT-like requests (161 prompt and 338 output tokens on
/// average) 256 running requests use about 5 000 blocks, so KV runs out —
/// and requests are preempted — only with longer contexts or a smaller
/// cache.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Requests one rank runs at once (vLLM's `max_num_seqs`); this is what
    /// the engine reports to the gate.
    pub max_num_seqs: usize,
    /// Token budget of one step, shared by decodes (one token each) and
    /// prefill chunks (vLLM's `max_num_batched_tokens`).
    pub max_num_batched_tokens: usize,
    /// The most prompt (or recomputed) tokens one request computes in a
    /// step, 0 for no cap: vLLM's `--long-prefill-token-threshold`, which
    /// keeps one long prompt from taking a step's whole token budget. Like
    /// vLLM's V1 scheduler, the cap holds only when more than one request
    /// is running or waiting at the start of the step ("there is no other
    /// request for it to starve"); a decode (one token) is never capped.
    /// vLLM's adaptive variant (a floor at the budget's fair share,
    /// `long_prefill_token_threshold_adaptive`) is not modelled.
    pub long_prefill_token_threshold: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks of one rank.
    pub kv_blocks: usize,
    /// Step time model.
    pub step_time: StepTime,
    /// Data-parallel ranks: independent engines behind one handle.
    pub dp_ranks: usize,
    /// Wall-clock seconds per simulated second when the tokio clock runs
    /// in real time: 0.1 runs ten times faster than the modelled GPU. It
    /// changes nothing under a paused (virtual) clock except the reading of
    /// `Instant::now()`: every latency a client measures is scaled by it.
    pub time_scale: f64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            long_prefill_token_threshold: 0,
            block_size: 16,
            kv_blocks: 24_000,
            step_time: StepTime::default(),
            dp_ranks: 1,
            time_scale: 1.0,
        }
    }
}

impl EngineConfig {
    /// What the engine reports to a gate: `max_num_seqs` per rank and the
    /// number of ranks.
    pub fn capacity(&self) -> EngineCapacity {
        EngineCapacity::new(self.max_num_seqs, self.dp_ranks)
    }

    /// The engine's prefill rate of one rank, tokens per second: a full
    /// chunked-prefill step (`max_num_batched_tokens` prompt tokens, no
    /// decodes) over its step time. This is the rate a burst of prompts is
    /// prefilled at; decodes sharing a step lower it a little (256 of them
    /// take 256 tokens of the step's budget and 1.5 ms), so it is an upper
    /// bound. The default engine: 2048 tokens in 41.1 ms, about 49,900
    /// tokens/s.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        let step = self.step_time.of(self.max_num_batched_tokens, 0);
        self.max_num_batched_tokens as f64 / step.as_secs_f64()
    }

    #[track_caller]
    pub(crate) fn validate(&self) {
        let positive = [
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("block_size", self.block_size),
            ("kv_blocks", self.kv_blocks),
            ("dp_ranks", self.dp_ranks),
        ];
        for (name, value) in positive {
            assert!(value > 0, "EngineConfig::{name} must be positive");
        }
        assert!(
            self.time_scale.is_finite() && self.time_scale > 0.0,
            "EngineConfig::time_scale must be positive"
        );
    }
}

/// One generated token of a [`TokenStream`](super::TokenStream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    /// Position in the output, from 0.
    pub index: usize,
    /// Whether this is the last token: the stream ends after it.
    pub last: bool,
}
