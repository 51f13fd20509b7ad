//! Per-node config rendered from the NodeClaim, its EC2NodeClass and the
//! operator's Ignition ConfigMaps, through the real server under the
//! shipped RBAC (ConfigMaps in autonode-system, EC2NodeClasses cluster-wide).

use anyhow::{bail, ensure, Result};
use autonode_shared::ignition;
use autonode_shared::protocol::{ErrorResponse, JoinRequest, JoinResponse};
use autonode_tests::callers::joiner::{self, Answer, NodeKeys};
use autonode_tests::cloud::fakecloud::Instance;
use autonode_tests::harness::poll::{self, OnTimeout, Seen};
use autonode_tests::karpenter::standin;
use autonode_tests::kube::controlplane::unique;
use autonode_tests::kube::manifest::apply_manifest;
use autonode_tests::machines::node::launch_machine;
use autonode_tests::server::ignition as guest_ignition;
use autonode_tests::server::world::{cloud_settings, World, ACCOUNT, REGION};
use autonode_tests::server::{http_get, Setup, TestServer, SERVER_SERVICE_ACCOUNT};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::{json, Value};
use std::time::Duration;

/// Every `EC2NodeClass.spec.kubelet` field.
fn full_kubelet() -> Value {
    json!({
        "maxPods": 58, "podsPerCore": 4,
        "systemReserved": {"cpu": "100m", "memory": "100Mi", "ephemeral-storage": "1Gi"},
        "kubeReserved": {"cpu": "200m", "memory": "300Mi"},
        "evictionHard": {"memory.available": "5%", "nodefs.available": "10%"},
        "evictionSoft": {"memory.available": "10%"},
        "evictionSoftGracePeriod": {"memory.available": "1m30s"},
        "evictionMaxPodGracePeriod": 60,
        "imageGCHighThresholdPercent": 85, "imageGCLowThresholdPercent": 80,
        "cpuCFSQuota": false, "clusterDNS": ["10.100.0.10"],
    })
}

const BASE: &str = r#"{"ignition": {"version": "3.2.0"},
  "storage": {"files": [{"path": "/etc/motd", "contents": {"source": "data:,base"}},
                        {"path": "/etc/base-only", "contents": {"source": "data:,b"}}]},
  "systemd": {"units": [{"name": "base.service", "contents": "[Service]\nExecStart=/bin/true\n"}]}}"#;
const CLASS: &str = r#"{"ignition": {"version": "3.3.0"},
  "storage": {"files": [{"path": "/etc/motd", "overwrite": true, "contents": {"source": "data:,class"}}]}}"#;
const BROKEN: &str = r#"{"ignition": {"version": "3.3.0"}, "storage": {"disks": [{"device": "/dev/xvdb", "wipeTable": true}]}}"#;

/// An EC2NodeClass as an operator writes it, with `spec.kubelet` and the
/// ConfigMap holding its Ignition config.
async fn create_class(world: &World, name: &str, kubelet: Value, ignition: &str) -> Result<()> {
    let annotations = json!({"autonode.dev/ignition": ignition});
    let spec = standin::custom_spec(kubelet);
    standin::create_nodeclass(&world.cp.admin().await?, name, annotations, spec).await?;
    Ok(())
}

/// A server with the base config in ConfigMap `base` and a class `class`
/// (every kubelet field set) whose own config, in `<class>-ignition`, is
/// merged over it.
async fn layered_world(class: &str) -> Result<World> {
    let world = World::start_with(&["--base-ignition=base".into()]).await?;
    put_configmap(&world, "base", BASE).await?;
    let configmap = format!("{class}-ignition");
    put_configmap(&world, &configmap, CLASS).await?;
    create_class(&world, class, full_kubelet(), &configmap).await?;
    Ok(world)
}

/// Creates or replaces an Ignition ConfigMap.
async fn put_configmap(world: &World, name: &str, config: &str) -> Result<()> {
    guest_ignition::put_configmap(&world.cp.admin().await?, name, config).await
}

