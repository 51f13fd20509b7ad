//! Why a kubelet CSR is left pending: each reason, its metric label, and
//! when to look at the CSR again.

use super::{MAX_USAGES, RETRY_DECLINED};
use crate::ec2::LookupError;
use crate::kube::binding::Unreadable;
use autonode_shared::csr;
use std::time::Duration;
use thiserror::Error;

/// Why a kubelet CSR was not approved (now).
#[derive(Debug, Error)]
pub enum Decline {
    #[error("node {0} does not exist")]
    NoNode(String),
    #[error("node {0} has no AWS providerID")]
    NoProviderId(String),
    #[error("no NodeClaim has providerID {0}")]
    NoNodeClaim(String),
    #[error("{count} NodeClaims have providerID {provider_id}")]
    ManyNodeClaims { provider_id: String, count: usize },
    #[error("NodeClaim {0} is not bound by autonode")]
    NotBound(String),
    #[error("NodeClaim {nodeclaim}: {source}")]
    UnreadableBinding {
        nodeclaim: String,
        source: Unreadable,
    },
    /// [`crate::kube::binding::is_its_node`] says no.
    #[error(
        "node {node} (providerID {provider_id}) is not NodeClaim {nodeclaim}'s: it is bound to \
         instance {bound} as node {bound_name}"
    )]
    NotItsNode {
        node: String,
        provider_id: String,
        nodeclaim: String,
        bound: String,
        bound_name: String,
    },
    #[error(
        "another instance held the name {node} until {last_held}: a certificate issued to it \
         may be valid until {until}, and nothing in a CSR tells its machine from this one"
    )]
    NameReused {
        node: String,
        last_held: String,
        until: String,
    },
    #[error("node {node} is not instance {instance_id}'s name ({according_to} says {name:?})")]
    NotItsName {
        node: String,
        instance_id: String,
        according_to: &'static str,
        name: String,
    },
    #[error("instance {instance_id} is {state:?} in EC2, not pending or running")]
    NotLive { instance_id: String, state: String },
    #[error("{0}")]
    Csr(#[from] csr::CsrError),
    /// Its body was not kept ([`keep_for_judging`](super::keep_for_judging)): never judged.
    #[error(
        "its request is over {max} bytes or it has over {MAX_USAGES} usages; not kept, not judged",
        max = csr::MAX_CSR_PEM_BYTES
    )]
    Oversized,
    #[error(
        "node {node} already has {count} CSRs pending or approved in the last {window_minutes} \
         minutes (cap {cap})"
    )]
    TooMany {
        node: String,
        count: usize,
        cap: usize,
        window_minutes: u64,
    },
    #[error("EC2 lookup: {0}")]
    Lookup(#[from] LookupError),
    /// Not a verdict: this node's EC2 lookups are paced; look again then.
    #[error("node {node} is out of EC2 lookups for now; next in {retry_in:?}")]
    RateLimited { node: String, retry_in: Duration },
}

impl Decline {
    /// A short, fixed label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoNode(_) => "no_node",
            Self::NoProviderId(_) => "no_provider_id",
            Self::NoNodeClaim(_) => "no_nodeclaim",
            Self::ManyNodeClaims { .. } => "many_nodeclaims",
            Self::NotBound(_) => "not_bound",
            Self::UnreadableBinding { .. } => "unreadable_binding",
            Self::NotItsNode { .. } => "not_its_node",
            Self::NameReused { .. } => "name_reused",
            Self::NotItsName { .. } => "not_instance_name",
            Self::NotLive { .. } => "instance_not_live",
            Self::Csr(e) => e.reason(),
            Self::Oversized => "csr_too_large",
            Self::TooMany { .. } => "too_many_csrs",
            Self::Lookup(_) => "ec2_lookup",
            Self::RateLimited { .. } => "rate_limited",
        }
    }

    /// When to look at the CSR again: never for one not kept (a CSR's
    /// spec cannot change).
    pub(super) fn retry_in(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_in, .. } => Some(*retry_in),
            Self::Oversized => None,
            _ => Some(RETRY_DECLINED),
        }
    }
}
