//! The capacity check (issue 18): a Ready node's allocatable against what
//! Karpenter planned with (its NodeClaim's `status.allocatable`), on the
//! real control plane. A node short beyond the tolerance gets one
//! `CapacityShortfall` Warning on its NodeClaim and its EC2NodeClass and a
//! count in the metric, once, across a restart; a node that matches, or is
//! short within the tolerance, gets nothing. And a class that leaves
//! `maxPods` or `kubeReserved` unset is warned about once per generation
//! when nodes' configs are rendered from it.

use anyhow::{Context, Result};
use autonode_tests::harness::poll::{self, OnTimeout, Seen};
use autonode_tests::karpenter::standin;
use autonode_tests::machines::node::registration;
use autonode_tests::oracles::promql;
use autonode_tests::server::world::{JoinedNode, World};
use autonode_tests::server::{http_get, TestServer};
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use std::time::Duration;

const SHORTFALL: &str = "CapacityShortfall";
const UNSET: &str = "KubeletSettingsUnset";

/// What Karpenter writes on an m5.xlarge's NodeClaim with EKS's defaults.
fn planned() -> Value {
    json!({"cpu": "3920m", "memory": "14162Mi", "pods": "58", "ephemeral-storage": "17Gi"})
}

#[tokio::test]
async fn a_node_smaller_than_planned_is_reported_once_on_the_claim_and_the_class() -> Result<()> {
    let world = started().await?;
    let admin = world.cp.admin().await?;
    standin::create_custom_nodeclass(&admin, "default", "not read here").await?;

    // Karpenter planned 58 pods; the node allows 29.
    let small =
        json!({"cpu": "3920m", "memory": "14162Mi", "pods": "29", "ephemeral-storage": "17Gi"});
    let first = ready_node(&world, planned(), small.clone()).await?;
    let on_claim = wait_events(&world, &first.claim, SHORTFALL).await?;
    assert_eq!(on_claim.len(), 1, "{on_claim:?}");
    let (count, note) = &on_claim[0];
    assert_eq!(*count, 1);
    assert!(
        note.contains("pods 29 on the node, 58 expected (29 less, 50%"),
        "{note}"
    );
    assert!(note.contains("spec.kubelet.maxPods"), "{note}");
    assert!(!note.contains("memory"), "only the short resource: {note}");
    let on_class = wait_events(&world, "default", SHORTFALL).await?;
    assert_eq!(on_class.len(), 1, "{on_class:?}");
    assert!(on_class[0].1.contains(&first.claim), "{on_class:?}");
    assert!(
        on_class[0].1.contains("spec.kubelet.maxPods"),
        "{on_class:?}"
    );
    assert_eq!(shortfalls(&world.server, "pods").await?, 1);
    assert_eq!(shortfalls(&world.server, "memory").await?, 0);
    // The alert on shortfalls asks for the series as the server exports it.
    let (_, body) = http_get(&format!("{}/metrics", world.server.metrics_url())).await?;
    let rules = promql::read_rules()?;
    let missing = promql::rules_missing_from(&body, &rules, "autonode_capacity_shortfalls_total")?;
    assert!(
        missing.is_empty(),
        "the rules ask for what is not exported: {missing:?}"
    );

    // A restarted server (a new leader) reconciles every NodeClaim again:
    // the first is not reported again. The second node, short too, shows
    // the restarted controller at work.
    world.server.restart().await?;
    let second = ready_node(&world, planned(), small).await?;
    wait_events(&world, &second.claim, SHORTFALL).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = events(&world, &first.claim, SHORTFALL).await?;
    assert_eq!(again, on_claim, "reported once, across the restart");
    assert_eq!(
        shortfalls(&world.server, "pods").await?,
        1,
        "the restarted server counts the second node only"
    );
    let logged = world
        .server
        .log()
        .lines()
        .filter(|l| l.contains(&first.claim) && l.contains("less allocatable"))
        .count();
    assert_eq!(logged, 1, "{}", world.server.log());
    Ok(())
}

