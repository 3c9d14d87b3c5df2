//! A request's quality of service (behaviour §8): its [`Priority`] and its
//! [`Tenant`], as the admission layer's describer fills them in.
//!
//! A request with neither is priority 0, no tenant: the gate's plain FIFO.
//! Three ways to give them:
//!
//! * [`AdmissionLayer::qos_headers`](crate::http::AdmissionLayer::qos_headers)
//!   with [`QosHeaders`]: the layer reads `x-admission-priority` and
//!   `x-admission-tenant` (or headers you name);
//! * a describer of your own, a closure given to
//!   [`AdmissionLayer::describe`](crate::http::AdmissionLayer::describe)
//!   that sets `descriptor.priority` and `descriptor.tenant`;
//! * [`Priority`] and [`Tenant`] request extensions, inserted by any
//!   middleware of yours in front of the layer: the layer always reads them.
//!
//! **Take them from a trusted router only.** A client that may set its own
//! priority can put itself ahead of everyone, and one that picks its tenant
//! can claim someone else's share. Have the router strip whatever the
//! client sent and set these headers itself, or decide them in your own
//! describer from an authenticated identity.
//!
//! Malformed values are ignored, as a malformed rank is: a request whose
//! priority header is not one decimal integer gets priority 0, one whose
//! tenant header is not one UTF-8 name of at most
//! [`QosHeaders::MAX_TENANT_BYTES`] bytes gets no tenant. Neither is ever an
//! error answer.
//!
//! ```
//! use axum::{Router, routing::post};
//! use tower_admission::http::QosHeaders;
//! use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};
//!
//! let gate = Gate::new(AdmissionConfig::new().tenant_weight("chat", 4));
//! let app: Router = Router::new()
//!     .route("/v1/chat/completions", post(|| async { "…" }))
//!     .route_layer(AdmissionLayer::new(gate).qos_headers(QosHeaders::default()));
//! # let _ = app;
//! ```

use std::fmt;

use http::{HeaderName, HeaderValue, Request};

use super::Describe;
use crate::gate::{Descriptor, Tenant};
use crate::headers::{header_name, single_value};

/// A request extension holding the request's priority (behaviour §8): higher is
/// served first, 0 by default, negative marks sheddable work. Read by
/// [`Admission`](crate::http::Admission) into the request's
/// [`Descriptor`](crate::Descriptor), with the request's [`Tenant`]
/// extension; set by it on an admitted request whose priority
/// [`QosHeaders`] read, for the inner service to see.
///
/// ```
/// use tower_admission::Tenant;
/// use tower_admission::http::Priority;
///
/// let mut req = http::Request::new(());
/// // Set by a trusted router or an inner layer, never from what the client says.
/// req.extensions_mut().insert(Priority(5));
/// req.extensions_mut().insert(Tenant::new("chat"));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Priority(pub i32);

/// What [`QosHeaders`] read of a request: its priority and tenant, each
/// `None` when the headers could not tell. The layer describes the request
/// with it and sets it as the admitted request's extensions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Qos {
    pub(crate) priority: Option<i32>,
    pub(crate) tenant: Option<Tenant>,
}

impl Qos {
    /// Fills in what is known of `descriptor`.
    pub(crate) fn describe(self, descriptor: &mut Descriptor) {
        if let Some(priority) = self.priority {
            descriptor.priority = priority;
        }
        if let Some(tenant) = self.tenant {
            descriptor.tenant = Some(tenant);
        }
    }

    /// Inserts what is known as [`Priority`] and [`Tenant`] extensions of
    /// `req`, replacing any there; what is unknown leaves them as they are.
    pub(crate) fn insert_into<B>(self, req: &mut Request<B>) {
        if let Some(priority) = self.priority {
            req.extensions_mut().insert(Priority(priority));
        }
        if let Some(tenant) = self.tenant {
            req.extensions_mut().insert(tenant);
        }
    }
}

