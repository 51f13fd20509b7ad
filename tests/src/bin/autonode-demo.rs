//! The local demo: a machine joins a real control plane through autonode.
//!
//! Starts etcd, kube-apiserver and kube-controller-manager, the fake cloud
//! and autonode-server; plays Karpenter's part; runs the real agent binary
//! on a simulated instance in its own network namespace; then shows the node
//! registering itself with the credentials the agent wrote, and the
//! NodeClaim's Events. Everything is removed when it ends.

use anyhow::{Context, Result};
use autonode_tests::fakecloud::Instance;
use autonode_tests::karpenter;
use autonode_tests::node::{registration, user_data, SimulatedNode};
use autonode_tests::world::World;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, ListParams, PostParams};
use std::time::Instant;

#[tokio::main]
async fn main() -> Result<()> {
    let started = Instant::now();
    step("starting etcd, kube-apiserver, kube-controller-manager, the fake cloud and autonode-server");
    let world = World::start().await?;
    done(&format!(
        "control plane at {}, join API at {}",
        world.cp.url(),
        world.server.url()
    ));

    step("playing Karpenter: NodeClaim created, instance launched, providerID set");
    let user_data = user_data(&world);
    let (claim, instance) = world
        .launch(|i| Instance {
            user_data: user_data.clone().into_bytes(),
            ..i
        })
        .await?;
    done(&format!("NodeClaim {claim} → {}", instance.provider_id()));
    println!("    userData the instance gets:\n{}", indent(&user_data));

    step("booting the instance: its own network namespace, IMDS at 169.254.169.254");
    let node = SimulatedNode::boot(&world, &instance)?;
    done(&format!("namespace {}", node.netns.name()));

    step("running autonode-agent on the instance");
    let run = node.run_agent(&[]).await?;
    println!("{}", indent(&String::from_utf8_lossy(&run.stderr)));
    anyhow::ensure!(run.status.success(), "the agent failed ({})", run.status);
    done("attested, certificates issued, kubelet configured and started");
    println!(
        "    systemctl was asked to: {}",
        node.systemctl_calls().trim().replace('\n', "; ")
    );

    step("kubelet registers the Node with the credentials the agent wrote (NodeRestriction on)");
    let kubelet = node.kubelet_client().await?;
    let registered = Api::<Node>::all(kubelet)
        .create(&PostParams::default(), &registration(&instance))
        .await
        .context("registering the Node")?;
    let taints = registered
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    done(&format!(
        "Node {} providerID {} taints {:?}",
        instance.private_dns_name,
        instance.provider_id(),
        taints
            .iter()
            .map(|t| format!("{}:{}", t.key, t.effect))
            .collect::<Vec<_>>()
    ));

    step("what the NodeClaim shows");
    let admin = world.cp.admin().await?;
    let nodeclaim = karpenter::nodeclaims(&admin).get(&claim).await?;
    let annotations = nodeclaim.metadata.annotations.unwrap_or_default();
    for (key, value) in annotations
        .iter()
        .filter(|(k, _)| k.starts_with("autonode.dev/"))
    {
        println!("    annotation {key}={value}");
    }
    // Events are written in the background: give them a moment.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let selector = format!("involvedObject.name={claim}");
    let events = Api::<Event>::namespaced(admin, "default")
        .list(&ListParams::default().fields(&selector))
        .await?;
    for event in events.items {
        println!(
            "    event {} {}: {}",
            event.type_.unwrap_or_default(),
            event.reason.unwrap_or_default(),
            event.message.unwrap_or_default()
        );
    }

    step("cleaning up");
    drop(node);
    drop(world);
    done(&format!(
        "all processes stopped, all files removed; {:.1}s in all",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
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
