//! The attest step: the instance's one NodeClaim passes its rules and its
//! binding (if any) names this join's keys, EC2 says the instance is live
//! and runs the signed image, the CSRs ask for nothing but the names and
//! addresses EC2 gives the machine, and whether that name was another
//! instance's lately ([`reuse`]). A NodeClaim already Registered refuses
//! the join; when its Node is not the machine EC2 names for the instance,
//! as `node_spoofed`, which replaces it ([`registered_refusal`]).
//!
//! The binding is judged on the cached NodeClaim before EC2 is asked: a
//! replayed document (another key than the bound one) costs no
//! `DescribeInstances` on the account's shared EC2 budget. The bind step
//! judges it again on the version it writes over.

use super::admit::Admitted;
use super::JoinContext;
use crate::attestation::Verdict;
use crate::ec2::{Ec2Instance, LookupError};
use crate::join::refusal::{JoinError, Refusal};
use crate::kube::binding::{self, Keys, Record};
use crate::kube::karpenter::NodeClaim;
use crate::kube::nodeclaim::{self, SelectError};
use crate::kube::reuse;
use crate::primitives::clock::KubeTime;
use autonode_shared::csr::{self, ParsedCsr};
use autonode_shared::identity::IdentityDocument;
use autonode_shared::protocol::Attestation;
use k8s_openapi::jiff::Timestamp;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What attestation established about the machine.
pub(super) struct Attested {
    pub(super) doc: IdentityDocument,
    pub(super) claim: Arc<NodeClaim>,
    pub(super) instance: Ec2Instance,
    pub(super) provider_id: String,
    /// The two CSRs, as sent and as judged against EC2's answer.
    pub(super) csrs: Csrs,
    /// When another instance last held this node name, if certificates
    /// issued to it then may still be valid.
    pub(super) held: Option<Timestamp>,
    /// The NodeClaim's age when the machine was attested (the attested
    /// milestone's time).
    pub(super) attested_at: Option<f64>,
    /// The binding this join's keys resume, as the cached NodeClaim holds
    /// it; `None` when the NodeClaim is unbound.
    pub(super) existing: Option<Record>,
}

/// A join's two CSRs: PEM as sent, and parsed.
pub(super) struct Csrs {
    pub(super) client_pem: String,
    pub(super) serving_pem: String,
    pub(super) client: ParsedCsr,
    pub(super) serving: ParsedCsr,
}

impl Csrs {
    /// The fingerprints of the two keys, as the binding records them.
    pub(super) fn fingerprints(&self) -> [String; 2] {
        [
            self.client.public_key_fingerprint(),
            self.serving.public_key_fingerprint(),
        ]
    }
}

/// The NodeClaim's rules (the one found by
/// [`NodeClaims::one_for`](crate::kube::nodeclaim::NodeClaims::one_for)), then
/// EC2, then the CSRs against EC2's answer.
pub(super) async fn attest(
    ctx: &JoinContext,
    admitted: Admitted,
    claim: Arc<NodeClaim>,
) -> Result<Attested, JoinError> {
    let Admitted {
        request,
        client_csr,
        serving_csr,
        doc,
        provider_id,
        evidence,
        ..
    } = admitted;
    let registered = match nodeclaim::check(&claim, doc.pending_time) {
        Err(SelectError::Registered(_)) => {
            Some(claim.status.as_ref().and_then(|s| s.node_name.clone()))
        }
        checked => checked.map(|()| None)?,
    };
    let csrs = Csrs {
        client_pem: request.client_csr,
        serving_pem: request.serving_csr,
        client: client_csr,
        serving: serving_csr,
    };
    let [client, serving] = csrs.fingerprints();
    let keys = Keys {
        client: &client,
        serving: &serving,
    };
    let existing = binding::judge(&claim, &doc.instance_id, keys)?;
    if let Some(node) = registered {
        return Err(registered_refusal(ctx, &claim, &doc, existing.as_ref(), node).await);
    }
    below_minimum(ctx, &doc, &request.agent_version)?;
    attestation(ctx, &claim, &doc, &csrs, evidence.as_ref())?;
    let instance = lookup(ctx, &doc).await?;
    check_csrs(&csrs, &instance, &request.agent_version)?;
    let held = name_held_by_others(ctx, &instance, &doc.instance_id);
    Ok(Attested {
        attested_at: nodeclaim::age_seconds(&claim, ctx.clock),
        doc,
        claim,
        instance,
        provider_id,
        csrs,
        held,
        existing,
    })
}