/// Reads the priority and the tenant from request headers set by a
/// trusted router: by default `x-admission-priority` and
/// `x-admission-tenant`.
///
/// * The priority must be exactly one header holding a decimal integer
///   that fits an `i32`: ASCII digits, optionally after a `-`. Anything
///   else — no header, an empty value, a `+`, spaces inside, a number out
///   of range, non-ASCII bytes, the header repeated (even with equal
///   values) — leaves the priority unknown (0), as a malformed rank leaves
///   a request unranked.
/// * The tenant is exactly one header holding a name: valid UTF-8, not
///   empty, at most [`MAX_TENANT_BYTES`](Self::MAX_TENANT_BYTES) bytes, no
///   control characters. Anything else leaves the request without a
///   tenant. The name is hashed into a [`Tenant`]; weights configured by
///   name ([`AdmissionConfig::tenant_weight`](crate::AdmissionConfig::tenant_weight))
///   apply to it.
///
/// The headers must be set by a trusted router, which should remove any
/// copy sent by the client: an end user who sets their own priority jumps
/// the queue, and one who names a tenant takes its share.
///
/// ```
/// use tower_admission::http::QosHeaders;
///
/// let headers = QosHeaders::default()
///     .priority_header("x-priority")
///     .tenant_header("x-org-id");
/// # let _ = headers;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosHeaders {
    priority: HeaderName,
    tenant: HeaderName,
}

impl QosHeaders {
    /// The header read for the priority by default.
    pub const DEFAULT_PRIORITY_NAME: &'static str = "x-admission-priority";
    /// The header read for the tenant by default.
    pub const DEFAULT_TENANT_NAME: &'static str = "x-admission-tenant";
    /// The longest tenant name read, in bytes; a longer one is ignored.
    pub const MAX_TENANT_BYTES: usize = 256;

    /// Reads the priority from header `name` (a `&str`, `String` or
    /// [`HeaderName`]) instead.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name: header names are
    /// configuration, so this is a programming error, found at startup.
    pub fn priority_header<N>(self, name: N) -> Self
    where
        N: TryInto<HeaderName>,
        N::Error: fmt::Debug,
    {
        Self {
            priority: header_name(name, "QosHeaders::priority_header"),
            ..self
        }
    }

    /// Reads the tenant from header `name` instead.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn tenant_header<N>(self, name: N) -> Self
    where
        N: TryInto<HeaderName>,
        N::Error: fmt::Debug,
    {
        Self {
            tenant: header_name(name, "QosHeaders::tenant_header"),
            ..self
        }
    }
}

impl Default for QosHeaders {
    fn default() -> Self {
        QosHeaders {
            priority: HeaderName::from_static(Self::DEFAULT_PRIORITY_NAME),
            tenant: HeaderName::from_static(Self::DEFAULT_TENANT_NAME),
        }
    }
}

impl QosHeaders {
    /// What the headers of `req` say about its priority and tenant.
    pub(crate) fn read<B>(&self, req: &Request<B>) -> Qos {
        let headers = req.headers();
        Qos {
            priority: single_value(headers, &self.priority).and_then(parse_priority),
            tenant: single_value(headers, &self.tenant).and_then(parse_tenant),
        }
    }
}

/// The priority and tenant the headers hold; a missing or malformed one
/// leaves what was filled in before.
impl<B> Describe<B> for QosHeaders {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        self.read(req).describe(descriptor);
    }
}

