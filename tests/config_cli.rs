//! Configuration from command-line flags (behaviour §5): a flag beats both
//! of its setting's variables, invalid values fail naming the flag, the
//! help lists the flags with their variables.

#![cfg(feature = "clap")]

#[path = "support/config_env.rs"]
mod config_env;

use std::cell::RefCell;
use std::time::Duration;

use clap::Parser;
use config_env::*;
use tower_admission::AdmissionArgs;

#[derive(Debug, Parser)]
struct Worker {
    #[command(flatten)]
    admission: AdmissionArgs,
    #[arg(long, default_value_t = 8000)]
    port: u16,
}

fn parse(args: &[&str]) -> Result<Worker, clap::Error> {
    Worker::try_parse_from(std::iter::once("worker").chain(args.iter().copied()))
}

#[test]
fn flags_beat_both_variables_per_setting() {
    let worker = parse(&[
        "--engine-request-limit",
        "3",
        "--request-queue-limit=0",
        "--port",
        "9000",
    ])
    .unwrap();
    assert_eq!(worker.port, 9000);
    let config = worker.admission.resolve_with(env(&[
        (REQUEST, "7"),
        (REQUEST_ALIAS, "5"),
        (WAITING_ALIAS, "6"),
        (QUEUE, "40"),
    ]));
    assert_eq!(explicit(&config), [Some(3), Some(6), Some(0)]);
}

#[test]
fn without_flags_the_environment_and_defaults_decide() {
    let worker = parse(&[]).unwrap();
    assert_eq!(worker.admission, AdmissionArgs::default());
    let config = worker.admission.resolve_with(env(&[(QUEUE, " 0 ")]));
    assert_eq!(explicit(&config), [None, None, Some(0)]);
}

