//! The operations kit against a real Prometheus: `docs/prometheus/alerts.yml`
//! checked and unit-tested by `promtool`, then loaded into a Prometheus
//! server (started here, on a free loopback port, with a generated config)
//! that scrapes the example OpenAI server while it serves a steady load and
//! then a burst past its capacity. Through Prometheus's HTTP API:
//!
//! - every PromQL expression of `docs/operations.md` (its `promql` blocks)
//!   and of `docs/grafana/tower-admission.json` (every `expr`, and the
//!   variables' `label_values` queries) parses and returns data; they are
//!   read from the files, so a broken expression added there fails here;
//! - the Little's-law estimate of `docs/operations.md` (`L`, `C`, and `W`
//!   measured by the histogram) over the steady window agrees within 10%
//!   with `sizing::Sampler` over the same window;
//! - the alert `AdmissionWorkerRejectionsSustained` fires during the burst
//!   and resolves after it; `AdmissionNoCapacityReport` never becomes
//!   active (the example reports its engine's capacity); every rule
//!   evaluates without error.
//!
//! The Sampler takes `Gate::snapshot()`s, but the example's gate lives in
//! another process: the test rebuilds rank 0's snapshot from the example's
//! own `/metrics` every 20 ms (five times as often as Prometheus scrapes),
//! the gauges and counters being the gate's counts and tallies.
//!
//! The alert rules are loaded as they are written, with every duration
//! (`for:` and range selectors) divided by 60, a minute becoming a second;
//! Prometheus scrapes every 100 ms and evaluates every 250 ms.
//!
//! Needs `prometheus` and `promtool` (Debian's `prometheus` package) on the
//! `PATH`: without them the tests say what to install and pass, unless
//! `CI=true`, where they fail.

use tower_admission_testkit::exposition;
#[path = "support/ops_files.rs"]
mod ops_files;
#[path = "support/prometheus.rs"]
mod prometheus;
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tower_admission::sizing::{Estimate, Sampler};
use tower_admission::{AdmissionConfig, Counts, EngineCapacity, Gate, Snapshot, Tally};

use exposition::Exposition;
use ops_files::*;
use prometheus::*;
use support::FOREVER;

/// The prefix the rules, the documentation and the dashboard are written
/// for.
const PREFIX: &str = "dynamo_backend_admission";

/// Each duration of the alert rules is divided by this for the live test.
const TIME_SQUEEZE: u64 = 60;

// ---------------------------------------------------------------------------
// Load on the example server

fn chat(max_tokens: u64) -> Value {
    json!({
        "model": "sim",
        "messages": [{"role": "user", "content": "Tell me about admission control."}],
        "max_tokens": max_tokens,
        "stream": true,
    })
}

/// Posts a streamed chat request and reads it to its end; the status.
async fn complete(http: &reqwest::Client, url: &str, rank: Option<u32>) -> u16 {
    let mut request = http
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat(2));
    if let Some(rank) = rank {
        request = request.header("x-data-parallel-rank", rank);
    }
    let response = request.send().await.expect("the request failed");
    let status = response.status().as_u16();
    response.bytes().await.expect("the body failed");
    status
}

/// Sends a request every `every` until `stop`, each read to its end; the
/// statuses of the answers.
fn steady_load(
    http: reqwest::Client,
    url: String,
    rank: Option<u32>,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Vec<u16>> {
    tokio::spawn(async move {
        let mut requests = Vec::new();
        let mut tick = tokio::time::interval(every);
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let (http, url) = (http.clone(), url.clone());
            requests.push(tokio::spawn(
                async move { complete(&http, &url, rank).await },
            ));
        }
        let mut statuses = Vec::new();
        for request in requests {
            statuses.push(request.await.expect("a request task panicked"));
        }
        statuses
    })
}

/// A streamed request held open past its first token, until dropped.
struct Held {
    _response: reqwest::Response,
}

async fn hold(http: &reqwest::Client, url: &str) -> Held {
    let mut response = http
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat(FOREVER))
        .send()
        .await
        .expect("the request failed");
    assert_eq!(response.status(), 200);
    // The role chunk, then the first token: the request no longer waits.
    let mut seen = String::new();
    while seen.matches("\n\n").count() < 2 {
        let chunk = response
            .chunk()
            .await
            .expect("the stream failed")
            .expect("the stream ended");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    Held {
        _response: response,
    }
}

