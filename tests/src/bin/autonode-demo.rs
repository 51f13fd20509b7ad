//! The local demo: the real Karpenter launches a machine for a Deployment,
//! autonode joins it, and the pod runs there.
//!
//! Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler,
//! moto (a third-party EC2), the real Karpenter controller and
//! autonode-server; creates an EC2NodeClass whose userData is what
//! `autonode-server render-userdata` prints, and a NodePool; scales a
//! Deployment up. Each instance Karpenter launches into moto boots as a VM
//! (the amd64 test image under QEMU: the agent from its package,
//! containerd, the real kubelet). Narrates each step: the NodeClaim, the
//! moto instance, the agent's log, the Node, the pod Running. Everything
//! is removed when it ends.

use anyhow::Result;
use autonode_tests::fleet::cluster::{KarpenterCluster, CLASS, POOL};
use autonode_tests::fleet::vm::{create_deployment, follow, scale, Step, DEPLOYMENT};
use autonode_tests::karpenter::standin::nodeclaims;
use autonode_tests::kube::events::events_of;
use autonode_tests::machines::launcher::MachineKind;
use std::time::Instant;

#[tokio::main]
async fn main() -> Result<()> {
    let started = Instant::now();
    step("starting a control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), moto as EC2, the real Karpenter and autonode-server");
    let cluster = KarpenterCluster::start_with(MachineKind::Vm, &[], &[]).await?;
    done(&format!(
        "API server {}, autonode-server {} (machines reach both at 172.31.0.10), moto {}",
        cluster.cp.url(),
        cluster.server.url(),
        cluster.moto.url()
    ));

    step(&format!("EC2NodeClass {CLASS} (amiFamily Custom) and NodePool {POOL}; waiting for Karpenter to call the class Ready"));
    println!(
        "    its userData, as `autonode-server render-userdata` prints it:\n{}",
        indent(&cluster.rendered_user_data()?)
    );
    cluster.create_class_and_pool().await?;
    done("Karpenter resolved the class's AMI, subnet and security group in moto");

    let admin = cluster.cp.admin().await?;
    create_deployment(&admin).await?;
    step(&format!(
        "scaling Deployment {DEPLOYMENT} to 1 replica: no node can take its pod"
    ));
    println!("    The machine is a VM emulated in software (QEMU without KVM): from here to the pod Running takes about 2 to 5 minutes.");
    println!("    (Its serial console will be target/vm/console/karpenter-<instance id>.log.)");
    let t0 = Instant::now();
    scale(&admin, 1).await?;
    let journey = follow(&cluster, t0, narrate).await?;

    step("what the NodeClaim shows");
    let claim = nodeclaims(&admin).get(&journey.claim).await?;
    for condition in claim.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        println!(
            "    condition {}={} {}",
            condition["type"].as_str().unwrap_or_default(),
            condition["status"].as_str().unwrap_or_default(),
            condition["reason"].as_str().unwrap_or_default()
        );
    }
    show_events(&admin, &journey.claim).await?;

    step("cleaning up");
    drop(cluster);
    done(&format!(
        "all processes stopped, all files removed; {:.0} s in all, {:.0} s from the scale-up to the pod Running",
        started.elapsed().as_secs_f64(),
        journey.seconds("pod_running").unwrap_or_default()
    ));
    Ok(())
}

/// The NodeClaim's Events in the order they first happened, each with the
/// number of times it was recorded (a repeated Event is counted, not
/// listed again).
async fn show_events(admin: &kube::Client, claim: &str) -> Result<()> {
    let mut events = events_of(admin, claim).await?;
    events.sort_by_key(|event| {
        let first = event.first_timestamp.as_ref().map(|t| t.0);
        first.or(event.event_time.as_ref().map(|t| t.0))
    });
    let mut put_back = false;
    for event in &events {
        let reason = event.reason.as_deref().unwrap_or_default();
        let message = event.message.as_deref().unwrap_or_default();
        let times = match event.count {
            Some(count) if count > 1 => format!(" (×{count})"),
            _ => String::new(),
        };
        println!(
            "    event {} {reason}{times}: {message}",
            event.type_.as_deref().unwrap_or_default()
        );
        put_back |= reason == "AutonodeBootstrapped" && message.contains("Status: True -> Unknown");
    }
    if put_back {
        // autonode never writes True -> Unknown (its writes carry the
        // resourceVersion read, and Ready is kept once reported): this is
        // Karpenter's write racing autonode's, which would read as a flap.
        println!(
            "    (Karpenter writes a NodeClaim's conditions list whole, from the copy it read; \
             when that copy is older than autonode's last write, it puts back an earlier \
             AutonodeBootstrapped, and autonode writes its own again.)"
        );
    }
    Ok(())
}

/// What each step of the journey means, and what was seen.
fn narrate(seen: &Step) {
    let heading = match seen.name {
        "pod_pending" => "kube-scheduler finds no node for the pod",
        "nodeclaim" => "Karpenter wants a node for it: a NodeClaim",
        "launched" => "Karpenter launches the instance (CreateFleet on moto)",
        "agent_joined" => "the VM booted; autonode-agent proved the instance's identity to autonode-server and configured kubelet (its log)",
        "node_registered" => "kubelet registers the Node with the credentials the agent got",
        "node_ready" => "the Node is Ready",
        "initialized" => "Karpenter takes the Node for its NodeClaim",
        "pod_running" => "the pod runs on the new node",
        other => other,
    };
    step(&format!("[{:>5.1} s] {heading}", seen.after.as_secs_f64()));
    if seen.name == "agent_joined" {
        println!("{}", indent(&seen.detail));
    } else {
        done(&seen.detail);
    }
}

fn step(what: &str) {
    println!("\n==> {what}");
}

fn done(what: &str) {
    println!("    ✓ {what}");
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("      {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
