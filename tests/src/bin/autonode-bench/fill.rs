//! Filling a fresh control plane with a fleet as it stands after its
//! machines joined: the EC2NodeClasses of a real fleet, NodeClaims as
//! Karpenter writes them, every machine joined through the join protocol
//! (so its NodeClaim is bound and both its CSRs exist, as joins leave
//! them), the Node its kubelet registers (Ready), and a client renewal
//! each, which the leader's approver judges and kube-controller-manager
//! signs.
//!
//! Where the real kubelet writes (its Node, its renewal), the bench writes
//! instead, fast: the Node as the cluster admin, the renewal as the node
//! (impersonating `system:node:<name>` in `system:nodes`, which is who the
//! approver and NodeRestriction see). The objects are shaped and sized as
//! on EKS (labels, annotations, images, conditions), since what the server
//! parses is what the API server sends, whatever it keeps of it.

use crate::burst::JoinClient;
use crate::options::BURST_DEADLINE;
use anyhow::{ensure, Context, Result};
use autonode_shared::protocol::JoinRequest;
use autonode_tests::callers::joiner::{self, CsrShape, NodeKeys};
use autonode_tests::cloud::fakecloud::Instance;
use autonode_tests::karpenter::standin::{self as karpenter, FIELD_MANAGER};
use autonode_tests::kube::controlplane::unique;
use autonode_tests::machines::node;
use autonode_tests::server::world::{World, ACCOUNT, REGION};
use autonode_tests::server::TestServer;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// EC2NodeClasses of the fleet: a few dozen, as a platform with a class
/// per team and workload kind has.
pub(crate) const CLASSES: usize = 36;
/// API writes in flight at once while filling (creates and patches).
const WRITES_IN_FLIGHT: usize = 48;
/// Joins in flight at once: below the server's concurrent-join limit
/// (256), so filling is not slowed by answers of 503 and their backoff.
const JOINS_IN_FLIGHT: usize = 192;
/// The kubelet client signer, which a client renewal asks.
pub(crate) const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Names of the bench's renewals begin so.
pub(crate) const RENEWAL_PREFIX: &str = "fleet-renewal-";

/// One machine of the fleet.
pub(crate) struct Machine {
    pub(crate) claim: String,
    pub(crate) instance: Instance,
}

impl Machine {
    /// The name its kubelet registers (the join's `node_name`).
    pub(crate) fn node_name(&self) -> &str {
        &self.instance.private_dns_name
    }
}

