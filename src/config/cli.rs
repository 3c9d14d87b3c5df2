//! Command-line flags for the admission settings (feature `clap`).

use std::num::NonZeroUsize;

use super::env::{self, Overrides};
use super::{AdmissionConfig, TenantLimits};

/// Declares [`AdmissionArgs`]: first its numeric flags, in the order of
/// [`env::NUMERIC`], one line each (field, value name, parser), then the
/// other fields as written; and `numeric`, the numeric flags' values in
/// that order, for [`Overrides::numeric`].
macro_rules! admission_args {
    (
        $(#[$attr:meta])*
        pub struct AdmissionArgs {
            numeric: [$(
                $(#[$doc:meta])*
                pub $field:ident: Option<$ty:ty> as $value_name:literal by $parser:ident,
            )+]
            $($other:tt)*
        }
    ) => {
        $(#[$attr])*
        pub struct AdmissionArgs {
            $(
                $(#[$doc])*
                #[arg(
                    long,
                    value_name = $value_name,
                    allow_negative_numbers = true,
                    value_parser = $parser
                )]
                pub $field: Option<$ty>,
            )+
            $($other)*
        }

        impl AdmissionArgs {
            fn numeric(&self) -> [Option<usize>; env::NUMERIC.len()] {
                [$(self.$field.map(usize::from)),+]
            }
        }
    };
}

admission_args! {
    /// The admission flags of behaviour §5, to flatten into a worker's own
    /// [`clap::Parser`]:
    ///
    /// | flag | environment (canonical, then alias) |
    /// |---|---|
    /// | `--engine-request-limit <N>` | `DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT`, `DYN_ENGINE_REQUEST_LIMIT` |
    /// | `--engine-request-waiting-limit <N>` | `DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT`, `DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT` |
    /// | `--request-queue-limit <N>` | `DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT`, `DYN_DYNAMO_REQUEST_QUEUE_LIMIT` |
    /// | `--engine-waiting-token-limit <N>` | `DYN_BACKEND_ADMISSION_ENGINE_WAITING_TOKEN_LIMIT` |
    /// | `--engine-token-limit <N>` | `DYN_BACKEND_ADMISSION_ENGINE_TOKEN_LIMIT` |
    /// | `--request-queue-token-limit <N>` | `DYN_BACKEND_ADMISSION_REQUEST_QUEUE_TOKEN_LIMIT` |
    /// | `--request-queue-wait-limit-ms <MS>` | `DYN_BACKEND_ADMISSION_REQUEST_QUEUE_WAIT_LIMIT_MS` |
    /// | `--ttft-objective-ms <MS>` | `DYN_BACKEND_ADMISSION_TTFT_OBJECTIVE_MS` |
    /// | `--inter-token-objective-ms <MS>` | `DYN_BACKEND_ADMISSION_INTER_TOKEN_OBJECTIVE_MS` |
    /// | `--aging-interval-ms <MS>` | `DYN_BACKEND_ADMISSION_AGING_INTERVAL_MS` |
    /// | `--queue-delay-target-ms <MS>` | `DYN_BACKEND_ADMISSION_QUEUE_DELAY_TARGET_MS` |
    /// | `--priority-bands <BANDS>` | `DYN_BACKEND_ADMISSION_PRIORITY_BANDS` |
    /// | `--tenant-weight <NAME=WEIGHT>` (repeatable) | `DYN_BACKEND_ADMISSION_TENANT_WEIGHTS` |
    /// | `--adaptive-waiting-limit[=<BOOL>]` | `DYN_BACKEND_ADMISSION_ADAPTIVE_WAITING_LIMIT` |
    /// | `--tenant-request-limit <N>` | `DYN_BACKEND_ADMISSION_TENANT_REQUEST_LIMIT` |
    /// | `--tenant-token-limit <N>` | `DYN_BACKEND_ADMISSION_TENANT_TOKEN_LIMIT` |
    /// | `--tenant-queue-limit <N>` | `DYN_BACKEND_ADMISSION_TENANT_QUEUE_LIMIT` |
    /// | `--tenant-limit <NAME=REQUESTS[:TOKENS[:QUEUED]]>` (repeatable) | `DYN_BACKEND_ADMISSION_TENANT_LIMITS` |
    ///
    /// The token limits are off unless set: requests are then counted, not
    /// weighed. So are the queue wait limit and the time-to-first-token
    /// objective: a queued request then waits as long as the queue takes. So is
    /// aging (behaviour §8); without `--priority-bands` every priority is a band of
    /// its own, and a tenant without a weight weighs 1.
    ///
    /// Priority bands are comma-separated integers (`--priority-bands=-1,0,10`),
    /// none listed twice; the variable takes the same list. Tenant weights are
    /// `NAME=WEIGHT` with a positive integer weight, one flag per tenant
    /// (`--tenant-weight chat=4 --tenant-weight batch=1`; a tenant named by two
    /// flags gets the last weight); the variable takes them comma-separated
    /// (`chat=4,batch=1`), no tenant twice. Any `--tenant-weight` flag keeps
    /// the variable unread.
    ///
    /// An invalid flag value (zero, negative or non-numeric engine limits, a
    /// negative or non-numeric queue limit, a zero interval or weight, a band
    /// that is not an integer or is listed twice, an empty tenant name) fails
    /// parsing with an error naming the flag and the value, so the worker does
    /// not start.
    /// [`resolve`](Self::resolve) then fills in what the flags left unset, per
    /// setting: flag, canonical variable, alias, default.
    ///
    /// ```
    /// use clap::Parser;
    /// use tower_admission::AdmissionArgs;
    ///
    /// #[derive(Parser)]
    /// struct Worker {
    ///     #[command(flatten)]
    ///     admission: AdmissionArgs,
    ///     #[arg(long, default_value = "8000")]
    ///     port: u16,
    /// }
    ///
    /// let worker = Worker::parse_from(["worker", "--engine-request-waiting-limit", "12"]);
    /// let config = worker.admission.resolve_with(|variable| match variable {
    ///     "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT" => Some("64".into()),
    ///     "DYN_ENGINE_REQUEST_LIMIT" => Some("32".into()),
    ///     _ => None,
    /// });
    /// assert_eq!(config.explicit().engine_request_waiting_limit, Some(12)); // the flag wins
    /// assert_eq!(config.explicit().engine_request_limit, Some(32)); // from the alias
    /// assert_eq!(config.explicit().request_queue_limit, None); // follows the engine
    /// ```
    #[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
    pub struct AdmissionArgs {
        numeric: [
            /// Admitted requests per data-parallel rank whose response has not
            /// ended [default: the engine's max_num_seqs; env:
            /// DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT, DYN_ENGINE_REQUEST_LIMIT]
            pub engine_request_limit: Option<NonZeroUsize> as "N" by engine_limit,

            /// Admitted requests per data-parallel rank without a first token or
            /// completion yet [default: the engine's max_num_seqs; env:
            /// DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT,
            /// DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT]
            pub engine_request_waiting_limit: Option<NonZeroUsize> as "N" by engine_limit,

            /// Requests per data-parallel rank waiting in the gate's queue; 0
            /// disables queueing [default: 2 × the engine's max_num_seqs; env:
            /// DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT, DYN_DYNAMO_REQUEST_QUEUE_LIMIT]
            pub request_queue_limit: Option<usize> as "N" by queue_limit,

            /// Prompt tokens per data-parallel rank of admitted requests without a
            /// first token yet [default: off; env:
            /// DYN_BACKEND_ADMISSION_ENGINE_WAITING_TOKEN_LIMIT]
            pub engine_waiting_token_limit: Option<NonZeroUsize> as "N" by engine_limit,

            /// Prompt plus maximum output tokens per data-parallel rank of admitted
            /// requests whose response has not ended [default: off; env:
            /// DYN_BACKEND_ADMISSION_ENGINE_TOKEN_LIMIT]
            pub engine_token_limit: Option<NonZeroUsize> as "N" by engine_limit,

            /// Prompt tokens per data-parallel rank of requests waiting in the
            /// gate's queue [default: off; env:
            /// DYN_BACKEND_ADMISSION_REQUEST_QUEUE_TOKEN_LIMIT]
            pub request_queue_token_limit: Option<NonZeroUsize> as "N" by engine_limit,

            /// Longest time a request may wait in the gate's queue, in
            /// milliseconds; a request predicted to wait longer is rejected at once
            /// [default: off; env: DYN_BACKEND_ADMISSION_REQUEST_QUEUE_WAIT_LIMIT_MS]
            pub request_queue_wait_limit_ms: Option<NonZeroUsize> as "MS" by engine_limit,

            /// Time-to-first-token objective in milliseconds: the queue wait budget
            /// becomes the objective minus the measured engine waiting time
            /// [default: off; env: DYN_BACKEND_ADMISSION_TTFT_OBJECTIVE_MS]
            pub ttft_objective_ms: Option<NonZeroUsize> as "MS" by engine_limit,

            /// Inter-token objective in milliseconds: a finished request counts
            /// as goodput only if the mean gap between the content chunks of
            /// its response was not longer (measured, not enforced) [default:
            /// off; env: DYN_BACKEND_ADMISSION_INTER_TOKEN_OBJECTIVE_MS]
            pub inter_token_objective_ms: Option<NonZeroUsize> as "MS" by engine_limit,

            /// A queued request rises one priority band per this many milliseconds
            /// of waiting, so a steady stream of higher-priority work never starves
            /// it [default: off; env: DYN_BACKEND_ADMISSION_AGING_INTERVAL_MS]
            pub aging_interval_ms: Option<NonZeroUsize> as "MS" by engine_limit,

            /// Controlled delay: once a queue's wait has stayed above this many
            /// milliseconds for 100 ms, its requests older than it are answered as
            /// overload (reason queue_delay) until it drains [default: off; env:
            /// DYN_BACKEND_ADMISSION_QUEUE_DELAY_TARGET_MS]
            pub queue_delay_target_ms: Option<NonZeroUsize> as "MS" by engine_limit,

            /// Admitted requests per data-parallel rank one tenant may hold; a
            /// tenant at it waits without holding up others [default: off; env:
            /// DYN_BACKEND_ADMISSION_TENANT_REQUEST_LIMIT]
            pub tenant_request_limit: Option<NonZeroUsize> as "N" by engine_limit,

            /// Prompt plus maximum output tokens per data-parallel rank of one
            /// tenant's admitted requests [default: off; env:
            /// DYN_BACKEND_ADMISSION_TENANT_TOKEN_LIMIT]
            pub tenant_token_limit: Option<NonZeroUsize> as "N" by engine_limit,

            /// Requests per data-parallel rank one tenant may have queued; past
            /// it, its requests are refused at once (scope tenant, reason
            /// tenant_limit) [default: off; env:
            /// DYN_BACKEND_ADMISSION_TENANT_QUEUE_LIMIT]
            pub tenant_queue_limit: Option<usize> as "N" by queue_limit,
        ]

        /// Comma-separated priorities that are bands, e.g. -1,0,10: a request
        /// belongs to the highest band at or below its priority [default: every
        /// priority is a band; env: DYN_BACKEND_ADMISSION_PRIORITY_BANDS]
        // Fully qualified: one value holding a list, not a repeatable flag.
        #[arg(long, value_name = "BANDS", allow_hyphen_values = true, value_parser = priority_bands)]
        pub priority_bands: Option<::std::vec::Vec<i32>>,

        /// Weight of a tenant in fair sharing within a band, as NAME=WEIGHT;
        /// repeat for each tenant [default: every tenant weighs 1; env:
        /// DYN_BACKEND_ADMISSION_TENANT_WEIGHTS, comma-separated]
        #[arg(long, value_name = "NAME=WEIGHT", value_parser = tenant_weight)]
        pub tenant_weight: Vec<(String, u32)>,

        /// Limits of one tenant per rank, as NAME=REQUESTS,
        /// NAME=REQUESTS:TOKENS or NAME=REQUESTS:TOKENS:QUEUED (an empty
        /// field takes the default for every tenant); repeat for
        /// each tenant [default: the --tenant-*-limit defaults; env:
        /// DYN_BACKEND_ADMISSION_TENANT_LIMITS, comma-separated]
        #[arg(long, value_name = "NAME=REQUESTS[:TOKENS[:QUEUED]]", value_parser = tenant_limit)]
        pub tenant_limit: Vec<(String, TenantLimits)>,

        /// Move the engine request waiting limit per rank between 1 and its
        /// configured or reported value by the engine waiting time the gate
        /// measures (a latency gradient; see AdaptiveWaitingLimit); with no
        /// value, true [default: off; env:
        /// DYN_BACKEND_ADMISSION_ADAPTIVE_WAITING_LIMIT]
        #[arg(
            long,
            value_name = "BOOL",
            num_args = 0..=1,
            require_equals = true,
            default_missing_value = "true",
            value_parser = switch
        )]
        pub adaptive_waiting_limit: Option<bool>,
    }
}

