//! The real Karpenter taking away nodes that joined through autonode: an
//! empty node consolidated, a NodeClaim deleted, a static NodePool scaled.
//! Each removal must leave nothing of autonode's behind, and the removed
//! machine's disk, in anyone's hands, must get nothing more: its identity
//! document and keys cannot join again, its kubelet credential cannot renew.

use crate::karpenter_real::{follow, record, round, wait_autonode_condition, Journey};
use anyhow::{Context, Result};
use autonode_server::kube::marks::CSR_INSTANCE_LABEL;
use autonode_tests::callers::joiner::CsrShape;
use autonode_tests::cloud::moto::ZONE;
use autonode_tests::fleet::cluster::{
    create_class, create_pending_pod, create_pod, create_pool_named, is_ready, list_nodeclaims,
    KarpenterCluster, LAUNCH_TIMEOUT, POD, POOL,
};
use autonode_tests::fleet::journey::{
    follow_claim, is_issued, is_undecided, join_refused_line, left_pending_as, leftovers,
    replay_join, steal, wait_deleting, wait_removed, Stolen,
};
use autonode_tests::karpenter::standin::nodeclaims;
use autonode_tests::machines::launcher::{Machine, MachineKind};
use autonode_tests::machines::node::kubelet_client_under;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Event, Node, NodeSpec, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch,
    PatchParams, PostParams,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Instant;

