//! Configuration sources' test vocabulary: the environment variables by
//! name, an environment from a list, and the three explicit settings a
//! configuration resolved to.

#![allow(dead_code)] // each test binary uses part of it

use std::collections::HashMap;

use tower_admission::AdmissionConfig;

pub const REQUEST: &str = "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT";
pub const REQUEST_ALIAS: &str = "DYN_ENGINE_REQUEST_LIMIT";
pub const WAITING: &str = "DYN_BACKEND_ADMISSION_ENGINE_REQUEST_WAITING_LIMIT";
pub const WAITING_ALIAS: &str = "DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT";
pub const QUEUE: &str = "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT";
pub const QUEUE_ALIAS: &str = "DYN_DYNAMO_REQUEST_QUEUE_LIMIT";
pub const WAITING_TOKENS: &str = "DYN_BACKEND_ADMISSION_ENGINE_WAITING_TOKEN_LIMIT";
pub const ENGINE_TOKENS: &str = "DYN_BACKEND_ADMISSION_ENGINE_TOKEN_LIMIT";
pub const QUEUE_TOKENS: &str = "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_TOKEN_LIMIT";
pub const QUEUE_WAIT_MS: &str = "DYN_BACKEND_ADMISSION_REQUEST_QUEUE_WAIT_LIMIT_MS";
pub const TTFT_MS: &str = "DYN_BACKEND_ADMISSION_TTFT_OBJECTIVE_MS";
pub const INTER_TOKEN_MS: &str = "DYN_BACKEND_ADMISSION_INTER_TOKEN_OBJECTIVE_MS";
pub const AGING_MS: &str = "DYN_BACKEND_ADMISSION_AGING_INTERVAL_MS";
pub const BANDS: &str = "DYN_BACKEND_ADMISSION_PRIORITY_BANDS";
pub const WEIGHTS: &str = "DYN_BACKEND_ADMISSION_TENANT_WEIGHTS";
pub const ADAPTIVE: &str = "DYN_BACKEND_ADMISSION_ADAPTIVE_WAITING_LIMIT";

pub const TOO_LARGE: &str = "340282366920938463463374607431768211456"; // 2^128

pub fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| vars.get(name).cloned()
}

/// The three explicit settings a configuration resolved to.
pub fn explicit(config: &AdmissionConfig) -> [Option<usize>; 3] {
    [
        config.explicit().engine_request_limit,
        config.explicit().engine_request_waiting_limit,
        config.explicit().request_queue_limit,
    ]
}

/// The weight a configuration gives the tenant named `tenant`: the one
/// set, or 1.
pub fn weight_of(config: &tower_admission::AdmissionConfig, tenant: &str) -> u32 {
    config
        .explicit()
        .tenant_weights
        .get(tenant)
        .copied()
        .unwrap_or(1)
}
