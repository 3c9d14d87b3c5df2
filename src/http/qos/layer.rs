//! [`QosLayer`] and its service [`SetQos`]: a request's priority and
//! tenant set as extensions before admission, for the admission layer's
//! describer ([`QosExtension`](crate::http::QosExtension)) to read.

use std::task::{Context, Poll};

use http::Request;
use tower_layer::Layer;
use tower_service::Service;

use super::QosExtractor;
#[cfg(doc)]
use super::{Priority, QosHeaders};
#[cfg(doc)]
use crate::gate::Tenant;

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
#[derive(Debug, Clone)]
pub struct QosLayer<E> {
    extractor: E,
}

impl<E> QosLayer<E> {
    /// A layer that asks `extractor` for each request's priority and
    /// tenant.
    pub fn new(extractor: E) -> Self {
        QosLayer { extractor }
    }
}

impl<S, E: Clone> Layer<S> for QosLayer<E> {
    type Service = SetQos<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        SetQos {
            inner,
            extractor: self.extractor.clone(),
        }
    }
}

/// The service of [`QosLayer`].
#[derive(Debug, Clone)]
pub struct SetQos<S, E> {
    inner: S,
    extractor: E,
}

impl<S, E, B> Service<Request<B>> for SetQos<S, E>
where
    S: Service<Request<B>>,
    E: QosExtractor<B>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        set_qos(&self.extractor, &mut req);
        self.inner.call(req)
    }
}

/// Sets `req`'s [`Priority`] and [`Tenant`] extensions from what
/// `extractor` finds.
pub(crate) fn set_qos<B>(extractor: &impl QosExtractor<B>, req: &mut Request<B>) {
    extractor.qos(req).insert_into(req);
}
