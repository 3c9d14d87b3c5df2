//! The metric families: each series' name, kind, unit and help text,
//! declared once in the table below.

use metrics::Unit;

/// Which families are described: always, with a token limit set, with
/// priority bands configured, with the saturation gauge on; the client's
/// view (recorded by the HTTP layer) always.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Group {
    Base,
    Tokens,
    Priorities,
    Saturation,
    Client,
}

/// Declares every metric family once: the group it is described with,
/// its kind, its name (the field of [`Names`] and the suffix after the
/// prefix), its unit and its help text.
macro_rules! families {
    ($($group:ident $kind:ident $name:ident: $unit:ident, $help:literal;)*) => {
        /// The full names of the metric families.
        pub(super) struct Names {
            $(pub(super) $name: String,)*
        }

        impl Names {
            pub(super) fn new(prefix: &str) -> Self {
                Names {
                    $($name: format!("{prefix}_{}", stringify!($name)),)*
                }
            }

            /// Describes the families of `group` to the recorder.
            pub(super) fn describe_group(&self, group: Group) {
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
    Client histogram client_time_to_first_token_seconds: Seconds, "Time from a request's arrival at the HTTP layer (its queue wait included) to the first content token of its response, or to the end of a response that ended without one.";
    Client histogram client_inter_token_latency_seconds: Seconds, "Time between successive content chunks of a response, after its first token, as the HTTP layer passes them on.";
    Client histogram client_request_duration_seconds: Seconds, "Time from a request's arrival at the HTTP layer to the end of its response (or its drop), for admitted requests.";
    Client counter goodput_requests_total: Count, "Admitted requests whose response ended, without a server error, within every objective: time to first token, inter-token gap, the request's own deadline.";
    Client counter finished_requests_total: Count, "Admitted requests whose response ended: completed, failed or cut off.";
    Saturation gauge saturation: Count, "Demand over what the gate can hold in the engine and its queue, 0 (idle) to 1 (the next request is rejected); a rank's is the larger of its own and the worker's; dp_rank=unspecified is the whole worker.";
}

impl Names {
    pub(super) fn describe(&self) {
        self.describe_group(Group::Base);
    }

    pub(super) fn describe_priorities(&self) {
        self.describe_group(Group::Priorities);
    }

    pub(super) fn describe_tokens(&self) {
        self.describe_group(Group::Tokens);
    }

    pub(super) fn describe_saturation(&self) {
        self.describe_group(Group::Saturation);
    }

    pub(super) fn describe_client(&self) {
        self.describe_group(Group::Client);
    }
}
