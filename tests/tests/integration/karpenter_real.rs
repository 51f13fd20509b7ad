//! The real Karpenter (the AWS provider's controller, `tests/setup/build-karpenter`)
//! against a real control plane with kube-scheduler, launching into moto
//! (`tests/setup/install-moto`), a third-party EC2.
//!
//! Needs a Kubernetes the Karpenter under test declares it supports
//! (`tests/setup/build-karpenter --kube-range`; `tests/run --karpenter`
//! chooses one): the harness refuses any other.

use anyhow::{bail, Context, Result};
use autonode_server::ec2::{
    Credentials, Ec2Client, Ec2Settings, InstanceState, LookupError, LookupRetries,
};
use autonode_tests::cloud::moto::{Moto, MotoInstance, AMD64_AMI, INSTANCE_TYPE, REGION, ZONE};
use autonode_tests::fleet::cluster::{
    create_class, create_pending_pod, create_pod, create_pool, CLASS, LAUNCH_TIMEOUT, POOL,
};
use autonode_tests::fleet::journey::follow_claim;
use autonode_tests::harness::pki::Ca;
use autonode_tests::karpenter::real::{
    check_supports, current, install_karpenter_crds, module_dir, pinned, under_test,
    KarpenterController, Release,
};
use autonode_tests::karpenter::standin::{ec2nodeclasses, nodeclaims};
use autonode_tests::kube::controlplane::ControlPlane;
use autonode_tests::kube::events::{event_reasons, events_of};
use autonode_tests::machines::launcher::Flaw;
use autonode_tests::server;
use kube::api::ListParams;
use serde_json::json;
use std::time::{Duration, Instant};

