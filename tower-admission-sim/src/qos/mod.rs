//! The quality-of-service evaluation behind `examples/qos.rs` (behaviour §8):
//! the seed's incident — a chatbot's TTFT rises when batch summarisation
//! starts — and weighted fairness between two tenants, in front of the same
//! simulated engine, in virtual time; and the noisy tenant behind
//! `examples/noisy_tenant.rs` ([`QosConfig::noisy_tenant`]): one tenant
//! floods long prompts beside a steady one, against per-tenant limits.
//!
//! A run is a set of [`Traffic`] streams (open-loop, seeded, each from its
//! own start time) sent through one [`Policy`]:
//!
//! | [`Policy`] | in front of the engine |
//! |---|---|
//! | [`NoAdmission`](Policy::NoAdmission) | nothing: every request joins the engine's own unbounded queue |
//! | [`Gate`](Policy::Gate) | a [`Gate`](tower_admission::Gate) with its defaults, and requests that carry neither priority nor tenant: one FIFO queue |
//! | [`GateQos`](Policy::GateQos) | the gate with [`QosConfig::priority_bands`], [`QosConfig::aging_interval`] and [`QosConfig::tenant_weights`]; requests carry their traffic's priority and tenant |
//! | [`GateQosWaitLimit`](Policy::GateQosWaitLimit) | the same and a request queue wait limit ([`QosConfig::queue_wait_limit`]): a request predicted to wait longer (counting only its band and higher ones) is rejected on arrival, and one that waits longer leaves the queue |
//! | [`GateQosTokenBudget`](Policy::GateQosTokenBudget) | the same as the wait-limit row and an engine waiting token limit ([`QosConfig::token_budget`]): prompt tokens admitted but not yet prefilled |
//! | [`GateTenantLimits`](Policy::GateTenantLimits) | the gate of [`GateQos`](Policy::GateQos) with per-tenant limits for every tenant ([`QosConfig::tenant_request_limit`], [`QosConfig::tenant_token_limit`], [`QosConfig::tenant_queue_limit`]) and, if set, a TTFT objective ([`QosConfig::ttft_objective`]) |
//!
//! Every request tells the gate its cost (prompt tokens, and its output
//! length as `max_tokens`), so fair shares between tenants are by tokens.
//! The capacity of each traffic shape is measured on its own with
//! [`measure_capacity`](super::sweep::measure_capacity) (the engine kept
//! full by closed-loop clients), and a traffic's rate is its load × that
//! capacity. Goodput of a class counts the requests that completed within
//! its [`Slo`]; total goodput is the sum over classes of each class's
//! goodput as a fraction of its own capacity: 1.0 is the engine doing as
//! much good work as it could for either class alone.
//!
//! Clients are patient: they wait for every request and never retry. The
//! run records every request that arrives before [`QosConfig::record_until`]
//! and lasts until each of them has completed or been rejected, at most
//! [`QosConfig::drain`] longer (arrivals go on meanwhile, so the load stays
//! the same); a latency still open then is a lower bound.

use std::fmt;
use std::time::Duration;

use super::config::EngineConfig;
use super::measure::{Percentile, Slo};
use super::time;
use super::workload::Lengths;
use tower_admission::{AdmissionConfig, RejectionReason, TenantLimits};

pub use self::simulate::run;

mod simulate;

/// What stands between the clients and the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Nothing: requests go straight into the engine's queue.
    NoAdmission,
    /// The gate with its defaults; requests carry no priority or tenant.
    Gate,
    /// The gate with bands, aging and tenant weights.
    GateQos,
    /// [`Policy::GateQos`] and a request queue wait limit.
    GateQosWaitLimit,
    /// [`Policy::GateQosWaitLimit`] and an engine waiting token limit.
    GateQosTokenBudget,
    /// [`Policy::GateQos`] with per-tenant limits and the TTFT objective
    /// (the noisy-tenant evaluation; not in [`Policy::ALL`]).
    GateTenantLimits,
}

