//! The official OpenAI Python client (`openai` on PyPI, installed by
//! `.ci/run`) against `examples/openai_server.rs`: it streams a chat
//! completion, reads whole and legacy completions, gets a `400` as
//! `BadRequestError`, and sees an overload (`529`) as an `APIStatusError`
//! with its scope and `Retry-After`. The script is
//! `tests/python/openai_client.py`.
//!
//! Without `python3` or its `openai` package the test is skipped, saying
//! how to install it, so that `cargo test` passes on a machine with only
//! the Rust toolchain. `REQUIRE_OPENAI_CLIENT=1` (set by `.ci/run`) makes
//! the missing package a failure instead, so CI can never skip it silently.

mod support;

use std::process::{Command, Stdio};

use support::Process;

const REQUIRE: &str = "REQUIRE_OPENAI_CLIENT";

/// Whether `python3` can import `openai`: `Err` says why not.
fn python_with_openai() -> Result<String, String> {
    let output = Command::new("python3")
        .args(["-c", "import openai; print(openai.__version__)"])
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("cannot run python3: {error}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(format!(
            "python3 cannot import openai:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

#[test]
fn the_official_openai_client_streams_and_reads_overload_as_an_api_status_error() {
    let install = "install it with `python3 -m pip install 'openai>=1.40,<4'` (as .ci/run does)";
    let version = match python_with_openai() {
        Ok(version) => version,
        Err(reason) if std::env::var_os(REQUIRE).is_some_and(|value| value == "1") => {
            panic!("{reason}\n{REQUIRE}=1 requires this test: {install}")
        }
        Err(reason) => {
            eprintln!("skipped: {reason}\n{install} to run it");
            return;
        }
    };
    eprintln!("openai {version}");

    let server = support::server(
        "openai_server",
        &[
            "--max-num-seqs",
            "1",
            "--request-queue-limit",
            "0",
            "--max-model-len",
            "1000000",
        ],
        &[],
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/openai_client.py");
    let base_url = format!("{}/v1", server.url);
    let mut python = Process::spawn(
        std::path::Path::new("python3"),
        &[script, &base_url],
        // Nothing from the developer's environment may redirect the client.
        &[("OPENAI_BASE_URL", &base_url), ("OPENAI_API_KEY", "unused")],
    );
    let (status, stdout, stderr) = python.wait();
    assert!(
        status.success(),
        "{script} failed ({status})\nstdout:\n{stdout}\nstderr:\n{stderr}\nserver stderr:\n{}",
        server.process.stderr()
    );
    let checks: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("ok "))
        .map(|check| check.split(':').next().unwrap())
        .collect();
    assert_eq!(
        checks,
        ["stream", "whole", "completion", "bad request", "overloaded"],
        "{stdout}"
    );
    assert!(stdout.contains("ok overloaded: 529 overloaded"), "{stdout}");
}
