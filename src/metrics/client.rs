//! The client's view (behaviour §6): what the HTTP layer measures of each
//! admitted request — its time to first token and the gaps between its
//! content chunks as the client receives them, its end-to-end time, and
//! whether it met its objectives — by priority band and tenant class, two
//! labels whose values the configuration bounds, whatever clients send.
//!
//! The gate's own series are set from its tallies; these are recorded as
//! the layer sees each request, with handles registered with the gate's
//! other series (the same recorder, the same late-recorder rule): a
//! request holds one `Arc` of its label set's handles, and each content
//! chunk costs one clock read and one histogram record.

use std::collections::{BTreeSet, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use metrics::{Counter, Histogram};

use super::families::Names;
use crate::config::{AdmissionConfig, Clock};
use crate::gate::Tenant;
use crate::gate::observe::contain;

/// The `tenant_class` of every tenant the configuration does not name, and
/// of requests without a tenant.
pub(super) const OTHER_TENANTS: &str = "other";

/// The values the two labels take, from the configuration: the configured
/// priority bands (none: no `priority` label), and the tenants named in
/// tenant weights or per-tenant limits, plus [`OTHER_TENANTS`].
#[derive(Debug, Clone, Default)]
pub(super) struct Labels {
    /// The configured bands, ascending.
    bands: Vec<i32>,
    /// The named tenants, sorted: the `tenant_class` of class `i`.
    named: Vec<String>,
    /// Each named tenant's class.
    classes: HashMap<Tenant, usize>,
}

impl Labels {
    pub(super) fn of(config: &AdmissionConfig) -> Self {
        let named: BTreeSet<&str> = config
            .tenant_weights()
            .map(|(name, _)| name)
            .chain(config.tenant_limits.by_name.keys().map(String::as_str))
            .collect();
        let named: Vec<String> = named.into_iter().map(str::to_owned).collect();
        let classes = named
            .iter()
            .enumerate()
            .map(|(class, name)| (Tenant::new(name), class))
            .collect();
        Labels {
            bands: config.priority_bands.clone(),
            named,
            classes,
        }
    }

    /// How many label sets there are: bands (at least one) × (named
    /// tenants + the others).
    pub(super) fn sets(&self) -> usize {
        self.bands.len().max(1) * (self.named.len() + 1)
    }

    /// The label set of a request: the band it arrived in (the highest at
    /// or below its priority, the lowest if below them all), and its
    /// tenant's class.
    pub(super) fn index(&self, priority: i32, tenant: Option<Tenant>) -> usize {
        let band = self
            .bands
            .partition_point(|&band| band <= priority)
            .saturating_sub(1);
        let class = tenant
            .and_then(|tenant| self.classes.get(&tenant).copied())
            .unwrap_or(self.named.len());
        band * (self.named.len() + 1) + class
    }

    /// The labels of each set, in the order of [`index`](Self::index).
    fn each(&self) -> Vec<Vec<(&'static str, String)>> {
        let priorities: Vec<Option<String>> = match self.bands.is_empty() {
            true => vec![None],
            false => self
                .bands
                .iter()
                .map(|band| Some(band.to_string()))
                .collect(),
        };
        let classes = self.named.iter().map(String::as_str).chain([OTHER_TENANTS]);
        let mut sets = Vec::with_capacity(self.sets());
        for priority in &priorities {
            for class in classes.clone() {
                let mut labels = Vec::with_capacity(2);
                if let Some(priority) = priority {
                    labels.push(("priority", priority.clone()));
                }
                labels.push(("tenant_class", class.to_owned()));
                sets.push(labels);
            }
        }
        sets
    }
}

/// The handles of one label set.
pub(crate) struct ClientHandles {
    ttft: Histogram,
    inter_token: Histogram,
    duration: Histogram,
    goodput: Counter,
    finished: Counter,
}

impl ClientHandles {
    fn noop() -> Self {
        ClientHandles {
            ttft: Histogram::noop(),
            inter_token: Histogram::noop(),
            duration: Histogram::noop(),
            goodput: Counter::noop(),
            finished: Counter::noop(),
        }
    }
}

/// The handles of every label set, registered with the gate's other
/// series.
pub(super) struct ClientSeries {
    sets: Vec<Arc<ClientHandles>>,
}

impl ClientSeries {
    /// Registers every label set with the current recorder; should the
    /// recorder panic, they record nothing.
    pub(super) fn register(names: &Names, labels: &Labels) -> Self {
        let sets = labels
            .each()
            .into_iter()
            .map(|set| {
                let register = || {
                    use metrics::{counter, histogram};
                    ClientHandles {
                        ttft: histogram!(
                            names.client_time_to_first_token_seconds.clone(),
                            set.as_slice()
                        ),
                        inter_token: histogram!(
                            names.client_inter_token_latency_seconds.clone(),
                            set.as_slice()
                        ),
                        duration: histogram!(
                            names.client_request_duration_seconds.clone(),
                            set.as_slice()
                        ),
                        goodput: counter!(names.goodput_requests_total.clone(), set.as_slice()),
                        finished: counter!(names.finished_requests_total.clone(), set.as_slice()),
                    }
                };
                let handles = catch_unwind(AssertUnwindSafe(register)).unwrap_or_else(|_| {
                    tracing::warn!("the metrics recorder panicked registering the client's series");
                    ClientHandles::noop()
                });
                Arc::new(handles)
            })
            .collect();
        ClientSeries { sets }
    }

    pub(super) fn get(&self, index: usize) -> Option<&Arc<ClientHandles>> {
        self.sets.get(index)
    }
}

/// What the layer measures a request against: the configured objectives,
/// and the clock it measures with (the gate's).
#[derive(Debug, Clone, Default)]
pub(super) struct ClientConfig {
    pub(super) objectives: Objectives,
    pub(super) clock: Clock,
}

impl ClientConfig {
    pub(super) fn of(config: &AdmissionConfig) -> Self {
        ClientConfig {
            objectives: Objectives {
                ttft: config.ttft_objective,
                inter_token: config.inter_token_objective,
                deadline: None,
            },
            clock: config.clock.clone(),
        }
    }
}

/// The objectives a finished request must meet to count as goodput; each
/// one not set is met.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Objectives {
    /// The time-to-first-token objective.
    pub(crate) ttft: Option<Duration>,
    /// The mean gap between content chunks after the first token.
    pub(crate) inter_token: Option<Duration>,
    /// The request's own deadline, from its arrival, for its whole response.
    pub(crate) deadline: Option<Duration>,
}