use autonode_tests::cloud::moto::MOTO_VERSION;
use autonode_tests::fleet::cluster::{
    condition, is_ready, karpenter_finished_with, list_nodeclaims, KarpenterCluster, CLUSTER_NAME,
    POD,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;

#[tokio::test(flavor = "multi_thread")]
async fn a_pending_pod_makes_karpenter_launch_an_instance_with_the_classes_user_data_verbatim(
) -> Result<()> {
    let cp = ControlPlane::start_for_karpenter().await?;
    check_supports(under_test()?, cp.version())?;
    install_karpenter_crds(&cp).await?;
    let moto = Moto::start().await?;
    moto.seed().await?;
    let started = Instant::now();
    let karpenter = KarpenterController::start(&cp, &moto).await?;
    eprintln!(
        "Karpenter ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let client = cp.admin().await?;
    let (user_data, _ca_dir) = rendered_user_data()?;
    let t_class = Instant::now();
    create_class(&client, &user_data).await?;
    create_pool(&client).await?;
    // Karpenter launches only from a Ready class: its AMIs, subnets and
    // security groups resolved in moto, its launch validated there.
    wait_for(&karpenter, "Ready EC2NodeClass", || async {
        let class = ec2nodeclasses(&client).get(CLASS).await?;
        let ready = class.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        Ok(ready.then_some(()))
    })
    .await?;
    eprintln!(
        "EC2NodeClass Ready in {:.1} s",
        t_class.elapsed().as_secs_f64()
    );

    let t0 = Instant::now();
    create_pending_pod(&client).await?;

    // The pod → NodeClaim → CreateFleet path, each step timed.
    let claim = wait_for(&karpenter, "a NodeClaim for the pending pod", || async {
        let list = nodeclaims(&client).list(&ListParams::default()).await?;
        Ok(list.items.into_iter().next())
    })
    .await?;
    let claim_s = t0.elapsed().as_secs_f64();
    let claim_name = claim
        .metadata
        .name
        .clone()
        .context("NodeClaim without a name")?;
    let provider_id = wait_for(&karpenter, "the NodeClaim's providerID", || async {
        let claim = nodeclaims(&client).get(&claim_name).await?;
        Ok(claim.data["status"]["providerID"]
            .as_str()
            .filter(|id| !id.is_empty())
            .map(str::to_string))
    })
    .await?;
    let launched_s = t0.elapsed().as_secs_f64();
    eprintln!(
        "pending pod → NodeClaim {claim_name}: {claim_s:.1} s; → launched ({provider_id}): {launched_s:.1} s"
    );

    // What moto holds is what Karpenter asked EC2 for.
    let instances = moto.instances().await?;
    let [instance]: [MotoInstance; 1] = instances
        .try_into()
        .map_err(|all: Vec<MotoInstance>| anyhow::anyhow!("not one instance in moto: {all:?}"))?;
    assert!(moto.fleets().await? >= 1, "no CreateFleet reached moto");
    assert_eq!(provider_id, format!("aws:///{ZONE}/{}", instance.id));
    assert_eq!(instance.instance_type, INSTANCE_TYPE);
    assert_eq!(instance.image_id, AMD64_AMI);
    assert_eq!(
        instance
            .tags
            .get("karpenter.sh/nodepool")
            .map(String::as_str),
        Some(POOL),
        "tags: {:?}",
        instance.tags
    );
    let on_instance = moto
        .user_data(&instance.id)
        .await?
        .context("the instance has no userData")?;
    assert!(
        on_instance == user_data.as_bytes(),
        "the instance's userData differs from the class's:\n--- class ---\n{user_data}\n--- instance ---\n{}",
        String::from_utf8_lossy(&on_instance)
    );
    Ok(())
}

/// What `autonode-server render-userdata` prints for a test cluster, and
/// the directory holding the join CA it names (kept until the test ends).
fn rendered_user_data() -> Result<(String, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let ca_file = dir.path().join("join-ca.pem");
    std::fs::write(&ca_file, Ca::new("autonode-join-ca")?.cert_pem())?;
    let output = std::process::Command::new(server::binary("autonode-server")?)
        .arg("render-userdata")
        .arg("--public-url=https://autonode.example.com:8443")
        .arg(format!("--join-ca-file={}", ca_file.display()))
        .arg("--cluster-name=autonode-test")
        .output()?;
    if !output.status.success() {
        bail!(
            "render-userdata: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok((String::from_utf8(output.stdout)?, dir))
}

/// Polls `probe` until it yields a value, failing with Karpenter's log if
/// it has exited or [`LAUNCH_TIMEOUT`] passes.
async fn wait_for<T, F, Fut>(karpenter: &KarpenterController, what: &str, probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let every = Duration::from_millis(250);
    karpenter.wait_for(what, LAUNCH_TIMEOUT, every, probe).await
}

/// autonode-server's EC2 client (the join's DescribeInstances) reads from
/// moto what it reads from EC2: the same moto the real Karpenter launches
/// into can answer the server in the scenarios.
#[tokio::test]
async fn the_servers_ec2_lookup_reads_a_moto_instance_as_moto_describes_it() -> Result<()> {
    let moto = Moto::start().await?;
    let seeded = moto.seed().await?;
    let id = moto
        .run_instance(
            &seeded,
            AMD64_AMI,
            ("karpenter.sh/nodeclaim", "autonode-abcde"),
        )
        .await?;
    let client = Ec2Client::with_credentials(
        Ec2Settings {
            endpoint: Some(moto.url().to_string()),
            timeout: Duration::from_secs(10),
            retry: LookupRetries::default(),
        },
        Credentials::new(
            "AKIAAUTONODETEST0000",
            "autonode-test-secret",
            None,
            None,
            "test",
        ),
    )?;
    let [described]: [MotoInstance; 1] = moto
        .instances()
        .await?
        .try_into()
        .map_err(|all: Vec<MotoInstance>| anyhow::anyhow!("not one instance in moto: {all:?}"))?;

    let seen = client.describe(REGION, &id).await?;
    assert_eq!(seen.instance_id, id);
    assert_eq!(seen.state, InstanceState::Running);
    assert_eq!(seen.image_id, AMD64_AMI);
    assert_eq!(seen.instance_type, INSTANCE_TYPE);
    assert_eq!(seen.availability_zone, ZONE);
    assert_eq!(seen.architecture, "x86_64");
    assert!(!described.private_dns_name.is_empty(), "{described:?}");
    assert_eq!(seen.private_dns_name, described.private_dns_name);
    assert_eq!(
        seen.private_ips.first().map(ToString::to_string),
        Some(described.private_ip.clone())
    );
    assert_eq!(
        seen.tags.get("karpenter.sh/nodeclaim").map(String::as_str),
        Some("autonode-abcde")
    );

    // A batch (`ec2::Batched`): moto, as EC2, describes every instance
    // asked for, each under its own ID, and fails the whole call for one ID
    // it does not know; the batcher counts on both.
    let second = moto
        .run_instance(
            &seeded,
            AMD64_AMI,
            ("karpenter.sh/nodeclaim", "autonode-fghij"),
        )
        .await?;
    let both = client.describe_many(REGION, &[&id, &second]).await?;
    let mut ids: Vec<&str> = both.iter().map(|i| i.instance_id.as_str()).collect();
    ids.sort_unstable();
    let mut asked = [id.as_str(), second.as_str()];
    asked.sort_unstable();
    assert_eq!(ids, asked);
    let unknown = "i-0123456789abcdef0";
    let failed = client.describe_many(REGION, &[&id, unknown]).await;
    assert!(
        matches!(failed, Err(LookupError::NotFound { .. })),
        "{failed:?}"
    );

    // A terminated instance must read as terminated: the server refuses
    // its joins and renewals on that.
    moto.terminate(&id).await?;
    let gone = client.describe(REGION, &id).await?;
    assert_eq!(gone.state, InstanceState::Terminated);
    Ok(())
}

/// autonode's condition type on NodeClaims.
pub(crate) const AUTONODE_CONDITION: &str = "AutonodeBootstrapped";

/// The user the server's writes come as (its ServiceAccount).
const SERVER_USER: &str = "system:serviceaccount:autonode-system:autonode-server";

/// Karpenter's annotation of an EC2NodeClass's (and a NodeClaim's) hash,
/// which its static drift check compares.
pub(crate) const CLASS_HASH: &str = "karpenter.k8s.aws/ec2nodeclass-hash";

/// How a pending pod became a node, each step timed from the pod's creation.
#[derive(Debug)]
pub(crate) struct Journey {
    pub(crate) claim: String,
    pub(crate) node: String,
    pub(crate) claim_s: f64,
    pub(crate) launched_s: f64,
    pub(crate) registered_s: f64,
    pub(crate) initialized_s: f64,
    pub(crate) bound_s: f64,
}

/// Follows the pending pod created at `t0` through a NodeClaim not in
/// `skip`: Karpenter launches it, the machine's agent joins, the Node
/// registers, Karpenter marks it Launched, Registered and Initialized, and
/// kube-scheduler binds the pod to it.
pub(crate) async fn follow(
    cluster: &KarpenterCluster,
    skip: &[String],
    t0: Instant,
) -> Result<Journey> {
    follow_pod(cluster, POD, skip, t0).await
}

/// [`follow`] for the pending pod `pod` (in `default`).
pub(crate) async fn follow_pod(
    cluster: &KarpenterCluster,
    pod: &str,
    skip: &[String],
    t0: Instant,
) -> Result<Journey> {
    let admin = cluster.cp.admin().await?;
    let claim = cluster
        .wait_for(
            "a NodeClaim for the pending pod",
            LAUNCH_TIMEOUT,
            || async {
                let all = list_nodeclaims(&admin).await?;
                Ok(all
                    .into_iter()
                    .filter_map(|c| c.metadata.name)
                    .find(|name| !skip.contains(name)))
            },
        )
        .await?;
    let claim_s = t0.elapsed().as_secs_f64();
    let followed = follow_claim(cluster, &claim).await?;
    let initialized_s = t0.elapsed().as_secs_f64();
    let launched_s = followed.launched.duration_since(t0).as_secs_f64();
    let registered_s = followed.registered.duration_since(t0).as_secs_f64();
    let machine = followed.machine;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    cluster
        .wait_for("the pod bound to the node", LAUNCH_TIMEOUT, || async {
            let pod = pods.get(pod).await?;
            let bound = pod.spec.and_then(|s| s.node_name);
            Ok(bound.filter(|n| *n == machine.node_name).map(drop))
        })
        .await?;
    let journey = Journey {
        claim,
        node: machine.node_name,
        claim_s,
        launched_s,
        registered_s,
        initialized_s,
        bound_s: t0.elapsed().as_secs_f64(),
    };
    eprintln!("{journey:#?}");
    Ok(journey)
}

/// A cluster whose server runs with `server_args`, its class and pool,
/// and a pending pod followed to its node ([`follow`]).
async fn pending_pod_to_node(server_args: &[String]) -> Result<(KarpenterCluster, Journey)> {
    let cluster = KarpenterCluster::start(server_args).await?;
    cluster.create_class_and_pool().await?;
    let t0 = Instant::now();
    create_pending_pod(&cluster.cp.admin().await?).await?;
    let journey = follow(&cluster, &[], t0).await?;
    Ok((cluster, journey))
}

/// Merges `entries` and the versions they ran with into
/// `target/bench/karpenter.json`.
pub(crate) fn record(cluster: &KarpenterCluster, entries: serde_json::Value) -> Result<()> {
    let mut all = match entries {
        serde_json::Value::Object(map) => map,
        other => bail!("not an object: {other}"),
    };
    all.insert(
        "karpenter_version".into(),
        cluster.karpenter.release().to_string().into(),
    );
    all.insert("moto_version".into(), MOTO_VERSION.into());
    all.insert(
        "kubernetes_version".into(),
        cluster.cp.version().to_string().into(),
    );
    let path = autonode_tests::harness::bench::merge("karpenter.json", all)?;
    eprintln!("recorded in {}", path.display());
    Ok(())
}

/// Waits for autonode's condition on `claim` to be `status`/`reason`.
pub(crate) async fn wait_autonode_condition(
    cluster: &KarpenterCluster,
    claim: &str,
    status: &str,
    reason: &str,
) -> Result<()> {
    let claims = nodeclaims(&cluster.cp.admin().await?);
    cluster
        .wait_for(
            &format!("{AUTONODE_CONDITION}={status}/{reason} on {claim}"),
            Duration::from_secs(60),
            || async {
                let c = claims.get(claim).await?;
                let ours = condition(&c, AUTONODE_CONDITION);
                Ok(ours
                    .is_some_and(|c| c["status"] == status && c["reason"] == reason)
                    .then_some(()))
            },
        )
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pending_pod_becomes_a_node_that_karpenter_initializes_and_the_pod_is_bound_to_it(
) -> Result<()> {
    let (cluster, journey) = pending_pod_to_node(&[]).await?;
    let admin = cluster.cp.admin().await?;

    // Karpenter took the Node for its NodeClaim's and finished with it:
    // its taint gone, its labels on.
    let node = Api::<Node>::all(admin.clone()).get(&journey.node).await?;
    karpenter_finished_with(&node)?;
    let claim = nodeclaims(&admin).get(&journey.claim).await?;
    assert_eq!(claim.data["status"]["nodeName"], journey.node.as_str());
    // And autonode told its own story on the same NodeClaim.
    wait_autonode_condition(&cluster, &journey.claim, "True", "NodeReady").await?;
    let reasons = event_reasons(&admin, &journey.claim).await?;
    for reason in ["Attested", "NodeRegistered", "NodeReady"] {
        assert!(reasons.iter().any(|r| r == reason), "{reasons:?}");
    }
    record(
        &cluster,
        serde_json::json!({
            "pending_to_ready_s": round(journey.initialized_s),
            "pending_to_ready_steps_s": {
                "nodeclaim": round(journey.claim_s),
                "launched": round(journey.launched_s),
                "node_registered": round(journey.registered_s),
                "initialized": round(journey.initialized_s),
                "pod_bound": round(journey.bound_s),
            },
            "pending_to_ready_kubelet": "stand-in (the harness registers the Node Ready)",
        }),
    )
}

pub(crate) fn round(seconds: f64) -> f64 {
    (seconds * 10.0).round() / 10.0
}

/// The server's and everyone else's writes to `claim`'s status, from the
/// API server's audit log: (user, HTTP code, whether the object written
/// back carries autonode's condition).
fn status_writes(cluster: &KarpenterCluster, claim: &str) -> Result<Vec<(String, i64, bool)>> {
    let events = cluster.cp.audit_events()?;
    Ok(events
        .iter()
        .filter(|e| {
            e["objectRef"]["name"] == claim
                && e["objectRef"]["subresource"] == "status"
                && e["stage"] == "ResponseComplete"
        })
        .map(|e| {
            let user = e["user"]["username"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let code = e["responseStatus"]["code"].as_i64().unwrap_or_default();
            let ours = e["responseObject"]["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == AUTONODE_CONDITION);
            (user, code, ours)
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn autonodes_condition_and_events_survive_karpenters_status_writes_without_a_write_storm(
) -> Result<()> {
    let (cluster, journey) = pending_pod_to_node(&[]).await?;
    let admin = cluster.cp.admin().await?;
    wait_autonode_condition(&cluster, &journey.claim, "True", "NodeReady").await?;

    // Every write to the NodeClaim's status, in order. A write of
    // Karpenter's that leaves our condition out after the server had put
    // it there dropped it; the server must put it back, each time.
    let writes = status_writes(&cluster, &journey.claim)?;
    let mut present = false;
    let (mut dropped, mut restored) = (0, 0);
    for (user, code, ours) in &writes {
        if *code != 200 {
            continue;
        }
        if present && !ours {
            dropped += 1;
        }
        if !present && *ours && user == SERVER_USER && dropped > restored {
            restored += 1;
        }
        present = *ours;
    }
    let server_writes: Vec<_> = writes.iter().filter(|(u, _, _)| u == SERVER_USER).collect();
    let server_ok = server_writes.iter().filter(|(_, c, _)| *c == 200).count();
    let karpenter_writes = writes.len() - server_writes.len();
    eprintln!(
        "status writes: server {} ({server_ok} applied), others {karpenter_writes}; \
         ours dropped {dropped} times, put back {restored}:\n{writes:#?}",
        server_writes.len()
    );
    assert!(present, "the last write left our condition out");
    assert_eq!(dropped, restored, "a drop was not put back: {writes:#?}");
    // One write per stage (attested, registered, ready), one per drop, and
    // a conflict's retry each: anything more is a storm.
    let bound = 3 + 2 * dropped + 3;
    assert!(
        server_writes.len() <= bound,
        "{} server writes (bound {bound}): {writes:#?}",
        server_writes.len()
    );

    // Karpenter's own conditions are all still there beside ours.
    let claim = nodeclaims(&admin).get(&journey.claim).await?;
    for t in ["Launched", "Registered", "Initialized", "Ready"] {
        assert!(
            condition(&claim, t).is_some_and(|c| c["status"] == "True"),
            "{t}: {:#}",
            claim.data["status"]
        );
    }
    let reasons = event_reasons(&admin, &journey.claim).await?;
    for reason in ["Attested", "AgentProgress", "NodeRegistered", "NodeReady"] {
        assert!(reasons.iter().any(|r| r == reason), "{reasons:?}");
    }
    record(
        &cluster,
        serde_json::json!({
            "status_writes": {
                "server": server_writes.len(),
                "others": karpenter_writes,
                "autonode_condition_dropped": dropped,
                "autonode_condition_restored": restored,
            },
        }),
    )
}

/// Karpenter's own registration timeout (`lifecycle/liveness.go`): how
/// long a machine that never registers holds its NodeClaim without autonode.
const KARPENTER_REGISTRATION_TIMEOUT_S: f64 = 900.0;

#[tokio::test(flavor = "multi_thread")]
async fn a_machine_whose_agent_fails_for_good_is_replaced_in_seconds_not_after_fifteen_minutes(
) -> Result<()> {
    // The first machine's image cannot start kubelet: its agent joins,
    // then fails for good and says so, signed with its new key.
    let (cluster, replaced) = flawed_machine_replaced(
        Flaw::KubeletWontStart,
        ("BootstrapFailed", "starting kubelet"),
    )
    .await?;
    record(
        &cluster,
        serde_json::json!({
            "failed_join_replaced_s": round(replaced.replaced_s),
            "failed_join_nodeclaim_deleted_s": round(replaced.deleted_s),
            "karpenter_registration_timeout_s": KARPENTER_REGISTRATION_TIMEOUT_S,
        }),
    )
}

/// The README's promise: a refusal that dooms the machine deletes its
/// NodeClaim, so Karpenter replaces it at once. The first machine's signed
/// document names another image than the one EC2 says it runs: its join
/// is refused for good before anything is bound.
#[tokio::test(flavor = "multi_thread")]
async fn a_machine_whose_join_is_refused_for_good_is_replaced_in_seconds_with_the_reason_on_its_nodeclaim(
) -> Result<()> {
    let (cluster, replaced) = flawed_machine_replaced(
        Flaw::SignedForAnotherImage,
        ("JoinRefused", "but the document says"),
    )
    .await?;
    assert_eq!(replaced.agent_code, Some(2), "a refused agent exits 2");
    record(
        &cluster,
        serde_json::json!({
            "refused_join_replaced_s": round(replaced.replaced_s),
            "refused_join_nodeclaim_deleted_s": round(replaced.deleted_s),
        }),
    )
}

/// A cluster whose first machine has `flaw`, its class and pool, and a
/// pending pod; with an admin client.
async fn flawed_first(flaw: Flaw) -> Result<(KarpenterCluster, kube::Client)> {
    let cluster = KarpenterCluster::start(&[]).await?;
    let admin = cluster.cp.admin().await?;
    cluster.launcher.flaw_next(flaw, 1);
    cluster.create_class_and_pool().await?;
    create_pending_pod(&admin).await?;
    Ok((cluster, admin))
}

/// How a flawed machine's NodeClaim went, timed from its agent's exit.
pub(crate) struct Replaced {
    pub(crate) deleted_s: f64,
    pub(crate) replaced_s: f64,
    pub(crate) agent_code: Option<i32>,
}

/// The first machine Karpenter launches has `flaw`: its agent fails, the
/// server deletes its NodeClaim with an Event `reason` whose message holds
/// `says`, Karpenter terminates it and launches another, which joins and
/// takes the pod, within a minute (Karpenter alone waits 15).
async fn flawed_machine_replaced(
    flaw: Flaw,
    says: (&str, &str),
) -> Result<(KarpenterCluster, Replaced)> {
    let cluster = KarpenterCluster::start(&[]).await?;
    cluster.create_class_and_pool().await?;
    let replaced = flawed_machine_replaced_in(&cluster, flaw, says, &[], json!({})).await?;
    Ok((cluster, replaced))
}

/// [`flawed_machine_replaced`] in a running `cluster` whose NodeClaims
/// `existing` stay out of it: the next machine has `flaw`, and the pending
/// pod ([`POD`], with `pod_spec`'s keys) is what Karpenter launches it
/// for.
pub(crate) async fn flawed_machine_replaced_in(
    cluster: &KarpenterCluster,
    flaw: Flaw,
    (reason, says): (&str, &str),
    existing: &[String],
    pod_spec: serde_json::Value,
) -> Result<Replaced> {
    let admin = cluster.cp.admin().await?;
    cluster.launcher.flaw_next(flaw, 1);
    create_pod(&admin, POD, pod_spec).await?;
    let claims = nodeclaims(&admin);

    let (failed_claim, failed) = cluster
        .wait_for(
            "the flawed machine's agent to fail",
            LAUNCH_TIMEOUT,
            || async {
                // The flawed machine whose NodeClaim is still there: an
                // earlier round's flawed machine is stopped, its claim gone.
                let all = list_nodeclaims(&admin).await?;
                let flawed = cluster
                    .launcher
                    .machines()
                    .into_values()
                    .filter(|m| m.broken);
                for machine in flawed {
                    let claim = all.iter().find(|c| {
                        c.data["status"]["providerID"]
                            .as_str()
                            .is_some_and(|p| p.ends_with(&machine.instance_id))
                    });
                    let Some(name) = claim.and_then(|c| c.metadata.name.clone()) else {
                        continue;
                    };
                    if let Some(error) = &machine.error {
                        bail!("machine {}: {error}", machine.instance_id);
                    }
                    if machine.agent.is_some() {
                        return Ok(Some((name, machine)));
                    }
                }
                Ok(None)
            },
        )
        .await?;
    let agent = failed.agent.clone().context("the agent ran")?;
    assert_ne!(agent.code, Some(0), "{agent:#?}");
    assert!(failed.registered.is_none(), "{failed:#?}");

    // The server deletes the NodeClaim; Karpenter terminates the instance
    // (the machine stops) and launches another for the pod.
    gone(cluster, &claims, &failed_claim, Duration::from_secs(120)).await?;
    let deleted_s = agent.at.elapsed().as_secs_f64();
    let replacement = cluster
        .wait_for(
            "a replacement NodeClaim",
            Duration::from_secs(120),
            || async {
                let all = list_nodeclaims(&admin).await?;
                Ok(all
                    .into_iter()
                    .filter_map(|c| c.metadata.name)
                    .find(|n| *n != failed_claim && !existing.contains(n)))
            },
        )
        .await?;
    let replaced_s = agent.at.elapsed().as_secs_f64();
    eprintln!(
        "agent failed → NodeClaim {failed_claim} deleted {deleted_s:.1} s, → {replacement} created {replaced_s:.1} s"
    );
    machine_stopped(cluster, &failed.instance_id).await?;

    // The reason is on the NodeClaim's record for whoever looks.
    let messages: Vec<String> = events_of(&admin, &failed_claim)
        .await?
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message)
        .collect();
    assert!(
        messages.iter().any(|m| m.contains(says)),
        "a {reason} Event says {says:?}: {messages:?}"
    );

    // The replacement, on a working image, joins and takes the pod.
    let t0 = Instant::now();
    let mut skip = existing.to_vec();
    skip.push(failed_claim.clone());
    let journey = follow(cluster, &skip, t0).await?;
    assert_eq!(journey.claim, replacement);
    assert!(
        replaced_s < 60.0,
        "replaced after {replaced_s:.1} s (Karpenter alone: {KARPENTER_REGISTRATION_TIMEOUT_S} s)"
    );
    Ok(Replaced {
        deleted_s,
        replaced_s,
        agent_code: agent.code,
    })
}

/// Waits up to `timeout` for object `name` of `api` to be gone (for a
/// NodeClaim: Karpenter's finalizer done, the instance terminated and its
/// Nodes deleted).
async fn gone<K>(
    cluster: &KarpenterCluster,
    api: &Api<K>,
    name: &str,
    timeout: Duration,
) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    cluster
        .wait_for(&format!("{name} gone"), timeout, || async {
            Ok(api.get_opt(name).await?.is_none().then_some(()))
        })
        .await
}

/// Waits for the launcher to have stopped `instance_id`'s machine (its
/// instance terminated).
async fn machine_stopped(cluster: &KarpenterCluster, instance_id: &str) -> Result<()> {
    cluster
        .wait_for(
            &format!("machine {instance_id} stopped"),
            Duration::from_secs(120),
            || async {
                let machine = cluster.launcher.machine(instance_id);
                Ok(machine.and_then(|m| m.stopped).map(drop))
            },
        )
        .await
}

/// The server's metric `name` (0 when it has not been set yet).
async fn server_metric(server: &server::TestServer, name: &str) -> Result<f64> {
    let metrics = server::http_get(&format!("{}/metrics", server.metrics_url()))
        .await?
        .1;
    let prefix = format!("{name} ");
    Ok(metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str())?.trim().parse().ok())
        .unwrap_or(0.0))
}

/// Waits for `server`'s upkeep to have compared the class, then for
/// Karpenter to have hashed the class as it now is; returns how many
/// NodeClaims are `Drifted`, after checking that each carries the class's
/// hash (no static drift possible).
async fn drifted_after_upkeep(
    cluster: &KarpenterCluster,
    server: &server::TestServer,
) -> Result<usize> {
    cluster
        .wait_for(
            "the upkeep's check of the class",
            Duration::from_secs(60),
            || async {
                let checks = server_metric(server, "autonode_nodeclass_checks_total").await?;
                Ok((checks >= 1.0).then_some(()))
            },
        )
        .await?;
    let admin = cluster.cp.admin().await?;
    let class = cluster
        .wait_for(
            "Karpenter's view of the class now",
            Duration::from_secs(60),
            || async {
                let class = ec2nodeclasses(&admin).get(CLASS).await?;
                let generation = class.metadata.generation;
                let seen = condition(&class, "Ready")
                    .and_then(|c| c["observedGeneration"].as_i64())
                    .is_some_and(|g| Some(g) == generation);
                Ok(seen.then_some(class))
            },
        )
        .await?;
    let class_hash = class
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CLASS_HASH))
        .cloned()
        .context("Karpenter has not hashed the class")?;
    let claims = list_nodeclaims(&admin).await?;
    let mut drifted = 0;
    for claim in &claims {
        let hash = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CLASS_HASH));
        assert_eq!(
            hash,
            Some(&class_hash),
            "NodeClaim {:?} was launched from another class spec",
            claim.metadata.name
        );
        if condition(claim, "Drifted").is_some_and(|c| c["status"] == "True") {
            eprintln!(
                "Drifted: {:#}\nclass's groups: {:#}\nmoto: {:#?}",
                claim.data["status"],
                class.data["status"]["securityGroups"],
                cluster.moto.instances().await?
            );
            drifted += 1;
        }
    }
    Ok(drifted)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_no_op_upkeep_drifts_no_nodeclaim_on_its_first_reconcile_nor_after_a_restart(
) -> Result<()> {
    // The operator's class, userData from render-userdata, kept by no one:
    // Karpenter launches from it and the machine joins.
    let (cluster, journey) = pending_pod_to_node(&["--manage-nodeclasses=false".into()]).await?;
    let admin = cluster.cp.admin().await?;
    let rendered = cluster.rendered_user_data()?;

    // Then the server is upgraded to one that keeps the class: its first
    // reconcile finds a class Karpenter already launched from.
    cluster.server.kill();
    let mut args = cluster.upkeep_args();
    args.push("--leader-lease=3".into());
    let upkeep = cluster.start_server(&args).await?;
    let first = drifted_after_upkeep(&cluster, &upkeep).await?;
    let writes = server_metric(&upkeep, "autonode_nodeclass_writes_total").await?;

    // And restarted.
    upkeep.restart().await?;
    let restarted = drifted_after_upkeep(&cluster, &upkeep).await?;

    let class = ec2nodeclasses(&admin).get(CLASS).await?;
    assert_eq!(class.data["spec"]["userData"], rendered.as_str());
    let claim = nodeclaims(&admin).get(&journey.claim).await?;
    assert!(is_ready(&claim), "{:#}", claim.data["status"]);
    eprintln!(
        "drifted after the first reconcile: {first}; after a restart: {restarted}; \
         class writes by the upkeep: {writes}; cluster {CLUSTER_NAME}"
    );
    assert_eq!(first + restarted, 0, "a no-op upkeep drifted NodeClaims");
    record(
        &cluster,
        serde_json::json!({
            "drifted_by_noop_upkeep": first + restarted,
            "noop_upkeep_class_writes": writes,
        }),
    )
}

/// The `NAME = "1.MINOR"` constant of Karpenter's `version.go`.
fn declared(version_go: &str, name: &str) -> Option<String> {
    version_go.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == name).then(|| value.trim().trim_matches('"').to_string())
    })
}

/// The range `release` declares, read from its module's
/// `pkg/providers/version/version.go` (`go mod download` in the harness's
/// module that pins it: the copy go.sum pins, fetched from the proxy
/// unless the module cache has it already).
fn declared_range(release: Release) -> Result<(String, String)> {
    let module = format!("github.com/aws/karpenter-provider-aws@v{release}");
    let download = std::process::Command::new("go")
        .args(["mod", "download", "-json", &module])
        // As tests/setup/build-karpenter: the module asks a newer Go.
        .env("GOTOOLCHAIN", "auto")
        .current_dir(module_dir(release))
        .output()
        .context("go mod download")?;
    let found: serde_json::Value = serde_json::from_slice(&download.stdout)
        .with_context(|| String::from_utf8_lossy(&download.stderr).into_owned())?;
    let dir = found["Dir"]
        .as_str()
        .with_context(|| format!("{module}: {found}"))?;
    let version_go = std::path::Path::new(dir).join("pkg/providers/version/version.go");
    let source =
        std::fs::read_to_string(&version_go).with_context(|| version_go.display().to_string())?;
    Ok((
        declared(&source, "MinK8sVersion").context("no MinK8sVersion")?,
        declared(&source, "MaxK8sVersion").context("no MaxK8sVersion")?,
    ))
}

/// The README's "the versions the pinned Karpenter supports": the oldest
/// and newest Kubernetes pinned under tests/kube/ are the range the current
/// Karpenter declares, so moving Karpenter without moving the range fails
/// here. Every pinned Karpenter (the previous minor too) supports a pinned
/// Kubernetes, so `tests/run --karpenter` always has one to choose; and
/// `tests/setup/build-karpenter --kube-range`, which tests/run chooses by,
/// reads the same range as this test.
#[test]
fn the_pinned_kubernetes_range_is_the_one_the_pinned_karpenter_declares() -> Result<()> {
    let list = std::process::Command::new(
        autonode_tests::machines::vm::repo_root().join("tests/setup/build-kube"),
    )
    .arg("--list")
    .output()
    .context("tests/setup/build-kube --list")?;
    let minors: Vec<String> = String::from_utf8(list.stdout)?
        .lines()
        .filter_map(|v| v.rsplit_once('.').map(|(minor, _)| minor.to_string()))
        .collect();
    let minor_of = |v: &str| v.split('.').nth(1).and_then(|m| m.parse::<u32>().ok());
    let oldest = minors
        .iter()
        .min_by_key(|v| minor_of(v))
        .context("no pinned version")?;
    let newest = minors
        .iter()
        .max_by_key(|v| minor_of(v))
        .context("no pinned version")?;
    let now = current()?;
    let all = pinned()?;
    assert!(
        all.len() >= 2,
        "the current and the previous minor: {all:?}"
    );
    for release in all {
        let (min, max) = declared_range(release)?;
        if release == now {
            assert_eq!(
                (oldest.as_str(), newest.as_str()),
                (min.as_str(), max.as_str()),
                "Karpenter {release} supports {min}–{max}; tests/kube/ pins {minors:?}"
            );
        }
        let (lo, hi) = (minor_of(&min), minor_of(&max));
        assert!(
            minors.iter().any(|v| (lo..=hi).contains(&minor_of(v))),
            "Karpenter {release} supports {min}–{max}, and none of {minors:?} is pinned"
        );
        let script = std::process::Command::new(
            autonode_tests::machines::vm::repo_root().join("tests/setup/build-karpenter"),
        )
        .args(["--kube-range", &release.to_string()])
        .output()
        .context("tests/setup/build-karpenter --kube-range")?;
        assert!(
            script.status.success(),
            "{}",
            String::from_utf8_lossy(&script.stderr)
        );
        assert_eq!(
            String::from_utf8(script.stdout)?.trim(),
            format!("{min} {max}"),
            "Karpenter {release}"
        );
    }
    let sample = "const (\n\tMinK8sVersion = \"1.26\"\n\tMaxK8sVersion = \"1.37\"\n)";
    assert_eq!(declared(sample, "MaxK8sVersion").as_deref(), Some("1.37"));
    Ok(())
}

/// The impostor's Node name: a compromised node's own (NodeRestriction
/// lets a kubelet register only the Node of its name, with any
/// providerID).
const IMPOSTOR: &str = "ip-10-66-6-6.ec2.internal";

/// Security review 4, item 7. A compromised node registers a Node carrying
/// the providerID of a machine Karpenter just launched, before that
/// machine's agent has joined: Karpenter takes the impostor for the
/// NodeClaim's node (copies its labels and taints there, sends its pods).
/// When the machine's agent starts, the server sees the NodeClaim
/// Registered to a Node that is not the machine EC2 names for the
/// instance: refused as `node_spoofed`, reported (a `NodeSpoofed` Event),
/// metered, and the NodeClaim deleted, so Karpenter terminates the machine,
/// deletes the impostor's Node and launches a replacement that joins.
/// Before, the join was refused as `nodeclaim_registered` on every retry
/// and the impostor kept the capacity.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_registered_with_a_booting_machines_provider_id_gets_its_nodeclaim_replaced(
) -> Result<()> {
    let deleted_s = impostor_replaced(Flaw::AgentStartsLate).await?;
    eprintln!(
        "agent started → deletion of the NodeClaim registered to the impostor {deleted_s:.1} s"
    );
    Ok(())
}

