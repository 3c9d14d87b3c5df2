//! Configuration from environment variables (behaviour §5): precedence,
//! trimming, invalid values, warnings. The flags are in `config_cli.rs`.

#[path = "support/logs.rs"]
mod logs;

use std::cell::RefCell;
use std::time::Duration;

use tower_admission::{AdmissionConfig, EngineCapacity};

#[path = "support/config_env.rs"]
mod config_env;
use config_env::*;

struct Case {
    vars: &'static [(&'static str, &'static str)],
    expect: Option<usize>,
    why: &'static str,
}

/// Runs `cases` for the setting at `index` of [`explicit`] and checks that
/// the other two settings stay unset.
fn check(index: usize, cases: &[Case]) {
    for case in cases {
        let config = AdmissionConfig::from_lookup(env(case.vars));
        let got = explicit(&config);
        assert_eq!(got[index], case.expect, "{}: {:?}", case.why, case.vars);
        for (other, value) in got.iter().enumerate() {
            if other != index {
                assert_eq!(*value, None, "{}: setting {other} untouched", case.why);
            }
        }
    }
}

#[test]
fn engine_request_limit_canonical_then_alias_then_default() {
    check(
        0,
        &[
            Case {
                vars: &[(REQUEST, "7"), (REQUEST_ALIAS, "5")],
                expect: Some(7),
                why: "canonical beats alias",
            },
            Case {
                vars: &[(REQUEST_ALIAS, "5")],
                expect: Some(5),
                why: "alias alone",
            },
            Case {
                vars: &[(REQUEST, "invalid"), (REQUEST_ALIAS, "5")],
                expect: Some(5),
                why: "non-numeric canonical",
            },
            Case {
                vars: &[(REQUEST, ""), (REQUEST_ALIAS, "5")],
                expect: Some(5),
                why: "empty canonical",
            },
            Case {
                vars: &[(REQUEST, "0"), (REQUEST_ALIAS, "5")],
                expect: Some(5),
                why: "zero canonical",
            },
            Case {
                vars: &[(REQUEST, "-1"), (REQUEST_ALIAS, "5")],
                expect: Some(5),
                why: "negative canonical",
            },
            Case {
                vars: &[(REQUEST, "2.5"), (REQUEST_ALIAS, "5")],
                expect: Some(5),
                why: "fractional canonical",
            },
            Case {
                vars: &[(REQUEST, " 7 ")],
                expect: Some(7),
                why: "trimmed",
            },
            Case {
                vars: &[(REQUEST, "\t7\n"), (REQUEST_ALIAS, "5")],
                expect: Some(7),
                why: "trimmed beats alias",
            },
            Case {
                vars: &[(REQUEST, "0"), (REQUEST_ALIAS, "0")],
                expect: None,
                why: "both zero: follows the engine",
            },
            Case {
                vars: &[(REQUEST, TOO_LARGE)],
                expect: None,
                why: "overflowing",
            },
            Case {
                vars: &[(REQUEST, TOO_LARGE), (REQUEST_ALIAS, " 9")],
                expect: Some(9),
                why: "overflowing canonical",
            },
            Case {
                vars: &[],
                expect: None,
                why: "unset",
            },
        ],
    );
}

#[test]
fn engine_request_waiting_limit_canonical_then_alias_then_default() {
    check(
        1,
        &[
            Case {
                vars: &[(WAITING, "12"), (WAITING_ALIAS, "5")],
                expect: Some(12),
                why: "canonical beats alias",
            },
            Case {
                vars: &[(WAITING_ALIAS, "5")],
                expect: Some(5),
                why: "alias alone",
            },
            Case {
                vars: &[(WAITING, "twelve"), (WAITING_ALIAS, "5")],
                expect: Some(5),
                why: "non-numeric canonical",
            },
            Case {
                vars: &[(WAITING, ""), (WAITING_ALIAS, "5")],
                expect: Some(5),
                why: "empty canonical",
            },
            Case {
                vars: &[(WAITING, "0"), (WAITING_ALIAS, "5")],
                expect: Some(5),
                why: "zero canonical",
            },
            Case {
                vars: &[(WAITING, "-3"), (WAITING_ALIAS, "5")],
                expect: Some(5),
                why: "negative canonical",
            },
            Case {
                vars: &[(WAITING, " 12 ")],
                expect: Some(12),
                why: "trimmed",
            },
            Case {
                vars: &[(WAITING, "0"), (WAITING_ALIAS, "0")],
                expect: None,
                why: "both zero: follows the engine",
            },
            Case {
                vars: &[(WAITING_ALIAS, "-5")],
                expect: None,
                why: "negative alias",
            },
            Case {
                vars: &[(WAITING, TOO_LARGE)],
                expect: None,
                why: "overflowing",
            },
        ],
    );
}

