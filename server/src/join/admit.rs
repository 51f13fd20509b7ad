//! The admit step: the request's identity document is AWS-signed and
//! within the account, region and pendingTime policy, and its two CSRs
//! parse. No I/O and no waiting: it runs before the caller takes a join
//! permit, so a request that can never pass costs a little CPU and no
//! permit.
//!
//! The document comes first: its one RSA verification and the policy are
//! the cheap refusal, where each CSR's proof of possession is an ECDSA
//! verification several times as costly. A flood of documents from an
//! account the server does not serve was checked CSRs first, and those
//! checks were most of what the flood cost (docs/benchmarks.md).

use super::{agents, outcome, JoinContext, Step};
use crate::join::refusal::{JoinError, Refusal};
use crate::kube::karpenter::{aws_provider_id, NodeClaim};
use crate::kube::metrics::AgentLabels;
use autonode_shared::csr::{self, ParsedCsr};
use autonode_shared::identity::{self, IdentityDocument};
use autonode_shared::protocol::{Attestation, JoinRequest};
use std::sync::Arc;
use std::time::Instant;

/// A join request that passed admission: its CSRs parse, and its identity
/// document is AWS-signed and within the account/region policy and the
/// pendingTime window. Only such a request takes a join permit, waits for
/// the NodeClaim cache or reaches EC2.
pub struct Admitted {
    pub(super) request: JoinRequest,
    pub(super) client_csr: ParsedCsr,
    pub(super) serving_csr: ParsedCsr,
    pub(super) doc: IdentityDocument,
    pub(super) provider_id: String,
    /// The attestation evidence a `/v2` join sent; `None` for `/v1`.
    pub(super) evidence: Option<Attestation>,
    pub(super) started: Instant,
}

impl Admitted {
    /// The instance the verified document names.
    pub fn instance_id(&self) -> &str {
        &self.doc.instance_id
    }
}

/// The admit step: the document (its signature, then the policy), then
/// the CSRs. A refusal is recorded here like any other. `evidence` is
/// carried to the attest step, which alone knows whether the instance's
/// class must attest.
pub fn admit(
    ctx: &JoinContext,
    request_id: &str,
    request: JoinRequest,
    evidence: Option<Attestation>,
) -> Result<Admitted, JoinError> {
    let started = Instant::now();
    let mut steps = ctx.metrics.steps();
    let doc = match verify(ctx, &request) {
        Ok(doc) => doc,
        Err(refusal) => return Err(refused(ctx, request_id, &request, None, started, refusal)),
    };
    let provider_id = aws_provider_id(&doc.availability_zone, &doc.instance_id);
    if let Err(e) = ctx.policy.check(&doc, ctx.clock.now()) {
        // Reported on the NodeClaim if the cache has it now; the grace for
        // a NodeClaim the cache lacks is only for documents that pass.
        let claim = match ctx.claims.by_provider_id(&provider_id).as_slice() {
            [only] => Some(only.clone()),
            _ => None,
        };
        let refusal = Refusal::from(e);
        if let (None, Some(failure)) = (&claim, refusal.failure()) {
            // The cache may not hold the providerID Karpenter just wrote:
            // recorded once it does (a document of an instance no
            // NodeClaim ever names waits a while, bounded, and is dropped).
            let why = format!("join refused for good: {refusal}");
            ctx.claims.failed_when_known(&provider_id, why, failure);
        }
        return Err(refused(ctx, request_id, &request, claim, started, refusal));
    }
    let (client_csr, serving_csr) = match parse(&request) {
        Ok(csrs) => csrs,
        Err(refusal) => return Err(refused(ctx, request_id, &request, None, started, refusal)),
    };
    steps.done(Step::Admit.name());
    let version = agents::label(&request.agent_version);
    ctx.metrics
        .join_agents
        .get_or_create(&AgentLabels { version })
        .inc();
    Ok(Admitted {
        request,
        client_csr,
        serving_csr,
        doc,
        provider_id,
        evidence,
        started,
    })
}

/// Records a refusal at admission and hands it back.
fn refused(
    ctx: &JoinContext,
    request_id: &str,
    request: &JoinRequest,
    claim: Option<Arc<NodeClaim>>,
    started: Instant,
    refusal: Refusal,
) -> JoinError {
    let error = JoinError::Refused(refusal);
    let agent = &request.agent_version;
    outcome::record(
        ctx,
        request_id,
        started,
        claim.as_deref(),
        agent,
        Err(&error),
    );
    error
}

/// Parse: the request's own structure. Nothing is trusted yet.
fn parse(request: &JoinRequest) -> Result<(ParsedCsr, ParsedCsr), Refusal> {
    let client = csr::parse_csr(request.client_csr.as_bytes()).map_err(Refusal::ClientCsr)?;
    let serving = csr::parse_csr(request.serving_csr.as_bytes()).map_err(Refusal::ServingCsr)?;
    Ok((client, serving))
}

/// Verify: the document's signature against the pinned
/// certificates ([`admit`] then checks the policy).
fn verify(ctx: &JoinContext, request: &JoinRequest) -> Result<IdentityDocument, Refusal> {
    let verified = identity::verify(request.identity.rsa2048.as_bytes(), &ctx.trust)?;
    Ok(verified.into_document())
}