#[tokio::test]
async fn a_node_as_planned_or_short_within_the_tolerance_is_not_reported() -> Result<()> {
    let world = started().await?;
    let admin = world.cp.admin().await?;
    standin::create_custom_nodeclass(&admin, "default", "not read here").await?;

    // The same amounts in the units kubelet writes.
    let same = json!({"cpu": "3920m", "memory": "14501888Ki", "pods": "58",
                      "ephemeral-storage": "18253611008"});
    let matching = ready_node(&world, planned(), same).await?;
    // 3% short of cpu and memory: under the default 5%.
    let close =
        json!({"cpu": "3803m", "memory": "13738Mi", "pods": "58", "ephemeral-storage": "17Gi"});
    let within = ready_node(&world, planned(), close).await?;
    // 10% short of memory: reported, and the sign the controller has run.
    let far =
        json!({"cpu": "3920m", "memory": "12745Mi", "pods": "58", "ephemeral-storage": "17Gi"});
    let short = ready_node(&world, planned(), far).await?;

    let reported = wait_events(&world, &short.claim, SHORTFALL).await?;
    assert!(
        reported[0]
            .1
            .contains("memory 12745Mi on the node, 14162Mi expected"),
        "{reported:?}"
    );
    assert!(reported[0].1.contains("evictionHard"), "{reported:?}");
    for claim in [&matching.claim, &within.claim] {
        wait_checked(&world, claim).await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for claim in [&matching.claim, &within.claim] {
        let found = events(&world, claim, SHORTFALL).await?;
        assert!(found.is_empty(), "{claim}: {found:?}");
    }
    assert_eq!(shortfalls(&world.server, "memory").await?, 1);
    assert_eq!(shortfalls(&world.server, "cpu").await?, 0);
    Ok(())
}

#[tokio::test]
async fn a_class_without_max_pods_or_kube_reserved_is_warned_about_once_per_generation(
) -> Result<()> {
    let world = started().await?;
    let admin = world.cp.admin().await?;
    let spec = standin::custom_spec(json!({"maxPods": 29}));
    standin::create_nodeclass(&admin, "default", json!({}), spec).await?;

    for _ in 0..2 {
        world.join_new(|i| i).await?;
    }
    let warned = wait_events(&world, "default", UNSET).await?;
    assert_eq!(warned.len(), 1, "{warned:?}");
    let (count, note) = &warned[0];
    assert_eq!(*count, 1, "two joins, one warning: {warned:?}");
    assert!(
        note.contains("spec.kubelet.kubeReserved is unset"),
        "{note}"
    );
    assert!(!note.contains("maxPods"), "maxPods is set: {note}");
    let logged = || {
        world
            .server
            .log()
            .lines()
            .filter(|l| l.contains("spec.kubelet.kubeReserved is unset"))
            .count()
    };
    assert_eq!(logged(), 1, "{}", world.server.log());

    // An edit of the class is a new generation: warned about again.
    let classes = standin::ec2nodeclasses(&admin);
    let generation = classes.get("default").await?.metadata.generation;
    let unset = json!({"spec": {"kubelet": {"maxPods": null}}});
    classes
        .patch("default", &PatchParams::default(), &Patch::Merge(&unset))
        .await?;
    wait_generation(&world, generation.unwrap_or_default() + 1).await?;
    // The server's class cache follows its watch: give it a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    world.join_new(|i| i).await?;
    poll::until(
        "second warning after the edit",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async { Ok((logged() >= 2).then_some(())) },
    )
    .await
    .on_timeout(|| format!(":\n{}", world.server.log()))?;
    let line = world
        .server
        .log()
        .lines()
        .rfind(|l| l.contains("spec.kubelet.kubeReserved is unset"))
        .map(str::to_string)
        .context("no line")?;
    assert!(line.contains("spec.kubelet.maxPods is unset"), "{line}");
    Ok(())
}

/// A world whose server leads within 3 s.
async fn started() -> Result<World> {
    World::start_with(&["--leader-lease=3".into()]).await
}

/// A machine joined from the class `default` whose NodeClaim says Karpenter
/// planned with `planned` and whose Node registers Ready with `allocatable`.
async fn ready_node(world: &World, planned: Value, allocatable: Value) -> Result<JoinedNode> {
    let joined = world.join_new(|i| i).await?;
    let admin = world.cp.admin().await?;
    let params = PatchParams {
        field_manager: Some(standin::FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let patch = json!({"status": {"allocatable": planned}});
    standin::nodeclaims(&admin)
        .patch_status(&joined.claim, &params, &Patch::Merge(&patch))
        .await
        .context("setting the NodeClaim's allocatable")?;
    let mut node = serde_json::to_value(registration(&joined.instance))?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    node["status"] = json!({
        "allocatable": allocatable,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "lastTransitionTime": now}],
    });
    let node: Node = serde_json::from_value(node)?;
    let nodes: Api<Node> = Api::all(joined.client.clone());
    nodes.create(&PostParams::default(), &node).await?;
    Ok(joined)
}

/// The Events with `reason` on the object named `name`: count and message.
async fn events(world: &World, name: &str, reason: &str) -> Result<Vec<(i32, String)>> {
    let api: Api<Event> = Api::namespaced(world.cp.admin().await?, "default");
    let selector = format!("involvedObject.name={name},reason={reason}");
    let mut found: Vec<(i32, String)> = api
        .list(&ListParams::default().fields(&selector))
        .await?
        .items
        .into_iter()
        .map(|e| (e.count.unwrap_or(1), e.message.unwrap_or_default()))
        .collect();
    found.sort();
    Ok(found)
}

/// Like [`events`], once there is at least one.
async fn wait_events(world: &World, name: &str, reason: &str) -> Result<Vec<(i32, String)>> {
    poll::until(
        &format!("{reason} Event on {name}"),
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            let found = events(world, name, reason).await?;
            Ok((!found.is_empty()).then_some(found))
        },
    )
    .await
}

