//! Metrics of the gate (SPEC §6), through the [`metrics`] facade, so any
//! exporter works (Prometheus first).
//!
//! Every name is `<prefix>_<suffix>`; the prefix is
//! [`AdmissionConfig::metrics_prefix`](crate::AdmissionConfig::metrics_prefix),
//! [`DEFAULT_PREFIX`] unless set. With the prefix `dynamo_backend_admission`
//! the names are those of the source system. Every series carries a
//! `dp_rank` label: the rank number (`"0"`, `"1"`, …) or `"unspecified"` for
//! unranked requests. Each request is counted under one value; sum over all
//! values, `unspecified` included, for the worker's totals.
//!
//! | suffix | type | extra labels | meaning |
//! |---|---|---|---|
//! | `engine_request_count` | gauge | | admitted requests whose response has not ended |
//! | `engine_request_waiting_count` | gauge | | admitted requests without a first token or completion yet |
//! | `request_queue_count` | gauge | | requests waiting in the gate's queue |
//! | `request_receive_total` | counter | | requests received |
//! | `request_admit_total` | counter | `source` = `direct` \| `queue` | requests admitted |
//! | `rejection_total` | counter | `scope` = `rank` \| `worker` (and `reason` = `queue_full` \| `deadline` \| `displaced` when deadlines are on or priority bands are configured; \| `queue_delay`, worker scope only, with a queue delay target) | requests rejected |
//! | `cancellation_total` | counter | | requests cancelled while queued |
//! | `engine_request_limit` | gauge | | the engine request limit |
//! | `engine_request_waiting_limit` | gauge | | the engine request waiting limit |
//! | `request_queue_limit` | gauge | | the request queue limit |
//! | `request_queue_wait_seconds` | histogram | | time in the gate's queue, of requests admitted from it |
//! | `engine_request_waiting_seconds` | histogram | | admission to first token or completion: the W of Little's law |
//! | `request_queue_oldest_age_seconds` | gauge | | how long the oldest request still in the gate's queue has waited; 0 when the queue is empty |
//!
//! With [`AdmissionConfig::saturation_metric`](crate::AdmissionConfig::saturation_metric)
//! one more gauge, per `dp_rank`, is the single signal for routers and
//! autoscalers (off by default, so that the default series are SPEC §6's):
//!
//! | suffix | type | meaning |
//! |---|---|---|
//! | `saturation` | gauge | demand over what the gate can hold, in the engine and in its queue: 0 when idle, 1 when the next request would be rejected |
//!
//! For counts `c` against limits `L`: engine fill `e` = the largest of
//! `c.engine_requests / L.engine_request_limit`, `c.engine_waiting /
//! L.engine_request_waiting_limit` and, where token limits are set, the
//! token counts over them; queue fill `q` = the larger of `c.queued /
//! L.request_queue_limit` and queued tokens over their limit; each at most
//! 1; and `saturation = (e × E + q × Q) / (E + Q)` with `E` the engine
//! request limit and `Q` the queue limit. Under `dp_rank="unspecified"` it
//! is the **whole worker's** (its combined counts over its combined
//! limits, which is what unranked requests draw on), and a rank's series
//! is the larger of the rank's own and the worker's (a ranked request
//! needs room in both). It is a ratio, so it does **not** follow the sum
//! rule of the other series: the worker total is the `unspecified` series
//! itself (as for the limit gauges), not a sum over `dp_rank`; take `max`
//! over `dp_rank` for the busiest rank. The worker's series is set at
//! every event; a rank's at that rank's events and at
//! [`Gate::refresh_metrics`](crate::Gate::refresh_metrics) (call it before
//! a scrape). [`Gate::saturation`](crate::Gate::saturation) gives the same
//! value in code.
//!
//! With a token limit set ([`AdmissionConfig::engine_waiting_token_limit`](crate::AdmissionConfig::engine_waiting_token_limit)
//! and its siblings), six more gauges weigh the requests, per `dp_rank`;
//! without one they do not exist:
//!
//! | suffix | meaning |
//! |---|---|
//! | `engine_token_count` | prompt plus maximum output tokens of admitted requests |
//! | `engine_waiting_token_count` | prompt tokens of admitted requests without a first token yet |
//! | `request_queue_token_count` | prompt tokens of queued requests |
//! | `engine_token_limit`, `engine_waiting_token_limit`, `request_queue_token_limit` | the token limits that are set (combined for `unspecified`) |
//!
//! With [`AdmissionConfig::priority_bands`](crate::AdmissionConfig::priority_bands)
//! configured (SPEC §8), three more series carry a `priority` label: the
//! configured band a request arrived in (`"0"`, `"10"`, …; a request of
//! priority 3 with bands 0 and 10 counts under `"0"`), so the label has one
//! value per configured band and no more. Without configured bands every
//! priority would be a band of its own, an unbounded label: then these
//! series do not exist. No series ever carries a tenant (unbounded too).
//!
//! | suffix | type | labels | meaning |
//! |---|---|---|---|
//! | `request_queue_by_priority_count` | gauge | `dp_rank`, `priority` | requests waiting in the gate's queue |
//! | `request_admit_by_priority_total` | counter | `dp_rank`, `priority` | requests admitted (both sources) |
//! | `rejection_by_priority_total` | counter | `dp_rank`, `priority` | requests rejected (every scope and reason) |
//!
//! Summed over `priority` they equal `request_queue_count`,
//! `request_admit_total` (both sources) and `rejection_total`. A request
//! that ages into a higher band (an aging interval is set) still counts
//! under the band it arrived in.
//!
//! After settling, `request_receive_total` = `request_admit_total` (both
//! sources) + `rejection_total` (both scopes) + `cancellation_total`, per
//! `dp_rank` while the ranks do not change.
//!
//! The three limit gauges show the configured per-rank limits under each
//! rank's `dp_rank`. Under `dp_rank="unspecified"` they show the combined
//! capacity of the worker (ranks × the per-rank limit), which is what
//! unranked requests draw on; before the engine reports, the gate assumes
//! one rank and every request is unranked. A rank that vanishes in a
//! capacity report keeps its series, with every gauge at 0: its requests
//! are counted as unranked from then on, so a request received on it ends
//! under `dp_rank="unspecified"`, and the sum above holds for the worker's
//! totals rather than per `dp_rank`.
//!
//! # Recording
//!
//! The gate hands each event's counts and tallies to this module after it
//! has released its lock; the recorder never runs inside the gate. Gauges
//! and counters are *set* from the gate's own counts and tallies, never
//! incremented or decremented: they cannot drift from
//! [`Gate::snapshot`](crate::Gate::snapshot), and when two events' values
//! race out of the gate the later event's values win, so the last value
//! written is always the latest state. Handles are registered when the gate
//! is built and when the engine reports new ranks; events then touch
//! pre-registered handles.
//!
//! The order of installing the recorder (exporter) and creating the
//! [`Gate`](crate::Gate) does not matter. A gate built while no recorder is
//! installed looks for one at each event (one relaxed atomic load, and the
//! facade's recorder lookup, until it finds one); at the first event after
//! one is installed it registers its series with it, logs that it did
//! (`INFO`), and sets every series at once, as
//! [`Gate::refresh_metrics`](crate::Gate::refresh_metrics) does, counters
//! included (they are set from the gate's tallies, so nothing counted
//! before is lost). Until then it skips each event's observation: it
//! reads no clock for it and sets nothing (there is nothing to set), so a
//! request admitted before the recorder appeared records no
//! `engine_request_waiting_seconds` sample (queued requests are stamped
//! all the same, for their queue waits and ages). A gate built after the
//! recorder pays one relaxed load per event for this. (The facade cannot
//! say whether a recorder is installed; the gate takes a zero-sized
//! recorder — the facade's no-op one — for none. A zero-sized recorder of
//! your own still receives the series registered when the gate was built,
//! set whenever the gate sets the whole picture — when it is built, at
//! capacity reports and at [`Gate::refresh_metrics`](crate::Gate::refresh_metrics)
//! — but not at each event.)
//!
//! Each event sets only the series whose values it changed (the values
//! last written are kept beside the handles, under the same lock that
//! orders racing observations); the whole picture sets every series
//! again.
//!
//! A recorder that panics loses its own observation and nothing else: the
//! gate's capacity, its waiters and the process are unaffected.
//!
//! One gate registers one set of series: two gates in one process need
//! different prefixes, or they overwrite each other's gauges.
//!
//! For a request admitted from the queue, admission is the moment the gate
//! offered it capacity: its queue wait ends and its engine waiting time
//! begins there, as its counts move from the queue to the engine.
//!
//! Queue and waiting times are measured with `quanta`'s clock (the CPU's
//! invariant TSC where there is one, else the OS's monotonic clock): the
//! clock is read at each arrival and when a request's waiting ends, before
//! taking the gate's lock, and once inside it for an event that admits
//! queued requests. Without the `metrics` feature the gate never reads the
//! clock.
//!
//! # The age of the oldest queued request
//!
//! `request_queue_oldest_age_seconds` is measured from the oldest queued
//! request's arrival, which the gate notes anyway: on the gate's own clock
//! ([`AdmissionConfig::clock`](crate::AdmissionConfig::clock)) when it
//! keeps time (deadlines or aging on), so the age agrees with deadlines,
//! aging and a test's paused clock; otherwise on `quanta`'s clock, from the
//! stamp taken at every arrival for `request_queue_wait_seconds`. Arrivals
//! cost nothing more; an event reads a clock once more, after the lock,
//! only when a queue it touched is not empty.
//!
//! Like every gauge it is set at the gate's events, so between events it
//! goes stale: a request stuck in a queue that nothing touches would keep
//! the age of the last event. Call
//! [`Gate::refresh_metrics`](crate::Gate::refresh_metrics) in the
//! `/metrics` handler, before rendering, so each scrape sees the age at
//! the scrape (the examples do).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use metrics::{Counter, Gauge, Histogram, Unit};

