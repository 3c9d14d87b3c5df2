//! The one seam where a request is described to the gate: [`Describe`]
//! turns a request into a [`Descriptor`] (rank, cost, priority, tenant,
//! deadline), and the admission layer holds one describer, reads it once
//! per request and hands the descriptor to the [`Gate`](crate::Gate) whole.
//!
//! Describers compose: each fills in what it knows and leaves the rest as
//! the describers before it left it, so a tuple `(A, B)` is A, then B. The
//! layer's describer always starts from the request's [`Cost`],
//! [`Priority`] and [`Tenant`] extensions (set by an earlier layer such as
//! [`OpenAiCostLayer`](super::OpenAiCostLayer), or by middleware of your
//! own), then applies what it was given:
//!
//! | describer | fills in | set on the layer with |
//! |---|---|---|
//! | [`QosHeaders`] | `priority`, `tenant`, from headers | [`AdmissionLayer::qos_headers`](super::AdmissionLayer::qos_headers) |
//! | [`RankHeader`], or any describer | `rank` | [`AdmissionLayer::rank`](super::AdmissionLayer::rank) |
//! | [`GrpcTimeout`], [`DeadlineHeader`] | `deadline` (the smallest wins) | [`AdmissionLayer::grpc_timeout`](super::AdmissionLayer::grpc_timeout), [`AdmissionLayer::deadline_header`](super::AdmissionLayer::deadline_header) |
//! | [`CostHeader`] | `cost`, from headers | [`AdmissionLayer::describe`](super::AdmissionLayer::describe) |
//! | a closure `Fn(&Request<B>, &mut Descriptor)` | anything | [`AdmissionLayer::describe`](super::AdmissionLayer::describe) |
//!
//! ```
//! use tower_admission::http::{Describe, GrpcTimeout, QosHeaders};
//! use tower_admission::{Descriptor, RankHeader};
//!
//! let describer = (RankHeader::default(), QosHeaders::default(), GrpcTimeout);
//! let req = http::Request::builder()
//!     .header("x-data-parallel-rank", "1")
//!     .header("x-admission-priority", "5")
//!     .header("grpc-timeout", "250m")
//!     .body(())
//!     .unwrap();
//! let descriptor = describer.descriptor(&req);
//! assert_eq!(descriptor.rank, Some(1));
//! assert_eq!(descriptor.priority, 5);
//! assert_eq!(descriptor.deadline, Some(std::time::Duration::from_millis(250)));
//! ```
//!
//! This file holds the trait, its closures and tuples, and the describer
//! the layer holds; beside it, the built-in readers: `rank.rs`
//! ([`RankHeader`]), `qos.rs` ([`QosHeaders`], [`Priority`]), `cost.rs`
//! ([`CostHeader`]) and `deadline.rs` ([`GrpcTimeout`], [`DeadlineHeader`]).

use http::Request;

use crate::gate::{Cost, Descriptor, Tenant};

mod cost;
mod deadline;
mod qos;
mod rank;

pub use self::cost::CostHeader;
pub use self::deadline::{DeadlineHeader, GrpcTimeout};
pub(crate) use self::qos::Qos;
pub use self::qos::{Priority, QosHeaders};
pub use self::rank::RankHeader;

