//! The gate of one worker: the [`state`] machine behind one short critical
//! section per event ([`driver`]), the RAII handle of admitted work
//! ([`Permit`]), the public vocabulary ([`types`]) and the one-way
//! observation of it all ([`observe`]).
//!
//! Dependencies point down: `types` is a leaf; `state` knows only `types`
//! and the configuration; the driver wraps `state`; observers (metrics)
//! receive plain values from the driver and import nothing but `types` and
//! `observe`.

mod driver;
mod lane;
mod locked;
pub(crate) mod observe;
mod permit;
pub(crate) mod state;
pub(crate) mod types;

pub use self::driver::{Acquire, Gate};
pub use self::permit::Permit;
pub use self::types::{
    AdmitSource, Cost, Counts, Descriptor, Overloaded, RejectionReason, RejectionScope, Snapshot,
    Tally, Tenant,
};

#[cfg(all(test, loom))]
mod loom_tests;
