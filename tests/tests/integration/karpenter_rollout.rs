//! What autonode's EC2NodeClass upkeep changes, under the real Karpenter:
//! a new AMI or a new join URL makes Karpenter replace the fleet, at the
//! pace of the NodePool's disruption budget, the replacements joining
//! through autonode; the rollout guard puts a bad AMI back before the
//! fleet is gone; a new serving certificate under the same join CA drifts
//! nothing.
//!
//! The fleet: a ReplicaSet (kube-controller-manager's own controller) of
//! pods that each need most of an m5.large, so every node holds one and a
//! drifted node's pod needs a replacement node (Karpenter deletes an empty
//! drifted node without replacing it). The pods have no grace period: the
//! kubelet stand-in runs no containers, so an evicted pod would otherwise
//! wait forever for a kubelet to confirm it stopped.
//!
//! The NodePool's budget is [`BUDGET`] node and consolidation is off
//! (`consolidateAfter: Never`), so drift is the only disruption. How fast
//! Karpenter goes, from its source (core v1.15.0): the disruption loop
//! polls every 10 s when it has nothing to do and again at once after it
//! started a command; drift commands have no validation delay (the 15 s
//! one is consolidation's); a NodeClaim's `Drifted` condition follows the
//! EC2NodeClass's watch events (and a 5-minute requeue); a drifted
//! candidate is tainted, its replacement launched, and it is deleted only
//! once the replacement is Initialized; a replacement deleted meanwhile
//! fails the command and the candidate is untainted; a replacement is
//! created by the disruption queue itself, not batched by the provisioner
//! (`BATCH_IDLE_DURATION` does not apply); a drain lasts at least 5 s.
//! None of these has a setting; the scenarios are short because Karpenter
//! reacts to events.

use crate::karpenter_real::{record, round};
use anyhow::{Context, Result};
use autonode_tests::cloud::moto::{Moto, AMD64_AMI, REGION};
use autonode_tests::fleet::cluster::{
    condition, create_class, create_pool_named, host_addr, list_nodeclaims, KarpenterCluster,
    CLASS, LAUNCH_TIMEOUT, MOTO_ACCOUNT, POOL, SERVER_INSIDE,
};
use autonode_tests::harness::pki::Ca;
use autonode_tests::harness::poll;
use autonode_tests::karpenter::standin::{ec2nodeclasses, nodeclaims};
use autonode_tests::network::blip::Blip;
use autonode_tests::server::{self, CloudSettings, Setup, TestServer};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::Client;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// Nodes in the fleet.
const FLEET: usize = 3;

/// The NodePool's disruption budget: at most this many nodes disrupted at
/// once.
const BUDGET: usize = 1;

/// The fleet's ReplicaSet (and its pods' label), in `default`.
const WORKLOAD: &str = "fleet";

/// Karpenter's annotation of an EC2NodeClass's hash, which its static
/// drift compares with each NodeClaim's.
const CLASS_HASH: &str = "karpenter.k8s.aws/ec2nodeclass-hash";

/// The rollout guard's failures before it puts values back (the server's
/// default `--rollout-failures`).
const ROLLOUT_FAILURES: usize = 3;

/// The rollout guard's condition type on the class.
const ROLLOUT_CONDITION: &str = "AutonodeRollout";

/// How long replacing the whole fleet may take: per node a launch, a
/// join, registration and Karpenter's drain and termination, one at a
/// time, on two shared cores.
const FLEET_TIMEOUT: Duration = Duration::from_secs(480);

/// One scenario: the cluster, a fleet on [`AMD64_AMI`] kept by a server
/// whose `--ami-ids` is in a config file (so a restart with another AMI
/// keeps its ports, certificate and flags), and a rollout state key file
/// every server generation shares.
struct Scenario {
    cluster: KarpenterCluster,
    config: PathBuf,
    key: PathBuf,
    dir: TempDir,
}

impl Scenario {
    /// A cluster whose class the server keeps at [`AMD64_AMI`], a NodePool
    /// with the budget, and `fleet` nodes joined and Initialized, the
    /// guard's state settled on those values.
    async fn start(fleet: usize) -> Result<Self> {
        Self::start_with(fleet, &[]).await
    }

