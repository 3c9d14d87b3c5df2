//! [`FirstToken`]: the handler's way to end an admitted request's waiting,
//! and the cell it shares with the response body.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::gate::Permit;

/// Ends the *waiting* of an admitted request from inside the handler.
///
/// Every request the layer admits carries one in its extensions (with axum:
/// `Extension(first_token): Extension<FirstToken>`). By default waiting ends
/// when the response body's first generated token passes the
/// [`FirstTokenDetector`](crate::FirstTokenDetector), or when the body ends.
/// A handler that knows better calls [`mark`](FirstToken::mark):
///
/// * a non-streaming JSON answer, marked when the engine has produced its
///   first token (otherwise waiting lasts until the whole answer is
///   generated and its body reaches the client);
/// * an engine that reports its first token before the bytes reach the body.
///
/// `mark` releases the waiting capacity at once, before the response body is
/// polled. It is idempotent, cheap after the first call, and harmless after
/// the body has ended waiting or the response has ended. Clones share the
/// request's state; keeping one after the response ended holds no capacity.
///
/// ```
/// use axum::{Extension, Json, Router, routing::post};
/// use tower_admission::http::FirstToken;
/// use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};
///
/// async fn complete(Extension(first_token): Extension<FirstToken>) -> Json<&'static str> {
///     // ... the engine produced its first token:
///     first_token.mark();
///     // ... and the rest of the answer:
///     Json("the whole answer")
/// }
///
/// let gate = Gate::new(AdmissionConfig::new());
/// let app: Router = Router::new()
///     .route("/v1/completions", post(complete).route_layer(AdmissionLayer::new(gate)));
/// # let _ = app;
/// ```
#[derive(Clone)]
pub struct FirstToken {
    shared: Arc<Shared>,
}

/// What the response body and every [`FirstToken`] clone share.
struct Shared {
    /// Waiting has ended (marked, detected, or the response ended): the fast
    /// check that spares the lock.
    waiting_over: AtomicBool,
    /// The request's permit; taken (and dropped) when the response ends.
    permit: Mutex<Option<Permit>>,
}

impl FirstToken {
    /// The first generated token exists: release the request's waiting
    /// capacity now. Idempotent.
    pub fn mark(&self) {
        self.shared.end_waiting();
    }

    /// Whether waiting has ended: marked, seen by the detector, or the
    /// response ended.
    pub fn is_marked(&self) -> bool {
        self.shared.waiting_over.load(Ordering::Acquire)
    }
}

impl fmt::Debug for FirstToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FirstToken")
            .field("marked", &self.is_marked())
            .finish()
    }
}

impl Shared {
    fn end_waiting(&self) {
        if self.waiting_over.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut permit = self.permit.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(permit) = permit.as_mut() {
            permit.first_token();
        }
    }
}

/// The layer's side of an admitted request: holds the permit (through the
/// shared cell) until the response ends, and releases it when dropped.
pub(crate) struct Held {
    shared: Arc<Shared>,
}

impl Held {
    /// The cell of a newly admitted request, and the extension that shares it.
    pub(crate) fn new(permit: Permit) -> (Held, FirstToken) {
        let shared = Arc::new(Shared {
            waiting_over: AtomicBool::new(false),
            permit: Mutex::new(Some(permit)),
        });
        let token = FirstToken {
            shared: Arc::clone(&shared),
        };
        (Held { shared }, token)
    }

    /// The detector saw the first token.
    pub(crate) fn first_token(&mut self) {
        match Arc::get_mut(&mut self.shared) {
            // Nobody else holds the cell: no lock needed.
            Some(shared) => {
                if !std::mem::replace(shared.waiting_over.get_mut(), true) {
                    let permit = shared
                        .permit
                        .get_mut()
                        .unwrap_or_else(PoisonError::into_inner);
                    if let Some(permit) = permit.as_mut() {
                        permit.first_token();
                    }
                }
            }
            None => self.shared.end_waiting(),
        }
    }

    /// Whether waiting has ended, by a handler's [`FirstToken::mark`] or
    /// otherwise.
    #[inline]
    pub(crate) fn waiting_over(&self) -> bool {
        self.shared.waiting_over.load(Ordering::Relaxed)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Alone, the cell and its permit go with the `Arc`; otherwise a
        // `FirstToken` clone may outlive the response and must not keep the
        // permit alive.
        if Arc::get_mut(&mut self.shared).is_none() {
            self.shared.waiting_over.store(true, Ordering::Release);
            let permit = self
                .shared
                .permit
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            drop(permit);
        }
    }
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("Held");
        match self.shared.permit.try_lock() {
            Ok(permit) => debug.field("permit", &*permit),
            Err(_) => debug.field("permit", &"<locked>"),
        };
        debug.finish()
    }
}