#[test]
fn request_queue_limit_accepts_zero_and_prefers_the_canonical_variable() {
    check(
        2,
        &[
            Case {
                vars: &[(QUEUE, "40"), (QUEUE_ALIAS, "5")],
                expect: Some(40),
                why: "canonical beats alias",
            },
            Case {
                vars: &[(QUEUE_ALIAS, "5")],
                expect: Some(5),
                why: "alias alone",
            },
            Case {
                vars: &[(QUEUE, "0"), (QUEUE_ALIAS, "5")],
                expect: Some(0),
                why: "zero is valid: no queue",
            },
            Case {
                vars: &[(QUEUE, " 0 "), (QUEUE_ALIAS, "5")],
                expect: Some(0),
                why: "trimmed zero beats alias",
            },
            Case {
                vars: &[(QUEUE_ALIAS, "0")],
                expect: Some(0),
                why: "zero alias",
            },
            Case {
                vars: &[(QUEUE, "-1"), (QUEUE_ALIAS, "5")],
                expect: Some(5),
                why: "negative canonical",
            },
            Case {
                vars: &[(QUEUE, "none"), (QUEUE_ALIAS, "5")],
                expect: Some(5),
                why: "non-numeric canonical",
            },
            Case {
                vars: &[(QUEUE, ""), (QUEUE_ALIAS, "")],
                expect: None,
                why: "both empty",
            },
            Case {
                vars: &[(QUEUE, TOO_LARGE), (QUEUE_ALIAS, TOO_LARGE)],
                expect: None,
                why: "both overflowing",
            },
        ],
    );
}

#[test]
fn each_setting_resolves_independently() {
    let config = AdmissionConfig::from_lookup(env(&[
        (REQUEST, "bad"),
        (REQUEST_ALIAS, "8"),
        (WAITING, "4"),
        (QUEUE_ALIAS, "0"),
    ]));
    assert_eq!(explicit(&config), [Some(8), Some(4), Some(0)]);

    // An overridden engine limit does not change the queue default, which
    // still follows the engine.
    let config = AdmissionConfig::from_lookup(env(&[(REQUEST, "3")]));
    let limits = config.limits_for(Some(EngineCapacity::new(64, 2)));
    assert_eq!(limits.engine_request_limit, 3);
    assert_eq!(limits.engine_request_waiting_limit, 64);
    assert_eq!(limits.request_queue_limit, 128);
    assert_eq!(limits.engine_waiting_token_limit, None);
}

#[test]
fn a_valid_canonical_value_means_the_alias_is_never_read() {
    let read = RefCell::new(Vec::new());
    let vars = env(&[
        (REQUEST, "7"),
        (REQUEST_ALIAS, "5"),
        (WAITING, "oops"),
        (WAITING_ALIAS, "6"),
        (QUEUE, "0"),
        (QUEUE_ALIAS, "5"),
    ]);
    let config = AdmissionConfig::from_lookup(|name| {
        read.borrow_mut().push(name.to_owned());
        vars(name)
    });
    assert_eq!(explicit(&config), [Some(7), Some(6), Some(0)]);
    // Then the token limits' variables, which have no aliases.
    assert_eq!(
        *read.borrow(),
        [
            REQUEST,
            WAITING,
            WAITING_ALIAS,
            QUEUE,
            WAITING_TOKENS,
            ENGINE_TOKENS,
            QUEUE_TOKENS,
            QUEUE_WAIT_MS,
            TTFT_MS,
            INTER_TOKEN_MS,
            AGING_MS,
            "DYN_BACKEND_ADMISSION_QUEUE_DELAY_TARGET_MS",
            "DYN_BACKEND_ADMISSION_TENANT_REQUEST_LIMIT",
            "DYN_BACKEND_ADMISSION_TENANT_TOKEN_LIMIT",
            "DYN_BACKEND_ADMISSION_TENANT_QUEUE_LIMIT",
            BANDS,
            WEIGHTS,
            "DYN_BACKEND_ADMISSION_TENANT_LIMITS",
            ADAPTIVE
        ]
    );
}

#[test]
fn from_env_reads_the_process_environment() {
    // The environment is process-wide: set it in a child process running
    // only `from_env_child`, rather than in this multi-threaded one.
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "from_env_child", "--ignored", "--quiet"])
        .env(CHILD, "1")
        .env(REQUEST, "nope")
        .env(REQUEST_ALIAS, " 11 ")
        .env(WAITING, "21")
        .env_remove(WAITING_ALIAS)
        .env_remove(QUEUE)
        .env_remove(QUEUE_ALIAS)
        .env(AGING_MS, " 250 ")
        .env(BANDS, "5,0")
        .env(WEIGHTS, "chat=3")
        .env_remove(WAITING_TOKENS)
        .env_remove(ENGINE_TOKENS)
        .env_remove(QUEUE_TOKENS)
        .env_remove(QUEUE_WAIT_MS)
        .env_remove(TTFT_MS)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "the child's assertions failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("1 passed"),
        "the child ran: {output:?}"
    );
}

