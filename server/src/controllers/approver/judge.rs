//! The renewal rules: what makes a kubelet CSR its node's own, checked
//! cheapest first against the node, its NodeClaim's binding and EC2.

use super::cap::counted_toward_cap;
use super::decline::Decline;
use super::{over_cap_key, Context, RECENT_WINDOW};
use crate::kube::binding;
use crate::kube::karpenter::{parse_aws_provider_id, NodeClaim};
use crate::kube::reuse;
use crate::primitives::clock::KubeTime;
use autonode_shared::csr::{self, Purpose};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use std::sync::Arc;
use std::time::Instant;

/// Checks cheapest first, so that what is refused on the objects alone
/// never costs an EC2 call.
pub(super) async fn judge(
    csr: &CertificateSigningRequest,
    node: &str,
    purpose: Purpose,
    ctx: &Context,
) -> Result<(), Decline> {
    if csr.spec.request.0.is_empty() {
        return Err(Decline::Oversized);
    }
    let count = counted_toward_cap(ctx, csr);
    if count >= ctx.settings.pending_cap {
        return Err(Decline::TooMany {
            node: node.to_string(),
            count,
            cap: ctx.settings.pending_cap,
            window_minutes: RECENT_WINDOW.as_secs() / 60,
        });
    }
    // Under the cap again: a later excess is told anew.
    ctx.told.clear(&over_cap_key(node));
    let node_obj = ctx
        .nodes
        .get(&ObjectRef::new(node))
        .ok_or_else(|| Decline::NoNode(node.to_string()))?;
    let provider_id = node_obj
        .provider_id()
        .map(str::to_string)
        .ok_or_else(|| Decline::NoProviderId(node.to_string()))?;
    let (_zone, instance_id) = parse_aws_provider_id(&provider_id)
        .ok_or_else(|| Decline::NoProviderId(node.to_string()))?;
    let claims = ctx.settings.claims.by_provider_id(&provider_id);
    let (claim, record) = bound_claim(claims, &provider_id)?;
    if !binding::is_its_node(&claim, &record, &node_obj) {
        return Err(Decline::NotItsNode {
            node: node.to_string(),
            provider_id,
            nodeclaim: claim.name_any(),
            bound: record.instance_id,
            bound_name: record.node_name,
        });
    }
    not_reused(ctx, &claim, node, instance_id)?;
    let region = record.region;
    let parsed = csr::parse_csr(&csr.spec.request.0)?;
    csr::check_usages(
        csr.spec.usages.as_deref().unwrap_or_default(),
        purpose,
        &parsed.key,
    )?;
    let instance = lookup(ctx, node, &region, instance_id).await?;
    if !instance.state.is_live() {
        return Err(Decline::NotLive {
            instance_id: instance_id.to_string(),
            state: format!("{:?}", instance.state),
        });
    }
    its_name(node, instance_id, "EC2", &instance.private_dns_name)?;
    match purpose {
        Purpose::Client => csr::check_client_csr(&parsed, node)?,
        Purpose::Serving => {
            let dns = [instance.private_dns_name.clone()];
            csr::check_serving_csr(&parsed, node, &dns, &instance.private_ips)?;
        }
    }
    Ok(())
}

/// The one NodeClaim of the instance behind `provider_id` (`claims` are
/// those with that providerID) and the binding autonode recorded on it;
/// whether it is the Node's is [`binding::is_its_node`]'s to say.
pub(super) fn bound_claim(
    mut claims: Vec<Arc<NodeClaim>>,
    provider_id: &str,
) -> Result<(Arc<NodeClaim>, binding::Record), Decline> {
    let claim = match claims.len() {
        1 => claims.pop(),
        0 => None,
        count => {
            return Err(Decline::ManyNodeClaims {
                provider_id: provider_id.to_string(),
                count,
            })
        }
    }
    .ok_or_else(|| Decline::NoNodeClaim(provider_id.to_string()))?;
    let nodeclaim = claim.name_any();
    match binding::recorded(&claim) {
        Ok(Some(record)) => Ok((claim, record)),
        Ok(None) => Err(Decline::NotBound(nodeclaim)),
        Err(source) => Err(Decline::UnreadableBinding { nodeclaim, source }),
    }
}

/// Refuses while another instance than `instance_id` held the name `node`
/// within a certificate's lifetime (see [`crate::kube::reuse`]): a
/// credential issued to that instance may still be valid, and nothing in
/// a CSR says which of the two machines made it.
fn not_reused(
    ctx: &Context,
    claim: &NodeClaim,
    node: &str,
    instance_id: &str,
) -> Result<(), Decline> {
    let now = ctx.settings.clock.stamp();
    let claims = &ctx.settings.claims;
    let known = (claims.bound_to(node), claims.history());
    let remembered = reuse::last_held_by_others(known, node, instance_id, now);
    let held = remembered.max(reuse::marked(claim).filter(|_| reuse::is_ip_based(node)));
    let Some(held) = held else {
        return Ok(());
    };
    let until = reuse::window_end(held, ctx.settings.signing_duration);
    if until <= now {
        return Ok(());
    }
    Err(Decline::NameReused {
        node: node.to_string(),
        last_held: held.to_string(),
        until: until.to_string(),
    })
}

/// Whether `node` is `name`, the name `according_to` gives `instance_id`.
fn its_name(
    node: &str,
    instance_id: &str,
    according_to: &'static str,
    name: &str,
) -> Result<(), Decline> {
    if name == node {
        return Ok(());
    }
    Err(Decline::NotItsName {
        node: node.to_string(),
        instance_id: instance_id.to_string(),
        according_to,
        name: name.to_string(),
    })
}

/// The instance as EC2 describes it: from the cache, or (within `node`'s
/// budget) from EC2.
async fn lookup(
    ctx: &Context,
    node: &str,
    region: &str,
    instance_id: &str,
) -> Result<crate::ec2::Ec2Instance, Decline> {
    if let Some(instance) = ctx.lookups.cached(region, instance_id) {
        return Ok(instance);
    }
    ctx.limiter
        .try_take(node, Instant::now())
        .map_err(|retry_in| Decline::RateLimited {
            node: node.to_string(),
            retry_in,
        })?;
    Ok(ctx.lookups.refresh(region, instance_id).await?)
}
