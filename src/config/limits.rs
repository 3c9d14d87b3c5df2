//! What the limits are: the engine's reported capacity, the effective
//! per-rank limits, and where each limit in force came from.

use std::fmt;

/// The most data-parallel ranks a capacity report may name. The gate keeps
/// state (and metric series) per rank, so a corrupt report of billions of
/// ranks must not be believed; real deployments run tens to hundreds.
pub const MAX_DP_RANKS: usize = 4096;

/// What the engine says about itself: how many sequences one data-parallel
/// rank runs at once, and how many ranks there are.
///
/// Defaults that follow the engine are derived from it: both engine limits
/// are `max_num_seqs` per rank, the queue limit `2 × max_num_seqs` per rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EngineCapacity {
    /// The engine's `max_num_seqs`: sequences one rank batches at once.
    pub max_num_seqs: usize,
    /// Number of data-parallel ranks; ranks are numbered `0..dp_ranks`.
    pub dp_ranks: usize,
}

impl EngineCapacity {
    /// A capacity report of `max_num_seqs` per rank over `dp_ranks` ranks.
    pub fn new(max_num_seqs: usize, dp_ranks: usize) -> Self {
        EngineCapacity {
            max_num_seqs,
            dp_ranks,
        }
    }

    /// Why this report cannot be used, if it cannot: a report of zero ranks or
    /// zero sequences describes an engine that can run nothing, and one of
    /// more than [`MAX_DP_RANKS`] ranks an engine no one runs; either is far
    /// more likely a bug in the reporter than the truth.
    pub(crate) fn invalid_reason(&self) -> Option<&'static str> {
        if self.dp_ranks == 0 {
            Some("dp_ranks is 0")
        } else if self.dp_ranks > MAX_DP_RANKS {
            Some("dp_ranks is above MAX_DP_RANKS")
        } else if self.max_num_seqs == 0 {
            Some("max_num_seqs is 0")
        } else {
            None
        }
    }
}

/// The effective limits of one data-parallel rank. The combined capacity of a
/// worker is `ranks ×` each of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Admitted requests whose response has not ended.
    pub engine_request_limit: usize,
    /// Admitted requests without a first token or completion yet.
    pub engine_request_waiting_limit: usize,
    /// Requests waiting in the gate's queue.
    pub request_queue_limit: usize,
    /// Prompt tokens of admitted requests without a first token or
    /// completion yet; `None`: not limited.
    pub engine_waiting_token_limit: Option<usize>,
    /// Prompt plus maximum output tokens of admitted requests whose response
    /// has not ended; `None`: not limited.
    pub engine_token_limit: Option<usize>,
    /// Prompt tokens of requests waiting in the gate's queue; `None`: not
    /// limited.
    pub request_queue_token_limit: Option<usize>,
}

/// Where a limit in force comes from, by behaviour §5's precedence: a flag, then
/// a variable (canonical, then alias), then the default. A limit set with
/// the builder is [`Code`](Self::Code).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LimitSource {
    /// A command-line flag (`AdmissionArgs`, feature `clap`), by name.
    Flag(&'static str),
    /// An environment variable, by name.
    Variable(&'static str),
    /// The builder ([`AdmissionConfig::engine_request_limit`](crate::AdmissionConfig::engine_request_limit) and its
    /// siblings).
    Code,
    /// The adaptive waiting limit
    /// ([`AdmissionConfig::adaptive_waiting_limit`](crate::AdmissionConfig::adaptive_waiting_limit)) sets it, between a
    /// floor and a ceiling.
    Adaptive {
        /// The smallest limit.
        floor: usize,
        /// The largest limit.
        ceiling: usize,
    },
    /// Not set. A request limit then follows the engine: its reported
    /// `max_num_seqs` (twice that for the queue), or
    /// [`DEFAULT_ENGINE_LIMIT`](crate::DEFAULT_ENGINE_LIMIT) (twice that for the queue) until it
    /// reports; a token limit is off.
    #[default]
    Default,
}

impl fmt::Display for LimitSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitSource::Flag(flag) => write!(f, "flag {flag}"),
            LimitSource::Variable(variable) => write!(f, "variable {variable}"),
            LimitSource::Code => f.write_str("set in code"),
            LimitSource::Adaptive { floor, ceiling } => {
                write!(f, "adaptive: between {floor} and {ceiling}")
            }
            LimitSource::Default => f.write_str("default"),
        }
    }
}

/// Where each request and token limit comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LimitSources {
    /// Of [`Limits::engine_request_limit`].
    pub engine_request_limit: LimitSource,
    /// Of [`Limits::engine_request_waiting_limit`].
    pub engine_request_waiting_limit: LimitSource,
    /// Of [`Limits::request_queue_limit`].
    pub request_queue_limit: LimitSource,
    /// Of [`Limits::engine_waiting_token_limit`].
    pub engine_waiting_token_limit: LimitSource,
    /// Of [`Limits::engine_token_limit`].
    pub engine_token_limit: LimitSource,
    /// Of [`Limits::request_queue_token_limit`].
    pub request_queue_token_limit: LimitSource,
}