use crate::config::{AdmissionConfig, Limits};
use crate::gate::observe::{BucketView, Configured, Observation, Observer, contain};
use crate::gate::types::BandTally;
use crate::gate::{Counts, Tally};

/// The metric name prefix unless
/// [`AdmissionConfig::metrics_prefix`](crate::AdmissionConfig::metrics_prefix)
/// sets another.
pub const DEFAULT_PREFIX: &str = "admission";

/// Histogram buckets, in seconds, for the gate's `_seconds` series (queue
/// time, engine waiting time): from 1 ms to a minute, as the sidecar and
/// the examples give them to the Prometheus exporter
/// (`PrometheusBuilder::set_buckets_for_metric(Matcher::Suffix("_seconds"), &SECONDS_BUCKETS)`).
/// Without buckets that exporter renders summaries, which cannot be
/// aggregated across workers.
pub const SECONDS_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The `dp_rank` label of unranked requests.
const UNSPECIFIED: &str = "unspecified";

/// What the limit gauges of a vanished rank show.
const NO_LIMITS: Limits = Limits {
    engine_request_limit: 0,
    engine_request_waiting_limit: 0,
    request_queue_limit: 0,
    engine_waiting_token_limit: Some(0),
    engine_token_limit: Some(0),
    request_queue_token_limit: Some(0),
};

