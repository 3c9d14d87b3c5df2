//! The parameters of the adaptive engine request waiting limit
//! ([`AdmissionConfig::adaptive_waiting_limit`](super::AdmissionConfig::adaptive_waiting_limit)).
//! The algorithm that uses them is described on [`AdaptiveWaitingLimit`].

use std::time::Duration;

/// The parameters of the adaptive engine request waiting limit, off unless
/// [`AdmissionConfig::adaptive_waiting_limit`](super::AdmissionConfig::adaptive_waiting_limit)
/// or [`adaptive_waiting_limit_with`](super::AdmissionConfig::adaptive_waiting_limit_with)
/// turns it on (`--adaptive-waiting-limit`,
/// `DYN_BACKEND_ADMISSION_ADAPTIVE_WAITING_LIMIT`).
///
/// With it on, the gate moves the per-rank engine request waiting limit
/// between a floor and a ceiling by the **engine waiting time** it measures
/// (admission to first token or completion), instead of an operator sizing
/// it by hand with Little's law (`docs/operations.md`). The rule is a
/// latency gradient in the spirit of Netflix's Gradient2 and Envoy's
/// adaptive concurrency filter, applied to time to first token:
///
/// 1. **Baseline.** The no-load waiting time is *probed*: the limit drops
///    to the floor until [`probe_samples`](Self::probe_samples) requests
///    admitted during the probe have waited, and their mean waiting time is
///    the baseline; then the limit goes back to where it was. The first
///    probe starts with the first waiting time measured, the next ones
///    every [`probe_interval`](Self::probe_interval), so the baseline
///    follows an engine that got slower (a longer decode, fewer slots).
///    Between probes, an interval whose mean waiting time is below the
///    baseline lowers the baseline to it at once: an engine that got faster
///    is believed immediately. A probe lasts until the requests admitted
///    before it have stopped waiting and `probe_samples` admitted during it
///    have waited: with a waiting stage of a step or two, a fraction of a
///    second; the gate admits less meanwhile.
/// 2. **Gradient.** Every [`interval`](Self::interval) (at the first
///    waiting time measured after it), the mean waiting time of the
///    interval, `short`, is compared with the baseline: `gradient =
///    clamp(tolerance × baseline / short, 0.5, 1)`.
/// 3. **Move.** Below 1, waiting time rose: the target is `limit ×
///    gradient`. At 1, waiting time stays near its baseline: the target is
///    `limit + √limit`, but **only if the limit bound** during the interval
///    (an admission filled the waiting limit of its rank, or of the
///    worker). An idle or lightly loaded engine answers fast whatever the
///    limit, and growing the limit there would only let the next burst in
///    unchecked. The limit moves by [`smoothing`](Self::smoothing) of the
///    way to its target and stays within `[floor, ceiling]`; the limit in
///    force is the estimate rounded to the nearest integer.
///
/// The limit starts at the floor and grows as the engine shows it can take
/// more. Nothing is measured while nothing is admitted, so an idle gate's
/// limit does not move. Shrinking never revokes admitted work: the waiting
/// count may exceed the limit until it drains, as after a capacity report
/// (behaviour §2, §5). One limit serves every rank, as the configured setting
/// does: waiting times of all ranks are pooled.
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | [`floor`](Self::floor) | 1 | the smallest limit, and the limit during a probe |
/// | [`ceiling`](Self::ceiling) | the configured waiting limit, else the engine's reported `max_num_seqs` (10000 until it reports) | the largest limit |
/// | [`tolerance`](Self::tolerance) | 1.5 | waiting times up to this multiple of the baseline count as "near the baseline" |
/// | [`smoothing`](Self::smoothing) | 0.2 | the fraction of the way to its target the limit moves per interval |
/// | [`interval`](Self::interval) | 100 ms | how often the limit moves |
/// | [`probe_interval`](Self::probe_interval) | 10 s | how often the baseline is probed again |
/// | [`probe_samples`](Self::probe_samples) | 5 | waiting times a probe averages |
///
/// The gate keeps time while it is on (on its
/// [`clock`](super::AdmissionConfig::clock)).
///
/// ```
/// use std::time::Duration;
/// use tower_admission::{AdaptiveWaitingLimit, AdmissionConfig};
///
/// let config = AdmissionConfig::new().adaptive_waiting_limit_with(
///     AdaptiveWaitingLimit::default()
///         .floor(2)
///         .ceiling(64)
///         .interval(Duration::from_millis(250)),
/// );
/// assert_eq!(config.explicit().adaptive_waiting_limit.map(|a| a.floor), Some(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct AdaptiveWaitingLimit {
    /// The smallest limit per rank, and the limit while the baseline is
    /// probed. Default 1.
    pub floor: usize,
    /// The largest limit per rank; `None` (the default): the configured
    /// engine request waiting limit, or the engine's reported
    /// `max_num_seqs` (10000 until it reports).
    pub ceiling: Option<usize>,
    /// Waiting times up to `tolerance ×` the baseline let the limit grow;
    /// longer ones shrink it. Default 1.5.
    pub tolerance: f64,
    /// The fraction of the way to its target the limit moves per interval,
    /// in `(0, 1]`. Default 0.2.
    pub smoothing: f64,
    /// How often the limit moves. Default 100 ms.
    pub interval: Duration,
    /// How often the baseline is probed again. Default 10 s.
    pub probe_interval: Duration,
    /// Waiting times of requests admitted during a probe that it averages.
    /// Default 5.
    pub probe_samples: usize,
}