/// Creates or replaces an Ignition Secret.
async fn put_secret(world: &World, name: &str, config: &str) -> Result<()> {
    guest_ignition::put_secret(&world.cp.admin().await?, name, config).await
}

/// Joins until the server answers something other than 503 for a cache
/// still catching up: returns the first 503 whose log line says `why`.
async fn unavailable_because(world: &World, request: &JoinRequest, why: &str) -> Result<String> {
    until_503_for(world, why, || async {
        let answer = world.joiner.join(request).await?;
        let Answer::Refused(503, body) = answer else {
            bail!("expected 503 ({why}), got {answer:?}");
        };
        ensure!(body.error == "temporarily unavailable", "{body:?}");
        Ok(logged_for(world, &body, why))
    })
    .await
}

/// Polls `join` for up to 20 s until it yields the server's log line for a
/// 503; fails with the server's log.
async fn until_503_for<F, Fut>(world: &World, why: &str, join: F) -> Result<String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<String>>>,
{
    let what = format!("503 for {why:?}");
    poll::until(
        &what,
        Duration::from_secs(20),
        Duration::from_millis(200),
        join,
    )
    .await
    .on_timeout(|| format!(":\n{}", world.server.log()))
}

/// The server's log line for the refusal `body`, if it says `why`.
fn logged_for(world: &World, body: &ErrorResponse, why: &str) -> Option<String> {
    world
        .server
        .log()
        .lines()
        .find(|l| l.contains(&body.request_id) && l.contains(why))
        .map(str::to_string)
}

/// Karpenter's part for a NodeClaim of `class` with taints, startup taints
/// and labels (some kubelet may not set), then the instance.
async fn launch(world: &World, class: &str) -> Result<Instance> {
    let admin = world.cp.admin().await?;
    let name = format!("{class}-{}", unique());
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": name, "labels": {
            "karpenter.sh/nodepool": "gpu",
            "team": "ml",
            "node-role.kubernetes.io/worker": "",
        }},
        "spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": class},
            "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}],
            "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
            "startupTaints": [{"key": "node.cilium.io/agent-not-ready", "effect": "NoExecute"}],
        },
    }))?;
    standin::nodeclaims(&admin)
        .create(&PostParams::default(), &object)
        .await?;
    let instance = world.cloud.launch(
        Instance::builder()
            .account_id(ACCOUNT)
            .region(REGION)
            .build(),
    );
    standin::set_provider_id(&admin, &name, &instance.provider_id()).await?;
    Ok(instance)
}

/// Joins as an agent does: 503s (caches catching up with objects the test
/// just wrote) are retried.
async fn join(world: &World, request: &JoinRequest) -> Result<JoinResponse> {
    join_granted(
        world,
        request,
        Duration::from_secs(20),
        Duration::from_millis(200),
    )
    .await
}

/// Joins until granted, a 503 retried every `every` for up to `within`;
/// any other refusal fails at once.
pub(crate) async fn join_granted(
    world: &World,
    request: &JoinRequest,
    within: Duration,
    every: Duration,
) -> Result<JoinResponse> {
    poll::until("join granted", within, every, || async {
        Ok(match world.joiner.join(request).await? {
            Answer::Granted(response) => Seen(Some(*response), String::new()),
            Answer::Refused(503, body) => Seen(None, format!("join answered 503: {body:?}")),
            Answer::Refused(status, body) => bail!("join answered {status}: {body:?}"),
        })
    })
    .await
}

/// The decoded contents of `path` in a rendered Ignition config.
fn file(config: &Value, path: &str) -> Option<Vec<u8>> {
    let parsed = ignition::parse(config).expect("the agent accepts the config");
    let file = parsed.storage.files.into_iter().find(|f| f.path == path)?;
    let source = file.contents.source?;
    let (meta, data) = source.strip_prefix("data:")?.split_once(',')?;
    if meta.ends_with(";base64") {
        return base64::engine::general_purpose::STANDARD.decode(data).ok();
    }
    Some(data.as_bytes().to_vec())
}

