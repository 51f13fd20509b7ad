//! A machine's whole life under the real Karpenter, for the scenarios that
//! remove nodes: following a NodeClaim to an Initialized node, waiting for
//! Karpenter to take it away again, what of autonode's that leaves behind,
//! and what someone who kept the machine's disk can still do with it.

use crate::cloud::fakecloud::Instance;
use crate::fleet::cluster::{host_addr, KarpenterCluster, LAUNCH_TIMEOUT, SERVER_INSIDE};
use crate::karpenter::standin::nodeclaims;
use crate::machines::launcher::Machine;
use crate::machines::node::SimulatedNode;
use crate::server::{server_user, SERVER_SERVICE_ACCOUNT};
use anyhow::{bail, Context, Result};
use autonode_server::controllers::nodeclass::rollout::store::STORE_NAME;
use autonode_server::kube::marks::CSR_INSTANCE_LABEL;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use std::path::Path;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// How long Karpenter may take to remove a node here: consolidation's
/// 10 s polls and 15 s validation, the drain, TerminateInstances, on two
/// shared cores.
pub const REMOVAL_TIMEOUT: Duration = Duration::from_secs(180);

/// A NodeClaim followed to its machine, and when each step was seen (for
/// the tests that time them).
pub struct Followed {
    pub machine: Machine,
    /// When moto had the claim's instance.
    pub launched: Instant,
    /// When the machine's agent had joined and its Node registered.
    pub registered: Instant,
}

/// Follows NodeClaim `claim` until its machine has joined through the
/// agent and Karpenter has it Launched, Registered, Initialized and Ready.
/// Returns the machine, and when it launched and registered.
pub async fn follow_claim(cluster: &KarpenterCluster, claim: &str) -> Result<Followed> {
    let (_, instance_id) = cluster.launched(claim).await?;
    let launched = Instant::now();
    let machine = cluster
        .wait_for("the machine's Node", LAUNCH_TIMEOUT, || async {
            let Some(machine) = cluster.launcher.machine(&instance_id) else {
                return Ok(None);
            };
            if let Some(error) = &machine.error {
                bail!("machine {instance_id}: {error}");
            }
            if let Some(agent) = machine.agent.as_ref().filter(|a| a.code != Some(0)) {
                bail!("the agent on {instance_id} failed: {agent:#?}");
            }
            Ok(machine.registered.map(|_| machine))
        })
        .await?;
    let registered = Instant::now();
    if let Err(e) = cluster.initialized(claim).await {
        // What Karpenter and the kubelet said, to tell whose step stalled.
        let admin = cluster.cp.admin().await?;
        let status = nodeclaims(&admin).get(claim).await?.data["status"].clone();
        let node = Api::<Node>::all(admin).get_opt(&machine.node_name).await?;
        bail!("{e:#}\nNodeClaim status: {status:#}\nNode: {node:#?}");
    }
    Ok(Followed {
        machine,
        launched,
        registered,
    })
}

/// What whoever takes a running machine (or its disk) holds: a copy of
/// its disk (the agent's keys, kubelet's credential and config) and what
/// its IMDS tells (the instance, whose identity document the test cloud
/// signs as it did at launch, and its userData).
pub struct Stolen {
    pub disk: TempDir,
    pub instance: Instance,
}