    /// [`Scenario::start`], the server also given `extra` flags (kept
    /// across its restarts).
    async fn start_with(fleet: usize, extra: &[String]) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("autonode-rollout-")
            .tempdir()?;
        let config = dir.path().join("server.toml");
        let key = dir.path().join("rollout-state.key");
        std::fs::write(&key, rand::random::<[u8; 32]>())?;
        write_ami(&config, AMD64_AMI)?;
        let mut flags = own_flags(&config, &key);
        flags.extend_from_slice(extra);
        let cluster = KarpenterCluster::start(&flags).await?;
        let scenario = Self {
            cluster,
            config,
            key,
            dir,
        };
        scenario.create_fleet(fleet).await?;
        Ok(scenario)
    }

    async fn create_fleet(&self, fleet: usize) -> Result<()> {
        let cluster = &self.cluster;
        let admin = cluster.cp.admin().await?;
        create_class(&admin, &cluster.rendered_user_data()?).await?;
        create_pool_with_budget(&admin, BUDGET).await?;
        cluster.class_ready().await?;
        create_workload(&admin, fleet).await?;
        wait_fleet(cluster, AMD64_AMI, &BTreeSet::new(), fleet).await?;
        // The values the fleet runs are the guard's last good ones: a bad
        // change can be put back to them.
        wait_rollout(cluster, "True", "Settled").await
    }

    /// The userData flags with `flag` (`--public-url`, `--join-ca-file`)
    /// set to `value`.
    fn upkeep_args_with(&self, flag: &str, value: &str) -> Vec<String> {
        let prefix = format!("{flag}=");
        self.cluster
            .upkeep_args()
            .into_iter()
            .map(|a| {
                if a.starts_with(&prefix) {
                    format!("{prefix}{value}")
                } else {
                    a
                }
            })
            .collect()
    }

    /// Flags for another server generation with `flag` set to `value`.
    fn flags_with(&self, flag: &str, value: &str) -> Vec<String> {
        let mut args = self.upkeep_args_with(flag, value);
        args.push("--leader-lease=3".into());
        args.extend(own_flags(&self.config, &self.key));
        args
    }

    /// Restarts the server with `--ami-ids amd64=<ami>`, as a rolling
    /// restart with a new setting would.
    async fn restart_with_ami(&self, ami: &str) -> Result<()> {
        write_ami(&self.config, ami)?;
        self.cluster.server.restart().await
    }

    /// The NodeClaims now, by name.
    async fn claim_names(&self) -> Result<BTreeSet<String>> {
        let admin = self.cluster.cp.admin().await?;
        Ok(list_nodeclaims(&admin)
            .await?
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect())
    }
}

/// The flags every server generation of a scenario gets besides the
/// harness's: the config file (`--ami-ids`), the shared rollout state key
/// (each test server has a TLS key of its own, from which the key would
/// otherwise be derived), and a 2 s resync of unchanged classes.
fn own_flags(config: &std::path::Path, key: &std::path::Path) -> Vec<String> {
    vec![
        format!("--config={}", config.display()),
        format!("--rollout-state-key-file={}", key.display()),
        "--nodeclass-resync=2".into(),
    ]
}

fn write_ami(config: &std::path::Path, ami: &str) -> Result<()> {
    write_config(config, ami, "")
}

/// The server's config file: `--ami-ids amd64=<ami>` and `more` (TOML).
fn write_config(config: &std::path::Path, ami: &str, more: &str) -> Result<()> {
    std::fs::write(config, format!("ami-ids = [\"amd64={ami}\"]\n{more}"))
        .with_context(|| format!("writing {}", config.display()))
}

/// A NodePool of the class on moto's one instance type, its disruption
/// budget `nodes` and consolidation off: drift is the only reason a node
/// is disrupted.
async fn create_pool_with_budget(client: &Client, nodes: usize) -> Result<()> {
    let disruption = json!({"disruption": {
        "consolidateAfter": "Never",
        "budgets": [{"nodes": nodes.to_string()}],
    }});
    create_pool_named(client, POOL, disruption).await
}

/// The fleet's workload: `replicas` pods of 1.5 CPU (an m5.large holds
/// one), no grace period. Created once the namespace's default
/// ServiceAccount exists (the API server refuses pods before).
async fn create_workload(client: &Client, replicas: usize) -> Result<()> {
    let set: ReplicaSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": WORKLOAD, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": WORKLOAD}},
            "template": {
                "metadata": {"labels": {"app": WORKLOAD}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "pause",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "1500m", "memory": "64Mi"}},
                    }],
                },
            },
        },
    }))?;
    Api::<ReplicaSet>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &set)
        .await
        .context("creating the ReplicaSet")?;
    Ok(())
}