impl Policy {
    /// Every policy, in table order.
    pub const ALL: [Policy; 5] = [
        Policy::NoAdmission,
        Policy::Gate,
        Policy::GateQos,
        Policy::GateQosWaitLimit,
        Policy::GateQosTokenBudget,
    ];

    /// A short name for tables and plots.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::NoAdmission => "no admission control",
            Policy::Gate => "gate, FIFO (defaults)",
            Policy::GateQos => "gate, QoS",
            Policy::GateQosWaitLimit => "gate, QoS + wait limit",
            Policy::GateQosTokenBudget => "gate, QoS + wait + tokens",
            Policy::GateTenantLimits => "gate, tenant limits",
        }
    }

    /// Whether requests tell the gate their priority and tenant.
    pub fn uses_qos(&self) -> bool {
        matches!(
            self,
            Policy::GateQos
                | Policy::GateQosWaitLimit
                | Policy::GateQosTokenBudget
                | Policy::GateTenantLimits
        )
    }

    /// The gate's configuration under this policy; `None` without a gate.
    /// The gate keeps time on the simulator's clock.
    pub fn gate_config(&self, config: &QosConfig) -> Option<AdmissionConfig> {
        let qos = || {
            let mut gate = AdmissionConfig::new()
                .priority_bands(config.priority_bands.iter().copied())
                .clock(|| time::now().into_std());
            if let Some(interval) = config.aging_interval {
                gate = gate.aging_interval(interval);
            }
            for &(tenant, weight) in &config.tenant_weights {
                gate = gate.tenant_weight(tenant, weight);
            }
            gate
        };
        match self {
            Policy::NoAdmission => None,
            Policy::Gate => Some(AdmissionConfig::new()),
            Policy::GateQos => Some(qos()),
            Policy::GateQosWaitLimit => {
                Some(qos().request_queue_wait_limit(config.queue_wait_limit))
            }
            Policy::GateQosTokenBudget => Some(
                qos()
                    .request_queue_wait_limit(config.queue_wait_limit)
                    .engine_waiting_token_limit(config.token_budget),
            ),
            Policy::GateTenantLimits => {
                let mut gate = qos();
                if let Some(n) = config.tenant_request_limit {
                    gate = gate.tenant_request_limit(n);
                }
                if let Some(n) = config.tenant_token_limit {
                    gate = gate.tenant_token_limit(n);
                }
                if let Some(n) = config.tenant_queue_limit {
                    gate = gate.tenant_queue_limit(n);
                }
                for &(tenant, limits) in &config.tenant_overrides {
                    gate = gate.tenant_limits(tenant, limits);
                }
                if let Some(objective) = config.ttft_objective {
                    gate = gate.ttft_objective(objective);
                }
                Some(gate)
            }
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// One open-loop stream of requests: a class of traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct Traffic {
    /// A short name (`chat`, `batch`, ...).
    pub name: &'static str,
    /// Offered load, as a multiple of the engine's capacity for requests of
    /// this shape alone.
    pub load: f64,
    /// When the stream starts, from the start of the run.
    pub start: Duration,
    /// Prompt lengths.
    pub prompt_tokens: Lengths,
    /// Output lengths.
    pub output_tokens: Lengths,
    /// Its priority, told to the gate under the QoS policies.
    pub priority: i32,
    /// Its tenant, told to the gate under the QoS policies.
    pub tenant: &'static str,
    /// What makes one of its requests good.
    pub slo: Slo,
}

impl Traffic {
    /// Interactive chat: ShareGPT-like lengths, priority 1, tenant `chat`;
    /// good within TTFT ≤ 1 s and TPOT ≤ 100 ms.
    pub fn chat(load: f64) -> Traffic {
        Traffic {
            name: "chat",
            load,
            start: Duration::ZERO,
            prompt_tokens: Lengths::sharegpt_prompt(),
            output_tokens: Lengths::sharegpt_output(),
            priority: 1,
            tenant: "chat",
            slo: Slo {
                ttft: Duration::from_secs(1),
                tpot: Duration::from_millis(100),
            },
        }
    }

    /// Batch summarisation: long documents (lognormal, mean 3000 tokens,
    /// sigma 0.5, clipped to 1024..=8192) and short summaries (mean 200
    /// tokens, sigma 0.5, 16..=1024), priority 0, tenant `batch`; good
    /// within TTFT ≤ 30 s and TPOT ≤ 100 ms (a job that can wait, not
    /// forever).
    pub fn batch(load: f64, start: Duration) -> Traffic {
        Traffic {
            name: "batch",
            load,
            start,
            prompt_tokens: Lengths::LogNormal {
                mean: 3000.0,
                sigma: 0.5,
                min: 1024,
                max: 8192,
            },
            output_tokens: Lengths::LogNormal {
                mean: 200.0,
                sigma: 0.5,
                min: 16,
                max: 1024,
            },
            priority: 0,
            tenant: "batch",
            slo: Slo {
                ttft: Duration::from_secs(30),
                tpot: Duration::from_millis(100),
            },
        }
    }

    /// The noisy-tenant incident's steady tenant: short chat turns (prompts
    /// lognormal mean 150 tokens, sigma 0.2, clipped to 100..=200; outputs
    /// the same), priority 0, tenant `steady`; good when its first token
    /// comes within `ttft` (the TTFT objective alone: the TPOT objective is
    /// left unbounded).
    pub fn steady(load: f64, ttft: Duration) -> Traffic {
        let short = Lengths::LogNormal {
            mean: 150.0,
            sigma: 0.2,
            min: 100,
            max: 200,
        };
        Traffic {
            name: "steady",
            load,
            start: Duration::ZERO,
            prompt_tokens: short,
            output_tokens: short,
            priority: 0,
            tenant: "steady",
            slo: Slo {
                ttft,
                tpot: Duration::MAX,
            },
        }
    }

    /// The noisy-tenant incident's flood: long prompts (lognormal mean 4000
    /// tokens, sigma 0.4, clipped to 2048..=8192) and short answers (mean
    /// 200, sigma 0.5, 16..=1024), priority 0 like everyone, tenant
    /// `flood`, from `start`; good within TTFT ≤ 30 s (TPOT unbounded).
    pub fn flood(load: f64, start: Duration) -> Traffic {
        Traffic {
            name: "flood",
            load,
            start,
            prompt_tokens: Lengths::LogNormal {
                mean: 4000.0,
                sigma: 0.4,
                min: 2048,
                max: 8192,
            },
            output_tokens: Lengths::LogNormal {
                mean: 200.0,
                sigma: 0.5,
                min: 16,
                max: 1024,
            },
            priority: 0,
            tenant: "flood",
            slo: Slo {
                ttft: Duration::from_secs(30),
                tpot: Duration::MAX,
            },
        }
    }

    fn shape(&self) -> (Lengths, Lengths) {
        (self.prompt_tokens, self.output_tokens)
    }
}

/// Everything a QoS evaluation depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct QosConfig {
    /// The simulated engine (one rank).
    pub engine: EngineConfig,
    /// The streams of requests.
    pub traffic: Vec<Traffic>,
    /// The gate's priority bands under the QoS policies.
    pub priority_bands: Vec<i32>,
    /// The gate's aging interval under the QoS policies.
    pub aging_interval: Option<Duration>,
    /// Tenant weights under the QoS policies (tenants not named weigh 1).
    pub tenant_weights: Vec<(&'static str, u32)>,
    /// The request queue wait limit of [`Policy::GateQosWaitLimit`] and
    /// [`Policy::GateQosTokenBudget`].
    pub queue_wait_limit: Duration,
    /// The engine waiting token limit of [`Policy::GateQosTokenBudget`].
    pub token_budget: usize,
    /// The engine request limit of every tenant under
    /// [`Policy::GateTenantLimits`] (off when `None`).
    pub tenant_request_limit: Option<usize>,
    /// The engine token limit (prompt plus maximum output) of every tenant
    /// under [`Policy::GateTenantLimits`] (off when `None`).
    pub tenant_token_limit: Option<usize>,
    /// The queue limit of every tenant under [`Policy::GateTenantLimits`]
    /// (off when `None`).
    pub tenant_queue_limit: Option<usize>,
    /// Limits of tenants by name under [`Policy::GateTenantLimits`], over
    /// the ones for every tenant (a limit an override leaves unset is the
    /// default's).
    pub tenant_overrides: Vec<(&'static str, TenantLimits)>,
    /// The gate's TTFT objective under [`Policy::GateTenantLimits`] (off
    /// when `None`).
    pub ttft_objective: Option<Duration>,
    /// Requests arriving before this are recorded (and waited for).
    pub record_until: Duration,
    /// How long past [`record_until`](Self::record_until) a run waits for
    /// the recorded requests to finish.
    pub drain: Duration,
    /// The policies to compare.
    pub policies: Vec<Policy>,
    /// Seed of the workload: every policy sees the same requests.
    pub seed: u64,
    /// Threads that run policies in parallel (at least 1).
    pub threads: usize,
}

impl QosConfig {
    /// The seed's incident on the default engine (256 sequences, one H100
    /// rank): chat at 0.6× its capacity from the start; batch summarisation
    /// at 2× its capacity from 30 s; recorded until 90 s. Bands 0 and 1,
    /// aging every 60 s; a 10 s queue wait limit; a token budget of 2048
    /// prompt tokens (one full prefill step).
    pub fn incident() -> QosConfig {
        let batch_start = Duration::from_secs(30);
        QosConfig {
            engine: EngineConfig::default(),
            traffic: vec![Traffic::chat(0.6), Traffic::batch(2.0, batch_start)],
            priority_bands: vec![0, 1],
            aging_interval: Some(Duration::from_secs(60)),
            tenant_weights: Vec::new(),
            queue_wait_limit: Duration::from_secs(10),
            token_budget: 2048,
            tenant_request_limit: None,
            tenant_token_limit: None,
            tenant_queue_limit: None,
            tenant_overrides: Vec::new(),
            ttft_objective: None,
            record_until: Duration::from_secs(90),
            drain: Duration::from_secs(120),
            policies: Policy::ALL.to_vec(),
            seed: 1,
            threads: std::thread::available_parallelism().map_or(1, usize::from),
        }
    }

    /// Weighted fairness: tenants `a` (weight 3) and `b` (weight 1) at the
    /// same priority, ShareGPT-like requests, each at 1.5× capacity;
    /// recorded for 60 s. No bands and no aging; a 5 s queue wait limit.
    pub fn fairness() -> QosConfig {
        let tenant = |name: &'static str| Traffic {
            name,
            priority: 0,
            tenant: name,
            slo: Slo::default(),
            ..Traffic::chat(1.5)
        };
        QosConfig {
            traffic: vec![tenant("a"), tenant("b")],
            priority_bands: Vec::new(),
            aging_interval: None,
            tenant_weights: vec![("a", 3)],
            queue_wait_limit: Duration::from_secs(5),
            record_until: Duration::from_secs(60),
            drain: Duration::from_secs(60),
            policies: vec![Policy::Gate, Policy::GateQos, Policy::GateQosWaitLimit],
            ..QosConfig::incident()
        }
    }

    /// The noisy-tenant incident (source documents: "prevent one tenant
    /// with long prompts from monopolizing KV blocks and blocking others;
    /// bound requests and estimated token-work budgets per tenant") on the
    /// default engine (256 sequences, 384,000 tokens of KV, one H100 rank):
    /// tenant `steady` at 0.4× its capacity from the start, tenant `flood`
    /// at 3× its capacity from 30 s; recorded until 90 s. One priority, no
    /// aging, equal tenant weights. The tenant-limits row: every tenant may
    /// hold 128 engine requests (half of `max_num_seqs`), 192,000 engine
    /// tokens (half the KV) and 8 queued requests (about what the flood's
    /// share drains in the objective), and the gate has a 1 s TTFT
    /// objective (steady's).
    pub fn noisy_tenant() -> QosConfig {
        let objective = Duration::from_secs(1);
        let engine = EngineConfig::default();
        let kv_tokens = engine.kv_blocks * engine.block_size;
        QosConfig {
            traffic: vec![
                Traffic::steady(0.4, objective),
                Traffic::flood(3.0, Duration::from_secs(30)),
            ],
            priority_bands: Vec::new(),
            aging_interval: None,
            tenant_weights: Vec::new(),
            tenant_request_limit: Some(engine.max_num_seqs / 2),
            tenant_token_limit: Some(kv_tokens / 2),
            tenant_queue_limit: Some(8),
            ttft_objective: Some(objective),
            record_until: Duration::from_secs(90),
            drain: Duration::from_secs(120),
            policies: vec![Policy::Gate, Policy::GateQos, Policy::GateTenantLimits],
            engine,
            ..QosConfig::incident()
        }
    }

    /// When the traffic named `name` starts.
    ///
    /// # Panics
    ///
    /// If there is no such traffic.
    pub fn start_of(&self, name: &str) -> Duration {
        self.traffic[self.index_of(name)].start
    }

    fn index_of(&self, name: &str) -> usize {
        self.traffic
            .iter()
            .position(|traffic| traffic.name == name)
            .unwrap_or_else(|| panic!("no traffic named {name:?}"))
    }
}

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Index of its traffic in [`QosConfig::traffic`].
    pub traffic: usize,
    /// When it arrived, from the start of the run.
    pub arrival: Duration,
    /// Prompt plus output tokens: its cost as the gate saw it.
    pub engine_tokens: usize,
    /// When it was admitted (the engine took it), if it was.
    pub admitted: Option<Duration>,
    /// When its first token came, if it did.
    pub first_token: Option<Duration>,
    /// When its last token came, if it did.
    pub finished: Option<Duration>,
    /// Tokens it received.
    pub tokens: usize,
    /// When and why it was rejected, if it was.
    pub rejected: Option<(Duration, RejectionReason)>,
}

