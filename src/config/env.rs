//! Resolution of the settings from environment variables (behaviour §5, §7, §8,
//! §9).
//!
//! Each setting has a canonical variable and, for the three request
//! settings, an alias. Per setting, the
//! first valid source wins: canonical, then alias, then the default (which
//! follows the engine). A valid canonical value means the alias is never
//! read. A value that is set but invalid logs a warning naming the variable
//! and the value, and resolution moves on to the next source: a typo in an
//! environment variable should not keep a worker from starting, but it must
//! not go unnoticed either.

use std::fmt;
use std::num::IntErrorKind;
use std::time::Duration;

use super::{AdmissionConfig, LimitSource, LimitSources, TenantLimits};

/// Reading a configuration from the environment: the constructors that
/// this module's rules serve.
impl AdmissionConfig {
    /// A configuration from the process environment (behaviour §5); see
    /// [`from_lookup`](Self::from_lookup) for the variables and the rules.
    pub fn from_env() -> Self {
        Self::from_lookup(process_env)
    }

    /// A configuration from environment variables, read through `lookup`
    /// (which returns a variable's value, or `None` when it is unset) rather
    /// than from the process environment.
    ///
    /// | setting | canonical variable, then alias |
    /// |---|---|
    /// | engine request limit | `DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT`, `DYN_ENGINE_REQUEST_LIMIT` |
    /// | engine request waiting limit | `DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT`, `DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT` |
    /// | request queue limit | `DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT`, `DYN_DYNAMO_REQUEST_QUEUE_LIMIT` |
    /// | engine waiting token limit | `DYN_BACKEND_ADMISSION_ENGINE_WAITING_TOKEN_LIMIT` |
    /// | engine token limit | `DYN_BACKEND_ADMISSION_ENGINE_TOKEN_LIMIT` |
    /// | request queue token limit | `DYN_BACKEND_ADMISSION_REQUEST_QUEUE_TOKEN_LIMIT` |
    /// | request queue wait limit (ms) | `DYN_BACKEND_ADMISSION_REQUEST_QUEUE_WAIT_LIMIT_MS` |
    /// | time-to-first-token objective (ms) | `DYN_BACKEND_ADMISSION_TTFT_OBJECTIVE_MS` |
    /// | inter-token objective (ms) | `DYN_BACKEND_ADMISSION_INTER_TOKEN_OBJECTIVE_MS` |
    /// | aging interval (ms) | `DYN_BACKEND_ADMISSION_AGING_INTERVAL_MS` |
    /// | queue delay target (ms) | `DYN_BACKEND_ADMISSION_QUEUE_DELAY_TARGET_MS` |
    /// | priority bands | `DYN_BACKEND_ADMISSION_PRIORITY_BANDS` (`-1,0,10`) |
    /// | tenant weights | `DYN_BACKEND_ADMISSION_TENANT_WEIGHTS` (`chat=4,batch=1`) |
    /// | adaptive waiting limit | `DYN_BACKEND_ADMISSION_ADAPTIVE_WAITING_LIMIT` (`true`, `false`; also `1`/`0`, `yes`/`no`, `on`/`off`) |
    /// | tenant request limit | `DYN_BACKEND_ADMISSION_TENANT_REQUEST_LIMIT` |
    /// | tenant token limit | `DYN_BACKEND_ADMISSION_TENANT_TOKEN_LIMIT` |
    /// | tenant queue limit | `DYN_BACKEND_ADMISSION_TENANT_QUEUE_LIMIT` (non-negative) |
    /// | limits of named tenants | `DYN_BACKEND_ADMISSION_TENANT_LIMITS` (`batch=2:20000:10,chat=8`) |
    ///
    /// Per setting, independently: a valid canonical value wins and its
    /// alias is not read; otherwise a valid alias value wins; otherwise the
    /// setting follows the engine (or, for the settings without an alias,
    /// stays off). Values are trimmed. Engine limits, token limits,
    /// durations and weights accept positive integers, the queue limit
    /// non-negative ones. A value that is empty, not an integer, negative,
    /// below the minimum or too large — or a band list with a band twice, a
    /// weight list with an empty name or a tenant twice — logs a warning
    /// naming the variable and the value, and the next source is used: a
    /// list is taken whole or not at all.
    ///
    /// ```
    /// use tower_admission::AdmissionConfig;
    ///
    /// let config = AdmissionConfig::from_lookup(|variable| match variable {
    ///     "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT" => Some(" 12 ".into()),
    ///     "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT" => Some("-1".into()), // warns
    ///     "DYN_DYNAMO_REQUEST_QUEUE_LIMIT" => Some("0".into()),
    ///     _ => None,
    /// });
    /// assert_eq!(config.explicit().engine_request_limit, None); // follows the engine
    /// assert_eq!(config.explicit().engine_request_waiting_limit, Some(12));
    /// assert_eq!(config.explicit().request_queue_limit, Some(0)); // from the alias
    /// ```
    ///
    /// With the `clap` feature, `AdmissionArgs` adds command-line flags that
    /// take precedence over both variables.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        resolve(Overrides::default(), &lookup)
    }
}

