//! A real vLLM (the CPU build of `scripts/vllm/`) for `proxy_vllm.rs`:
//! started once per configuration and shared by the tests that use it, its
//! `/metrics` parsed.
//!
//! vLLM takes about a minute to start (Python imports in three processes),
//! so one server of a configuration serves every test that asks for that
//! configuration; asking for another stops it first (two cores, ~3.3 GB a
//! server). The server runs in a session of its own under a small `bash`
//! lifeline whose stdin this process holds: when the test binary exits,
//! however it exits, the pipe closes and the lifeline stops the whole
//! process group (`SIGTERM`, `SIGKILL` after 15 s), so no engine outlives
//! the tests even though a shared engine lives in a `static`.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Set to 1 (as `.ci/run` does) to make a missing vLLM a failure.
pub const REQUIRE: &str = "REQUIRE_VLLM";

const INSTALL: &str = "eval \"$(bash scripts/vllm/setup.sh)\"";

/// Longest wait for a server to answer `GET /health` 200: 45-70 s alone,
/// longer for two data-parallel ranks or on a busy machine.
pub const STARTUP: Duration = Duration::from_secs(420);

/// What the tests run: `vllm`, the model directory, the virtualenv's
/// Python (with the `openai` package, a pinned dependency of vLLM).
#[derive(Clone, Debug)]
pub struct Kit {
    pub vllm: PathBuf,
    pub model: PathBuf,
    pub python: PathBuf,
}

/// Whether `REQUIRE_VLLM=1`.
pub fn required() -> bool {
    std::env::var_os(REQUIRE).is_some_and(|value| value == "1")
}

/// Skips the test with `reason` (prints it), or fails it under
/// `REQUIRE_VLLM=1`.
#[track_caller]
pub fn skip(reason: &str) {
    if required() {
        panic!("{reason}\n{REQUIRE}=1 requires this test: {INSTALL}");
    }
    eprintln!("skipped: {reason}; {INSTALL} to run it");
}

/// The kit from `VLLM_BIN` and `VLLM_TINY_MODEL` (and `VLLM_PYTHON`, else
/// the `python` beside `vllm`), or `None` after [`skip`].
pub fn kit() -> Option<Kit> {
    let vllm = std::env::var_os("VLLM_BIN").map(PathBuf::from);
    let model = std::env::var_os("VLLM_TINY_MODEL").map(PathBuf::from);
    let reason = match (vllm, model) {
        (Some(vllm), Some(model)) if vllm.is_file() && model.join("config.json").is_file() => {
            let python = std::env::var_os("VLLM_PYTHON")
                .map(PathBuf::from)
                .unwrap_or_else(|| vllm.with_file_name("python"));
            return Some(Kit {
                vllm,
                model,
                python,
            });
        }
        (Some(vllm), Some(model)) => format!(
            "{} is not a file or {} has no config.json",
            vllm.display(),
            model.display()
        ),
        _ => "VLLM_BIN and VLLM_TINY_MODEL are not both set".to_owned(),
    };
    skip(&reason);
    None
}

/// The flags every server here gets; a configuration adds its own.
/// `--max-num-seqs 4` sequences per rank, 16 MiB of KV cache (8,192 tokens:
/// four sequences of the whole 2,048-token context).
pub const BASE_FLAGS: [&str; 11] = [
    "--served-model-name",
    "tiny",
    "--max-num-seqs",
    "4",
    "--max-model-len",
    "2048",
    "--enforce-eager",
    "--dtype",
    "float32",
    "--kv-cache-memory-bytes",
    "16777216",
];

/// The environment of `scripts/vllm/serve.sh`.
pub const ENV: [(&str, &str); 9] = [
    ("VLLM_TARGET_DEVICE", "cpu"),
    ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("HF_HUB_DISABLE_TELEMETRY", "1"),
    ("VLLM_NO_USAGE_STATS", "1"),
    ("DO_NOT_TRACK", "1"),
    ("VLLM_HOST_IP", "127.0.0.1"),
    ("PYTHONUNBUFFERED", "1"),
];

/// Starts the command after the log path in a session of its own, prints
/// its pid, and stops its process group once stdin closes.
const LIFELINE: &str = r#"
log=$1; shift
setsid "$@" >"$log" 2>&1 </dev/null &
pid=$!
echo "$pid"
while read -r _; do :; done
kill -TERM -- "-$pid" 2>/dev/null || exit 0
for _ in $(seq 1 150); do
  kill -0 -- "-$pid" 2>/dev/null || exit 0
  sleep 0.1
done
kill -KILL -- "-$pid" 2>/dev/null
exit 0
"#;