impl Outcome {
    /// Time to first token; `None` if it had none by the end (rejected, or
    /// still waiting).
    pub fn ttft(&self) -> Option<Duration> {
        Some(self.first_token? - self.arrival)
    }

    /// Time per output token after the first, once it completed.
    pub fn tpot(&self) -> Option<Duration> {
        let (first, finished) = (self.first_token?, self.finished?);
        let gaps = u32::try_from(self.tokens.saturating_sub(1)).unwrap_or(u32::MAX);
        Some((finished - first).checked_div(gaps).unwrap_or_default())
    }

    /// Completed within `slo`.
    pub fn good(&self, slo: Slo) -> bool {
        matches!((self.ttft(), self.tpot()), (Some(ttft), Some(tpot)) if ttft <= slo.ttft && tpot <= slo.tpot)
    }

    /// How long it waited for an answer: to its first token, or to its
    /// rejection; to `end` (a lower bound, `true`) if it had neither.
    pub fn wait(&self, end: Duration) -> (Duration, bool) {
        match (self.first_token, self.rejected) {
            (Some(at), _) | (None, Some((at, _))) => (at - self.arrival, false),
            (None, None) => (end - self.arrival, true),
        }
    }
}

/// One policy's run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The policy.
    pub policy: Policy,
    /// Every recorded request, in arrival order.
    pub outcomes: Vec<Outcome>,
    /// When the run ended, from its start.
    pub end: Duration,
    /// Preemptions in the engine over the run.
    pub preemptions: u64,
}

