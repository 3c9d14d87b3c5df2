//! A simulated LLM inference engine and workloads, to see what admission
//! control by [`tower_admission`] does under overload without a GPU. Not
//! published: the evaluations behind the repository's BENCHMARKS.md
//! (`cargo run --release -p tower-admission-sim --example overload`), the
//! example servers and the aiperf benchmarks live here.
//!
//! - [`SimEngine`]: a continuous-batching engine per data-parallel rank,
//!   modelled the way serving simulators (Vidur, BLIS) fit real engines —
//!   `max_num_seqs` running slots, an unbounded waiting queue inside the
//!   engine, a per-step token budget with chunked prefill, a linear step
//!   time ([`StepTime`]), and a paged KV cache whose exhaustion preempts
//!   (recomputes) the newest request. The first token comes after the last
//!   prefill chunk, then one token per step. Dropping a [`TokenStream`]
//!   cancels its request.
//! - [`Workload`]: seeded open-loop arrivals (Poisson, or gamma for
//!   burstiness) with ShareGPT-like prompt and output lengths, or a
//!   long-prompt mix.
//! - [`sweep`]: the overload evaluation of `examples/overload.rs` — goodput
//!   and latency against offered load with no admission control,
//!   `tower::limit::ConcurrencyLimit`, a TGI-style semaphore, a vLLM-style
//!   cap and the [`Gate`](tower_admission::Gate), with patient, retrying or impatient
//!   clients.
//! - [`qos`]: the quality-of-service evaluation of `examples/qos.rs` —
//!   the seed's incident (chat traffic, then batch summarisation at twice
//!   capacity) with no admission control, the FIFO gate and the gate with
//!   priority bands, and weighted fairness between two tenants; and of
//!   `examples/noisy_tenant.rs` — a tenant flooding long prompts beside a
//!   steady one, with per-tenant limits.
//! - [`adaptive`]: the evaluation of the adaptive waiting limit of
//!   `examples/adaptive.rs` — steady overload on an engine that reports
//!   nothing, slowed to half speed mid-run ([`SimEngine::set_slowdown`])
//!   and back, against a waiting limit sized by hand with Little's law.
//! - [`VirtualRuntime`] and [`time`]: the virtual clock the simulations
//!   run on.
//!
//! Make and run the engine inside a [`VirtualRuntime`] and it runs in
//! virtual time: a minute of GPU work takes milliseconds, and a run is
//! deterministic for a seed (see [`time`]; no tokio `test-util` needed).
//! On a tokio runtime it runs in real time, and
//! [`EngineConfig::time_scale`] speeds it up or slows it down.
//!
//! ```
//! use tower_admission_sim::{EngineConfig, Request, SimEngine, VirtualRuntime};
//! use tower_admission::{AdmissionConfig, Gate};
//!
//! VirtualRuntime::new().block_on(async {
//!     let engine = SimEngine::new(EngineConfig::default());
//!     let gate = Gate::new(AdmissionConfig::new());
//!     engine.report_to(&gate); // the gate's limits follow max_num_seqs
//!
//!     let mut permit = gate.acquire(Some(0)).await.expect("room");
//!     let request = Request { prompt_tokens: 161, output_tokens: 338, rank: permit.rank() };
//!     let mut stream = engine.submit(request).unwrap();
//!     stream.next_token().await.unwrap();
//!     permit.first_token();
//!     while stream.next_token().await.is_some() {}
//!     drop(permit); // the response ended
//! });
//! ```
//!
//! What the model leaves out: prefix caching, speculative decoding, CUDA
//! graph padding, swapping instead of recomputing, and per-request variation
//! in step cost beyond the token counts.

pub mod adaptive;
mod capacity;
mod config;
mod engine;
mod measure;
pub mod qos;
mod scheduler;
pub mod sweep;
pub mod time;
mod workload;

pub use self::config::{EngineConfig, StepTime, Token};
pub use self::engine::{EngineStats, Request, SimEngine, SubmitError, TokenStream};
pub use self::time::{VirtualRuntime, now, sleep, sleep_until, spawn};
pub use self::workload::{Arrival, Arrivals, Lengths, MixPart, Workload};