/// The fleet's EC2NodeClasses, each as an operator writes it for autonode
/// and with the status Karpenter gives it.
pub(crate) async fn classes(world: &World, admin: &kube::Client) -> Result<()> {
    let user_data = node::user_data(world);
    let api = karpenter::ec2nodeclasses(admin);
    futures::stream::iter(0..CLASSES)
        .map(|i| {
            let (api, user_data) = (api.clone(), user_data.clone());
            async move {
                let name = class_name(i);
                let object: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "karpenter.k8s.aws/v1",
                    "kind": "EC2NodeClass",
                    "metadata": {"name": name},
                    "spec": class_spec(i, &user_data),
                }))?;
                api.create(&PostParams::default(), &object)
                    .await
                    .with_context(|| format!("creating EC2NodeClass {name}"))?;
                let status = json!({"status": class_status(i)});
                api.patch_status(&name, &karpenter_writes(), &Patch::Merge(&status))
                    .await
                    .with_context(|| format!("status of EC2NodeClass {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(WRITES_IN_FLIGHT)
        .try_collect::<()>()
        .await
}

/// `count` machines: each NodeClaim created, its instance launched and its
/// providerID (and what else Karpenter writes at launch) set.
pub(crate) async fn launch(
    world: &World,
    admin: &kube::Client,
    count: usize,
) -> Result<Vec<Machine>> {
    let api = karpenter::nodeclaims(admin);
    futures::stream::iter(0..count)
        .map(|i| {
            let (api, cloud) = (api.clone(), &world.cloud);
            async move {
                let claim = format!("fleet-{}", unique());
                let class = class_name(i % CLASSES);
                let object: DynamicObject = serde_json::from_value(nodeclaim(&claim, &class, i))?;
                let create = PostParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..PostParams::default()
                };
                api.create(&create, &object)
                    .await
                    .with_context(|| format!("creating NodeClaim {claim}"))?;
                let built = Instance::builder()
                    .account_id(ACCOUNT)
                    .region(REGION)
                    .availability_zone(ZONES[i % 3])
                    .instance_type(INSTANCE_TYPE)
                    .build();
                let instance = cloud.launch(built);
                let status = json!({"status": nodeclaim_status(&instance)});
                api.patch_status(&claim, &karpenter_writes(), &Patch::Merge(&status))
                    .await
                    .with_context(|| format!("status of NodeClaim {claim}"))?;
                anyhow::Ok(Machine { claim, instance })
            }
        })
        .buffer_unordered(WRITES_IN_FLIGHT)
        .try_collect()
        .await
}

/// Joins every machine through the join protocol, a bounded number at a
/// time, with the agent's retry rules, spread over `servers` as a Service
/// spreads connections over replicas; fails if any join does.
pub(crate) async fn join(
    world: &World,
    servers: &[&TestServer],
    machines: &[Machine],
) -> Result<()> {
    let ca = world.cloud.ca().clone();
    let instances: Vec<Instance> = machines.iter().map(|m| m.instance.clone()).collect();
    let requests = tokio::task::spawn_blocking(move || {
        instances
            .iter()
            .map(|instance| joiner::honest_request(instance, &ca, &NodeKeys::generate()?))
            .collect::<Result<Vec<JoinRequest>>>()
    })
    .await??;
    // The servers' NodeClaim watches have seen the last providerID by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let clients = servers
        .iter()
        .map(|server| JoinClient::new(server.url(), server.ca_pem()))
        .collect::<Result<Vec<_>>>()?;
    let deadline = BURST_DEADLINE;
    let failed = futures::stream::iter(requests.into_iter().enumerate())
        .map(|(machine, request)| {
            let client = clients[machine % clients.len()].clone();
            async move { client.join_like_agent(machine, &request, deadline).await }
        })
        .buffer_unordered(JOINS_IN_FLIGHT)
        .filter_map(|outcome| async move { outcome.err() })
        .collect::<Vec<_>>()
        .await;
    if let Some(first) = failed.first() {
        anyhow::bail!(
            "{} of the fleet's joins failed, first: {first:#}",
            failed.len()
        );
    }
    Ok(())
}

/// The Node each machine's kubelet registers, Ready.
pub(crate) async fn register(admin: &kube::Client, machines: &[Machine]) -> Result<()> {
    let api: Api<Node> = Api::all(admin.clone());
    futures::stream::iter(machines.iter().enumerate())
        .map(|(i, machine)| {
            let api = api.clone();
            async move { register_one(&api, machine, i).await }
        })
        .buffer_unordered(WRITES_IN_FLIGHT)
        .try_collect()
        .await
}

/// Registers `machine`'s Node, Ready (what its kubelet would do).
pub(crate) async fn register_one(api: &Api<Node>, machine: &Machine, i: usize) -> Result<()> {
    let object: Node = serde_json::from_value(node_object(machine, i))?;
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("registering Node {}", machine.node_name()))?;
    Ok(())
}

/// A client renewal of each machine's kubelet, made as the node.
pub(crate) async fn renew(admin: &kube::Client, machines: &[Machine]) -> Result<()> {
    let shapes: Vec<String> = machines.iter().map(|m| m.node_name().to_string()).collect();
    let pems = tokio::task::spawn_blocking(move || {
        shapes
            .iter()
            .map(|name| CsrShape::client(name).csr(&rcgen::KeyPair::generate()?))
            .collect::<Result<Vec<String>>>()
    })
    .await??;
    futures::stream::iter(machines.iter().zip(pems))
        .map(|(machine, pem)| async move {
            renewal(admin, machine.node_name(), &pem).await.map(drop)
        })
        .buffer_unordered(WRITES_IN_FLIGHT)
        .try_collect()
        .await
}