/// Scales the fleet's workload to `replicas`.
async fn scale_workload(client: &Client, replicas: usize) -> Result<()> {
    Api::<ReplicaSet>::namespaced(client.clone(), "default")
        .patch(
            WORKLOAD,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .context("scaling the ReplicaSet")?;
    Ok(())
}

fn is_true(claim: &DynamicObject, type_: &str) -> bool {
    condition(claim, type_).is_some_and(|c| c["status"] == "True")
}

fn image_of(claim: &DynamicObject) -> &str {
    claim.data["status"]["imageID"].as_str().unwrap_or_default()
}

fn instance_of(claim: &DynamicObject) -> Option<&str> {
    claim.data["status"]["providerID"]
        .as_str()?
        .rsplit('/')
        .next()
}

/// Waits until the fleet is `fleet` NodeClaims, every one Initialized on
/// `ami` and none of `gone` left, and the workload's pods are all bound to
/// its nodes; returns the NodeClaims.
async fn wait_fleet(
    cluster: &KarpenterCluster,
    ami: &str,
    gone: &BTreeSet<String>,
    fleet: usize,
) -> Result<Vec<DynamicObject>> {
    let admin = cluster.cp.admin().await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let what = format!("{fleet} Initialized NodeClaims on {ami}, none of {gone:?}");
    cluster
        .wait_for(&what, FLEET_TIMEOUT, || async {
            let claims = list_nodeclaims(&admin).await?;
            let settled = claims.len() == fleet
                && claims.iter().all(|c| {
                    let name = c.metadata.name.as_deref().unwrap_or_default();
                    is_true(c, "Initialized")
                        && image_of(c) == ami
                        && c.metadata.deletion_timestamp.is_none()
                        && !gone.contains(name)
                });
            if !settled {
                return Ok(None);
            }
            let nodes: BTreeSet<&str> = claims
                .iter()
                .filter_map(|c| c.data["status"]["nodeName"].as_str())
                .collect();
            let selector = format!("app={WORKLOAD}");
            let placed = pods.list(&ListParams::default().labels(&selector)).await?;
            let bound = placed.items.iter().filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_deref())
                        .is_some_and(|n| nodes.contains(n))
            });
            Ok((bound.count() == fleet).then_some(claims.clone()))
        })
        .await
}

/// Waits for the class's rollout condition to be `status`/`reason`.
async fn wait_rollout(cluster: &KarpenterCluster, status: &str, reason: &str) -> Result<()> {
    let admin = cluster.cp.admin().await?;
    let what = format!("{ROLLOUT_CONDITION}={status}/{reason} on the class");
    cluster
        .wait_for(&what, FLEET_TIMEOUT, || async {
            let class = ec2nodeclasses(&admin).get(CLASS).await?;
            let at = condition(&class, ROLLOUT_CONDITION)
                .is_some_and(|c| c["status"] == status && c["reason"] == reason);
            Ok(at.then_some(()))
        })
        .await
}

/// Every replacement joined through autonode: its machine's agent
/// succeeded, the kubelet registered with what the agent wrote, and moto
/// runs it on `ami`.
async fn assert_joined_on(
    cluster: &KarpenterCluster,
    claims: &[DynamicObject],
    ami: &str,
) -> Result<()> {
    let instances = cluster.moto.instances().await?;
    for claim in claims {
        let id = instance_of(claim).context("a NodeClaim without a providerID")?;
        let machine = cluster
            .launcher
            .machine(id)
            .with_context(|| format!("no machine booted for {id}"))?;
        let agent = machine.agent.as_ref().context("the agent never ran")?;
        assert_eq!(agent.code, Some(0), "{machine:#?}");
        assert!(machine.registered.is_some(), "{machine:#?}");
        let described = instances
            .iter()
            .find(|i| i.id == id)
            .with_context(|| format!("{id} is not in moto"))?;
        assert_eq!(described.image_id, ami, "{described:?}");
        assert!(
            is_true(claim, "AutonodeBootstrapped") || is_true(claim, "Initialized"),
            "{:#}",
            claim.data["status"]
        );
    }
    Ok(())
}

/// A new x86_64 image in moto (a copy of [`AMD64_AMI`]: moto's
/// RegisterImage keeps no architecture, its CopyImage keeps the source's).
async fn new_image(moto: &Moto) -> Result<String> {
    let xml = moto
        .call(
            "CopyImage",
            &[
                ("SourceImageId", AMD64_AMI),
                ("SourceRegion", REGION),
                ("Name", "autonode-test-x86_64-next"),
            ],
        )
        .await?;
    let doc = roxmltree::Document::parse(&xml).context("CopyImage")?;
    doc.descendants()
        .find(|n| n.has_tag_name("imageId"))
        .and_then(|n| n.text())
        .map(str::to_string)
        .with_context(|| format!("CopyImage answered no imageId: {xml}"))
}

/// Whether Karpenter counts `claim` against the budget now: an
/// Initialized NodeClaim it has started to disrupt (its `DisruptionReason`
/// condition: tainted, its replacement on the way) or is deleting
/// (draining), until its instance is terminating, when Karpenter stops
/// counting it (core's `NodePoolStatsFromNodes`).
fn disrupting(claim: &DynamicObject) -> bool {
    let started = is_true(claim, "DisruptionReason") || claim.metadata.deletion_timestamp.is_some();
    started && is_true(claim, "Initialized") && !is_true(claim, "InstanceTerminating")
}