#[tokio::test(flavor = "multi_thread")]
async fn an_emptied_node_is_consolidated_away_and_its_machine_can_never_join_or_renew_again(
) -> Result<()> {
    let cluster = KarpenterCluster::start(&[]).await?;
    let admin = cluster.cp.admin().await?;
    // Karpenter may take an empty node away at once, one at a time.
    let disruption = json!({
        "consolidationPolicy": "WhenEmpty",
        "consolidateAfter": "0s",
        "budgets": [{"nodes": "1"}],
    });
    class_and_pools(&cluster, &[(POOL, json!({ "disruption": disruption }))]).await?;
    let (journey, machine) = pending_pod_to_machine(&cluster).await?;
    let stolen = steal(&cluster, &machine).await?;
    renews_while_it_lives(&cluster, &machine, &stolen).await?;

    // The pod goes and the node is empty. Deleted at once: the kubelet
    // stand-in runs no pod, so nothing would confirm a graceful end.
    let at_once = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    Api::<Pod>::namespaced(admin.clone(), "default")
        .delete(POD, &at_once)
        .await?;
    let emptied = Instant::now();
    let deleting = wait_deleting(&cluster, &journey.claim).await?;
    let decided_s = deleting.duration_since(emptied).as_secs_f64();
    eprintln!("pod deleted → NodeClaim deleting: {decided_s:.1} s");
    let cleaned_s = removed_for_good(&cluster, &journey.claim, &machine, &stolen, deleting).await?;

    // It was Karpenter's consolidation that took it.
    let told = karpenter_events(&admin, &journey.claim).await?;
    assert!(
        told.iter()
            .any(|(reason, message)| reason == "DisruptionTerminating" && message.contains("Empty")),
        "{told:?}"
    );
    record(
        &cluster,
        json!({
            "scale_down_cleaned_s": round(cleaned_s),
            "scale_down_empty_to_deleting_s": round(decided_s),
        }),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_nodeclaims_machine_is_terminated_and_can_never_join_or_renew_again() -> Result<()>
{
    let cluster = KarpenterCluster::start(&[]).await?;
    let admin = cluster.cp.admin().await?;
    // No disruption of Karpenter's own: only the deletion below removes it.
    // (consolidateAfter written out: v1.14 requires it, v1.15 defaults it.)
    let disruption = json!({"consolidateAfter": "0s", "budgets": [{"nodes": "0"}]});
    class_and_pools(&cluster, &[(POOL, json!({ "disruption": disruption }))]).await?;
    let (journey, machine) = pending_pod_to_machine(&cluster).await?;
    let stolen = steal(&cluster, &machine).await?;
    renews_while_it_lives(&cluster, &machine, &stolen).await?;

    // Without its pod (see above), as an operator would: `kubectl delete nodeclaim`.
    let at_once = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    Api::<Pod>::namespaced(admin.clone(), "default")
        .delete(POD, &at_once)
        .await?;
    let deleting = Instant::now();
    nodeclaims(&admin)
        .delete(&journey.claim, &DeleteParams::default())
        .await?;
    let cleaned_s = removed_for_good(&cluster, &journey.claim, &machine, &stolen, deleting).await?;
    record(
        &cluster,
        json!({ "nodeclaim_deleted_cleaned_s": round(cleaned_s) }),
    )
}

/// The class (the rendered userData) and `pools` (name, spec keys), once
/// Karpenter has the class Ready.
async fn class_and_pools(
    cluster: &KarpenterCluster,
    pools: &[(&str, serde_json::Value)],
) -> Result<()> {
    let admin = cluster.cp.admin().await?;
    create_class(&admin, &cluster.rendered_user_data()?).await?;
    for (name, spec) in pools {
        create_pool_named(&admin, name, spec.clone()).await?;
    }
    cluster.class_ready().await
}

/// A pending pod followed to its node ([`follow`]), and the machine.
async fn pending_pod_to_machine(cluster: &KarpenterCluster) -> Result<(Journey, Machine)> {
    let t0 = Instant::now();
    create_pending_pod(&cluster.cp.admin().await?).await?;
    let journey = follow(cluster, &[], t0).await?;
    let machine = cluster
        .launcher
        .machines()
        .into_values()
        .find(|m| m.node_name == journey.node)
        .context("no machine for the node")?;
    Ok((journey, machine))
}

/// Once Karpenter has begun deleting `claim` (seen at `deleting`): waits
/// until the node and the machine are gone, checks that nothing of
/// autonode's is left, then plays whoever kept the machine's disk
/// (`stolen`). Returns the seconds from `deleting` to everything gone.
async fn removed_for_good(
    cluster: &KarpenterCluster,
    claim: &str,
    machine: &Machine,
    stolen: &Stolen,
    deleting: Instant,
) -> Result<f64> {
    wait_removed(cluster, claim, machine).await?;
    let cleaned_s = deleting.elapsed().as_secs_f64();
    eprintln!("NodeClaim {claim} deleting → everything gone: {cleaned_s:.1} s");
    let left = leftovers(cluster, claim, machine).await?;
    assert!(left.is_empty(), "left behind: {left:#?}");
    its_identity_cannot_join_again(cluster, machine, stolen).await?;
    its_credential_cannot_renew(cluster, machine, stolen).await?;
    Ok(cleaned_s)
}

/// While the machine lives, its kubelet's renewal and serving certificate,
/// made as below with the same credential, are approved and issued: what
/// is left pending after its removal is so because of the removal.
async fn renews_while_it_lives(
    cluster: &KarpenterCluster,
    machine: &Machine,
    stolen: &Stolen,
) -> Result<()> {
    let kubelet = kubelet_client_under(stolen.disk.path()).await?;
    let as_node: Api<CertificateSigningRequest> = Api::all(kubelet);
    let client = CsrShape::client(&machine.node_name);
    let serving = CsrShape::serving(&stolen.instance);
    let renewed = submit(&as_node, "renew-alive", CLIENT_SIGNER, &client).await?;
    let served = submit(&as_node, "serving-alive", SERVING_SIGNER, &serving).await?;
    let admin: Api<CertificateSigningRequest> = Api::all(cluster.cp.admin().await?);
    for csr in [renewed, served] {
        cluster
            .wait_for(&format!("{csr} issued"), LAUNCH_TIMEOUT, || async {
                Ok(is_issued(&admin.get(&csr).await?).then_some(()))
            })
            .await?;
    }
    Ok(())
}

/// The attacker boots the terminated instance's identity again: IMDS
/// serving its signed identity document, the agent's keys the server bound
/// to it. The join finds no NodeClaim for the instance
/// (`NodeClaims::one_for`, server/src/kube/nodeclaim.rs): refused as
/// `no_nodeclaim`, the agent exits 2, and nothing is created for it. Were
/// that check missing, the agent would exit 0 (or the refusal would come
/// later, from EC2's `terminated`, under another reason): either fails here.
async fn its_identity_cannot_join_again(
    cluster: &KarpenterCluster,
    machine: &Machine,
    stolen: &Stolen,
) -> Result<()> {
    let admin = cluster.cp.admin().await?;
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let selector = format!("{CSR_INSTANCE_LABEL}={}", machine.instance_id);
    let of_instance = ListParams::default().labels(&selector);
    let before = csrs.list(&of_instance).await?.items.len();

    let run = replay_join(cluster, stolen).await?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "the replayed agent: {stderr}");
    let line = join_refused_line(cluster, &machine.instance_id).await?;
    eprintln!("replayed join: {line}");
    assert!(line.contains(r#"reason="no_nodeclaim""#), "{line}");

    let after = csrs.list(&of_instance).await?.items.len();
    assert_eq!(after, before, "the refused join created CSRs");
    let node = Api::<Node>::all(admin).get_opt(&machine.node_name).await?;
    assert!(node.is_none(), "{node:?}");
    Ok(())
}

/// The attacker holds the removed machine's kubelet credential (its client
/// certificate, still valid for the join's bounded lifetime) and asks for
/// a renewal, then re-creates the Node (NodeRestriction lets a node create
/// its own Node object) pointing at its old instance and asks again, with
/// a serving certificate too. The approver
/// (server/src/controllers/approver/judge.rs) leaves the first pending as
/// `no_node` and the others as `no_nodeclaim`: without a NodeClaim bound to
/// that instance nothing of the node's is approved. Were either check
/// missing, the next would give another reason (or approve): the reasons
/// and the undecided CSRs are asserted.
async fn its_credential_cannot_renew(
    cluster: &KarpenterCluster,
    machine: &Machine,
    stolen: &Stolen,
) -> Result<()> {
    let kubelet = kubelet_client_under(stolen.disk.path()).await?;
    let name = &machine.node_name;
    // The credential still works: only the approver stands in the way.
    let nodes: Api<Node> = Api::all(kubelet.clone());
    assert!(nodes.get_opt(name).await?.is_none());
    let as_node: Api<CertificateSigningRequest> = Api::all(kubelet.clone());
    let client = CsrShape::client(name);
    let no_node = submit(&as_node, "renew-gone", CLIENT_SIGNER, &client).await?;
    left_pending_as(cluster, &no_node, "no_node").await?;

    let provider_id = format!("aws:///{ZONE}/{}", machine.instance_id);
    nodes
        .create(&PostParams::default(), &bare_node(name, &provider_id))
        .await
        .context("the dead node re-creating its Node")?;
    let serving = CsrShape::serving(&stolen.instance);
    let renewed = submit(&as_node, "renew-again", CLIENT_SIGNER, &client).await?;
    let served = submit(&as_node, "serving-again", SERVING_SIGNER, &serving).await?;
    for csr in [&renewed, &served] {
        // The approver may judge before its Node cache has the new Node
        // (`no_node`); it looks again within 30 s and says why anew.
        let line = left_pending_as(cluster, csr, "no_nodeclaim").await?;
        eprintln!("dead node's CSR: {line}");
    }
    let admin: Api<CertificateSigningRequest> = Api::all(cluster.cp.admin().await?);
    for csr in [&no_node, &renewed, &served] {
        let object = admin.get(csr).await?;
        let status = &object.status;
        assert!(is_undecided(&object), "{csr} was decided: {status:?}");
    }
    Ok(())
}

/// The Node a kubelet registers, with only its name and providerID.
fn bare_node(name: &str, provider_id: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(provider_id.to_string()),
            ..Default::default()
        }),
        status: None,
    }
}

