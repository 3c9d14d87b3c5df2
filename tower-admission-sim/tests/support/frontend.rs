//! The frontend example as a child process, beside the example workers of
//! `support/mod.rs`.
//!
//! It is built here, once per test binary, by cargo with the test's
//! profile.

#![allow(dead_code)] // each test binary uses part of it

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::support::{Process, cargo_build_examples};

/// The path of the frontend example, built (or found up to date) by cargo.
pub fn frontend_binary() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BUILT.get_or_init(build_frontend) {
        Ok(path) => path.clone(),
        Err(message) => panic!("{message}"),
    }
}

fn build_frontend() -> Result<PathBuf, String> {
    let mut built = cargo_build_examples(crate::support::MANIFEST, None, &["frontend"])?;
    Ok(built
        .remove("frontend")
        .expect("checked by cargo_build_examples"))
}

/// The frontend example, started with `--listen 127.0.0.1:0` and a
/// `--worker` per URL.
pub struct Frontend {
    pub process: Process,
    /// `http://127.0.0.1:PORT`, from its first line of output.
    pub url: String,
}

impl Frontend {
    pub fn start(workers: &[&str]) -> Frontend {
        Frontend::start_with(workers, &[])
    }

    /// [`Frontend::start`] with more flags.
    pub fn start_with(workers: &[&str], flags: &[&str]) -> Frontend {
        let mut args = vec!["--listen", "127.0.0.1:0"];
        for worker in workers {
            args.extend(["--worker", worker]);
        }
        args.extend_from_slice(flags);
        let process = Process::spawn(&frontend_binary(), &args, &[]);
        let stdout = process.wait_for_stdout("address and banner", |text| {
            (text.lines().count() >= 4 && text.ends_with('\n')).then(|| text.to_owned())
        });
        let first = stdout.lines().next().unwrap();
        let url = first
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .to_owned();
        Frontend { process, url }
    }
}
