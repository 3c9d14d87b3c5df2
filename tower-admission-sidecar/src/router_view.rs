//! The router view (issue 36): see [`RouterView`].

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use tokio::time::Instant;
use tower::Service;
use tower_admission::{Counts, Gate, Snapshot};

use super::body::Body;
use super::upstream::Upstream;

/// The largest engine `/metrics` body read (as for the merge).
const MAX_ENGINE_METRICS_BYTES: usize = 4 << 20;

/// How the router view reads the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouterViewOptions {
    /// How often the engine's `/metrics` is fetched in the background
    /// (50 ms: the endpoint picker's own refresh).
    pub interval: Duration,
    /// An engine scrape older than this is said in the log (200 ms: what
    /// the endpoint picker treats as stale).
    pub stale_after: Duration,
}

impl Default for RouterViewOptions {
    fn default() -> Self {
        RouterViewOptions {
            interval: Duration::from_millis(50),
            stale_after: Duration::from_millis(200),
        }
    }
}

impl RouterViewOptions {
    /// The engine fetched every `interval`, stale after `stale_after`.
    pub fn new(interval: Duration, stale_after: Duration) -> Self {
        RouterViewOptions {
            interval,
            stale_after,
        }
    }
}

/// The engine family, from the names of its series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Vllm,
    Sglang,
    LlamaCpp,
    Tgi,
    Other,
}

impl Family {
    fn of(text: &str) -> Family {
        let has = |prefix: &str| {
            text.lines()
                .any(|line| !line.starts_with('#') && line.starts_with(prefix))
        };
        if has("vllm:") {
            Family::Vllm
        } else if has("sglang:") {
            Family::Sglang
        } else if has("llamacpp:") {
            Family::LlamaCpp
        } else if has("tgi_") {
            Family::Tgi
        } else {
            Family::Other
        }
    }

    /// The names the view serves: waiting, running, cache.
    fn names(self) -> [&'static str; 3] {
        match self {
            Family::Sglang => [
                "sglang:num_queue_reqs",
                "sglang:num_running_reqs",
                "sglang:token_usage",
            ],
            _ => [
                "vllm:num_requests_waiting",
                "vllm:num_requests_running",
                "vllm:kv_cache_usage_perc",
            ],
        }
    }

    /// The engine's own series the view reads for an engine that does not
    /// use the names it serves: waiting, running, cache ("": none).
    fn sources(self) -> [&'static str; 3] {
        match self {
            Family::Vllm | Family::Sglang | Family::Other => ["", "", ""],
            Family::LlamaCpp => [
                "llamacpp:requests_deferred",
                "llamacpp:requests_processing",
                "llamacpp:kv_cache_usage_ratio",
            ],
            Family::Tgi => ["tgi_queue_size", "", ""],
        }
    }
}

/// One sample: its name, its labels as written (without braces), its value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: String,
    value: f64,
}

/// The samples of `names` in an exposition text.
fn samples(text: &str, names: &[&str]) -> Vec<Sample> {
    let mut found = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        if name.is_empty() || !names.contains(&name) {
            continue;
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            match labels_end(&line[name_end + 1..]) {
                Some(end) => (
                    &line[name_end + 1..name_end + 1 + end],
                    &line[name_end + 2 + end..],
                ),
                None => continue,
            }
        } else {
            ("", &line[name_end..])
        };
        let Some(value) = rest.split_whitespace().next().and_then(|v| v.parse().ok()) else {
            continue;
        };
        found.push(Sample {
            name: name.to_owned(),
            labels: labels.to_owned(),
            value,
        });
    }
    found
}

/// Where the label set that starts `text` ends (the closing brace outside
/// quotes).
fn labels_end(text: &str) -> Option<usize> {
    let (mut quoted, mut escaped) = (false, false);
    for (index, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(index),
            _ => {}
        }
    }
    None
}

