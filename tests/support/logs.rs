//! What the crate logs through `tracing`, captured as text for a test.

#![allow(dead_code)] // each test binary uses part of it

//!
//! One global subscriber, installed once per test binary, writes each event
//! to the [`Logs`] capturing on the thread that emitted it. Not a
//! thread-local dispatcher: tracing caches each callsite's interest when it
//! is first hit, and a test on another thread hitting it first, with no
//! dispatcher of its own, could make it invisible to a capture (seen as a
//! test that captured nothing, now and then, on a loaded machine).

use std::cell::RefCell;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use tracing_subscriber::fmt::MakeWriter;

thread_local! {
    static CURRENT: RefCell<Option<Logs>> = const { RefCell::new(None) };
}

fn install() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(Routed)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in a test binary that captures logs");
    });
}

/// Ends a capture: the thread goes back to what it captured before.
pub struct Capturing {
    previous: Option<Logs>,
}

impl Drop for Capturing {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|current| *current.borrow_mut() = previous);
    }
}

/// Writes an event to the thread's capture, if it wants its level.
struct Routed;

impl<'a> MakeWriter<'a> for Routed {
    type Writer = RoutedWriter;

    fn make_writer(&'a self) -> RoutedWriter {
        RoutedWriter(None)
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> RoutedWriter {
        RoutedWriter(CURRENT.with(|current| {
            current
                .borrow()
                .as_ref()
                .filter(|logs| *meta.level() <= logs.level)
                .cloned()
        }))
    }
}

/// The writer of one event: the capture's buffer, or nowhere.
struct RoutedWriter(Option<Logs>);

impl Write for RoutedWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if let Some(logs) = &mut self.0 {
            logs.write(bytes)?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

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
        let _capturing = self.set_default();
        run()
    }

    /// Captures on this thread until the guard is dropped.
    pub fn set_default(&self) -> Capturing {
        install();
        let previous = CURRENT.with(|current| current.replace(Some(self.clone())));
        Capturing { previous }
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