/// Which families are described: always, with a token limit set, or
/// with priority bands configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Group {
    Base,
    Tokens,
    Priorities,
    Saturation,
}

/// Declares every metric family once: the group it is described with,
/// its kind, its name (the field of [`Names`] and the suffix after the
/// prefix), its unit and its help text.
macro_rules! families {
    ($($group:ident $kind:ident $name:ident: $unit:ident, $help:literal;)*) => {
        /// The full names of the metric families.
        struct Names {
            $($name: String,)*
        }

        impl Names {
            fn new(prefix: &str) -> Self {
                Names {
                    $($name: format!("{prefix}_{}", stringify!($name)),)*
                }
            }

            /// Describes the families of `group` to the recorder.
            fn describe_group(&self, group: Group) {
                $(
                    if group == Group::$group {
                        families!(@describe $kind, self.$name.clone(), Unit::$unit, $help);
                    }
                )*
            }
        }
    };
    (@describe gauge, $name:expr, $unit:expr, $help:literal) => {
        metrics::describe_gauge!($name, $unit, $help)
    };
    (@describe counter, $name:expr, $unit:expr, $help:literal) => {
        metrics::describe_counter!($name, $unit, $help)
    };
    (@describe histogram, $name:expr, $unit:expr, $help:literal) => {
        metrics::describe_histogram!($name, $unit, $help)
    };
}

families! {
    Base gauge engine_request_count: Count, "Admitted requests whose response has not ended.";
    Base gauge engine_request_waiting_count: Count, "Admitted requests without a first generated token or completion yet.";
    Base gauge request_queue_count: Count, "Requests waiting in the gate's queue, outside the engine.";
    Base counter request_receive_total: Count, "Requests received by the gate.";
    Base counter request_admit_total: Count, "Requests admitted to the engine, on arrival (source=direct) or from the queue (source=queue).";
    Base counter rejection_total: Count, "Requests rejected as overload, naming their rank (scope=rank) or the whole worker (scope=worker); with deadlines or priority bands on, why (reason=queue_full|deadline|displaced).";
    Base counter cancellation_total: Count, "Requests cancelled while waiting in the gate's queue.";
    Base gauge engine_request_limit: Count, "Engine request limit per rank (combined capacity for dp_rank=unspecified).";
    Base gauge engine_request_waiting_limit: Count, "Engine request waiting limit per rank (combined capacity for dp_rank=unspecified).";
    Base gauge request_queue_limit: Count, "Request queue limit per rank (combined capacity for dp_rank=unspecified).";
    Base histogram request_queue_wait_seconds: Seconds, "Time requests admitted from the gate's queue spent in it.";
    Base histogram engine_request_waiting_seconds: Seconds, "Time from admission to the first generated token or completion.";
    Base gauge request_queue_oldest_age_seconds: Seconds, "How long the oldest request still waiting in the gate's queue has waited (0 when the queue is empty), as of the gate's last event or metrics refresh.";
    Tokens gauge engine_token_count: Count, "Prompt plus maximum output tokens of admitted requests whose response has not ended.";
    Tokens gauge engine_waiting_token_count: Count, "Prompt tokens of admitted requests without a first generated token or completion yet.";
    Tokens gauge request_queue_token_count: Count, "Prompt tokens of requests waiting in the gate's queue.";
    Tokens gauge engine_token_limit: Count, "Engine token limit per rank (combined capacity for dp_rank=unspecified).";
    Tokens gauge engine_waiting_token_limit: Count, "Engine waiting token limit per rank (combined capacity for dp_rank=unspecified).";
    Tokens gauge request_queue_token_limit: Count, "Request queue token limit per rank (combined capacity for dp_rank=unspecified).";
    Priorities gauge request_queue_by_priority_count: Count, "Requests waiting in the gate's queue, by the configured priority band they arrived in.";
    Priorities counter request_admit_by_priority_total: Count, "Requests admitted to the engine (either source), by the configured priority band they arrived in.";
    Priorities counter rejection_by_priority_total: Count, "Requests rejected as overload (any scope and reason), by the configured priority band they arrived in.";
    Saturation gauge saturation: Count, "Demand over what the gate can hold in the engine and its queue, 0 (idle) to 1 (the next request is rejected); a rank's is the larger of its own and the worker's; dp_rank=unspecified is the whole worker.";
}

impl Names {
    fn describe(&self) {
        self.describe_group(Group::Base);
    }

    fn describe_priorities(&self) {
        self.describe_group(Group::Priorities);
    }

    fn describe_tokens(&self) {
        self.describe_group(Group::Tokens);
    }

    fn describe_saturation(&self) {
        self.describe_group(Group::Saturation);
    }
}

