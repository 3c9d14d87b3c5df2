//! The engine's KV cache, in tokens, as vLLM states it: the reservation
//! the gate's engine token limit follows.
//!
//! vLLM states no `max_num_seqs`, but its `/metrics` carries
//! `vllm:cache_config_info`, a gauge of 1 whose labels describe the KV
//! cache of each engine (one per data-parallel rank, label `engine`):
//! `kv_cache_size_tokens` where the version states it, else
//! `num_gpu_blocks` × `block_size`. A gate that admits no more prompt plus
//! maximum output tokens per rank than that cache holds never makes the
//! engine preempt (recompute) a running request for lack of blocks: the
//! source documents' "reserve KV headroom".

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;

use crate::upstream::Upstream;

/// The series whose labels describe vLLM's KV cache.
const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";

/// The largest `/metrics` answer read (vLLM's is tens of KiB).
const MAX_METRICS_BYTES: usize = 16 << 20;

/// The largest KV cache believed, in tokens: 2^40 is far beyond any
/// accelerator's memory; a larger number is a bug or a hostile answer.
pub const MAX_KV_CACHE_TOKENS: u64 = 1 << 40;

/// The KV cache of one rank, in tokens, from vLLM's `/metrics` text: the
/// smallest over its engines (ranks), so that the per-rank limit fits
/// every rank. `None` when the text states none (not vLLM, or a version
/// without the series) or states nonsense (zero, a number past
/// [`MAX_KV_CACHE_TOKENS`]).
///
/// ```
/// use tower_admission_sidecar::vllm_kv_cache_tokens;
///
/// let text = r#"vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="64"} 1.0"#;
/// assert_eq!(vllm_kv_cache_tokens(text), Some(8192));
/// ```
pub fn vllm_kv_cache_tokens(metrics: &str) -> Option<usize> {
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix(CACHE_CONFIG_INFO)?.strip_prefix('{'))
        .filter_map(|rest| cache_tokens(rest.split_once('}')?.0))
        .min()
}

/// The tokens one `cache_config_info` label set states.
fn cache_tokens(labels: &str) -> Option<usize> {
    let number = |name: &str| -> Option<u64> {
        let value = label(labels, name)?;
        value.parse::<u64>().ok().filter(|&n| n > 0)
    };
    let tokens = match number("kv_cache_size_tokens") {
        Some(tokens) => tokens,
        None => number("num_gpu_blocks")?.checked_mul(number("block_size")?)?,
    };
    (tokens <= MAX_KV_CACHE_TOKENS)
        .then_some(tokens)
        .and_then(|tokens| usize::try_from(tokens).ok())
}

/// The value of label `name` in a Prometheus label set (`a="1",b="2"`);
/// vLLM's values here are numbers, so an escaped quote never matters.
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let mut rest = labels;
    loop {
        let (key, after) = rest.split_once("=\"")?;
        let (value, tail) = after.split_once('"')?;
        if key.trim_start_matches(',').trim() == name {
            return Some(value);
        }
        rest = tail;
    }
}

/// Asks the engine behind `upstream` for its `/metrics` once, within
/// `timeout`, and reads its KV cache per rank ([`vllm_kv_cache_tokens`]).
pub async fn ask_kv_cache_tokens(upstream: &Upstream, timeout: Duration) -> Option<usize> {
    let uri = upstream.url().join("/metrics").ok()?;
    let request = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .body(Empty::<Bytes>::new())
        .ok()?;
    let client = Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http();
    let body = tokio::time::timeout(timeout, async {
        let response = client.request(request).await.ok()?;
        if response.status() != StatusCode::OK {
            return None;
        }
        let body = Limited::new(response.into_body(), MAX_METRICS_BYTES);
        body.collect().await.ok().map(|body| body.to_bytes())
    })
    .await
    .ok()??;
    vllm_kv_cache_tokens(std::str::from_utf8(&body).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As vLLM 0.32's CPU build renders it (labels abridged).
    const VLLM: &str = r#"# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",kv_cache_max_concurrency="4.0",num_gpu_blocks="64",prefix_caching_hash_algo="sha256"} 1.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0
"#;

    #[test]
    fn blocks_times_block_size_per_rank() {
        assert_eq!(vllm_kv_cache_tokens(VLLM), Some(8192));
    }

    #[test]
    fn a_stated_token_size_wins_and_the_smallest_rank_counts() {
        let text = "vllm:cache_config_info{engine=\"0\",kv_cache_size_tokens=\"9000\",num_gpu_blocks=\"1\",block_size=\"16\"} 1\n\
                    vllm:cache_config_info{engine=\"1\",num_gpu_blocks=\"500\",block_size=\"16\"} 1\n";
        assert_eq!(vllm_kv_cache_tokens(text), Some(8000));
    }

    #[test]
    fn nothing_stated_or_nonsense_is_none() {
        assert_eq!(vllm_kv_cache_tokens(""), None);
        assert_eq!(vllm_kv_cache_tokens("llamacpp:kv_cache_tokens 5\n"), None);
        for labels in [
            r#"num_gpu_blocks="0",block_size="16""#,
            r#"num_gpu_blocks="-3",block_size="16""#,
            r#"num_gpu_blocks="18446744073709551615",block_size="16""#,
            r#"kv_cache_size_tokens="18446744073709551615""#,
            r#"num_gpu_blocks="64""#,
            r#"num_gpu_blocks="64",block_size=""#,
        ] {
            let text = format!("vllm:cache_config_info{{{labels}}} 1\n");
            assert_eq!(vllm_kv_cache_tokens(&text), None, "{labels}");
        }
    }
}
