//! What the two example servers share: the simulated engine's flags, how a
//! request becomes engine work (prompt tokens, output length, the context
//! limit), the synthetic words standing for tokens, and the shutdown
//! signal.

use std::num::NonZeroUsize;

use tower_admission_sim::{EngineConfig, SimEngine};

/// Flags of the simulated engine.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// Data-parallel ranks of the simulated engine: independent engines,
    /// each with its own admission limits and queue
    #[arg(long, value_name = "N", default_value = "1")]
    pub dp_ranks: NonZeroUsize,

    /// Requests one rank runs at once (vLLM's max_num_seqs); reported to
    /// the gate, whose defaults follow it
    #[arg(long, value_name = "N", default_value = "256")]
    pub max_num_seqs: NonZeroUsize,

    /// Wall-clock seconds per simulated GPU second: 0.1 runs ten times
    /// faster than the modelled H100, 10 ten times slower
    #[arg(long, value_name = "FACTOR", default_value = "1", value_parser = time_scale)]
    pub time_scale: f64,

    /// Longest prompt plus output a request may ask for, in tokens; longer
    /// requests get a 400 (gRPC: INVALID_ARGUMENT)
    #[arg(long, value_name = "TOKENS", default_value = "8192")]
    pub max_model_len: NonZeroUsize,

    /// Tokens generated for a request that sets no maximum (it then ends
    /// with finish_reason "stop")
    #[arg(long, value_name = "TOKENS", default_value = "64")]
    pub default_max_tokens: NonZeroUsize,
}

fn time_scale(raw: &str) -> Result<f64, String> {
    match raw.trim().parse::<f64>() {
        Ok(scale) if scale.is_finite() && scale > 0.0 => Ok(scale),
        _ => Err(format!("{raw:?} is not a positive number")),
    }
}

impl EngineArgs {
    /// The engine these flags describe: the default engine (an 8B model on
    /// one H100 per rank), with a KV cache at least large enough for one
    /// request of `max_model_len` tokens.
    pub fn engine_config(&self) -> EngineConfig {
        let defaults = EngineConfig::default();
        let kv_blocks = self
            .max_model_len
            .get()
            .div_ceil(defaults.block_size)
            .max(defaults.kv_blocks);
        EngineConfig {
            max_num_seqs: self.max_num_seqs.get(),
            dp_ranks: self.dp_ranks.get(),
            time_scale: self.time_scale,
            kv_blocks,
            ..defaults
        }
    }

    /// Starts the engine on the current tokio runtime.
    pub fn start(&self) -> SimEngine {
        SimEngine::new(self.engine_config())
    }

    /// One line describing the engine, for the startup banner.
    pub fn describe(&self) -> String {
        format!(
            "engine: simulated, {} rank(s) x max_num_seqs {}, max_model_len {}, time scale {}",
            self.dp_ranks, self.max_num_seqs, self.max_model_len, self.time_scale
        )
    }

    /// What the engine will run for a request of `prompt_tokens` that asks
    /// for at most `max_tokens` (`None`: no limit), or why it is invalid.
    pub fn plan(&self, prompt_tokens: usize, max_tokens: Option<u64>) -> Result<Plan, String> {
        let max_model_len = self.max_model_len.get();
        let (output_tokens, finish_reason) = match max_tokens {
            Some(0) => return Err("max_tokens must be at least 1, got 0".to_owned()),
            Some(requested) => (
                usize::try_from(requested).unwrap_or(usize::MAX),
                FinishReason::Length,
            ),
            // The "model" chooses to stop: at the default length, but never
            // past the context.
            None => (
                self.default_max_tokens
                    .get()
                    .min(max_model_len.saturating_sub(prompt_tokens).max(1)),
                FinishReason::Stop,
            ),
        };
        let total = prompt_tokens.saturating_add(output_tokens);
        if total > max_model_len {
            // vLLM's wording, which OpenAI-compatible clients recognise.
            return Err(format!(
                "This model's maximum context length is {max_model_len} tokens. However, you \
                 requested {total} tokens ({prompt_tokens} in the messages, {output_tokens} in \
                 the completion). Please reduce the length of the messages or completion."
            ));
        }
        Ok(Plan {
            prompt_tokens,
            output_tokens,
            finish_reason,
        })
    }
}

