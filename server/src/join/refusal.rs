//! Why a join was not granted.
//!
//! The caller learns only that it was refused (and a request id); the
//! precise reason goes to the log, an Event and the `reason` label of a
//! metric. Each reason has a short stable label for that.
//!
//! The services a join uses ([`crate::kube::nodeclaim`], [`crate::kube::binding`],
//! [`crate::kube::issuer`], [`crate::join::render::inputs`]) return their own errors and
//! know nothing of HTTP; the `From` impls here are the one place that
//! decides which of their failures refuse a join and which only make it
//! unavailable for now.

use crate::attestation::verdict::AttestationRefusal;
use crate::ec2::LookupError;
use crate::join::render::inputs::ConfigError;
use crate::kube::binding::{BindingError, BindingRefusal};
use crate::kube::budget::{Cause, Failure};
use crate::kube::issuer::IssueError;
use crate::kube::nodeclaim::{FindError, SelectError};
use autonode_shared::csr::CsrError;
use autonode_shared::identity::{IdentityError, PolicyError};
use autonode_shared::issued::IssuedError;
use std::net::IpAddr;
use thiserror::Error;

use crate::join::agents::MinVersion;
use crate::join::agents::PRIMARY_ADDRESSES_ONLY as AGENT_FIXED;

fn list(ips: &[IpAddr]) -> String {
    let words: Vec<String> = ips.iter().map(ToString::to_string).collect();
    words.join(", ")
}

