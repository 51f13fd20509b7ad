//! Karpenter upgraded in place under a running fleet, as users do who lag
//! a release: machines join through autonode under the previous minor
//! (`karpenter_controller::previous`, v1.14), then Karpenter is replaced
//! by the current one (`current`, v1.15) the way its upgrade guide orders
//! it: the controller stopped, the new CRDs applied over the old, the new
//! controller started. The upgrade itself must drift and replace nothing,
//! leave autonode's condition and Events on every NodeClaim, and the new
//! Karpenter must still launch machines that join, and still replace a
//! machine whose join is refused for good in seconds.
//!
//! Needs both Karpenter builds and a Kubernetes both declare they support
//! (v1.14 stops at 1.36, so not the 1.37 CI runs): `tests/run --karpenter
//! 1.14` builds both and chooses such a Kubernetes (1.34), and runs this
//! test. Elsewhere it is ignored (nextest counts it skipped), and run on a
//! Kubernetes either does not support it fails saying so.

use crate::karpenter_real::{
    flawed_machine_replaced_in, follow_pod, record, round, wait_autonode_condition,
    AUTONODE_CONDITION, CLASS_HASH,
};
use anyhow::{bail, Context, Result};
use autonode_tests::fleet::cluster::{
    condition, create_class, create_pod, create_pool_named, list_nodeclaims, KarpenterCluster, POOL,
};
use autonode_tests::karpenter::real::{check_supports, current, previous, under_test};
use autonode_tests::kube::events::event_reasons;
use autonode_tests::machines::launcher::{Flaw, MachineKind};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The fleet joined before the upgrade.
const FLEET: usize = 3;

/// How long the fleet is watched after the new Karpenter is ready: its
/// disruption loop runs every 10 s and a NodeClaim's `Drifted` condition is
/// set on its first reconcile (the informers' initial list), so a drift the
/// upgrade caused shows, and is acted on (budget 1), well within it.
const SETTLE: Duration = Duration::from_secs(60);

/// A pod that needs a machine of its own (an m5.large holds one).
fn own_machine() -> serde_json::Value {
    json!({
        "terminationGracePeriodSeconds": 0,
        "containers": [{
            "name": "pause",
            "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "1500m", "memory": "64Mi"}},
        }],
    })
}

/// What a NodeClaim is, for telling a replacement from the original.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    uid: String,
    provider_id: String,
    node: String,
}

fn identity(claim: &DynamicObject) -> Identity {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    Identity {
        uid: claim.metadata.uid.clone().unwrap_or_default(),
        provider_id: text(&claim.data["status"]["providerID"]),
        node: text(&claim.data["status"]["nodeName"]),
    }
}

