//! Admission control for streaming LLM inference servers.
//!
//! A worker has one [`Gate`]. Before a request consumes engine capacity the
//! gate decides whether to **admit** it now, **queue** it in a bounded FIFO,
//! or **reject** it fast with an explicit overload answer, so that goodput —
//! requests that meet their latency objectives — stays near capacity however
//! hard the load pushes. Excess work waits outside the engine, never hidden
//! inside it. The rules, one by one, are the behaviour contract
//! (`docs/behaviour.md` in the repository); this page is the guide.
//!
//! * [How it decides](#how-it-decides)
//! * [As a Tower layer](#as-a-tower-layer): axum, tonic, the overload answer
//! * [Configuration](#configuration): limits, precedence, what is in force
//! * Opt-in policies: [token budgets](#token-budgets),
//!   [deadlines and a TTFT objective](#deadlines-and-a-ttft-objective),
//!   [controlled delay, Retry-After, saturation](#controlled-delay-a-drain-rate-retry-after-saturation),
//!   [quality of service](#quality-of-service-priority-tenants-aging)
//! * [Metrics](#metrics), [sizing the waiting limit](#sizing-the-waiting-limit),
//!   [operating it](#operating-it)
//! * [Composing with other layers](#composing-with-other-layers),
//!   [testing](#testing), [features](#features), [the other crates](#the-other-crates)
//!
//! # How it decides
//!
//! Two engine limits and one queue apply per data-parallel rank:
//!
//! | setting | counts | released at |
//! |---|---|---|
//! | engine request limit | admitted requests whose response has not ended | end of the response stream (end, error, drop) |
//! | engine request waiting limit | admitted requests without a first generated token yet | first generated token, or completion |
//! | request queue limit | requests waiting outside the engine (FIFO) | admission, or cancellation while queued |
//!
//! * A new request enters the engine only when both limits have room **and
//!   its queue is empty**. Freed capacity goes to the oldest queued request
//!   that fits, atomically: a newcomer never overtakes a waiter.
//! * Waiting ends at the first generated token, decided by a
//!   [`FirstTokenDetector`]. The default, `detect::Auto`, chooses by the
//!   response's content type: `detect::OpenAiSse` for `text/event-stream`
//!   (role-only chunks, empty deltas, comments, keep-alives and the interim
//!   events of the OpenAI Responses API and Anthropic's Messages API do not
//!   end waiting), `detect::Grpc` for gRPC (the first complete message),
//!   `detect::AnyData` otherwise (the first non-empty data frame). A handler
//!   can end waiting itself with the `http::FirstToken` request extension,
//!   e.g. for a non-streaming JSON answer.
//! * A request cancelled while queued leaves at once; one that ends, fails,
//!   panics or is dropped releases exactly what it still holds. No
//!   preemption, no queue timeout (unless you opt in to deadlines).
//! * Each data-parallel rank has its own limits and queue; a busy rank never
//!   blocks another. Requests without a rank, or with one the engine has not
//!   reported, are unranked: they share one queue and draw on the combined
//!   capacity of all ranks. Ranks come from `x-data-parallel-rank` (the
//!   header vLLM's API server honours) with [`RankHeader`], a request
//!   extension, or a closure. **Take ranks from a trusted router, never from
//!   end users.**
//! * Rejections say whom they concern: the rank (the worker still has room
//!   for others) or the whole worker (`Retry-After: 1`: route elsewhere for a
//!   second).
//!
//! Without HTTP, the gate is a plain async API. [`Gate::acquire`] takes the
//! request's data-parallel rank: `None` means **no rank** (an unranked
//! request), `Some(r)` rank `r` of those the engine reported:
//!
//! ```
//! use tower_admission::{AdmissionConfig, EngineCapacity, Gate};
//!
//! # futures::executor::block_on(async {
//! let gate = Gate::new(AdmissionConfig::new());
//! gate.report_capacity(EngineCapacity::new(256, 1)); // from the engine
//! let mut permit = gate.acquire(None).await?; // None: no rank; Err(Overloaded) when full
//! // ... stream the response; at the first generated token:
//! permit.first_token();
//! // ... when the response ends, the permit is dropped.
//! # Ok::<_, tower_admission::Overloaded>(())
//! # });
//! ```
//!
//! [`Gate::acquire_with`] takes a whole [`Descriptor`] instead: the rank, a
//! [`Cost`], a priority, a [`Tenant`], a deadline.
//!
//! # As a Tower layer
//!
//! With the `http` feature (on by default), [`AdmissionLayer`] puts the gate
//! in front of an axum, tonic or hyper service. The permit travels into the
//! response body and is released when the stream ends. The
//! [`http`] module has the details; the repository's README has
//! a whole axum server with Prometheus metrics (`examples/axum_quickstart.rs`),
//! and `examples/axum_minimal.rs` is a smaller one that also answers a
//! non-streaming route.
//!
//! * **One gate per worker**, shared by every route; never create it inside a
//!   layer (axum applies a layer per route).
//! * **On each route's method router** (`post(chat).route_layer(admitted)`),
//!   so that 404s and 405s take no capacity; health and metrics routes are
//!   not admitted.
//! * **Capacity: `AdmissionConfig::capacity` or [`Gate::report_capacity`].**
//!   Both tell the gate what the engine says about itself (`max_num_seqs` per
//!   rank, data-parallel ranks); the defaults follow it, a limit set by flag,
//!   variable or code does not. Use `AdmissionConfig::capacity` when the
//!   capacity is known before the gate is built and does not change (a fixed
//!   deployment, a test). Use `Gate::report_capacity` when the engine tells
//!   you at run time — once it is up, and again whenever it changes (a
//!   restart with another `max_num_seqs`, ranks coming or going). Until
//!   either, the gate assumes one rank of 10000.
//! * **Say what is in force.** The gate logs its limits (per rank, combined,
//!   and where each comes from) with `tracing` at `INFO` when it is built and
//!   whenever a capacity report changes them; [`Gate::limits_in_force`] gives
//!   the same to print at start-up.
//!
//! With tonic, per service (feature `tonic`, which makes the admitted service
//! a tonic `NamedService`):
//! `Server::builder().add_service(AdmissionLayer::new(gate).layer(svc))`. Or
//! around the whole server, letting health checks and reflection through:
//! `Server::builder().layer(AdmissionLayer::new(gate).bypass(BypassPaths::grpc_health_and_reflection()))`
//! (`examples/tonic_minimal.rs`). tonic's `concurrency_limit_per_connection`
//! and HTTP/2's `max_concurrent_streams` are queues in front of the gate that
//! it cannot see: leave them unset, or well above the gate's limits plus its
//! queue.
//!
//! ## The overload answer
//!
//! Decided before any header is sent — never a `200` followed by an
//! in-stream error. HTTP gets `529 Site is overloaded` with an OpenAI error
//! object (`message`, `type`, `param`, `code`) and the rejection's `scope`,
//! `rank` and `reason` as extra members:
//!
//! ```text
//! HTTP/1.1 529 Site is overloaded
//! content-type: application/json
//! x-admission-rejection-scope: worker
//! x-admission-rejection-reason: queue_full
//! retry-after: 1
//!
//! {"error":{"message":"overloaded: the worker has no room to admit or queue the request","type":"overloaded","param":null,"code":529,"scope":"worker","rank":null,"reason":"queue_full"}}
//! ```
//!
//! The reason ([`RejectionReason`]) is also in
//! `x-admission-rejection-reason`: `queue_full`; `deadline` when a queue wait
//! budget ran out; `displaced` when a higher-priority arrival took the place;
//! `queue_delay` when controlled delay shed a standing queue; `body_reads`
//! when `http::OpenAiCostLayer` could not read the body (too many at once);
//! and, from the sidecar, `shutdown` while it drains. Rank-scoped rejections
//! carry `x-admission-rejection-scope: rank` and `x-admission-rank: N`, and
//! no `Retry-After`. `AdmissionLayer::overload_status` changes the status
//! (503, 429, …), `retry_after` the `Retry-After` (or drops it), and
//! `overload_response` replaces the whole answer with one of your own. A
//! gRPC request (`content-type: application/grpc…`) gets a trailers-only
//! response with `grpc-status: 14` (`UNAVAILABLE`, configurable with
//! `grpc_overload_code`), a `grpc-message`, and `grpc-retry-pushback-ms:
//! 1000` for worker scope; a gRPC-Web request gets its own content type
//! back.
//!
//! # Configuration
//!
//! Per rank; engine limits take positive integers, the queue limit
//! non-negative ones (`0` disables queueing):
//!
//! | setting | default (per rank) | CLI flag (feature `clap`) | environment (canonical, then alias) |
//! |---|---|---|---|
//! | engine request limit | `max_num_seqs` (10000 until reported) | `--engine-request-limit` | `DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT`, `DYN_ENGINE_REQUEST_LIMIT` |
//! | engine request waiting limit | `max_num_seqs` (10000 until reported) | `--engine-request-waiting-limit` | `DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT`, `DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT` |
//! | request queue limit | 2 × `max_num_seqs` (20000 until reported) | `--request-queue-limit` | `DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT`, `DYN_DYNAMO_REQUEST_QUEUE_LIMIT` |
//!
//! **Every limit is per rank; unranked requests get the combined capacity.**
//! A request for a reported rank uses that rank's limits and queue. A request
//! with no rank (or one the engine has not reported) is unranked: unranked
//! requests share one queue and draw on the worker's combined capacity, ranks
//! × each per-rank limit, and every ranked request counts against that
//! combined capacity too. Worked example: two reported ranks, per-rank limits
//! of 4 (request and waiting) and a queue of 8. A request for rank 0 runs
//! when fewer than 4 of rank 0 run, and otherwise waits in rank 0's queue of
//! 8; **unranked traffic gets 8 running and 16 queued**, not 4 and 8. To give
//! it 4 and 8, set per-rank limits of 2 and a queue of 4 (the ranks then get
//! 2 and 4 each). Before the engine's first report the gate assumes one rank.
//!
//! The gate logs the limits in force, per rank and combined, with the source
//! of each (`flag --engine-request-limit`, `variable
//! DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT`, `set in code`, or `default:
//! the reported max_num_seqs`), at `INFO` when it is built and whenever a
//! capacity report changes them; [`Gate::limits_in_force`] returns the same
//! ([`LimitsInForce`], whose `Display` the example servers print at
//! start-up):
//!
//! ```text
//! admission limits in force (the engine reported its capacity): 2 ranks (reported: max_num_seqs 256, dp_ranks 2); per rank: engine request limit 4 (flag --engine-request-limit), engine request waiting limit 4 (variable DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT), request queue limit 8 (set in code); combined, for unranked requests: engine request limit 8, engine request waiting limit 8, request queue limit 16
//! ```
//!
//! Precedence per setting: CLI flag > canonical variable > alias > default.
//! Environment values are trimmed; an invalid one logs a warning naming the
//! variable and the value and falls through to the next source; an invalid
//! flag fails parsing. Explicit settings are fixed; defaults follow every
//! [`Gate::report_capacity`] (growth admits waiters at once, shrinking never
//! revokes admitted work, queued requests of a vanished rank become unranked
//! in age order). Everything is also a builder: `AdmissionConfig::new()
//! .engine_request_limit(n).engine_request_waiting_limit(n).request_queue_limit(n)`,
//! or [`AdmissionConfig::from_lookup`] to resolve from your own source
//! ([`AdmissionConfig::from_env`] reads the process environment). With the
//! `clap` feature, flatten `AdmissionArgs` into your server's parser and call
//! `args.resolve()`.
//!
//! ## Token budgets
//!
//! Opt-in. Request counts treat a 100-token prompt and a 20,000-token one
//! alike. Three more per-rank limits weigh requests by their tokens; each is
//! off unless set, and with all three off nothing changes:
//!
//! | setting | counts | CLI flag | environment |
//! |---|---|---|---|
//! | engine waiting token limit | prompt tokens of admitted requests until their first token | `--engine-waiting-token-limit` | `DYN_BACKEND_ADMISSION_ENGINE_WAITING_TOKEN_LIMIT` |
//! | engine token limit | prompt + maximum output tokens of admitted requests until the response ends | `--engine-token-limit` | `DYN_BACKEND_ADMISSION_ENGINE_TOKEN_LIMIT` |
//! | request queue token limit | prompt tokens of queued requests | `--request-queue-token-limit` | `DYN_BACKEND_ADMISSION_REQUEST_QUEUE_TOKEN_LIMIT` |
//!
//! A request's cost must be known before admission: a [`Cost`] in the
//! request's extensions, put there by a layer in front of `AdmissionLayer`.
//! `http::OpenAiCostLayer` reads an OpenAI body (bounded: over the bound,
//! `413` before admission; 64 bodies read at once, beyond that `529` with
//! reason `body_reads`), estimates prompt tokens (your tokenizer, or bytes /
//! 4) and reads `max_tokens` / `max_completion_tokens`; your own layer or
//! describer can set a cost from a trusted router's headers. With the gate
//! alone: `Gate::acquire_with(Descriptor::new().with_cost(Cost::prompt(800)))`.
//! A request larger than a whole budget runs alone rather than never; only
//! queue heads are admitted, so small prompts never overtake a long one.
//! [`sizing::token_budget`] gives the candidate waiting token limit from a
//! TTFT objective and the prefill speed (0.3 s × 6,000 tokens/s ≈ 1,800).
//!
//! ## Deadlines and a TTFT objective
//!
//! Opt-in. By default a queued request waits as long as the queue takes.
//! Opt in to a **queue wait budget**: the smallest of a queue wait limit
//! (`--request-queue-wait-limit-ms`,
//! `DYN_BACKEND_ADMISSION_REQUEST_QUEUE_WAIT_LIMIT_MS`), the client's own
//! deadline (`AdmissionLayer::grpc_timeout()` honours `grpc-timeout`;
//! `deadline_header(name)` a header of milliseconds), and the budget a
//! **time-to-first-token objective** leaves (`--ttft-objective-ms`,
//! `DYN_BACKEND_ADMISSION_TTFT_OBJECTIVE_MS`): the objective minus the
//! measured mean engine waiting time. A request whose budget runs out leaves
//! the queue at once with reason `deadline` (gRPC: `DEADLINE_EXCEEDED` when
//! it was the client's own deadline, `UNAVAILABLE` otherwise); one predicted
//! to wait past its budget, from the rate its queue drains at, is rejected on
//! arrival. With deadlines on, `rejection_total` carries `reason` next to
//! `scope`.
//!
//! ## Controlled delay, a drain-rate Retry-After, saturation
//!
//! All opt-in.
//!
//! - **Controlled delay** (`AdmissionConfig::queue_delay_target`,
//!   `--queue-delay-target-ms`, `DYN_BACKEND_ADMISSION_QUEUE_DELAY_TARGET_MS`):
//!   a queue absorbs bursts but may not stand. Once a queue's wait has stayed
//!   above the target for an interval (100 ms, `queue_delay_interval`), its
//!   requests older than the target are answered as overload (worker scope,
//!   reason `queue_delay`) until it has drained (stayed empty for an
//!   interval). With a 50 ms target the simulated overload sweep's p99 TTFT
//!   falls from 6.5–6.8 s (the defaults) to about 90–96 ms at 2×–8×, at the
//!   same goodput (BENCHMARKS.md).
//! - **Retry-After from the drain rate**
//!   (`AdmissionConfig::retry_after_from_drain_rate(max)`; without it
//!   worker-scoped answers say `Retry-After: 1`): worker-scoped rejections
//!   carry the queue's length over its measured drain rate, in whole seconds,
//!   within `[1 s, max]` (`Overloaded::retry_after()`, `Retry-After`,
//!   `grpc-retry-pushback-ms`). The frontend crate `tower-admission-route`
//!   honours it up to its `max_retry_after` (5 s by default) and cools a
//!   worker down for it up to `max_cooldown` (1 s by default): raise both to
//!   use it.
//! - **Saturation** ([`Gate::saturation`], [`Gate::rank_saturation`], and with
//!   `AdmissionConfig::saturation_metric(true)` the gauge
//!   `<prefix>_saturation{dp_rank}`): demand over what the gate can hold, 0
//!   idle, 1 when the next request would be rejected; `dp_rank="unspecified"`
//!   is the worker. `docs/deployment.md` scales on it with an HPA or KEDA.
//!
//! ## Quality of service: priority, tenants, aging
//!
//! Opt-in. By default every request is in one class and the queue is FIFO. A
//! request may carry a **priority** (an integer, higher first, default 0,
//! negative for sheddable work) and a **tenant** (a fairness key). Queued
//! requests are then served by strict priority between bands, weighted fair
//! sharing between tenants within a band, FIFO within a tenant. A full queue
//! gives the place of its newest lowest-priority request to a higher-priority
//! arrival: that request gets its overload answer at once with reason
//! `displaced`.
//!
//! The layer reads both from request extensions, `http::Priority(i32)` and
//! [`Tenant`], set by your own middleware, or from headers with
//! `AdmissionLayer::qos_headers(QosHeaders::default())`:
//!
//! | header | value | malformed (ignored) |
//! |---|---|---|
//! | `x-admission-priority` | one decimal integer that fits an `i32` (`5`, `-1`) | `+5`, `1.0`, `high`, out of range, repeated: priority 0 |
//! | `x-admission-tenant` | one UTF-8 name of at most 256 bytes | empty, not UTF-8, too long, control characters, repeated: no tenant |
//!
//! ```
//! use tower_admission::{AdmissionConfig, AdmissionLayer, Gate, QosHeaders};
//!
//! let gate = Gate::new(AdmissionConfig::new().tenant_weight("chat", 4));
//! let layer = AdmissionLayer::new(gate).qos_headers(QosHeaders::default());
//! # let _ = layer;
//! ```
//!
//! **Take them from a trusted router only**, which strips whatever the client
//! sent: a client that sets its own priority jumps the queue, and one that
//! names a tenant takes its share. A malformed value falls back to the
//! default, as a malformed rank does; it is never an error answer.
//!
//! | setting | default | CLI flag | environment |
//! |---|---|---|---|
//! | aging interval: a waiting request rises one band per interval | off | `--aging-interval-ms <MS>` | `DYN_BACKEND_ADMISSION_AGING_INTERVAL_MS` |
//! | priority bands: a request joins the highest band at or below its priority | every priority is a band | `--priority-bands -1,0,10` | `DYN_BACKEND_ADMISSION_PRIORITY_BANDS=-1,0,10` |
//! | tenant weights | every tenant weighs 1 | `--tenant-weight chat=4` (repeat per tenant) | `DYN_BACKEND_ADMISSION_TENANT_WEIGHTS=chat=4,batch=1` |
//!
//! The same rules as the other settings: a zero interval or weight, a band
//! that is not an integer or is listed twice, an empty tenant name fail a
//! flag with an error naming it and the value, and make a variable log a
//! warning and be ignored (a list is taken whole or not at all). In code:
//! `AdmissionConfig::aging_interval`, `priority_bands`, `tenant_weight`.
//!
//! Two things to know when sizing them (measured in BENCHMARKS.md, "Quality
//! of service"):
//!
//! - **Aging is a starvation bound, not a share.** Once low-priority work
//!   waits longer than the aging interval, its band rises level with the
//!   bands above and, being older, is served first: under sustained overload
//!   the priorities blur. Choose an interval longer than the low band's usual
//!   queue wait, or bound that wait (`--request-queue-wait-limit-ms`).
//! - **Weights share the service of a queue, not its places.** When a full
//!   queue turns arrivals away, each freed place goes to whichever tenant
//!   arrives next, so admitted shares drift towards the arrival mix. A queue
//!   wait limit (or a TTFT objective) keeps the queue from filling and the
//!   weights hold (3.00:1 for weights 3:1 in the evaluation).
//!
//! # Metrics
//!
//! Feature `metrics` (default), through the `metrics` facade: install your
//! exporter (e.g. `metrics-exporter-prometheus`) and serve it on `/metrics`.
//! The order does not matter: a gate built before the exporter was installed
//! registers its series at its first event after it (and logs that it did, at
//! `INFO`), counters included from the start. Names are `<prefix>_<suffix>`
//! (`AdmissionConfig::metrics_prefix`, default `admission`;
//! `dynamo_backend_admission` gives the source system's names), each with
//! `dp_rank` = `"0"`, `"1"`, … or `"unspecified"`:
//!
//! | suffix | type | extra labels |
//! |---|---|---|
//! | `engine_request_count`, `engine_request_waiting_count`, `request_queue_count` | gauge | |
//! | `request_receive_total` | counter | |
//! | `request_admit_total` | counter | `source` = `direct` \| `queue` |
//! | `rejection_total` | counter | `scope` = `rank` \| `worker` |
//! | `cancellation_total` | counter | |
//! | `engine_request_limit`, `engine_request_waiting_limit`, `request_queue_limit` | gauge | |
//! | `request_queue_wait_seconds` | histogram | |
//! | `engine_request_waiting_seconds` | histogram | |
//! | `request_queue_oldest_age_seconds` | gauge | |
//!
//! Gauges are set from the gate's authoritative counts on every transition,
//! so they never drift. [`Gate::snapshot`] gives the same counts and outcome
//! tallies without an exporter.
//!
//! `request_queue_oldest_age_seconds` is how long the oldest request still in
//! the queue has waited (0 when it is empty): a stuck queue shows here before
//! any request leaves it. Between the gate's events it is not updated, so
//! call [`Gate::refresh_metrics`] in your `/metrics` handler just before
//! rendering (the examples do). Where reasons other than `queue_full` can
//! occur (deadlines, priority bands, a queue delay target, the cost layer's
//! `body_reads`, the sidecar's `shutdown`), `rejection_total` also carries
//! `reason`. With `AdmissionConfig::priority_bands` configured (only then:
//! the label's values are the configured bands),
//! `request_queue_by_priority_count` (gauge), `request_admit_by_priority_total`
//! and `rejection_by_priority_total` (counters) carry `priority` = the band a
//! request arrived in. No series carries a tenant the configuration does
//! not name (unbounded cardinality).
//!
//! The HTTP layer adds the client's view (behaviour §6): each admitted
//! request measured from its arrival at the layer, its queue wait included,
//! to the end of its response, labelled `priority` (with configured bands)
//! and `tenant_class` (a tenant named by a weight or per-tenant limits, else
//! `other`), without `dp_rank`:
//!
//! | suffix | type | what |
//! |---|---|---|
//! | `client_time_to_first_token_seconds` | histogram | arrival to the first content token |
//! | `client_inter_token_latency_seconds` | histogram | gaps between content chunks after the first token |
//! | `client_request_duration_seconds` | histogram | arrival to the end of the response |
//! | `finished_requests_total` | counter | admitted requests whose response ended (completed, failed or cut off) |
//! | `goodput_requests_total` | counter | those that completed without a 5xx within the TTFT objective, the inter-token objective (`AdmissionConfig::inter_token_objective`, the mean gap between content chunks) and their own deadline |
//!
//! Alert on `goodput / finished`. The [`metrics`] module has the rest.
//!
//! # Sizing the waiting limit
//!
//! With Little's law, for one worker and one rank over a steady window: `L` =
//! time average of `engine_request_waiting_count`, `C` = rate of
//! `request_admit_total` (both sources), `W ≈ L / C`. The initial
//! waiting-limit candidate is `ceil(C × W)`: 50 requests/s with a mean wait
//! of 0.24 s gives 12.
//!
//! 1. Drive the worker at the highest steady load that still meets your
//!    latency objective, with representative prompts, and engine limits high
//!    enough that the gate neither queues nor rejects during the window.
//! 2. Measure one worker and one known `dp_rank` (`unspecified` says nothing
//!    per rank), in a window with negligible failures and cancellations.
//! 3. Compute the candidate — from Prometheus (`docs/operations.md` has the
//!    PromQL), or live with `sizing::Sampler::rank(0)` fed `gate.snapshot()`s,
//!    which refuses a window with queueing, rejections or too few admissions
//!    and says why — then set
//!    `DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT` and validate under
//!    representative load and bursts. It is a mean: it does not bound tail
//!    latency.
//!
//! ```
//! use std::time::Duration;
//! use tower_admission::sizing::Estimate;
//!
//! let estimate = Estimate::from_rate_and_wait(50.0, Duration::from_millis(240));
//! assert_eq!(estimate.waiting_limit(), 12);
//! ```
//!
//! Or let the gate find it (opt-in): with
//! `AdmissionConfig::adaptive_waiting_limit(true)` (`--adaptive-waiting-limit`,
//! `DYN_BACKEND_ADMISSION_ADAPTIVE_WAITING_LIMIT=true`) the per-rank waiting
//! limit moves between a floor (1) and a ceiling (the configured or reported
//! limit) by a latency-gradient rule: it grows while the engine waiting time
//! stays near its no-load baseline and the limit binds, and shrinks when the
//! waiting time rises ([`AdaptiveWaitingLimit`] for its parameters). Against
//! a simulated engine that reports nothing it keeps 0.88–0.90 of the goodput
//! of the same server with its capacity reported, under aiperf at 3× load
//! (BENCHMARKS.md). The [`sizing`] module has the details.
//!
//! # Operating it
//!
//! The repository's `docs/` holds three files written for the metric prefix
//! `dynamo_backend_admission` (`sed 's/dynamo_backend_admission_/admission_/g'`
//! for the default prefix):
//!
//! - `docs/prometheus/alerts.yml`: alert rules to load as they are, each
//!   with what it means and what to do: the queue above 80% of its limit and
//!   growing, worker-scoped rejections above 5% of the requests for 5
//!   minutes, the waiting count pinned at its limit for 10 minutes, a gate
//!   that never got a capacity report (engine limits of 10000), counts that
//!   stay above zero after 15 idle minutes, and the oldest queued request
//!   waiting over 30 seconds for 2 minutes (with `Gate::refresh_metrics()` in
//!   the `/metrics` handler). Unit tests:
//!   `promtool test rules docs/prometheus/alerts_test.yml`.
//! - `docs/grafana/tower-admission.json`: a Grafana dashboard with variables
//!   for the data source, the metric prefix, the workers (`instance`),
//!   `dp_rank` and the Little's-law window, and four rows, each series per
//!   worker and rank: *counts against limits* (each count drawn with its
//!   limit, so the limit that holds work back is the one its count sits on);
//!   *admissions and rejections* (by source, by scope and reason, the
//!   rejected share, cancellations); *queue and waiting times* (heatmaps and
//!   p50/p90/p99, and the age of the oldest queued request); *Little's law*
//!   (`L`, `C`, `W`, the candidate waiting limit against the one in force,
//!   and whether the window is usable).
//! - `docs/operations.md`: sizing the waiting limit, with the PromQL.
//!
//! `tower-admission-sim/tests/server_prometheus_live.rs` runs them against a
//! real Prometheus (Debian's `prometheus` package; without it the test says
//! so and passes, except under `CI=true`) scraping the example OpenAI server
//! through a steady load and a burst: every documented and dashboard query
//! returns data, Prometheus's Little's-law figures agree with
//! `sizing::Sampler` within 10%, and the worker-rejection alert fires during
//! the burst and resolves after it. `docs/deployment.md` covers Kubernetes,
//! autoscaling on saturation, Envoy and gRPC clients' retry policies.
//!
//! # Composing with other layers
//!
//! Put timeouts, tracing, metrics and compression **outside** the admission
//! layer (a timeout outside covers the queue wait and cancels the queued
//! request when it fires). A rate limiter that **rejects** (`429` per key:
//! `tower_governor`, an API-key quota) goes **outside**, in front of the
//! gate: a request it turns away takes no capacity and is not even counted
//! as received. A limiter that **delays** (tower's `RateLimit`,
//! `ConcurrencyLimit`) must **never** sit outside — it would be an unbounded
//! queue in front of the gate that the gate cannot see — and goes inside,
//! behind a `Buffer`, with axum's `HandleErrorLayer` between the gate and the
//! `Buffer`; build the router once (`.with_state(())`) so that every
//! connection shares the pacer. The [`http`] module's
//! "Composing with other middleware" explains each case with a compiled
//! example; `examples/axum_rate_limits.rs` is that server, whole.
//!
//! # Testing
//!
//! The layer is a plain tower `Service` over `http` types: `tower_test::mock`
//! stands in for the engine and `tokio_test::task` polls the response futures
//! one step at a time, so each assertion sees the gate exactly where the
//! requests left it — no runtime, no sleeps. The [`http`]
//! module's "Testing with tower-test" shows a queued request admitted when
//! the first response's body ends, and an overload answer with its headers
//! and body as sent (dev-dependencies: `tower-test = "0.4"`,
//! `tokio-test = "0.4"`, `http-body-util = "0.1"`, `bytes = "1"`,
//! `http = "1"`).
//!
//! Assert on [`Gate::snapshot`]: `total`, `unranked` and `ranks[r]` are
//! [`Counts`] (`engine_requests`, `engine_waiting`, `queued`; compare with
//! `Counts::new(engine_requests, engine_waiting, queued)`), and `tally`,
//! `unranked_tally` and `rank_tallies[r]` are [`Tally`]s of how requests
//! ended (`received`, `admitted_direct`, `admitted_queue`, `rejected_rank`,
//! `rejected_worker`, `cancelled`, …). `Tally::since(&earlier)` gives what
//! happened in between; `Snapshot::is_idle()` says nothing is held or queued
//! and every request received has ended.
//!
//! # Features
//!
//! | feature | default | what |
//! |---|---|---|
//! | `http` | yes | the Tower layer, the overload answers, the detectors |
//! | `hyper` | yes | the `Site is overloaded` reason phrase on HTTP/1 |
//! | `metrics` | yes | the series of the `metrics` module, through the `metrics` facade |
//! | `clap` | no | `AdmissionArgs`, the admission flags for a server's CLI |
//! | `tonic` | no | `Admission` is a tonic `NamedService` when the service it wraps is one |
//!
//! The library builds on Rust 1.85 (edition 2024), with every feature and
//! with none.
//!
//! # The other crates
//!
//! The repository is a workspace; each product is a crate of its own on this
//! one's public API:
//!
//! * [`tower-admission-sidecar`](https://docs.rs/tower-admission-sidecar): the
//!   `tower-admission` binary (`cargo install tower-admission-sidecar`), a
//!   reverse proxy that puts the gate in front of an engine it does not
//!   contain — vLLM, SGLang, llama.cpp's `llama-server`, TGI — and the same
//!   proxy as a library.
//! * [`tower-admission-route`](https://docs.rs/tower-admission-route): the
//!   frontend side — overload-aware workers for `tower::balance` and a retry
//!   policy for overload answers.
//! * `tower-admission-sim` (in the repository, not published): a simulated
//!   continuous-batching engine, the evaluations behind BENCHMARKS.md
//!   (`cargo run --release -p tower-admission-sim --example overload`), and
//!   example OpenAI and gRPC servers on it.
#![deny(missing_docs, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
mod config;
#[cfg(feature = "http")]
pub mod detect;
mod gate;
#[cfg(feature = "http")]
mod headers;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "http")]
mod json;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
pub mod sizing;

/// Who hears of the gate's events: the `metrics` series when the feature is
/// on, nobody otherwise. The one place that chooses.
#[cfg(feature = "metrics")]
type DefaultObserver = crate::metrics::Recorder;
#[cfg(not(feature = "metrics"))]
type DefaultObserver = crate::gate::observe::NoObserver;

#[cfg(feature = "clap")]
pub use crate::config::AdmissionArgs;
pub use crate::config::TenantLimits;
pub use crate::config::{
    AdaptiveWaitingLimit, AdmissionConfig, DEFAULT_ENGINE_LIMIT, EngineCapacity, ExplicitSettings,
    LimitSource, LimitSources, Limits, LimitsInForce, MAX_DP_RANKS,
};
#[cfg(feature = "http")]
pub use crate::detect::FirstTokenDetector;
pub use crate::gate::{
    Acquire, AdmitSource, Cost, Counts, Descriptor, Gate, Overloaded, Permit, RejectionReason,
    RejectionScope, Snapshot, Tally, Tenant,
};
#[cfg(feature = "http")]
pub use crate::http::{
    Admission, AdmissionLayer, Admitted, Describe, Priority, QosHeaders, RankHeader,
};
