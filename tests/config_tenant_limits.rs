//! Per-tenant limits from environment variables and command-line flags:
//! each read from its variable, a flag beating its variable, an invalid
//! variable warning (naming the variable and the value) and falling
//! through, an invalid flag failing (naming the flag and the value).

#[path = "support/logs.rs"]
mod logs;

use std::collections::HashMap;

use tower_admission::{AdmissionConfig, TenantLimits};

const REQUESTS: &str = "DYN_BACKEND_ADMISSION_TENANT_REQUEST_LIMIT";
const TOKENS: &str = "DYN_BACKEND_ADMISSION_TENANT_TOKEN_LIMIT";
const QUEUED: &str = "DYN_BACKEND_ADMISSION_TENANT_QUEUE_LIMIT";
const NAMED: &str = "DYN_BACKEND_ADMISSION_TENANT_LIMITS";

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| vars.get(name).cloned()
}

fn logs_of(f: impl FnOnce()) -> String {
    let logs = logs::Logs::at(tracing::Level::WARN);
    logs.capture(f);
    logs.text()
}

/// The limits in force for `tenant`: its own, each unset one from the
/// default for every tenant.
fn in_force(config: &AdmissionConfig, tenant: &str) -> TenantLimits {
    let explicit = config.explicit();
    let own = explicit
        .named_tenant_limits
        .get(tenant)
        .copied()
        .unwrap_or_default();
    let default = explicit.tenant_limits;
    limits(
        own.engine_requests().or(default.engine_requests()),
        own.engine_tokens().or(default.engine_tokens()),
        own.queued_requests().or(default.queued_requests()),
    )
}

fn limits(requests: Option<usize>, tokens: Option<usize>, queued: Option<usize>) -> TenantLimits {
    let mut limits = TenantLimits::new();
    if let Some(n) = requests {
        limits = limits.requests(n);
    }
    if let Some(n) = tokens {
        limits = limits.tokens(n);
    }
    if let Some(n) = queued {
        limits = limits.queued(n);
    }
    limits
}

#[test]
fn tenant_limits_are_off_unless_set() {
    let config = AdmissionConfig::from_lookup(env(&[]));
    assert!(config.explicit().tenant_limits == TenantLimits::new());
    assert_eq!(config.explicit().named_tenant_limits.len(), 0);
}

#[test]
fn tenant_limits_are_read_from_their_variables() {
    let config = AdmissionConfig::from_lookup(env(&[
        (REQUESTS, " 4 "),
        (TOKENS, "20000"),
        (QUEUED, "0"),
        (NAMED, "batch=2:50000:10, chat=8,bulk=::3"),
    ]));
    assert_eq!(
        config.explicit().tenant_limits,
        limits(Some(4), Some(20_000), Some(0))
    );
    assert_eq!(
        in_force(&config, "batch"),
        limits(Some(2), Some(50_000), Some(10))
    );
    assert_eq!(
        in_force(&config, "chat"),
        limits(Some(8), Some(20_000), Some(0))
    );
    assert_eq!(
        in_force(&config, "bulk"),
        limits(Some(4), Some(20_000), Some(3))
    );
}

#[test]
fn the_largest_integer_is_a_valid_limit() {
    let max = usize::MAX.to_string();
    let named = format!("big={max}:{max}:{max}");
    let config = AdmissionConfig::from_lookup(env(&[
        (REQUESTS, &max),
        (TOKENS, &max),
        (QUEUED, &max),
        (NAMED, &named),
    ]));
    let all = Some(usize::MAX);
    assert_eq!(config.explicit().tenant_limits, limits(all, all, all));
    assert_eq!(in_force(&config, "big"), limits(all, all, all));
}

#[test]
fn an_invalid_tenant_variable_warns_naming_it_and_the_value_and_stays_off() {
    const TOO_LARGE: &str = "340282366920938463463374607431768211456"; // 2^128
    let cases: &[(&str, &str, &str)] = &[
        (REQUESTS, "0", "positive integer"),
        (REQUESTS, "-1", "negative"),
        (REQUESTS, "many", "not an integer"),
        (REQUESTS, TOO_LARGE, "too large"),
        (TOKENS, "0", "positive integer"),
        (QUEUED, "-3", "negative"),
        (QUEUED, "", "empty"),
        (NAMED, "batch", "NAME=REQUESTS"),
        (NAMED, "=2", "name is empty"),
        (NAMED, "batch=0", "positive integer"),
        (NAMED, "batch=2:0", "positive integer"),
        (NAMED, "batch=2:10:-1", "negative"),
        (NAMED, "batch=2:10:1:4", "4 limits"),
        (NAMED, "batch=::", "no limit"),
        (NAMED, "batch=1,batch=2", "twice"),
        (NAMED, "chat=1,batch=x", "not an integer"),
    ];
    for &(variable, value, reason) in cases {
        let logs = logs_of(|| {
            let config = AdmissionConfig::from_lookup(env(&[(variable, value)]));
            assert!(
                config.explicit().tenant_limits == TenantLimits::new(),
                "{variable}={value}"
            );
            assert_eq!(
                config.explicit().named_tenant_limits.len(),
                0,
                "a list is taken whole or not at all: {value}"
            );
        });
        assert_eq!(logs.lines().count(), 1, "one warning: {logs}");
        assert!(logs.contains("WARN"), "{logs}");
        assert!(logs.contains(variable), "names the variable: {logs}");
        assert!(
            logs.contains(&format!("{value:?}")),
            "names the value: {logs}"
        );
        assert!(logs.contains(reason), "says why ({reason}): {logs}");
    }
}