/// The token series of one bucket, registered only when a token limit is
/// set (without one, requests are counted, not weighed).
struct TokenMetrics {
    engine_tokens: Gauge,
    engine_waiting_tokens: Gauge,
    queued_tokens: Gauge,
    engine_token_limit: Gauge,
    engine_waiting_token_limit: Gauge,
    request_queue_token_limit: Gauge,
}

impl TokenMetrics {
    fn register(names: &Names, limits: &Limits, dp_rank: &str) -> Self {
        use metrics::gauge;
        let gauge = |name: &String| gauge!(name.clone(), "dp_rank" => dp_rank.to_owned());
        // A limit that is not set has no series: 0 would read as "nothing fits".
        let limit = |set: Option<usize>, name: &String| match set {
            Some(_) => gauge(name),
            None => Gauge::noop(),
        };
        TokenMetrics {
            engine_tokens: gauge(&names.engine_token_count),
            engine_waiting_tokens: gauge(&names.engine_waiting_token_count),
            queued_tokens: gauge(&names.request_queue_token_count),
            engine_token_limit: limit(limits.engine_token_limit, &names.engine_token_limit),
            engine_waiting_token_limit: limit(
                limits.engine_waiting_token_limit,
                &names.engine_waiting_token_limit,
            ),
            request_queue_token_limit: limit(
                limits.request_queue_token_limit,
                &names.request_queue_token_limit,
            ),
        }
    }

    fn set_counts(&self, counts: &crate::gate::Counts) {
        self.engine_tokens.set(counts.engine_tokens as f64);
        self.engine_waiting_tokens
            .set(counts.engine_waiting_tokens as f64);
        self.queued_tokens.set(counts.queued_tokens as f64);
    }

    fn set_limits(&self, limits: &Limits, ranks: usize) {
        let combined = |per_rank: Option<usize>| per_rank.unwrap_or(0).saturating_mul(ranks) as f64;
        self.engine_token_limit
            .set(combined(limits.engine_token_limit));
        self.engine_waiting_token_limit
            .set(combined(limits.engine_waiting_token_limit));
        self.request_queue_token_limit
            .set(combined(limits.request_queue_token_limit));
    }
}

/// The series of one configured priority band of one bucket, registered
/// only when bands are configured: the `priority` label takes one value per
/// configured band, so its cardinality is the configuration's.
struct BandMetrics {
    queued: Gauge,
    admitted: Counter,
    rejected: Counter,
}

impl BandMetrics {
    fn register(names: &Names, dp_rank: &str, priority: &str) -> Self {
        use metrics::{counter, gauge};
        let labels = || {
            [
                ("dp_rank", dp_rank.to_owned()),
                ("priority", priority.to_owned()),
            ]
        };
        BandMetrics {
            queued: gauge!(names.request_queue_by_priority_count.clone(), &labels()),
            admitted: counter!(names.request_admit_by_priority_total.clone(), &labels()),
            rejected: counter!(names.rejection_by_priority_total.clone(), &labels()),
        }
    }
}

/// What every bucket's series look like: which optional series exist.
/// Decided from the configuration when the gate is built.
struct Shape {
    /// The configured limits when a token limit is set: then every bucket
    /// has token series too.
    token_limits: Option<Limits>,
    /// Whether rejections carry a `reason` label: the gate keeps time, so
    /// some may be for a deadline, or priority bands are configured, so
    /// some may be displaced.
    reasons: bool,
    /// Whether controlled delay is on: then rejections of reason
    /// `queue_delay` have a series.
    shedding: bool,
    /// Whether the saturation gauge is recorded.
    saturation: bool,
    /// The `priority` label of each configured band, lowest first; empty:
    /// no per-priority series.
    priorities: Vec<String>,
}

impl Shape {
    fn of(config: &AdmissionConfig) -> Self {
        let limits = config.limits_for(None);
        let token_limits = (limits.engine_waiting_token_limit.is_some()
            || limits.engine_token_limit.is_some()
            || limits.request_queue_token_limit.is_some())
        .then_some(limits);
        let priorities: Vec<String> = config
            .explicit_priority_bands()
            .iter()
            .map(i32::to_string)
            .collect();
        Shape {
            token_limits,
            reasons: config.deadlines_enabled() || !priorities.is_empty(),
            shedding: config.explicit_queue_delay_target().is_some(),
            saturation: config.explicit_saturation_metric(),
            priorities,
        }
    }

    /// No optional series.
    #[cfg(test)]
    fn plain() -> Self {
        Shape {
            token_limits: None,
            reasons: false,
            shedding: false,
            saturation: false,
            priorities: Vec::new(),
        }
    }
}

/// The handles of one bucket: a rank, or the unranked requests.
struct BucketMetrics {
    engine_requests: Gauge,
    engine_waiting: Gauge,
    queued: Gauge,
    engine_request_limit: Gauge,
    engine_request_waiting_limit: Gauge,
    request_queue_limit: Gauge,
    received: Counter,
    admitted_direct: Counter,
    admitted_queue: Counter,
    /// Rejections of each scope; with reasons on, those for a full queue.
    rejected_rank: Counter,
    rejected_worker: Counter,
    /// Rejections of each scope for a deadline, with reasons on.
    expired_rank: Counter,
    expired_worker: Counter,
    /// Rejections of each scope of displaced requests, with reasons on.
    displaced_rank: Counter,
    displaced_worker: Counter,
    /// Rejections by controlled delay (always worker-scoped), when it is on.
    shed_worker: Counter,
    /// Whether the rejection series carry a `reason` label.
    reasons: bool,
    cancelled: Counter,
    queue_wait: Histogram,
    engine_waiting_time: Histogram,
    oldest_wait: Gauge,
    /// The saturation gauge, when it is recorded.
    saturation: Gauge,
    tokens: Option<TokenMetrics>,
    /// One per configured priority band, lowest first.
    bands: Vec<BandMetrics>,
    /// The latest events applied, so that observations racing each other
    /// out of the gate leave the latest values behind.
    applied: Mutex<Applied>,
}