/// What the watch of NodeClaims saw.
#[derive(Debug, Default)]
struct Seen {
    /// The NodeClaims being disrupted now.
    now: BTreeSet<String>,
    /// The most disrupted at once.
    max: usize,
    /// Every NodeClaim ever disrupted.
    disrupted: BTreeSet<String>,
    /// Each NodeClaim's `Drifted` reason, when it had one.
    drifted: BTreeMap<String, String>,
    /// (seconds since the watch began, NodeClaims disrupted at once), at
    /// each change.
    timeline: Vec<(f64, usize)>,
}

/// Watches every NodeClaim change (a watch, not a poll: no overlap of two
/// disruptions can fall between two looks) and counts the NodeClaims
/// Karpenter disrupts at once.
struct DisruptionWatch {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl DisruptionWatch {
    fn start(client: &Client) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stream = watcher(nodeclaims(client), watcher::Config::default());
        let into = seen.clone();
        let began = Instant::now();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(event) = event else { continue };
                let mut seen = into.lock().unwrap_or_else(|e| e.into_inner());
                match event {
                    watcher::Event::Apply(claim) | watcher::Event::InitApply(claim) => {
                        seen.observe(&claim, began)
                    }
                    watcher::Event::Delete(claim) => seen.forget(&claim, began),
                    watcher::Event::Init | watcher::Event::InitDone => {}
                }
            }
        });
        Self { seen, task }
    }

    fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Seen {
    fn observe(&mut self, claim: &DynamicObject, began: Instant) {
        let name = claim.metadata.name.clone().unwrap_or_default();
        if let Some(drift) = condition(claim, "Drifted").filter(|c| c["status"] == "True") {
            let reason = drift["reason"].as_str().unwrap_or_default().to_string();
            self.drifted.insert(name.clone(), reason);
        }
        let changed = if disrupting(claim) {
            self.disrupted.insert(name.clone());
            self.now.insert(name)
        } else {
            self.now.remove(&name)
        };
        if changed {
            self.changed(began);
        }
    }

    fn forget(&mut self, claim: &DynamicObject, began: Instant) {
        if self
            .now
            .remove(claim.metadata.name.as_deref().unwrap_or_default())
        {
            self.changed(began);
        }
    }

    fn changed(&mut self, began: Instant) {
        self.max = self.max.max(self.now.len());
        self.timeline
            .push((round(began.elapsed().as_secs_f64()), self.now.len()));
    }
}

impl Drop for DisruptionWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How a fleet was replaced.
struct Replaced {
    /// Seconds from the change until the last old NodeClaim was gone and
    /// every replacement Initialized.
    seconds: f64,
    /// The most NodeClaims disrupted at once.
    max: usize,
    /// The old NodeClaims' `Drifted` reasons.
    reasons: BTreeSet<String>,
    /// The replacements.
    fleet: Vec<DynamicObject>,
}

