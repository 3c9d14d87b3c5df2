//! [`QosLayer`] and its service [`SetQos`]: a request's priority and
//! tenant set as extensions before admission, for the admission layer's
//! describer ([`QosExtension`](crate::http::QosExtension)) to read.

#[cfg(doc)]
use super::{Priority, QosExtractor, QosHeaders};
#[cfg(doc)]
use crate::gate::Tenant;
use crate::http::extension::{SetExtension, SetExtensionLayer, SetsQos};

/// Sets each request's [`Priority`] and [`Tenant`] extensions with a
/// [`QosExtractor`]; goes outside (before) the admission layer. What the
/// extractor cannot tell leaves the extensions as they were.
///
/// ```
/// use axum::{Router, routing::post};
/// use tower_admission::http::{QosHeaders, QosLayer};
/// use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};
///
/// let gate = Gate::new(AdmissionConfig::new());
/// let app: Router = Router::new()
///     .route("/v1/chat/completions", post(|| async { "…" }))
///     .route_layer(AdmissionLayer::new(gate))
///     // Added last, so it runs first.
///     .route_layer(QosLayer::new(QosHeaders::default()));
/// # let _ = app;
/// ```
pub type QosLayer<E> = SetExtensionLayer<E, SetsQos>;

/// The service of [`QosLayer`].
pub type SetQos<S, E> = SetExtension<S, E, SetsQos>;