/// Why a join for a Registered NodeClaim (whose Karpenter `nodeName` is
/// `node`) is refused. Registered to the machine EC2 names for the
/// instance (as the binding recorded it, or EC2 says when unbound), the
/// join is merely late: `nodeclaim_registered`. Registered to a Node that
/// is provably another machine's, that Node carries this instance's
/// providerID without being its machine (NodeRestriction lets a node
/// choose its providerID), and Karpenter gave it this NodeClaim's labels,
/// taints and pods: `node_spoofed`, which fails the NodeClaim so Karpenter
/// replaces it. Bound, the claim's machine is the one its binding names,
/// so any other Node is an impostor. Unbound, the machine may be one
/// autonode never joined, whose Node is named otherwise than EC2 names it
/// (Bottlerocket after its instance id, any `--hostname-override`): only a
/// Node name that is another machine's ([`names_another_machine`]) is
/// proof; any other is refused as late, and nothing is deleted on the
/// word of whoever holds one of its identity documents.
/// The binding was judged first: a bound claim's join here is its own
/// machine's (or costs a replay nothing), and needs no EC2 lookup.
async fn registered_refusal(
    ctx: &JoinContext,
    claim: &NodeClaim,
    doc: &IdentityDocument,
    existing: Option<&Record>,
    node: Option<String>,
) -> JoinError {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let late = JoinError::from(Refusal::NodeClaim(SelectError::Registered(name.clone())));
    let Some(node) = node else {
        return late;
    };
    let expected = match existing {
        Some(record) => record.node_name.clone(),
        None => match lookup(ctx, doc).await {
            Ok(instance) if names_another_machine(ctx, claim, &instance, &node) => {
                instance.private_dns_name
            }
            Ok(_) => return late,
            Err(e) => return e,
        },
    };
    if expected == node {
        return late;
    }
    Refusal::NodeSpoofed {
        nodeclaim: name,
        instance_id: doc.instance_id.clone(),
        registered: node,
        expected,
    }
    .into()
}

/// Whether Node name `node`, which an unbound `claim` is Registered to, is
/// provably not `instance`'s machine: it is the name another NodeClaim's
/// binding recorded (EC2's name for that machine, which autonode joined),
/// or an EC2 address-based name (`ip-10-0-0-1.<domain>`) for an address
/// `instance` does not have. EC2 gives such names by the address, so one
/// for another address names another machine; a machine naming its own
/// Node after its own address under another domain (a VPC's DHCP options)
/// is its own.
fn names_another_machine(
    ctx: &JoinContext,
    claim: &NodeClaim,
    instance: &Ec2Instance,
    node: &str,
) -> bool {
    let bound_elsewhere = ctx
        .claims
        .bound_to(node)
        .iter()
        .any(|other| other.metadata.uid != claim.metadata.uid);
    let own = |ip: &std::net::IpAddr| {
        instance.private_ips.contains(ip) || instance.interface_ips.contains(ip)
    };
    let another_address = address_in_ec2_name(node).is_some_and(|ip| !own(&ip));
    bound_elsewhere || another_address
}

/// The IPv4 address an EC2 address-based name (`ip-10-0-0-1.ec2.internal`,
/// `ip-10-0-0-1.<region>.compute.internal`, or under a VPC's own domain)
/// is made of; `None` for any other name.
fn address_in_ec2_name(node: &str) -> Option<std::net::IpAddr> {
    let (host, domain) = node.split_once('.')?;
    let dotted = host.strip_prefix("ip-")?.replace('-', ".");
    let ip: std::net::Ipv4Addr = dotted.parse().ok()?;
    (!domain.is_empty()).then_some(std::net::IpAddr::V4(ip))
}

/// This instance's EC2 lookups are spent for now ([`super::lookup_limiter`]).
#[derive(Debug, thiserror::Error)]
#[error("instance {instance_id} was looked up in EC2 too often; the next lookup in {wait:?}")]
struct LookupsSpent {
    instance_id: String,
    wait: Duration,
}

