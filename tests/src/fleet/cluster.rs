//! One test's cluster around the real Karpenter: a control plane with
//! kube-scheduler, moto as EC2, the real Karpenter controller, autonode-server
//! reading moto for its EC2 checks, and the [`Launcher`] turning each
//! instance Karpenter launches into a machine that runs the agent.
//!
//! The userData names the server at [`SERVER_INSIDE`], an address on
//! each machine's own loopback that the machine forwards to wherever the
//! server listens, so the class (and so Karpenter's drift hash) does not
//! depend on the port a test's server got, and a second server can take
//! over the same machines. VMs ([`MachineKind::Vm`]) find it, and the API
//! server, at a fixed address of their network instead
//! ([`MachineKind::server_inside`]).

use crate::cloud::fakecloud::TestCa;
use crate::cloud::moto::{Moto, Seeded, DISCOVERY_TAG, INSTANCE_TYPE, REGION};
use crate::harness::pki::Ca;
use crate::harness::poll::{self, OnTimeout, Seen};
use crate::karpenter::real::{
    apply_karpenter_crds, check_supports, install_karpenter_crds_of, under_test,
    KarpenterController, Release,
};
use crate::karpenter::standin::{ec2nodeclasses, nodeclaims};
use crate::kube::controlplane::ControlPlane;
use crate::machines::launcher::{Cluster, Launcher, MachineKind};
use crate::server::{self, CloudSettings, Setup, TestServer};
use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::Client;
use serde_json::json;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;

/// The EC2NodeClass and NodePool the scenarios use.
pub const CLASS: &str = "autonode";
pub const POOL: &str = "autonode";

/// The account moto runs everything in (its default `ownerId`).
pub const MOTO_ACCOUNT: &str = "123456789012";

/// The server as a simulated machine reaches it: its own loopback,
/// forwarded.
pub const SERVER_INSIDE: SocketAddr = crate::machines::launcher::SIMULATED_SERVER_INSIDE;

/// The cluster name userData carries.
pub const CLUSTER_NAME: &str = "autonode-test";

/// The pending pod's name, in `default`.
pub const POD: &str = "waits-for-a-node";

/// Everything one scenario runs. Field order is drop order: machines stop
/// first, the control plane last.
pub struct KarpenterCluster {
    pub launcher: Launcher,
    /// What the launcher makes of each instance.
    pub kind: MachineKind,
    pub karpenter: KarpenterController,
    pub server: TestServer,
    pub moto: Arc<Moto>,
    pub seeded: Seeded,
    pub cp: ControlPlane,
    pub identity_ca: Arc<TestCa>,
    pub join_ca: Ca,
    dir: TempDir,
}

impl KarpenterCluster {
    /// Starts it all; the server with [`Self::upkeep_args`] (the class's
    /// upkeep on), a 3 s leader lease and `server_args`. No class, pool
    /// or pod yet.
    pub async fn start(server_args: &[String]) -> Result<Self> {
        Self::start_with(MachineKind::Simulated, server_args, &[]).await
    }

    /// Like [`Self::start`], each instance becoming a `kind` of machine
    /// (the API server, the server and the userData made reachable for
    /// it, and the server given the flags it needs), with `karpenter_env`
    /// added to Karpenter's environment (its feature gates, say).
    pub async fn start_with(
        kind: MachineKind,
        server_args: &[String],
        karpenter_env: &[(&str, &str)],
    ) -> Result<Self> {
        Self::start_on(under_test()?, kind, server_args, karpenter_env).await
    }