/// One setting's environment variables, the smallest value it accepts and
/// what it is when nothing sets it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setting {
    pub(crate) canonical: &'static str,
    pub(crate) alias: Option<&'static str>,
    pub(crate) minimum: usize,
    /// The default, in words: the warning of an invalid variable names it,
    /// and the flag's help shows it (`[default: …; env: …]`, checked by a
    /// test of the flags).
    pub(crate) default: &'static str,
}

/// The numeric settings, declared once, in the order of
/// [`AdmissionArgs`](crate::AdmissionArgs)'s fields: the builder method
/// each sets, its flag, its variables, the smallest value it accepts and
/// its default.
/// The environment resolver reads them from here, and the command line
/// hands its values over in this order ([`Overrides::numeric`]); a test
/// of the flags checks that their names and order agree with it.
pub(crate) const NUMERIC: [Numeric; 14] = [
    Numeric {
        name: "engine_request_limit",
        flag: "--engine-request-limit",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT",
            alias: Some("DYN_ENGINE_REQUEST_LIMIT"),
            minimum: 1,
            default: "the engine's max_num_seqs",
        },
        apply: |config, n| config.engine_request_limit(n),
    },
    Numeric {
        name: "engine_request_waiting_limit",
        flag: "--engine-request-waiting-limit",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT",
            alias: Some("DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT"),
            minimum: 1,
            default: "the engine's max_num_seqs",
        },
        apply: |config, n| config.engine_request_waiting_limit(n),
    },
    Numeric {
        name: "request_queue_limit",
        flag: "--request-queue-limit",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT",
            alias: Some("DYN_DYNAMO_REQUEST_QUEUE_LIMIT"),
            minimum: 0,
            default: "2 × the engine's max_num_seqs",
        },
        apply: |config, n| config.request_queue_limit(n),
    },
    Numeric {
        name: "engine_waiting_token_limit",
        flag: "--engine-waiting-token-limit",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_ENGINE_WAITING_TOKEN_LIMIT",
            alias: None,
            minimum: 1,
            default: "off",
        },
        apply: |config, n| config.engine_waiting_token_limit(n),
    },
    Numeric {
        name: "engine_token_limit",
        flag: "--engine-token-limit",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_ENGINE_TOKEN_LIMIT",
            alias: None,
            minimum: 1,
            default: "off",
        },
        apply: |config, n| config.engine_token_limit(n),
    },
    Numeric {
        name: "request_queue_token_limit",
        flag: "--request-queue-token-limit",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_TOKEN_LIMIT",
            alias: None,
            minimum: 1,
            default: "off",
        },
        apply: |config, n| config.request_queue_token_limit(n),
    },
    Numeric {
        name: "request_queue_wait_limit",
        flag: "--request-queue-wait-limit-ms",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_WAIT_LIMIT_MS",
            alias: None,
            minimum: 1,
            default: "off",
        },
        apply: |config, n| config.request_queue_wait_limit(millis(n)),
    },
    Numeric {
        name: "ttft_objective",
        flag: "--ttft-objective-ms",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_TTFT_OBJECTIVE_MS",
            alias: None,
            minimum: 1,
            default: "off",
        },
        apply: |config, n| config.ttft_objective(millis(n)),
    },
    Numeric {
        name: "inter_token_objective",
        flag: "--inter-token-objective-ms",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_INTER_TOKEN_OBJECTIVE_MS",
            alias: None,
            minimum: 1,
            default: "off",
        },
        apply: |config, n| config.inter_token_objective(millis(n)),
    },
    Numeric {
        name: "aging_interval",
        flag: "--aging-interval-ms",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_AGING_INTERVAL_MS",
            alias: None,
            minimum: 1,
            default: "off",
        },
        apply: |config, n| config.aging_interval(millis(n)),
    },
    Numeric {
        name: "queue_delay_target",
        flag: "--queue-delay-target-ms",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_QUEUE_DELAY_TARGET_MS",
            alias: None,
            minimum: 1,
            default: "off",
        },
        apply: |config, n| config.queue_delay_target(millis(n)),
    },
    Numeric {
        name: "tenant_request_limit",
        flag: "--tenant-request-limit",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_TENANT_REQUEST_LIMIT",
            alias: None,
            minimum: 1,
            default: "off",
        },
        apply: |config, n| config.tenant_request_limit(n),
    },
    Numeric {
        name: "tenant_token_limit",
        flag: "--tenant-token-limit",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_TENANT_TOKEN_LIMIT",
            alias: None,
            minimum: 1,
            default: "off",
        },
        apply: |config, n| config.tenant_token_limit(n),
    },
    Numeric {
        name: "tenant_queue_limit",
        flag: "--tenant-queue-limit",
        setting: Setting {
            canonical: "DYN_BACKEND_ADMISSION_TENANT_QUEUE_LIMIT",
            alias: None,
            minimum: 0,
            default: "off",
        },
        apply: |config, n| config.tenant_queue_limit(n),
    },
];