/// A definite "no": retrying the same request cannot succeed.
#[derive(Debug, Error)]
pub enum Refusal {
    #[error("malformed request: {0}")]
    BadRequest(String),
    #[error("identity document refused: {0}")]
    Identity(#[from] IdentityError),
    #[error("identity policy refused: {0}")]
    Policy(#[from] PolicyError),
    /// No one NodeClaim may be bound for this instance now; the
    /// selection's own words (see [`SelectError`]).
    #[error(transparent)]
    NodeClaim(SelectError),
    /// The NodeClaim's binding refuses the join (unreadable, bound to other
    /// keys, or the NodeClaim gone before the write); the binding's own
    /// words (see [`BindingRefusal`]).
    #[error(transparent)]
    Binding(BindingRefusal),
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
    /// The instance's NodeClaim is Registered to a Node that is not the
    /// machine EC2 names for the instance: another node registered a Node
    /// carrying its providerID (NodeRestriction lets a node choose it)
    /// before the machine's agent joined, and Karpenter took that Node for
    /// the NodeClaim. The machine can never join as it; the NodeClaim is
    /// replaced, which also removes the impostor Node from Karpenter's
    /// capacity.
    #[error(
        "NodeClaim {nodeclaim} is Registered to Node {registered}, but EC2 names instance \
         {instance_id} {expected}: a Node carrying this instance's providerID was registered \
         by another node"
    )]
    NodeSpoofed {
        nodeclaim: String,
        instance_id: String,
        registered: String,
        expected: String,
    },
    #[error("client CSR refused: {0}")]
    ClientCsr(CsrError),
    #[error("serving CSR refused: {0}")]
    ServingCsr(CsrError),
    /// An agent of before [`crate::join::agents::PRIMARY_ADDRESSES_ONLY`] on an instance whose primary
    /// interface has other addresses: it asks its serving certificate for
    /// all of them (as those agents did), and no later try of that AMI can
    /// pass, so its NodeClaim is doomed at once rather than left to time
    /// out. Nothing is signed.
    #[error(
        "the AMI's autonode-agent ({agent_version:?}) is too old for this server: on instance \
         {instance_id} it asks a serving certificate for the primary interface's other addresses \
         ({}), which are pods' and never signed; bake autonode-agent {AGENT_FIXED} or later into \
         the AMI (docs/upgrading.md)",
        list(.extra)
    )]
    AgentTooOld {
        instance_id: String,
        agent_version: String,
        extra: Vec<IpAddr>,
    },
    /// An agent older than the operator's `--min-agent-version`: the AMI
    /// was baked with an agent the operator retired, and no later try of
    /// that AMI can pass, so the machine is replaced (within the failure
    /// budget: a whole fleet of such AMIs is one systemic cause, said once)
    /// and the words say what to bake.
    #[error(
        "the AMI's autonode-agent ({agent_version:?}) on instance {instance_id} is older than \
         this server's --min-agent-version {minimum}: bake autonode-agent {minimum} or later into \
         the AMI and point the EC2NodeClass at it (docs/upgrading.md)"
    )]
    AgentBelowMinimum {
        instance_id: String,
        agent_version: String,
        minimum: MinVersion,
    },
    /// The class must attest (the operator's `--attestation-policy`) and
    /// the join's evidence did not pass; the verdict's own words.
    #[error(transparent)]
    Attestation(#[from] AttestationRefusal),
    #[error("kube-controller-manager refused to sign {csr}: {message}")]
    SigningFailed { csr: String, message: String },
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
    /// What this refusal says of the instance's NodeClaim, each reason
    /// decided here with its reasoning (the budget, `crate::kube::budget`,
    /// then decides whether a failure deletes):
    ///
    /// - [`Cause::Machine`], replace: the instance itself can never join
    ///   (its EC2 state, its image, its name, its agent), and another
    ///   machine may; counted against its group's failure budget.
    /// - [`Cause::Server`], mark only: the instance is refused for
    ///   something on autonode's side. A NodeClaim has a providerID only
    ///   because Karpenter launched that instance in the account and
    ///   region it runs in, so an account or region refused is the
    ///   allow-list's mistake; a pendingTime too old, in the future or
    ///   before the NodeClaim is read against the server's clock or the
    ///   API server's, not against anything the machine chose. A
    ///   replacement fails the same way: marked and said, never deleted,
    ///   and not the values on trial's failure for the rollout guard.
    /// - [`Cause::Impostor`], replace: the NodeClaim's Node is another
    ///   node's (see [`Refusal::NodeSpoofed`]).
    /// - `None`, nothing: a bad request that someone else holding the
    ///   instance's document could have sent (a forged signature, foreign
    ///   CSRs, a replay), or a refusal that says nothing of the machine;
    ///   acting on it would let a leaked document get healthy machines
    ///   marked or replaced.
    pub fn cause(&self) -> Option<Cause> {
        match self {
            Self::Policy(_) | Self::NodeClaim(SelectError::PendingBeforeNodeClaim { .. }) => {
                Some(Cause::Server)
            }
            Self::InstanceNotLive { .. }
            | Self::ImageMismatch { .. }
            | Self::NoPrivateDnsName(_)
            | Self::AgentTooOld { .. }
            | Self::AgentBelowMinimum { .. } => Some(Cause::Machine),
            Self::NodeSpoofed { .. } => Some(Cause::Impostor),
            Self::Attestation(a) if a.is_the_machines() => Some(Cause::Machine),
            _ => None,
        }
    }

    /// The failure this refusal records on the instance's NodeClaim, if
    /// any ([`Refusal::cause`]).
    pub fn failure(&self) -> Option<Failure> {
        let reason = self.reason();
        self.cause().map(|cause| Failure { reason, cause })
    }

    /// Whether this refusal marks the instance's NodeClaim failed (and may
    /// replace it): it says something definite of the instance itself, or
    /// of autonode's settings ([`Refusal::cause`]).
    pub fn dooms_instance(&self) -> bool {
        self.cause().is_some()
    }

    /// Whether the refusal dooms the instance even when its NodeClaim is
    /// bound. Only a refusal reached after the binding was judged to name
    /// this join's own keys qualifies (attest judges it before the CSRs),
    /// so it is the bound machine's own (a resume), never another
    /// holder of its document.
    pub fn dooms_bound_instance(&self) -> bool {
        matches!(
            self,
            Self::AgentTooOld { .. } | Self::AgentBelowMinimum { .. } | Self::NodeSpoofed { .. }
        )
    }

    /// Whether the refusal dooms the instance even when its NodeClaim is
    /// Registered: only when the Registered Node is not the machine's own,
    /// so the NodeClaim's "node" is an impostor and the machine behind it
    /// can never become one.
    pub fn dooms_registered_instance(&self) -> bool {
        matches!(self, Self::NodeSpoofed { .. })
    }

    /// What the caller is told: nothing of the reason (that is in the log,
    /// the Event and the metric), except for an agent too old for this
    /// server, whose own log is then where its operator looks first.
    pub fn caller_message(&self) -> String {
        match self {
            Self::AgentTooOld { .. } => format!(
                "join refused: this autonode-agent is too old for the server; bake autonode-agent {AGENT_FIXED} or later into the AMI"
            ),
            Self::AgentBelowMinimum { minimum, .. } => format!(
                "join refused: this autonode-agent is older than the server's minimum (--min-agent-version {minimum}); bake autonode-agent {minimum} or later into the AMI"
            ),
            _ => "join refused".to_string(),
        }
    }

    /// A short, stable label for metrics and Event reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::Identity(e) => e.label(),
            Self::Policy(e) => e.label(),
            Self::NodeClaim(e) => match e {
                SelectError::None(_) => "no_nodeclaim",
                SelectError::Many { .. } => "many_nodeclaims",
                SelectError::Registered(_) => "nodeclaim_registered",
                SelectError::Deleting(_) => "nodeclaim_deleting",
                SelectError::PendingBeforeNodeClaim { .. } => "pending_before_nodeclaim",
            },
            Self::Binding(e) => match e {
                BindingRefusal::Unreadable { .. } => "binding_unreadable",
                BindingRefusal::PossibleReplay { .. } => "possible_replay",
                BindingRefusal::Gone(_) => "no_nodeclaim",
            },
            Self::Lookup(_) => "ec2_lookup_refused",
            Self::InstanceNotLive { .. } => "instance_not_live",
            Self::ImageMismatch { .. } => "image_mismatch",
            Self::NoPrivateDnsName(_) => "no_private_dns_name",
            Self::ClientCsr(_) => "client_csr",
            Self::ServingCsr(_) => "serving_csr",
            Self::AgentTooOld { .. } => "agent_too_old",
            Self::AgentBelowMinimum { .. } => "agent_below_minimum",
            Self::NodeSpoofed { .. } => "node_spoofed",
            Self::Attestation(a) => a.reason(),
            Self::SigningFailed { .. } => "signing_failed",
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
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl JoinError {
    /// The label for metrics: the refusal reason, or `unavailable`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Refused(r) => r.reason(),
            Self::Unavailable(_) => "unavailable",
        }
    }

    /// A join that cannot complete now, for `why`.
    pub fn unavailable(why: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Unavailable(why.into())
    }
}