/// Creates a client renewal (PEM `pem`) as node `node` would; returns its
/// name.
pub(crate) async fn renewal(admin: &kube::Client, node: &str, pem: &str) -> Result<String> {
    let name = format!("{RENEWAL_PREFIX}{}", unique());
    let body = json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, pem),
            "signerName": CLIENT_SIGNER,
            "usages": ["digital signature", "key encipherment", "client auth"],
        },
    });
    // Impersonated: the API server records the node as the CSR's
    // requester, as it does for kubelet's own.
    let request = http::Request::post("/apis/certificates.k8s.io/v1/certificatesigningrequests")
        .header("content-type", "application/json")
        .header("impersonate-user", format!("system:node:{node}"))
        .header("impersonate-group", "system:nodes")
        .header("impersonate-group", "system:authenticated")
        .body(serde_json::to_vec(&body)?)?;
    match admin.request::<CertificateSigningRequest>(request).await {
        Ok(created) => ensure!(created.metadata.name.as_deref() == Some(name.as_str())),
        // Sent again after the first try was taken (an overloaded API
        // server's answer lost): the name is this bench's alone.
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(e).with_context(|| format!("renewal of {node}")),
    }
    Ok(name)
}

/// Waits until `done` says the fleet has settled (it is asked every few
/// seconds, and prints what it sees), within `within`.
pub(crate) async fn settle<F, Fut>(what: &str, within: Duration, mut done: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(usize, usize)>>,
{
    let started = Instant::now();
    loop {
        let (have, want) = done().await?;
        if have >= want {
            eprintln!(
                "  {what}: {have} of {want} after {:.0}s",
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        ensure!(
            started.elapsed() < within,
            "{what}: only {have} of {want} after {within:?}"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// How many of the bench's renewals are signed, out of how many there are.
pub(crate) async fn renewals_signed(admin: &kube::Client) -> Result<(usize, usize)> {
    let api: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let mut params = kube::api::ListParams::default()
        .fields(&format!("spec.signerName={CLIENT_SIGNER}"))
        .limit(500);
    let (mut signed, mut all) = (0, 0);
    loop {
        let page = api.list(&params).await?;
        for csr in page.items.iter().filter(|c| {
            c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(RENEWAL_PREFIX))
        }) {
            all += 1;
            signed += usize::from(csr.status.as_ref().is_some_and(|s| s.certificate.is_some()));
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => params = params.continue_token(&next),
            None => return Ok((signed, all)),
        }
    }
}

/// How many NodeClaims autonode has reported bootstrapped (its condition
/// True), out of how many there are.
pub(crate) async fn reported(admin: &kube::Client) -> Result<(usize, usize)> {
    let api = karpenter::nodeclaims(admin);
    let mut params = kube::api::ListParams::default().limit(500);
    let (mut done, mut all) = (0, 0);
    loop {
        let page = api.list(&params).await?;
        for claim in &page.items {
            all += 1;
            done += usize::from(bootstrapped(claim));
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => params = params.continue_token(&next),
            None => return Ok((done, all)),
        }
    }
}

/// Whether autonode's condition on `claim` is True.
pub(crate) fn bootstrapped(claim: &DynamicObject) -> bool {
    let conditions = claim.data["status"]["conditions"].as_array();
    conditions.into_iter().flatten().any(|c| {
        c["type"] == autonode_server::kube::condition::BOOTSTRAPPED && c["status"] == "True"
    })
}

fn karpenter_writes() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

const INSTANCE_TYPE: &str = "m6i.xlarge";
const ZONES: [&str; 3] = ["us-west-2a", "us-west-2b", "us-west-2c"];

pub(crate) fn class_name(i: usize) -> String {
    let teams = ["payments", "search", "ml", "web", "batch", "data"];
    let kinds = ["general", "compute", "memory", "gpu", "spot", "system"];
    format!("{}-{}", teams[i % 6], kinds[(i / 6) % 6])
}

/// What Karpenter allots a node of [`INSTANCE_TYPE`] (its NodeClaim's
/// allocatable, and the Node's: no capacity shortfall to report).
fn allocatable() -> Value {
    json!({"cpu": "3920m", "memory": "14162Mi", "pods": "58", "ephemeral-storage": "89Gi"})
}

fn class_spec(i: usize, user_data: &str) -> Value {
    let mut spec = karpenter::custom_spec(json!({
        "maxPods": 58,
        "kubeReserved": {"cpu": "80m", "memory": "893Mi", "ephemeral-storage": "1Gi"},
        "systemReserved": {"cpu": "100m", "memory": "100Mi"},
        "evictionHard": {"memory.available": "5%", "nodefs.available": "10%"},
    }));
    spec["userData"] = user_data.into();
    spec["tags"] = json!({
        "team": class_name(i), "cost-center": format!("cc-{:04}", 1000 + i),
        "environment": "production", "managed-by": "karpenter",
        "karpenter.sh/discovery": "fleet",
    });
    spec["blockDeviceMappings"] = json!([{
        "deviceName": "/dev/xvda",
        "ebs": {"volumeSize": "100Gi", "volumeType": "gp3", "iops": 3000,
                "throughput": 125, "encrypted": true, "deleteOnTermination": true},
    }]);
    spec["detailedMonitoring"] = false.into();
    spec
}

fn class_status(i: usize) -> Value {
    let now = now();
    let condition = |type_: &str| {
        json!({"type": type_, "status": "True", "reason": type_, "message": "",
               "lastTransitionTime": now, "observedGeneration": 1})
    };
    let amis: Vec<Value> = ["amd64", "arm64"]
        .iter()
        .enumerate()
        .map(|(n, arch)| {
            json!({"id": format!("ami-0{:016x}", i * 2 + n), "name": format!("fleet-{arch}-2026.12"),
                   "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": [arch]}]})
        })
        .collect();
    let subnets: Vec<Value> = ZONES
        .iter()
        .enumerate()
        .map(|(n, zone)| json!({"id": format!("subnet-0{:016x}", i * 3 + n), "zone": zone, "zoneID": format!("usw2-az{}", n + 1)}))
        .collect();
    let conditions = [
        "AMIsReady",
        "SubnetsReady",
        "SecurityGroupsReady",
        "InstanceProfileReady",
        "ValidationSucceeded",
        "Ready",
    ]
    .map(condition);
    json!({
        "amis": amis,
        "subnets": subnets,
        "securityGroups": [{"id": format!("sg-0{i:016x}"), "name": format!("{}-nodes", class_name(i))}],
        "instanceProfile": format!("fleet_{}", class_name(i)),
        "conditions": conditions,
    })
}

/// A NodeClaim as Karpenter creates it for `class`.
fn nodeclaim(name: &str, class: &str, i: usize) -> Value {
    let pool = format!("pool-{}", i % 12);
    json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {
            "name": name,
            "labels": {
                "karpenter.sh/nodepool": pool,
                "karpenter.k8s.aws/ec2nodeclass": class,
                "karpenter.sh/capacity-type": "on-demand",
                "node.kubernetes.io/instance-type": INSTANCE_TYPE,
                "topology.kubernetes.io/region": REGION,
                "topology.kubernetes.io/zone": ZONES[i % 3],
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "karpenter.k8s.aws/instance-category": "m",
                "karpenter.k8s.aws/instance-family": "m6i",
                "karpenter.k8s.aws/instance-generation": "6",
                "karpenter.k8s.aws/instance-size": "xlarge",
                "karpenter.k8s.aws/instance-cpu": "4",
                "karpenter.k8s.aws/instance-memory": "16384",
                "team": class.split('-').next().unwrap_or_default(),
            },
            "annotations": {
                "karpenter.sh/nodepool-hash": format!("{}", 1_000_000_007u64 * (i as u64 % 12 + 1)),
                "karpenter.sh/nodepool-hash-version": "v3",
                "karpenter.k8s.aws/ec2nodeclass-hash": format!("{}", 2_000_000_011u64 * (i as u64 % 36 + 1)),
                "karpenter.k8s.aws/ec2nodeclass-hash-version": "v4",
                "karpenter.k8s.aws/tagged": "true",
            },
            "finalizers": ["karpenter.sh/termination"],
        },
        "spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": class},
            "expireAfter": "720h",
            "requirements": [
                {"key": "karpenter.sh/nodepool", "operator": "In", "values": [pool]},
                {"key": "node.kubernetes.io/instance-type", "operator": "In",
                 "values": ["m6i.xlarge", "m6i.2xlarge", "m7i.xlarge", "m7i.2xlarge", "c6i.2xlarge"]},
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ZONES},
                {"key": "karpenter.k8s.aws/instance-generation", "operator": "Gt", "values": ["5"]},
            ],
            "resources": {"requests": {"cpu": "2150m", "memory": "6Gi", "pods": "14"}},
        },
    })
}