/// A priority is an optional `-` and one or more ASCII digits that fit an
/// `i32`; nothing else.
fn parse_priority(value: &HeaderValue) -> Option<i32> {
    let text = value.to_str().ok()?;
    let digits = text.strip_prefix('-').unwrap_or(text);
    // `str::parse` alone would also take a leading `+`.
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A tenant is a UTF-8 name of 1 to [`QosHeaders::MAX_TENANT_BYTES`] bytes
/// without control characters.
fn parse_tenant(value: &HeaderValue) -> Option<Tenant> {
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > QosHeaders::MAX_TENANT_BYTES {
        return None;
    }
    let name = std::str::from_utf8(bytes).ok()?;
    if name.chars().any(char::is_control) {
        return None;
    }
    Some(Tenant::new(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The priority and tenant in `req`'s extensions: priority 0 and no
    /// tenant unless set.
    fn qos_of<B>(req: &Request<B>) -> (i32, Option<Tenant>) {
        let extensions = req.extensions();
        let priority = extensions
            .get::<Priority>()
            .map_or(0, |priority| priority.0);
        (priority, extensions.get::<Tenant>().copied())
    }

    fn with(name: &'static str, values: &[&[u8]]) -> Request<()> {
        let mut req = Request::new(());
        for value in values {
            req.headers_mut()
                .append(name, HeaderValue::from_bytes(value).unwrap());
        }
        req
    }

    fn priority_of(values: &[&[u8]]) -> Option<i32> {
        QosHeaders::default()
            .read(&with(QosHeaders::DEFAULT_PRIORITY_NAME, values))
            .priority
    }

    fn tenant_of(values: &[&[u8]]) -> Option<Tenant> {
        QosHeaders::default()
            .read(&with(QosHeaders::DEFAULT_TENANT_NAME, values))
            .tenant
    }

    /// `read` finds nothing in any of `values` (each the header's values,
    /// in order), nor where no header is read from at all: none, an empty
    /// one, one that is not UTF-8.
    fn assert_unread<T: fmt::Debug>(read: fn(&[&[u8]]) -> Option<T>, values: &[&[&[u8]]]) {
        let unreadable: &[&[&[u8]]] = &[&[], &[b""], &[b"\xff\xfe"]];
        for values in unreadable.iter().chain(values) {
            assert!(read(values).is_none(), "{values:?}");
        }
    }

    #[test]
    fn a_single_decimal_integer_is_the_priority() {
        assert_eq!(priority_of(&[b"0"]), Some(0));
        assert_eq!(priority_of(&[b"5"]), Some(5));
        assert_eq!(priority_of(&[b"-1"]), Some(-1));
        assert_eq!(priority_of(&[b"007"]), Some(7));
        assert_eq!(priority_of(&[b"-0"]), Some(0));
        assert_eq!(priority_of(&[b"2147483647"]), Some(i32::MAX));
        assert_eq!(priority_of(&[b"-2147483648"]), Some(i32::MIN));
    }

    #[test]
    fn anything_but_one_plain_integer_leaves_the_priority_unknown() {
        assert_unread(
            priority_of,
            &[
                &[b"-"],
                &[b"+1"],
                &[b"--1"],
                &[b"1 2"],
                &[b" 1"],
                &[b"1.0"],
                &[b"0x1"],
                &[b"high"],
                &[b"2147483648"],
                &[b"-2147483649"],
                &[b"99999999999999999999999999"],
                &[b"1\x80"],
                &[b"1", b"1"],
                &[b"1", b"2"],
            ],
        );
    }

    #[test]
    fn a_single_utf8_name_is_the_tenant() {
        assert_eq!(tenant_of(&[b"acme"]), Some(Tenant::new("acme")));
        assert_eq!(
            tenant_of(&["caf\u{e9}".as_bytes()]),
            Some(Tenant::new("caf\u{e9}"))
        );
        let longest = vec![b'a'; QosHeaders::MAX_TENANT_BYTES];
        assert!(tenant_of(&[&longest]).is_some());
    }

    #[test]
    fn anything_but_one_plain_name_leaves_no_tenant() {
        let overlong = vec![b'a'; QosHeaders::MAX_TENANT_BYTES + 1];
        assert_unread(
            tenant_of,
            &[
                &[b"acme\xc3"],
                &[b"a\tb"],
                &[&overlong],
                &[b"acme", b"acme"],
                &[b"acme", b"globex"],
            ],
        );
    }

    #[test]
    fn header_names_are_configurable_and_extensions_default_to_priority_0() {
        let headers = QosHeaders::default()
            .priority_header("X-Prio")
            .tenant_header("x-org");
        let mut req = Request::builder()
            .header("x-prio", "3")
            .header("x-org", "acme")
            .header(QosHeaders::DEFAULT_PRIORITY_NAME, "9")
            .body(())
            .unwrap();
        assert_eq!(qos_of(&req), (0, None));
        headers.read(&req).insert_into(&mut req);
        assert_eq!(qos_of(&req), (3, Some(Tenant::new("acme"))));
        let descriptor = headers.descriptor(&req);
        assert_eq!(descriptor.priority, 3);
        assert_eq!(descriptor.tenant, Some(Tenant::new("acme")));
        // A malformed header leaves what an earlier layer set, and what
        // was filled in before.
        req.headers_mut().insert("x-prio", "high".parse().unwrap());
        headers.read(&req).insert_into(&mut req);
        assert_eq!(req.extensions().get::<Priority>(), Some(&Priority(3)));
        let mut descriptor = Descriptor::new().with_priority(5);
        headers.describe(&req, &mut descriptor);
        assert_eq!(descriptor.priority, 5);
    }
}