impl AdmissionArgs {
    /// The configuration these flags give, with the process environment
    /// filling in unset flags (see [`AdmissionConfig::from_env`]).
    pub fn resolve(&self) -> AdmissionConfig {
        self.resolve_with(env::process_env)
    }

    /// The same as [`resolve`](Self::resolve), reading variables through
    /// `lookup` instead of the process environment. The variables of a
    /// setting given by a flag are not read.
    pub fn resolve_with(&self, lookup: impl Fn(&str) -> Option<String>) -> AdmissionConfig {
        let overrides = Overrides {
            numeric: self.numeric(),
            priority_bands: self.priority_bands.clone(),
            tenant_weights: (!self.tenant_weight.is_empty()).then(|| self.tenant_weight.clone()),
            tenant_limits: (!self.tenant_limit.is_empty()).then(|| self.tenant_limit.clone()),
            adaptive_waiting_limit: self.adaptive_waiting_limit,
        };
        env::resolve(overrides, &lookup)
    }
}

fn engine_limit(raw: &str) -> Result<NonZeroUsize, String> {
    env::parse(raw, 1)
        .map(|n| NonZeroUsize::new(n).expect("parse enforces the minimum of 1"))
        .map_err(|invalid| invalid.to_string())
}

fn queue_limit(raw: &str) -> Result<usize, String> {
    env::parse(raw, 0).map_err(|invalid| invalid.to_string())
}