    /// Like [`Self::start_with`], with Karpenter `release` (its CRDs and
    /// controller) instead of the one under test. The Kubernetes under
    /// test must be in the range the release declares.
    pub async fn start_on(
        release: Release,
        kind: MachineKind,
        server_args: &[String],
        karpenter_env: &[(&str, &str)],
    ) -> Result<Self> {
        let cp = ControlPlane::start_for_karpenter_reachable_at(&kind.reachable_ips()).await?;
        check_supports(release, cp.version())?;
        install_karpenter_crds_of(&cp, release).await?;
        let moto = Arc::new(Moto::start().await?);
        let seeded = moto.seed().await?;
        let karpenter =
            KarpenterController::start_release(&cp, &moto, release, karpenter_env).await?;
        let dir = tempfile::Builder::new()
            .prefix("autonode-kcluster-")
            .tempdir()?;
        let join_ca = Ca::new("autonode-join-ca")?;
        std::fs::write(dir.path().join("join-ca.pem"), join_ca.cert_pem())?;
        let identity_ca = Arc::new(TestCa::generate()?);
        let mut args = upkeep_args(dir.path(), kind);
        args.push("--leader-lease=3".into());
        args.extend_from_slice(server_args);
        let server = start_server(&cp, &moto, &identity_ca, &join_ca, kind, &args).await?;
        // In the namespace the server's RBAC made.
        kind.prepare(&cp.admin().await?).await?;
        let launcher = Launcher::start(
            moto.clone(),
            Cluster {
                identity_ca: identity_ca.clone(),
                server_inside: kind.server_inside(),
                server_host: host_addr(&server)?,
                api_host: crate::machines::vm::loopback_addr(cp.url())?,
                kind,
            },
        );
        Ok(Self {
            launcher,
            kind,
            karpenter,
            server,
            moto,
            seeded,
            cp,
            identity_ca,
            join_ca,
            dir,
        })
    }

    /// The flags the class's userData is rendered from (`serve` and
    /// `render-userdata` alike).
    pub fn upkeep_args(&self) -> Vec<String> {
        upkeep_args(self.dir.path(), self.kind)
    }

    /// Another server of this cluster (same join CA, identity CA and
    /// moto) with `args` and nothing else.
    pub async fn start_server(&self, args: &[String]) -> Result<TestServer> {
        start_server(
            &self.cp,
            &self.moto,
            &self.identity_ca,
            &self.join_ca,
            self.kind,
            args,
        )
        .await
    }

    /// What `autonode-server render-userdata` prints for this cluster: the
    /// userData an operator puts in a class the server does not manage,
    /// and the server's upkeep keeps.
    pub fn rendered_user_data(&self) -> Result<String> {
        server::render_user_data(&self.upkeep_args())
    }

    /// The class (with the rendered userData) and the pool, once Karpenter
    /// has the class Ready.
    pub async fn create_class_and_pool(&self) -> Result<()> {
        let client = self.cp.admin().await?;
        create_class(&client, &self.rendered_user_data()?).await?;
        create_pool(&client).await?;
        self.class_ready().await
    }

    /// Replaces the running Karpenter with `to`, in the order its upgrade
    /// guide gives: the old controller stopped (SIGTERM, as its
    /// Deployment's rollout), `to`'s CRDs applied over the installed ones,
    /// then `to`'s controller started with `karpenter_env`, ready. Returns
    /// the CRDs whose definition the upgrade changed.
    pub async fn upgrade_karpenter(
        &mut self,
        to: Release,
        karpenter_env: &[(&str, &str)],
    ) -> Result<Vec<String>> {
        check_supports(to, self.cp.version())?;
        if !self.karpenter.stop(Duration::from_secs(30)) {
            eprintln!(
                "Karpenter {} did not exit within 30 s of SIGTERM; killed",
                self.karpenter.release()
            );
        }
        let changed = apply_karpenter_crds(&self.cp, to).await?;
        let next =
            KarpenterController::start_release(&self.cp, &self.moto, to, karpenter_env).await?;
        // The old one is dropped (already stopped) here.
        self.karpenter = next;
        Ok(changed)
    }

    /// Waits for Karpenter to call the class Ready (its AMIs, subnets and
    /// security groups resolved): it launches nothing from it before.
    pub async fn class_ready(&self) -> Result<()> {
        let classes = ec2nodeclasses(&self.cp.admin().await?);
        self.wait_for("a Ready EC2NodeClass", LAUNCH_TIMEOUT, || async {
            Ok(is_ready(&classes.get(CLASS).await?).then_some(()))
        })
        .await
    }

    /// Polls `probe` until it yields a value; fails with what the
    /// Karpenter, the server and the machines did if `timeout` passes or
    /// Karpenter exits.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, probe: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        self.karpenter
            .wait_for(what, timeout, Duration::from_millis(250), probe)
            .await
            .on_timeout(|| {
                format!(
                    "\n--- server ---\n{}\n--- machines ---\n{:#?}",
                    tail(&self.server.log(), 30),
                    self.launcher.machines()
                )
            })
    }
}

