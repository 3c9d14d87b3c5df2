//! The official OpenAI Python client (`openai` on PyPI, installed by
//! `.ci/run`) against `examples/openai_server.rs`: it streams a chat
//! completion, reads whole and legacy completions, gets a `400` as
//! `BadRequestError`, and sees an overload (`529`) as an `APIStatusError`
//! with the scope and `Retry-After` of SPEC §4. The script is
//! `tests/python/openai_client.py`.
//!
//! Without Python's `openai` package the test fails, saying how to install
//! it; set `TOWER_ADMISSION_SKIP_PYTHON=1` to skip it instead.
#![cfg(all(
    feature = "sim",
    feature = "clap",
    feature = "http",
    feature = "metrics"
))]

mod support;

use std::process::{Command, Stdio};

use support::{Process, Server};

const SKIP: &str = "TOWER_ADMISSION_SKIP_PYTHON";

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
    let version = match python_with_openai() {
        Ok(version) => version,
        Err(reason) if std::env::var_os(SKIP).is_some_and(|value| value == "1") => {
            eprintln!("skipped ({SKIP}=1): {reason}");
            return;
        }
        Err(reason) => panic!(
            "{reason}\ninstall it with `python3 -m pip install 'openai>=1.40,<4'` \
             (as .ci/run does), or set {SKIP}=1 to skip this test"
        ),
    };
    eprintln!("openai {version}");

    let server = Server::start(
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
