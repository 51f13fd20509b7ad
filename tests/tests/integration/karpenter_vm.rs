//! The real kubelet under the real Karpenter: each instance Karpenter
//! launches into moto becomes a VM (the amd64 test image under QEMU's
//! emulation, `tests/src/machines/vm.rs`) whose agent joins through autonode-server
//! and whose kubelet, of the version under test, registers the Node and
//! runs the pod (`autonode_tests::fleet::vm`).
//!
//! Slow by nature (a boot under emulation): in the `vm` test group of
//! `.config/nextest.toml`, one at a time. Needs the agent's amd64 package
//! (`packaging/build`), as the VM tests do.

use anyhow::{ensure, Result};
use autonode_tests::cloud::moto::MOTO_VERSION;
use autonode_tests::fleet::cluster::{karpenter_finished_with, KarpenterCluster};
use autonode_tests::fleet::vm::{create_deployment, follow, moto_instance, scale, Journey};
use autonode_tests::karpenter::standin::nodeclaims;
use autonode_tests::kube::events::event_reasons;
use autonode_tests::machines::launcher::MachineKind;
use autonode_tests::machines::vm::{self, AgentCost, LOCAL_IMAGE};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::Client;
use serde_json::json;
use std::time::Instant;

#[tokio::test(flavor = "multi_thread")]
async fn a_pending_pod_runs_on_a_vm_that_karpenter_launched_and_autonode_joined() -> Result<()> {
    let cluster = KarpenterCluster::start_with(MachineKind::Vm, &[], &[]).await?;
    cluster.create_class_and_pool().await?;
    let admin = cluster.cp.admin().await?;
    create_deployment(&admin).await?;
    let t0 = Instant::now();
    scale(&admin, 1).await?;
    let journey = follow(&cluster, t0, |step| {
        eprintln!(
            "{:>6.1} s  {}: {}",
            step.after.as_secs_f64(),
            step.name,
            step.detail
        )
    })
    .await?;

    let load = vm::host_load();
    // The image's record of kubelet's version (packaging/bake/provision)
    // spared the agent a `kubelet --version` on the way to the Node.
    let cost = agent_cost(&journey)?;
    cost.check_recorded()?;
    check_node(&cluster, &admin, &journey).await?;
    check_pod(&admin, &journey).await?;
    let claim = nodeclaims(&admin).get(&journey.claim).await?;
    ensure!(
        claim.data["status"]["nodeName"] == journey.node.as_str(),
        "the NodeClaim's nodeName is {}, the Node {}",
        claim.data["status"]["nodeName"],
        journey.node
    );
    // autonode told its part of the story on the same NodeClaim.
    let reasons = event_reasons(&admin, &journey.claim).await?;
    for reason in ["Attested", "NodeRegistered", "NodeReady"] {
        ensure!(
            reasons.iter().any(|r| r == reason),
            "no {reason} Event on the NodeClaim: {reasons:?}"
        );
    }
    record(&cluster, &journey, &cost, &load)
}

/// The agent's cost, from the log the launcher kept of its run (the
/// `agent_joined` step's detail: its last lines).
fn agent_cost(journey: &Journey) -> Result<AgentCost> {
    let log = journey
        .steps
        .iter()
        .find(|s| s.name == "agent_joined")
        .map(|s| s.detail.as_str())
        .unwrap_or_default();
    AgentCost::from_log(log.lines())
}

/// The Node is the instance's, as moto describes it, registered by the
/// kubelet of the version under test, and Karpenter finished with it.
async fn check_node(cluster: &KarpenterCluster, admin: &Client, journey: &Journey) -> Result<()> {
    let instance = moto_instance(cluster, &journey.instance_id).await?;
    ensure!(
        journey.node == instance.private_dns_name,
        "Node {} for an instance named {} by moto",
        journey.node,
        instance.private_dns_name
    );
    let want = cluster.cp.version().to_string();
    ensure!(
        journey.kubelet_version.trim_start_matches('v') == want.trim_start_matches('v'),
        "kubelet {} registered, the control plane is {want}",
        journey.kubelet_version
    );
    let node = Api::<Node>::all(admin.clone()).get(&journey.node).await?;
    karpenter_finished_with(&node)?;
    let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
    ensure!(
        addresses
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == instance.private_ip),
        "the Node's addresses {addresses:?} lack moto's {}",
        instance.private_ip
    );
    Ok(())
}

/// The pod's container really runs the image the VM carries.
async fn check_pod(admin: &Client, journey: &Journey) -> Result<()> {
    let pod = Api::<Pod>::namespaced(admin.clone(), "default")
        .get(&journey.pod)
        .await?;
    let statuses = pod
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default();
    ensure!(
        statuses.iter().all(|c| c.image == LOCAL_IMAGE
            && c.ready
            && !c.container_id.as_deref().unwrap_or_default().is_empty()),
        "the pod's containers: {statuses:#?}"
    );
    Ok(())
}

/// Writes the journey's figures under `vm` in `target/bench/karpenter.json`
/// (the top-level `pending_to_ready_s` is the kubelet stand-in's).
fn record(
    cluster: &KarpenterCluster,
    journey: &Journey,
    cost: &AgentCost,
    load: &str,
) -> Result<()> {
    let seconds = |step: &str| journey.seconds(step).map(|s| (s * 10.0).round() / 10.0);
    let steps: serde_json::Map<String, serde_json::Value> = journey
        .steps
        .iter()
        .map(|s| (s.name.to_string(), json!(seconds(s.name))))
        .collect();
    let vm = json!({
        "pending_to_ready_s": seconds("node_ready"),
        "pending_to_running_s": seconds("pod_running"),
        "steps_s": steps,
        "kubelet": "real, in the amd64 test image under QEMU (TCG, one emulated CPU)",
        "kubelet_version": journey.kubelet_version,
        "karpenter_version": cluster.karpenter.release().to_string(),
        "moto_version": MOTO_VERSION,
        "kubernetes_version": cluster.cp.version().to_string(),
        // The agent's own share (fork to exit, when systemd starts
        // kubelet), and the host's load averages when the pod ran.
        "agent": cost.to_json(),
        "host_load": load,
    });
    eprintln!(
        "scale-up to Node Ready {:?} s, to the pod Running {:?} s; the agent took {:.2} s and {:.2} s of CPU from its fork to its exit ({:.2} s and {:.2} s from main; {:.2} s its children's), kubelet's version from={}; host load {load}",
        seconds("node_ready"),
        seconds("pod_running"),
        cost.took_s,
        cost.cpu_s,
        cost.main_took_s,
        cost.main_cpu_s,
        cost.children_cpu_s,
        cost.kubelet_version_from
    );
    let entries = [("vm".to_string(), vm)].into_iter().collect();
    let path = autonode_tests::harness::bench::merge("karpenter.json", entries)?;
    eprintln!("recorded in {}", path.display());
    Ok(())
}
