//! The operations kit's tools for the live Prometheus test: `prometheus`
//! and `promtool` found on the `PATH` (or a skip, or a failure under CI),
//! the repository's `docs/` files, and a Prometheus server started on a
//! free loopback port with a generated config, queried through its HTTP API.

#![allow(dead_code)] // each test binary uses part of it

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::support::{PATIENCE, Process};

/// The repository's root, where `docs/` is.
pub const MANIFEST_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

// ---------------------------------------------------------------------------
// The tools

/// `prometheus` and `promtool`, found on the `PATH`.
pub struct Tools {
    pub prometheus: PathBuf,
    pub promtool: PathBuf,
}

/// The tools, or `None` (after saying what to install) when they are
/// missing outside CI. In CI (`CI=true`) missing tools fail the test.
pub fn tools(test: &str) -> Option<Tools> {
    let find = |name: &str| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .find(|candidate| candidate.is_file())
        })
    };
    match (find("prometheus"), find("promtool")) {
        (Some(prometheus), Some(promtool)) => Some(Tools {
            prometheus,
            promtool,
        }),
        (prometheus, promtool) => {
            let missing: Vec<&str> = [("prometheus", prometheus), ("promtool", promtool)]
                .into_iter()
                .filter(|(_, found)| found.is_none())
                .map(|(name, _)| name)
                .collect();
            let message = format!(
                "{test}: {} not found on PATH; install Debian's `prometheus` package \
                 (apt-get install prometheus), which provides /usr/bin/prometheus and \
                 /usr/bin/promtool",
                missing.join(" and ")
            );
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{message} (required when CI=true)");
            }
            eprintln!("skipped: {message}");
            None
        }
    }
}

pub fn docs(path: &str) -> PathBuf {
    Path::new(MANIFEST_DIR).join("docs").join(path)
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()))
}

/// Runs `promtool` with `args`; panics with its output unless it succeeds.
#[track_caller]
pub fn promtool(tools: &Tools, args: &[&str]) -> String {
    let output = Command::new(&tools.promtool)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", tools.promtool.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "promtool {args:?} failed ({}):\n{text}",
        output.status
    );
    text
}

// ---------------------------------------------------------------------------
// Prometheus

/// A Prometheus server started for the test, with its temporary directory.
pub struct Prometheus {
    pub process: Process,
    /// Config, rules and data; removed after the process is killed.
    pub _dir: TempDir,
    pub api: String,
    pub http: reqwest::Client,
}

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let path = std::env::temp_dir().join(format!("{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|error| panic!("cannot create {}: {error}", path.display()));
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs_f64()
}

impl Prometheus {
    /// Starts Prometheus scraping `target` (host:port) every 100 ms and
    /// evaluating `rules` every 250 ms; returns once it is ready.
    pub async fn start(tools: &Tools, target: &str, rules: &str) -> Prometheus {
        let dir = TempDir::new("tower-admission-prometheus");
        let rules_path = dir.0.join("alerts.yml");
        std::fs::write(&rules_path, rules).expect("write the rules");
        promtool(tools, &["check", "rules", rules_path.to_str().unwrap()]);
        let config = format!(
            "global:\n  scrape_interval: 100ms\n  scrape_timeout: 100ms\n  \
             evaluation_interval: 250ms\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: openai_server\n    static_configs:\n      \
             - targets: ['{target}']\n",
            rules = rules_path.display(),
        );
        let config_path = dir.0.join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write the config");
        promtool(tools, &["check", "config", config_path.to_str().unwrap()]);
        let port = free_port();
        let address = format!("127.0.0.1:{port}");
        let process = Process::spawn(
            &tools.prometheus,
            &[
                &format!("--config.file={}", config_path.display()),
                &format!("--storage.tsdb.path={}", dir.0.join("data").display()),
                &format!("--web.listen-address={address}"),
                "--log.level=warn",
            ],
            &[],
        );
        let prometheus = Prometheus {
            process,
            _dir: dir,
            api: format!("http://{address}"),
            http: reqwest::Client::new(),
        };
        prometheus
            .wait_until("ready", || async {
                let ready = prometheus
                    .http
                    .get(format!("{}/-/ready", prometheus.api))
                    .send()
                    .await;
                ready.is_ok_and(|response| response.status().is_success())
            })
            .await;
        prometheus
    }

    /// Polls `done` (every 50 ms) until it holds; panics with
    /// Prometheus's log after `PATIENCE`.
    pub async fn wait_until<F, Fut>(&self, what: &str, mut done: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + PATIENCE;
        while !done().await {
            assert!(
                Instant::now() < deadline,
                "Prometheus: not {what} after {PATIENCE:?}; its log:\n{}",
                self.process.stderr()
            );
            // The poll interval; `done` is what is waited for.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `GET /api/v1/<path>` with `params`; the `data` of a successful
    /// answer, or a panic naming the error and the parameters.
    pub async fn api(&self, path: &str, params: &[(&str, String)]) -> Value {
        let response = self
            .http
            .get(format!("{}/api/v1/{path}", self.api))
            .query(params)
            .send()
            .await
            .unwrap_or_else(|error| panic!("Prometheus API {path}: {error}"));
        let body: Value = response
            .json()
            .await
            .unwrap_or_else(|error| panic!("Prometheus API {path}: not JSON: {error}"));
        assert_eq!(
            body["status"], "success",
            "Prometheus API {path} {params:?}: {body}"
        );
        body["data"].clone()
    }

    /// An instant query at `time` (Unix seconds): its result vector.
    pub async fn query(&self, expr: &str, time: f64) -> Vec<Value> {
        let data = self
            .api(
                "query",
                &[("query", expr.to_owned()), ("time", format!("{time:.3}"))],
            )
            .await;
        data["result"].as_array().cloned().unwrap_or_default()
    }

    /// The single value of an instant query that must give exactly one
    /// series.
    pub async fn scalar(&self, expr: &str, time: f64) -> f64 {
        let result = self.query(expr, time).await;
        assert_eq!(result.len(), 1, "{expr}: one series expected: {result:?}");
        sample_value(&result[0]["value"])
    }

    /// A range query: its result matrix.
    pub async fn query_range(&self, expr: &str, start: f64, end: f64, step: &str) -> Vec<Value> {
        let data = self
            .api(
                "query_range",
                &[
                    ("query", expr.to_owned()),
                    ("start", format!("{start:.3}")),
                    ("end", format!("{end:.3}")),
                    ("step", step.to_owned()),
                ],
            )
            .await;
        data["result"].as_array().cloned().unwrap_or_default()
    }

    /// The states of the active (pending or firing) alerts named `name`.
    pub async fn alert_states(&self, name: &str) -> Vec<String> {
        let data = self.api("alerts", &[]).await;
        data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|alert| alert["labels"]["alertname"] == name)
            .map(|alert| alert["state"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

/// The number of a `[timestamp, "value"]` pair.
pub fn sample_value(pair: &Value) -> f64 {
    pair[1]
        .as_str()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(|| panic!("not a sample: {pair}"))
}