/// Takes `machine` while it runs (moto still describes its fleet then).
pub async fn steal(cluster: &KarpenterCluster, machine: &Machine) -> Result<Stolen> {
    let id = &machine.instance_id;
    let root = machine
        .root
        .as_ref()
        .with_context(|| format!("machine {id} has no disk yet"))?;
    let disk = tempfile::Builder::new()
        .prefix("autonode-stolen-")
        .tempdir()?;
    copy_tree(root, disk.path())?;
    let described = cluster
        .moto
        .instances()
        .await?
        .into_iter()
        .find(|i| i.id == *id)
        .with_context(|| format!("moto does not know {id}"))?;
    let (template, version) = cluster
        .moto
        .template_of(id)
        .await?
        .with_context(|| format!("{id} was not launched by a fleet"))?;
    let data = cluster.moto.template_data(&template, &version).await?;
    let instance = crate::machines::launcher::instance(&described, data.user_data)?;
    Ok(Stolen { disk, instance })
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_symlink() && std::fs::metadata(entry.path()).is_err() {
            // Absolute on the machine (a systemd unit's link): kept as is.
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else if kind.is_file() || kind.is_symlink() {
            // A link that resolves here (kubelet's `-current.pem` files,
            // relative) is copied as what it points to.
            std::fs::copy(entry.path(), &target)
                .with_context(|| format!("copying {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Waits until Karpenter has removed `machine` whose NodeClaim is `claim`:
/// the NodeClaim and the Node gone, the instance terminated in moto, and
/// the machine stopped (the launcher stops it once moto says terminated).
pub async fn wait_removed(
    cluster: &KarpenterCluster,
    claim: &str,
    machine: &Machine,
) -> Result<()> {
    let admin = cluster.cp.admin().await?;
    let claims = nodeclaims(&admin);
    let nodes: Api<Node> = Api::all(admin.clone());
    let id = &machine.instance_id;
    cluster
        .wait_for("the node removed", REMOVAL_TIMEOUT, || async {
            let claim_gone = claims.get_opt(claim).await?.is_none();
            let node_gone = nodes.get_opt(&machine.node_name).await?.is_none();
            let terminated = cluster
                .moto
                .instances()
                .await?
                .iter()
                .any(|i| i.id == *id && i.state == "terminated");
            let stopped = cluster
                .launcher
                .machine(id)
                .is_some_and(|m| m.stopped.is_some());
            Ok((claim_gone && node_gone && terminated && stopped).then_some(()))
        })
        .await
}

/// When NodeClaim `claim` began to go: the moment its deletion is first
/// seen (its deletionTimestamp set, or already gone).
pub async fn wait_deleting(cluster: &KarpenterCluster, claim: &str) -> Result<Instant> {
    let admin = cluster.cp.admin().await?;
    let claims = nodeclaims(&admin);
    cluster
        .wait_for("the NodeClaim's deletion", REMOVAL_TIMEOUT, || async {
            let deleting = match claims.get_opt(claim).await? {
                Some(c) => c.metadata.deletion_timestamp.is_some(),
                None => true,
            };
            Ok(deleting.then(Instant::now))
        })
        .await
}

/// One write of autonode-server's, as the API server's audit log has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerWrite {
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

/// The verbs that write (the audit log also has the server's reads).
const WRITES: [&str; 4] = ["create", "update", "patch", "delete"];

/// Every write the server made so far, successful ones only.
pub fn server_writes(cluster: &KarpenterCluster) -> Result<Vec<ServerWrite>> {
    let user = server_user();
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    Ok(cluster
        .cp
        .audit_events()?
        .iter()
        .filter(|e| {
            e["user"]["username"] == user.as_str()
                && WRITES.contains(&e["verb"].as_str().unwrap_or_default())
                && e["stage"] == "ResponseComplete"
                && e["responseStatus"]["code"]
                    .as_i64()
                    .is_some_and(|c| c < 300)
        })
        .map(|e| ServerWrite {
            verb: text(&e["verb"]),
            resource: text(&e["objectRef"]["resource"]),
            subresource: text(&e["objectRef"]["subresource"]),
            namespace: text(&e["objectRef"]["namespace"]),
            name: text(&e["objectRef"]["name"]),
        })
        .collect())
}

/// What of autonode's is left for `machine` (NodeClaim `claim`) once
/// Karpenter has removed it; empty when nothing is. Read from the API
/// server's own record of the server's writes, not from a list of what the
/// server is meant to write: a kind of object it starts writing per node
/// shows up here as unknown.
///
/// Kept by design, and so not counted: Events (history; the API server
/// expires them after an hour), the join's CSRs once approved and issued
/// (kube-controller-manager's CSR cleaner removes them after an hour), the
/// server's leader Lease and its upkeep of the EC2NodeClass (neither is
/// per node).
pub async fn leftovers(
    cluster: &KarpenterCluster,
    claim: &str,
    machine: &Machine,
) -> Result<Vec<String>> {
    let admin = cluster.cp.admin().await?;
    let mut left = Vec::new();
    let writes = server_writes(cluster)?;
    // The audit log must hold the server's writes, or this sees nothing:
    // every join creates CSRs.
    if !writes
        .iter()
        .any(|w| w.resource == "certificatesigningrequests")
    {
        bail!("no CSR the server created is in the audit log: {writes:#?}");
    }
    let kinds: std::collections::BTreeSet<_> = writes
        .iter()
        .map(|w| format!("{} {}/{}", w.verb, w.resource, w.subresource))
        .collect();
    eprintln!("the server's writes: {kinds:?}");
    for write in writes {
        match write.resource.as_str() {
            "events" | "ec2nodeclasses" | "customresourcedefinitions" => {}
            "leases" if write.namespace == SERVER_SERVICE_ACCOUNT.0 => {}
            // The rollout guard's state: one per cluster, per class (a
            // class outlives its machines).
            "configmaps"
                if write.namespace == SERVER_SERVICE_ACCOUNT.0 && write.name == STORE_NAME => {}
            // Looked at below, by what they are for.
            "certificatesigningrequests" | "nodeclaims" => {}
            _ => left.push(format!("a write this check does not know: {write:?}")),
        }
    }
    if nodeclaims(&admin).get_opt(claim).await?.is_some() {
        left.push(format!("NodeClaim {claim}"));
    }
    if Api::<Node>::all(admin.clone())
        .get_opt(&machine.node_name)
        .await?
        .is_some()
    {
        left.push(format!("Node {}", machine.node_name));
    }
    left.extend(undecided_csrs(&admin, machine).await?);
    Ok(left)
}

/// The CSRs for `machine` (the join's, by their instance label; its
/// kubelet's, by their requester) that are not approved and issued.
async fn undecided_csrs(admin: &kube::Client, machine: &Machine) -> Result<Vec<String>> {
    let requester = format!("system:node:{}", machine.node_name);
    let all = Api::<CertificateSigningRequest>::all(admin.clone())
        .list(&ListParams::default())
        .await?;
    Ok(all
        .items
        .into_iter()
        .filter(|csr| {
            let label = csr
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(CSR_INSTANCE_LABEL));
            label == Some(&machine.instance_id)
                || csr.spec.username.as_deref() == Some(requester.as_str())
        })
        .filter(|csr| !is_issued(csr))
        .map(|csr| format!("CSR {} not issued", csr.metadata.name.unwrap_or_default()))
        .collect())
}

/// Whether `csr` is approved and carries its certificate.
pub fn is_issued(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.as_ref();
    let approved = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Approved"));
    approved && status.and_then(|s| s.certificate.as_ref()).is_some()
}

/// Whether `csr` is neither approved nor denied, and has no certificate.
pub fn is_undecided(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.clone().unwrap_or_default();
    status.conditions.unwrap_or_default().is_empty() && status.certificate.is_none()
}

/// Boots the machine of `stolen` again after its instance is gone: IMDS
/// answering as it did (the same identity document, signed by the same
/// key), and on its disk the agent's keys the server bound to it, without
/// the agent's record of its join, so that the agent joins again with
/// those keys as after a crash. Runs the agent there; returns its output.
pub async fn replay_join(
    cluster: &KarpenterCluster,
    stolen: &Stolen,
) -> Result<std::process::Output> {
    let node = SimulatedNode::boot_at(
        &stolen.instance,
        &cluster.identity_ca,
        SERVER_INSIDE,
        host_addr(&cluster.server)?,
    )?;
    let keys = node.path("/var/lib/autonode");
    std::fs::create_dir_all(&keys)?;
    for key in ["client.key", "serving.key"] {
        let from = stolen.disk.path().join("var/lib/autonode").join(key);
        std::fs::copy(&from, keys.join(key))
            .with_context(|| format!("copying {}", from.display()))?;
    }
    node.run_agent(&[]).await
}

/// The server's log line refusing a join for `instance_id`, once there is one.
pub async fn join_refused_line(cluster: &KarpenterCluster, instance_id: &str) -> Result<String> {
    cluster
        .wait_for("the server's refusal", Duration::from_secs(30), || async {
            Ok(cluster
                .server
                .log()
                .lines()
                .find(|l| l.contains("join refused") && l.contains(instance_id))
                .map(str::to_string))
        })
        .await
}

/// The server's log line leaving kubelet CSR `csr` pending for `reason`
/// (its metric label), once there is one. The approver looks at a CSR
/// left pending again every 30 s and logs a new reason anew.
pub async fn left_pending_as(
    cluster: &KarpenterCluster,
    csr: &str,
    reason: &str,
) -> Result<String> {
    let label = format!("reason=\"{reason}\"");
    cluster
        .wait_for(
            &format!("{csr} left pending as {reason}"),
            Duration::from_secs(75),
            || async {
                Ok(cluster
                    .server
                    .log()
                    .lines()
                    .find(|l| l.contains(csr) && l.contains("left pending") && l.contains(&label))
                    .map(str::to_string))
            },
        )
        .await
}
