//! The per-requester cap: which of a node's other CSRs count against it,
//! pending ones and those approved within [`RECENT_WINDOW`].

use super::store::{approved, decided};
use super::{Context, RECENT_WINDOW};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::ResourceExt;

/// CSRs from the same requester that count toward its cap, this one
/// excluded: from the requester's own entries in the index, not a scan.
pub(super) fn counted_toward_cap(ctx: &Context, csr: &CertificateSigningRequest) -> usize {
    let now = ctx.settings.clock.unix();
    let Some(user) = csr.spec.username.as_deref() else {
        return 0;
    };
    ctx.by_node
        .of(user, &ctx.csr_stores)
        .iter()
        .filter(|other| counts_toward_cap(other, csr, now))
        .count()
}

/// Whether `other` counts toward `csr`'s requester's cap at `now` (Unix
/// seconds): same requester, another CSR, and pending, or approved and
/// created within [`RECENT_WINDOW`]. Denied and failed-unapproved ones do
/// not count: they gave the node nothing.
pub(super) fn counts_toward_cap(
    other: &CertificateSigningRequest,
    csr: &CertificateSigningRequest,
    now: i64,
) -> bool {
    if other.spec.username != csr.spec.username || other.name_any() == csr.name_any() {
        return false;
    }
    if !decided(other) {
        return true;
    }
    if !approved(other) {
        return false;
    }
    let window = i64::try_from(RECENT_WINDOW.as_secs()).unwrap_or(i64::MAX);
    match other.metadata.creation_timestamp.as_ref() {
        Some(created) => now.saturating_sub(created.0.as_second()) < window,
        // The API server always sets it; without one, count it.
        None => true,
    }
}