impl Eq for AdaptiveWaitingLimit {}

impl Default for AdaptiveWaitingLimit {
    fn default() -> Self {
        AdaptiveWaitingLimit {
            floor: 1,
            ceiling: None,
            tolerance: 1.5,
            smoothing: 0.2,
            interval: Duration::from_millis(100),
            probe_interval: Duration::from_secs(10),
            probe_samples: 5,
        }
    }
}

/// Builder methods that set one parameter, checked: unless `$valid`
/// holds of the value, they panic naming the parameter, the value and the
/// rule (`$why`).
macro_rules! checked_setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty, if $valid:expr, else $why:literal;)+) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(mut self, $name: $ty) -> Self {
            assert!(
                $valid,
                "invalid adaptive waiting limit {}: {}",
                stringify!($name),
                format_args!($why)
            );
            self.$name = $name.into();
            self
        }
    )+};
}

impl AdaptiveWaitingLimit {
    checked_setters! {
        /// Sets the floor.
        ///
        /// # Panics
        ///
        /// If `floor` is 0.
        floor: usize, if floor > 0, else "0 (the floor must be a positive integer)";

        /// Sets the ceiling; a ceiling below the floor is raised to it.
        ///
        /// # Panics
        ///
        /// If `ceiling` is 0.
        ceiling: usize, if ceiling > 0, else "0 (the ceiling must be a positive integer)";

        /// Sets the tolerance.
        ///
        /// # Panics
        ///
        /// If `tolerance` is not a finite number of at least 1.
        tolerance: f64, if tolerance.is_finite() && tolerance >= 1.0,
            else "{tolerance} (must be at least 1)";

        /// Sets the smoothing.
        ///
        /// # Panics
        ///
        /// If `smoothing` is not in `(0, 1]`.
        smoothing: f64, if smoothing > 0.0 && smoothing <= 1.0,
            else "{smoothing} (must be in (0, 1])";

        /// Sets the interval.
        ///
        /// # Panics
        ///
        /// If `interval` is zero.
        interval: Duration, if !interval.is_zero(), else "0 (must be positive)";

        /// Sets the probe interval.
        ///
        /// # Panics
        ///
        /// If `probe_interval` is zero.
        probe_interval: Duration, if !probe_interval.is_zero(), else "0 (must be positive)";

        /// Sets the samples a probe averages.
        ///
        /// # Panics
        ///
        /// If `probe_samples` is 0.
        probe_samples: usize, if probe_samples > 0, else "0 (must be a positive integer)";
    }

    /// The ceiling in force when the configured or reported waiting limit
    /// is `limit`: the explicit ceiling, else `limit`; never below the
    /// floor.
    pub(crate) fn ceiling_for(&self, limit: usize) -> usize {
        self.ceiling.unwrap_or(limit).max(self.floor)
    }
}