/// The value of label `key` in a label set as written.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].trim_start_matches([',', ' ']);
        let value_start = eq + 2;
        let mut end = value_start;
        let mut escaped = false;
        for (index, c) in rest[value_start..].char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = value_start + index;
                    break;
                }
                _ => {}
            }
        }
        if name == key {
            return Some(&rest[value_start..end]);
        }
        rest = &rest[(end + 1).min(rest.len())..];
    }
    None
}

/// The engine's last scrape.
#[derive(Debug)]
struct Scrape {
    at: Instant,
    text: String,
    family: Family,
}

#[derive(Debug)]
struct Shared {
    gate: Gate,
    prefix: String,
    options: RouterViewOptions,
    last: Mutex<Option<Scrape>>,
    stale_said: std::sync::atomic::AtomicBool,
}

/// The router view (issue 36): the engine family's own load gauges, with
/// the gate counted in, for the routers that read them.
///
/// Fleet routers pick a worker from the engine's own gauges: llm-d's
/// endpoint picker (the Gateway API Inference Extension) reads
/// `vllm:num_requests_waiting`, `vllm:num_requests_running` and
/// `vllm:kv_cache_usage_perc` every 50 ms; vLLM's production-stack router,
/// AIBrix and Dynamo read the same kind of gauge; SGLang's are
/// `sglang:num_queue_reqs`, `sglang:num_running_reqs`, `sglang:token_usage`.
/// Behind the sidecar the excess waits in the gate's queue, so the engine's
/// own waiting gauge reads 0 on the busiest worker and the router sends it
/// more. With the router view on, the sidecar's `/metrics` serves those
/// names with the gate's queue counted in: the router needs no change but
/// the port it scrapes (the sidecar's, which every request must pass
/// anyway).
///
/// | engine | waiting | running | cache |
/// |---|---|---|---|
/// | vLLM (`vllm:` series) | `vllm:num_requests_waiting` = vLLM's + the gate's queue, per `engine` rank | vLLM's `vllm:num_requests_running` | vLLM's `vllm:kv_cache_usage_perc` |
/// | SGLang (`sglang:` series) | `sglang:num_queue_reqs` = SGLang's + the gate's queue | SGLang's `sglang:num_running_reqs` | SGLang's `sglang:token_usage` |
/// | llama.cpp, TGI, any other | `vllm:num_requests_waiting` = the engine's own waiting (`llamacpp:requests_deferred`, `tgi_queue_size`) + the gate's queue | the gate's admitted requests | the engine's (`llamacpp:kv_cache_usage_ratio`), else the gate's engine requests over its limit |
///
/// The view never waits on the engine: the gate's numbers are read at the
/// scrape, the engine's are its last scrape, fetched in the background
/// every [`RouterViewOptions::interval`]; the age of that scrape is the
/// gauge `{prefix}_engine_scrape_age_seconds`, and a scrape older than
/// [`RouterViewOptions::stale_after`] is said in the log (once, until a
/// fresh one comes). The gate's unranked queue (requests any rank may
/// take) is counted in every rank's waiting gauge; a ranked request in its
/// rank's.
///
/// With the engine's metrics merged (`--merge-engine-metrics`), the merge
/// is the background scrape too, without the engine's own series of the
/// names the view serves: a series never has two values.
///
/// Cheap to clone; the background scrape runs until every clone is gone or
/// the runtime shuts down.
#[derive(Debug, Clone)]
pub struct RouterView {
    shared: Arc<Shared>,
}

