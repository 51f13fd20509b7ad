//! A Deployment scaled up, followed to a running pod on a VM that the real
//! Karpenter launched and autonode joined ([`MachineKind::Vm`]): the steps
//! the integration test asserts and the demo narrates, each timed from the
//! scale-up.
//!
//! [`MachineKind::Vm`]: crate::machines::launcher::MachineKind::Vm

use crate::cloud::moto::MotoInstance;
use crate::fleet::cluster::{list_nodeclaims, KarpenterCluster, LAUNCH_TIMEOUT};
use crate::machines::vm::LOCAL_IMAGE;
use anyhow::{bail, Context, Result};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;
use std::time::{Duration, Instant};

/// The Deployment, in `default`; its pods carry `app=`[`DEPLOYMENT`].
pub const DEPLOYMENT: &str = "runs-on-autonode";

/// How long a step on the VM may take: a boot under emulation on shared
/// cores (minutes), kubelet's start, a pod's sandbox and container.
pub const VM_STEP_TIMEOUT: Duration = Duration::from_secs(600);

/// Creates [`DEPLOYMENT`] with no replica: one container of
/// [`LOCAL_IMAGE`], the one image the VM has (never pulled), asking for
/// a little CPU and memory so that Karpenter sizes a node for it.
pub async fn create_deployment(client: &Client) -> Result<()> {
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "namespace": "default"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": DEPLOYMENT}},
            "template": {
                "metadata": {"labels": {"app": DEPLOYMENT}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "sleeps",
                        "image": LOCAL_IMAGE,
                        "imagePullPolicy": "Never",
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                    }],
                },
            },
        },
    }))?;
    Api::<Deployment>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &deployment)
        .await
        .context("creating the Deployment")?;
    Ok(())
}

/// Scales [`DEPLOYMENT`] to `replicas`.
pub async fn scale(client: &Client, replicas: i32) -> Result<()> {
    let patch = json!({"spec": {"replicas": replicas}});
    Api::<Deployment>::namespaced(client.clone(), "default")
        .patch_scale(DEPLOYMENT, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("scaling the Deployment")?;
    Ok(())
}

/// One step of the journey: its name, when it was seen (from the
/// scale-up), and what was seen, for people.
#[derive(Debug, Clone)]
pub struct Step {
    pub name: &'static str,
    pub after: Duration,
    pub detail: String,
}

/// Where the pod went, and the steps on the way.
#[derive(Debug, Clone, Default)]
pub struct Journey {
    pub pod: String,
    pub claim: String,
    pub provider_id: String,
    pub instance_id: String,
    pub node: String,
    /// The kubelet that registered, as its Node reports it.
    pub kubelet_version: String,
    pub steps: Vec<Step>,
}

impl Journey {
    /// When step `name` was seen, in seconds from the scale-up.
    pub fn seconds(&self, name: &str) -> Option<f64> {
        self.steps
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.after.as_secs_f64())
    }
}

/// Follows the Deployment scaled up at `t0` to its pod running on a VM:
/// the pending pod, Karpenter's NodeClaim, its CreateFleet (the moto
/// instance), the agent's run in the VM, the Node kubelet registers, Ready,
/// Karpenter's Initialized, the pod Running. `tell` hears each step as
/// it is seen.
pub async fn follow(
    cluster: &KarpenterCluster,
    t0: Instant,
    tell: impl FnMut(&Step),
) -> Result<Journey> {
    let mut follower = Follower {
        cluster,
        admin: cluster.cp.admin().await?,
        t0,
        tell,
        journey: Journey::default(),
    };
    follower.pending_pod().await?;
    follower.launched().await?;
    follower.joined().await?;
    follower.node_ready().await?;
    cluster.initialized(&follower.journey.claim).await?;
    let detail = format!(
        "NodeClaim {} is Launched, Registered and Initialized",
        follower.journey.claim
    );
    follower.note("initialized", detail);
    let detail = follower.running().await?;
    follower.note("pod_running", detail);
    Ok(follower.journey)
}

/// The moto instance `id`, as moto describes it now.
pub async fn moto_instance(cluster: &KarpenterCluster, id: &str) -> Result<MotoInstance> {
    cluster
        .moto
        .instances()
        .await?
        .into_iter()
        .find(|i| i.id == id)
        .with_context(|| format!("moto does not know {id}"))
}

/// One journey being followed.
struct Follower<'a, F> {
    cluster: &'a KarpenterCluster,
    admin: Client,
    t0: Instant,
    tell: F,
    journey: Journey,
}