/// The result of an evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// The configuration it ran.
    pub config: QosConfig,
    /// The engine's capacity for each traffic's requests alone, requests
    /// per second, in [`QosConfig::traffic`] order.
    pub capacities: Vec<f64>,
    /// One run per policy, in [`QosConfig::policies`] order.
    pub runs: Vec<Run>,
}

/// The requests of one traffic that arrived in a span of time, as seen by
/// one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    /// Requests that arrived.
    pub arrived: usize,
    /// Of those, admitted (the engine took them).
    pub admitted: usize,
    /// Of those, rejected (any reason).
    pub rejected: usize,
    /// Of those, displaced from the queue by higher-priority arrivals.
    pub displaced: usize,
    /// Of those, rejected for their queue wait budget after waiting in the
    /// queue (the others rejected for it were predicted to miss it and
    /// turned away on arrival).
    pub expired: usize,
    /// Of those, completed within the traffic's objectives.
    pub good: usize,
    /// Good requests per second of the span.
    pub goodput: f64,
    /// Goodput as a fraction of the engine's capacity for this traffic.
    pub capacity_fraction: f64,
    /// Median time to first token of the requests not rejected.
    pub ttft_p50: Option<Percentile>,
    /// 95th percentile of the same.
    pub ttft_p95: Option<Percentile>,
    /// 95th percentile of the time from arrival to admission of the
    /// requests not rejected: the part of their TTFT spent in the gate's
    /// queue (the rest is the engine's: its own queue and prefill).
    pub queue_p95: Option<Percentile>,
    /// The longest wait for an answer (first token or rejection).
    pub longest_wait: Option<Percentile>,
}