/// How a finished request went, as the layer saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Arrival to the first content token, or to the end of a response
    /// that ended without one; `None` if it failed or was cut off first.
    pub(crate) ttft: Option<Duration>,
    /// The mean gap between successive content chunks: from the first
    /// token to the last content chunk, over the gaps between them (zero
    /// for a response of one chunk or none). Benchmark clients call it the
    /// inter-token latency of the request (aiperf) or its time per output
    /// token (vLLM's benchmarks, DistServe's goodput).
    pub(crate) mean_gap: Duration,
    /// Arrival to the end (or the drop) of the response.
    pub(crate) duration: Duration,
    /// Whether the response reached its end (not an error, not a drop).
    pub(crate) completed: bool,
    /// Whether the engine answered with a server error (5xx).
    pub(crate) server_error: bool,
}

impl Objectives {
    /// Whether `outcome` met every objective: it completed without a
    /// server error, its first token came within the TTFT objective, the
    /// mean gap between its content chunks was within the inter-token
    /// objective, and it ended within its deadline.
    pub(crate) fn met(&self, outcome: &Outcome) -> bool {
        let within = |measured: Duration, objective: Option<Duration>| {
            objective.is_none_or(|objective| measured <= objective)
        };
        outcome.completed
            && !outcome.server_error
            && outcome.ttft.is_some_and(|ttft| within(ttft, self.ttft))
            && within(outcome.mean_gap, self.inter_token)
            && within(outcome.duration, self.deadline)
    }
}

/// A request that arrived at the layer while metrics are recorded: when,
/// the handles of its label set, and its objectives.
pub(crate) struct Started {
    arrived: Instant,
    handles: Arc<ClientHandles>,
    objectives: Objectives,
    clock: Clock,
}

impl super::Recorder {
    /// An HTTP layer admits through the gate: registers the client's view
    /// with the gate's series, now if they are registered (with the
    /// recorder current now), or when they are.
    pub(crate) fn want_client(&self) {
        self.client_wanted.store(true, Ordering::Relaxed);
        if !self.looking.load(Ordering::Relaxed) {
            let series = self.late.get().unwrap_or(&self.built);
            series.client(&self.names, &self.shape);
        }
    }

    /// The start of the client's view of a request arriving now, of
    /// `priority`, `tenant` and `deadline`; `None` while nothing records
    /// (no recorder has been found yet: the gate's next event looks for
    /// one, and registers the series).
    pub(crate) fn client_arrival(
        &self,
        priority: i32,
        tenant: Option<Tenant>,
        deadline: Option<Duration>,
    ) -> Option<Started> {
        if self.looking.load(Ordering::Relaxed) {
            return None;
        }
        let series = self.late.get().unwrap_or(&self.built);
        let client = series.client(&self.names, &self.shape);
        let handles = client.get(self.shape.client.index(priority, tenant))?;
        Some(Started {
            arrived: self.client.clock.now(),
            handles: Arc::clone(handles),
            objectives: Objectives {
                deadline,
                ..self.client.objectives
            },
            clock: self.client.clock.clone(),
        })
    }
}

impl Started {
    /// The request was admitted: its response is measured from now on.
    pub(crate) fn admitted(self) -> Measuring {
        Measuring {
            started: self,
            first_token: None,
            last_chunk: None,
            gaps: 0,
            ttft: None,
            server_error: false,
        }
    }
}

/// An admitted request's response, being measured.
pub(crate) struct Measuring {
    started: Started,
    /// When the first token passed; `None` before it.
    first_token: Option<Instant>,
    /// When the latest content chunk passed; `None` before the first token.
    last_chunk: Option<Instant>,
    /// The gaps measured: content chunks after the first token.
    gaps: u32,
    ttft: Option<Duration>,
    server_error: bool,
}