/// Waits until NodeClaim `claim`'s marks say its capacity was compared.
async fn wait_checked(world: &World, claim: &str) -> Result<()> {
    let claims = standin::nodeclaims(&world.cp.admin().await?);
    poll::until(
        &format!("capacity compared on NodeClaim {claim}"),
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            let object = claims.get(claim).await?;
            let reported = object
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("autonode.dev/reported"))
                .cloned()
                .unwrap_or_default();
            let compared = reported.split(',').any(|r| r == "capacity");
            Ok(Seen(
                compared.then_some(()),
                format!("reported: {reported:?}"),
            ))
        },
    )
    .await
}

/// Waits until the EC2NodeClass `default` is at `generation` or later.
async fn wait_generation(world: &World, generation: i64) -> Result<()> {
    let classes = standin::ec2nodeclasses(&world.cp.admin().await?);
    poll::until(
        &format!("generation {generation} of EC2NodeClass default"),
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            let now = classes.get("default").await?.metadata.generation;
            Ok((now >= Some(generation)).then_some(()))
        },
    )
    .await
}

/// `autonode_capacity_shortfalls_total` for class `default` and `resource`
/// (0 when never counted).
async fn shortfalls(server: &TestServer, resource: &str) -> Result<u64> {
    let (_, body) = http_get(&format!("{}/metrics", server.metrics_url())).await?;
    let prefix = format!(
        "autonode_capacity_shortfalls_total{{nodeclass=\"default\",resource=\"{resource}\"}} "
    );
    match body.lines().find_map(|l| l.strip_prefix(&prefix)) {
        Some(value) => Ok(value.trim().parse()?),
        None => Ok(0),
    }
}
