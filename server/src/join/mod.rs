//! One join request, start to end. This is the one list of a join's
//! steps: [`Step::ALL`] holds them in order, each is a file of this folder
//! named as the step, and the `step` label of
//! `autonode_join_step_duration_seconds` is that name. docs/architecture.md
//! follows this list, and a test fails when the two disagree.
//!
//! 1. **admit** ([`admit()`]): the two CSRs parse
//!    ([`autonode_shared::csr`]); the identity document's signature
//!    verifies against the pinned AWS certificates, then the account,
//!    region and pendingTime window ([`autonode_shared::identity`]). No I/O
//!    and no waiting, before the caller takes a join permit, so a request
//!    that can never pass costs a little CPU and no permit.
//! 2. **attest** (`attest`): the instance's one NodeClaim
//!    ([`NodeClaims::one_for`], waiting out the cache's grace only for
//!    documents that passed) and its rules, its binding (another key is a
//!    replay, refused before EC2 is asked), for a class the operator's
//!    policy names its NitroTPM evidence ([`crate::attestation`]), the
//!    instance as EC2 sees it
//!    ([`crate::ec2`]), the CSRs against what EC2 says the machine is,
//!    and whether its name was another instance's lately
//!    ([`crate::kube::reuse`]).
//! 3. **bind** (`bind`): the CSR objects created (or a resume's recorded
//!    ones found, [`crate::kube::issuer`]) while the kubelet settings and
//!    Ignition config are rendered ([`render`], from
//!    [`render::inputs`]), then the instance's keys and those objects
//!    recorded on the NodeClaim ([`crate::kube::binding`]); nothing is
//!    bound whose config is broken.
//! 4. **approve** (`approve`): both CSRs approved, signed by
//!    kube-controller-manager, and the certificates checked against the
//!    CSRs that were judged; the answer carries them with the rendered
//!    config.
//!
//! Every step either hands the next one stronger facts or stops the join
//! with a [`Refusal`](refusal::Refusal) (final) or [`JoinError::Unavailable`] (retry): the
//! services say what went wrong in their own errors, and only here
//! ([`refusal`]) does that become a verdict. Names and addresses come from
//! EC2 and the NodeClaim, never from the request. What a request leaves
//! behind (log line, Event, metrics, deleting a doomed NodeClaim) is
//! recorded in one place, `outcome`.

mod admit;
pub mod agents;
mod approve;
mod attest;
mod bind;
mod outcome;
pub mod refusal;
pub mod render;

pub use admit::{admit, Admitted};

use crate::ec2::InstanceLookup;
use crate::join::refusal::JoinError;
use crate::join::render::inputs::NodeConfig;
use crate::join::render::ClusterSettings;
use crate::kube::binding::Binding;
use crate::kube::events::Events;
use crate::kube::issuer::{Issuer, Lifetimes};
use crate::kube::karpenter::NodeClaim;
use crate::kube::metrics::{Metrics, Steps};
use crate::kube::nodeclaim::{Milestone, NodeClaims};
use crate::primitives::clock::Clock;
use crate::primitives::limiter::Limiter;
use approve::approve;
use attest::{attest, Attested};
use autonode_shared::identity::{Policy, TrustStore};
use autonode_shared::protocol::JoinResponse;
use autonode_shared::protocol::KubeletSettings;
use bind::bind;
use outcome::Outcome;
use std::sync::Arc;

/// A join's steps, in the order they run (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Admit,
    Attest,
    Bind,
    Approve,
}

impl Step {
    /// Every step, in order.
    pub const ALL: [Step; 4] = [Step::Admit, Step::Attest, Step::Bind, Step::Approve];

    /// Its name: the file that does it and its metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Step::Admit => "admit",
            Step::Attest => "attest",
            Step::Bind => "bind",
            Step::Approve => "approve",
        }
    }
}

/// The guest cluster as a node sees it.
#[derive(Debug, Clone)]
pub struct ClusterInfo {
    /// The API server URL nodes use.
    pub api_server: String,
    /// PEM bundle nodes trust for the API server.
    pub ca_pem: String,
    pub settings: ClusterSettings,
}

