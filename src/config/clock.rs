//! The gate's clock.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

/// The gate's clock: `Instant::now` unless the user gave another.
#[derive(Clone, Default)]
pub(crate) struct Clock(pub(super) Option<Arc<dyn Fn() -> Instant + Send + Sync>>);

impl Clock {
    pub(crate) fn now(&self) -> Instant {
        match &self.0 {
            Some(now) => now(),
            None => Instant::now(),
        }
    }
}

impl PartialEq for Clock {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Clock {}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Clock(custom)"
        } else {
            "Clock(std)"
        })
    }
}
