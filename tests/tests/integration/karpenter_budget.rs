//! The failure budget with the real Karpenter v1.15.1 on moto (issue 47):
//! a misconfiguration costs a machine or two per pending pod, not a
//! launch every 10 s; a lone bad machine is still replaced in seconds.
//! The figures go to `target/bench/karpenter.json` (docs/benchmarks.md).

use crate::karpenter_real::{flawed_machine_replaced_in, record, round};
use anyhow::{ensure, Result};
use autonode_tests::fleet::cluster::{create_pod, KarpenterCluster, CLASS, POD, POOL};
use autonode_tests::kube::events::events_of;
use autonode_tests::machines::launcher::Flaw;
use autonode_tests::server;
use serde_json::json;
use std::time::{Duration, Instant};

/// Pods pending at once, each needing a machine of its own.
const PODS: usize = 3;

/// How long the storm is watched: `AUTONODE_STORM_WATCH_S`, default 180 s
/// (once a group is held nothing more launches until Karpenter's
/// 15-minute timeout, so a longer watch only confirms it; the 600
/// s run is in docs/benchmarks.md).
fn watch() -> Duration {
    let seconds = std::env::var("AUTONODE_STORM_WATCH_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(180);
    Duration::from_secs(seconds)
}

/// A pod that takes a machine for itself (host port 8080: Karpenter puts
/// no two on one node).
fn own_machine() -> serde_json::Value {
    json!({"containers": [{
        "name": "pause",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
        "ports": [{"containerPort": 8080, "hostPort": 8080}],
    }]})
}

/// The messages of the Events of `reason` on the `kind` object `name`.
async fn warnings(
    admin: &kube::Client,
    kind: &str,
    name: &str,
    reason: &str,
) -> Result<Vec<String>> {
    let events = events_of(admin, name).await?;
    Ok(events
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some(kind))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message)
        .collect())
}