#[derive(Default)]
struct Applied {
    counts: u64,
    limits: u64,
    /// The latest event whose worker saturation was set (the unranked
    /// bucket's series shows the worker's).
    saturation: u64,
    /// The values last written to the handles (`None`: never written), so
    /// that an event writes only the series whose values it changed: an
    /// arrival changes three or four of some twenty.
    written: Written,
}

/// The values a bucket's handles were last set to.
#[derive(Default)]
struct Written {
    counts: Option<Counts>,
    oldest_wait: Option<f64>,
    saturation: Option<f64>,
    /// The counters, in the order [`BucketMetrics::counters`] gives them.
    counters: Option<[u64; COUNTERS]>,
    /// Queued requests and tally of each band, lowest first; grown to the
    /// configured bands at the first write.
    bands: Vec<(Option<usize>, Option<BandTally>)>,
}

/// How many counters a bucket has (each scope and reason of rejection
/// one, with reasons off some are always 0).
const COUNTERS: usize = 11;

impl BucketMetrics {
    /// Registers the series of one `dp_rank` value with the current
    /// recorder; should the recorder panic, the bucket records nothing.
    fn register(names: &Names, shape: &Shape, rank: Option<u32>) -> Self {
        let register = || Self::try_register(names, shape, rank);
        catch_unwind(AssertUnwindSafe(register)).unwrap_or_else(|_| {
            tracing::warn!(
                ?rank,
                "the metrics recorder panicked registering the gate's series"
            );
            Self::noop()
        })
    }

    fn noop() -> Self {
        BucketMetrics {
            engine_requests: Gauge::noop(),
            engine_waiting: Gauge::noop(),
            queued: Gauge::noop(),
            engine_request_limit: Gauge::noop(),
            engine_request_waiting_limit: Gauge::noop(),
            request_queue_limit: Gauge::noop(),
            received: Counter::noop(),
            admitted_direct: Counter::noop(),
            admitted_queue: Counter::noop(),
            rejected_rank: Counter::noop(),
            rejected_worker: Counter::noop(),
            expired_rank: Counter::noop(),
            expired_worker: Counter::noop(),
            displaced_rank: Counter::noop(),
            displaced_worker: Counter::noop(),
            shed_worker: Counter::noop(),
            reasons: false,
            cancelled: Counter::noop(),
            queue_wait: Histogram::noop(),
            engine_waiting_time: Histogram::noop(),
            oldest_wait: Gauge::noop(),
            saturation: Gauge::noop(),
            tokens: None,
            bands: Vec::new(),
            applied: Mutex::default(),
        }
    }

    fn try_register(names: &Names, shape: &Shape, rank: Option<u32>) -> Self {
        use metrics::{counter, gauge, histogram};
        let dp_rank = rank.map_or_else(|| UNSPECIFIED.to_owned(), |rank| rank.to_string());
        let gauge = |name: &String| gauge!(name.clone(), "dp_rank" => dp_rank.clone());
        let counter = |name: &String| counter!(name.clone(), "dp_rank" => dp_rank.clone());
        let histogram = |name: &String| histogram!(name.clone(), "dp_rank" => dp_rank.clone());
        let admitted = |source: &'static str| counter!(names.request_admit_total.clone(), "dp_rank" => dp_rank.clone(), "source" => source);
        let rejected = |scope: &'static str, reason: Option<&'static str>| match reason {
            None => {
                counter!(names.rejection_total.clone(), "dp_rank" => dp_rank.clone(), "scope" => scope)
            }
            Some(reason) => {
                counter!(names.rejection_total.clone(), "dp_rank" => dp_rank.clone(), "scope" => scope, "reason" => reason)
            }
        };
        let reasons = shape.reasons;
        let full = reasons.then_some("queue_full");
        // Series of a reason other than a full queue, with reasons on.
        let because = |scope, reason| match reasons {
            true => rejected(scope, Some(reason)),
            false => Counter::noop(),
        };
        BucketMetrics {
            engine_requests: gauge(&names.engine_request_count),
            engine_waiting: gauge(&names.engine_request_waiting_count),
            queued: gauge(&names.request_queue_count),
            engine_request_limit: gauge(&names.engine_request_limit),
            engine_request_waiting_limit: gauge(&names.engine_request_waiting_limit),
            request_queue_limit: gauge(&names.request_queue_limit),
            received: counter(&names.request_receive_total),
            admitted_direct: admitted("direct"),
            admitted_queue: admitted("queue"),
            // Unranked rejections are always worker-scoped: no series for
            // a count that can only ever be 0.
            rejected_rank: match rank {
                Some(_) => rejected("rank", full),
                None => Counter::noop(),
            },
            rejected_worker: rejected("worker", full),
            expired_rank: match rank {
                Some(_) => because("rank", "deadline"),
                None => Counter::noop(),
            },
            expired_worker: because("worker", "deadline"),
            displaced_rank: match rank {
                Some(_) => because("rank", "displaced"),
                None => Counter::noop(),
            },
            displaced_worker: because("worker", "displaced"),
            shed_worker: match shape.shedding {
                true => because("worker", "queue_delay"),
                false => Counter::noop(),
            },
            reasons,
            cancelled: counter(&names.cancellation_total),
            queue_wait: histogram(&names.request_queue_wait_seconds),
            engine_waiting_time: histogram(&names.engine_request_waiting_seconds),
            oldest_wait: gauge(&names.request_queue_oldest_age_seconds),
            saturation: match shape.saturation {
                true => gauge(&names.saturation),
                false => Gauge::noop(),
            },
            tokens: shape
                .token_limits
                .as_ref()
                .map(|limits| TokenMetrics::register(names, limits, &dp_rank)),
            bands: shape
                .priorities
                .iter()
                .map(|priority| BandMetrics::register(names, &dp_rank, priority))
                .collect(),
            applied: Mutex::default(),
        }
    }

