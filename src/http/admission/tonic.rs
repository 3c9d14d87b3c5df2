//! tonic integration (feature `tonic`): an admitted service keeps its gRPC
//! name, so it can be added to a tonic server on its own.

use tonic::server::NamedService;

use super::Admission;

#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
/// `Server::builder().add_service(AdmissionLayer::new(gate).layer(svc))`:
/// the admitted service is routed under `svc`'s name.
impl<S: NamedService, D, R, P, X> NamedService for Admission<S, D, R, P, X> {
    const NAME: &'static str = S::NAME;
}
