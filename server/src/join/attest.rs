//! The attest step: the instance's one NodeClaim passes its rules, EC2
//! says the instance is live and runs the signed image, and the CSRs ask
//! for nothing but the names and addresses EC2 gives the machine.

use super::JoinContext;
use crate::ec2::{Ec2Instance, LookupError};
use crate::join::refusal::{JoinError, Refusal};
use crate::kube::karpenter::NodeClaim;
use crate::kube::nodeclaim;
use autonode_shared::csr::{self, ParsedCsr};
use autonode_shared::identity::IdentityDocument;
use std::sync::Arc;

/// What attestation established about the machine.
pub(super) struct Attested {
    pub(super) doc: IdentityDocument,
    pub(super) claim: Arc<NodeClaim>,
    pub(super) instance: Ec2Instance,
    pub(super) provider_id: String,
}

/// The NodeClaim's rules (the one found by
/// [`NodeClaims::one_for`](crate::kube::nodeclaim::NodeClaims::one_for)), then
/// EC2.
pub(super) async fn attest(
    ctx: &JoinContext,
    doc: IdentityDocument,
    provider_id: String,
    claim: Arc<NodeClaim>,
) -> Result<Attested, JoinError> {
    nodeclaim::check(&claim, doc.pending_time)?;
    let instance = lookup(ctx, &doc).await?;
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

/// The CSRs against what EC2 says this machine is.
pub(super) fn check_csrs(
    client: &ParsedCsr,
    serving: &ParsedCsr,
    attested: &Attested,
) -> Result<(), Refusal> {
    let node = &attested.instance.private_dns_name;
    csr::check_client_csr(client, node).map_err(Refusal::ClientCsr)?;
    let dns = [node.clone()];
    csr::check_serving_csr(serving, node, &dns, &attested.instance.private_ips)
        .map_err(Refusal::ServingCsr)
}