/// EC2 could not answer now.
#[derive(Debug, thiserror::Error)]
#[error("EC2: {0}")]
struct Ec2Unavailable(#[source] LookupError);

/// The instance as EC2 sees it: live, same image, with a DNS name.
async fn lookup(ctx: &JoinContext, doc: &IdentityDocument) -> Result<Ec2Instance, JoinError> {
    if let Err(wait) = ctx.lookups.try_take(&doc.instance_id, Instant::now()) {
        return Err(JoinError::unavailable(LookupsSpent {
            instance_id: doc.instance_id.clone(),
            wait,
        }));
    }
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
fn check_csrs(csrs: &Csrs, instance: &Ec2Instance, agent_version: &str) -> Result<(), Refusal> {
    let node = &instance.private_dns_name;
    csr::check_client_csr(&csrs.client, node).map_err(Refusal::ClientCsr)?;
    let dns = [node.clone()];
    csr::check_serving_csr(&csrs.serving, node, &dns, &instance.private_ips).map_err(|e| {
        too_old(&csrs.serving, instance, agent_version).unwrap_or(Refusal::ServingCsr(e))
    })
}

/// The refusal for an agent of before 0.2.0 on an instance whose primary
/// interface has more addresses than the primary ones: such an agent asks
/// its serving certificate for every one of them, which the server no
/// longer signs. Recognised only when the CSR would pass with the
/// interface's own addresses (as EC2 lists them) allowed; it is never
/// signed, whatever it asks.
fn too_old(serving: &ParsedCsr, instance: &Ec2Instance, agent_version: &str) -> Option<Refusal> {
    let node = &instance.private_dns_name;
    let mut known = instance.private_ips.clone();
    known.extend(instance.interface_ips.iter().copied());
    csr::check_serving_csr(serving, node, std::slice::from_ref(node), &known).ok()?;
    let extra = serving
        .ip_addresses
        .iter()
        .filter(|ip| !instance.private_ips.contains(ip))
        .copied()
        .collect();
    Some(Refusal::AgentTooOld {
        instance_id: instance.instance_id.clone(),
        agent_version: agent_version.chars().take(64).collect(),
        extra,
    })
}

/// The operator's `--min-agent-version` against the version the agent
/// reports. Judged after the binding, so a bound claim's join here is its
/// own machine's; before EC2 is asked, so a fleet of retired AMIs costs no
/// `DescribeInstances`. A Registered claim never reaches it: a node that
/// joined is not touched by a minimum raised later.
/// The class's attestation, when the operator's policy names it: after
/// the binding (a replay is refused before a document costs any
/// verifying) and before EC2 is asked.
fn attestation(
    ctx: &JoinContext,
    claim: &NodeClaim,
    doc: &IdentityDocument,
    csrs: &Csrs,
    evidence: Option<&Attestation>,
) -> Result<(), Refusal> {
    let class = claim.spec.node_class_ref.as_ref().map(|r| r.name.as_str());
    let keys = [
        csrs.client.spki_der.as_slice(),
        csrs.serving.spki_der.as_slice(),
    ];
    let now = std::time::SystemTime::from(ctx.clock.now());
    match ctx
        .attestation
        .judge(class, &doc.instance_id, keys, evidence, now)?
    {
        Verdict::Attested(measurement) => tracing::info!(
            instance = %doc.instance_id,
            class = class.unwrap_or_default(),
            measurement,
            "NitroTPM attestation passed"
        ),
        Verdict::NotRequired => {}
    }
    Ok(())
}

fn below_minimum(
    ctx: &JoinContext,
    doc: &IdentityDocument,
    agent_version: &str,
) -> Result<(), Refusal> {
    match ctx.min_agent_version {
        Some(minimum) if !minimum.admits(agent_version) => Err(Refusal::AgentBelowMinimum {
            instance_id: doc.instance_id.clone(),
            agent_version: agent_version.chars().take(64).collect(),
            minimum,
        }),
        _ => Ok(()),
    }
}

/// When another instance last held the node name EC2 gives this one, if
/// certificates issued to it then may still be valid (see [`reuse`]).
fn name_held_by_others(
    ctx: &JoinContext,
    instance: &Ec2Instance,
    instance_id: &str,
) -> Option<Timestamp> {
    let now = ctx.clock.stamp();
    let name = &instance.private_dns_name;
    let known = (ctx.claims.bound_to(name), ctx.claims.history());
    let held = reuse::last_held_by_others(known, name, instance_id, now)?;
    let open = reuse::window_end(held, ctx.lifetimes.signing) > now;
    if open {
        tracing::warn!(node = %name, instance = %instance_id, last_held = %held, "this node name was another instance's within a certificate's lifetime: its kubelet CSRs stay pending until then, and this join's certificates last the signer's full lifetime");
    }
    open.then_some(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_address_based_name_gives_an_address() {
        let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
        assert_eq!(
            address_in_ec2_name("ip-10-0-0-1.ec2.internal"),
            ip("10.0.0.1")
        );
        assert_eq!(
            address_in_ec2_name("ip-10-1-2-3.us-west-2.compute.internal"),
            ip("10.1.2.3")
        );
        assert_eq!(
            address_in_ec2_name("ip-10-1-2-3.corp.example"),
            ip("10.1.2.3")
        );
        for other in [
            "i-0123456789abcdef0",
            "i-0123456789abcdef0.us-west-2.compute.internal",
            "ip-10-0-0-1",
            "ip-10-0-0.ec2.internal",
            "ip-10-0-0-999.ec2.internal",
            "node-7.example",
            "ip-10-0-0-1.",
        ] {
            assert_eq!(address_in_ec2_name(other), None, "{other}");
        }
    }
}