#[test]
fn a_flag_keeps_its_settings_variables_unread() {
    let worker = parse(&["--engine-request-waiting-limit", "12"]).unwrap();
    let read = RefCell::new(Vec::new());
    let config = worker.admission.resolve_with(|name| {
        read.borrow_mut().push(name.to_owned());
        None
    });
    assert_eq!(explicit(&config), [None, Some(12), None]);
    assert_eq!(
        *read.borrow(),
        [
            REQUEST,
            REQUEST_ALIAS,
            QUEUE,
            QUEUE_ALIAS,
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
fn invalid_flag_values_fail_with_the_flag_and_the_value() {
    let cases: &[(&[&str], &str, &str)] = &[
        (&["--engine-request-limit", "0"], "'0'", "positive integer"),
        (&["--engine-request-limit", "-2"], "'-2'", "negative"),
        (&["--engine-request-limit=lots"], "'lots'", "not an integer"),
        (
            &["--engine-request-waiting-limit", "0"],
            "'0'",
            "positive integer",
        ),
        (
            &["--engine-request-waiting-limit", "1.5"],
            "'1.5'",
            "not an integer",
        ),
        (&["--request-queue-limit", "-1"], "'-1'", "negative"),
        (&["--request-queue-limit", "x"], "'x'", "not an integer"),
        (
            &["--request-queue-limit", TOO_LARGE],
            TOO_LARGE,
            "too large",
        ),
        (
            &["--engine-waiting-token-limit", "0"],
            "'0'",
            "positive integer",
        ),
        (&["--engine-token-limit", "-5"], "'-5'", "negative"),
        (
            &["--request-queue-token-limit", "1e3"],
            "'1e3'",
            "not an integer",
        ),
    ];
    for &(args, value, reason) in cases {
        let error = parse(args).expect_err(&format!("{args:?} must fail"));
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::ValueValidation,
            "{args:?}"
        );
        let message = error.to_string();
        let flag = args[0].split('=').next().unwrap();
        assert!(message.contains(flag), "names the flag: {message}");
        assert!(message.contains(value), "names the value: {message}");
        assert!(message.contains(reason), "says why: {message}");
    }
}

#[test]
fn token_limit_flags_beat_their_variables() {
    let worker = parse(&[
        "--engine-waiting-token-limit",
        "1000",
        "--engine-token-limit",
        "8000",
        "--request-queue-token-limit",
        "1800",
    ])
    .unwrap();
    let config = worker
        .admission
        .resolve_with(env(&[(WAITING_TOKENS, "5"), (QUEUE_TOKENS, "7")]));
    assert_eq!(config.explicit().engine_waiting_token_limit, Some(1000));
    assert_eq!(config.explicit().engine_token_limit, Some(8000));
    assert_eq!(config.explicit().request_queue_token_limit, Some(1800));
}

#[test]
fn the_deadline_flags_set_the_wait_limit_and_the_objective() {
    let worker = parse(&[
        "--request-queue-wait-limit-ms",
        "1500",
        "--ttft-objective-ms",
        "1000",
    ])
    .unwrap();
    let config = worker.admission.resolve_with(env(&[(TTFT_MS, "5")]));
    assert_eq!(
        config.explicit().request_queue_wait_limit,
        Some(Duration::from_millis(1500))
    );
    assert_eq!(
        config.explicit().ttft_objective,
        Some(Duration::from_secs(1))
    );
    assert!(config.deadlines_enabled());
    let error = parse(&["--ttft-objective-ms", "0"])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("--ttft-objective-ms") && error.contains("'0'"),
        "{error}"
    );
    let help = parse(&["--help"]).unwrap_err().to_string();
    assert!(
        help.contains("--request-queue-wait-limit-ms <MS>"),
        "{help}"
    );
}

#[test]
fn the_inter_token_objective_flag_beats_its_variable_and_keeps_time_off() {
    let worker = parse(&["--inter-token-objective-ms", "50"]).unwrap();
    let config = worker.admission.resolve_with(env(&[(INTER_TOKEN_MS, "5")]));
    assert_eq!(
        config.explicit().inter_token_objective,
        Some(Duration::from_millis(50))
    );
    // A measure of goodput, not an admission rule: the gate keeps no time
    // for it.
    assert!(!config.deadlines_enabled());
    let from_variable = parse(&[])
        .unwrap()
        .admission
        .resolve_with(env(&[(INTER_TOKEN_MS, " 80 ")]));
    assert_eq!(
        from_variable.explicit().inter_token_objective,
        Some(Duration::from_millis(80))
    );
    for value in ["0", "-3", "soon"] {
        let error = parse(&["--inter-token-objective-ms", value])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--inter-token-objective-ms") && error.contains(&format!("'{value}'")),
            "{error}"
        );
    }
    let help = parse(&["--help"]).unwrap_err().to_string();
    assert!(help.contains("--inter-token-objective-ms <MS>"), "{help}");
}

#[test]
fn the_qos_flags_beat_their_variables() {
    let worker = parse(&[
        "--aging-interval-ms",
        "500",
        "--priority-bands",
        "-1,0,10",
        "--tenant-weight",
        "chat=4",
        "--tenant-weight=batch = 1",
    ])
    .unwrap();
    assert_eq!(worker.admission.priority_bands, Some(vec![-1, 0, 10]));
    let read = RefCell::new(Vec::new());
    let vars = env(&[(AGING_MS, "9"), (BANDS, "1,2"), (WEIGHTS, "other=7")]);
    let config = worker.admission.resolve_with(|name| {
        read.borrow_mut().push(name.to_owned());
        vars(name)
    });
    assert_eq!(
        config.explicit().aging_interval,
        Some(Duration::from_millis(500))
    );
    assert_eq!(config.explicit().priority_bands, &[-1, 0, 10]);
    assert_eq!(weight_of(&config, "chat"), 4);
    assert_eq!(weight_of(&config, "batch"), 1);
    assert_eq!(weight_of(&config, "other"), 1, "the variable is not read");
    for variable in [AGING_MS, BANDS, WEIGHTS] {
        assert!(
            !read.borrow().iter().any(|name| name == variable),
            "{variable}"
        );
    }

    // Without the flags, the variables decide.
    let config = parse(&[]).unwrap().admission.resolve_with(env(&[
        (AGING_MS, "9"),
        (BANDS, "2,1"),
        (WEIGHTS, "other=7"),
    ]));
    assert_eq!(
        config.explicit().aging_interval,
        Some(Duration::from_millis(9))
    );
    assert_eq!(config.explicit().priority_bands, &[1, 2]);
    assert_eq!(weight_of(&config, "other"), 7);
}

