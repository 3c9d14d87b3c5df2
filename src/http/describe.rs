//! The one seam where a request is described to the gate: [`Describe`]
//! turns a request into a [`Descriptor`] (rank, cost, priority, tenant,
//! deadline), and the admission layer holds one describer, reads it once
//! per request and hands the descriptor to the [`Gate`](crate::Gate) whole.
//!
//! Describers compose: each fills in what it knows and leaves the rest as
//! the describers before it left it, so a tuple `(A, B)` is A, then B. The
//! built-in ones:
//!
//! | describer | fills in | set on the layer with |
//! |---|---|---|
//! | [`CostExtension`] | `cost`, from a [`Cost`] extension ([`CostLayer`](super::CostLayer), [`OpenAiCostLayer`](super::OpenAiCostLayer)) | always on |
//! | [`QosExtension`] | `priority`, `tenant`, from [`Priority`] and [`Tenant`] extensions ([`QosLayer`](super::QosLayer)) | always on |
//! | [`QosHeaders`] | `priority`, `tenant`, from headers | [`AdmissionLayer::qos_headers`](super::AdmissionLayer::qos_headers) |
//! | [`RankHeader`], [`RankExtension`], [`NoRank`], any [`RankExtractor`] through [`ByRank`] | `rank` | [`AdmissionLayer::rank`](super::AdmissionLayer::rank) |
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

use std::time::Duration;

use http::{HeaderMap, HeaderName, Request};

use super::cost::{CostExtractor, CostHeader};
use super::qos::{Priority, Qos, QosExtractor, QosHeaders};
use super::rank::{NoRank, RankExtension, RankExtractor, RankHeader};
use crate::gate::{Cost, Descriptor, Tenant};
use crate::headers::{GRPC_TIMEOUT, parse_grpc_timeout, single_value};

/// Describes a request to the gate: fills in what it can tell of the
/// request's [`Descriptor`] and leaves the rest as it is.
///
/// Closures `Fn(&Request<B>, &mut Descriptor)` are describers, and so are
/// tuples of describers (applied in order), the built-in header and
/// extension readers, and any [`RankExtractor`] wrapped in [`ByRank`]. Give
/// one to [`AdmissionLayer::describe`](super::AdmissionLayer::describe):
///
/// ```
/// use std::time::Duration;
///
/// use tower_admission::{AdmissionConfig, AdmissionLayer, Descriptor, Gate};
///
/// // Batch traffic is sheddable and waits at most a second.
/// let layer = AdmissionLayer::new(Gate::new(AdmissionConfig::new())).describe(
///     |req: &http::Request<axum::body::Body>, descriptor: &mut Descriptor| {
///         if req.uri().path().starts_with("/batch/") {
///             descriptor.priority = -1;
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

/// Describes the rank with a [`RankExtractor`]: a closure
/// `Fn(&Request<B>) -> Option<u32>` or an extractor of your own. The rank
/// it reads replaces any an earlier describer filled in, `None` included.
///
/// ```
/// use tower_admission::http::{ByRank, Describe};
///
/// let by_path = ByRank(|req: &http::Request<()>| req.uri().path().strip_prefix("/rank/")?.parse().ok());
/// let req = http::Request::get("/rank/2").body(()).unwrap();
/// assert_eq!(by_path.descriptor(&req).rank, Some(2));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ByRank<R>(pub R);

impl<B, R: RankExtractor<B>> Describe<B> for ByRank<R> {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        descriptor.rank = self.0.rank(req);
    }
}

/// The rank from the header, replacing any filled in before.
impl<B> Describe<B> for RankHeader {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        descriptor.rank = self.rank(req);
    }
}

/// The rank from the extension, replacing any filled in before.
impl<B> Describe<B> for RankExtension {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        descriptor.rank = RankExtractor::rank(self, req);
    }
}

/// Unranked, whatever was filled in before.
impl<B> Describe<B> for NoRank {
    #[inline]
    fn describe(&self, _req: &Request<B>, descriptor: &mut Descriptor) {
        descriptor.rank = None;
    }
}

/// The cost from the headers, when the prompt header holds one; otherwise
/// the cost stays as it was.
impl<B> Describe<B> for CostHeader {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        if let Some(cost) = self.cost(req) {
            descriptor.cost = cost;
        }
    }
}

/// The priority and tenant the headers hold; a missing or malformed one
/// leaves what was filled in before.
impl<B> Describe<B> for QosHeaders {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        apply_qos(self.qos(req), descriptor);
    }
}

/// Fills in what `qos` knows.
pub(super) fn apply_qos(qos: Qos, descriptor: &mut Descriptor) {
    if let Some(priority) = qos.priority {
        descriptor.priority = priority;
    }
    if let Some(tenant) = qos.tenant {
        descriptor.tenant = Some(tenant);
    }
}

/// Describes the cost with the request's [`Cost`] extension, the one
/// [`CostLayer`](super::CostLayer) and
/// [`OpenAiCostLayer`](super::OpenAiCostLayer) set; without one the cost
/// stays as it was. The admission layer always reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CostExtension;

impl<B> Describe<B> for CostExtension {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        if let Some(cost) = req.extensions().get::<Cost>() {
            descriptor.cost = *cost;
        }
    }
}

/// Describes the priority and tenant with the request's [`Priority`] and
/// [`Tenant`] extensions, the ones [`QosLayer`](super::QosLayer) sets; each
/// missing one stays as it was. The admission layer always reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosExtension;

