//! The admission middleware itself, laid out as a tower-http middleware:
//! [`AdmissionLayer`] (`layer.rs`) configures it, [`Admission`]
//! (`service.rs`) decides each request when it is called, its
//! [`ResponseFuture`] (`future.rs`) waits in the gate's queue and then for
//! the inner service, and its [`ResponseBody`] (`body.rs`) carries the
//! request's permit until the response ends. Beside them: the
//! [`Admitted`] and [`FirstToken`] extensions an admitted request carries
//! (`admitted.rs`, `first_token.rs`), the [`Bypass`] predicates
//! (`bypass.rs`), the client's view of each admitted request, measured
//! from its arrival to the end of its response (`client.rs`) and, with
//! feature `tonic`, tonic's `NamedService` (`tonic.rs`).
//!
//! What the layer tells the gate about a request comes from the
//! [describer](crate::http::Describe) (`http/describe.rs`), and its
//! overload answers from `http/reject.rs`, both shared with the other
//! middlewares of [`http`](crate::http). Every type here is re-exported
//! there, which is where the docs and examples are.

mod admitted;
mod body;
mod bypass;
mod client;
mod first_token;
mod future;
mod layer;
mod service;
#[cfg(feature = "tonic")]
mod tonic;

pub use self::admitted::Admitted;
pub use self::body::ResponseBody;
pub use self::bypass::{Bypass, BypassPaths, NoBypass};
pub use self::first_token::FirstToken;
pub use self::future::ResponseFuture;
pub use self::layer::AdmissionLayer;
pub use self::service::Admission;