#[test]
fn an_invalid_tenant_variable_leaves_the_others_as_they_are() {
    let logs = logs_of(|| {
        let config = AdmissionConfig::from_lookup(env(&[(REQUESTS, "zero"), (QUEUED, "5")]));
        assert_eq!(config.explicit().tenant_limits, limits(None, None, Some(5)));
    });
    assert!(logs.contains(REQUESTS), "{logs}");
}

#[cfg(feature = "clap")]
mod cli {
    use clap::Parser;
    use tower_admission::AdmissionArgs;

    use super::*;

    #[derive(Debug, Parser)]
    struct Worker {
        #[command(flatten)]
        admission: AdmissionArgs,
    }

    fn parse(args: &[&str]) -> Result<Worker, clap::Error> {
        Worker::try_parse_from(std::iter::once("worker").chain(args.iter().copied()))
    }

    #[test]
    fn tenant_flags_beat_their_variables() {
        let worker = parse(&[
            "--tenant-request-limit",
            "2",
            "--tenant-queue-limit=0",
            "--tenant-limit",
            "batch=1:1000:4",
            "--tenant-limit",
            "chat=6",
        ])
        .unwrap();
        let config = worker.admission.resolve_with(env(&[
            (REQUESTS, "9"),
            (TOKENS, "700"),
            (QUEUED, "9"),
            (NAMED, "other=1"),
        ]));
        assert_eq!(
            config.explicit().tenant_limits,
            limits(Some(2), Some(700), Some(0)),
            "the token limit from its variable, the others from their flags"
        );
        assert_eq!(
            in_force(&config, "batch"),
            limits(Some(1), Some(1000), Some(4))
        );
        assert_eq!(
            in_force(&config, "chat"),
            limits(Some(6), Some(700), Some(0))
        );
        assert_eq!(
            config.explicit().named_tenant_limits.len(),
            2,
            "any --tenant-limit keeps the variable unread"
        );
    }

    #[test]
    fn the_largest_integer_is_a_valid_flag() {
        let max = usize::MAX.to_string();
        let named = format!("big={max}:{max}:{max}");
        let worker = parse(&[
            "--tenant-request-limit",
            &max,
            "--tenant-token-limit",
            &max,
            "--tenant-queue-limit",
            &max,
            "--tenant-limit",
            &named,
        ])
        .unwrap();
        let config = worker.admission.resolve_with(env(&[]));
        let all = Some(usize::MAX);
        assert_eq!(config.explicit().tenant_limits, limits(all, all, all));
        assert_eq!(in_force(&config, "big"), limits(all, all, all));
    }

    #[test]
    fn invalid_tenant_flags_fail_with_the_flag_and_the_value() {
        let cases: &[(&[&str], &str, &str)] = &[
            (&["--tenant-request-limit", "0"], "'0'", "positive integer"),
            (&["--tenant-request-limit", "-2"], "'-2'", "negative"),
            (
                &["--tenant-token-limit", "lots"],
                "'lots'",
                "not an integer",
            ),
            (&["--tenant-queue-limit", "-1"], "'-1'", "negative"),
            (&["--tenant-limit", "batch"], "'batch'", "NAME=REQUESTS"),
            (&["--tenant-limit", "=1"], "'=1'", "name is empty"),
            (
                &["--tenant-limit", "batch=0"],
                "'batch=0'",
                "positive integer",
            ),
            (
                &["--tenant-limit", "batch=1:x"],
                "'batch=1:x'",
                "not an integer",
            ),
            (&["--tenant-limit", "batch=::"], "'batch=::'", "no limit"),
        ];
        for &(args, value, reason) in cases {
            let error = parse(args).expect_err(&format!("{args:?} must fail"));
            assert_eq!(
                error.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{args:?}"
            );
            let message = error.to_string();
            assert!(message.contains(args[0]), "names the flag: {message}");
            assert!(message.contains(value), "names the value: {message}");
            assert!(message.contains(reason), "says why: {message}");
        }
    }

    #[test]
    fn the_help_lists_the_tenant_flags_and_their_variables() {
        let help = parse(&["--help"]).unwrap_err().to_string();
        for needle in [
            "--tenant-request-limit <N>",
            "--tenant-token-limit <N>",
            "--tenant-queue-limit <N>",
            "--tenant-limit <NAME=REQUESTS[:TOKENS[:QUEUED]]>",
            REQUESTS,
            TOKENS,
            QUEUED,
            NAMED,
        ] {
            assert!(help.contains(needle), "{needle} in help:\n{help}");
        }
    }
}