/// A kubelet's renewal (client) or serving CSR of `shape`, submitted as
/// kubelet would; its name. One maker of kubelet CSRs: renewal's.
async fn submit(
    api: &Api<CertificateSigningRequest>,
    prefix: &str,
    signer: &str,
    shape: &CsrShape<'_>,
) -> Result<String> {
    let usage = match signer {
        SERVING_SIGNER => "server auth",
        _ => "client auth",
    };
    crate::renewal::submit(api, prefix, signer, usage, shape).await
}

const CLIENT_SIGNER: &str = crate::renewal::CLIENT;
const SERVING_SIGNER: &str = crate::renewal::SERVING;

/// The (reason, message) of each Event on `claim`.
async fn karpenter_events(admin: &kube::Client, claim: &str) -> Result<Vec<(String, String)>> {
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let selector = format!("involvedObject.name={claim}");
    Ok(events
        .list(&ListParams::default().fields(&selector))
        .await?
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect())
}

/// The static pool and the dynamic one beside it, of the same class.
const STATIC_POOL: &str = "autonode-static";
const DYNAMIC_POOL: &str = "autonode-dynamic";

/// Karpenter's static NodePools (`spec.replicas`) are alpha in v1.15,
/// behind this gate (sigs.k8s.io/karpenter `pkg/operator/options`).
const STATIC_CAPACITY: (&str, &str) = ("FEATURE_GATES", "StaticCapacity=true");