impl Measuring {
    /// The response's head: a server error never meets its objectives.
    pub(crate) fn server_error(&mut self, server_error: bool) {
        self.server_error = server_error;
    }

    /// A content chunk passed (the first token, or one after it): the
    /// first records the time to first token, each later one its gap from
    /// the one before. One clock read, one record, nothing allocated.
    #[inline]
    pub(crate) fn chunk(&mut self) {
        let now = self.started.clock.now();
        let handles = &self.started.handles;
        match self.last_chunk {
            None => {
                let ttft = now.saturating_duration_since(self.started.arrived);
                self.ttft = Some(ttft);
                self.first_token = Some(now);
                contain(|| handles.ttft.record(ttft.as_secs_f64()));
            }
            Some(last) => {
                let gap = now.saturating_duration_since(last);
                self.gaps = self.gaps.saturating_add(1);
                contain(|| handles.inter_token.record(gap.as_secs_f64()));
            }
        }
        self.last_chunk = Some(now);
    }

    /// The response ended (`completed`: it reached its end; otherwise it
    /// failed or was dropped): records its duration, counts it finished,
    /// and as goodput if it met its objectives. A response that completed
    /// without a token has its time to first token at its end, as waiting
    /// ends at completion (behaviour §2.5).
    pub(crate) fn finish(mut self, completed: bool) {
        let now = self.started.clock.now();
        let duration = now.saturating_duration_since(self.started.arrived);
        let handles = &self.started.handles;
        if completed && self.ttft.is_none() {
            self.ttft = Some(duration);
            contain(|| handles.ttft.record(duration.as_secs_f64()));
        }
        let mean_gap = match (self.first_token, self.last_chunk) {
            (Some(first), Some(last)) if self.gaps > 0 => {
                last.saturating_duration_since(first) / self.gaps
            }
            _ => Duration::ZERO,
        };
        let outcome = Outcome {
            ttft: self.ttft,
            mean_gap,
            duration,
            completed,
            server_error: self.server_error,
        };
        let met = self.started.objectives.met(&outcome);
        contain(|| {
            handles.duration.record(duration.as_secs_f64());
            handles.finished.increment(1);
            if met {
                handles.goodput.increment(1);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn good() -> Outcome {
        Outcome {
            ttft: Some(100 * MS),
            mean_gap: 20 * MS,
            duration: 500 * MS,
            completed: true,
            server_error: false,
        }
    }

    #[test]
    fn a_request_without_objectives_meets_them_if_it_completes_cleanly() {
        let none = Objectives::default();
        assert!(none.met(&good()));
        assert!(!none.met(&Outcome {
            completed: false,
            ..good()
        }));
        assert!(!none.met(&Outcome {
            server_error: true,
            ..good()
        }));
    }

    #[test]
    fn each_objective_is_met_at_its_bound_and_missed_past_it() {
        let objectives = Objectives {
            ttft: Some(100 * MS),
            inter_token: Some(20 * MS),
            deadline: Some(500 * MS),
        };
        assert!(objectives.met(&good()), "every measure at its bound");
        let late_token = Outcome {
            ttft: Some(101 * MS),
            ..good()
        };
        let long_gap = Outcome {
            mean_gap: 21 * MS,
            ..good()
        };
        let past_deadline = Outcome {
            duration: 501 * MS,
            ..good()
        };
        for missed in [late_token, long_gap, past_deadline] {
            assert!(!objectives.met(&missed), "{missed:?}");
        }
    }

    #[test]
    fn labels_are_the_configured_bands_times_the_named_tenants_and_the_others() {
        let config = AdmissionConfig::new()
            .priority_bands([0, 10])
            .tenant_weight("chat", 4)
            .tenant_limits("batch", crate::TenantLimits::new().requests(1))
            .tenant_weight("batch", 1);
        let labels = Labels::of(&config);
        assert_eq!(labels.sets(), 2 * 3);
        let each = labels.each();
        assert_eq!(each.len(), labels.sets());
        let at = |priority, tenant: Option<&str>| {
            each[labels.index(priority, tenant.map(Tenant::new))].clone()
        };
        let set = |priority: &str, class: &str| {
            vec![
                ("priority", priority.to_owned()),
                ("tenant_class", class.to_owned()),
            ]
        };
        assert_eq!(at(3, Some("chat")), set("0", "chat"));
        assert_eq!(at(-5, Some("batch")), set("0", "batch"), "below every band");
        assert_eq!(at(10, Some("acme")), set("10", "other"));
        assert_eq!(at(99, None), set("10", "other"));
    }

    #[test]
    fn without_bands_there_is_no_priority_label() {
        let labels = Labels::of(&AdmissionConfig::new());
        assert_eq!(labels.sets(), 1);
        assert_eq!(labels.index(-7, Some(Tenant::new("acme"))), 0);
        assert_eq!(
            labels.each(),
            vec![vec![("tenant_class", OTHER_TENANTS.to_owned())]]
        );
    }
}