/// Describes a request to the gate: fills in what it can tell of the
/// request's [`Descriptor`] and leaves the rest as it is.
///
/// Closures `Fn(&Request<B>, &mut Descriptor)` are describers, and so are
/// tuples of describers (applied in order) and the built-in header readers
/// ([`RankHeader`], [`QosHeaders`], [`CostHeader`], [`GrpcTimeout`],
/// [`DeadlineHeader`]). Give one to
/// [`AdmissionLayer::describe`](super::AdmissionLayer::describe):
///
/// ```
/// use std::time::Duration;
///
/// use tower_admission::{AdmissionConfig, AdmissionLayer, Descriptor, Gate, Tenant};
///
/// // Batch traffic is sheddable, one tenant, and waits at most a second.
/// let layer = AdmissionLayer::new(Gate::new(AdmissionConfig::new())).describe(
///     |req: &http::Request<axum::body::Body>, descriptor: &mut Descriptor| {
///         if req.uri().path().starts_with("/batch/") {
///             descriptor.priority = -1;
///             descriptor.tenant = Some(Tenant::new("batch"));
///             descriptor.deadline = Some(Duration::from_secs(1));
///         }
///     },
/// );
/// # let _ = layer;
/// ```
///
/// Requests are described from trusted sources only (a router's headers,
/// an authenticated identity): a client that describes itself can jump
/// the queue or claim another tenant's share.
pub trait Describe<B> {
    /// Fills in what `req` tells of `descriptor`. Must not panic, whatever
    /// the request carries.
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor);

    /// The descriptor of `req`: a plain request ([`Descriptor::new`]) as
    /// this describer describes it.
    fn descriptor(&self, req: &Request<B>) -> Descriptor {
        let mut descriptor = Descriptor::new();
        self.describe(req, &mut descriptor);
        descriptor
    }
}

impl<B, F> Describe<B> for F
where
    F: Fn(&Request<B>, &mut Descriptor),
{
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        self(req, descriptor)
    }
}

macro_rules! describe_tuple {
    ($($name:ident)*) => {
        /// Each describer in turn: a later one overrides what an earlier
        /// one filled in.
        #[allow(non_snake_case)]
        impl<B, $($name: Describe<B>),*> Describe<B> for ($($name,)*) {
            #[inline]
            fn describe(&self, _req: &Request<B>, _descriptor: &mut Descriptor) {
                let ($($name,)*) = self;
                $($name.describe(_req, _descriptor);)*
            }
        }
    };
}

describe_tuple!();
describe_tuple!(A1);
describe_tuple!(A1 A2);
describe_tuple!(A1 A2 A3);
describe_tuple!(A1 A2 A3 A4);
describe_tuple!(A1 A2 A3 A4 A5);
describe_tuple!(A1 A2 A3 A4 A5 A6);
describe_tuple!(A1 A2 A3 A4 A5 A6 A7);
describe_tuple!(A1 A2 A3 A4 A5 A6 A7 A8);

/// Fills in the cost, priority and tenant the request's [`Cost`],
/// [`Priority`] and [`Tenant`] extensions hold; each missing one stays as
/// it was. The layer's describer always starts with it.
fn from_extensions<B>(req: &Request<B>, descriptor: &mut Descriptor) {
    let extensions = req.extensions();
    if let Some(cost) = extensions.get::<Cost>() {
        descriptor.cost = *cost;
    }
    if let Some(priority) = extensions.get::<Priority>() {
        descriptor.priority = priority.0;
    }
    if let Some(tenant) = extensions.get::<Tenant>() {
        descriptor.tenant = Some(*tenant);
    }
}

/// The describer an admission layer holds: the extensions always, the
/// QoS headers if the layer reads them, the rank describer `R` (by default
/// `()`: unranked), the deadline readers its settings turned on, then
/// whatever was added with
/// [`AdmissionLayer::describe`](super::AdmissionLayer::describe) (`X`), in
/// that order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Describer<R = (), X = ()> {
    pub(crate) qos_headers: Option<QosHeaders>,
    pub(crate) rank: R,
    pub(crate) grpc_timeout: Option<GrpcTimeout>,
    pub(crate) deadline_header: Option<DeadlineHeader>,
    pub(crate) more: X,
}

impl<R, X> Describer<R, X> {
    /// The same describer with another rank describer.
    pub(crate) fn rank<R2>(self, rank: R2) -> Describer<R2, X> {
        Describer {
            qos_headers: self.qos_headers,
            rank,
            grpc_timeout: self.grpc_timeout,
            deadline_header: self.deadline_header,
            more: self.more,
        }
    }

    /// The same describer, with `more` after what it already adds.
    pub(crate) fn and<X2>(self, more: X2) -> Describer<R, (X, X2)> {
        Describer {
            qos_headers: self.qos_headers,
            rank: self.rank,
            grpc_timeout: self.grpc_timeout,
            deadline_header: self.deadline_header,
            more: (self.more, more),
        }
    }