/// The limits a gate enforces, per rank and combined, and where each comes
/// from: what [`Gate::limits_in_force`](crate::Gate::limits_in_force)
/// returns, what the gate logs (`tracing`, level `INFO`) when it is built
/// and whenever a capacity report changes it, and what a server prints at
/// start-up (its `Display`).
///
/// Unranked requests draw on the **combined** capacity: `ranks ×` each
/// per-rank limit. With two reported ranks and per-rank limits of 4 (queue
/// 8), ranked requests get 4 running and 8 queued on each rank, and
/// unranked ones 8 running and 16 queued between them:
///
/// ```
/// use tower_admission::{AdmissionConfig, EngineCapacity, Gate};
///
/// let gate = Gate::new(
///     AdmissionConfig::new()
///         .engine_request_limit(4)
///         .engine_request_waiting_limit(4)
///         .request_queue_limit(8)
///         .capacity(EngineCapacity::new(256, 2)),
/// );
/// let in_force = gate.limits_in_force();
/// assert_eq!(in_force.per_rank.engine_request_limit, 4);
/// assert_eq!(in_force.combined().engine_request_limit, 8);
/// assert_eq!(in_force.combined().request_queue_limit, 16);
/// assert_eq!(
///     in_force.to_string(),
///     "2 ranks (reported: max_num_seqs 256, dp_ranks 2); per rank: \
///      engine request limit 4 (set in code), engine request waiting limit 4 (set in code), \
///      request queue limit 8 (set in code); combined, for unranked requests: \
///      engine request limit 8, engine request waiting limit 8, request queue limit 16"
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitsInForce {
    /// The limits of each rank.
    pub per_rank: Limits,
    /// How many ranks the combined capacity spans: the engine's reported
    /// `dp_ranks`, or 1 before it reports.
    pub ranks: usize,
    /// The engine's latest capacity report, `None` before the first.
    pub capacity: Option<EngineCapacity>,
    /// Where each limit comes from.
    pub sources: LimitSources,
}

impl LimitsInForce {
    /// The worker's combined capacity, `ranks ×` each per-rank limit: what
    /// unranked requests draw on, and what every request must also fit.
    pub fn combined(&self) -> Limits {
        let times = |per_rank: usize| per_rank.saturating_mul(self.ranks);
        let limits = &self.per_rank;
        Limits {
            engine_request_limit: times(limits.engine_request_limit),
            engine_request_waiting_limit: times(limits.engine_request_waiting_limit),
            request_queue_limit: times(limits.request_queue_limit),
            engine_waiting_token_limit: limits.engine_waiting_token_limit.map(times),
            engine_token_limit: limits.engine_token_limit.map(times),
            request_queue_token_limit: limits.request_queue_token_limit.map(times),
        }
    }

    /// Where a request limit comes from, in words: a default says what it
    /// follows.
    fn source(&self, source: LimitSource, queue: bool) -> String {
        match (source, self.capacity, queue) {
            (LimitSource::Default, Some(_), false) => "default: the reported max_num_seqs".into(),
            (LimitSource::Default, Some(_), true) => {
                "default: 2 × the reported max_num_seqs".into()
            }
            (LimitSource::Default, None, _) => "default until the engine reports".into(),
            (source, _, _) => source.to_string(),
        }
    }
}

impl fmt::Display for LimitsInForce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (limits, sources, combined) = (&self.per_rank, &self.sources, self.combined());
        match self.capacity {
            Some(capacity) => write!(
                f,
                "{} rank{} (reported: max_num_seqs {}, dp_ranks {})",
                self.ranks,
                if self.ranks == 1 { "" } else { "s" },
                capacity.max_num_seqs,
                capacity.dp_ranks
            )?,
            None => f.write_str("1 rank (assumed: the engine has not reported its capacity)")?,
        }
        write!(
            f,
            "; per rank: engine request limit {} ({}), engine request waiting limit {} ({}), \
             request queue limit {} ({})",
            limits.engine_request_limit,
            self.source(sources.engine_request_limit, false),
            limits.engine_request_waiting_limit,
            self.source(sources.engine_request_waiting_limit, false),
            limits.request_queue_limit,
            self.source(sources.request_queue_limit, true),
        )?;
        let tokens = [
            (
                "engine waiting token limit",
                limits.engine_waiting_token_limit,
                sources.engine_waiting_token_limit,
            ),
            (
                "engine token limit",
                limits.engine_token_limit,
                sources.engine_token_limit,
            ),
            (
                "request queue token limit",
                limits.request_queue_token_limit,
                sources.request_queue_token_limit,
            ),
        ];
        for (name, limit, source) in tokens {
            if let Some(limit) = limit {
                write!(f, ", {name} {limit} ({source})")?;
            }
        }
        write!(
            f,
            "; combined, for unranked requests: engine request limit {}, \
             engine request waiting limit {}, request queue limit {}",
            combined.engine_request_limit,
            combined.engine_request_waiting_limit,
            combined.request_queue_limit,
        )?;
        let combined_tokens = [
            (
                "engine waiting token limit",
                combined.engine_waiting_token_limit,
            ),
            ("engine token limit", combined.engine_token_limit),
            (
                "request queue token limit",
                combined.request_queue_token_limit,
            ),
        ];
        for (name, limit) in combined_tokens {
            if let Some(limit) = limit {
                write!(f, ", {name} {limit}")?;
            }
        }
        Ok(())
    }
}