// What each service's error means for the join: the only place a
// service's failure becomes a verdict. A service says what went wrong; the
// join decides whether that is a refusal (final) or unavailable (retry).

impl From<FindError> for JoinError {
    fn from(e: FindError) -> Self {
        match e {
            FindError::Select(e) => e.into(),
            e @ (FindError::NotListed(_) | FindError::Stale) => Self::unavailable(e),
        }
    }
}

impl From<SelectError> for Refusal {
    fn from(e: SelectError) -> Self {
        Self::NodeClaim(e)
    }
}

impl From<SelectError> for JoinError {
    fn from(e: SelectError) -> Self {
        Self::Refused(e.into())
    }
}

impl From<BindingError> for JoinError {
    fn from(e: BindingError) -> Self {
        match e {
            BindingError::Refused(refusal) => Self::Refused(Refusal::Binding(refusal)),
            e @ (BindingError::Changed(_) | BindingError::Api(_)) => Self::unavailable(e),
        }
    }
}

impl From<IssueError> for JoinError {
    fn from(e: IssueError) -> Self {
        let refusal = match e {
            IssueError::SigningFailed { csr, message } => Refusal::SigningFailed { csr, message },
            IssueError::Substituted { csr, detail } => Refusal::CsrSubstituted { csr, detail },
            IssueError::CertificateMismatch { csr, source } => {
                Refusal::CertificateMismatch { csr, source }
            }
            e @ (IssueError::Api(_) | IssueError::WatchEnded | IssueError::NotSigned { .. }) => {
                return Self::unavailable(e)
            }
        };
        Self::Refused(refusal)
    }
}