/// The example's `/metrics`, parsed.
async fn scrape(http: &reqwest::Client, url: &str) -> Exposition {
    let text = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .expect("scrape /metrics")
        .text()
        .await
        .expect("read /metrics");
    Exposition::parse(&text)
}

/// Rank 0's part of a gate snapshot, rebuilt from the gate's series:
/// `template` (a snapshot of a gate of the same capacity) with the counts
/// and tallies of rank 0 and of the unranked requests replaced.
// Field by field, not struct literals: the structs may grow fields.
#[allow(clippy::field_reassign_with_default)]
fn snapshot_from(template: &Snapshot, metrics: &Exposition) -> Snapshot {
    let value = |suffix: &str, labels: &[(&str, &str)]| {
        metrics.value(&format!("{PREFIX}_{suffix}"), labels) as u64
    };
    let counts = |rank: &str| {
        let labels = [("dp_rank", rank)];
        let mut counts = Counts::default();
        counts.engine_requests = value("engine_request_count", &labels) as usize;
        counts.engine_waiting = value("engine_request_waiting_count", &labels) as usize;
        counts.queued = value("request_queue_count", &labels) as usize;
        counts
    };
    let tally = |rank: &str| {
        let admitted = |source| {
            value(
                "request_admit_total",
                &[("dp_rank", rank), ("source", source)],
            )
        };
        let rejected = |scope| value("rejection_total", &[("dp_rank", rank), ("scope", scope)]);
        let mut tally = Tally::default();
        tally.received = value("request_receive_total", &[("dp_rank", rank)]);
        tally.admitted_direct = admitted("direct");
        tally.admitted_queue = admitted("queue");
        // Unranked requests have no rank-scoped series: always 0.
        tally.rejected_rank = if rank == "unspecified" {
            0
        } else {
            rejected("rank")
        };
        tally.rejected_worker = rejected("worker");
        tally.cancelled = value("cancellation_total", &[("dp_rank", rank)]);
        tally
    };
    let mut snapshot = template.clone();
    snapshot.ranks = vec![counts("0")];
    snapshot.rank_tallies = vec![tally("0")];
    snapshot.unranked = counts("unspecified");
    snapshot.unranked_tally = tally("unspecified");
    snapshot
}

/// `|measured - reference| <= 10%` of the reference.
#[track_caller]
fn within_ten_percent(what: &str, prometheus: f64, sampler: f64) {
    let error = (prometheus - sampler).abs() / sampler;
    assert!(
        error <= 0.10,
        "{what}: Prometheus says {prometheus}, sizing::Sampler {sampler}: {:.1}% apart",
        error * 100.0
    );
}

// ---------------------------------------------------------------------------
// The tests

#[test]
fn the_duration_squeezer_rewrites_for_and_ranges_only() {
    let (out, rewritten) = squeeze_durations(
        "      for: 5m\n  rate(x[10m]) / y[1h30m:1m] > 0.05\n  summary: see [the docs]\n",
        60,
    );
    assert_eq!(
        out,
        "      for: 5000ms\n  rate(x[10000ms]) / y[90000ms:1000ms] > 0.05\n  summary: see [the docs]\n"
    );
    assert_eq!(rewritten, 4);
    assert_eq!(duration_ms("250ms"), Some(250));
    assert_eq!(duration_ms("1h30m"), Some(5_400_000));
    assert_eq!(duration_ms("5"), None);
    assert_eq!(duration_ms("m5"), None);
}

#[test]
fn the_documentation_promql_is_read_one_expression_at_a_time() {
    let found = markdown_promql(
        "text\n```promql\n# A\nfoo\n\n# B\n  bar\n/ baz\n# C:\n# c1,\nqux\n# D\nquux\n```\n```rust\nnot = this;\n```\n",
    );
    assert_eq!(
        found,
        [
            ("A".to_owned(), "foo".to_owned()),
            ("B".to_owned(), "  bar\n/ baz".to_owned()),
            ("C: c1,".to_owned(), "qux".to_owned()),
            ("D".to_owned(), "quux".to_owned()),
        ]
    );
}

