//! What the crate logs through `tracing`, captured as text for a test.

#![allow(dead_code)] // each test binary uses part of it

use std::io::Write;
use std::sync::{Arc, Mutex};

/// The formatted log lines written so far, of one level and above.
#[derive(Clone)]
pub struct Logs {
    written: Arc<Mutex<Vec<u8>>>,
    level: tracing::Level,
}

impl Default for Logs {
    /// `INFO` and above.
    fn default() -> Self {
        Logs::at(tracing::Level::INFO)
    }
}

impl Logs {
    /// Events of `level` and above.
    pub fn at(level: tracing::Level) -> Self {
        Logs {
            written: Arc::default(),
            level,
        }
    }

    /// Captures the events on this thread while `run` runs.
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
            .with_max_level(self.level)
            .with_ansi(false)
            .with_writer(move || logs.clone())
            .finish()
    }

    /// Everything captured.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.written.lock().unwrap()).into_owned()
    }

    /// Every line captured.
    pub fn lines(&self) -> Vec<String> {
        self.text().lines().map(str::to_owned).collect()
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
        self.written.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