/// One numeric setting: see [`NUMERIC`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Numeric {
    /// The builder method of [`AdmissionConfig`] it sets.
    pub(crate) name: &'static str,
    /// Its command-line flag ([`AdmissionArgs`](crate::AdmissionArgs)).
    pub(crate) flag: &'static str,
    /// Its variables and minimum.
    pub(crate) setting: Setting,
    /// Sets it on a configuration (durations are in milliseconds).
    pub(crate) apply: fn(AdmissionConfig, usize) -> AdmissionConfig,
}

/// Where the limits of [`Limits`](crate::Limits) keep their source; the
/// durations keep none.
fn source_of<'a>(sources: &'a mut LimitSources, name: &str) -> Option<&'a mut LimitSource> {
    match name {
        "engine_request_limit" => Some(&mut sources.engine_request_limit),
        "engine_request_waiting_limit" => Some(&mut sources.engine_request_waiting_limit),
        "request_queue_limit" => Some(&mut sources.request_queue_limit),
        "engine_waiting_token_limit" => Some(&mut sources.engine_waiting_token_limit),
        "engine_token_limit" => Some(&mut sources.engine_token_limit),
        "request_queue_token_limit" => Some(&mut sources.request_queue_token_limit),
        _ => None,
    }
}

/// Milliseconds, for the settings that are durations.
fn millis(n: usize) -> Duration {
    Duration::from_millis(n as u64)
}

/// Comma-separated priorities that are bands: `-1,0,10`.
pub(crate) const PRIORITY_BANDS: &str = "DYN_BACKEND_ADMISSION_PRIORITY_BANDS";

