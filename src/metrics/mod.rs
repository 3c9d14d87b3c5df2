//! Metrics of the gate (behaviour §6), through the [`metrics`] facade, so any
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
//! | `rejection_total` | counter | `scope` = `rank` \| `worker` (and `reason` = `queue_full` \| `deadline` \| `displaced` when deadlines are on or priority bands are configured; \| `queue_delay`, worker scope only, with a queue delay target; `reason` = `shutdown` \| `body_reads`, worker scope only, always, from the first such rejection on) | requests rejected |
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
//! autoscalers (off by default, so that the default series are behaviour §6's):
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
//! configured (behaviour §8), three more series carry a `priority` label: the
//! configured band a request arrived in (`"0"`, `"10"`, …; a request of
//! priority 3 with bands 0 and 10 counts under `"0"`), so the label has one
//! value per configured band and no more. Without configured bands every
//! priority would be a band of its own, an unbounded label: then these
//! series do not exist. No series carries a tenant the configuration does
//! not name (unbounded too).
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
//! # The client's view
//!
//! The HTTP layer ([`AdmissionLayer`](crate::http::AdmissionLayer), so the
//! sidecar too) measures each request it admits as its client feels it,
//! from the moment the layer is called (the queue wait included) to the
//! end of its response, on the gate's clock
//! ([`AdmissionConfig::clock`](crate::AdmissionConfig::clock)). Its series
//! are registered with the gate's when a layer is made for the gate
//! ([`AdmissionLayer::new`](crate::http::AdmissionLayer::new)), with the
//! recorder in use then (a gate still waiting for its recorder registers
//! them with the one it finds), and recorded only while the gate's metrics
//! are. They carry no `dp_rank` (they are the worker's), and two labels
//! the configuration bounds: `priority`, the configured band the request
//! arrived in (only with configured bands), and `tenant_class`, the
//! request's tenant when a [tenant weight](crate::AdmissionConfig::tenant_weight)
//! or [per-tenant limits](crate::AdmissionConfig::tenant_limits) name it,
//! `other` for any other tenant and for none. A family has `bands ×
//! (named tenants + 1)` series (one band without bands), whatever tenants
//! clients send.
//!
//! | suffix | type | meaning |
//! |---|---|---|
//! | `client_time_to_first_token_seconds` | histogram | arrival to the data frame with the first generated token (as the detector sees it; after [`FirstToken::mark`](crate::http::FirstToken::mark), the first non-empty frame), or to the end of a response completed without one |
//! | `client_inter_token_latency_seconds` | histogram | the gap before each content chunk after the first token (every non-empty data frame from then on is one, but an event stream's `data: [DONE]` and usage-only chunk, `"choices": []`) |
//! | `client_request_duration_seconds` | histogram | arrival to the end of the response: completed, failed or dropped |
//! | `finished_requests_total` | counter | admitted requests whose response ended, however it ended |
//! | `goodput_requests_total` | counter | finished requests that met every objective |
//!
//! A request met its objectives when its response completed (no body
//! error, not dropped before its end) with a status below 500, its time to
//! first token is at most
//! [`ttft_objective`](crate::AdmissionConfig::ttft_objective), the mean
//! gap between its content chunks (from the first token to the last
//! content chunk, over the gaps between them: a benchmark client's
//! per-request inter-token latency, or time per output token) at most
//! [`inter_token_objective`](crate::AdmissionConfig::inter_token_objective),
//! and its duration at most its own
//! [deadline](crate::Descriptor::deadline); an objective not set is met.
//! Requests the gate rejected or that were cancelled while queued never
//! started, and count in neither counter. Each content chunk costs one
//! clock read and one histogram record; nothing is allocated per chunk.
//! Unlike the gate's counters, which are set from its tallies, these two
//! are incremented, once per request, when its response ends; a request
//! arriving before a late recorder was found (see below) is not measured.
//!
//! After settling, `request_receive_total` = `request_admit_total` (both
//! sources) + `rejection_total` (both scopes) + `cancellation_total`, per
//! `dp_rank` while the ranks do not change.
//!
//! Two reasons of rejection are possible whatever the configuration, and
//! rare: `shutdown` (the gate was [shut down](crate::Gate::shut_down): the
//! requests queued then and those arriving after) and `body_reads` (a
//! request turned away in front of the gate by
//! [`OpenAiCostLayer`](crate::http::OpenAiCostLayer), counted with
//! [`Gate::reject`](crate::Gate::reject) under `dp_rank="unspecified"`).
//! Their `rejection_total` series always carry `scope="worker"` and their
//! `reason`, whether or not the other series do, and never add to the
//! series without a reason. Rather than a series at 0 in every exposition,
//! each is registered at its first rejection, with the recorder in use
//! then (a server's global recorder; a test's local recorder must be in
//! use at the event, not only when the gate was built).
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

use metrics::{Counter, Gauge, Histogram};

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

mod bucket;
pub(crate) mod client;
mod families;
mod ranks;

use self::bucket::{BucketMetrics, Shape};
use self::client::{ClientConfig, ClientSeries};
use self::families::Names;
use self::ranks::RankTable;

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
    /// What the HTTP layer measures requests against.
    client: ClientConfig,
    /// Whether an HTTP layer admits through the gate: then the client's
    /// view is registered with the gate's other series.
    client_wanted: AtomicBool,
}

/// One registration of the gate's series, with one recorder.
struct Series {
    unranked: BucketMetrics,
    ranks: RankTable,
    /// The client's view, registered once an HTTP layer admits through
    /// the gate (see [`Recorder::want_client`]).
    client: OnceLock<ClientSeries>,
}

impl Series {
    /// Registers the gate's series, and the client's view with them when
    /// `client` (an HTTP layer admits through the gate).
    fn register(names: &Names, shape: &Shape, client: bool) -> Self {
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
        let series = Series {
            unranked: BucketMetrics::register(names, shape, None),
            ranks: RankTable::new(),
            client: OnceLock::new(),
        };
        if client {
            series.client(names, shape);
        }
        series
    }

    /// The client's view, registered with the current recorder the first
    /// time.
    fn client(&self, names: &Names, shape: &Shape) -> &ClientSeries {
        self.client.get_or_init(|| {
            contain(|| names.describe_client());
            ClientSeries::register(names, &shape.client)
        })
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
            built: Series::register(&names, &shape, false),
            looking: AtomicBool::new(!recorder_installed()),
            late: OnceLock::new(),
            client: ClientConfig::of(config),
            client_wanted: AtomicBool::new(false),
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
        if let Some(waited) = observation.event.queue_wait {
            bucket.queue_wait.record(waited.as_secs_f64());
        }
        if let Some(waited) = observation.event.engine_waiting {
            bucket.engine_waiting_time.record(waited.as_secs_f64());
        }
        bucket.apply(
            observation.seq,
            &observation.bucket,
            observation.event.tally_changed,
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
                observation.event.tally_changed,
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
            let client = self.client_wanted.load(Ordering::Relaxed);
            Series::register(&self.names, &self.shape, client)
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