/// What Karpenter writes on a NodeClaim's status once it has launched the
/// instance.
fn nodeclaim_status(instance: &Instance) -> Value {
    json!({
        "providerID": instance.provider_id(),
        "imageID": instance.image_id,
        "capacity": {"cpu": "4", "memory": "15155Mi", "pods": "58", "ephemeral-storage": "100Gi"},
        "allocatable": allocatable(),
        "conditions": [{
            "type": "Launched", "status": "True", "reason": "Launched", "message": "",
            "lastTransitionTime": now(),
        }],
    })
}

/// The Node a kubelet on EKS registers, grown to what it is once it has
/// run a while (its images pulled).
fn node_object(machine: &Machine, i: usize) -> Value {
    let (name, instance) = (machine.node_name(), &machine.instance);
    let now = now();
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({"type": type_, "status": status, "reason": reason,
               "message": format!("kubelet has {reason}"),
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let images: Vec<Value> = (0..40)
        .map(|n| {
            let repo = format!("602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/image-{n}");
            json!({"names": [format!("{repo}@sha256:{:064x}", n * 7919 + 1), format!("{repo}:v1.{n}.0")],
                   "sizeBytes": 20_000_000 + n * 1_000_003})
        })
        .collect();
    let ip = instance.private_ip.to_string();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/instance-type": INSTANCE_TYPE,
                "node.kubernetes.io/instance-type": INSTANCE_TYPE,
                "topology.kubernetes.io/region": REGION,
                "topology.kubernetes.io/zone": instance.availability_zone,
                "failure-domain.beta.kubernetes.io/region": REGION,
                "failure-domain.beta.kubernetes.io/zone": instance.availability_zone,
                "karpenter.sh/nodepool": format!("pool-{}", i % 12),
                "karpenter.sh/capacity-type": "on-demand",
                "karpenter.sh/initialized": "true",
                "karpenter.sh/registered": "true",
                "karpenter.k8s.aws/ec2nodeclass": class_name(i % CLASSES),
                "karpenter.k8s.aws/instance-family": "m6i",
                "karpenter.k8s.aws/instance-size": "xlarge",
                "k8s.io/cloud-provider-aws": "0123456789abcdef0123456789abcdef",
            },
            "annotations": {
                "alpha.kubernetes.io/provided-node-ip": ip,
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "karpenter.sh/nodepool-hash-version": "v3",
                "csi.volume.kubernetes.io/nodeid": format!("{{\"ebs.csi.aws.com\":\"{}\"}}", instance.instance_id),
            },
        },
        "spec": {"providerID": instance.provider_id()},
        "status": {
            "capacity": {"cpu": "4", "memory": "15947788Ki", "pods": "58",
                         "ephemeral-storage": "104845292Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "allocatable": allocatable(),
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "InternalDNS", "address": name},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": format!("{:032x}", i), "systemUUID": format!("ec2{:029x}", i),
                "bootID": format!("{:08x}-0000-4000-8000-{:012x}", i, i),
                "kernelVersion": "6.12.40-64.114.amzn2023.x86_64",
                "osImage": "Amazon Linux 2023.9.20260101", "containerRuntimeVersion": "containerd://2.1.4",
                "kubeletVersion": "v1.37.2-eks-0000000", "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64",
            },
            "images": images,
        },
    })
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