/// Comma-separated tenant weights: `batch=1,chat=4`.
pub(crate) const TENANT_WEIGHTS: &str = "DYN_BACKEND_ADMISSION_TENANT_WEIGHTS";

/// Comma-separated limits of named tenants:
/// `batch=2:20000:10,chat=8`.
pub(crate) const TENANT_LIMITS: &str = "DYN_BACKEND_ADMISSION_TENANT_LIMITS";

/// Whether the engine request waiting limit adapts: `true` or `false`
/// (also `1`/`0`, `yes`/`no`, `on`/`off`).
pub(crate) const ADAPTIVE_WAITING_LIMIT: &str = "DYN_BACKEND_ADMISSION_ADAPTIVE_WAITING_LIMIT";

/// Values that take precedence over the environment (from the command
/// line). A setting given here is resolved without reading its variables.
#[derive(Debug, Clone, Default)]
pub(crate) struct Overrides {
    /// Each of [`NUMERIC`], in its order.
    pub(crate) numeric: [Option<usize>; NUMERIC.len()],
    pub(crate) priority_bands: Option<Vec<i32>>,
    pub(crate) tenant_weights: Option<Vec<(String, u32)>>,
    pub(crate) tenant_limits: Option<Vec<(String, TenantLimits)>>,
    pub(crate) adaptive_waiting_limit: Option<bool>,
}

/// Builds a configuration from `overrides`, then the variables `lookup`
/// returns, then the defaults, independently per setting.
pub(crate) fn resolve(
    overrides: Overrides,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> AdmissionConfig {
    let mut config = AdmissionConfig::new();
    for (numeric, given) in NUMERIC.iter().zip(overrides.numeric) {
        if let Some((n, source)) = numeric.setting.resolve(numeric.flag, given, lookup) {
            config = (numeric.apply)(config, n);
            if let Some(recorded) = source_of(&mut config.sources, numeric.name) {
                *recorded = source;
            }
        }
    }
    let priority_bands = overrides
        .priority_bands
        .or_else(|| read(PRIORITY_BANDS, lookup, &"the default", parse_priority_bands));
    if let Some(bands) = priority_bands {
        config = config.priority_bands(bands);
    }
    let tenant_weights = overrides
        .tenant_weights
        .or_else(|| read(TENANT_WEIGHTS, lookup, &"the default", parse_tenant_weights));
    for (tenant, weight) in tenant_weights.into_iter().flatten() {
        config = config.tenant_weight(tenant, weight);
    }
    let tenant_limits = overrides
        .tenant_limits
        .or_else(|| read(TENANT_LIMITS, lookup, &"the default", parse_tenant_limits));
    for (tenant, limits) in tenant_limits.into_iter().flatten() {
        config = config.tenant_limits(tenant, limits);
    }
    let adaptive = overrides.adaptive_waiting_limit.or_else(|| {
        read(
            ADAPTIVE_WAITING_LIMIT,
            lookup,
            &"the default (off)",
            parse_switch,
        )
    });
    if let Some(on) = adaptive {
        config = config.adaptive_waiting_limit(on);
    }
    config
}

/// Reads a variable of the process environment. A value that is not valid
/// Unicode is passed on (lossily) so that it is reported as invalid rather
/// than silently treated as unset.
pub(crate) fn process_env(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(value) => Some(value),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(value)) => Some(value.to_string_lossy().into_owned()),
    }
}

impl Setting {
    /// The value of `flag`, when given, else of the first of the two
    /// variables that holds a valid one, with where it came from.
    fn resolve(
        &self,
        flag: &'static str,
        given: Option<usize>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Option<(usize, LimitSource)> {
        if let Some(n) = given {
            return Some((n, LimitSource::Flag(flag)));
        }
        let from = |variable: &'static str, next: &dyn fmt::Display| {
            self.read(variable, lookup, next)
                .map(|n| (n, LimitSource::Variable(variable)))
        };
        let default = TheDefault(self.default);
        match self.alias {
            Some(alias) => from(self.canonical, &alias).or_else(|| from(alias, &default)),
            None => from(self.canonical, &default),
        }
    }