#[test]
fn the_dashboard_panels_use_the_data_source_variable_and_do_not_overlap() {
    let dashboard: Value =
        serde_json::from_str(&read(&docs("grafana/tower-admission.json"))).expect("dashboard JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = std::collections::BTreeSet::new();
    let mut cells = BTreeMap::new();
    for panel in panels {
        let title = panel["title"].as_str().expect("a title");
        assert!(
            ids.insert(panel["id"].as_u64().expect("an id")),
            "{title}: id reused"
        );
        let grid = &panel["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|key| grid[key].as_u64().expect("gridPos"));
        assert!(x + w <= 24, "{title}: wider than the dashboard");
        for column in x..x + w {
            for row in y..y + h {
                if let Some(other) = cells.insert((column, row), title) {
                    panic!("{title} overlaps {other}");
                }
            }
        }
        if panel["type"] == "row" {
            continue;
        }
        assert!(
            !panel["description"].as_str().unwrap_or_default().is_empty(),
            "{title}: say what it shows"
        );
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for source in std::iter::once(&panel["datasource"])
            .chain(targets.iter().map(|target| &target["datasource"]))
        {
            assert_eq!(source["uid"], "${datasource}", "{title}");
        }
    }
}

#[test]
fn promtool_checks_and_unit_tests_every_alert_rule() {
    let Some(tools) = tools("promtool_checks_and_unit_tests_every_alert_rule") else {
        return;
    };
    let rules_path = docs("prometheus/alerts.yml");
    let tests_path = docs("prometheus/alerts_test.yml");
    promtool(&tools, &["check", "rules", rules_path.to_str().unwrap()]);
    let output = promtool(&tools, &["test", "rules", tests_path.to_str().unwrap()]);
    assert!(output.contains("SUCCESS"), "{output}");

    // Every rule has unit tests where it fires and where it does not.
    let names = alert_names(&read(&rules_path));
    assert!(names.len() >= 5, "{names:?}");
    let coverage = unit_test_coverage(&read(&tests_path));
    for name in &names {
        assert_eq!(
            coverage.get(name),
            Some(&(true, true)),
            "{name}: alerts_test.yml must expect it to fire at one evaluation and not at \
             another (fired, not fired): {coverage:?}"
        );
    }

    // The test-time rewrite keeps the rules valid.
    let (squeezed, rewritten) = squeeze_durations(&read(&rules_path), TIME_SQUEEZE);
    assert!(rewritten > names.len(), "{rewritten} durations");
    let dir = TempDir::new("tower-admission-rules");
    let path = dir.0.join("alerts.yml");
    std::fs::write(&path, squeezed).unwrap();
    promtool(&tools, &["check", "rules", path.to_str().unwrap()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_prometheus_runs_the_documented_promql_the_dashboard_and_the_alerts() {
    let Some(tools) =
        tools("a_live_prometheus_runs_the_documented_promql_the_dashboard_and_the_alerts")
    else {
        return;
    };
    let started = unix_now();
    // One rank of 64 sequences; the gate admits 32 at a time (and 32
    // waiting), and queues 4. Twenty times slower than the modelled GPU:
    // a request waits ~0.2 s for its first token.
    let server = support::server(
        "openai_server",
        &[
            "--max-num-seqs",
            "64",
            "--engine-request-limit",
            "32",
            "--engine-request-waiting-limit",
            "32",
            "--request-queue-limit",
            "4",
            "--time-scale",
            "20",
            "--max-model-len",
            "1000000",
            "--metrics-prefix",
            PREFIX,
        ],
        &[],
    );
    let url = server.url.clone();
    let target = url.trim_start_matches("http://").to_owned();
    let (rules, _) = squeeze_durations(&read(&docs("prometheus/alerts.yml")), TIME_SQUEEZE);
    let prometheus = Prometheus::start(&tools, &target, &rules).await;
    prometheus
        .wait_until("scraping the example server", || async {
            let up = prometheus
                .query("up{job=\"openai_server\"}", unix_now())
                .await;
            up.first()
                .is_some_and(|series| sample_value(&series["value"]) == 1.0)
        })
        .await;
    let http = reqwest::Client::new();

    // ---- A steady load on rank 0, well within the limits: 40 requests a
    // second, sampled every 20 ms for 10 s after a 2 s warm-up.
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_load(
        http.clone(),
        url.clone(),
        Some(0),
        Duration::from_millis(25),
        Arc::clone(&stop),
    );
    let template =
        Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(64, 1))).snapshot();
    let mut sampler = Sampler::rank(0);
    let mut every = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(2),
        Duration::from_millis(20),
    );
    let window_start = Instant::now() + Duration::from_secs(2);
    let mut first_wall = None;
    let last_wall = loop {
        every.tick().await;
        let metrics = scrape(&http, &url).await;
        let (at, wall) = (Instant::now(), unix_now());
        sampler.record(&snapshot_from(&template, &metrics), at);
        first_wall.get_or_insert(wall);
        if at >= window_start + Duration::from_secs(10) {
            break wall;
        }
    };
    let first_wall = first_wall.unwrap();
    // Prometheus must have scraped past the window's end before it is
    // asked about it; the load goes on meanwhile.
    let receive = format!("{PREFIX}_request_receive_total{{dp_rank=\"0\"}}");
    prometheus
        .wait_until("scraped past the window", || async {
            let stamp = prometheus
                .query(&format!("timestamp({receive})"), unix_now())
                .await;
            stamp
                .first()
                .is_some_and(|series| sample_value(&series["value"]) > last_wall + 0.2)
        })
        .await;
    stop.store(true, Ordering::Relaxed);
    let statuses = load.await.unwrap();
    assert!(
        statuses.iter().all(|&status| status == 200),
        "the steady load was shaped by the gate: {statuses:?}"
    );
    let estimate: Estimate = sampler
        .estimate()
        .unwrap_or_else(|why| panic!("sizing::Sampler gave no estimate: {why}"));

    // The documentation's L, C and W over the same window.
    let documented = markdown_promql(&read(&docs("operations.md")));
    let window = format!("[{}ms]", ((last_wall - first_wall) * 1000.0).round() as u64);
    let find = |prefix: &str| {
        let (_, expr) = documented
            .iter()
            .find(|(comment, _)| comment.starts_with(prefix))
            .unwrap_or_else(|| {
                panic!("no expression after a `# {prefix}` comment: {documented:?}")
            });
        assert!(expr.contains("[10m]"), "{expr}");
        expr.replace("[10m]", &window)
    };
    let l = prometheus.scalar(&find("L:"), last_wall).await;
    let c = prometheus.scalar(&find("C:"), last_wall).await;
    let w = prometheus.scalar(&find("W,"), last_wall).await;
    eprintln!(
        "window {window}: Prometheus L {l:.3}, C {c:.2}/s, W {w:.4} s; sizing::Sampler L {:.3}, \
         C {:.2}/s, W = L / C {:.4} s, candidate waiting limit {}",
        estimate.mean_waiting(),
        estimate.admission_rate(),
        estimate.mean_wait().as_secs_f64(),
        estimate.waiting_limit(),
    );
    within_ten_percent("L", l, estimate.mean_waiting());
    within_ten_percent("C", c, estimate.admission_rate());
    within_ten_percent("W", w, estimate.mean_wait().as_secs_f64());
    // The window is usable: the three checks of the documentation are 0.
    let checks: Vec<&(String, String)> = documented
        .iter()
        .skip_while(|(comment, _)| !comment.starts_with("The window is usable"))
        .collect();
    assert_eq!(checks.len(), 3, "{documented:?}");
    for (comment, expr) in checks {
        let expr = expr.replace("[10m]", &window);
        assert_eq!(
            prometheus.scalar(&expr, last_wall).await,
            0.0,
            "{comment}: {expr}"
        );
    }

    // ---- A burst past capacity: 32 held streams fill the engine, four
    // requests take the queue, and unranked requests keep coming and are
    // rejected for the whole worker until the alert fires.
    let alert = "AdmissionWorkerRejectionsSustained";
    assert!(prometheus.alert_states(alert).await.is_empty());
    let mut held = Vec::new();
    for _ in 0..32 {
        held.push(hold(&http, &url).await);
    }
    let queued: Vec<JoinHandle<u16>> = (0..4)
        .map(|_| {
            let (http, url) = (http.clone(), url.clone());
            tokio::spawn(async move { complete(&http, &url, None).await })
        })
        .collect();
    let queue = format!("{PREFIX}_request_queue_count");
    let queue_full = || async {
        let metrics = scrape(&http, &url).await;
        metrics.value(&queue, &[("dp_rank", "unspecified")]) == 4.0
    };
    prometheus
        .wait_until("seeing the queue full", queue_full)
        .await;
    let stop = Arc::new(AtomicBool::new(false));
    let flood = steady_load(
        http.clone(),
        url.clone(),
        None,
        Duration::from_millis(20),
        Arc::clone(&stop),
    );
    let burst_start = unix_now();
    prometheus
        .wait_until("firing the worker-rejection alert", || async {
            prometheus.alert_states(alert).await == ["firing"]
        })
        .await;
    let fired_after = unix_now() - burst_start;
    stop.store(true, Ordering::Relaxed);
    let statuses = flood.await.unwrap();
    assert!(
        !statuses.is_empty() && statuses.iter().all(|&status| status == 529),
        "every request of the flood is an overload answer: {statuses:?}"
    );
    // The held streams end; the queued requests run.
    drop(held);
    for request in queued {
        assert_eq!(request.await.unwrap(), 200);
    }
    let burst_end = unix_now();
    prometheus
        .wait_until("resolving the worker-rejection alert", || async {
            prometheus.alert_states(alert).await.is_empty()
        })
        .await;
    eprintln!(
        "{alert}: fired {fired_after:.1} s into the burst, resolved {:.1} s after it",
        unix_now() - burst_end
    );

    // ---- Every documented expression, as written, returns data.
    let end = unix_now();
    for (comment, expr) in &documented {
        let result = prometheus.query(expr, end).await;
        assert!(
            !result.is_empty(),
            "docs/operations.md `# {comment}`: no data for\n{expr}"
        );
    }

    // ---- Every dashboard query parses and returns data over the run, as
    // Grafana asks for it (a range query), with every variable at All.
    let dashboard: Value =
        serde_json::from_str(&read(&docs("grafana/tower-admission.json"))).expect("dashboard JSON");
    let (values, label_queries) = dashboard_variables(&dashboard, "2s", "10s");
    assert_eq!(values.get("prefix").map(String::as_str), Some(PREFIX));
    let expressions = dashboard_expressions(&dashboard);
    assert!(expressions.len() >= 20, "{expressions:?}");
    for (title, expr) in label_queries.into_iter().chain(expressions) {
        let promql = interpolate(&expr, &values);
        let result = prometheus.query_range(&promql, started, end, "1s").await;
        let finite = result
            .iter()
            .flat_map(|series| series["values"].as_array().into_iter().flatten())
            .any(|pair| sample_value(pair).is_finite());
        assert!(
            finite,
            "dashboard panel {title:?}: no data over the run for\n{promql}\n{result:?}"
        );
    }

    // ---- Every rule evaluated without error, and the example (which
    // reports its engine's capacity) never looked unreported.
    let rules = prometheus.api("rules", &[]).await;
    let mut evaluated = 0;
    for group in rules["groups"].as_array().expect("rule groups") {
        for rule in group["rules"].as_array().expect("rules") {
            assert_eq!(rule["health"], "ok", "{rule}");
            evaluated += 1;
        }
    }
    assert_eq!(
        evaluated,
        alert_names(&read(&docs("prometheus/alerts.yml"))).len()
    );
    let never = format!(
        "count_over_time(ALERTS{{alertname=\"AdmissionNoCapacityReport\"}}[{}s])",
        (end - started).ceil() as u64 + 1
    );
    assert!(prometheus.query(&never, end).await.is_empty(), "{never}");
    let fired = format!(
        "count_over_time(ALERTS{{alertname=\"{alert}\",alertstate=\"firing\"}}[{}s])",
        (end - started).ceil() as u64 + 1
    );
    assert!(!prometheus.query(&fired, end).await.is_empty(), "{fired}");
    drop(prometheus);
    drop(server);
}