impl Evaluation {
    /// The run of `policy`, if it ran.
    pub fn run(&self, policy: Policy) -> Option<&Run> {
        self.runs.iter().find(|run| run.policy == policy)
    }

    /// The engine's capacity for the traffic named `name`, requests per
    /// second.
    pub fn capacity(&self, name: &str) -> f64 {
        self.capacities[self.config.index_of(name)]
    }

    /// The requests of traffic `name` under `policy` that arrived in
    /// `from..until`.
    ///
    /// # Panics
    ///
    /// If `policy` did not run or there is no such traffic.
    pub fn slice(&self, policy: Policy, name: &str, from: Duration, until: Duration) -> Slice {
        let run = self.run(policy).expect("the policy ran");
        let index = self.config.index_of(name);
        let slo = self.config.traffic[index].slo;
        let outcomes: Vec<&Outcome> = run
            .outcomes
            .iter()
            .filter(|o| o.traffic == index && o.arrival >= from && o.arrival < until)
            .collect();
        let mut ttfts: Vec<(Duration, bool)> = outcomes
            .iter()
            .filter(|o| o.rejected.is_none())
            .map(|o| o.wait(run.end))
            .collect();
        let mut waits: Vec<(Duration, bool)> = outcomes.iter().map(|o| o.wait(run.end)).collect();
        let mut queued: Vec<(Duration, bool)> = outcomes
            .iter()
            .filter(|o| o.rejected.is_none())
            .map(|o| match o.admitted {
                Some(at) => (at - o.arrival, false),
                None => (run.end - o.arrival, true),
            })
            .collect();
        let good = outcomes.iter().filter(|o| o.good(slo)).count();
        let span = (until - from).as_secs_f64();
        let goodput = good as f64 / span;
        Slice {
            arrived: outcomes.len(),
            admitted: outcomes.iter().filter(|o| o.admitted.is_some()).count(),
            rejected: outcomes.iter().filter(|o| o.rejected.is_some()).count(),
            displaced: outcomes
                .iter()
                .filter(|o| matches!(o.rejected, Some((_, RejectionReason::Displaced))))
                .count(),
            expired: outcomes
                .iter()
                .filter(|o| {
                    matches!(o.rejected, Some((at, RejectionReason::Deadline)) if at > o.arrival)
                })
                .count(),
            good,
            goodput,
            capacity_fraction: goodput / self.capacities[index],
            ttft_p50: Percentile::of(&mut ttfts, 0.50),
            ttft_p95: Percentile::of(&mut ttfts, 0.95),
            queue_p95: Percentile::of(&mut queued, 0.95),
            longest_wait: Percentile::of(&mut waits, 1.0),
        }
    }