const CHILD: &str = "TOWER_ADMISSION_TEST_FROM_ENV_CHILD";

#[test]
#[ignore = "run by from_env_reads_the_process_environment"]
fn from_env_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let config = AdmissionConfig::from_env();
    assert_eq!(explicit(&config), [Some(11), Some(21), None]);
    assert_eq!(
        config.explicit().aging_interval,
        Some(Duration::from_millis(250))
    );
    assert_eq!(config.explicit().priority_bands, &[0, 5]);
    assert_eq!(weight_of(&config, "chat"), 3);
    assert_eq!(config.explicit().request_queue_wait_limit, None);
}

/// Captures what `tracing` logs at `WARN` and above while `f` runs on
/// this thread.
fn logs_of(f: impl FnOnce()) -> String {
    let logs = logs::Logs::at(tracing::Level::WARN);
    logs.capture(f);
    logs.text()
}

#[test]
fn an_invalid_value_warns_naming_the_variable_and_the_value() {
    let logs = logs_of(|| {
        let config = AdmissionConfig::from_lookup(env(&[
            (REQUEST, " -1 "),
            (REQUEST_ALIAS, "5"),
            (QUEUE_ALIAS, "many"),
        ]));
        assert_eq!(explicit(&config), [Some(5), None, None]);
    });
    let lines: Vec<&str> = logs.lines().collect();
    assert_eq!(lines.len(), 2, "one warning per invalid value:\n{logs}");
    assert!(lines[0].contains("WARN"), "{logs}");
    assert!(
        lines[0].contains(REQUEST) && lines[0].contains("\" -1 \""),
        "{logs}"
    );
    assert!(lines[0].contains("negative"), "{logs}");
    assert!(
        lines[0].contains(REQUEST_ALIAS),
        "says what is used instead: {logs}"
    );
    assert!(
        lines[1].contains(QUEUE_ALIAS) && lines[1].contains("\"many\""),
        "{logs}"
    );
    assert!(lines[1].contains("not an integer"), "{logs}");
    assert!(
        lines[1].contains("the default (2 × the engine's max_num_seqs)"),
        "names the default it falls back to: {logs}"
    );
}

#[test]
fn valid_and_unset_values_log_nothing() {
    let logs = logs_of(|| {
        let _ = AdmissionConfig::from_lookup(env(&[(REQUEST, " 7 "), (QUEUE_ALIAS, "0")]));
    });
    assert_eq!(logs, "");
}

#[test]
fn token_limits_are_off_unless_set_and_read_from_their_variables() {
    let config = AdmissionConfig::from_lookup(env(&[]));
    let limits = config.limits_for(None);
    assert_eq!(limits.engine_waiting_token_limit, None);
    assert_eq!(limits.engine_token_limit, None);
    assert_eq!(limits.request_queue_token_limit, None);

    let config = AdmissionConfig::from_lookup(env(&[
        (WAITING_TOKENS, " 1800 "),
        (ENGINE_TOKENS, "64000"),
        (QUEUE_TOKENS, "4000"),
    ]));
    let limits = config.limits_for(Some(EngineCapacity::new(64, 2)));
    assert_eq!(limits.engine_waiting_token_limit, Some(1800));
    assert_eq!(limits.engine_token_limit, Some(64000));
    assert_eq!(limits.request_queue_token_limit, Some(4000));
}

#[test]
fn an_invalid_token_limit_warns_naming_the_variable_and_stays_off() {
    let logs = logs_of(|| {
        let config = AdmissionConfig::from_lookup(env(&[(WAITING_TOKENS, "0")]));
        assert_eq!(config.explicit().engine_waiting_token_limit, None);
    });
    assert!(
        logs.contains(WAITING_TOKENS) && logs.contains("\"0\""),
        "{logs}"
    );
    assert!(logs.contains("positive integer"), "{logs}");
}

#[test]
#[should_panic(expected = "invalid engine_waiting_token_limit: 0")]
fn a_zero_token_limit_in_code_panics_naming_the_setting() {
    let _ = AdmissionConfig::new().engine_waiting_token_limit(0);
}

#[test]
fn deadlines_are_off_unless_set_and_read_from_their_variables() {
    let config = AdmissionConfig::from_lookup(env(&[]));
    assert!(!config.deadlines_enabled());
    let config = AdmissionConfig::from_lookup(env(&[(QUEUE_WAIT_MS, "250"), (TTFT_MS, "x")]));
    assert_eq!(
        config.explicit().request_queue_wait_limit,
        Some(Duration::from_millis(250))
    );
    assert_eq!(config.explicit().ttft_objective, None);
    assert!(config.deadlines_enabled());
}