    /// Each counter with its value from `tally`, in a fixed order.
    fn counters(&self, tally: &Tally) -> [(&Counter, u64); COUNTERS] {
        let (rejected_rank, rejected_worker) = if self.reasons {
            (
                tally.rejected_rank - tally.expired_rank - tally.displaced_rank,
                tally.rejected_worker
                    - tally.expired_worker
                    - tally.displaced_worker
                    - tally.shed_worker,
            )
        } else {
            (tally.rejected_rank, tally.rejected_worker)
        };
        [
            (&self.received, tally.received),
            (&self.admitted_direct, tally.admitted_direct),
            (&self.admitted_queue, tally.admitted_queue),
            (&self.rejected_rank, rejected_rank),
            (&self.rejected_worker, rejected_worker),
            (&self.expired_rank, tally.expired_rank),
            (&self.expired_worker, tally.expired_worker),
            (&self.displaced_rank, tally.displaced_rank),
            (&self.displaced_worker, tally.displaced_worker),
            (&self.shed_worker, tally.shed_worker),
            (&self.cancelled, tally.cancelled),
        ]
    }

    /// Sets the gauges from the bucket's counts after event `seq` (and the
    /// limit gauges, when given), unless a later event was applied already,
    /// and the counters from its tally when `tally` says it changed.
    /// Counters are set, not incremented: they are the gate's own tallies
    /// and cannot drift from its snapshot.
    ///
    /// An event writes only the series whose values differ from the ones
    /// last written (under the same lock, so this is exact); with `limits`
    /// (the whole picture: the gate was built, the engine reported, or
    /// metrics were refreshed) every series is written again.
    fn apply(&self, seq: u64, view: &BucketView, tally: bool, limits: Option<(Limits, usize)>) {
        let every = limits.is_some();
        let mut applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        let applied = &mut *applied;
        let written = &mut applied.written;
        if written.bands.len() < self.bands.len() {
            written.bands.resize(self.bands.len(), (None, None));
        }
        if seq > applied.counts {
            applied.counts = seq;
            let counts = view.counts;
            let last = written.counts.filter(|_| !every);
            let changed = |old: fn(&Counts) -> usize| last.as_ref().map(old) != Some(old(&counts));
            if changed(|counts| counts.engine_requests) {
                self.engine_requests.set(counts.engine_requests as f64);
            }
            if changed(|counts| counts.engine_waiting) {
                self.engine_waiting.set(counts.engine_waiting as f64);
            }
            if changed(|counts| counts.queued) {
                self.queued.set(counts.queued as f64);
            }
            if let Some(tokens) = &self.tokens {
                if last != Some(counts) {
                    tokens.set_counts(&counts);
                }
            }
            written.counts = Some(counts);
            let oldest = view.oldest_wait.map_or(0.0, |waited| waited.as_secs_f64());
            if every || written.oldest_wait != Some(oldest) {
                self.oldest_wait.set(oldest);
                written.oldest_wait = Some(oldest);
            }
            if every || written.saturation != Some(view.saturation) {
                self.saturation.set(view.saturation);
                written.saturation = Some(view.saturation);
            }
            if view.rank.is_none() {
                applied.saturation = seq;
            }
        }
        // Counters only grow, and are set from tallies that only grow: a
        // late write of an older tally changes nothing.
        if tally {
            let last = written.counters.filter(|_| !every);
            let mut values = [0; COUNTERS];
            for (at, (counter, value)) in self.counters(&view.tally).into_iter().enumerate() {
                if last.is_none_or(|last| last[at] < value) {
                    counter.absolute(value);
                }
                values[at] = last.map_or(value, |last| last[at].max(value));
            }
            written.counters = Some(values);
        }
        let bands = self.bands.iter().zip(view.bands.iter().flatten());
        for ((metrics, band), (queued, band_tally)) in bands.zip(&mut written.bands) {
            // The band's queue length is a count, its tally a tally: each
            // moves under its own rule, as above (`applied.counts == seq`:
            // this event's counts are the latest).
            if applied.counts == seq && (every || *queued != Some(band.queued)) {
                metrics.queued.set(band.queued as f64);
                *queued = Some(band.queued);
            }
            if tally {
                let old = band_tally.filter(|_| !every);
                let new = band.tally;
                if old.is_none_or(|old| old.admitted < new.admitted) {
                    metrics.admitted.absolute(new.admitted);
                }
                if old.is_none_or(|old| old.rejected < new.rejected) {
                    metrics.rejected.absolute(new.rejected);
                }
                let old = old.unwrap_or_default();
                *band_tally = Some(BandTally {
                    admitted: old.admitted.max(new.admitted),
                    rejected: old.rejected.max(new.rejected),
                });
            }
        }
        if let Some((limits, ranks)) = limits {
            if seq > applied.limits {
                applied.limits = seq;
                self.set_limits(limits, ranks);
            }
        }
    }