/// How long a step of Karpenter's may take here: it batches pending pods
/// for a second or more, resolves the class, calls moto, all on two
/// shared cores.
pub const LAUNCH_TIMEOUT: Duration = Duration::from_secs(180);

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn upkeep_args(dir: &std::path::Path, kind: MachineKind) -> Vec<String> {
    vec![
        format!("--public-url=https://{}", kind.server_inside()),
        format!("--join-ca-file={}", dir.join("join-ca.pem").display()),
        format!("--cluster-name={CLUSTER_NAME}"),
    ]
}

/// A server trusting `identity_ca` for identity documents and asking
/// moto about instances, for moto's account and region, reachable by
/// `kind` of machines, with the flags they need before `args`.
async fn start_server(
    cp: &ControlPlane,
    moto: &Moto,
    identity_ca: &TestCa,
    join_ca: &Ca,
    kind: MachineKind,
    args: &[String],
) -> Result<TestServer> {
    let cloud = CloudSettings {
        identity_ca_pem: identity_ca.ca_pem(),
        ec2_endpoint: moto.url().to_string(),
        accounts: vec![MOTO_ACCOUNT.into()],
        regions: vec![REGION.into()],
    };
    let mut all = kind.server_args();
    all.extend_from_slice(args);
    let extra_ips = kind.reachable_ips();
    let setup = Setup {
        extra_args: &all,
        extra_ips: &extra_ips,
        join_ca: Some(join_ca),
        ..Setup::default()
    };
    TestServer::launch(cp, &cloud, &setup).await
}

/// The server's join address on host loopback.
pub fn host_addr(server: &TestServer) -> Result<SocketAddr> {
    server
        .url()
        .trim_start_matches("https://")
        .parse()
        .context("server URL is not https://ip:port")
}

/// Whether an object's `Ready` status condition is True.
pub fn is_ready(object: &DynamicObject) -> bool {
    condition(object, "Ready").is_some_and(|c| c["status"] == "True")
}

/// An object's status condition of `type_`.
pub fn condition<'a>(object: &'a DynamicObject, type_: &str) -> Option<&'a serde_json::Value> {
    object.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
}

/// An `amiFamily: Custom` class selecting moto's seeded resources by tag,
/// with an instance profile (no IAM role for Karpenter to resolve).
pub async fn create_class(client: &Client, user_data: &str) -> Result<()> {
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
/// Its disruption budget is 0 nodes: no scenario here is about Karpenter
/// replacing nodes it finds drifted or underused, and a replacement in the
/// middle of one would make its counts wrong. (Drift itself is still
/// computed and shown on the NodeClaims.) `consolidateAfter` is v1.15's
/// default, written out: v1.14's schema requires it ([`create_pool_named`]).
pub async fn create_pool(client: &Client) -> Result<()> {
    let budget_none = json!({"disruption": {
        "consolidateAfter": "0s",
        "budgets": [{"nodes": "0"}],
    }});
    create_pool_named(client, POOL, budget_none).await
}

/// A pod no node can take yet ([`POD`]).
pub async fn create_pending_pod(client: &Client) -> Result<()> {
    create_pod(client, POD, json!({})).await
}

/// A pause pod `name` with a small request and `spec`'s keys added to its
/// spec (a `nodeSelector`, say). The namespace's default ServiceAccount is
/// made by kube-controller-manager shortly after start; until then the API
/// server refuses pods, so the create is retried.
pub async fn create_pod(client: &Client, name: &str, spec: serde_json::Value) -> Result<()> {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "pause",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            }],
        },
    });
    let serde_json::Value::Object(extra) = spec else {
        bail!("a pod spec that is not an object: {spec}");
    };
    for (key, value) in extra {
        pod["spec"][key] = value;
    }
    let pod: Pod = serde_json::from_value(pod)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // Every refusal is a "not yet"; the last one says why on a timeout.
    poll::until(
        &format!("pod {name} created"),
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            Ok(match pods.create(&PostParams::default(), &pod).await {
                Ok(_) => Seen(Some(()), String::new()),
                Err(e) => {
                    eprintln!("pod not created yet: {e}");
                    Seen(None, format!("creating the pod {name}: {e}"))
                }
            })
        },
    )
    .await
}