fn priority_bands(raw: &str) -> Result<Vec<i32>, String> {
    env::parse_priority_bands(raw)
}

fn tenant_weight(raw: &str) -> Result<(String, u32), String> {
    env::parse_tenant_weight(raw)
}

fn tenant_limit(raw: &str) -> Result<(String, TenantLimits), String> {
    env::parse_tenant_limit(raw)
}

fn switch(raw: &str) -> Result<bool, String> {
    env::parse_switch(raw)
}

#[cfg(test)]
mod tests {
    use clap::Args as _;

    use super::*;

    #[test]
    fn the_numeric_flags_are_the_settings_table_in_its_order() {
        let command = AdmissionArgs::augment_args(clap::Command::new("worker"));
        let flags: Vec<String> = command
            .get_arguments()
            .filter_map(|arg| arg.get_long())
            .map(|long| format!("--{long}"))
            .take(env::NUMERIC.len())
            .collect();
        let table: Vec<&str> = env::NUMERIC.iter().map(|numeric| numeric.flag).collect();
        assert_eq!(flags, table);
        for numeric in &env::NUMERIC {
            // The flag is the builder method's name, with its unit.
            let flag = numeric.flag.trim_start_matches("--").replace('-', "_");
            assert!(
                flag.starts_with(numeric.name),
                "{flag} sets {}",
                numeric.name
            );
        }
    }

    #[test]
    fn each_numeric_flag_shows_the_tables_default_and_variables() {
        let command = AdmissionArgs::augment_args(clap::Command::new("worker"));
        for numeric in &env::NUMERIC {
            let long = numeric.flag.trim_start_matches("--");
            let arg = command
                .get_arguments()
                .find(|arg| arg.get_long() == Some(long))
                .unwrap_or_else(|| panic!("no flag {}", numeric.flag));
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
            let setting = numeric.setting;
            let variables = match setting.alias {
                Some(alias) => format!("{}, {alias}", setting.canonical),
                None => setting.canonical.to_owned(),
            };
            let expected = format!("[default: {}; env: {variables}]", setting.default);
            assert!(
                help.ends_with(&expected),
                "{}: help {help:?} should end with {expected:?}",
                numeric.flag
            );
        }
    }
}