#[tokio::test]
async fn the_class_shapes_kubelet_and_ignition_is_merged_identically_for_each_node() -> Result<()> {
    let world = layered_world("gpu").await?;

    let first = launch(&world, "gpu").await?;
    let keys = NodeKeys::generate()?;
    let response = join(
        &world,
        &joiner::honest_request(&first, world.cloud.ca(), &keys)?,
    )
    .await?;

    let config = &response.kubelet.config;
    for (key, value) in full_kubelet().as_object().into_iter().flatten() {
        assert_eq!(&config[key], value, "spec.kubelet.{key}");
    }
    assert_eq!(config["rotateCertificates"], true);
    assert_eq!(config["serverTLSBootstrap"], true);
    assert_eq!(config["shutdownGracePeriod"], "45s");
    assert_eq!(config["clusterDomain"], "cluster.local");
    assert_eq!(
        response.kubelet.register_with_taints,
        [
            "karpenter.sh/unregistered:NoExecute",
            "nvidia.com/gpu=true:NoSchedule",
            "node.cilium.io/agent-not-ready:NoExecute",
        ]
    );
    let labels: Vec<_> = response.kubelet.node_labels.iter().collect();
    assert_eq!(
        labels,
        [
            (&"karpenter.sh/nodepool".to_string(), &"gpu".to_string()),
            (&"team".to_string(), &"ml".to_string()),
        ],
        "node-role.kubernetes.io/* is not kubelet's to set"
    );

    // base < class < generated.
    let ignition = &response.ignition;
    assert_eq!(ignition["ignition"]["version"], "3.4.0");
    assert_eq!(file(ignition, "/etc/motd").as_deref(), Some(&b"class"[..]));
    assert_eq!(file(ignition, "/etc/base-only").as_deref(), Some(&b"b"[..]));
    assert_eq!(ignition["systemd"]["units"][0]["name"], "base.service");
    let kubelet_file = file(ignition, "/etc/kubernetes/kubelet/config.json").expect("generated");
    assert_eq!(serde_json::from_slice::<Value>(&kubelet_file)?, *config);

    // Another node of the same class gets byte-identical config.
    let second = launch(&world, "gpu").await?;
    let keys = NodeKeys::generate()?;
    let other = join(
        &world,
        &joiner::honest_request(&second, world.cloud.ca(), &keys)?,
    )
    .await?;
    assert_eq!(
        serde_json::to_vec(&other.kubelet.config)?,
        serde_json::to_vec(&response.kubelet.config)?
    );
    assert_eq!(
        serde_json::to_vec(&other.ignition)?,
        serde_json::to_vec(&response.ignition)?
    );
    assert_eq!(
        other.kubelet.register_with_taints,
        response.kubelet.register_with_taints
    );
    Ok(())
}

#[tokio::test]
async fn a_broken_ignition_config_is_retryable_and_reported_on_the_class() -> Result<()> {
    let world = World::start().await?;
    put_configmap(&world, "broken-ignition", BROKEN).await?;
    create_class(&world, "broken", json!({"maxPods": 20}), "broken-ignition").await?;
    let instance = launch(&world, "broken").await?;
    let keys = NodeKeys::generate()?;
    let request = joiner::honest_request(&instance, world.cloud.ca(), &keys)?;

    // 503 until the server's caches show the objects just written, then
    // 503 for the config's own fault, named in the log.
    let line = unavailable_because(&world, &request, "storage.disks").await?;
    assert!(
        line.contains("ConfigMap autonode-system/broken-ignition"),
        "the log names the ConfigMap: {line}"
    );
    stays_refused(&world, &request, &instance).await?;
    world.event_reasons("broken", "NodeConfigInvalid").await?;
    let events: Api<Event> = Api::namespaced(world.cp.admin().await?, "default");
    let selector = "involvedObject.kind=EC2NodeClass,involvedObject.name=broken";
    let about_disks: Vec<_> = events
        .list(&ListParams::default().fields(selector))
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.message
                .as_deref()
                .unwrap_or_default()
                .contains("storage.disks")
        })
        .collect();
    assert_eq!(
        about_disks.len(),
        1,
        "one Event on the class, however often the agent retried"
    );
    assert_eq!(about_disks[0].reason.as_deref(), Some("NodeConfigInvalid"));

    // The operator fixes the config; the agent's retry succeeds.
    put_configmap(&world, "broken-ignition", CLASS).await?;
    let response = join(&world, &request).await?;
    assert_eq!(response.kubelet.config["maxPods"], 20);
    assert_eq!(
        file(&response.ignition, "/etc/motd").as_deref(),
        Some(&b"class"[..])
    );
    Ok(())
}