/// The fleet's replacement after a change, watched: every old NodeClaim
/// disrupted (and `Drifted` first), never more than [`BUDGET`] at once, the
/// replacements Initialized on `ami` and joined through autonode.
async fn replaced_at_the_budgets_pace(
    scenario: &Scenario,
    watch: &DisruptionWatch,
    old: &BTreeSet<String>,
    ami: &str,
    t0: Instant,
) -> Result<Replaced> {
    let cluster = &scenario.cluster;
    let fleet = wait_fleet(cluster, ami, old, old.len()).await?;
    let replaced_s = t0.elapsed().as_secs_f64();
    assert_joined_on(cluster, &fleet, ami).await?;
    let (max, disrupted, drifted, timeline) = watch.seen(|s| {
        (
            s.max,
            s.disrupted.clone(),
            s.drifted.clone(),
            s.timeline.clone(),
        )
    });
    eprintln!(
        "fleet replaced in {replaced_s:.1} s; disrupted at once: {timeline:?}; drifted: {drifted:?}"
    );
    assert_eq!(&disrupted, old, "the NodeClaims disrupted are the old ones");
    for name in old {
        assert!(drifted.contains_key(name), "{name} was not Drifted first");
    }
    assert!(
        max <= BUDGET,
        "{max} NodeClaims disrupted at once, over the budget of {BUDGET}: {timeline:?}"
    );
    Ok(Replaced {
        seconds: replaced_s,
        max,
        reasons: drifted.into_values().collect(),
        fleet,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_ami_drifts_the_fleet_and_karpenter_replaces_it_one_node_at_a_time_through_autonode(
) -> Result<()> {
    let scenario = Scenario::start(FLEET).await?;
    let cluster = &scenario.cluster;
    let admin = cluster.cp.admin().await?;
    let old = scenario.claim_names().await?;
    let new_ami = new_image(&cluster.moto).await?;
    let watch = DisruptionWatch::start(&admin);

    let t0 = Instant::now();
    scenario.restart_with_ami(&new_ami).await?;
    let replaced = replaced_at_the_budgets_pace(&scenario, &watch, &old, &new_ami, t0).await?;
    let (replaced_s, max) = (replaced.seconds, replaced.max);
    assert_eq!(max, BUDGET, "the budget was never used");
    assert_eq!(
        replaced.reasons,
        BTreeSet::from(["AMIDrift".to_string()]),
        "the drift was the AMI's"
    );
    // The first replacement Ready promoted the new AMI.
    wait_rollout(cluster, "True", "Settled").await?;
    record(
        cluster,
        json!({
            "rollout_fleet": FLEET,
            "rollout_budget_nodes": BUDGET,
            "rollout_max_disrupted_at_once": max,
            "rollout_replaced_s": round(replaced_s),
            "rollout_replaced_per_node_s": round(replaced_s / FLEET as f64),
        }),
    )
}

/// A TCP front at the address every machine's forward dials (the first
/// server's), relaying to another server: the Service in front of the
/// server's replicas, which outlives any one of them. Stops on drop.
struct Front(tokio::task::JoinHandle<()>);

impl Front {
    async fn start(at: SocketAddr, to: SocketAddr) -> Result<Self> {
        // The killed server's socket is closed; binding may still race
        // the kernel's cleanup for a moment.
        let listener = poll::until(
            &format!("front bound at {at}"),
            Duration::from_secs(10),
            Duration::from_millis(100),
            || async {
                Ok(match tokio::net::TcpListener::bind(at).await {
                    Ok(listener) => poll::Seen(Some(listener), String::new()),
                    Err(e) => poll::Seen(None, format!("binding the front at {at}: {e}")),
                })
            },
        )
        .await?;
        let task = tokio::spawn(async move {
            // Dropping the set (task aborted) aborts every relay with it.
            let mut relays = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => if let Ok((inbound, _)) = accepted {
                        relays.spawn(relay(inbound, to));
                    },
                    Some(_) = relays.join_next() => {}
                }
            }
        });
        Ok(Self(task))
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn relay(mut inbound: tokio::net::TcpStream, to: SocketAddr) {
    // A refused connection is dropped: the agent sees the server down and
    // retries.
    if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
        let _ = inbound.set_nodelay(true);
        let _ = outbound.set_nodelay(true);
        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
    }
}

/// The class's userData now.
async fn class_user_data(client: &Client) -> Result<String> {
    let class = ec2nodeclasses(client).get(CLASS).await?;
    Ok(class.data["spec"]["userData"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// A server generation that renders `rendered` takes over from the
/// cluster's (behind its address, as a Deployment's rolling restart behind
/// its Service); the class gets the new userData and Karpenter replaces
/// the fleet for its hash, at the budget's pace, each replacement booting
/// with the new userData byte for byte and joining through `next`.
async fn new_user_data_rolls(
    scenario: &Scenario,
    next: TestServer,
    rendered: &str,
) -> Result<Replaced> {
    let cluster = &scenario.cluster;
    let admin = cluster.cp.admin().await?;
    let old = scenario.claim_names().await?;
    assert_ne!(class_user_data(&admin).await?, rendered, "nothing to roll");
    let watch = DisruptionWatch::start(&admin);
    let t0 = Instant::now();
    cluster.server.kill();
    let _front = Front::start(host_addr(&cluster.server)?, host_addr(&next)?).await?;
    cluster
        .wait_for("the class's new userData", LAUNCH_TIMEOUT, || async {
            Ok((class_user_data(&admin).await? == rendered).then_some(()))
        })
        .await?;
    let replaced = replaced_at_the_budgets_pace(scenario, &watch, &old, AMD64_AMI, t0).await?;
    assert_eq!(replaced.max, BUDGET, "the budget was never used");
    assert_eq!(
        replaced.reasons,
        BTreeSet::from(["NodeClassDrift".to_string()]),
        "the drift was the class's hash (its userData)"
    );
    for claim in &replaced.fleet {
        let id = instance_of(claim).context("no providerID")?;
        let on_instance = cluster.moto.user_data(id).await?.context("no userData")?;
        assert!(on_instance == rendered.as_bytes(), "{id}'s userData");
    }
    // The first replacement Ready promoted the new userData.
    wait_rollout(cluster, "True", "Settled").await?;
    Ok(replaced)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_join_url_changes_the_user_data_and_drifts_the_fleet_at_the_budgets_pace(
) -> Result<()> {
    let scenario = Scenario::start(FLEET).await?;
    let cluster = &scenario.cluster;
    // The join API gets another name: `localhost`, which the serving
    // certificate names too, on each machine's same forward.
    let url = format!("https://localhost:{}", SERVER_INSIDE.port());
    let rendered = server::render_user_data(&scenario.upkeep_args_with("--public-url", &url))?;
    let next = cluster
        .start_server(&scenario.flags_with("--public-url", &url))
        .await?;
    let replaced = new_user_data_rolls(&scenario, next, &rendered).await?;
    record(
        cluster,
        json!({
            "join_url_change_max_disrupted_at_once": replaced.max,
            "join_url_change_replaced_s": round(replaced.seconds),
        }),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_join_ca_changes_the_pin_in_user_data_and_drifts_the_fleet_at_the_budgets_pace(
) -> Result<()> {
    let scenario = Scenario::start(FLEET).await?;
    let cluster = &scenario.cluster;
    // A new root: userData pins the CA by its SHA-256, so the pin changes,
    // and the next server serves a certificate of the new CA only.
    let ca = Ca::new("autonode-join-ca-next")?;
    let ca_file = scenario.dir.path().join("join-ca-next.pem");
    std::fs::write(&ca_file, ca.cert_pem())?;
    let ca_file = ca_file.display().to_string();
    let rendered =
        server::render_user_data(&scenario.upkeep_args_with("--join-ca-file", &ca_file))?;
    let cloud = CloudSettings {
        identity_ca_pem: cluster.identity_ca.ca_pem(),
        ec2_endpoint: cluster.moto.url().to_string(),
        accounts: vec![MOTO_ACCOUNT.into()],
        regions: vec![REGION.into()],
    };
    let flags = scenario.flags_with("--join-ca-file", &ca_file);
    let setup = Setup {
        extra_args: &flags,
        join_ca: Some(&ca),
        ..Setup::default()
    };
    let next = TestServer::launch(&cluster.cp, &cloud, &setup).await?;
    let replaced = new_user_data_rolls(&scenario, next, &rendered).await?;
    record(
        cluster,
        json!({
            "join_ca_change_max_disrupted_at_once": replaced.max,
            "join_ca_change_replaced_s": round(replaced.seconds),
        }),
    )
}

/// The guard's state on the class, out of its seal (`{state, mac}`).
fn rollout_state(class: &DynamicObject) -> serde_json::Value {
    let text = class
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("autonode.dev/rollout"))
        .cloned()
        .unwrap_or_default();
    let sealed: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    serde_json::from_str(sealed["state"].as_str().unwrap_or_default()).unwrap_or_default()
}

/// The AMI the class selects (one `{id}` term, as `--ami-ids` keeps it).
fn class_ami(class: &DynamicObject) -> &str {
    class.data["spec"]["amiSelectorTerms"][0]["id"]
        .as_str()
        .unwrap_or_default()
}

/// Waits until Karpenter has taken `ami` back: no NodeClaim Drifted or
/// being disrupted, every one on `ami` (the failed replacements gone);
/// returns how many of `old` are still there.
async fn calm_on(cluster: &KarpenterCluster, ami: &str, old: &BTreeSet<String>) -> Result<usize> {
    let admin = cluster.cp.admin().await?;
    cluster
        .wait_for("the fleet no longer drifted", FLEET_TIMEOUT, || async {
            let claims = list_nodeclaims(&admin).await?;
            let calm = claims.iter().all(|c| {
                !is_true(c, "Drifted")
                    && !is_true(c, "DisruptionReason")
                    && c.metadata.deletion_timestamp.is_none()
                    && image_of(c) == ami
            });
            let names: BTreeSet<String> =
                claims.into_iter().filter_map(|c| c.metadata.name).collect();
            Ok(calm.then(|| names.intersection(old).count()))
        })
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rollout_guard_puts_a_failing_ami_back_before_karpenter_has_replaced_the_fleet(
) -> Result<()> {
    // The guard alone: the fleet's drift launches its replacements
    // together, so more of them fail than the default failure budget
    // deletes before the revert lands, and those past it would be kept
    // (marked) until Karpenter's registration timeout, 15 minutes, before
    // the fleet is calm again (docs/design.md, "The failure budget and the
    // rollout guard").
    let scenario = Scenario::start_with(FLEET, &["--failure-budget=100".into()]).await?;
    let cluster = &scenario.cluster;
    let admin = cluster.cp.admin().await?;
    let old = scenario.claim_names().await?;
    let new_ami = new_image(&cluster.moto).await?;
    let watch = DisruptionWatch::start(&admin);

    // Every machine from now on fails (its kubelet cannot start): far more
    // than the guard's threshold, so what stops the rollout is the guard.
    cluster.launcher.break_next(100);
    let t0 = Instant::now();
    scenario.restart_with_ami(&new_ami).await?;
    wait_rollout(cluster, "False", "Reverted").await?;
    let reverted_s = t0.elapsed().as_secs_f64();
    cluster.launcher.break_next(0);
    let class = ec2nodeclasses(&admin).get(CLASS).await?;
    assert_eq!(class_ami(&class), AMD64_AMI, "the old AMI is back");
    let failed = rollout_state(&class)["refused"]["failed"]
        .as_array()
        .map(Vec::len)
        .unwrap_or_default();

    let survivors = calm_on(cluster, AMD64_AMI, &old).await?;
    let broken = cluster
        .launcher
        .machines()
        .into_values()
        .filter(|m| m.broken)
        .count();
    let (max, drifted) = watch.seen(|s| (s.max, s.drifted.clone()));
    eprintln!(
        "reverted after {reverted_s:.1} s and {failed} failed NodeClaims ({broken} broken machines); \
         {survivors} of {FLEET} old NodeClaims survived; most disrupted at once {max}; drifted {drifted:?}"
    );
    assert!(
        failed >= ROLLOUT_FAILURES,
        "reverted after {failed} failures, not the guard's {ROLLOUT_FAILURES}"
    );
    assert!(max <= BUDGET, "{max} disrupted at once");
    assert!(
        old.iter().any(|name| drifted.contains_key(name)),
        "Karpenter never found the fleet drifted: {drifted:?}"
    );
    // Karpenter deletes a drifted node only once its replacement is
    // Initialized, and no replacement on the failing AMI ever is.
    assert_eq!(survivors, FLEET, "old NodeClaims were replaced by failures");
    record(
        cluster,
        json!({
            "rollout_reverted_after_failed": failed,
            "rollout_reverted_broken_machines": broken,
            "rollout_reverted_s": round(reverted_s),
            "rollout_reverted_old_survived": survivors,
            "rollout_reverted_fleet": FLEET,
            "rollout_reverted_failures_threshold": ROLLOUT_FAILURES,
        }),
    )
}

/// The leaf certificate (PEM) the join API at `addr` presents, as
/// `openssl s_client` receives it.
fn served_leaf(addr: SocketAddr) -> Result<String> {
    let output = std::process::Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string()])
        .args(["-servername", "localhost", "-showcerts"])
        .stdin(std::process::Stdio::null())
        .output()
        .context("running openssl s_client")?;
    let text = String::from_utf8_lossy(&output.stdout);
    const END: &str = "-----END CERTIFICATE-----";
    let start = text
        .find("-----BEGIN CERTIFICATE-----")
        .with_context(|| format!("no certificate from {addr}: {text}"))?;
    let end = text[start..].find(END).context("a truncated certificate")? + start + END.len();
    Ok(text[start..end].to_string())
}

fn same_pem(a: &str, b: &str) -> bool {
    let squeeze = |s: &str| s.split_whitespace().collect::<String>();
    squeeze(a) == squeeze(b)
}

/// Writes `text` to `path` by a rename, as a Secret's volume is updated.
fn replace_file(path: &std::path::Path, text: &str) -> Result<()> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("replacing {}", path.display()))
}

/// The server's metric `name` (0 until set).
async fn server_metric(server: &TestServer, name: &str) -> Result<f64> {
    let metrics = server::http_get(&format!("{}/metrics", server.metrics_url()))
        .await?
        .1;
    let prefix = format!("{name} ");
    Ok(metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str())?.trim().parse().ok())
        .unwrap_or(0.0))
}

/// The reasons of the Events on the class.
async fn class_event_reasons(client: &Client) -> Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let selector = format!("involvedObject.name={CLASS},involvedObject.kind=EC2NodeClass");
    Ok(events
        .list(&ListParams::default().fields(&selector))
        .await?
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect())
}

/// What Karpenter's drift reads of the class: its userData, its hash and
/// its generation (bumped by any spec change).
async fn class_fingerprint(client: &Client) -> Result<(String, Option<String>, Option<i64>)> {
    let class = ec2nodeclasses(client).get(CLASS).await?;
    let user_data = class.data["spec"]["userData"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let hash = class
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CLASS_HASH))
        .cloned();
    Ok((user_data, hash, class.metadata.generation))
}

