//! Where the engine's capacity comes from: the flag, or what the engine
//! itself reports, read again while it runs.
//!
//! | engine | route | field |
//! |---|---|---|
//! | llama.cpp | `GET /props` | `total_slots` (its `--parallel`), one rank |
//! | SGLang | `GET /server_info`, before 0.5 `GET /get_server_info` | per rank: `internal_states[i].effective_max_running_requests_per_dp`, else `max_running_requests` / `dp_size`; ranks: `dp_size` |
//! | TGI | `GET /info` (`"router": "text-generation-router"`) | `max_concurrent_requests`, one rank |
//! | vLLM | none | its OpenAI server states no `max_num_seqs` anywhere a client can read (`/v1/models` says only `"owned_by": "vllm"`): give `--max-num-seqs` |
//!
//! The fields were checked against each engine's own source: llama.cpp
//! `tools/server/server-context.cpp` (`total_slots = params.n_parallel`;
//! every route answers `503 Loading model` until the model is loaded),
//! SGLang `python/sglang/srt/entrypoints/http_server.py` and its
//! scheduler's `get_internal_state` (`max_running_requests` is `null` unless
//! the user set it; the effective value is per data-parallel rank), TGI
//! `router/src/lib.rs` (`struct Info`).
//!
//! The parsers are pure functions of a response body, so each engine's
//! dialect is tested without the engine; [`discover_capacity`](super::discover_capacity) is the driver that
//! asks over HTTP.

use std::time::Duration;

use serde_json::Value;

use tower_admission::EngineCapacity;

/// Which kind of engine a capacity report came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EngineKind {
    /// llama.cpp's `llama-server`.
    LlamaCpp,
    /// SGLang.
    Sglang,
    /// Hugging Face text-generation-inference.
    Tgi,
    /// vLLM, which reports no capacity.
    Vllm,
}

impl EngineKind {
    /// The engine's name and the route its capacity was read from, for logs.
    pub fn describe(self) -> &'static str {
        match self {
            EngineKind::LlamaCpp => "llama.cpp GET /props total_slots",
            EngineKind::Sglang => "SGLang GET /server_info",
            EngineKind::Tgi => "TGI GET /info max_concurrent_requests",
            EngineKind::Vllm => "vLLM (reports no max_num_seqs)",
        }
    }

    /// The engine family's name.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::LlamaCpp => "llama.cpp",
            EngineKind::Sglang => "SGLang",
            EngineKind::Tgi => "TGI",
            EngineKind::Vllm => "vLLM",
        }
    }

    /// The routes of this engine family whose `POST`s pass the gate by
    /// default: the family's own rows of
    /// [`DEFAULT_PASS_PATHS`](crate::DEFAULT_PASS_PATHS), which holds them
    /// all (the list used while the family is not known).
    pub fn pass_paths(self) -> &'static [&'static str] {
        match self {
            EngineKind::LlamaCpp => &[
                "/health",
                "/v1/models",
                "/models",
                "/metrics",
                "/tokenize",
                "/detokenize",
                "/apply-template",
                "/props",
                "/lora-adapters",
            ],
            EngineKind::Sglang => &[
                "/health",
                "/v1/models",
                "/metrics",
                "/tokenize",
                "/detokenize",
                "/load_lora_adapter",
                "/unload_lora_adapter",
            ],
            EngineKind::Tgi => &[
                "/health",
                "/v1/models",
                "/metrics",
                "/tokenize",
                "/chat_tokenize",
            ],
            EngineKind::Vllm => &[
                "/health",
                "/ping",
                "/v1/models",
                "/metrics",
                "/tokenize",
                "/detokenize",
                "/v1/load_lora_adapter",
                "/v1/unload_lora_adapter",
            ],
        }
    }
}

/// The routes asked, in order, until one answers with a capacity.
pub(crate) const PROBES: &[(&str, Probe)] = &[
    ("/props", Probe::LlamaCpp),
    ("/server_info", Probe::Sglang),
    ("/get_server_info", Probe::Sglang),
    ("/info", Probe::Tgi),
    ("/v1/models", Probe::Vllm),
];

/// How to read one probe route's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    LlamaCpp,
    Sglang,
    Tgi,
    Vllm,
}

/// What the engine said of its capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineReport {
    /// The engine and its capacity.
    Capacity(EngineKind, EngineCapacity),
    /// The engine is known, and says nothing of its capacity (vLLM).
    Silent(EngineKind),
    /// No answer that tells: the engine is down or loading, or of a kind
    /// not known here.
    Unknown,
}

use EngineReport as Reading;

