//! Requests that skip admission: [`Bypass`] and the predicates that ship
//! with the crate.

use std::sync::Arc;

use http::Request;

/// Decides which requests skip the gate entirely: they reach the inner
/// service without being counted, queued or rejected.
///
/// Useful when the layer wraps a whole server that also answers health
/// checks or reflection, which must keep answering while the engine is
/// saturated. Closures `Fn(&Request<B>) -> bool` are predicates too.
///
/// ```
/// use tower_admission::http::BypassPaths;
/// use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};
///
/// let gate = Gate::new(AdmissionConfig::new());
/// // gRPC health checks and server reflection skip the gate:
/// let layer = AdmissionLayer::new(gate.clone()).bypass(BypassPaths::grpc_health_and_reflection());
/// // or anything else a closure can tell from the request:
/// let layer = AdmissionLayer::new(gate)
///     .bypass(|req: &http::Request<axum::body::Body>| req.uri().path() == "/health");
/// # let _ = layer;
/// ```
pub trait Bypass<B> {
    /// Whether `req` skips admission. Must not panic, whatever the request
    /// carries.
    fn bypass(&self, req: &Request<B>) -> bool;
}

impl<B, F> Bypass<B> for F
where
    F: Fn(&Request<B>) -> bool,
{
    fn bypass(&self, req: &Request<B>) -> bool {
        self(req)
    }
}

/// Every request goes through the gate. The default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoBypass;

impl<B> Bypass<B> for NoBypass {
    #[inline]
    fn bypass(&self, _req: &Request<B>) -> bool {
        false
    }
}

/// Requests whose path starts with one of the given prefixes skip the gate.
/// Cloning it (servers clone their services per request) does not allocate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BypassPaths {
    prefixes: Arc<[String]>,
}

impl BypassPaths {
    /// Requests whose path starts with any of `prefixes` skip the gate.
    pub fn new<I, P>(prefixes: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        BypassPaths {
            prefixes: prefixes.into_iter().map(Into::into).collect(),
        }
    }

    /// The gRPC health service (`grpc.health.v1.Health`) and server
    /// reflection (`grpc.reflection.v1` and `v1alpha`).
    pub fn grpc_health_and_reflection() -> Self {
        Self::new([
            "/grpc.health.v1.Health/",
            "/grpc.reflection.v1.ServerReflection/",
            "/grpc.reflection.v1alpha.ServerReflection/",
        ])
    }
}

impl<B> Bypass<B> for BypassPaths {
    fn bypass(&self, req: &Request<B>) -> bool {
        let path = req.uri().path();
        self.prefixes
            .iter()
            .any(|prefix| path.starts_with(prefix.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str) -> Request<()> {
        Request::builder().uri(path).body(()).unwrap()
    }

    #[test]
    fn grpc_health_and_reflection_paths_bypass() {
        let bypass = BypassPaths::grpc_health_and_reflection();
        assert!(bypass.bypass(&request("/grpc.health.v1.Health/Check")));
        assert!(bypass.bypass(&request("/grpc.health.v1.Health/Watch")));
        assert!(bypass.bypass(&request(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        )));
        assert!(!bypass.bypass(&request("/generate.v1.Generator/Generate")));
        assert!(!bypass.bypass(&request("/grpc.health.v1.HealthX/Check")));
    }

    #[test]
    fn nothing_bypasses_by_default() {
        assert!(!NoBypass.bypass(&request("/grpc.health.v1.Health/Check")));
    }
}
