//! Examples and binaries as child processes, for the tests that talk to
//! them over real sockets.
//!
//! Examples are built by running cargo itself, once per test binary:
//! `cargo test --test example_server` does not build examples, and an old
//! binary left in `target/` would test old code. Every wait is on an event
//! (a line on the child's stdout, the child's exit) with a deadline, so a
//! broken server fails the test instead of hanging it.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a child may take to print its address, or to exit, and a test
/// to wait for any one answer.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// Output tokens that take the simulated engine far longer than any test
/// (~6 ms a token): a request asking for them stays in flight until its
/// client goes away.
pub const FOREVER: u64 = 900_000;

/// Awaits `future`, failing the test if it takes longer than [`PATIENCE`].
pub async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("nothing happened within {PATIENCE:?}"))
}

/// The admission variables of behaviour §5, §7, §8 and §9: cleared in every child, so that the
/// developer's environment cannot change what a test sees.
pub const ADMISSION_VARIABLES: [&str; 15] = [
    "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT",
    "DYN_ENGINE_REQUEST_LIMIT",
    "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT",
    "DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT",
    "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT",
    "DYN_DYNAMO_REQUEST_QUEUE_LIMIT",
    "DYN_BACKEND_ADMISSION_ENGINE_WAITING_TOKEN_LIMIT",
    "DYN_BACKEND_ADMISSION_ENGINE_TOKEN_LIMIT",
    "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_TOKEN_LIMIT",
    "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_WAIT_LIMIT_MS",
    "DYN_BACKEND_ADMISSION_TTFT_OBJECTIVE_MS",
    "DYN_BACKEND_ADMISSION_AGING_INTERVAL_MS",
    "DYN_BACKEND_ADMISSION_QUEUE_DELAY_TARGET_MS",
    "DYN_BACKEND_ADMISSION_PRIORITY_BANDS",
    "DYN_BACKEND_ADMISSION_TENANT_WEIGHTS",
];

/// Builds the examples `names` of the package whose manifest is
/// `manifest` (pass `concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")`)
/// with cargo, with `features` on top of the default ones, with the profile
/// of the running test (tests live in
/// `target/<profile>/deps/`, so a `cargo test --release` reuses its
/// artifacts), and returns each example's executable by name.
pub fn cargo_build_examples(
    manifest: &str,
    features: Option<&str>,
    names: &[&str],
) -> Result<BTreeMap<String, PathBuf>, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.args([
        "build",
        "--manifest-path",
        manifest,
        "--message-format=json-render-diagnostics",
    ]);
    if let Some(features) = features {
        command.args(["--features", features]);
    }
    for name in names {
        command.args(["--example", name]);
    }
    let profile = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.file_name()?.to_owned()))
        .and_then(|name| name.into_string().ok());
    if let Some(profile) = profile.filter(|profile| profile != "debug") {
        command.args(["--profile", &profile]);
    }
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("cannot run cargo to build {names:?}: {error}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo could not build {names:?} ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let mut examples = BTreeMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_example = message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|kind| kind == "example"));
        if message["reason"] == "compiler-artifact" && is_example {
            if let (Some(name), Some(executable)) = (
                message["target"]["name"].as_str(),
                message["executable"].as_str(),
            ) {
                examples.insert(name.to_owned(), PathBuf::from(executable));
            }
        }
    }
    match names.iter().find(|name| !examples.contains_key(**name)) {
        Some(missing) => Err(format!("cargo reported no executable for {missing}")),
        None => Ok(examples),
    }
}

/// A child process, killed when dropped; threads collect its stdout and
/// stderr.
pub struct Process {
    child: Child,
    stdout: Output,
    stderr: Output,
}

/// What a thread has read from one of the child's pipes so far, with a
/// condition variable signalled at each read.
struct Output {
    shared: Arc<(Mutex<Collected>, Condvar)>,
    reader: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Collected {
    text: String,
    closed: bool,
}

impl Output {
    fn collect(mut pipe: impl Read + Send + 'static) -> Output {
        let shared = Arc::new((Mutex::new(Collected::default()), Condvar::new()));
        let sink = Arc::clone(&shared);
        let reader = std::thread::spawn(move || {
            let mut buffer = [0; 4096];
            loop {
                let read = pipe.read(&mut buffer).unwrap_or(0);
                let (collected, changed) = &*sink;
                let mut collected = collected.lock().unwrap();
                if read == 0 {
                    collected.closed = true;
                } else {
                    let text = String::from_utf8_lossy(&buffer[..read]);
                    collected.text.push_str(&text);
                }
                changed.notify_all();
                if collected.closed {
                    return;
                }
            }
        });
        Output {
            shared,
            reader: Some(reader),
        }
    }