    /// Sets the worker's saturation (the unranked bucket's series) after
    /// event `seq`, unless a later event set it already.
    fn set_worker_saturation(&self, seq: u64, saturation: f64) {
        let mut applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        if seq > applied.saturation {
            applied.saturation = seq;
            if applied.written.saturation != Some(saturation) {
                self.saturation.set(saturation);
                applied.written.saturation = Some(saturation);
            }
        }
    }

    fn set_limits(&self, limits: Limits, ranks: usize) {
        let combined = |per_rank: usize| per_rank.saturating_mul(ranks) as f64;
        self.engine_request_limit
            .set(combined(limits.engine_request_limit));
        self.engine_request_waiting_limit
            .set(combined(limits.engine_request_waiting_limit));
        self.request_queue_limit
            .set(combined(limits.request_queue_limit));
        if let Some(tokens) = &self.tokens {
            tokens.set_limits(&limits, ranks);
        }
    }
}

/// Records the gate's transitions: the gate's observer when the `metrics`
/// feature is on. It hears of each event after the gate's lock is released,
/// in plain values, and never sees the gate's state.
pub(crate) struct Recorder {
    names: Names,
    shape: Shape,
    /// The series registered when the gate was built.
    built: Series,
    /// The series registered with a recorder installed after the gate was
    /// built without one; once registered, the ones recorded.
    late: OnceLock<Series>,
    /// Whether the gate was built with no recorder installed and none has
    /// appeared since: until one does, each event looks for it.
    looking: AtomicBool,
}

/// One registration of the gate's series, with one recorder.
struct Series {
    unranked: BucketMetrics,
    ranks: RankTable,
}

impl Series {
    fn register(names: &Names, shape: &Shape) -> Self {
        contain(|| {
            names.describe();
            if shape.token_limits.is_some() {
                names.describe_tokens();
            }
            if !shape.priorities.is_empty() {
                names.describe_priorities();
            }
            if shape.saturation {
                names.describe_saturation();
            }
        });
        Series {
            unranked: BucketMetrics::register(names, shape, None),
            ranks: RankTable::new(),
        }
    }
}

/// Whether a metrics recorder is installed (globally, or locally on this
/// thread). The `metrics` facade has no such question, but the recorder it
/// uses when none is installed is zero-sized and every real one holds
/// state: a zero-sized recorder of the user's own is taken for none, which
/// only means the gate keeps the series it registered with it when built.
fn recorder_installed() -> bool {
    metrics::with_recorder(|recorder| std::mem::size_of_val(recorder) != 0)
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("prefix_of", &self.names.engine_request_count)
            .field("ranks", &self.series().0.ranks.len())
            .field("late", &self.late.get().is_some())
            .finish()
    }
}

impl Observer for Recorder {
    const ENABLED: bool = true;

    /// Describes the families and registers the unranked series with the
    /// current recorder.
    fn new(config: &AdmissionConfig) -> Self {
        let prefix = config.metrics_prefix.as_deref().unwrap_or(DEFAULT_PREFIX);
        let names = Names::new(prefix);
        let shape = Shape::of(config);
        Recorder {
            built: Series::register(&names, &shape),
            looking: AtomicBool::new(!recorder_installed()),
            late: OnceLock::new(),
            names,
            shape,
        }
    }

    /// Whether there is anything to record with: a recorder was installed
    /// when the gate was built or has been since. A gate waiting for its
    /// recorder skips each event's observation (it has nothing to set), and
    /// at its first event after one appears registers its series and sets
    /// them all from the gate's own counts and tallies (see
    /// [`observe`](Observer::observe)), so nothing skipped is lost.
    #[inline]
    fn active(&self) -> bool {
        !self.looking.load(Ordering::Relaxed) || recorder_installed()
    }

    /// The gate was built, the engine reported its capacity, or metrics
    /// were refreshed: every gauge is set, new ranks are registered,
    /// vanished ranks zeroed.
    fn configured(&self, configured: &Configured) {
        let (series, _) = self.series();
        let seq = configured.seq;
        // Before the first report the gate assumes one rank.
        let combined = configured.ranks.max(1);
        series.unranked.apply(
            seq,
            &configured.unranked,
            true,
            Some((configured.limits, combined)),
        );
        for view in &configured.rank_buckets {
            let rank = view.rank.unwrap_or_default() as usize;
            let limits = if rank < configured.ranks {
                configured.limits
            } else {
                NO_LIMITS
            };
            self.bucket(series, view.rank)
                .apply(seq, view, true, Some((limits, 1)));
        }
    }

