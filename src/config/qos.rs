//! The class-of-service settings (behaviour §8): priority bands, tenant
//! weights and aging.

use std::time::Duration;

use super::AdmissionConfig;
use super::setters::duration_setters;

impl AdmissionConfig {
    duration_setters! {
        /// Sets the aging interval (behaviour §8): a queued request rises one
        /// priority band for each interval it has waited, so a steady stream of
        /// higher-priority work never starves it. Aging lifts a band as a whole,
        /// by the wait of its oldest request; within a band, tenants keep their
        /// fair shares. Off unless set.
        ///
        /// Aging bounds a wait; it does not share capacity. Once a lower band's
        /// requests wait longer than the interval, that band rises level with
        /// the ones above and, being older, goes first. Choose an interval
        /// longer than the lower bands' usual queue wait, or bound that wait
        /// with a [queue wait limit](Self::request_queue_wait_limit).
        ///
        /// # Panics
        ///
        /// If `interval` is zero.
        aging_interval(interval);
    }

    /// Sets which priorities are bands (behaviour §8). A request belongs to the
    /// highest band at or below its priority (the lowest band if its
    /// priority is below them all), bands are served strictly in order, and
    /// metrics carry a `priority` label of the band. Unset, every priority
    /// is a band of its own and metrics carry no `priority` label.
    ///
    /// ```
    /// use tower_admission::AdmissionConfig;
    ///
    /// let config = AdmissionConfig::new().priority_bands([10, -1, 0]);
    /// assert_eq!(config.explicit().priority_bands, &[-1, 0, 10]);
    /// ```
    pub fn priority_bands(mut self, bands: impl IntoIterator<Item = i32>) -> Self {
        let mut bands: Vec<i32> = bands.into_iter().collect();
        bands.sort_unstable();
        bands.dedup();
        self.priority_bands = bands;
        self
    }

    /// Sets the weight of `tenant` in weighted fair sharing within a band
    /// (behaviour §8): a tenant of weight 3 is served three times the tokens (or
    /// requests, when costs are unknown) of a tenant of weight 1 while both
    /// wait. Tenants not named weigh 1.
    ///
    /// # Panics
    ///
    /// If `weight` is 0.
    #[track_caller]
    pub fn tenant_weight(mut self, tenant: impl Into<String>, weight: u32) -> Self {
        let tenant = tenant.into();
        assert!(
            weight > 0,
            "invalid tenant_weight: {tenant}=0 (the weight must be a positive integer)"
        );
        self.tenant_weights.insert(tenant, weight);
        self
    }

    /// Every tenant weight set, by tenant name.
    pub(crate) fn tenant_weights(&self) -> impl Iterator<Item = (&str, u32)> + '_ {
        self.tenant_weights
            .iter()
            .map(|(tenant, weight)| (tenant.as_str(), *weight))
    }
}