    fn text(&self) -> String {
        self.shared.0.lock().unwrap().text.clone()
    }

    /// Waits until `done` holds for the text read so far, and returns its
    /// answer; `None` if the pipe closed or `PATIENCE` passed first.
    fn wait_for<T>(&self, mut done: impl FnMut(&str) -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + PATIENCE;
        let (collected, changed) = &*self.shared;
        let mut collected = collected.lock().unwrap();
        loop {
            if let Some(answer) = done(&collected.text) {
                return Some(answer);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            if collected.closed {
                return None;
            }
            collected = changed.wait_timeout(collected, left).unwrap().0;
        }
    }

    /// Everything the child wrote, once it has closed the pipe.
    fn finish(&mut self) -> String {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.text()
    }
}

impl Process {
    /// Starts `program` with `args` and `env`, without the admission
    /// variables of the test's own environment.
    pub fn spawn(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Process {
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for variable in ADMISSION_VARIABLES {
            command.env_remove(variable);
        }
        command.envs(env.iter().copied());
        let mut child = command
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", program.display()));
        let stdout = Output::collect(child.stdout.take().unwrap());
        let stderr = Output::collect(child.stderr.take().unwrap());
        Process {
            child,
            stdout,
            stderr,
        }
    }

    /// What the child has written to stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.text()
    }

    /// What the child has written to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.text()
    }

    /// Waits until the child's stdout satisfies `done`; panics if it does
    /// not within `PATIENCE`.
    #[track_caller]
    pub fn wait_for_stdout<T>(&self, what: &str, done: impl FnMut(&str) -> Option<T>) -> T {
        self.stdout.wait_for(done).unwrap_or_else(|| {
            panic!(
                "no {what} on stdout; stdout:\n{}\nstderr:\n{}",
                self.stdout(),
                self.stderr()
            )
        })
    }

    /// The `http://…` address of a server whose first line of stdout is
    /// `listening on http://…`, once that line is whole.
    #[track_caller]
    pub fn listening_url(&self) -> String {
        self.wait_for_stdout("listening address", |text| {
            let (line, _) = text.split_once('\n')?;
            line.strip_prefix("listening on ").map(str::to_owned)
        })
    }

    /// Waits for the child to exit, then returns its status, stdout and
    /// stderr. Panics if it is still running after `PATIENCE`.
    #[track_caller]
    pub fn wait(&mut self) -> (ExitStatus, String, String) {
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "process {} still running after {PATIENCE:?}; stderr:\n{}",
                self.child.id(),
                self.stderr()
            );
            // Polls for the exit: std has no wait with a timeout.
            std::thread::sleep(Duration::from_millis(10));
        };
        (status, self.stdout.finish(), self.stderr.finish())
    }

    /// Sends SIGTERM, as a process manager does to stop a server.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {}: {status}", self.child.id());
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server (an example, say), started with `--listen 127.0.0.1:0`.
pub struct Server {
    pub process: Process,
    /// `http://127.0.0.1:PORT`, from its first line of output.
    pub url: String,
    /// The banner it printed after the address, when it started listening.
    pub banner: String,
}

impl Server {
    /// Starts `program` with `args` and `--listen 127.0.0.1:0`, and waits
    /// until it prints its address and banner (four lines).
    pub fn spawn(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut all = args.to_vec();
        all.extend(["--listen", "127.0.0.1:0"]);
        let process = Process::spawn(program, &all, env);
        let stdout = process.wait_for_stdout("address and banner", |text| {
            (text.lines().count() >= 4 && text.ends_with('\n')).then(|| text.to_owned())
        });
        let (first, banner) = stdout.split_once('\n').unwrap();
        let url = first
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .to_owned();
        Server {
            process,
            url,
            banner: banner.to_owned(),
        }
    }
}