#[tokio::test(flavor = "multi_thread")]
async fn a_static_nodepools_machines_join_and_its_replicas_scale_up_and_down_cleanly_beside_a_dynamic_pool(
) -> Result<()> {
    let cluster =
        KarpenterCluster::start_with(MachineKind::Simulated, &[], &[STATIC_CAPACITY]).await?;
    let admin = cluster.cp.admin().await?;
    // No disruption of Karpenter's own in either: only the replicas decide.
    // (consolidateAfter written out: v1.14 requires it, v1.15 defaults it.)
    let still = json!({"consolidateAfter": "0s", "budgets": [{"nodes": "0"}]});
    let t0 = Instant::now();
    class_and_pools(
        &cluster,
        &[
            (STATIC_POOL, json!({"replicas": 2, "disruption": still})),
            (DYNAMIC_POOL, json!({ "disruption": still })),
        ],
    )
    .await?;
    // The dynamic pool launches for a pod that asks for it.
    create_pod_for_pool(&admin, "wants-dynamic", DYNAMIC_POOL).await?;

    let two = follow_pool(&cluster, STATIC_POOL, 2).await?;
    let up_s = t0.elapsed().as_secs_f64();
    let [dynamic]: [(String, Machine); 1] = follow_pool(&cluster, DYNAMIC_POOL, 1)
        .await?
        .into_iter()
        .collect::<Vec<_>>()
        .try_into()
        .map_err(|all| anyhow::anyhow!("not one dynamic node: {all:?}"))?;
    eprintln!("static pool of 2 Initialized {up_s:.1} s after it was created");

    // Up to 3: one more machine joins; the first two stay.
    let t_up = Instant::now();
    set_replicas(&admin, STATIC_POOL, 3).await?;
    let three = follow_pool(&cluster, STATIC_POOL, 3).await?;
    let scaled_up_s = t_up.elapsed().as_secs_f64();
    assert!(
        two.keys().all(|c| three.contains_key(c)),
        "{two:?} → {three:?}"
    );

    // Down to 1: two NodeClaims go with their machines, cleanly.
    let t_down = Instant::now();
    let one = scale_down(&cluster, &three, 1).await?;
    let scaled_down_s = t_down.elapsed().as_secs_f64();

    // The one left and the dynamic node beside it are as they were.
    let claims = nodeclaims(&admin);
    assert_eq!(dynamic_claim(&admin).await?, dynamic.0);
    for claim in one.iter().chain([&dynamic.0]) {
        let c = claims.get(claim).await?;
        assert!(is_ready(&c), "{claim}: {:#}", c.data["status"]);
    }
    let dynamic_node = Api::<Node>::all(admin.clone())
        .get_opt(&dynamic.1.node_name)
        .await?;
    assert!(dynamic_node.is_some(), "the dynamic pool's node went");
    eprintln!("static 2 → 3: {scaled_up_s:.1} s; 3 → 1 (all gone): {scaled_down_s:.1} s");
    record(
        &cluster,
        json!({
            "static_pool_scaled_s": {
                "class_and_pools_created_to_2_initialized": round(up_s),
                "up_2_to_3_initialized": round(scaled_up_s),
                "down_3_to_1_cleaned": round(scaled_down_s),
            },
        }),
    )
}