    /// The value of one variable, if it is set and valid; `next` names the
    /// source used instead, for the warning.
    fn read(
        &self,
        variable: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
        next: &dyn fmt::Display,
    ) -> Option<usize> {
        read(variable, lookup, next, |raw| parse(raw, self.minimum))
    }
}

/// "the default (…)": what an invalid variable of a numeric setting falls
/// back to, named in its warning (only then formatted).
struct TheDefault(&'static str);

impl fmt::Display for TheDefault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the default ({})", self.0)
    }
}

/// The value of `variable` as `parse` reads it, if it is set and valid;
/// otherwise a warning naming the variable, the value, what is wrong with
/// it and `next`, the source used instead.
fn read<T, E: fmt::Display>(
    variable: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    next: &dyn fmt::Display,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Option<T> {
    let raw = lookup(variable)?;
    match parse(&raw) {
        Ok(value) => Some(value),
        Err(invalid) => {
            tracing::warn!(
                variable,
                value = %raw,
                "ignoring {variable}={raw:?}: {invalid}; using {next} instead"
            );
            None
        }
    }
}

/// Why a value is not a valid setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Invalid {
    Empty,
    NotAnInteger,
    Negative,
    TooLarge,
    BelowMinimum(usize),
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::Empty => f.write_str("the value is empty"),
            Invalid::NotAnInteger => f.write_str("not an integer"),
            Invalid::Negative => f.write_str("negative values are not allowed"),
            Invalid::TooLarge => f.write_str("too large for this platform"),
            Invalid::BelowMinimum(1) => f.write_str("must be a positive integer (at least 1)"),
            Invalid::BelowMinimum(minimum) => write!(f, "must be at least {minimum}"),
        }
    }
}

/// Parses a setting's value: a decimal integer, surrounding whitespace
/// ignored, at least `minimum`. Shared by the environment and the command
/// line so that both accept exactly the same values.
pub(crate) fn parse(raw: &str, minimum: usize) -> Result<usize, Invalid> {
    let value = raw.trim();
    match value.parse::<usize>() {
        Ok(n) if n >= minimum => Ok(n),
        Ok(_) => Err(Invalid::BelowMinimum(minimum)),
        Err(error) => Err(match error.kind() {
            IntErrorKind::Empty => Invalid::Empty,
            IntErrorKind::PosOverflow => Invalid::TooLarge,
            _ if is_negative_integer(value) => Invalid::Negative,
            _ => Invalid::NotAnInteger,
        }),
    }
}

/// Parses a list of priority bands: comma-separated decimal integers that
/// fit an `i32`, each trimmed, none listed twice. Shared by the environment
/// and the command line.
pub(crate) fn parse_priority_bands(raw: &str) -> Result<Vec<i32>, String> {
    if raw.trim().is_empty() {
        return Err(Invalid::Empty.to_string());
    }
    let mut bands: Vec<i32> = Vec::new();
    for item in raw.split(',') {
        let item = item.trim();
        let band = match item.parse::<i32>() {
            Ok(band) => band,
            Err(error) => {
                return Err(match error.kind() {
                    IntErrorKind::Empty => {
                        "an empty item (expected comma-separated integers such as -1,0,10)"
                            .to_owned()
                    }
                    IntErrorKind::PosOverflow | IntErrorKind::NegOverflow => {
                        format!("{item:?} is out of range (a priority is a 32-bit integer)")
                    }
                    _ => format!("{item:?} is not an integer"),
                });
            }
        };
        if bands.contains(&band) {
            return Err(format!("{band} is listed twice"));
        }
        bands.push(band);
    }
    Ok(bands)
}

