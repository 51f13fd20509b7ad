//! The real Karpenter (the AWS provider's controller, `tests/setup/build-karpenter`)
//! against a real control plane with kube-scheduler, launching into moto
//! (`tests/setup/install-moto`), a third-party EC2.
//!
//! Needs Kubernetes 1.26 or later (every pinned version is): Karpenter's
//! status writes fail on older API servers.

use anyhow::{bail, Context, Result};
use autonode_server::ec2::{Credentials, Ec2Client, Ec2Settings, InstanceState, RetryPolicy};
use autonode_tests::controlplane::ControlPlane;
use autonode_tests::karpenter::{ec2nodeclasses, nodeclaims};
use autonode_tests::karpenter_controller::{install_karpenter_crds, KarpenterController};
use autonode_tests::moto::{
    Moto, MotoInstance, AMD64_AMI, DISCOVERY_TAG, INSTANCE_TYPE, REGION, ZONE,
};
use autonode_tests::pki::Ca;
use autonode_tests::server;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::Client;
use serde_json::json;
use std::time::{Duration, Instant};

const CLASS: &str = "autonode";
const POOL: &str = "autonode";

/// How long a launch may take here: Karpenter batches pending pods for a
/// second or more, then resolves the class and calls moto, all on two
/// shared cores.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread")]
async fn a_pending_pod_makes_karpenter_launch_an_instance_with_the_classes_user_data_verbatim(
) -> Result<()> {
    let cp = ControlPlane::start_for_karpenter().await?;
    if !cp.version().at_least(1, 26) {
        bail!(
            "the real Karpenter needs Kubernetes 1.26 or later, this is {}: \
             run a pinned version (tests/run --kube 1.26 or later)",
            cp.version()
        );
    }
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

/// An `amiFamily: Custom` class selecting moto's seeded resources by tag,
/// with an instance profile (no IAM role for Karpenter to resolve).
async fn create_class(client: &Client, user_data: &str) -> Result<()> {
    let by_tag = json!([{"tags": {DISCOVERY_TAG.0: DISCOVERY_TAG.1}}]);
    let class: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": CLASS},
        "spec": {
            "amiFamily": "Custom",
            "amiSelectorTerms": by_tag,
            "subnetSelectorTerms": by_tag,
            "securityGroupSelectorTerms": by_tag,
            "instanceProfile": "autonode-test-nodes",
            "userData": user_data,
        },
    }))?;
    ec2nodeclasses(client)
        .create(&PostParams::default(), &class)
        .await
        .context("creating the EC2NodeClass")?;
    Ok(())
}

/// A NodePool of the class, pinned to moto's one launchable instance type.
///
/// Its disruption budget is 0 nodes: moto's fleets drop the launch
/// template's security groups, so Karpenter would find every node drifted
/// (SecurityGroupDrift) and replace it; this scenario is about the launch.
async fn create_pool(client: &Client) -> Result<()> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool"));
    let pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": POOL},
        "spec": {
            "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": CLASS},
                "requirements": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [INSTANCE_TYPE]},
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                ],
            }},
            "disruption": {"budgets": [{"nodes": "0"}]},
        },
    }))?;
    Api::<DynamicObject>::all_with(client.clone(), &resource)
        .create(&PostParams::default(), &pool)
        .await
        .context("creating the NodePool")?;
    Ok(())
}

/// A pod no node can take yet. The namespace's default ServiceAccount is
/// made by kube-controller-manager shortly after start; until then the
/// API server refuses pods, so the create is retried.
async fn create_pending_pod(client: &Client) -> Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "waits-for-a-node", "namespace": "default"},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "pause",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            }],
        },
    }))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                eprintln!("pod not created yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e).context("creating the pending pod"),
        }
    }
}

/// Polls `probe` until it yields a value, failing with Karpenter's log if
/// it has exited or [`LAUNCH_TIMEOUT`] passes.
async fn wait_for<T, F, Fut>(karpenter: &KarpenterController, what: &str, probe: F) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + LAUNCH_TIMEOUT;
    loop {
        karpenter.check_alive()?;
        if let Some(value) = probe().await? {
            return Ok(value);
        }
        if Instant::now() > deadline {
            bail!(
                "no {what} after {LAUNCH_TIMEOUT:?}; Karpenter's log:\n{}",
                karpenter.log_tail(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
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
            retry: RetryPolicy::default(),
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

    // A terminated instance must read as terminated: the server refuses
    // its joins and renewals on that.
    moto.terminate(&id).await?;
    let gone = client.describe(REGION, &id).await?;
    assert_eq!(gone.state, InstanceState::Terminated);
    Ok(())
}