/// cert-manager's renewal: a new key and certificate from the cluster's
/// join CA written over the files the server was started with. Returns
/// how long after the write the server served it.
async fn rotate_serving_certificate(cluster: &KarpenterCluster) -> Result<f64> {
    let addr = host_addr(&cluster.server)?;
    let first = served_leaf(addr)?;
    let loopback = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let serving = cluster.join_ca.server(&["localhost"], &[loopback])?;
    let dir = cluster.server.dir();
    let t0 = Instant::now();
    replace_file(&dir.join("tls.key"), &serving.key_pem)?;
    let chain = format!("{}{}", serving.cert_pem, cluster.join_ca.cert_pem());
    replace_file(&dir.join("tls.crt"), &chain)?;
    cluster
        .wait_for("the new certificate served", LAUNCH_TIMEOUT, || async {
            Ok(same_pem(&served_leaf(addr)?, &serving.cert_pem).then_some(()))
        })
        .await?;
    assert!(!same_pem(&first, &serving.cert_pem));
    Ok(t0.elapsed().as_secs_f64())
}

/// Scales the workload by one pod: Karpenter launches a machine, which
/// joins through autonode and is Initialized beside the `old` NodeClaims.
async fn one_more_machine_joins(cluster: &KarpenterCluster, old: &BTreeSet<String>) -> Result<()> {
    let admin = cluster.cp.admin().await?;
    scale_workload(&admin, old.len() + 1).await?;
    let fleet = wait_fleet(cluster, AMD64_AMI, &BTreeSet::new(), old.len() + 1).await?;
    let joined: Vec<DynamicObject> = fleet
        .into_iter()
        .filter(|c| !old.contains(c.metadata.name.as_deref().unwrap_or_default()))
        .collect();
    assert_eq!(joined.len(), 1);
    assert_joined_on(cluster, &joined, AMD64_AMI).await
}