/// Parses one tenant weight, `NAME=WEIGHT`: a name that is not empty once
/// trimmed, and a positive integer weight that fits a `u32`.
pub(crate) fn parse_tenant_weight(raw: &str) -> Result<(String, u32), String> {
    let Some((name, weight)) = raw.split_once('=') else {
        return Err("expected NAME=WEIGHT, e.g. chat=4".to_owned());
    };
    let name = name.trim();
    if name.is_empty() {
        return Err("the tenant name is empty (expected NAME=WEIGHT)".to_owned());
    }
    let weight = parse(weight, 1)
        .and_then(|weight| u32::try_from(weight).map_err(|_| Invalid::TooLarge))
        .map_err(|invalid| match invalid {
            Invalid::TooLarge => format!(
                "the weight of tenant {name:?} is too large (at most {})",
                u32::MAX
            ),
            invalid => format!("the weight of tenant {name:?}: {invalid}"),
        })?;
    Ok((name.to_owned(), weight))
}

/// Parses a list of tenant weights, `NAME=WEIGHT,NAME=WEIGHT`, no tenant
/// named twice.
pub(crate) fn parse_tenant_weights(raw: &str) -> Result<Vec<(String, u32)>, String> {
    if raw.trim().is_empty() {
        return Err(Invalid::Empty.to_string());
    }
    let mut weights: Vec<(String, u32)> = Vec::new();
    for item in raw.split(',') {
        let (name, weight) = parse_tenant_weight(item)?;
        if weights.iter().any(|(seen, _)| *seen == name) {
            return Err(format!("tenant {name:?} is given two weights"));
        }
        weights.push((name, weight));
    }
    Ok(weights)
}

/// Parses the limits of one tenant, `NAME=REQUESTS[:TOKENS[:QUEUED]]`: a
/// name that is not empty once trimmed, then its engine request limit,
/// engine token limit and queue limit per rank. A field left empty
/// (`batch=:20000`) takes the default for every tenant; at least one is
/// given. Requests and tokens are positive, the queue limit may be 0.
pub(crate) fn parse_tenant_limit(raw: &str) -> Result<(String, TenantLimits), String> {
    const FORM: &str = "NAME=REQUESTS[:TOKENS[:QUEUED]], e.g. batch=2:20000:10";
    let Some((name, values)) = raw.split_once('=') else {
        return Err(format!("expected {FORM}"));
    };
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("the tenant name is empty (expected {FORM})"));
    }
    let fields: Vec<&str> = values.split(':').map(str::trim).collect();
    if fields.len() > 3 {
        return Err(format!(
            "tenant {name:?} has {} limits (expected {FORM})",
            fields.len()
        ));
    }
    let mut limits = TenantLimits::new();
    for ((field, what), minimum) in fields
        .iter()
        .zip(["request limit", "token limit", "queue limit"])
        .zip([1, 1, 0])
    {
        if field.is_empty() {
            continue;
        }
        let n = parse(field, minimum)
            .map_err(|invalid| format!("the {what} of tenant {name:?}: {invalid}"))?;
        limits = match what {
            "request limit" => limits.requests(n),
            "token limit" => limits.tokens(n),
            _ => limits.queued(n),
        };
    }
    if !limits.is_set() {
        return Err(format!("tenant {name:?} has no limit (expected {FORM})"));
    }
    Ok((name.to_owned(), limits))
}

/// Parses a list of tenant limits, `NAME=REQUESTS[:TOKENS[:QUEUED]]`
/// comma-separated, no tenant named twice.
pub(crate) fn parse_tenant_limits(raw: &str) -> Result<Vec<(String, TenantLimits)>, String> {
    if raw.trim().is_empty() {
        return Err(Invalid::Empty.to_string());
    }
    let mut all: Vec<(String, TenantLimits)> = Vec::new();
    for item in raw.split(',') {
        let (name, limits) = parse_tenant_limit(item)?;
        if all.iter().any(|(seen, _)| *seen == name) {
            return Err(format!("tenant {name:?} is given limits twice"));
        }
        all.push((name, limits));
    }
    Ok(all)
}