/// Scales the static pool, whose machines are `before` (by NodeClaim),
/// down to `replicas`; waits until the NodeClaims it drops are gone with
/// their Nodes, instances and machines, and checks that nothing of
/// autonode's is left of them. Returns the NodeClaims left.
async fn scale_down(
    cluster: &KarpenterCluster,
    before: &BTreeMap<String, Machine>,
    replicas: usize,
) -> Result<Vec<String>> {
    let admin = cluster.cp.admin().await?;
    set_replicas(&admin, STATIC_POOL, replicas).await?;
    let left = cluster
        .wait_for("the static pool scaled down", LAUNCH_TIMEOUT, || async {
            let live = pool_claims(&admin, STATIC_POOL).await?;
            Ok((live.len() == replicas).then_some(live))
        })
        .await?;
    let removed: Vec<(&String, &Machine)> =
        before.iter().filter(|(c, _)| !left.contains(c)).collect();
    assert_eq!(
        removed.len(),
        before.len() - replicas,
        "{left:?} of {before:?}"
    );
    for (claim, machine) in &removed {
        wait_removed(cluster, claim, machine).await?;
    }
    for (claim, machine) in &removed {
        let behind = leftovers(cluster, claim, machine).await?;
        assert!(behind.is_empty(), "left behind by {claim}: {behind:#?}");
    }
    Ok(left)
}

/// The NodeClaims of `pool` not being deleted, by name.
async fn pool_claims(admin: &kube::Client, pool: &str) -> Result<Vec<String>> {
    Ok(list_nodeclaims(admin)
        .await?
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| {
            c.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("karpenter.sh/nodepool"))
                .is_some_and(|p| p == pool)
        })
        .filter_map(|c| c.metadata.name)
        .collect())
}

/// The dynamic pool's one NodeClaim.
async fn dynamic_claim(admin: &kube::Client) -> Result<String> {
    let claims = pool_claims(admin, DYNAMIC_POOL).await?;
    let [claim]: [String; 1] = claims
        .try_into()
        .map_err(|all| anyhow::anyhow!("not one dynamic NodeClaim: {all:?}"))?;
    Ok(claim)
}

/// Waits for `pool` to have `count` NodeClaims and follows each to an
/// Initialized node; then checks it still has exactly those (Karpenter
/// made no more). Returns their machines by NodeClaim.
async fn follow_pool(
    cluster: &KarpenterCluster,
    pool: &str,
    count: usize,
) -> Result<BTreeMap<String, Machine>> {
    let admin = cluster.cp.admin().await?;
    let claims = cluster
        .wait_for(
            &format!("{count} NodeClaims of {pool}"),
            LAUNCH_TIMEOUT,
            || async {
                let claims = pool_claims(&admin, pool).await?;
                Ok((claims.len() >= count).then_some(claims))
            },
        )
        .await?;
    let mut machines = BTreeMap::new();
    for claim in claims {
        let machine = follow_claim(cluster, &claim).await?.machine;
        // autonode told its story on each, static or not.
        wait_autonode_condition(cluster, &claim, "True", "NodeReady").await?;
        machines.insert(claim, machine);
    }
    let now = pool_claims(&admin, pool).await?;
    assert_eq!(
        now.len(),
        count,
        "{pool} has {now:?}, not {count}: {machines:#?}"
    );
    Ok(machines)
}

/// Sets `pool`'s `spec.replicas`.
async fn set_replicas(admin: &kube::Client, pool: &str, replicas: usize) -> Result<()> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool"));
    Api::<DynamicObject>::all_with(admin.clone(), &resource)
        .patch(
            pool,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .with_context(|| format!("scaling {pool} to {replicas}"))?;
    Ok(())
}

/// A pod only `pool`'s nodes can take (Karpenter labels them with it).
async fn create_pod_for_pool(admin: &kube::Client, name: &str, pool: &str) -> Result<()> {
    let selector = json!({"nodeSelector": {"karpenter.sh/nodepool": pool}});
    create_pod(admin, name, selector).await
}
