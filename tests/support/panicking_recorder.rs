//! A metrics recorder whose every call panics: user code the gate must
//! survive.

#![allow(dead_code)] // each test binary uses part of it

use std::sync::Arc;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

/// The message of every panic it raises.
pub const MESSAGE: &str = "injected recorder panic";

/// Panics on every call. With `panic_on_register`, registering a series
/// panics too; otherwise registration works and every handle it returns
/// panics when used.
#[derive(Debug, Clone, Copy)]
pub struct PanickingRecorder {
    pub panic_on_register: bool,
}

struct PanickingHandle;

impl CounterFn for PanickingHandle {
    fn increment(&self, _: u64) {
        panic!("{MESSAGE}");
    }
    fn absolute(&self, _: u64) {
        panic!("{MESSAGE}");
    }
}

impl GaugeFn for PanickingHandle {
    fn increment(&self, _: f64) {
        panic!("{MESSAGE}");
    }
    fn decrement(&self, _: f64) {
        panic!("{MESSAGE}");
    }
    fn set(&self, _: f64) {
        panic!("{MESSAGE}");
    }
}

impl HistogramFn for PanickingHandle {
    fn record(&self, _: f64) {
        panic!("{MESSAGE}");
    }
}

impl Recorder for PanickingRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {
        panic!("{MESSAGE}");
    }
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {
        panic!("{MESSAGE}");
    }
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {
        panic!("{MESSAGE}");
    }
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        if self.panic_on_register {
            panic!("{MESSAGE}");
        }
        Counter::from_arc(Arc::new(PanickingHandle))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        if self.panic_on_register {
            panic!("{MESSAGE}");
        }
        Gauge::from_arc(Arc::new(PanickingHandle))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        if self.panic_on_register {
            panic!("{MESSAGE}");
        }
        Histogram::from_arc(Arc::new(PanickingHandle))
    }
}
