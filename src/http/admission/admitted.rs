//! [`Admitted`]: what an admitted request carries into the inner service,
//! with its [`FirstToken`](crate::http::FirstToken) handle.

use http::Request;

use super::first_token::Held;
use crate::gate::{AdmitSource, Permit};

/// What the gate decided for a request, inserted into the request's
/// extensions before the inner service sees it: the rank the request is
/// counted under (`None` when unranked, including an unrecognised rank) and
/// how it got in. A handler that runs the request on an engine rank should
/// use this rank, the one the gate accounted for.
///
/// With axum: `Extension(admitted): Extension<Admitted>`. More fields may
/// come; read the ones you need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Admitted {
    /// The rank the request is counted under.
    pub rank: Option<u32>,
    /// Whether it was admitted on arrival or from the queue.
    pub source: AdmitSource,
}

impl Admitted {
    pub(crate) fn of(permit: &Permit) -> Admitted {
        Admitted {
            rank: permit.rank(),
            source: permit.source(),
        }
    }
}

/// Marks `req` admitted: the [`Admitted`] and
/// [`FirstToken`](crate::http::FirstToken) extensions.
pub(crate) fn admit<B>(req: &mut Request<B>, permit: Permit) -> Held {
    let admitted = Admitted::of(&permit);
    let (held, first_token) = Held::new(permit);
    let extensions = req.extensions_mut();
    extensions.insert(admitted);
    extensions.insert(first_token);
    held
}
