//! What the crate logs through `tracing`, captured as text for a test.

#![allow(dead_code)] // each test binary uses part of it

use std::io::Write;
use std::sync::{Arc, Mutex};

/// The formatted log lines written so far.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Captures every event of `INFO` and above on this thread while
    /// `run` runs.
    pub fn capture<T>(&self, run: impl FnOnce() -> T) -> T {
        tracing::subscriber::with_default(self.subscriber(), run)
    }

    /// Captures on this thread until the guard is dropped.
    pub fn set_default(&self) -> tracing::subscriber::DefaultGuard {
        tracing::subscriber::set_default(self.subscriber())
    }

    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        let logs = self.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || logs.clone())
            .finish()
    }

    /// Every line captured.
    pub fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The lines that contain `needle`.
    pub fn containing(&self, needle: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|line| line.contains(needle))
            .collect()
    }
}

impl Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