impl Probe {
    pub(crate) fn read(self, body: &[u8]) -> Reading {
        let Ok(json) = serde_json::from_slice::<Value>(body) else {
            return Reading::Unknown;
        };
        let found = match self {
            Probe::LlamaCpp => llama_cpp_props(&json).map(|c| (EngineKind::LlamaCpp, c)),
            Probe::Sglang => sglang_server_info(&json).map(|c| (EngineKind::Sglang, c)),
            Probe::Tgi => tgi_info(&json).map(|c| (EngineKind::Tgi, c)),
            Probe::Vllm => {
                return if is_vllm_models(&json) {
                    Reading::Silent(EngineKind::Vllm)
                } else {
                    Reading::Unknown
                };
            }
        };
        found.map_or(Reading::Unknown, |(kind, capacity)| {
            Reading::Capacity(kind, capacity)
        })
    }
}

/// The largest count an engine report is believed for: no engine batches a
/// million sequences on one rank, and a larger number is a bug or a hostile
/// answer that would size the gate's queue past any use.
pub const MAX_REPORTED_SEQUENCES: u64 = 1 << 20;

/// A positive integer member, within what a capacity can be.
fn positive(value: Option<&Value>) -> Option<usize> {
    let n = value?.as_u64()?;
    if n == 0 || n > MAX_REPORTED_SEQUENCES {
        return None;
    }
    usize::try_from(n).ok()
}

/// llama.cpp `GET /props`: `total_slots` sequences on one rank.
pub fn llama_cpp_props(json: &Value) -> Option<EngineCapacity> {
    let slots = positive(json.get("total_slots"))?;
    Some(EngineCapacity::new(slots, 1))
}

/// SGLang `GET /server_info`: per rank, the smallest
/// `effective_max_running_requests_per_dp` of `internal_states`; without
/// it, the user's `max_running_requests` shared over `dp_size` ranks.
pub fn sglang_server_info(json: &Value) -> Option<EngineCapacity> {
    let dp_size = positive(json.get("dp_size")).unwrap_or(1);
    let effective = json
        .get("internal_states")
        .and_then(Value::as_array)
        .and_then(|states| {
            states
                .iter()
                .map(|state| positive(state.get("effective_max_running_requests_per_dp")))
                .collect::<Option<Vec<_>>>()
        })
        .and_then(|per_rank| per_rank.into_iter().min());
    let per_rank = match effective {
        Some(per_rank) => per_rank,
        None => (positive(json.get("max_running_requests"))? / dp_size).max(1),
    };
    Some(EngineCapacity::new(per_rank, dp_size))
}

/// TGI `GET /info`: `max_concurrent_requests` on one rank, from a body
/// whose `router` is TGI's.
pub fn tgi_info(json: &Value) -> Option<EngineCapacity> {
    if json.get("router").and_then(Value::as_str) != Some("text-generation-router") {
        return None;
    }
    let requests = positive(json.get("max_concurrent_requests"))?;
    Some(EngineCapacity::new(requests, 1))
}

/// vLLM's `GET /v1/models`: a model `owned_by` `"vllm"`.
fn is_vllm_models(json: &Value) -> bool {
    json.get("data")
        .and_then(Value::as_array)
        .is_some_and(|models| {
            models
                .iter()
                .any(|model| model.get("owned_by").and_then(Value::as_str) == Some("vllm"))
        })
}

/// How often [`discover_capacity`](super::discover_capacity) asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoveryTiming {
    /// Between reads once the engine has reported.
    pub interval: Duration,
    /// Between reads while it has not (loading, down, restarting).
    pub retry: Duration,
    /// How long one read may take.
    pub timeout: Duration,
}

impl Default for DiscoveryTiming {
    fn default() -> Self {
        DiscoveryTiming {
            interval: Duration::from_secs(5),
            retry: Duration::from_millis(500),
            timeout: Duration::from_secs(2),
        }
    }
}

pub(crate) use self::discovery::{Discovery, ask_engine};

mod discovery {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use http::{Method, Request, StatusCode};
    use http_body_util::{BodyExt, Empty, Limited};
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use tokio::sync::Notify;

    use super::{DiscoveryTiming, EngineKind, PROBES, Probe, Reading};
    use crate::upstream::UpstreamUrl;
    use tower_admission::{EngineCapacity, Gate};

    /// The largest capacity answer read: `/server_info` lists every
    /// setting of the server, a few KiB.
    const MAX_ANSWER_BYTES: usize = 1 << 20;