#[test]
fn the_inter_token_objective_is_off_unless_set_and_read_from_its_variable() {
    let config = AdmissionConfig::from_lookup(env(&[]));
    assert_eq!(config.explicit().inter_token_objective, None);
    let config = AdmissionConfig::from_lookup(env(&[(INTER_TOKEN_MS, " 40 ")]));
    assert_eq!(
        config.explicit().inter_token_objective,
        Some(Duration::from_millis(40))
    );
    assert!(!config.deadlines_enabled(), "a measure, not a deadline");
    let config = AdmissionConfig::new().inter_token_objective(Duration::from_millis(25));
    assert_eq!(
        config.explicit().inter_token_objective,
        Some(Duration::from_millis(25))
    );
}

#[test]
fn an_invalid_inter_token_objective_warns_naming_the_variable_and_the_value_and_stays_off() {
    let cases: &[(&str, &str)] = &[
        ("0", "positive integer"),
        ("-5", "negative"),
        ("fast", "not an integer"),
        (TOO_LARGE, "too large"),
    ];
    for &(value, reason) in cases {
        let logs = logs_of(|| {
            let config = AdmissionConfig::from_lookup(env(&[(INTER_TOKEN_MS, value)]));
            assert_eq!(config.explicit().inter_token_objective, None, "{value}");
        });
        assert_eq!(logs.lines().count(), 1, "one warning: {logs}");
        assert!(logs.contains("WARN"), "{logs}");
        assert!(logs.contains(INTER_TOKEN_MS), "names the variable: {logs}");
        assert!(
            logs.contains(&format!("{value:?}")),
            "names the value: {logs}"
        );
        assert!(logs.contains(reason), "says why ({reason}): {logs}");
    }
}

#[test]
#[should_panic(expected = "invalid inter_token_objective: 0")]
fn a_zero_inter_token_objective_in_code_panics_naming_the_setting() {
    let _ = AdmissionConfig::new().inter_token_objective(Duration::ZERO);
}

#[test]
fn qos_settings_are_off_unless_set_and_read_from_their_variables() {
    let config = AdmissionConfig::from_lookup(env(&[]));
    assert_eq!(config.explicit().aging_interval, None);
    assert_eq!(config.explicit().priority_bands, &[] as &[i32]);
    assert_eq!(config.explicit().tenant_weights.len(), 0);
    assert!(!config.deadlines_enabled());

    let config = AdmissionConfig::from_lookup(env(&[
        (AGING_MS, " 2000 "),
        (BANDS, " 10, -1,0 "),
        (WEIGHTS, "chat = 4, batch=1"),
    ]));
    assert_eq!(
        config.explicit().aging_interval,
        Some(Duration::from_secs(2))
    );
    assert_eq!(config.explicit().priority_bands, &[-1, 0, 10]);
    let explicit = config.explicit();
    let weights: Vec<(&str, u32)> = explicit
        .tenant_weights
        .iter()
        .map(|(tenant, weight)| (tenant.as_str(), *weight))
        .collect();
    assert_eq!(weights, [("batch", 1), ("chat", 4)]);
    assert_eq!(weight_of(&config, "unnamed"), 1);
    assert!(config.deadlines_enabled(), "aging keeps time");
}

#[test]
fn an_invalid_qos_value_warns_naming_the_variable_and_the_value_and_stays_off() {
    let cases: &[(&str, &str, &str)] = &[
        (AGING_MS, "0", "positive integer"),
        (AGING_MS, "-5", "negative"),
        (AGING_MS, "soon", "not an integer"),
        (BANDS, "", "empty"),
        (BANDS, "0,x", "\"x\" is not an integer"),
        (BANDS, "0,,5", "empty item"),
        (BANDS, "5,0,5", "5 is listed twice"),
        (BANDS, "99999999999", "out of range"),
        (WEIGHTS, "chat=0", "positive integer"),
        (WEIGHTS, "chat=4,=2", "name is empty"),
        (WEIGHTS, "chat", "NAME=WEIGHT"),
        (WEIGHTS, "chat=four", "not an integer"),
        (WEIGHTS, "chat=1,chat=2", "two weights"),
        (WEIGHTS, "chat=99999999999", "too large"),
    ];
    for &(variable, value, reason) in cases {
        let logs = logs_of(|| {
            let config = AdmissionConfig::from_lookup(env(&[(variable, value)]));
            assert_eq!(config.explicit().aging_interval, None, "{variable}={value}");
            assert!(config.explicit().priority_bands.is_empty(), "{value}");
            assert_eq!(
                config.explicit().tenant_weights.len(),
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
        assert!(logs.contains("the default"), "{logs}");
    }
}