impl RouterView {
    /// Starts fetching `upstream`'s `/metrics` every
    /// [`interval`](RouterViewOptions::interval) on the current Tokio
    /// runtime; `prefix` is the gate's metrics prefix (for the age gauge).
    pub fn spawn(
        gate: Gate,
        upstream: &Upstream,
        prefix: &str,
        options: RouterViewOptions,
    ) -> Self {
        let view = RouterView {
            shared: Arc::new(Shared {
                gate,
                prefix: prefix.to_owned(),
                options,
                last: Mutex::new(None),
                stale_said: std::sync::atomic::AtomicBool::new(false),
            }),
        };
        let weak = Arc::downgrade(&view.shared);
        let mut upstream = upstream.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(options.interval);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(shared) = weak.upgrade() else {
                    return; // every view is gone
                };
                let fetched = tokio::time::timeout(options.stale_after, fetch(&mut upstream)).await;
                if let Ok(Some(text)) = fetched {
                    shared.record(text, Instant::now());
                }
            }
        });
        view
    }

    /// A view fed by [`record`](Self::record) alone (for tests).
    #[cfg(test)]
    fn manual(gate: Gate, options: RouterViewOptions) -> Self {
        RouterView {
            shared: Arc::new(Shared {
                gate,
                prefix: tower_admission::metrics::DEFAULT_PREFIX.to_owned(),
                options,
                last: Mutex::new(None),
                stale_said: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// The view's series, and the engine's last scrape without the series
    /// the view replaces when `merge`: appended to the gate's own.
    pub(crate) fn render(&self, merge: bool) -> String {
        let now = Instant::now();
        let snapshot = self.shared.gate.snapshot();
        let last = self.shared.last.lock().unwrap_or_else(|p| p.into_inner());
        let mut text = String::new();
        let age = last
            .as_ref()
            .map(|scrape| now.saturating_duration_since(scrape.at));
        self.shared.say_if_stale(age);
        let name = format!("{}_engine_scrape_age_seconds", self.shared.prefix);
        let _ = writeln!(
            text,
            "# HELP {name} Age of the engine scrape the router view serves (-1: none yet).\n\
             # TYPE {name} gauge\n{name} {}",
            age.map_or(-1.0, |age| age.as_secs_f64())
        );
        let (family, engine_text) = match last.as_ref() {
            Some(scrape) => (scrape.family, scrape.text.as_str()),
            None => (Family::Other, ""),
        };
        view(&mut text, family, engine_text, &snapshot);
        if merge && !engine_text.is_empty() {
            let replaced = family.names();
            for line in engine_text.lines() {
                if !replaces(line, &replaced) {
                    text.push_str(line);
                    text.push('\n');
                }
            }
        }
        text
    }
}

impl Shared {
    fn record(&self, text: String, at: Instant) {
        let family = Family::of(&text);
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(Scrape { at, text, family });
    }

    /// Logs a stale engine scrape once, and a fresh one after it.
    fn say_if_stale(&self, age: Option<Duration>) {
        use std::sync::atomic::Ordering;
        let stale = age.is_none_or(|age| age > self.options.stale_after);
        if stale != self.stale_said.swap(stale, Ordering::Relaxed) {
            if stale {
                tracing::warn!(
                    "the router view serves an engine scrape older than {:?} ({}): the engine's \
                     /metrics is slow or unreachable",
                    self.options.stale_after,
                    age.map_or_else(|| "none yet".to_owned(), |age| format!("{age:?}"))
                );
            } else {
                tracing::info!("the router view's engine scrape is fresh again");
            }
        }
    }
}

/// Whether an exposition `line` (sample, `# HELP` or `# TYPE`) is of one
/// of the `names`.
fn replaces(line: &str, names: &[&str]) -> bool {
    let body = line
        .strip_prefix("# HELP ")
        .or_else(|| line.strip_prefix("# TYPE "))
        .unwrap_or(line);
    let end = body.find(['{', ' ']).unwrap_or(body.len());
    names.contains(&&body[..end])
}

/// The gate's queue as a rank of the engine sees it: its own queue plus
/// the unranked queue (requests any rank may take).
fn queued_for(snapshot: &Snapshot, rank: Option<usize>) -> usize {
    let ranked = rank
        .and_then(|rank| snapshot.ranks.get(rank))
        .map_or(0, |counts| counts.queued);
    ranked + snapshot.unranked.queued
}

/// Writes the view's three series of `family`, from the engine's last
/// scrape `engine` and the gate's `snapshot`.
fn view(text: &mut String, family: Family, engine: &str, snapshot: &Snapshot) {
    let [waiting, running, cache] = family.names();
    let help = [
        (
            waiting,
            "Requests waiting: in the engine and in the admission gate's queue.",
        ),
        (running, "Requests running in the engine."),
        (cache, "KV cache usage, 0 to 1."),
    ];
    let mut lines: [Vec<String>; 3] = Default::default();
    match family {
        Family::Vllm | Family::Sglang => {
            // The engine's own series, label sets and all, the gate's
            // queue added to waiting (by `engine` rank where labelled).
            for sample in samples(engine, &[waiting]) {
                let rank = label(&sample.labels, "engine")
                    .or_else(|| label(&sample.labels, "dp_rank"))
                    .and_then(|rank| rank.parse().ok())
                    .or_else(|| snapshot.ranks.len().eq(&1).then_some(0));
                let value = sample.value + queued_for(snapshot, rank) as f64;
                lines[0].push(series(waiting, &sample.labels, value));
            }
            if lines[0].is_empty() {
                lines[0].push(series(waiting, "", snapshot.total.queued as f64));
            }
            for (slot, name) in [(1, running), (2, cache)] {
                for sample in samples(engine, &[name]) {
                    lines[slot].push(series(name, &sample.labels, sample.value));
                }
            }
        }
        Family::LlamaCpp | Family::Tgi | Family::Other => {
            let [own_waiting, own_running, own_cache] = family.sources();
            let sum = |name: &str| -> Option<f64> {
                let found = samples(engine, &[name]);
                (!name.is_empty() && !found.is_empty())
                    .then(|| found.iter().map(|sample| sample.value).sum())
            };
            let engine_waiting = sum(own_waiting).unwrap_or(0.0);
            lines[0].push(series(
                waiting,
                "",
                engine_waiting + snapshot.total.queued as f64,
            ));
            let running_now = sum(own_running).unwrap_or(snapshot.total.engine_requests as f64);
            lines[1].push(series(running, "", running_now));
            let usage = sum(own_cache).unwrap_or_else(|| occupancy(snapshot));
            lines[2].push(series(cache, "", usage));
        }
    }
    for ((name, help), lines) in help.iter().zip(&lines) {
        if lines.is_empty() {
            continue;
        }
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} gauge");
        for line in lines {
            text.push_str(line);
            text.push('\n');
        }
    }
}

/// The gate's engine requests over its engine request limit, over every
/// rank: the cache usage of an engine that states none.
fn occupancy(snapshot: &Snapshot) -> f64 {
    let ranks = snapshot.ranks.len().max(1);
    let limit = snapshot.limits.engine_request_limit.saturating_mul(ranks);
    if limit == 0 {
        return 0.0;
    }
    let Counts {
        engine_requests, ..
    } = snapshot.total;
    (engine_requests as f64 / limit as f64).min(1.0)
}

fn series(name: &str, labels: &str, value: f64) -> String {
    if labels.is_empty() {
        format!("{name} {value}")
    } else {
        format!("{name}{{{labels}}} {value}")
    }
}

/// The engine's `/metrics`, or `None` when it cannot be read.
async fn fetch(engine: &mut Upstream) -> Option<String> {
    let request = Request::get("/metrics")
        .body(Body::new(Empty::<Bytes>::new()))
        .expect("a GET of a fixed path is a valid request");
    let Ok(response) = engine.call(request).await;
    if response.status() != StatusCode::OK {
        return None;
    }
    let body = Limited::new(response.into_body(), MAX_ENGINE_METRICS_BYTES)
        .collect()
        .await
        .ok()?;
    let mut text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    Some(text)
}

#[cfg(test)]
mod tests;