    /// The rejections of traffic `name` under `policy` for arrivals in
    /// `from..until`, by reason, most frequent first.
    pub fn rejections(
        &self,
        policy: Policy,
        name: &str,
        from: Duration,
        until: Duration,
    ) -> Vec<(RejectionReason, usize)> {
        let run = self.run(policy).expect("the policy ran");
        let index = self.config.index_of(name);
        let mut counts: Vec<(RejectionReason, usize)> = Vec::new();
        for outcome in &run.outcomes {
            if outcome.traffic != index || outcome.arrival < from || outcome.arrival >= until {
                continue;
            }
            if let Some((_, reason)) = outcome.rejected {
                match counts.iter_mut().find(|(r, _)| *r == reason) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((reason, 1)),
                }
            }
        }
        counts.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        counts
    }

    /// The longest waits for an answer of traffic `name` under `policy`,
    /// for arrivals in the middle and the last third of `from..until`.
    pub fn longest_waits(
        &self,
        policy: Policy,
        name: &str,
        from: Duration,
        until: Duration,
    ) -> (Option<Percentile>, Option<Percentile>) {
        let third = (until - from) / 3;
        let middle = self.slice(policy, name, from + third, from + 2 * third);
        let last = self.slice(policy, name, from + 2 * third, until);
        (middle.longest_wait, last.longest_wait)
    }

    /// Whether no request of traffic `name` waits forever under `policy`:
    /// every one that arrived in `from..until` was answered (a first token
    /// or a rejection) before the run ended, and the longest wait does not
    /// grow with the length of the overload — arrivals of the last third
    /// waited at most 25% (and 1 s) longer than those of the middle third.
    /// A wait that grows without bound (an unbounded queue under overload)
    /// grows linearly from one third to the next.
    pub fn waits_bounded(
        &self,
        policy: Policy,
        name: &str,
        from: Duration,
        until: Duration,
    ) -> bool {
        match self.longest_waits(policy, name, from, until) {
            (Some(middle), Some(last)) if !middle.at_least && !last.at_least => {
                last.value <= middle.value.mul_f64(1.25) + Duration::from_secs(1)
            }
            _ => false,
        }
    }

    /// Total goodput of `policy` over arrivals in `from..until`: the sum
    /// over traffics of each one's goodput as a fraction of its capacity.
    pub fn total_goodput(&self, policy: Policy, from: Duration, until: Duration) -> f64 {
        self.config
            .traffic
            .iter()
            .map(|traffic| {
                self.slice(policy, traffic.name, from, until)
                    .capacity_fraction
            })
            .sum()
    }

    /// Requests and tokens (prompt + output) of traffic `name` the gate
    /// admitted under `policy` in `from..until` (by admission time).
    pub fn admitted(
        &self,
        policy: Policy,
        name: &str,
        from: Duration,
        until: Duration,
    ) -> Admitted {
        let run = self.run(policy).expect("the policy ran");
        let index = self.config.index_of(name);
        let mut admitted = Admitted::default();
        for outcome in &run.outcomes {
            if outcome.traffic == index
                && outcome.admitted.is_some_and(|at| at >= from && at < until)
            {
                admitted.requests += 1;
                admitted.tokens += outcome.engine_tokens;
            }
        }
        admitted
    }

    /// The `quantile` of the time to first token of traffic `name` under
    /// `policy`, for arrivals in consecutive bins of `bin` from 0 to
    /// [`QosConfig::record_until`]: (bin start, value), bins without
    /// admitted requests left out. Requests without a first token at the
    /// end count with their wait so far.
    pub fn ttft_series(
        &self,
        policy: Policy,
        name: &str,
        bin: Duration,
        quantile: f64,
    ) -> Vec<(Duration, Percentile)> {
        let run = self.run(policy).expect("the policy ran");
        let index = self.config.index_of(name);
        let mut series = Vec::new();
        let mut from = Duration::ZERO;
        while from < self.config.record_until {
            let until = from + bin;
            let mut ttfts: Vec<(Duration, bool)> = run
                .outcomes
                .iter()
                .filter(|o| o.traffic == index && o.arrival >= from && o.arrival < until)
                .filter(|o| o.rejected.is_none())
                .map(|o| o.wait(run.end))
                .collect();
            if let Some(value) = Percentile::of(&mut ttfts, quantile) {
                series.push((from, value));
            }
            from = until;
        }
        series
    }
}

/// Requests and tokens admitted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Admitted {
    /// Requests.
    pub requests: usize,
    /// Their prompt plus output tokens.
    pub tokens: usize,
}