/// The same impostor between the machine's join and its kubelet's
/// registration: the NodeClaim is bound, so the leader's feedback
/// controller sees it Registered to a Node other than the one its binding
/// names (EC2's name for the instance), with no join to refuse; it
/// reports, meters and deletes it the same way.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_registered_with_a_joined_machines_provider_id_before_its_kubelet_gets_its_nodeclaim_replaced(
) -> Result<()> {
    let deleted_s = impostor_replaced(Flaw::KubeletStartsLate).await?;
    eprintln!("impostor registered → deletion of its NodeClaim {deleted_s:.1} s");
    Ok(())
}

/// The impostor scenario: the first machine has `flaw` (it waits before
/// its join, or before its kubelet registers); an impostor registers a
/// Node with its providerID, Karpenter takes it, the machine goes on;
/// then the NodeClaim is deleted with a `NodeSpoofed` Event, the metric
/// counts it, Karpenter removes the impostor's Node and the machine, and a
/// replacement joins and takes the pod. Returns the seconds from the
/// machine going on (bound: from Karpenter's registration of the impostor)
/// to the NodeClaim's deletion being asked for (autonode's part).
async fn impostor_replaced(flaw: Flaw) -> Result<f64> {
    let (cluster, admin) = flawed_first(flaw).await?;
    let claims = nodeclaims(&admin);
    let victim = cluster
        .wait_for("a NodeClaim for the pod", LAUNCH_TIMEOUT, || async {
            let all = list_nodeclaims(&admin).await?;
            Ok(all.into_iter().find_map(|c| c.metadata.name))
        })
        .await?;
    let (_, instance_id) = cluster.launched(&victim).await?;
    let instance = cluster
        .wait_for("the machine booted", LAUNCH_TIMEOUT, || async {
            Ok(cluster
                .launcher
                .machine(&instance_id)
                .and_then(|m| m.instance))
        })
        .await?;
    if flaw == Flaw::KubeletStartsLate {
        wait_autonode_condition(&cluster, &victim, "Unknown", "Attested").await?;
    }

    // The attack: the impostor's kubelet credential registers its own Node
    // with the victim's providerID, Ready, as a kubelet would.
    let attacker = cluster
        .cp
        .client_as(&format!("system:node:{IMPOSTOR}"), Some("system:nodes"))
        .await?;
    let mut spoof = autonode_tests::machines::launcher::kubelet_node(&instance);
    spoof.metadata.name = Some(IMPOSTOR.into());
    if let Some(labels) = spoof.metadata.labels.as_mut() {
        labels.insert("kubernetes.io/hostname".into(), IMPOSTOR.into());
    }
    Api::<Node>::all(attacker)
        .create(&kube::api::PostParams::default(), &spoof)
        .await
        .context("NodeRestriction lets a node choose its Node's providerID")?;
    cluster
        .wait_for(
            "Karpenter to register the impostor for the NodeClaim",
            LAUNCH_TIMEOUT,
            || async {
                let c = claims.get_opt(&victim).await?;
                // Bound, the NodeClaim may be gone by the time we look.
                let Some(c) = c else { return Ok(Some(())) };
                let registered = condition(&c, "Registered").is_some_and(|c| c["status"] == "True");
                Ok((registered && c.data["status"]["nodeName"] == IMPOSTOR).then_some(()))
            },
        )
        .await?;

    let t0 = Instant::now();
    cluster.launcher.release_late_machines();
    cluster
        .wait_for(
            "the NodeClaim registered to the impostor being deleted",
            Duration::from_secs(60),
            || async {
                let c = claims.get_opt(&victim).await?;
                Ok(c.is_none_or(|c| c.metadata.deletion_timestamp.is_some())
                    .then_some(()))
            },
        )
        .await?;
    let deleted_s = t0.elapsed().as_secs_f64();
    // Karpenter's termination (the machine, the impostor's Node, drained
    // of pods no kubelet will ever stop) takes longer.
    gone(&cluster, &claims, &victim, Duration::from_secs(300)).await?;
    eprintln!(
        "{flaw:?}: NodeClaim gone {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let spoofed: Vec<String> = events_of(&admin, &victim)
        .await?
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("NodeSpoofed"))
        .filter_map(|e| e.message)
        .collect();
    assert!(
        spoofed
            .iter()
            .any(|m| m.contains(IMPOSTOR) && m.contains(&instance.private_dns_name)),
        "a NodeSpoofed Event names the impostor and the machine: {spoofed:?}"
    );
    let metric = server_metric(&cluster.server, "autonode_spoofed_nodes_total").await?;
    assert!(metric >= 1.0, "autonode_spoofed_nodes_total {metric}");
    // Karpenter removes the impostor's Node with the NodeClaim, and the
    // machine with it.
    let nodes = Api::<Node>::all(admin.clone());
    gone(&cluster, &nodes, IMPOSTOR, Duration::from_secs(120)).await?;
    machine_stopped(&cluster, &instance_id).await?;
    // The pod may have been bound to the impostor: evicted with it, or
    // left bound to a Node that is gone. A bare pod is not made again, as a
    // Deployment's would be: do that here.
    let pods = Api::<Pod>::namespaced(admin.clone(), "default");
    let on_impostor = pods
        .get_opt(POD)
        .await?
        .and_then(|p| p.spec?.node_name)
        .is_some_and(|n| n == IMPOSTOR);
    if on_impostor {
        let now = kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        pods.delete(POD, &now).await?;
        gone(&cluster, &pods, POD, Duration::from_secs(60)).await?;
    }
    if pods.get_opt(POD).await?.is_none() {
        create_pending_pod(&admin).await?;
    }
    // A replacement joins and takes the pod.
    let journey = follow(&cluster, std::slice::from_ref(&victim), t0).await?;
    eprintln!(
        "{flaw:?}: NodeClaim deleted {deleted_s:.1} s, replacement's pod bound {:.1} s",
        journey.bound_s
    );
    let key = match flaw {
        Flaw::AgentStartsLate => "spoofed_before_join_nodeclaim_deleted_s",
        _ => "spoofed_before_kubelet_nodeclaim_deleted_s",
    };
    record(&cluster, serde_json::json!({ key: round(deleted_s) }))?;
    Ok(deleted_s)
}