impl<B> Describe<B> for QosExtension {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        let extensions = req.extensions();
        if let Some(priority) = extensions.get::<Priority>() {
            descriptor.priority = priority.0;
        }
        if let Some(tenant) = extensions.get::<Tenant>() {
            descriptor.tenant = Some(*tenant);
        }
    }
}

/// Describes the deadline with a gRPC request's `grpc-timeout` (exactly one
/// valid header), the smaller of it and any deadline filled in before.
/// Set on the layer with
/// [`AdmissionLayer::grpc_timeout`](super::AdmissionLayer::grpc_timeout).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GrpcTimeout;

impl<B> Describe<B> for GrpcTimeout {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        let timeout = single_text(req.headers(), &GRPC_TIMEOUT).and_then(parse_grpc_timeout);
        shorten(descriptor, timeout);
    }
}

/// Describes the deadline with a header holding milliseconds from arrival
/// (exactly one, a decimal number, spaces around it allowed), the smaller
/// of it and any deadline filled in before. Set on the layer with
/// [`AdmissionLayer::deadline_header`](super::AdmissionLayer::deadline_header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadlineHeader {
    name: HeaderName,
}

impl DeadlineHeader {
    /// Reads the deadline from header `name`.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn new(name: &str) -> Self {
        DeadlineHeader {
            name: HeaderName::from_bytes(name.as_bytes())
                .unwrap_or_else(|_| panic!("invalid deadline header name: {name:?}")),
        }
    }

    /// The header read.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl<B> Describe<B> for DeadlineHeader {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        let after = single_text(req.headers(), &self.name)
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_millis);
        shorten(descriptor, after);
    }
}

/// Keeps the smaller of the descriptor's deadline and `after`.
fn shorten(descriptor: &mut Descriptor, after: Option<Duration>) {
    if let Some(after) = after {
        descriptor.deadline = Some(descriptor.deadline.map_or(after, |was| was.min(after)));
    }
}

/// The value of a header present exactly once, as text.
fn single_text<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    single_value(headers, name)?.to_str().ok()
}

/// The describer an admission layer holds: the extensions always, the
/// header readers its settings turned on, the rank extractor `R`, then
/// whatever was added with
/// [`AdmissionLayer::describe`](super::AdmissionLayer::describe) (`X`), in
/// that order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Describer<R = NoRank, X = ()> {
    pub(crate) qos_headers: Option<QosHeaders>,
    pub(crate) rank: R,
    pub(crate) grpc_timeout: Option<GrpcTimeout>,
    pub(crate) deadline_header: Option<DeadlineHeader>,
    pub(crate) more: X,
}

impl<R, X> Describer<R, X> {
    /// The same describer with another rank extractor.
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
        R: RankExtractor<B>,
        X: Describe<B>,
    {
        let mut descriptor = Descriptor::new();
        let qos = self.fill(req, &mut descriptor);
        (descriptor, qos)
    }

    /// [`read`](Self::read) into `descriptor`.
    fn fill<B>(&self, req: &Request<B>, descriptor: &mut Descriptor) -> Qos
    where
        R: RankExtractor<B>,
        X: Describe<B>,
    {
        let descriptor = &mut *descriptor;
        CostExtension.describe(req, descriptor);
        QosExtension.describe(req, descriptor);
        let qos = match &self.qos_headers {
            Some(headers) => headers.qos(req),
            None => Qos::new(),
        };
        apply_qos(qos, descriptor);
        descriptor.rank = self.rank.rank(req);
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

impl<B, R: RankExtractor<B>, X: Describe<B>> Describe<B> for Describer<R, X> {
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
        let descriptor = ((), NoRank).descriptor(&req);
        assert_eq!(descriptor, Descriptor::new());
    }

    #[test]
    fn the_smallest_deadline_wins_and_an_ambiguous_header_is_ignored() {
        let both = (GrpcTimeout, DeadlineHeader::new("x-request-timeout-ms"));
        let mut req = request(&[("grpc-timeout", "2S"), ("x-request-timeout-ms", " 1500 ")]);
        assert_eq!(
            both.descriptor(&req).deadline,
            Some(Duration::from_millis(1500))
        );
        req.headers_mut()
            .append("x-request-timeout-ms", "10".parse().unwrap());
        assert_eq!(both.descriptor(&req).deadline, Some(Duration::from_secs(2)));
        assert_eq!(().descriptor(&req).deadline, None);
    }

    #[test]
    fn extensions_fill_in_cost_priority_and_tenant_and_headers_override_them() {
        let mut req = request(&[("x-admission-priority", "7"), ("x-admission-tenant", "b")]);
        req.extensions_mut().insert(Cost::prompt(40));
        req.extensions_mut().insert(Priority(1));
        req.extensions_mut().insert(Tenant::new("a"));
        let extensions = (CostExtension, QosExtension).descriptor(&req);
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
    fn cost_headers_and_rank_extractors_describe_too() {
        let req = request(&[("x-prompt-tokens", "12")]);
        let cost = CostHeader::new("x-prompt-tokens").descriptor(&req).cost;
        assert_eq!(cost, Cost::prompt(12));
        let by_rank = ByRank(|_: &Request<()>| Some(4));
        assert_eq!(by_rank.descriptor(&req).rank, Some(4));
        let layers: Describer = Describer::default();
        let describer = layers.rank(|_: &Request<()>| Some(5));
        assert_eq!(describer.descriptor(&req).rank, Some(5));
    }
}