    /// Describes `req`, and says what its QoS headers held (nothing unless
    /// the layer reads them), for the layer to set as extensions.
    pub(crate) fn read<B>(&self, req: &Request<B>) -> (Descriptor, Qos)
    where
        R: Describe<B>,
        X: Describe<B>,
    {
        let mut descriptor = Descriptor::new();
        let qos = self.fill(req, &mut descriptor);
        (descriptor, qos)
    }

    /// [`read`](Self::read) into `descriptor`.
    fn fill<B>(&self, req: &Request<B>, descriptor: &mut Descriptor) -> Qos
    where
        R: Describe<B>,
        X: Describe<B>,
    {
        from_extensions(req, descriptor);
        let qos = match &self.qos_headers {
            Some(headers) => headers.read(req),
            None => Qos::default(),
        };
        qos.describe(descriptor);
        self.rank.describe(req, descriptor);
        if let Some(grpc) = &self.grpc_timeout {
            grpc.describe(req, descriptor);
        }
        if let Some(header) = &self.deadline_header {
            header.describe(req, descriptor);
        }
        self.more.describe(req, descriptor);
        qos
    }
}

impl<B, R: Describe<B>, X: Describe<B>> Describe<B> for Describer<R, X> {
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        self.fill(req, descriptor);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&'static str, &'static str)]) -> Request<()> {
        let mut req = Request::new(());
        for (name, value) in headers {
            req.headers_mut().append(*name, value.parse().unwrap());
        }
        req
    }

    #[test]
    fn a_tuple_applies_each_describer_in_turn() {
        let req = request(&[("x-data-parallel-rank", "3"), ("x-admission-priority", "2")]);
        let later = |_: &Request<()>, descriptor: &mut Descriptor| descriptor.priority += 10;
        let descriptor = (RankHeader::default(), QosHeaders::default(), later).descriptor(&req);
        assert_eq!((descriptor.rank, descriptor.priority), (Some(3), 12));
        let unranked = |_: &Request<()>, descriptor: &mut Descriptor| descriptor.rank = None;
        let descriptor = ((), unranked).descriptor(&req);
        assert_eq!(descriptor, Descriptor::new());
    }

    #[test]
    fn extensions_fill_in_cost_priority_and_tenant_and_headers_override_them() {
        let mut req = request(&[("x-admission-priority", "7"), ("x-admission-tenant", "b")]);
        req.extensions_mut().insert(Cost::prompt(40));
        req.extensions_mut().insert(Priority(1));
        req.extensions_mut().insert(Tenant::new("a"));
        let extensions: Describer = Describer::default();
        let extensions = extensions.descriptor(&req);
        assert_eq!(extensions.cost, Cost::prompt(40));
        assert_eq!(extensions.priority, 1);
        assert_eq!(extensions.tenant, Some(Tenant::new("a")));
        let describer: Describer = Describer {
            qos_headers: Some(QosHeaders::default()),
            ..Describer::default()
        };
        let (descriptor, qos) = describer.read(&req);
        assert_eq!(descriptor.priority, 7);
        assert_eq!(descriptor.tenant, Some(Tenant::new("b")));
        assert_eq!(qos.priority, Some(7));
        // A malformed header leaves the extension's value.
        req.headers_mut()
            .insert("x-admission-priority", "high".parse().unwrap());
        assert_eq!(describer.descriptor(&req).priority, 1);
    }

    #[test]
    fn cost_headers_and_closures_describe_too() {
        let req = request(&[("x-prompt-tokens", "12")]);
        let cost = CostHeader::new("x-prompt-tokens").descriptor(&req).cost;
        assert_eq!(cost, Cost::prompt(12));
        let by_rank = |_: &Request<()>, descriptor: &mut Descriptor| descriptor.rank = Some(4);
        assert_eq!(by_rank.descriptor(&req).rank, Some(4));
        let layers: Describer = Describer::default();
        let describer =
            layers.rank(|_: &Request<()>, descriptor: &mut Descriptor| descriptor.rank = Some(5));
        assert_eq!(describer.descriptor(&req).rank, Some(5));
    }
}
