//! The approver's own view of kubelet's CSRs: one watch and store per
//! signer, each CSR stripped to what judging reads, whether one is decided,
//! and the count of those still pending.

use super::MAX_USAGES;
use crate::kube::cache::{self, Cache};
use crate::kube::marks;
use crate::kube::metrics::{Metrics, SignerLabels};
use autonode_shared::csr;
use futures::{Stream, StreamExt};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::ByteString;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::Api;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// How often `autonode_csrs_pending` is counted again.
const PENDING_COUNT_PERIOD: Duration = Duration::from_secs(5);

/// Keeps `autonode_csrs_pending` at the undecided CSRs in each signer's
/// store: counted from the stores rather than from judgements, so a CSR
/// judged once and never again (one too large to keep) counts for as long
/// as it is pending, and a deleted one stops counting. Back to 0 when
/// dropped (this replica stops leading), so only the leader's is not 0.
pub(super) async fn count_pending(
    stores: [(&'static str, Store<CertificateSigningRequest>); 2],
    metrics: Metrics,
) {
    struct Zero(Metrics, [&'static str; 2]);
    impl Drop for Zero {
        fn drop(&mut self) {
            for signer in self.1 {
                self.0
                    .csrs_pending
                    .get_or_create(&SignerLabels { signer })
                    .set(0);
            }
        }
    }
    let _zero = Zero(metrics.clone(), stores.clone().map(|(signer, _)| signer));
    loop {
        for (signer, store) in &stores {
            let pending = store.state().iter().filter(|c| !decided(c)).count();
            metrics
                .csrs_pending
                .get_or_create(&SignerLabels { signer })
                .set(i64::try_from(pending).unwrap_or(i64::MAX));
        }
        tokio::time::sleep(PENDING_COUNT_PERIOD).await;
    }
}

/// The CSRs of `signer`, as a store, the queue of their changes and the
/// watch that fills both (each object stripped to [`keep_for_judging`]
/// before it is kept), to be polled beside the controller.
pub(super) fn kubelet_csrs(
    api: &Api<CertificateSigningRequest>,
    signer: &'static str,
) -> (
    Store<CertificateSigningRequest>,
    impl Stream<Item = Result<Arc<CertificateSigningRequest>, Infallible>> + Send + 'static,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    // Without autonode's own (labelled) CSRs: the join approves those, and
    // a node's CSR never is one of them (it is made by the server's own
    // identity). Each join's two CSRs and their changes were parsed and
    // kept here for nothing. A node that labels its own CSR so only hides
    // it from the one controller that could approve it.
    let config = watcher::Config::default()
        .fields(&format!("spec.signerName={signer}"))
        .labels(&format!("!{}", marks::CSR_MANAGED_LABEL))
        .page_size(cache::SMALL_PAGE);
    let (csrs, watching) = Cache::with_config(api.clone(), config, signer, keep_for_judging);
    let changes = csrs.changes().map(Ok);
    (csrs.store, changes, watching)
}

/// What the approver keeps of a kubelet CSR: what [`ours_to_judge`](super::ours_to_judge),
/// `judge` and the cap read. A request larger than
/// [`csr::MAX_CSR_PEM_BYTES`] (or with more usages than [`MAX_USAGES`]) is
/// not kept: its request is emptied, which the API server never stores, so
/// `judge` knows it for one it will not judge.
pub fn keep_for_judging(csr: &mut CertificateSigningRequest) {
    cache::identity_only(&mut csr.metadata);
    let spec = &mut csr.spec;
    spec.extra = None;
    spec.uid = None;
    let usages = spec.usages.as_ref().map_or(0, Vec::len);
    if spec.request.0.len() > csr::MAX_CSR_PEM_BYTES || usages > MAX_USAGES {
        spec.request = ByteString(Vec::new());
        spec.usages = None;
    }
    let Some(status) = csr.status.as_mut() else {
        return;
    };
    // Only whether there is one is read.
    if let Some(certificate) = status.certificate.as_mut() {
        certificate.0 = Vec::new();
    }
    for condition in status.conditions.iter_mut().flatten() {
        *condition = CertificateSigningRequestCondition {
            type_: std::mem::take(&mut condition.type_),
            status: std::mem::take(&mut condition.status),
            ..Default::default()
        };
    }
}

pub(super) fn decided(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.as_ref();
    status.and_then(|s| s.certificate.as_ref()).is_some()
        || status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
            c.iter()
                .any(|c| matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed"))
        })
}

/// Approved (by anyone), whether or not signed yet.
pub(super) fn approved(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.as_ref();
    status.and_then(|s| s.certificate.as_ref()).is_some()
        || status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Approved"))
}