/// The sum of `server`'s series whose line starts with `series`.
async fn series(server: &server::TestServer, series: &str) -> Result<f64> {
    let text = server::http_get(&format!("{}/metrics", server.metrics_url()))
        .await?
        .1;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Pending pods, every machine failing: watched for [`watch`], the
/// launches per pod.
async fn storm(cluster: &KarpenterCluster, flaw: Option<Flaw>) -> Result<(usize, Duration)> {
    if let Some(flaw) = flaw {
        cluster.launcher.flaw_next(flaw, 10_000);
    }
    cluster.create_class_and_pool().await?;
    let admin = cluster.cp.admin().await?;
    for i in 0..PODS {
        create_pod(&admin, &format!("storm-{i}"), own_machine()).await?;
    }
    let watched = watch();
    let t0 = Instant::now();
    tokio::time::sleep(watched).await;
    let launched = cluster.launcher.machines().len();
    eprintln!(
        "{launched} instances launched for {PODS} pods in {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    Ok((launched, watched))
}

/// Issue 47's first proof: every machine's kubelet will not start, so
/// every agent fails for good and says so, signed. The first two of the
/// group are replaced at once; then the group is over its budget, the
/// rest are kept marked, and Karpenter launches no more until its own
/// timeout: at most twice the pods. The NodePool and the class carry a
/// `FailureBudgetSpent` Warning naming the reason, and the gauge behind
/// the critical `AutonodeFailureBudgetSpent` (promtool:
/// tests/prometheus/bootstrap.test.yaml) is 1. Today's server: 54
/// instances for 3 pods in 181 s.
#[tokio::test(flavor = "multi_thread")]
async fn every_machine_failing_costs_at_most_two_launches_per_pending_pod() -> Result<()> {
    let cluster = KarpenterCluster::start(&[]).await?;
    let (launched, watched) = storm(&cluster, Some(Flaw::KubeletWontStart)).await?;
    record(
        &cluster,
        json!({
            "storm_watch_s": watched.as_secs(),
            "storm_pods": PODS,
            "storm_instances_launched": launched,
            "storm_launches_per_pending_pod": round(launched as f64 / PODS as f64),
        }),
    )?;
    ensure!(launched <= 2 * PODS, "{launched} instances for {PODS} pods");
    let admin = cluster.cp.admin().await?;
    for (kind, name) in [("NodePool", POOL), ("EC2NodeClass", CLASS)] {
        let said = warnings(&admin, kind, name, "FailureBudgetSpent").await?;
        ensure!(
            said.iter().any(|m| m.contains("agent_fatal")),
            "{kind} {name}: {said:?}"
        );
    }
    let over = series(&cluster.server, "autonode_failure_groups_over_budget ").await?;
    ensure!(over >= 1.0, "groups over budget: {over}");
    Ok(())
}

/// Issue 47's second proof: the server allows another account than the
/// fleet's (moto's). Every machine is refused as `account_not_allowed`:
/// no NodeClaim is deleted, each is marked with its reason, and the
/// counter behind the critical `AutonodeRefusedOnServerSide` counts them;
/// the NodePool and class say so. Today's server: 57 instances for 3 pods
/// in 182 s, and no word anywhere.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_allowing_another_account_deletes_no_nodeclaim_and_says_why() -> Result<()> {
    let cluster = KarpenterCluster::start(&["--allowed-accounts=999988887777".into()]).await?;
    let (launched, watched) = storm(&cluster, None).await?;
    record(
        &cluster,
        json!({
            "wrong_account_watch_s": watched.as_secs(),
            "wrong_account_instances_launched": launched,
        }),
    )?;
    ensure!(launched <= PODS, "{launched} instances for {PODS} pods");
    let deleted = series(&cluster.server, "autonode_nodeclaims_deleted_total{").await?;
    ensure!(deleted == 0.0, "NodeClaims deleted: {deleted}");
    let marked = series(
        &cluster.server,
        "autonode_nodeclaims_failed_server_side_total{",
    )
    .await?;
    ensure!(marked >= 1.0, "server-side failures: {marked}");
    let admin = cluster.cp.admin().await?;
    for (kind, name) in [("NodePool", POOL), ("EC2NodeClass", CLASS)] {
        let said = warnings(&admin, kind, name, "FailingOnServerSide").await?;
        ensure!(
            said.iter().any(|m| m.contains("account_not_allowed")),
            "{kind} {name}: {said:?}"
        );
    }
    Ok(())
}

/// Issue 47's third proof: one bad machine among good ones is still
/// replaced within 30 s, and so are the next ones, each after a machine
/// of the group became Ready (the replacement): three in a row, one more
/// than the default budget, each deleted and counted under its reason,
/// NodePool and class.
#[tokio::test(flavor = "multi_thread")]
async fn a_lone_bad_machine_is_replaced_in_seconds_each_time_one_of_its_group_was_ready_since(
) -> Result<()> {
    let cluster = KarpenterCluster::start(&[]).await?;
    cluster.create_class_and_pool().await?;
    let mut existing = Vec::new();
    let mut times = Vec::new();
    for round_no in 0..3 {
        let says = ("BootstrapFailed", "starting kubelet");
        let flaw = Flaw::KubeletWontStart;
        let replaced =
            flawed_machine_replaced_in(&cluster, flaw, says, &existing, json!({})).await?;
        eprintln!(
            "round {round_no}: replaced after {:.1} s",
            replaced.replaced_s
        );
        ensure!(
            replaced.replaced_s < 30.0,
            "replaced after {:.1} s",
            replaced.replaced_s
        );
        times.push(round(replaced.replaced_s));
        existing = autonode_tests::fleet::cluster::list_nodeclaims(&cluster.cp.admin().await?)
            .await?
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        next_round(&cluster).await?;
    }
    let labelled = format!(
        "autonode_nodeclaims_deleted_total{{reason=\"agent_fatal\",nodepool=\"{POOL}\",nodeclass=\"{CLASS}\"}} 3"
    );
    let text = server::http_get(&format!("{}/metrics", cluster.server.metrics_url()))
        .await?
        .1;
    ensure!(
        text.lines().any(|l| l == labelled),
        "no {labelled:?} in the scrape"
    );
    record(&cluster, json!({"lone_failure_replaced_s": times}))
}

/// Makes room for the next round's pod on a machine of its own: the pod
/// deleted (waited for), every Node cordoned, so Karpenter launches again.
async fn next_round(cluster: &KarpenterCluster) -> Result<()> {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, DeleteParams, Patch, PatchParams};
    let admin = cluster.cp.admin().await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    // At once: the stand-in kubelet runs no pod, so nothing would confirm
    // a graceful deletion.
    pods.delete(POD, &DeleteParams::default().grace_period(0))
        .await?;
    cluster
        .wait_for("the pod gone", Duration::from_secs(120), || async {
            Ok(pods.get_opt(POD).await?.is_none().then_some(()))
        })
        .await?;
    let nodes: Api<Node> = Api::all(admin);
    let cordon = json!({"spec": {"unschedulable": true}});
    for node in nodes.list(&Default::default()).await? {
        let name = node.metadata.name.unwrap_or_default();
        nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&cordon))
            .await?;
    }
    Ok(())
}