/// A running server.
struct Engine {
    /// The flags after [`BASE_FLAGS`] that made it.
    extra: Vec<String>,
    url: String,
    log: PathBuf,
    lifeline: Child,
    stdin: Option<ChildStdin>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        drop(self.stdin.take()); // the lifeline stops the server
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.lifeline.try_wait() {
                return;
            }
            // Polls for the exit: std has no wait with a timeout.
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.lifeline.kill();
        let _ = self.lifeline.wait();
    }
}

/// The one server alive, and the configuration that failed to start last
/// (with its reason), so that it is not tried again.
static ENGINE: Mutex<Option<Engine>> = Mutex::new(None);
static FAILED: Mutex<Option<(Vec<String>, String)>> = Mutex::new(None);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The last `lines` lines of the server's log.
pub fn log_tail(log: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(log) {
        let _ = file.read_to_string(&mut text);
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The error vLLM gave when it stopped during startup: its last lines that
/// name an error, else its last lines.
fn startup_error(log: &Path) -> String {
    let tail = log_tail(log, 400);
    let errors: Vec<&str> = tail
        .lines()
        .filter(|line| line.contains("Error") || line.contains("ERROR") || line.contains("error"))
        .collect();
    if errors.is_empty() {
        log_tail(log, 20)
    } else {
        errors[errors.len().saturating_sub(6)..].join("\n")
    }
}

/// The base URL of a server started with `extra` flags on top of
/// [`BASE_FLAGS`], started (after stopping any other) unless one is
/// running; `Err` with vLLM's own error when it cannot start.
pub async fn engine(kit: &Kit, extra: &[&str]) -> Result<String, String> {
    let extra: Vec<String> = extra.iter().map(|&flag| flag.to_owned()).collect();
    {
        let mut running = ENGINE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(engine) = running.as_ref() {
            if engine.extra == extra {
                return Ok(engine.url.clone());
            }
        }
        drop(running.take()); // another configuration: stop it first
    }
    if let Some((failed, reason)) = FAILED.lock().unwrap().as_ref() {
        if *failed == extra {
            return Err(reason.clone());
        }
    }
    match start(kit, &extra).await {
        Ok(engine) => {
            let url = engine.url.clone();
            *ENGINE
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(engine);
            Ok(url)
        }
        Err(reason) => {
            *FAILED.lock().unwrap() = Some((extra, reason.clone()));
            Err(reason)
        }
    }
}

/// The log of the server running now, for a failing test's message.
pub fn current_log() -> String {
    let running = ENGINE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    running
        .as_ref()
        .map_or_else(String::new, |engine| log_tail(&engine.log, 40))
}

async fn start(kit: &Kit, extra: &[String]) -> Result<Engine, String> {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("vllm-{port}.log"));
    let model = kit.model.to_str().unwrap();
    let port_text = port.to_string();
    // VLLM_TEST_CPUS=LIST runs vLLM on those cores only (`taskset -c`),
    // for measurements where the engine has cores of its own.
    let cpus = std::env::var("VLLM_TEST_CPUS").ok();
    let mut args: Vec<&str> = Vec::new();
    if let Some(cpus) = cpus.as_deref() {
        args.extend(["taskset", "-c", cpus]);
    }
    args.extend([kit.vllm.to_str().unwrap(), "serve", model]);
    args.extend(BASE_FLAGS);
    args.extend(["--host", "127.0.0.1", "--port", &port_text]);
    args.extend(extra.iter().map(String::as_str));
    eprintln!("starting vLLM: {} (log {})", args.join(" "), log.display());
    let mut lifeline = Command::new("bash")
        .arg("-c")
        .arg(LIFELINE)
        .arg("vllm-lifeline")
        .arg(&log)
        .args(&args)
        .envs(ENV)
        // Ours, not vLLM's: it warns of unknown VLLM_* variables.
        .env_remove("VLLM_BIN")
        .env_remove("VLLM_PYTHON")
        .env_remove("VLLM_TINY_MODEL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|error| format!("cannot run bash: {error}"))?;
    let stdin = lifeline.stdin.take();
    let mut pid_line = String::new();
    {
        // One short line, at once: read it byte by byte.
        let mut stdout = lifeline.stdout.take().unwrap();
        let mut byte = [0u8; 1];
        while stdout.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
            pid_line.push(byte[0] as char);
        }
    }
    let pid: u32 = pid_line
        .trim()
        .parse()
        .map_err(|_| format!("the lifeline printed no pid: {pid_line:?}"))?;
    let engine = Engine {
        extra: extra.to_vec(),
        url: url.clone(),
        log: log.clone(),
        lifeline,
        stdin,
    };
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Ok(response) = client.get(format!("{url}/health")).send().await {
            if response.status() == 200 {
                eprintln!(
                    "vLLM {} ready after {:.1} s",
                    extra.join(" "),
                    started.elapsed().as_secs_f64()
                );
                return Ok(engine);
            }
        }
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(format!(
                "vLLM {} stopped during startup:\n{}",
                extra.join(" "),
                startup_error(&log)
            ));
        }
        if started.elapsed() > STARTUP {
            return Err(format!(
                "vLLM {} not healthy after {STARTUP:?}; its log ends:\n{}",
                extra.join(" "),
                log_tail(&log, 30)
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One scrape of vLLM's `/metrics`: every sample by name and labels. Its
/// own parser, reading quoted label values whole (vLLM's
/// `cache_config_info` has dozens of labels).
#[derive(Debug, Default)]
pub struct VllmMetrics {
    pub samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl VllmMetrics {
    pub fn parse(text: &str) -> VllmMetrics {
        let mut samples = Vec::new();
        for line in text.lines() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, rest) = match line.find('{') {
                Some(brace) => (&line[..brace], &line[brace + 1..]),
                None => {
                    let (name, value) = line.split_once(' ').unwrap();
                    if let Ok(value) = value.trim().parse() {
                        samples.push((name.to_owned(), BTreeMap::new(), value));
                    }
                    continue;
                }
            };
            let mut labels = BTreeMap::new();
            let mut chars = rest.char_indices().peekable();
            let mut end = rest.len();
            loop {
                // key="value" pairs, separated by commas, up to '}'.
                let mut key = String::new();
                for (index, c) in chars.by_ref() {
                    if c == '}' {
                        end = index + 1;
                        break;
                    }
                    if c == '=' {
                        break;
                    }
                    if c != ',' {
                        key.push(c);
                    }
                }
                if end != rest.len() || key.is_empty() {
                    break;
                }
                chars.next(); // the opening quote
                let mut value = String::new();
                let mut escaped = false;
                for (_, c) in chars.by_ref() {
                    if escaped {
                        value.push(c);
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        break;
                    } else {
                        value.push(c);
                    }
                }
                labels.insert(key, value);
            }
            if let Ok(value) = rest[end.min(rest.len())..].trim().parse() {
                samples.push((name.to_owned(), labels, value));
            }
        }
        VllmMetrics { samples }
    }

    /// The sum of the samples of `name` that carry every one of `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(sample, have, _)| {
                sample == name
                    && labels
                        .iter()
                        .all(|&(key, value)| have.get(key).is_some_and(|have| have == value))
            })
            .map(|(_, _, value)| value)
            .sum()
    }

    /// `vllm:num_requests_running`, all ranks or `engine="N"`.
    pub fn running(&self, engine: Option<&str>) -> f64 {
        self.sum("vllm:num_requests_running", &engine_label(engine))
    }

    /// `vllm:num_requests_waiting`, all ranks or `engine="N"`.
    pub fn waiting(&self, engine: Option<&str>) -> f64 {
        self.sum("vllm:num_requests_waiting", &engine_label(engine))
    }

    /// Chat completions vLLM's HTTP server has answered (any status;
    /// a client that left counts too).
    pub fn chat_requests(&self) -> f64 {
        self.sum(
            "http_requests_total",
            &[("handler", "/v1/chat/completions")],
        )
    }

    /// Requests the engine finished (`vllm:request_success_total`, every
    /// finished_reason), all ranks or `engine="N"`.
    pub fn finished(&self, engine: Option<&str>) -> f64 {
        self.sum("vllm:request_success_total", &engine_label(engine))
    }
}

