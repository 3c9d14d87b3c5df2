//! What the tests of every crate of the tower-admission workspace share:
//! child processes with deadlines on every wait ([`process`]), the
//! Prometheus text exposition parsed ([`exposition`]) and a small seeded
//! generator ([`rng`]). Not published: a dev-dependency of the workspace's
//! crates only.

pub mod exposition;
pub mod process;
pub mod rng;

pub use exposition::Exposition;
pub use process::{FOREVER, PATIENCE, Process, Server, cargo_build_examples, within};
pub use rng::Rng;