    /// Records one event; asks for the whole picture when it registered
    /// the series just now, with a recorder installed after the gate was
    /// built.
    fn observe(&self, observation: &Observation) -> bool {
        let (series, registered) = self.series();
        let bucket = self.bucket(series, observation.bucket.rank);
        if let Some(waited) = observation.queue_wait {
            bucket.queue_wait.record(waited.as_secs_f64());
        }
        if let Some(waited) = observation.engine_waiting {
            bucket.engine_waiting_time.record(waited.as_secs_f64());
        }
        bucket.apply(
            observation.seq,
            &observation.bucket,
            observation.tally_changed,
            None,
        );
        // Every event moves the worker's saturation, whichever bucket it
        // concerned.
        series
            .unranked
            .set_worker_saturation(observation.seq, observation.worker_saturation);
        for view in &observation.offered {
            // An event that changed tallies may have changed theirs too
            // (controlled delay sheds from any queue).
            self.bucket(series, view.rank).apply(
                observation.seq,
                view,
                observation.tally_changed,
                None,
            );
        }
        registered
    }
}

impl Recorder {
    /// The series to record with, and whether they were registered just
    /// now. One relaxed load on the path of a gate built after its
    /// recorder was installed.
    #[inline]
    fn series(&self) -> (&Series, bool) {
        if self.looking.load(Ordering::Relaxed) {
            return self.look_for_recorder();
        }
        (self.late.get().unwrap_or(&self.built), false)
    }

    /// The gate was built with no recorder installed: registers the series
    /// with one installed since, if there is one now.
    #[cold]
    fn look_for_recorder(&self) -> (&Series, bool) {
        if !recorder_installed() {
            return (self.late.get().unwrap_or(&self.built), false);
        }
        let mut registered = false;
        let late = self.late.get_or_init(|| {
            registered = true;
            tracing::info!(
                prefix_of = %self.names.engine_request_count,
                "a metrics recorder was installed after the admission gate was built: \
                 registering the gate's series with it now"
            );
            Series::register(&self.names, &self.shape)
        });
        self.looking.store(false, Ordering::Relaxed);
        (late, registered)
    }

    /// The handles of a bucket, registered on first use.
    fn bucket<'a>(&'a self, series: &'a Series, rank: Option<u32>) -> &'a BucketMetrics {
        match rank {
            None => &series.unranked,
            Some(rank) => series.ranks.get_or_register(rank as usize, || {
                BucketMetrics::register(&self.names, &self.shape, Some(rank))
            }),
        }
    }
}

/// The handles of every rank ever recognised, by rank number.
///
/// It only grows, and only in [`Recorder::configured`] (under the gate's
/// lock); events read it without a lock of their own, so the gate's hot
/// path takes one lock, not two. Chunk `k` holds ranks `2^k - 1` to
/// `2^(k+1) - 2`, so a registered handle never moves.
struct RankTable {
    chunks: [OnceLock<Box<[OnceLock<BucketMetrics>]>>; RankTable::CHUNKS],
    /// One more than the highest rank registered.
    len: AtomicUsize,
}

impl RankTable {
    /// Enough for every `u32` rank.
    const CHUNKS: usize = 33;

    fn new() -> Self {
        RankTable {
            chunks: [const { OnceLock::new() }; RankTable::CHUNKS],
            len: AtomicUsize::new(0),
        }
    }

    fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Chunk and offset of `rank`.
    fn position(rank: usize) -> (usize, usize) {
        let index = rank + 1;
        let chunk = (usize::BITS - 1 - index.leading_zeros()) as usize;
        (chunk, index - (1 << chunk))
    }

    #[cfg(test)]
    fn get(&self, rank: usize) -> Option<&BucketMetrics> {
        let (chunk, offset) = Self::position(rank);
        self.chunks.get(chunk)?.get()?.get(offset)?.get()
    }

    fn get_or_register(
        &self,
        rank: usize,
        register: impl FnOnce() -> BucketMetrics,
    ) -> &BucketMetrics {
        let (chunk, offset) = Self::position(rank);
        let cells = self.chunks[chunk]
            .get_or_init(|| (0..1usize << chunk).map(|_| OnceLock::new()).collect());
        self.len.fetch_max(rank + 1, Ordering::Relaxed);
        cells[offset].get_or_init(register)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_table_positions_cover_every_rank_once() {
        assert_eq!(RankTable::position(0), (0, 0));
        assert_eq!(RankTable::position(1), (1, 0));
        assert_eq!(RankTable::position(2), (1, 1));
        assert_eq!(RankTable::position(3), (2, 0));
        assert_eq!(RankTable::position(6), (2, 3));
        assert_eq!(RankTable::position(7), (3, 0));
        let last = RankTable::position(u32::MAX as usize - 1);
        assert_eq!(last, (31, (1 << 31) - 1));
        assert!(last.0 < RankTable::CHUNKS);
    }

    #[test]
    fn rank_table_registers_each_rank_once_and_keeps_it() {
        let table = RankTable::new();
        let names = Names::new("test");
        assert!(table.get(0).is_none());
        let mut registered = 0;
        for rank in [0, 1, 2, 5, 2] {
            table.get_or_register(rank, || {
                registered += 1;
                BucketMetrics::register(&names, &Shape::plain(), Some(rank as u32))
            });
        }
        assert_eq!(registered, 4);
        assert_eq!(table.len(), 6);
        assert!(table.get(5).is_some());
        assert!(table.get(3).is_none(), "rank 3 was never registered");
    }
}
