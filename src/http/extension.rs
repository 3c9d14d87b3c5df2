//! [`SetExtensionLayer`] and its service [`SetExtension`]: one middleware
//! for the layers that set a request's extensions before admission from
//! what an extractor reads, for the admission layer's describer to find.
//!
//! What is set is chosen by the kind `K`: [`SetsCost`] (the
//! [`Cost`](crate::Cost) extension, from a [`CostExtractor`]: this is
//! [`CostLayer`](super::CostLayer)) or [`SetsQos`] (the
//! [`Priority`](super::Priority) and [`Tenant`](crate::gate::Tenant)
//! extensions, from a [`QosExtractor`]: this is
//! [`QosLayer`](super::QosLayer)). What the extractor cannot tell leaves
//! the extensions as they were. The service adds no work of its own: its
//! readiness is the inner service's, and its future the inner service's
//! future.

use std::fmt;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use http::Request;
use tower_layer::Layer;
use tower_service::Service;

use super::{CostExtractor, QosExtractor};

/// What a [`SetExtension`] of kind `Self` sets on a request, with an
/// extractor `E`. Implemented by [`SetsCost`] and [`SetsQos`].
pub trait ExtensionKind<E, B> {
    /// Sets `req`'s extensions from what `extractor` reads of it.
    fn set(extractor: &E, req: &mut Request<B>);
}

/// The kind of [`CostLayer`](super::CostLayer): sets the
/// [`Cost`](crate::Cost) extension from a [`CostExtractor`].
#[derive(Debug, Clone, Copy)]
pub enum SetsCost {}

/// The kind of [`QosLayer`](super::QosLayer): sets the
/// [`Priority`](super::Priority) and [`Tenant`](crate::gate::Tenant)
/// extensions from a [`QosExtractor`].
#[derive(Debug, Clone, Copy)]
pub enum SetsQos {}

impl<E: CostExtractor<B>, B> ExtensionKind<E, B> for SetsCost {
    fn set(extractor: &E, req: &mut Request<B>) {
        if let Some(cost) = extractor.cost(req) {
            req.extensions_mut().insert(cost);
        }
    }
}

impl<E: QosExtractor<B>, B> ExtensionKind<E, B> for SetsQos {
    fn set(extractor: &E, req: &mut Request<B>) {
        extractor.qos(req).insert_into(req);
    }
}

/// Sets request extensions of kind `K` with an extractor `E`; goes outside
/// (before) the admission layer. Usually named by its aliases,
/// [`CostLayer`](super::CostLayer) and [`QosLayer`](super::QosLayer).
pub struct SetExtensionLayer<E, K> {
    extractor: E,
    kind: PhantomData<fn() -> K>,
}

impl<E, K> SetExtensionLayer<E, K> {
    /// A layer that asks `extractor` for what to set on each request.
    pub fn new(extractor: E) -> Self {
        SetExtensionLayer {
            extractor,
            kind: PhantomData,
        }
    }
}

impl<E: Clone, K> Clone for SetExtensionLayer<E, K> {
    fn clone(&self) -> Self {
        SetExtensionLayer::new(self.extractor.clone())
    }
}

impl<E: fmt::Debug, K> fmt::Debug for SetExtensionLayer<E, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetExtensionLayer")
            .field("extractor", &self.extractor)
            .field("kind", &std::any::type_name::<K>())
            .finish()
    }
}

impl<S, E: Clone, K> Layer<S> for SetExtensionLayer<E, K> {
    type Service = SetExtension<S, E, K>;

    fn layer(&self, inner: S) -> Self::Service {
        SetExtension {
            inner,
            extractor: self.extractor.clone(),
            kind: PhantomData,
        }
    }
}

/// The service of [`SetExtensionLayer`]: [`SetCost`](super::SetCost) and
/// [`SetQos`](super::SetQos) by their aliases.
pub struct SetExtension<S, E, K> {
    inner: S,
    extractor: E,
    kind: PhantomData<fn() -> K>,
}

impl<S: Clone, E: Clone, K> Clone for SetExtension<S, E, K> {
    fn clone(&self) -> Self {
        SetExtension {
            inner: self.inner.clone(),
            extractor: self.extractor.clone(),
            kind: PhantomData,
        }
    }
}

impl<S: fmt::Debug, E: fmt::Debug, K> fmt::Debug for SetExtension<S, E, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetExtension")
            .field("inner", &self.inner)
            .field("extractor", &self.extractor)
            .field("kind", &std::any::type_name::<K>())
            .finish()
    }
}

impl<S, E, K, B> Service<Request<B>> for SetExtension<S, E, K>
where
    S: Service<Request<B>>,
    K: ExtensionKind<E, B>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        K::set(&self.extractor, &mut req);
        self.inner.call(req)
    }
}
