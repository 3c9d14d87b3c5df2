//! The handles of one bucket's series (a rank's, or the unranked
//! requests'), and the values last written through them: an event writes
//! only the series whose values it changed.

use super::*;

/// One gauge per stage of a request: in the engine, waiting in the engine
/// (no first token yet), in the gate's queue. A bucket has one set for its
/// request counts, one for its request limits, and the same for tokens.
pub(super) struct Stages {
    pub(super) engine: Gauge,
    pub(super) engine_waiting: Gauge,
    pub(super) queue: Gauge,
}

impl Stages {
    /// The three gauges, in the order of the fields.
    fn of([engine, engine_waiting, queue]: [Gauge; 3]) -> Self {
        Stages {
            engine,
            engine_waiting,
            queue,
        }
    }

    fn noop() -> Self {
        Stages::of(std::array::from_fn(|_| Gauge::noop()))
    }

    /// Sets the three gauges, in the order of the fields.
    fn set(&self, [engine, engine_waiting, queue]: [f64; 3]) {
        self.engine.set(engine);
        self.engine_waiting.set(engine_waiting);
        self.queue.set(queue);
    }
}

/// The token series of one bucket, registered only when a token limit is
/// set (without one, requests are counted, not weighed).
pub(super) struct TokenMetrics {
    pub(super) counts: Stages,
    pub(super) limits: Stages,
}

impl TokenMetrics {
    pub(super) fn register(names: &Names, limits: &Limits, dp_rank: &str) -> Self {
        use metrics::gauge;
        let gauge = |name: &String| gauge!(name.clone(), "dp_rank" => dp_rank.to_owned());
        // A limit that is not set has no series: 0 would read as "nothing fits".
        let limit = |set: Option<usize>, name: &String| match set {
            Some(_) => gauge(name),
            None => Gauge::noop(),
        };
        let counts = [
            &names.engine_token_count,
            &names.engine_waiting_token_count,
            &names.request_queue_token_count,
        ];
        let limits = [
            (limits.engine_token_limit, &names.engine_token_limit),
            (
                limits.engine_waiting_token_limit,
                &names.engine_waiting_token_limit,
            ),
            (
                limits.request_queue_token_limit,
                &names.request_queue_token_limit,
            ),
        ];
        TokenMetrics {
            counts: Stages::of(counts.map(gauge)),
            limits: Stages::of(limits.map(|(set, name)| limit(set, name))),
        }
    }

    pub(super) fn set_counts(&self, counts: &crate::gate::Counts) {
        let tokens = [
            counts.engine_tokens,
            counts.engine_waiting_tokens,
            counts.queued_tokens,
        ];
        self.counts.set(tokens.map(|n| n as f64));
    }

    pub(super) fn set_limits(&self, limits: &Limits, ranks: usize) {
        let combined = |per_rank: Option<usize>| per_rank.unwrap_or(0).saturating_mul(ranks) as f64;
        let per_rank = [
            limits.engine_token_limit,
            limits.engine_waiting_token_limit,
            limits.request_queue_token_limit,
        ];
        self.limits.set(per_rank.map(combined));
    }
}

/// The series of one configured priority band of one bucket, registered
/// only when bands are configured: the `priority` label takes one value per
/// configured band, so its cardinality is the configuration's.
pub(super) struct BandMetrics {
    pub(super) queued: Gauge,
    pub(super) admitted: Counter,
    pub(super) rejected: Counter,
}