#[test]
fn a_tenant_named_by_two_flags_gets_the_last_weight() {
    let worker = parse(&["--tenant-weight", "chat=4", "--tenant-weight", "chat=2"]).unwrap();
    let config = worker.admission.resolve_with(env(&[]));
    assert_eq!(weight_of(&config, "chat"), 2);
}

#[test]
fn invalid_qos_flag_values_fail_with_the_flag_and_the_value() {
    let cases: &[(&[&str], &str, &str)] = &[
        (&["--aging-interval-ms", "0"], "'0'", "positive integer"),
        (&["--aging-interval-ms", "-1"], "'-1'", "negative"),
        (&["--aging-interval-ms", "1s"], "'1s'", "not an integer"),
        (
            &["--priority-bands", "0,high"],
            "'0,high'",
            "not an integer",
        ),
        (&["--priority-bands", "1,2,1"], "'1,2,1'", "listed twice"),
        (&["--priority-bands", "-1,,2"], "'-1,,2'", "empty item"),
        (&["--priority-bands="], "''", "empty"),
        (
            &["--priority-bands", "3000000000"],
            "'3000000000'",
            "out of range",
        ),
        (
            &["--tenant-weight", "chat=0"],
            "'chat=0'",
            "positive integer",
        ),
        (&["--tenant-weight", "chat=-2"], "'chat=-2'", "negative"),
        (&["--tenant-weight", "chat=x"], "'chat=x'", "not an integer"),
        (&["--tenant-weight", "=3"], "'=3'", "name is empty"),
        (&["--tenant-weight", "chat"], "'chat'", "NAME=WEIGHT"),
        (
            &["--tenant-weight", "chat=5000000000"],
            "'chat=5000000000'",
            "too large",
        ),
    ];
    for &(args, value, reason) in cases {
        let error = parse(args).expect_err(&format!("{args:?} must fail"));
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::ValueValidation,
            "{args:?}"
        );
        let message = error.to_string();
        let flag = args[0].split('=').next().unwrap();
        assert!(message.contains(flag), "names the flag: {message}");
        assert!(message.contains(value), "names the value: {message}");
        assert!(message.contains(reason), "says why: {message}");
    }
}

#[test]
fn zero_is_a_valid_queue_limit_flag() {
    let worker = parse(&["--request-queue-limit", "0"]).unwrap();
    assert_eq!(worker.admission.request_queue_limit, Some(0));
}

#[test]
fn the_help_lists_the_flags_and_their_variables() {
    let error = parse(&["--help"]).unwrap_err();
    let help = error.to_string();
    for needle in [
        "--engine-request-limit <N>",
        "--engine-request-waiting-limit <N>",
        "--request-queue-limit <N>",
        "--engine-waiting-token-limit <N>",
        "--engine-token-limit <N>",
        "--request-queue-token-limit <N>",
        "--aging-interval-ms <MS>",
        "--priority-bands <BANDS>",
        "--tenant-weight <NAME=WEIGHT>",
        WAITING_TOKENS,
        AGING_MS,
        BANDS,
        WEIGHTS,
        REQUEST,
        WAITING_ALIAS,
        QUEUE_ALIAS,
    ] {
        assert!(help.contains(needle), "{needle} in help:\n{help}");
    }
}