    /// Asks the engine for its capacity and reports it to the gate, again
    /// every `interval`, sooner when the engine seems to have restarted.
    pub(crate) struct Discovery {
        pub(crate) gate: Gate,
        pub(crate) upstream: UpstreamUrl,
        pub(crate) timing: DiscoveryTiming,
        /// Woken when a forwarded request could not reach the engine.
        pub(crate) unreachable: Arc<Notify>,
        /// Replaces the number of ranks the engine reports.
        pub(crate) ranks: Option<usize>,
    }

    impl Discovery {
        pub(crate) async fn run(self) {
            let client = client();
            let mut last: Option<(EngineKind, EngineCapacity)> = None;
            let mut known: Option<Probe> = None;
            let mut said_silent = false;
            let mut said_waiting = false;
            loop {
                let reading = read(&client, &self.upstream, self.timing.timeout, &mut known).await;
                match reading {
                    Reading::Capacity(kind, mut capacity) => {
                        if let Some(ranks) = self.ranks {
                            capacity.dp_ranks = ranks;
                        }
                        if last != Some((kind, capacity)) {
                            tracing::info!(
                                max_num_seqs = capacity.max_num_seqs,
                                dp_ranks = capacity.dp_ranks,
                                "engine capacity from {}: {} sequences per rank, {} rank(s)",
                                kind.describe(),
                                capacity.max_num_seqs,
                                capacity.dp_ranks,
                            );
                            self.gate.report_capacity(capacity);
                            last = Some((kind, capacity));
                        }
                    }
                    Reading::Silent(kind) => {
                        // The binary refuses to start in front of such an
                        // engine; one that appears later (a restart into
                        // another engine) is said loudly.
                        if !said_silent {
                            tracing::error!(
                                "the engine is {}: the gate keeps its defaults; give \
                                 --max-num-seqs (and --data-parallel-size) as the engine's own \
                                 --max-num-seqs",
                                kind.describe()
                            );
                            said_silent = true;
                        }
                    }
                    Reading::Unknown => {
                        if last.is_none() && !said_waiting {
                            tracing::info!(
                                "no capacity report from the engine yet (loading, down, or an \
                                 engine that reports none): the gate works on its defaults"
                            );
                            said_waiting = true;
                        }
                    }
                }
                let wait = if matches!(reading, Reading::Capacity(..)) {
                    self.timing.interval
                } else {
                    self.timing.retry
                };
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = self.unreachable.notified() => {
                        // The engine may be restarting, perhaps with other
                        // settings: read it again as soon as it answers.
                        known = None;
                    }
                }
            }
        }
    }

    /// Asks the engine at `upstream` once, as [`Discovery`] does at each
    /// round: every known route in turn, each read bounded by `timeout`.
    pub(crate) async fn ask_engine(upstream: &UpstreamUrl, timeout: Duration) -> Reading {
        read(&client(), upstream, timeout, &mut None).await
    }

    /// A fresh connection per read, as for requests (see `Upstream`): a
    /// kept-alive one the engine closed would lose a read.
    fn client() -> Client<HttpConnector, Empty<Bytes>> {
        Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build_http()
    }

    /// One round: the probe that answered last time, or each in turn.
    async fn read(
        client: &Client<HttpConnector, Empty<Bytes>>,
        upstream: &UpstreamUrl,
        timeout: Duration,
        known: &mut Option<Probe>,
    ) -> Reading {
        if let Some(probe) = *known {
            let path = PROBES
                .iter()
                .find(|(_, p)| *p == probe)
                .map(|(path, _)| *path);
            if let Some(path) = path {
                let reading = ask(client, upstream, timeout, path, probe).await;
                if !matches!(reading, Reading::Unknown) {
                    return reading;
                }
            }
            *known = None;
        }
        let mut silent = None;
        for &(path, probe) in PROBES {
            match ask(client, upstream, timeout, path, probe).await {
                Reading::Capacity(kind, capacity) => {
                    *known = Some(probe);
                    return Reading::Capacity(kind, capacity);
                }
                Reading::Silent(kind) => silent = Some(kind),
                Reading::Unknown => {}
            }
        }
        silent.map_or(Reading::Unknown, Reading::Silent)
    }

    async fn ask(
        client: &Client<HttpConnector, Empty<Bytes>>,
        upstream: &UpstreamUrl,
        timeout: Duration,
        path: &str,
        probe: Probe,
    ) -> Reading {
        let Ok(uri) = upstream.join(path) else {
            return Reading::Unknown;
        };
        let Ok(request) = Request::builder()
            .method(Method::GET)
            .uri(uri)
            .body(Empty::new())
        else {
            return Reading::Unknown;
        };
        let answer = tokio::time::timeout(timeout, async {
            let response = client.request(request).await.ok()?;
            if response.status() != StatusCode::OK {
                return None;
            }
            let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES);
            body.collect().await.ok().map(|body| body.to_bytes())
        })
        .await;
        match answer {
            Ok(Some(body)) => probe.read(&body),
            _ => Reading::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(probe: Probe, body: Value) -> Reading {
        probe.read(body.to_string().as_bytes())
    }

    #[test]
    fn llama_cpp_reports_its_slots_on_one_rank() {
        let props = json!({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 4});
        assert_eq!(
            read(Probe::LlamaCpp, props),
            Reading::Capacity(EngineKind::LlamaCpp, EngineCapacity::new(4, 1))
        );
        // Router mode (no model of its own) has no slots.
        let router = json!({"role": "router", "max_instances": 4});
        assert_eq!(read(Probe::LlamaCpp, router), Reading::Unknown);
    }

    #[test]
    fn sglang_prefers_the_effective_per_rank_limit() {
        let info = json!({
            "max_running_requests": null,
            "dp_size": 2,
            "internal_states": [
                {"effective_max_running_requests_per_dp": 48},
                {"effective_max_running_requests_per_dp": 40},
            ],
        });
        assert_eq!(
            read(Probe::Sglang, info),
            Reading::Capacity(EngineKind::Sglang, EngineCapacity::new(40, 2))
        );
    }

    #[test]
    fn sglang_without_internal_states_shares_the_configured_limit() {
        let info = json!({"max_running_requests": 128, "dp_size": 4});
        assert_eq!(
            read(Probe::Sglang, info),
            Reading::Capacity(EngineKind::Sglang, EngineCapacity::new(32, 4))
        );
        // Unset, and nothing effective: no report.
        let unset = json!({"max_running_requests": null, "dp_size": 1});
        assert_eq!(read(Probe::Sglang, unset), Reading::Unknown);
    }

    #[test]
    fn tgi_is_recognised_by_its_router() {
        let info = json!({"router": "text-generation-router", "max_concurrent_requests": 128});
        assert_eq!(
            read(Probe::Tgi, info),
            Reading::Capacity(EngineKind::Tgi, EngineCapacity::new(128, 1))
        );
        let other = json!({"max_concurrent_requests": 128});
        assert_eq!(read(Probe::Tgi, other), Reading::Unknown);
    }

    #[test]
    fn each_familys_pass_list_is_a_part_of_the_default_list() {
        for kind in [
            EngineKind::LlamaCpp,
            EngineKind::Sglang,
            EngineKind::Tgi,
            EngineKind::Vllm,
        ] {
            for path in kind.pass_paths() {
                assert!(
                    crate::DEFAULT_PASS_PATHS.contains(path),
                    "{path} of {} is in DEFAULT_PASS_PATHS",
                    kind.name()
                );
            }
        }
        // Together they are the whole default list: no route listed for no
        // engine.
        for path in crate::DEFAULT_PASS_PATHS {
            assert!(
                [
                    EngineKind::LlamaCpp,
                    EngineKind::Sglang,
                    EngineKind::Tgi,
                    EngineKind::Vllm,
                ]
                .iter()
                .any(|kind| kind.pass_paths().contains(path)),
                "{path} belongs to some engine family"
            );
        }
    }

    #[test]
    fn vllm_is_recognised_and_reports_nothing() {
        let models = json!({"object": "list", "data": [{"id": "m", "owned_by": "vllm"}]});
        assert_eq!(read(Probe::Vllm, models), Reading::Silent(EngineKind::Vllm));
        let llama = json!({"object": "list", "data": [{"id": "m", "owned_by": "llamacpp"}]});
        assert_eq!(read(Probe::Vllm, llama), Reading::Unknown);
    }

    #[test]
    fn hostile_answers_report_nothing() {
        for body in [
            json!({"total_slots": 0}),
            json!({"total_slots": -1}),
            json!({"total_slots": "4"}),
            json!({"total_slots": 1e300}),
            json!({"total_slots": u64::MAX}),
            json!({"total_slots": MAX_REPORTED_SEQUENCES + 1}),
            json!([1, 2]),
        ] {
            assert_eq!(
                read(Probe::LlamaCpp, body.clone()),
                Reading::Unknown,
                "{body}"
            );
        }
        assert_eq!(Probe::Sglang.read(b"not json"), Reading::Unknown);
        assert_eq!(
            read(
                Probe::Sglang,
                json!({"dp_size": 0, "max_running_requests": 8})
            ),
            Reading::Capacity(EngineKind::Sglang, EngineCapacity::new(8, 1))
        );
    }
}