/// A validated request: what the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Prompt tokens (estimated from the text).
    pub prompt_tokens: usize,
    /// Tokens to generate.
    pub output_tokens: usize,
    /// Why the answer ends after the last token.
    pub finish_reason: FinishReason,
}

/// Why an answer ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The model stopped by itself.
    Stop,
    /// The request's `max_tokens` was reached.
    Length,
}

impl FinishReason {
    /// The OpenAI name: `stop` or `length`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Estimated tokens of `text`: about four bytes of English per token, the
/// rule of thumb of OpenAI's tokenizers. Empty text is 0 tokens.
pub fn estimate_tokens(text: &str) -> usize {
    text.len().div_ceil(4)
}

const WORDS: [&str; 24] = [
    "the", "engine", "admits", "a", "request", "when", "both", "limits", "have", "room", "and",
    "its", "queue", "is", "empty", "excess", "work", "waits", "outside", "never", "inside", "so",
    "goodput", "holds",
];

/// The text of generated token `index` of a request: a word with a leading
/// space, as a tokenizer's output usually is.
pub fn token_text(index: usize) -> String {
    format!(" {}", WORDS[index % WORDS.len()])
}

/// The signals that stop a server: Ctrl-C (SIGINT) and, on Unix, SIGTERM.
pub struct Shutdown {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Shutdown {
    /// Starts catching the signals now. Call it before announcing the
    /// address: a signal that arrives earlier has its default effect
    /// (SIGTERM kills the process), or none if the parent ignored it.
    pub fn listen() -> std::io::Result<Shutdown> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Shutdown {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Shutdown {})
    }

    /// Resolves at the first of the signals.
    async fn received(mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Binds the server's socket and starts catching the shutdown signals,
/// before the address is announced. The error says what failed.
pub async fn bind(
    listen: std::net::SocketAddr,
) -> Result<(tokio::net::TcpListener, std::net::SocketAddr, Shutdown), String> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|error| format!("cannot listen on {listen}: {error}"))?;
    let address = listener
        .local_addr()
        .map_err(|error| format!("no local address: {error}"))?;
    let shutdown =
        Shutdown::listen().map_err(|error| format!("cannot catch shutdown signals: {error}"))?;
    Ok((listener, address, shutdown))
}

/// How long open responses may go on after a shutdown signal.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs a server until it stops by itself, or until a shutdown signal and
/// then either the end of its open responses or [`SHUTDOWN_GRACE`],
/// whichever comes first. `serve` gets the future that tells the server to
/// stop taking new connections.
pub async fn serve_until_shutdown<F, E>(
    shutdown: Shutdown,
    serve: impl FnOnce(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> F,
) -> Result<(), E>
where
    F: Future<Output = Result<(), E>>,
{
    let signalled = std::sync::Arc::new(tokio::sync::Notify::new());
    let notify = std::sync::Arc::clone(&signalled);
    let server = serve(Box::pin(async move {
        shutdown.received().await;
        eprintln!(
            "shutting down: no new connections; open responses get {} s to finish",
            SHUTDOWN_GRACE.as_secs()
        );
        // Stored if nobody waits yet: the grace timer cannot miss it.
        notify.notify_one();
    }));
    tokio::select! {
        result = server => result,
        () = async {
            signalled.notified().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            eprintln!("shutting down: closing the responses still open");
            Ok(())
        }
    }
}

/// Logs to stderr, `warn` and above unless `RUST_LOG` says otherwise: the
/// gate warns about invalid admission variables there.
pub fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