/// Parses an on/off setting: `true`, `1`, `yes`, `on` or `false`, `0`,
/// `no`, `off`, trimmed, in any case. Shared by the environment and the
/// command line.
pub(crate) fn parse_switch(raw: &str) -> Result<bool, String> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        "" => Err(Invalid::Empty.to_string()),
        _ => Err("expected true or false (also 1/0, yes/no, on/off)".to_owned()),
    }
}

fn is_negative_integer(value: &str) -> bool {
    value
        .strip_prefix('-')
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `parse` rejects each value with an error that says why.
    fn assert_rejected<T: fmt::Debug>(
        parse: impl Fn(&str) -> Result<T, String>,
        cases: &[(&str, &str)],
    ) {
        for (raw, why) in cases {
            let error = parse(raw).expect_err(raw);
            assert!(error.contains(why), "{raw:?}: {error}");
        }
    }

    #[test]
    fn parse_explains_each_kind_of_invalid_value() {
        assert_eq!(parse(" 7\t", 1), Ok(7));
        assert_eq!(parse("0", 0), Ok(0));
        assert_eq!(parse("", 1), Err(Invalid::Empty));
        assert_eq!(parse("   ", 0), Err(Invalid::Empty));
        assert_eq!(parse("seven", 1), Err(Invalid::NotAnInteger));
        assert_eq!(parse("7.5", 1), Err(Invalid::NotAnInteger));
        assert_eq!(parse("-1", 0), Err(Invalid::Negative));
        assert_eq!(parse("-", 0), Err(Invalid::NotAnInteger));
        assert_eq!(parse("0", 1), Err(Invalid::BelowMinimum(1)));
        assert_eq!(
            parse("99999999999999999999999999999", 1),
            Err(Invalid::TooLarge)
        );
    }

    #[test]
    fn priority_bands_are_distinct_integers() {
        assert_eq!(parse_priority_bands(" 10, -1 ,0"), Ok(vec![10, -1, 0]));
        assert_eq!(parse_priority_bands("7"), Ok(vec![7]));
        assert_rejected(
            parse_priority_bands,
            &[
                ("", "empty"),
                (" ", "empty"),
                ("1,,2", "empty item"),
                ("1,", "empty item"),
                ("1,x", "\"x\" is not an integer"),
                ("1.5", "not an integer"),
                ("2147483648", "out of range"),
                ("-2147483649", "out of range"),
                ("0,5,0", "0 is listed twice"),
            ],
        );
    }

    #[test]
    fn a_switch_is_true_or_false() {
        for raw in ["true", " TRUE ", "1", "yes", "On"] {
            assert_eq!(parse_switch(raw), Ok(true), "{raw:?}");
        }
        for raw in ["false", "0", "No", " off"] {
            assert_eq!(parse_switch(raw), Ok(false), "{raw:?}");
        }
        assert_rejected(
            parse_switch,
            &[
                ("", "empty"),
                ("2", "expected true or false"),
                ("enabled", "expected"),
            ],
        );
    }

    #[test]
    fn tenant_weights_name_a_tenant_and_a_positive_weight() {
        assert_eq!(
            parse_tenant_weights(" chat = 4 ,batch=1"),
            Ok(vec![("chat".to_owned(), 4), ("batch".to_owned(), 1)])
        );
        assert_rejected(
            parse_tenant_weights,
            &[
                ("", "empty"),
                ("chat", "expected NAME=WEIGHT"),
                ("=3", "name is empty"),
                ("chat=0", "positive integer"),
                ("chat=-1", "negative"),
                ("chat=x", "not an integer"),
                ("chat=", "empty"),
                ("chat=4294967296", "too large"),
                ("chat=1,chat=2", "two weights"),
                ("chat=1,", "expected NAME=WEIGHT"),
            ],
        );
    }
}
