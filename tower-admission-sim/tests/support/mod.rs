//! The simulator's example servers as child processes, on top of the
//! workspace's test kit.

#![allow(dead_code)] // each test binary uses part of it

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::OnceLock;

pub use tower_admission_testkit::*;

/// This crate's manifest, whose examples the tests run.
pub const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");

/// The path of an example server, built (or found up to date) by cargo with
/// the profile of the running test.
pub fn example(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<BTreeMap<String, PathBuf>, String>> = OnceLock::new();
    let built = BUILT
        .get_or_init(|| cargo_build_examples(MANIFEST, None, &["openai_server", "tonic_server"]));
    match built {
        Ok(examples) => examples
            .get(name)
            .unwrap_or_else(|| panic!("cargo built no example {name:?}: {examples:?}"))
            .clone(),
        Err(message) => panic!("{message}"),
    }
}

/// Runs an example to its end (a client, say) and returns its status,
/// stdout and stderr.
pub fn run(example_name: &str, args: &[&str]) -> (ExitStatus, String, String) {
    Process::spawn(&example(example_name), args, &[]).wait()
}

/// Starts the example `example_name` with `args` and
/// `--listen 127.0.0.1:0`, and waits until it prints its address and
/// banner.
pub fn server(example_name: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
    Server::spawn(&example(example_name), args, env)
}