impl BandMetrics {
    pub(super) fn register(names: &Names, dp_rank: &str, priority: &str) -> Self {
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
pub(super) struct Shape {
    /// The configured limits when a token limit is set: then every bucket
    /// has token series too.
    pub(super) token_limits: Option<Limits>,
    /// Whether rejections carry a `reason` label: the gate keeps time, so
    /// some may be for a deadline, or priority bands are configured, so
    /// some may be displaced.
    pub(super) reasons: bool,
    /// Whether controlled delay is on: then rejections of reason
    /// `queue_delay` have a series.
    pub(super) shedding: bool,
    /// Whether the saturation gauge is recorded.
    pub(super) saturation: bool,
    /// The `priority` label of each configured band, lowest first; empty:
    /// no per-priority series.
    pub(super) priorities: Vec<String>,
    /// Whether some tenant is limited: then tenant-scoped rejections
    /// (reason `tenant_limit`) have a series, and rejections carry reasons.
    pub(super) tenants: bool,
    /// The label sets of the client's view.
    pub(super) client: super::client::Labels,
}

impl Shape {
    pub(super) fn of(config: &AdmissionConfig) -> Self {
        let limits = config.limits_for(None);
        let token_limits = (limits.engine_waiting_token_limit.is_some()
            || limits.engine_token_limit.is_some()
            || limits.request_queue_token_limit.is_some())
        .then_some(limits);
        let priorities: Vec<String> = config.priority_bands.iter().map(i32::to_string).collect();
        Shape {
            token_limits,
            reasons: config.deadlines_enabled()
                || !priorities.is_empty()
                || config.tenant_limits.is_on(),
            tenants: config.tenant_limits.is_on(),
            shedding: config.queue_delay_target.is_some(),
            saturation: config.explicit_saturation_metric(),
            priorities,
            client: super::client::Labels::of(config),
        }
    }

    /// No optional series.
    #[cfg(test)]
    pub(super) fn plain() -> Self {
        Shape {
            token_limits: None,
            reasons: false,
            shedding: false,
            saturation: false,
            priorities: Vec::new(),
            tenants: false,
            client: Default::default(),
        }
    }
}

/// The handles of one bucket: a rank, or the unranked requests.
pub(super) struct BucketMetrics {
    /// Requests at each stage.
    pub(super) counts: Stages,
    /// The request limit of each stage.
    pub(super) limits: Stages,
    pub(super) received: Counter,
    pub(super) admitted_direct: Counter,
    pub(super) admitted_queue: Counter,
    /// Rejections of each scope; with reasons on, those for a full queue.
    pub(super) rejected_rank: Counter,
    pub(super) rejected_worker: Counter,
    /// Rejections of each scope for a deadline, with reasons on.
    pub(super) expired_rank: Counter,
    pub(super) expired_worker: Counter,
    /// Rejections of each scope of displaced requests, with reasons on.
    pub(super) displaced_rank: Counter,
    pub(super) displaced_worker: Counter,
    /// Rejections by controlled delay (always worker-scoped), when it is on.
    pub(super) shed_worker: Counter,
    /// Rejections for a shutdown or too many body reads, possible with any
    /// configuration,
    /// registered at the first; `None` when the bucket records nothing.
    pub(super) rare: Option<Rare>,
    /// Refusals of a tenant over its limit, when tenants are limited.
    pub(super) rejected_tenant: Counter,
    /// Whether the rejection series carry a `reason` label.
    pub(super) reasons: bool,
    pub(super) cancelled: Counter,
    pub(super) queue_wait: Histogram,
    pub(super) engine_waiting_time: Histogram,
    pub(super) oldest_wait: Gauge,
    /// The saturation gauge, when it is recorded.
    pub(super) saturation: Gauge,
    pub(super) tokens: Option<TokenMetrics>,
    /// One per configured priority band, lowest first.
    pub(super) bands: Vec<BandMetrics>,
    /// The latest events applied, so that observations racing each other
    /// out of the gate leave the latest values behind.
    pub(super) applied: Mutex<Applied>,
}

#[derive(Default)]
pub(super) struct Applied {
    pub(super) counts: u64,
    pub(super) limits: u64,
    /// The latest event whose worker saturation was set (the unranked
    /// bucket's series shows the worker's).
    pub(super) saturation: u64,
    /// The values last written to the handles (`None`: never written), so
    /// that an event writes only the series whose values it changed: an
    /// arrival changes three or four of some twenty.
    pub(super) written: Written,
}

/// The values a bucket's handles were last set to.
#[derive(Default)]
pub(super) struct Written {
    pub(super) counts: Option<Counts>,
    pub(super) oldest_wait: Option<f64>,
    pub(super) saturation: Option<f64>,
    /// The counters, in the order [`BucketMetrics::counters`] gives them.
    pub(super) counters: Option<[u64; COUNTERS]>,
    /// Queued requests and tally of each band, lowest first; grown to the
    /// configured bands at the first write.
    pub(super) bands: Vec<(Option<usize>, Option<BandTally>)>,
    /// The counters of [`Rare`], in its order (0: never written).
    pub(super) rare: [u64; RARE.len()],
}

/// Reads one count of a tally.
type CountOf = fn(&Tally) -> u64;

/// The reasons of rejection possible whatever the configuration, and
/// rare (the gate shut down; a request turned away in front of it), with
/// their tally: always worker-scoped.
const RARE: [(&str, CountOf); 2] = [
    ("shutdown", |tally| tally.shutdown_worker),
    ("body_reads", |tally| tally.body_reads_worker),
];

/// The `rejection_total` series of the [`RARE`] reasons (the server
/// shutting down, too many bodies being read). Each is registered at the
/// first such rejection, not with the bucket: most servers never see one,
/// and a series at 0 for each would crowd every exposition. They always
/// carry a `reason` label (whether or not the other rejection series do),
/// so that they never add to the series of a full queue.
pub(super) struct Rare {
    name: String,
    dp_rank: String,
    counters: [OnceLock<Counter>; RARE.len()],
}

impl Rare {
    /// Sets each counter from `tally` where it grew past `written`
    /// (`every`: where it is not 0), registering it first if need be.
    fn set(&self, tally: &Tally, written: &mut [u64; RARE.len()], every: bool) {
        for (at, (reason, count)) in RARE.iter().enumerate() {
            let value = count(tally);
            if value == 0 || (!every && value <= written[at]) {
                continue;
            }
            let counter = self.counters[at].get_or_init(|| {
                let register = || {
                    metrics::counter!(self.name.clone(), "dp_rank" => self.dp_rank.clone(), "scope" => "worker", "reason" => *reason)
                };
                catch_unwind(AssertUnwindSafe(register)).unwrap_or_else(|_| Counter::noop())
            });
            contain(|| counter.absolute(value));
            written[at] = written[at].max(value);
        }
    }
}

/// How many counters a bucket has (each scope and reason of rejection
/// one, with reasons off some are always 0).
pub(super) const COUNTERS: usize = 12;

impl BucketMetrics {
    /// Registers the series of one `dp_rank` value with the current
    /// recorder; should the recorder panic, the bucket records nothing.
    pub(super) fn register(names: &Names, shape: &Shape, rank: Option<u32>) -> Self {
        let register = || Self::try_register(names, shape, rank);
        catch_unwind(AssertUnwindSafe(register)).unwrap_or_else(|_| {
            tracing::warn!(
                ?rank,
                "the metrics recorder panicked registering the gate's series"
            );
            Self::noop()
        })
    }

    pub(super) fn noop() -> Self {
        BucketMetrics {
            counts: Stages::noop(),
            limits: Stages::noop(),
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
            rare: None,
            rejected_tenant: Counter::noop(),
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

    pub(super) fn try_register(names: &Names, shape: &Shape, rank: Option<u32>) -> Self {
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
            counts: Stages::of(
                [
                    &names.engine_request_count,
                    &names.engine_request_waiting_count,
                    &names.request_queue_count,
                ]
                .map(gauge),
            ),
            limits: Stages::of(
                [
                    &names.engine_request_limit,
                    &names.engine_request_waiting_limit,
                    &names.request_queue_limit,
                ]
                .map(gauge),
            ),
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
            rare: Some(Rare {
                name: names.rejection_total.clone(),
                dp_rank: dp_rank.clone(),
                counters: Default::default(),
            }),
            rejected_tenant: match shape.tenants {
                true => because("tenant", "tenant_limit"),
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
    pub(super) fn counters(&self, tally: &Tally) -> [(&Counter, u64); COUNTERS] {
        // Shutdowns and body reads have series of their own ([`Rare`]),
        // whatever the configuration.
        let rare: u64 = RARE.iter().map(|(_, count)| count(tally)).sum();
        let (rejected_rank, rejected_worker) = if self.reasons {
            (
                tally.rejected_rank - tally.expired_rank - tally.displaced_rank,
                tally.rejected_worker
                    - tally.expired_worker
                    - tally.displaced_worker
                    - tally.shed_worker
                    - rare,
            )
        } else {
            (tally.rejected_rank, tally.rejected_worker - rare)
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
            (&self.rejected_tenant, tally.rejected_tenant),
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
    pub(super) fn apply(
        &self,
        seq: u64,
        view: &BucketView,
        tally: bool,
        limits: Option<(Limits, usize)>,
    ) {
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
                self.counts.engine.set(counts.engine_requests as f64);
            }
            if changed(|counts| counts.engine_waiting) {
                self.counts.engine_waiting.set(counts.engine_waiting as f64);
            }
            if changed(|counts| counts.queued) {
                self.counts.queue.set(counts.queued as f64);
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
            if let Some(rare) = &self.rare {
                rare.set(&view.tally, &mut written.rare, every);
            }
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
    pub(super) fn set_worker_saturation(&self, seq: u64, saturation: f64) {
        let mut applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        if seq > applied.saturation {
            applied.saturation = seq;
            if applied.written.saturation != Some(saturation) {
                self.saturation.set(saturation);
                applied.written.saturation = Some(saturation);
            }
        }
    }

    pub(super) fn set_limits(&self, limits: Limits, ranks: usize) {
        let combined = |per_rank: usize| per_rank.saturating_mul(ranks) as f64;
        let per_rank = [
            limits.engine_request_limit,
            limits.engine_request_waiting_limit,
            limits.request_queue_limit,
        ];
        self.limits.set(per_rank.map(combined));
        if let Some(tokens) = &self.tokens {
            tokens.set_limits(&limits, ranks);
        }
    }
}
