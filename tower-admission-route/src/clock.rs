//! Time arithmetic that saturates: waits come from servers' headers and
//! from settings, and no value of either may panic the clock.

use tokio::time::{Duration, Instant};

/// `now + wait`, or a century from now when that is past what `Instant`
/// can hold: a huge wait from a server's header or a setting must not
/// panic.
pub(crate) fn later(now: Instant, wait: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(wait)
        .or_else(|| now.checked_add(CENTURY))
        .unwrap_or(now)
}
