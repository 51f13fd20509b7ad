//! The real agent binary, on a simulated instance in its own network
//! namespace, joining through the real server and control plane.

use anyhow::Result;
use autonode_tests::cloud::fakecloud::Instance;
use autonode_tests::harness::poll::{self, OnTimeout};
use autonode_tests::machines::node::{launch_machine, registration, user_data, SimulatedNode};
use autonode_tests::server::ignition;
use autonode_tests::server::world::World;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, ListParams, PostParams};
use std::time::Duration;

#[tokio::test]
async fn the_agent_joins_and_its_kubeconfig_registers_the_node() -> Result<()> {
    let world = World::start().await?;
    let (claim, node) = launch_machine(&world).await?;
    let instance = node.instance.clone();
    let run = node.run_agent(&[]).await?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "agent failed:\n{stderr}");
    assert!(
        node.systemctl_calls().contains("kubelet.service"),
        "kubelet not started"
    );

    // The kubeconfig the agent wrote works: the node registers itself.
    let kubelet = node.kubelet_client().await?;
    let registered = Api::<Node>::all(kubelet)
        .create(&PostParams::default(), &registration(&instance))
        .await?;
    assert_eq!(
        registered.spec.and_then(|s| s.provider_id),
        Some(instance.provider_id())
    );

    // The NodeClaim tells the story.
    let reasons = world.event_reasons(&claim, "AgentProgress").await?;
    assert!(
        reasons.contains(&"Attested".to_string()),
        "events: {reasons:?}"
    );
    assert!(
        reasons.contains(&"AgentProgress".to_string()),
        "events: {reasons:?}"
    );

    // A second run verifies and exits without joining again.
    let again = node.run_agent(&[]).await?;
    assert_eq!(
        again.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let grants = world
        .server
        .log()
        .lines()
        .filter(|l| l.contains("join granted"))
        .count();
    assert_eq!(grants, 1, "the second run joined again");
    Ok(())
}

#[tokio::test]
async fn a_refused_agent_says_so_and_starts_nothing() -> Result<()> {
    let world = World::start().await?;
    // No NodeClaim: this machine was not launched by Karpenter.
    let instance = world.cloud.launch(
        Instance::builder()
            .account_id(autonode_tests::server::world::ACCOUNT)
            .region(autonode_tests::server::world::REGION)
            .user_data(user_data(&world).into_bytes())
            .build(),
    );
    let node = SimulatedNode::boot(&world, &instance)?;
    let run = node.run_agent(&[]).await?;
    assert_eq!(
        run.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        !node.systemctl_calls().contains("kubelet"),
        "kubelet was started"
    );
    let console = std::fs::read_to_string(node.path("/console.log")).unwrap_or_default();
    assert!(console.contains("refused"), "console says: {console}");
    assert!(world.csrs_for(&instance).await?.is_empty());
    Ok(())
}

/// A join the server keeps answering 503 (here the operator's base Ignition
/// config is one the agent would refuse) shows on the NodeClaim as an
/// `AgentRetrying` Event that says why; once the config is fixed, the same
/// run completes.
#[tokio::test]
async fn a_join_that_keeps_failing_is_reported_and_then_completes() -> Result<()> {
    let world = World::start_with(&["--base-ignition=base".into()]).await?;
    let broken = r#"{"ignition": {"version": "3.3.0"}, "storage": {"disks": [{"device": "/dev/xvdb", "wipeTable": true}]}}"#;
    ignition::put_configmap(&world.cp.admin().await?, "base", broken).await?;
    let (claim, node) = launch_machine(&world).await?;
    let agent = tokio::spawn(async move {
        let run = node.run_agent(&[]).await;
        (run, node)
    });

    let events: Api<Event> = Api::namespaced(world.cp.admin().await?, "default");
    let selector = format!("involvedObject.name={claim},reason=AgentRetrying");
    let message = poll::until(
        &format!("AgentRetrying Event on {claim}"),
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            Ok(events
                .list(&ListParams::default().fields(&selector))
                .await?
                .items
                .into_iter()
                .find_map(|e| e.message))
        },
    )
    .await
    .on_timeout(|| format!(":\n{}", world.server.log()))?;
    assert!(
        message.contains("phase join retrying") && message.contains("503"),
        "the Event says what keeps failing: {message}"
    );

    let fixed = r#"{"ignition": {"version": "3.3.0"}}"#;
    ignition::put_configmap(&world.cp.admin().await?, "base", fixed).await?;
    let (run, node) = agent.await?;
    let run = run?;
    assert_eq!(
        run.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(node.systemctl_calls().contains("kubelet.service"));
    Ok(())
}
