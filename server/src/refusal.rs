//! Why a join was not granted.
//!
//! The caller learns only that it was refused (and a request id); the
//! precise reason goes to the log, an Event and the `reason` label of a
//! metric. Each reason has a short stable label for that.

use crate::ec2::LookupError;
use autonode_shared::csr::CsrError;
use autonode_shared::identity::{IdentityError, PolicyError};
use autonode_shared::issued::IssuedError;
use thiserror::Error;

/// A definite "no": retrying the same request cannot succeed.
#[derive(Debug, Error)]
pub enum Refusal {
    #[error("malformed request: {0}")]
    BadRequest(String),
    #[error("identity document refused: {0}")]
    Identity(#[from] IdentityError),
    #[error("identity policy refused: {0}")]
    Policy(#[from] PolicyError),
    #[error("no NodeClaim has providerID {0}")]
    NoNodeClaim(String),
    #[error("{count} NodeClaims have providerID {provider_id}")]
    ManyNodeClaims { provider_id: String, count: usize },
    #[error("NodeClaim {0} is already Registered")]
    AlreadyRegistered(String),
    #[error("NodeClaim {0} is being deleted")]
    Deleting(String),
    #[error(
        "instance pendingTime {pending} is before NodeClaim {nodeclaim} was created ({created})"
    )]
    PendingBeforeNodeClaim {
        nodeclaim: String,
        pending: String,
        created: String,
    },
    #[error("EC2 refused the instance lookup: {0}")]
    Lookup(LookupError),
    #[error("instance {instance_id} is {state} in EC2, not pending or running")]
    InstanceNotLive { instance_id: String, state: String },
    #[error("instance {instance_id} runs image {actual} in EC2 but the document says {signed}")]
    ImageMismatch {
        instance_id: String,
        signed: String,
        actual: String,
    },
    #[error("instance {0} has no private DNS name in EC2")]
    NoPrivateDnsName(String),
    #[error("possible replay: instance {instance_id} (NodeClaim {nodeclaim}) is bound to client key {bound}, this join used {offered}")]
    PossibleReplay {
        instance_id: String,
        nodeclaim: String,
        bound: String,
        offered: String,
    },
    #[error("client CSR refused: {0}")]
    ClientCsr(CsrError),
    #[error("serving CSR refused: {0}")]
    ServingCsr(CsrError),
    #[error("kube-controller-manager refused to sign {csr}: {message}")]
    SigningFailed { csr: String, message: String },
    #[error("NodeClaim {nodeclaim}: {detail}")]
    BindingUnreadable { nodeclaim: String, detail: String },
    #[error("CSR object {csr} is not the one this join created and judged: {detail}")]
    CsrSubstituted { csr: String, detail: String },
    #[error("CSR {csr}: {source}")]
    CertificateMismatch {
        csr: String,
        #[source]
        source: IssuedError,
    },
}

impl Refusal {
    /// Whether this refusal means the instance itself can never join (its
    /// account, region, age, EC2 state or image), as opposed to a bad
    /// request that someone else holding its document could have sent (a
    /// forged signature, foreign CSRs, a replay): only the former may get
    /// its NodeClaim deleted, or a leaked document would be a way to have
    /// healthy machines replaced.
    pub fn dooms_instance(&self) -> bool {
        // A pendingTime "in the future" may be our own clock's fault.
        if let Self::Policy(PolicyError::PendingTimeInFuture { .. }) = self {
            return false;
        }
        matches!(
            self,
            Self::Policy(_)
                | Self::PendingBeforeNodeClaim { .. }
                | Self::InstanceNotLive { .. }
                | Self::ImageMismatch { .. }
                | Self::NoPrivateDnsName(_)
        )
    }

    /// A short, stable label for metrics and Event reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::Identity(e) => e.label(),
            Self::Policy(e) => e.label(),
            Self::NoNodeClaim(_) => "no_nodeclaim",
            Self::ManyNodeClaims { .. } => "many_nodeclaims",
            Self::AlreadyRegistered(_) => "nodeclaim_registered",
            Self::Deleting(_) => "nodeclaim_deleting",
            Self::PendingBeforeNodeClaim { .. } => "pending_before_nodeclaim",
            Self::Lookup(_) => "ec2_lookup_refused",
            Self::InstanceNotLive { .. } => "instance_not_live",
            Self::ImageMismatch { .. } => "image_mismatch",
            Self::NoPrivateDnsName(_) => "no_private_dns_name",
            Self::PossibleReplay { .. } => "possible_replay",
            Self::ClientCsr(_) => "client_csr",
            Self::ServingCsr(_) => "serving_csr",
            Self::SigningFailed { .. } => "signing_failed",
            Self::BindingUnreadable { .. } => "binding_unreadable",
            Self::CsrSubstituted { .. } => "csr_substituted",
            Self::CertificateMismatch { .. } => "certificate_mismatch",
        }
    }
}

/// Everything that can stop a join.
#[derive(Debug, Error)]
pub enum JoinError {
    /// A definite refusal (HTTP 403 or 400).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// Something on our side or upstream is unavailable; the agent retries
    /// (HTTP 503).
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
}

impl JoinError {
    /// The label for metrics: the refusal reason, or `unavailable`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Refused(r) => r.reason(),
            Self::Unavailable(_) => "unavailable",
        }
    }
}

impl From<kube::Error> for JoinError {
    fn from(e: kube::Error) -> Self {
        Self::Unavailable(format!("kube API: {e}"))
    }
}
