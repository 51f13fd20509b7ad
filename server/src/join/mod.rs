//! One join request, start to end. This is the one list of a join's steps
//! (the crate docs and docs/architecture.md point here); each names the module that
//! owns it, and [`admit`] and [`handle`] call them in this order:
//!
//! 1. **parse** (`parse`): the two CSRs parse
//!    ([`autonode_shared::csr`]). Nothing is trusted yet.
//! 2. **verify** (`verify`, then the policy in [`admit`]): the identity
//!    document's signature against the pinned AWS certificates, then the
//!    account, region and pendingTime window
//!    ([`autonode_shared::identity`]).
//!
//!    Steps 1 and 2 are [`admit`]: no I/O and no waiting, before the
//!    caller takes a join permit, so a request that can never pass costs
//!    a little CPU and no permit.
//! 3. **bind** (`attest`, `check_csrs`, then `bind::prepare`): the
//!    instance's one NodeClaim ([`NodeClaims::one_for`], waiting out the
//!    cache's grace only for documents that passed), the instance as EC2
//!    sees it ([`crate::ec2`]), the CSRs against what EC2 says the machine
//!    is; then the CSR objects created (or a resume's recorded ones found,
//!    [`crate::issuer`]) and the instance's keys and those objects recorded
//!    on the NodeClaim ([`crate::binding`]).
//! 4. **render** (in `bind::prepare`; [`crate::nodeconfig`],
//!    [`crate::render`]): the kubelet settings and Ignition config,
//!    rendered alongside the CSR objects of step 3 and before the binding
//!    is written, so nothing is approved for a node whose config is broken.
//! 5. **approve** (`approve`, [`crate::issuer`]): both CSRs approved,
//!    signed by kube-controller-manager, and the certificates checked
//!    against the CSRs that were judged; the answer carries them with the
//!    rendered config.
//!
//! Every step either hands the next one stronger facts or stops the join
//! with a [`Refusal`] (final) or [`JoinError::Unavailable`] (retry): the
//! services say what went wrong in their own errors, and only here
//! ([`crate::refusal`]) does that become a verdict. Names and addresses
//! come from EC2 and the NodeClaim, never from the request. What a request
//! leaves behind (log line, Event, metrics, deleting a doomed NodeClaim)
//! is recorded in one place, `outcome`.

mod bind;
mod outcome;

use crate::binding::{Binding, Keys};
use crate::ec2::{Ec2Instance, InstanceLookup, LookupError};
use crate::events::Events;
use crate::feedback::Milestone;
use crate::issuer::{IssueError, IssueRequest, Issuer};
use crate::karpenter::{aws_provider_id, NodeClaim};
use crate::marks;
use crate::metrics::{KindLabels, Metrics, Steps};
use crate::nodeclaim::{self, NodeClaims};
use crate::nodeconfig::NodeConfig;
use crate::refusal::{JoinError, Refusal};
use crate::render::ClusterSettings;
use autonode_shared::csr::{self, ParsedCsr, Purpose};
use autonode_shared::identity::{self, IdentityDocument, Policy, TrustStore};
use autonode_shared::protocol::KubeletSettings;
use autonode_shared::protocol::{JoinRequest, JoinResponse};
use bind::{prepare, CsrObject};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use outcome::Outcome;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use time::OffsetDateTime;

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
    pub clock: fn() -> OffsetDateTime,
    /// Delete the NodeClaim of an instance refused for good (see
    /// [`Refusal::dooms_instance`]), so Karpenter replaces it now.
    pub delete_refused: bool,
}

/// A join request that passed admission: its CSRs parse, and its identity
/// document is AWS-signed and within the account/region policy and the
/// pendingTime window. Only such a request takes a join permit, waits for
/// the NodeClaim cache or reaches EC2.
pub struct Admitted {
    request: JoinRequest,
    client_csr: ParsedCsr,
    serving_csr: ParsedCsr,
    doc: IdentityDocument,
    provider_id: String,
    started: Instant,
}

/// What attestation established about the machine.
struct Attested {
    doc: IdentityDocument,
    claim: Arc<NodeClaim>,
    instance: Ec2Instance,
    provider_id: String,
}