/// Everything a join needs, shared by all requests.
pub struct JoinContext {
    pub trust: TrustStore,
    pub policy: Policy,
    pub claims: NodeClaims,
    pub ec2: Arc<dyn InstanceLookup>,
    pub issuer: Issuer,
    pub cluster: ClusterInfo,
    pub events: Events,
    pub metrics: Metrics,
    /// Per-node config: EC2NodeClasses and Ignition ConfigMaps and Secrets.
    pub nodeconfig: NodeConfig,
    /// Injected so tests can set the time.
    pub clock: Clock,
    /// How long the join's certificates last.
    pub lifetimes: Lifetimes,
    /// The join's `DescribeInstances` per instance ([`lookup_limiter`]).
    pub lookups: Limiter,
    /// The oldest agent release admitted (`--min-agent-version`); `None`:
    /// every agent the wire format serves.
    pub min_agent_version: Option<agents::MinVersion>,
    /// Attested joins: the challenge's nonces, the Nitro root, the
    /// operator's policy (`--attestation-policy`).
    pub attestation: Arc<crate::attestation::Attestation>,
    /// Warn lines about refused joins, per reason
    /// ([`refusal_line_limiter`](crate::primitives::limiter::refusal_line_limiter)).
    pub refusal_lines: Limiter,
}

/// The join's EC2 lookups per instance: an honest machine asks once, and a
/// few more times while EC2 does not list it yet; past that, one per
/// 5 s, so a leaked document replayed against an unbound NodeClaim cannot
/// spend the account's shared EC2 budget (a bound one is refused before
/// EC2 is asked).
pub fn lookup_limiter() -> Limiter {
    const BURST: u32 = 4;
    const PERIOD: std::time::Duration = std::time::Duration::from_secs(5);
    const INSTANCES: usize = 100_000;
    Limiter::new(BURST, PERIOD, INSTANCES)
}

/// The steps after admit, for an admitted request holding a join
/// permit: attest → bind → approve. Records the outcome (see `outcome`).
pub async fn handle(
    ctx: &JoinContext,
    request_id: &str,
    admitted: Admitted,
) -> Result<JoinResponse, JoinError> {
    let started = admitted.started;
    let agent = admitted.request.agent_version.clone();
    ctx.metrics.joins_in_flight.inc();
    let Outcome { claim, result } = join(ctx, admitted).await;
    ctx.metrics.joins_in_flight.dec();
    let claim = claim.as_deref();
    outcome::record(ctx, request_id, started, claim, &agent, result.as_ref());
    result.map(|granted| granted.response)
}

/// The join, with the NodeClaim it found (if exactly one matched, whether
/// or not it passed the rules) for the outcome to report on.
async fn join(ctx: &JoinContext, admitted: Admitted) -> Outcome {
    // Timed from here: the wait for the NodeClaim cache is part of "attest".
    let mut steps = ctx.metrics.steps();
    let claim = match ctx.claims.one_for(&admitted.provider_id).await {
        Ok(claim) => claim,
        Err(e) => return Outcome::without_claim(e.into()),
    };
    let result = grant(ctx, admitted, claim.clone(), &mut steps).await;
    Outcome {
        claim: Some(claim),
        result,
    }
}

/// Attest, bind and approve, for the one NodeClaim that matches the
/// instance.
async fn grant(
    ctx: &JoinContext,
    admitted: Admitted,
    claim: Arc<NodeClaim>,
    steps: &mut Steps<'_>,
) -> Result<Granted, JoinError> {
    let attested = attest(ctx, admitted, claim).await?;
    steps.done(Step::Attest.name());
    let prepared = bind(ctx, &attested).await?;
    steps.done(Step::Bind.name());
    if prepared.binding == Binding::New {
        // Marked reported by the binding's own write.
        outcome::milestone(ctx, Milestone::Attested, attested.attested_at);
    }
    let certificates = approve(ctx, &prepared).await?;
    steps.done(Step::Approve.name());
    let written = prepared.claim.as_ref().unwrap_or(&attested.claim);
    outcome::certified(ctx, written, attested.attested_at).await;
    Ok(Granted {
        binding: prepared.binding,
        response: answer(ctx, &attested, certificates, prepared.rendered),
    })
}

/// What a granted join answers, and how it relates to the binding.
struct Granted {
    response: JoinResponse,
    binding: Binding,
}

/// The answer: the node's name and certificates, the cluster, the config.
fn answer(
    ctx: &JoinContext,
    attested: &Attested,
    [client_certificate, serving_certificate]: [String; 2],
    (kubelet, ignition): (KubeletSettings, serde_json::Value),
) -> JoinResponse {
    JoinResponse {
        node_name: attested.instance.private_dns_name.clone(),
        api_server: ctx.cluster.api_server.clone(),
        cluster_ca: ctx.cluster.ca_pem.clone(),
        client_certificate,
        serving_certificate,
        kubelet,
        ignition,
    }
}