/// The NodeClaims there are now.
pub async fn list_nodeclaims(client: &Client) -> Result<Vec<DynamicObject>> {
    Ok(nodeclaims(client).list(&Default::default()).await?.items)
}

/// A NodePool `name` of the class, pinned like [`create_pool`]'s, with
/// `spec`'s keys set in its spec (its `disruption`, `replicas`...).
/// [`create_pool`]'s budget of 0 nodes is not set here: a pool made with
/// this one is for scenarios about Karpenter removing nodes.
///
/// A `disruption` must name its `consolidateAfter`: v1.14's NodePool
/// schema requires it whenever `disruption` is given, v1.15's defaults it
/// to `0s`, and a pool that leaned on the default would be refused on the
/// previous minor only. Refused here on every release alike.
pub async fn create_pool_named(client: &Client, name: &str, spec: serde_json::Value) -> Result<()> {
    if spec
        .get("disruption")
        .is_some_and(|d| d.get("consolidateAfter").is_none())
    {
        bail!(
            "NodePool {name}: a disruption without consolidateAfter relies on one \
             Karpenter release's default (v1.14 requires it): {spec}"
        );
    }
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool"));
    let mut pool = json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": CLASS},
                "requirements": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [INSTANCE_TYPE]},
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                ],
            }},
        },
    });
    let serde_json::Value::Object(extra) = spec else {
        bail!("a NodePool spec that is not an object: {spec}");
    };
    for (key, value) in extra {
        pool["spec"][key] = value;
    }
    let pool: DynamicObject = serde_json::from_value(pool)?;
    Api::<DynamicObject>::all_with(client.clone(), &resource)
        .create(&PostParams::default(), &pool)
        .await
        .with_context(|| format!("creating the NodePool {name}"))?;
    Ok(())
}

impl KarpenterCluster {
    /// Waits for Karpenter to launch NodeClaim `claim` (Launched, a
    /// providerID set); returns the providerID and the instance id in it.
    pub async fn launched(&self, claim: &str) -> Result<(String, String)> {
        let claims = nodeclaims(&self.cp.admin().await?);
        let provider_id = self
            .wait_for("a launched NodeClaim", LAUNCH_TIMEOUT, || async {
                let c = claims.get(claim).await?;
                let launched = condition(&c, "Launched").is_some_and(|c| c["status"] == "True");
                Ok(c.data["status"]["providerID"]
                    .as_str()
                    .filter(|id| launched && !id.is_empty())
                    .map(str::to_string))
            })
            .await?;
        let instance_id = provider_id
            .rsplit('/')
            .next()
            .context("providerID without an instance id")?
            .to_string();
        Ok((provider_id, instance_id))
    }

    /// Waits for Karpenter to call NodeClaim `claim` Launched, Registered,
    /// Initialized and Ready.
    pub async fn initialized(&self, claim: &str) -> Result<()> {
        let claims = nodeclaims(&self.cp.admin().await?);
        self.wait_for("an Initialized NodeClaim", LAUNCH_TIMEOUT, || async {
            let c = claims.get(claim).await?;
            let all_true = ["Launched", "Registered", "Initialized"]
                .iter()
                .all(|t| condition(&c, t).is_some_and(|c| c["status"] == "True"));
            Ok((all_true && is_ready(&c)).then_some(()))
        })
        .await
    }
}

/// Whether Karpenter has finished registering `node`: its
/// `karpenter.sh/unregistered` taint gone, its `registered` and
/// `initialized` labels on; an error says what is not.
pub fn karpenter_finished_with(node: &k8s_openapi::api::core::v1::Node) -> Result<()> {
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if taints.iter().any(|t| t.key == "karpenter.sh/unregistered") {
        bail!("Karpenter's registration taint is still on: {taints:?}");
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for label in ["karpenter.sh/registered", "karpenter.sh/initialized"] {
        if labels.get(label).map(String::as_str) != Some("true") {
            bail!("no {label}=true on the Node: {labels:?}");
        }
    }
    Ok(())
}