/// Steps 1 and 2, admission: parse, then verify (the signature, then the
/// policy). A refusal is recorded here like any other.
pub fn admit(
    ctx: &JoinContext,
    request_id: &str,
    request: JoinRequest,
) -> Result<Admitted, JoinError> {
    let started = Instant::now();
    let mut steps = ctx.metrics.steps();
    let parsed = parse(&request).and_then(|csrs| Ok((csrs, verify(ctx, &request)?)));
    let ((client_csr, serving_csr), doc) = match parsed {
        Ok(parsed) => parsed,
        Err(refusal) => return Err(refused(ctx, request_id, None, started, refusal)),
    };
    let provider_id = aws_provider_id(&doc.availability_zone, &doc.instance_id);
    if let Err(e) = ctx.policy.check(&doc, (ctx.clock)()) {
        // Reported on the NodeClaim if the cache has it now; the grace for
        // a NodeClaim the cache lacks is only for documents that pass.
        let claim = match ctx.claims.by_provider_id(&provider_id).as_slice() {
            [only] => Some(only.clone()),
            _ => None,
        };
        return Err(refused(ctx, request_id, claim, started, e.into()));
    }
    steps.done("admit");
    Ok(Admitted {
        request,
        client_csr,
        serving_csr,
        doc,
        provider_id,
        started,
    })
}

/// Records a refusal at admission and hands it back.
fn refused(
    ctx: &JoinContext,
    request_id: &str,
    claim: Option<Arc<NodeClaim>>,
    started: Instant,
    refusal: Refusal,
) -> JoinError {
    let error = JoinError::Refused(refusal);
    outcome::record(ctx, request_id, started, claim.as_deref(), Err(&error));
    error
}