impl From<ConfigError> for JoinError {
    fn from(e: ConfigError) -> Self {
        Self::unavailable(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_nodeclaim_that_fails_the_rules_refuses_with_the_same_words() {
        let e = SelectError::PendingBeforeNodeClaim {
            nodeclaim: "c1".into(),
            pending: "p".into(),
            created: "c".into(),
        };
        let message = e.to_string();
        let verdict = JoinError::from(e);
        assert_eq!(verdict.reason(), "pending_before_nodeclaim");
        assert_eq!(verdict.to_string(), message);
    }

    #[test]
    fn a_binding_conflict_is_retried_and_a_replay_refused() {
        let changed = JoinError::from(BindingError::Changed("c1".into()));
        assert_eq!(changed.reason(), "unavailable");
        assert_eq!(
            changed.to_string(),
            "temporarily unavailable: the binding of NodeClaim c1 changed during this join; the retry is judged on the new one"
        );
        let gone = JoinError::from(BindingError::from(BindingRefusal::Gone("c1".into())));
        assert_eq!(gone.reason(), "no_nodeclaim");
        assert_eq!(
            gone.to_string(),
            "NodeClaim c1 was deleted during this join"
        );
    }

    #[test]
    fn a_binding_refusal_is_the_bindings_own_error_under_its_old_label() {
        let replay = BindingRefusal::PossibleReplay {
            instance_id: "i-1".into(),
            nodeclaim: "c1".into(),
            bound: "client a serving b".into(),
            offered: "client c serving d".into(),
        };
        let unreadable = BindingRefusal::Unreadable {
            nodeclaim: "c1".into(),
            source: crate::kube::binding::Unreadable("expected value".into()),
        };
        let cases = [
            (replay, "possible_replay", "possible replay: instance i-1 (NodeClaim c1) is bound to client key client a serving b, this join used client c serving d"),
            (unreadable, "binding_unreadable", "NodeClaim c1: expected value"),
        ];
        for (refusal, label, text) in cases {
            let verdict = JoinError::from(BindingError::from(refusal));
            assert_eq!(
                (verdict.reason(), verdict.to_string().as_str()),
                (label, text)
            );
            let JoinError::Refused(Refusal::Binding(inner)) = &verdict else {
                panic!("not a binding refusal: {verdict:?}");
            };
            assert_eq!(inner.to_string(), text, "the binding's words, not a copy");
        }
    }

    #[test]
    fn a_slow_signer_is_retried_and_a_substituted_csr_refused() {
        let slow = JoinError::from(IssueError::NotSigned {
            csr: "x".into(),
            timeout: Duration::from_secs(1),
        });
        assert_eq!(slow.reason(), "unavailable");
        let substituted = JoinError::from(IssueError::Substituted {
            csr: "x".into(),
            detail: "d".into(),
        });
        assert_eq!(substituted.reason(), "csr_substituted");
        assert_eq!(
            substituted.to_string(),
            "CSR object x is not the one this join created and judged: d"
        );
    }

    #[test]
    fn an_agent_too_old_dooms_its_instance_even_bound_and_says_which_version_fixes_it() {
        let refusal = Refusal::AgentTooOld {
            instance_id: "i-1".into(),
            agent_version: "0.1.0".into(),
            extra: vec!["10.0.1.24".parse().unwrap(), "2600::2".parse().unwrap()],
        };
        assert_eq!(refusal.reason(), "agent_too_old");
        assert!(refusal.dooms_instance() && refusal.dooms_bound_instance());
        let text = refusal.to_string();
        assert!(
            text.contains("\"0.1.0\"") && text.contains("10.0.1.24, 2600::2"),
            "{text}"
        );
        assert!(text.contains("autonode-agent 0.2.0 or later"), "{text}");
        assert!(refusal.caller_message().contains("0.2.0 or later"));
        let serving = Refusal::ServingCsr(CsrError::NoSans);
        assert!(!serving.dooms_instance() && !serving.dooms_bound_instance());
        assert_eq!(serving.caller_message(), "join refused");
    }

    #[test]
    fn an_agent_below_the_minimum_dooms_its_instance_and_says_what_to_bake() {
        let refusal = Refusal::AgentBelowMinimum {
            instance_id: "i-1".into(),
            agent_version: "0.2.0".into(),
            minimum: "0.3.0".parse().unwrap(),
        };
        assert_eq!(refusal.reason(), "agent_below_minimum");
        assert!(refusal.dooms_instance() && refusal.dooms_bound_instance());
        assert!(!refusal.dooms_registered_instance());
        assert_eq!(refusal.cause(), Some(Cause::Machine));
        let text = refusal.to_string();
        assert!(text.contains("\"0.2.0\"") && text.contains("i-1"), "{text}");
        assert!(text.contains("autonode-agent 0.3.0 or later"), "{text}");
        let told = refusal.caller_message();
        assert!(told.contains("--min-agent-version 0.3.0") && told.contains("0.3.0 or later"));
    }

    #[test]
    fn causes_on_the_servers_side_mark_and_the_machines_own_replace() {
        let account = Refusal::Policy(PolicyError::AccountNotAllowed("1".into()));
        let before = Refusal::NodeClaim(SelectError::PendingBeforeNodeClaim {
            nodeclaim: "c1".into(),
            pending: "p".into(),
            created: "c".into(),
        });
        for refusal in [account, before] {
            assert_eq!(refusal.cause(), Some(Cause::Server), "{refusal}");
        }
        let image = Refusal::ImageMismatch {
            instance_id: "i-1".into(),
            signed: "a".into(),
            actual: "b".into(),
        };
        let failure = image.failure().unwrap();
        assert_eq!(
            (failure.reason, failure.cause),
            ("image_mismatch", Cause::Machine)
        );
        assert_eq!(Refusal::BadRequest("x".into()).failure(), None);
    }
}