impl<F: FnMut(&Step)> Follower<'_, F> {
    fn note(&mut self, name: &'static str, detail: String) {
        let step = Step {
            name,
            after: self.t0.elapsed(),
            detail,
        };
        (self.tell)(&step);
        self.journey.steps.push(step);
    }

    /// The Deployment's pod, once the ReplicaSet has made it.
    async fn pending_pod(&mut self) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), "default");
        let selector = ListParams::default().labels(&format!("app={DEPLOYMENT}"));
        self.journey.pod = self
            .cluster
            .wait_for("the Deployment's pod", LAUNCH_TIMEOUT, || async {
                let list = pods.list(&selector).await?;
                Ok(list.items.into_iter().find_map(|p| p.metadata.name))
            })
            .await?;
        let detail = format!("pod {} is Pending: no node can take it", self.journey.pod);
        self.note("pod_pending", detail);
        Ok(())
    }

    /// Karpenter's NodeClaim, then its launch (CreateFleet on moto).
    async fn launched(&mut self) -> Result<()> {
        let admin = &self.admin;
        let claim = self
            .cluster
            .wait_for(
                "a NodeClaim for the pending pod",
                LAUNCH_TIMEOUT,
                || async { Ok(list_nodeclaims(admin).await?.into_iter().next()) },
            )
            .await?;
        let name = claim
            .metadata
            .name
            .clone()
            .context("a NodeClaim without a name")?;
        let requests = &claim.data["spec"]["resources"]["requests"];
        self.note(
            "nodeclaim",
            format!("Karpenter made NodeClaim {name} (requests {requests})"),
        );
        let (provider_id, instance_id) = self.cluster.launched(&name).await?;
        let instance = moto_instance(self.cluster, &instance_id).await?;
        let detail = format!(
            "CreateFleet: moto runs {instance_id} ({}, {}, {} in {}); NodeClaim Launched, providerID {provider_id}",
            instance.instance_type, instance.image_id, instance.private_ip, instance.zone,
        );
        self.journey.claim = name;
        self.journey.provider_id = provider_id;
        self.journey.instance_id = instance_id;
        self.note("launched", detail);
        Ok(())
    }

    /// The VM booted and its agent ran (exited 0): the agent's log.
    async fn joined(&mut self) -> Result<()> {
        let id = self.journey.instance_id.clone();
        let launcher = &self.cluster.launcher;
        let agent = self
            .cluster
            .wait_for("the agent's run in the VM", VM_STEP_TIMEOUT, || async {
                let Some(machine) = launcher.machine(&id) else {
                    return Ok(None);
                };
                if let Some(error) = &machine.error {
                    bail!("machine {id}: {error}");
                }
                Ok(machine.agent)
            })
            .await?;
        if agent.code != Some(0) {
            bail!(
                "the agent on {id} failed ({:?}):\n{}",
                agent.code,
                agent.log_tail
            );
        }
        self.note("agent_joined", agent.log_tail);
        Ok(())
    }

    /// The Node kubelet registered for the instance (by providerID, as
    /// Karpenter matches it), then Ready.
    async fn node_ready(&mut self) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.admin.clone());
        let provider_id = self.journey.provider_id.clone();
        let node = self
            .cluster
            .wait_for("the instance's Node", VM_STEP_TIMEOUT, || async {
                let list = nodes.list(&ListParams::default()).await?;
                Ok(list.items.into_iter().find(|n| {
                    n.spec.as_ref().and_then(|s| s.provider_id.as_deref())
                        == Some(provider_id.as_str())
                }))
            })
            .await?;
        let name = node
            .metadata
            .name
            .clone()
            .context("a Node without a name")?;
        let version = node
            .status
            .and_then(|s| s.node_info)
            .map(|i| i.kubelet_version)
            .unwrap_or_default();
        let detail = format!("kubelet {version} registered Node {name} (providerID {provider_id})");
        self.journey.node = name.clone();
        self.journey.kubelet_version = version;
        self.note("node_registered", detail);
        self.cluster
            .wait_for("the Node Ready", VM_STEP_TIMEOUT, || async {
                Ok(nodes.get_opt(&name).await?.filter(is_node_ready).map(drop))
            })
            .await?;
        self.note("node_ready", format!("Node {name} is Ready"));
        Ok(())
    }

    /// Waits for the pod to run on the journey's Node, every container
    /// running; says when its container started.
    async fn running(&self) -> Result<String> {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), "default");
        let journey = &self.journey;
        let pod = self
            .cluster
            .wait_for("the pod Running on the Node", VM_STEP_TIMEOUT, || async {
                let pod = pods.get(&journey.pod).await?;
                Ok(is_running_on(&pod, &journey.node).then_some(pod))
            })
            .await?;
        let status = pod.status.unwrap_or_default();
        let started = status
            .container_statuses
            .unwrap_or_default()
            .into_iter()
            .filter_map(|c| c.state?.running?.started_at)
            .map(|t| t.0.to_string())
            .collect::<Vec<_>>();
        Ok(format!(
            "pod {} is Running on {} (IP {}), its container started at {}",
            journey.pod,
            journey.node,
            status.pod_ip.unwrap_or_default(),
            started.join(", ")
        ))
    }
}

/// Whether a Node's Ready condition is True.
pub fn is_node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `pod` runs on `node`: phase Running, every container running.
pub fn is_running_on(pod: &Pod, node: &str) -> bool {
    let on_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref());
    let containers = status.and_then(|s| s.container_statuses.as_ref());
    on_node
        && phase == Some("Running")
        && containers.is_some_and(|all| {
            !all.is_empty()
                && all
                    .iter()
                    .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}