/// Checks the class is as `before` (userData, hash, generation: nothing
/// for Karpenter to drift on) and no NodeClaim is or was `Drifted` or
/// disrupted; returns the NodeClaims Drifted (0).
async fn nothing_drifted(
    admin: &Client,
    watch: &DisruptionWatch,
    before: &(String, Option<String>, Option<i64>),
) -> Result<usize> {
    let after = class_fingerprint(admin).await?;
    assert_eq!(&after, before, "the class changed");
    let claims = list_nodeclaims(admin).await?;
    let drifted = claims.iter().filter(|c| is_true(c, "Drifted")).count();
    let (max, ever_drifted) = watch.seen(|s| (s.max, s.drifted.len()));
    assert_eq!(drifted + ever_drifted + max, 0, "{claims:#?}");
    Ok(drifted + ever_drifted)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_serving_certificate_under_the_same_join_ca_drifts_nothing_and_new_machines_still_join(
) -> Result<()> {
    let scenario = Scenario::start(1).await?;
    let cluster = &scenario.cluster;
    let admin = cluster.cp.admin().await?;
    let old = scenario.claim_names().await?;
    let before = class_fingerprint(&admin).await?;
    let watch = DisruptionWatch::start(&admin);

    let reloaded_s = rotate_serving_certificate(cluster).await?;
    // A machine launched now joins against the new certificate.
    one_more_machine_joins(cluster, &old).await?;

    // A restart (a new pod reads the new pair at start) changes nothing
    // either: the same userData, so the same class hash, and no spec
    // write at all.
    cluster.server.restart().await?;
    cluster
        .wait_for("the restarted upkeep's check", LAUNCH_TIMEOUT, || async {
            let checks = server_metric(&cluster.server, "autonode_nodeclass_checks_total").await?;
            Ok((checks >= 1.0).then_some(()))
        })
        .await?;
    let drifted = nothing_drifted(&admin, &watch, &before).await?;
    // The state key is its own file, not derived from the TLS key just
    // rotated, so the guard kept its state through the restart.
    let reasons = class_event_reasons(&admin).await?;
    assert!(
        !reasons.iter().any(|r| r == "RolloutStateRejected"),
        "{reasons:?}"
    );
    eprintln!("new certificate served {reloaded_s:.1} s after it was written; drifted {drifted}");
    record(
        cluster,
        json!({
            "serving_cert_rotation_drifted": drifted,
            "serving_cert_reloaded_s": round(reloaded_s),
        }),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_api_server_url_reaches_new_machines_in_their_join_answer_and_drifts_nothing(
) -> Result<()> {
    let scenario = Scenario::start(1).await?;
    let cluster = &scenario.cluster;
    let admin = cluster.cp.admin().await?;
    let old = scenario.claim_names().await?;
    let before = class_fingerprint(&admin).await?;
    let watch = DisruptionWatch::start(&admin);

    // Another address of the same API server (a relay; the API server's
    // certificate names 127.0.0.1), given to nodes with --api-server-url.
    // The join answer carries it, userData does not.
    let relay = Blip::start(cluster.cp.url()).await?;
    let more = format!("api-server-url = \"{}\"\n", relay.url());
    write_config(&scenario.config, AMD64_AMI, &more)?;
    cluster.server.restart().await?;

    // A machine launched now joins, and its kubelet reaches the API server
    // at the new URL: cutting the relay's connections finds it there.
    one_more_machine_joins(cluster, &old).await?;
    cluster
        .wait_for(
            "the new node's kubelet connected through the new URL",
            LAUNCH_TIMEOUT,
            || async { Ok((relay.cut() >= 1).then_some(())) },
        )
        .await?;

    // The class is as it was: nothing for Karpenter to drift on.
    let drifted = nothing_drifted(&admin, &watch, &before).await?;
    record(cluster, json!({ "api_server_url_change_drifted": drifted }))
}