/// Steps 3 on, for an admitted request holding a join permit: bind →
/// render → approve. Records the outcome (see `outcome`).
pub async fn handle(
    ctx: &JoinContext,
    request_id: &str,
    admitted: Admitted,
) -> Result<JoinResponse, JoinError> {
    let started = admitted.started;
    ctx.metrics.joins_in_flight.inc();
    let Outcome { claim, result } = join(ctx, admitted).await;
    ctx.metrics.joins_in_flight.dec();
    outcome::record(ctx, request_id, started, claim.as_deref(), result.as_ref());
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

/// Steps 3 to 5 for the one NodeClaim that matches the instance.
async fn grant(
    ctx: &JoinContext,
    admitted: Admitted,
    claim: Arc<NodeClaim>,
    steps: &mut Steps<'_>,
) -> Result<Granted, JoinError> {
    let Admitted {
        request,
        client_csr,
        serving_csr,
        doc,
        provider_id,
        ..
    } = admitted;
    let attested = attest(ctx, doc, provider_id, claim, steps).await?;
    check_csrs(&client_csr, &serving_csr, &attested)?;
    // The attested milestone's time: the machine is what it says it is.
    let attested_at = nodeclaim::age_seconds(&attested.claim);
    let requests = [
        issue_request(&attested, &request.client_csr, &client_csr, Purpose::Client),
        issue_request(
            &attested,
            &request.serving_csr,
            &serving_csr,
            Purpose::Serving,
        ),
    ];
    let (client_key, serving_key) = (
        client_csr.public_key_fingerprint(),
        serving_csr.public_key_fingerprint(),
    );
    let keys = Keys {
        client: &client_key,
        serving: &serving_key,
    };
    let prepared = prepare(ctx, &attested, keys, &requests).await?;
    steps.done("prepare");
    let binding = prepared.binding;
    if binding == Binding::New {
        // Marked reported by the binding's own write.
        outcome::milestone(ctx, Milestone::Attested, attested_at);
    }
    let certificates = approve(ctx, &requests, prepared.csrs).await?;
    steps.done("certificates");
    let certified_at = nodeclaim::age_seconds(&attested.claim);
    // Once per NodeClaim, whichever join gets here first: a join resumed
    // after one that failed at approval records them now.
    let claim = prepared.claim.as_ref().unwrap_or(&attested.claim);
    let timed = [
        (Milestone::Attested, attested_at),
        (Milestone::Certificates, certified_at),
    ];
    outcome::milestones(ctx, claim, &timed).await;
    let response = answer(ctx, &attested, certificates, prepared.rendered);
    Ok(Granted { response, binding })
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

/// Step 1, parse: the request's own structure. Nothing is trusted yet.
fn parse(request: &JoinRequest) -> Result<(ParsedCsr, ParsedCsr), Refusal> {
    let client = csr::parse_csr(request.client_csr.as_bytes()).map_err(Refusal::ClientCsr)?;
    let serving = csr::parse_csr(request.serving_csr.as_bytes()).map_err(Refusal::ServingCsr)?;
    Ok((client, serving))
}

/// Step 2, verify: the document's signature against the pinned
/// certificates ([`admit`] then checks the policy).
fn verify(ctx: &JoinContext, request: &JoinRequest) -> Result<IdentityDocument, Refusal> {
    let verified = identity::verify(request.identity.rsa2048.as_bytes(), &ctx.trust)?;
    Ok(verified.into_document())
}

/// Step 3, bind: the NodeClaim's rules (the one found by
/// [`NodeClaims::one_for`]), then EC2.
async fn attest(
    ctx: &JoinContext,
    doc: IdentityDocument,
    provider_id: String,
    claim: Arc<NodeClaim>,
    steps: &mut Steps<'_>,
) -> Result<Attested, JoinError> {
    nodeclaim::check(&claim, doc.pending_time)?;
    steps.done("attest");
    let instance = lookup(ctx, &doc).await?;
    steps.done("ec2");
    Ok(Attested {
        doc,
        claim,
        instance,
        provider_id,
    })
}

/// EC2 could not answer now.
#[derive(Debug, thiserror::Error)]
#[error("EC2: {0}")]
struct Ec2Unavailable(#[source] LookupError);

/// The instance as EC2 sees it: live, same image, with a DNS name.
async fn lookup(ctx: &JoinContext, doc: &IdentityDocument) -> Result<Ec2Instance, JoinError> {
    let instance = match ctx
        .ec2
        .describe_instance(&doc.region, &doc.instance_id)
        .await
    {
        Ok(instance) => instance,
        Err(e) if e.is_transient() => return Err(JoinError::unavailable(Ec2Unavailable(e))),
        // The document is AWS-signed, so the instance exists; EC2's API is
        // eventually consistent and may not list a just-launched instance.
        Err(e @ LookupError::NotFound { .. }) => {
            return Err(JoinError::unavailable(Ec2Unavailable(e)))
        }
        Err(e) => return Err(Refusal::Lookup(e).into()),
    };
    if !instance.state.is_live() {
        return Err(Refusal::InstanceNotLive {
            instance_id: doc.instance_id.clone(),
            state: format!("{:?}", instance.state).to_lowercase(),
        }
        .into());
    }
    if instance.image_id != doc.image_id {
        return Err(Refusal::ImageMismatch {
            instance_id: doc.instance_id.clone(),
            signed: doc.image_id.clone(),
            actual: instance.image_id,
        }
        .into());
    }
    if instance.private_dns_name.is_empty() {
        return Err(Refusal::NoPrivateDnsName(doc.instance_id.clone()).into());
    }
    Ok(instance)
}

/// Step 3, bind: the CSRs against what EC2 says this machine is.
fn check_csrs(client: &ParsedCsr, serving: &ParsedCsr, attested: &Attested) -> Result<(), Refusal> {
    let node = &attested.instance.private_dns_name;
    csr::check_client_csr(client, node).map_err(Refusal::ClientCsr)?;
    let dns = [node.clone()];
    csr::check_serving_csr(serving, node, &dns, &attested.instance.private_ips)
        .map_err(Refusal::ServingCsr)
}

/// What to ask kube-controller-manager for (the CSR objects of step 3).
fn issue_request<'a>(
    attested: &Attested,
    pem: &'a str,
    judged: &'a ParsedCsr,
    purpose: Purpose,
) -> IssueRequest<'a> {
    let instance_id = &attested.doc.instance_id;
    let claim = attested.claim.metadata.name.clone().unwrap_or_default();
    IssueRequest {
        name_prefix: format!("autonode-{instance_id}-{}-", kind(purpose)),
        purpose,
        request_pem: pem,
        judged,
        labels: BTreeMap::from([
            (marks::CSR_INSTANCE_LABEL.to_string(), instance_id.clone()),
            (marks::CSR_NODECLAIM_LABEL.to_string(), claim.clone()),
        ]),
        approval_message: format!(
            "autonode-server: instance {instance_id} attested by its AWS identity document for NodeClaim {claim}"
        ),
    }
}

fn kind(purpose: Purpose) -> &'static str {
    match purpose {
        Purpose::Client => "client",
        Purpose::Serving => "serving",
    }
}

/// Step 5, approve: both CSR objects approved and signed, in the order of
/// the requests.
async fn approve(
    ctx: &JoinContext,
    requests: &[IssueRequest<'_>],
    csrs: Vec<CsrObject>,
) -> Result<[String; 2], JoinError> {
    let issued = requests
        .iter()
        .zip(csrs)
        .map(|(r, csr)| finish(ctx, r, csr.object));
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
            kind: kind(request.purpose),
        })
        .inc();
    Ok(cert)
}