fn is_true(claim: &DynamicObject, type_: &str) -> bool {
    condition(claim, type_).is_some_and(|c| c["status"] == "True")
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the previous Karpenter minor built and a Kubernetes both minors support: \
            `tests/run --karpenter 1.14` runs it"]
async fn karpenter_upgraded_from_the_previous_minor_under_a_running_fleet_drifts_and_replaces_nothing_and_autonode_still_joins_and_replaces(
) -> Result<()> {
    // From the release under test when it is older (`tests/run
    // --karpenter 1.14`), else from the previous minor; to the newest.
    let to = current()?;
    let from = match under_test()? {
        older if older < to => older,
        _ => previous()?,
    };
    let mut cluster = KarpenterCluster::start_on(from, MachineKind::Simulated, &[], &[]).await?;
    // Before a fleet is built on a cluster the upgrade could not go to.
    check_supports(to, cluster.cp.version())?;
    let admin = cluster.cp.admin().await?;
    create_class(&admin, &cluster.rendered_user_data()?).await?;
    // Consolidation off, a budget of one node: the only thing that could
    // replace a node here is drift (or expiry, 720 h away), and a drift the
    // upgrade caused would be acted on, not only shown.
    let pool = json!({"disruption": {
        "consolidateAfter": "Never",
        "budgets": [{"nodes": "1"}],
    }});
    create_pool_named(&admin, POOL, pool).await?;
    cluster.class_ready().await?;

    // The fleet, under the previous minor: each pod its own machine, each
    // joined through autonode.
    let t_fleet = Instant::now();
    for i in 0..FLEET {
        create_pod(&admin, &format!("fleet-{i}"), own_machine()).await?;
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let fleet = cluster
        .wait_for(
            &format!("{FLEET} Initialized NodeClaims under Karpenter {from}, the pods bound"),
            Duration::from_secs(480),
            || async {
                let claims = list_nodeclaims(&admin).await?;
                let ready = claims.len() == FLEET
                    && claims
                        .iter()
                        .all(|c| is_true(c, "Initialized") && is_true(c, "Ready"));
                if !ready {
                    return Ok(None);
                }
                let nodes: BTreeSet<String> = claims.iter().map(|c| identity(c).node).collect();
                for i in 0..FLEET {
                    let pod = pods.get(&format!("fleet-{i}")).await?;
                    let on = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
                    if !nodes.contains(&on) {
                        return Ok(None);
                    }
                }
                Ok(Some(claims))
            },
        )
        .await?;
    let fleet_s = t_fleet.elapsed().as_secs_f64();
    let names: Vec<String> = fleet
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    for claim in &names {
        wait_autonode_condition(&cluster, claim, "True", "NodeReady").await?;
    }
    // Every machine joined through autonode: its agent succeeded.
    let machines = cluster.launcher.machines();
    for claim in &fleet {
        let id = identity(claim);
        let machine = machines
            .values()
            .find(|m| id.provider_id.ends_with(&m.instance_id))
            .with_context(|| format!("no machine for {id:?}"))?;
        let agent = machine.agent.as_ref().context("the agent has not run")?;
        assert_eq!(agent.code, Some(0), "{machine:#?}");
    }
    let before: BTreeMap<String, Identity> = fleet
        .iter()
        .map(|c| (c.metadata.name.clone().unwrap_or_default(), identity(c)))
        .collect();
    let mut reasons_before = BTreeMap::new();
    for claim in &names {
        reasons_before.insert(claim.clone(), event_reasons(&admin, claim).await?);
    }
    let hashes_before: Vec<Option<String>> = fleet.iter().map(class_hash).collect();
    eprintln!(
        "fleet of {FLEET} under Karpenter {from} in {fleet_s:.1} s: {before:#?}\n\
         class hashes: {hashes_before:?}"
    );

    // The upgrade: controller down, CRDs, controller up.
    let t_upgrade = Instant::now();
    let changed = cluster.upgrade_karpenter(to, &[]).await?;
    let upgrade_s = t_upgrade.elapsed().as_secs_f64();
    eprintln!(
        "Karpenter {from} → {}: {upgrade_s:.1} s; CRDs changed: {changed:?}",
        cluster.karpenter.release()
    );
    assert_eq!(cluster.karpenter.release(), to);
    assert!(
        !changed.is_empty(),
        "the upgrade changed no CRD: {from} and {to} have the same schema, so this \
         test would not be testing an upgrade"
    );

    // The settle window: every look counts what drifted, went or came.
    let mut drifted: BTreeSet<String> = BTreeSet::new();
    let mut replaced: BTreeSet<String> = BTreeSet::new();
    let mut appeared: BTreeSet<String> = BTreeSet::new();
    let mut looks = 0;
    let t_settle = Instant::now();
    while t_settle.elapsed() < SETTLE {
        cluster.karpenter.check_alive()?;
        let claims = list_nodeclaims(&admin).await?;
        looks += 1;
        let now: BTreeMap<String, &DynamicObject> = claims
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
            .collect();
        for (name, was) in &before {
            match now.get(name) {
                None => {
                    replaced.insert(name.clone());
                }
                Some(c) => {
                    if c.metadata.deletion_timestamp.is_some() || identity(c) != *was {
                        replaced.insert(name.clone());
                    }
                    if is_true(c, "Drifted") && drifted.insert(name.clone()) {
                        eprintln!("Drifted after the upgrade: {:#}", c.data["status"]);
                    }
                }
            }
        }
        for name in now.keys().filter(|n| !before.contains_key(*n)) {
            appeared.insert(name.clone());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "settle window {:.0} s, {looks} looks: drifted {drifted:?}, replaced {replaced:?}, \
         new NodeClaims {appeared:?}",
        SETTLE.as_secs_f64()
    );

    // autonode's record on every NodeClaim, as before.
    let claims = list_nodeclaims(&admin).await?;
    for claim in &names {
        let c = claims
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(claim.as_str()))
            .with_context(|| format!("NodeClaim {claim} is gone"))?;
        let ours = condition(c, AUTONODE_CONDITION);
        assert!(
            ours.is_some_and(|o| o["status"] == "True" && o["reason"] == "NodeReady"),
            "{claim}: {AUTONODE_CONDITION} after the upgrade: {:#}",
            c.data["status"]
        );
        for t in ["Launched", "Registered", "Initialized", "Ready"] {
            assert!(is_true(c, t), "{claim}: {t}: {:#}", c.data["status"]);
        }
        let reasons = event_reasons(&admin, claim).await?;
        for reason in ["Attested", "NodeRegistered", "NodeReady"] {
            assert!(
                reasons.iter().any(|r| r == reason),
                "{claim}: {reason} gone: {reasons:?}"
            );
        }
        for reason in &reasons_before[claim] {
            assert!(
                reasons.contains(reason),
                "{claim}: the {reason} Event went with the upgrade: {reasons:?}"
            );
        }
    }
    let hashes_after: Vec<Option<String>> = claims.iter().map(class_hash).collect();
    eprintln!("class hashes after: {hashes_after:?}");

    // A new pod's machine, launched by the new Karpenter, joins.
    let t0 = Instant::now();
    create_pod(&admin, "after-the-upgrade", own_machine()).await?;
    let journey = follow_pod(&cluster, "after-the-upgrade", &names, t0).await?;
    wait_autonode_condition(&cluster, &journey.claim, "True", "NodeReady").await?;
    let new_join_s = t0.elapsed().as_secs_f64();
    let machine = cluster
        .launcher
        .machines()
        .into_values()
        .find(|m| m.node_name == journey.node)
        .context("no machine for the new node")?;
    assert_eq!(
        machine.agent.as_ref().and_then(|a| a.code),
        Some(0),
        "{machine:#?}"
    );

    // A machine whose join is refused for good: deleted by autonode, and
    // the new Karpenter replaces it.
    let mut existing = names.clone();
    existing.push(journey.claim.clone());
    let refused = flawed_machine_replaced_in(
        &cluster,
        Flaw::SignedForAnotherImage,
        ("JoinRefused", "but the document says"),
        &existing,
        own_machine(),
    )
    .await?;
    assert_eq!(refused.agent_code, Some(2), "a refused agent exits 2");

    // And the fleet from before is still the fleet from before.
    let claims = list_nodeclaims(&admin).await?;
    for (name, was) in &before {
        let still = claims
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name.as_str()))
            .map(identity);
        if still.as_ref() != Some(was) {
            replaced.insert(name.clone());
        }
        if claims
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some(name.as_str()) && is_true(c, "Drifted"))
        {
            drifted.insert(name.clone());
        }
    }
    eprintln!(
        "Karpenter {from} → {to}: drifted {}, replaced {}, NodeClaims the upgrade made {}; \
         new machine joined {new_join_s:.1} s after its pod; refused machine's NodeClaim \
         deleted {:.1} s, replaced {:.1} s after its agent exited",
        drifted.len(),
        replaced.len(),
        appeared.len(),
        refused.deleted_s,
        refused.replaced_s,
    );
    if !(drifted.is_empty() && replaced.is_empty() && appeared.is_empty()) {
        bail!(
            "the upgrade from Karpenter {from} to {to} disturbed the fleet: drifted \
             {drifted:?}, replaced {replaced:?}, new NodeClaims before any new pod {appeared:?}"
        );
    }
    record(
        &cluster,
        json!({
            "upgrade": {
                "from": from.to_string(),
                "to": to.to_string(),
                "fleet": FLEET,
                "fleet_joined_s": round(fleet_s),
                "upgrade_s": round(upgrade_s),
                "crds_changed": changed,
                "settle_window_s": SETTLE.as_secs(),
                "drifted": drifted.len(),
                "replaced": replaced.len(),
                "new_join_s": round(new_join_s),
                "new_join_steps_s": {
                    "nodeclaim": round(journey.claim_s),
                    "launched": round(journey.launched_s),
                    "node_registered": round(journey.registered_s),
                    "initialized": round(journey.initialized_s),
                    "pod_bound": round(journey.bound_s),
                },
                "refused_nodeclaim_deleted_s": round(refused.deleted_s),
                "refused_replaced_s": round(refused.replaced_s),
            },
        }),
    )
}

/// The class hash Karpenter stamped on a NodeClaim.
fn class_hash(claim: &DynamicObject) -> Option<String> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(CLASS_HASH)
        .cloned()
}