fn engine_label(engine: Option<&str>) -> Vec<(&str, &str)> {
    engine
        .map(|engine| ("engine", engine))
        .into_iter()
        .collect()
}

/// GETs `{url}/metrics` of a vLLM server.
pub async fn scrape(client: &reqwest::Client, url: &str) -> VllmMetrics {
    VllmMetrics::parse(&scrape_text(client, url).await)
}

/// GETs `{url}/metrics` of a vLLM server, unparsed.
pub async fn scrape_text(client: &reqwest::Client, url: &str) -> String {
    tokio::time::timeout(Duration::from_secs(20), async {
        client
            .get(format!("{url}/metrics"))
            .send()
            .await
            .unwrap_or_else(|error| panic!("GET {url}/metrics: {error}"))
            .text()
            .await
            .unwrap()
    })
    .await
    .unwrap_or_else(|_| panic!("GET {url}/metrics took over 20 s"))
}

#[test]
fn parses_vllm_exposition() {
    let text = "# HELP x y\nvllm:num_requests_running{engine=\"0\",model_name=\"tiny\"} 3.0\n\
                vllm:cache_config_info{a=\"[1, 2]\",b=\"x\\\"y\",engine=\"1\"} 1.0\nplain 2\n";
    let metrics = VllmMetrics::parse(text);
    assert_eq!(metrics.running(Some("0")), 3.0);
    assert_eq!(metrics.running(Some("1")), 0.0);
    assert_eq!(
        metrics.sum("vllm:cache_config_info", &[("a", "[1, 2]"), ("b", "x\"y")]),
        1.0
    );
    assert_eq!(metrics.sum("plain", &[]), 2.0);
}