/// The server keeps what it rendered while the layers are unchanged; a
/// layer written into something invalid is judged anew, and every join
/// from then on is refused for it, never served what was kept.
#[tokio::test]
async fn a_layer_broken_mid_run_refuses_the_next_joins() -> Result<()> {
    let world = layered_world("gpu").await?;
    for _ in 0..2 {
        let instance = launch(&world, "gpu").await?;
        let request = joiner::honest_request(&instance, world.cloud.ca(), &NodeKeys::generate()?)?;
        let response = join(&world, &request).await?;
        assert_eq!(
            file(&response.ignition, "/etc/base-only").as_deref(),
            Some(&b"b"[..])
        );
    }

    put_configmap(&world, "base", BROKEN).await?;
    let probe = launch(&world, "gpu").await?;
    let request = joiner::honest_request(&probe, world.cloud.ca(), &NodeKeys::generate()?)?;
    refused_once_seen(&world, &request, "storage.disks").await?;
    // The server has seen the change: a new node is refused from its
    // first join on.
    let instance = launch(&world, "gpu").await?;
    let request = joiner::honest_request(&instance, world.cloud.ca(), &NodeKeys::generate()?)?;
    let line = unavailable_because(&world, &request, "storage.disks").await?;
    assert!(
        line.contains("ConfigMap autonode-system/base (base Ignition, --base-ignition)"),
        "the log names the base ConfigMap: {line}"
    );
    stays_refused(&world, &request, &instance).await
}

/// A join refused for its config stays refused on retry, and nothing is
/// approved for it: its CSRs were created beside the rendering and deleted
/// unapproved when the rendering failed.
async fn stays_refused(world: &World, request: &JoinRequest, instance: &Instance) -> Result<()> {
    for _ in 0..3 {
        let again = world.joiner.join(request).await?;
        ensure!(again.status() == 503, "still refused: {again:?}");
    }
    let csrs = world.csrs_for(instance).await?;
    ensure!(csrs.is_empty(), "CSRs left behind: {csrs:?}");
    Ok(())
}

/// Joins while the server's cache may still hold the layer as it was (a
/// join may be granted meanwhile) until a 503 whose log line says `why`.
async fn refused_once_seen(world: &World, request: &JoinRequest, why: &str) -> Result<String> {
    until_503_for(world, why, || async {
        match world.joiner.join(request).await? {
            Answer::Granted(_) => Ok(None),
            Answer::Refused(503, body) => Ok(logged_for(world, &body, why)),
            answer => bail!("expected a join or 503 ({why}), got {answer:?}"),
        }
    })
    .await
}

#[tokio::test]
async fn the_agent_applies_the_merged_config() -> Result<()> {
    let world = layered_world("default").await?;
    let (_, node) = launch_machine(&world).await?;
    let run = node.run_agent(&[]).await?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "agent failed:\n{stderr}");
    assert_eq!(std::fs::read(node.path("/etc/motd"))?, b"class");
    assert_eq!(std::fs::read(node.path("/etc/base-only"))?, b"b");
    let written: Value = serde_json::from_slice(&std::fs::read(
        node.path("/etc/kubernetes/kubelet/config.json"),
    )?)?;
    assert_eq!(written["maxPods"], 58);
    Ok(())
}

