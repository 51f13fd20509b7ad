//! The approve step: both CSR objects approved, kube-controller-manager's
//! certificates awaited and checked against the CSRs that were judged.

use super::bind::Prepared;
use super::JoinContext;
use crate::join::refusal::JoinError;
use crate::kube::issuer::{IssueError, IssueRequest};
use crate::kube::metrics::KindLabels;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;

/// Both CSR objects approved and signed, in the order of
/// the requests.
pub(super) async fn approve(
    ctx: &JoinContext,
    prepared: &Prepared<'_>,
) -> Result<[String; 2], JoinError> {
    let issued = prepared
        .requests
        .iter()
        .zip(&prepared.csrs)
        .map(|(r, csr)| finish(ctx, r, csr.object.clone()));
    let certificates = futures::future::try_join_all(issued).await?;
    <[String; 2]>::try_from(certificates)
        .map_err(|_| JoinError::unavailable("expected two certificates"))
}

/// One CSR object approved, signed by kube-controller-manager.
async fn finish(
    ctx: &JoinContext,
    request: &IssueRequest<'_>,
    csr: CertificateSigningRequest,
) -> Result<String, IssueError> {
    let cert = ctx.issuer.finish(request, csr).await?;
    ctx.metrics
        .approvals
        .get_or_create(&KindLabels {
            kind: request.purpose.as_str(),
        })
        .inc();
    Ok(cert)
}
