//! Unit tests of the configuration.

use super::*;

#[test]
fn defaults_follow_the_engine_until_set() {
    let config = AdmissionConfig::new();
    assert_eq!(
        config.limits_for(None),
        Limits {
            engine_request_limit: 10_000,
            engine_request_waiting_limit: 10_000,
            request_queue_limit: 20_000,
            engine_waiting_token_limit: None,
            engine_token_limit: None,
            request_queue_token_limit: None,
        }
    );
    assert_eq!(
        config.limits_for(Some(EngineCapacity::new(64, 2))),
        Limits {
            engine_request_limit: 64,
            engine_request_waiting_limit: 64,
            request_queue_limit: 128,
            engine_waiting_token_limit: None,
            engine_token_limit: None,
            request_queue_token_limit: None,
        }
    );
}

#[test]
fn overriding_an_engine_limit_does_not_change_the_queue_default() {
    let config = AdmissionConfig::new().engine_request_limit(5);
    let limits = config.limits_for(Some(EngineCapacity::new(64, 1)));
    assert_eq!(limits.engine_request_limit, 5);
    assert_eq!(limits.engine_request_waiting_limit, 64);
    assert_eq!(limits.request_queue_limit, 128);
}

#[test]
#[should_panic(expected = "invalid engine_request_limit: 0")]
fn a_zero_engine_request_limit_panics_naming_the_setting() {
    let _ = AdmissionConfig::new().engine_request_limit(0);
}

#[test]
#[should_panic(expected = "invalid engine_request_waiting_limit: 0")]
fn a_zero_waiting_limit_panics_naming_the_setting() {
    let _ = AdmissionConfig::new().engine_request_waiting_limit(0);
}

#[test]
fn a_zero_queue_limit_is_valid() {
    let config = AdmissionConfig::new().request_queue_limit(0);
    assert_eq!(config.limits_for(None).request_queue_limit, 0);
}

#[test]
fn a_report_of_absurdly_many_ranks_is_ignored() {
    let config = AdmissionConfig::new().capacity(EngineCapacity::new(8, MAX_DP_RANKS + 1));
    assert_eq!(config.capacity, None);
    let config = AdmissionConfig::new().capacity(EngineCapacity::new(8, MAX_DP_RANKS));
    assert_eq!(config.capacity, Some(EngineCapacity::new(8, MAX_DP_RANKS)));
}

#[test]
fn an_empty_capacity_report_is_ignored() {
    let config = AdmissionConfig::new()
        .capacity(EngineCapacity::new(0, 2))
        .capacity(EngineCapacity::new(8, 0));
    assert_eq!(config.capacity, None);
}