/// Configs that carry credentials live in Secrets: `secret/<name>` in the
/// flag or the class's annotation. A missing one is retryable and named; a
/// reference of another kind is the operator's typo, named too.
#[tokio::test]
async fn ignition_from_secrets_is_merged_and_a_missing_one_is_named() -> Result<()> {
    let world = World::start_with(&["--base-ignition=secret/base-creds".into()]).await?;
    put_secret(&world, "base-creds", BASE).await?;
    create_class(&world, "creds", json!({}), "secret/class-creds").await?;
    create_class(&world, "typo", json!({}), "pods/class-creds").await?;

    let instance = launch(&world, "creds").await?;
    let request = joiner::honest_request(&instance, world.cloud.ca(), &NodeKeys::generate()?)?;
    let line = unavailable_because(&world, &request, "does not exist").await?;
    assert!(
        line.contains("Secret autonode-system/class-creds (Ignition of EC2NodeClass creds)"),
        "{line}"
    );
    world.event_reasons("creds", "NodeConfigInvalid").await?;

    put_secret(&world, "class-creds", CLASS).await?;
    let response = join(&world, &request).await?;
    assert_eq!(
        file(&response.ignition, "/etc/motd").as_deref(),
        Some(&b"class"[..]),
        "the class's Secret wins over the base"
    );
    assert_eq!(
        file(&response.ignition, "/etc/base-only").as_deref(),
        Some(&b"b"[..]),
        "the base Secret is merged under it"
    );

    let typo = launch(&world, "typo").await?;
    let request = joiner::honest_request(&typo, world.cloud.ca(), &NodeKeys::generate()?)?;
    let line = unavailable_because(&world, &request, "neither configmap nor secret").await?;
    assert!(line.contains("pods/class-creds"), "{line}");
    Ok(())
}

/// A replica that cannot read its Ignition namespace would keep every join
/// waiting: `/readyz` says so, names the cache, and turns ready once the
/// operator grants the read.
#[tokio::test]
async fn readyz_waits_for_the_node_config_caches() -> Result<()> {
    const ELSEWHERE: &str = "autonode-elsewhere";
    let world = World::start().await?;
    let settings = cloud_settings(&world.cloud, &world.ec2);
    let args = [format!("--ignition-namespace={ELSEWHERE}")];
    let setup = Setup {
        extra_args: &args,
        wait_ready: false,
        ..Setup::default()
    };
    let server = TestServer::launch(&world.cp, &settings, &setup).await?;
    let readyz = format!("{}/readyz", server.metrics_url());

    // Its RBAC grants ConfigMaps only in autonode-system: never synced.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, body) = http_get(&readyz).await?;
    assert_eq!(status, 503, "ready without its Ignition ConfigMaps: {body}");
    assert!(
        body.contains("Ignition ConfigMap cache not synced"),
        "{body}"
    );

    apply_manifest(&world.cp.admin().await?, &ignition_grant(ELSEWHERE)).await?;
    poll::until(
        "readiness after the grant",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { Ok((http_get(&readyz).await?.0 == 200).then_some(())) },
    )
    .await
    .on_timeout(|| format!(":\n{}", server.log()))
}

/// What `packaging/guest/rbac.yaml` says to grant when
/// `--ignition-namespace` is not its default: the same Role and RoleBinding
/// in that namespace.
fn ignition_grant(namespace: &str) -> String {
    let (account_namespace, account) = SERVER_SERVICE_ACCOUNT;
    format!(
        r#"
apiVersion: v1
kind: Namespace
metadata:
  name: {namespace}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: autonode-server-ignition
  namespace: {namespace}
rules:
  - apiGroups: [""]
    resources: ["configmaps", "secrets"]
    verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: autonode-server-ignition
  namespace: {namespace}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: autonode-server-ignition
subjects:
  - kind: ServiceAccount
    name: {account}
    namespace: {account_namespace}
"#
    )
}
