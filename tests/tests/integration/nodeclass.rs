//! EC2NodeClass upkeep, `render-userdata` and `--install-crds`, against a
//! real control plane with autonode-server running under the shipped RBAC.

use anyhow::{bail, Context, Result};
use autonode_agent::config::{Config, Document, ServerTrust};
use autonode_tests::controlplane::ControlPlane;
use autonode_tests::karpenter::{self, ec2nodeclasses};
use autonode_tests::pki::Ca;
use autonode_tests::server::{self, TestServer};
use autonode_tests::world::{cloud_settings, World, REGION};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tempfile::TempDir;

const PUBLIC_URL: &str = "https://autonode.example.com:8443";
const CLUSTER: &str = "prod-eu-1";
const AMD64: &str = "ami-0123456789abcdef0";
const ARM64: &str = "ami-0fedcba987654321f";

/// The userData flags, with a join CA of their own (rendering does not
/// need it to be the serving certificate's).
struct NodeFlags {
    _dir: TempDir,
    ca_pem: String,
    flags: Vec<String>,
}

impl NodeFlags {
    fn new(extra: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let ca = Ca::new("autonode-join-ca")?;
        let path: PathBuf = dir.path().join("join-ca.pem");
        std::fs::write(&path, ca.cert_pem())?;
        let mut flags = vec![
            format!("--public-url={PUBLIC_URL}"),
            format!("--join-ca-file={}", path.display()),
            format!("--cluster-name={CLUSTER}"),
            "--agent-deadline=480".to_string(),
        ];
        flags.extend(extra.iter().map(|s| s.to_string()));
        Ok(Self {
            ca_pem: ca.cert_pem().to_string(),
            flags,
            _dir: dir,
        })
    }

    /// What `autonode-server render-userdata` prints for these flags.
    fn rendered(&self) -> Result<String> {
        let output = std::process::Command::new(server::binary("autonode-server")?)
            .arg("render-userdata")
            .args(&self.flags)
            .output()?;
        if !output.status.success() {
            bail!(
                "render-userdata: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8(output.stdout)?)
    }
}

/// The serve flags for upkeep: userData flags, AMIs, a 1 s resync.
fn serve_flags(node: &NodeFlags, extra: &[&str]) -> Vec<String> {
    let mut flags = node.flags.clone();
    flags.push(format!("--ami-ids=amd64={AMD64},arm64={ARM64}"));
    flags.push("--nodeclass-resync=1".into());
    flags.extend(extra.iter().map(|s| s.to_string()));
    flags
}

fn spec(class: &DynamicObject) -> &Value {
    &class.data["spec"]
}

/// Polls the class until `done` holds.
async fn wait_for(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    done: impl Fn(&DynamicObject) -> bool,
) -> Result<DynamicObject> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let class = api.get(name).await?;
        if done(&class) {
            return Ok(class);
        }
        if Instant::now() > deadline {
            bail!(
                "EC2NodeClass {name}: not {what} after 20s: {}",
                spec(&class)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A counter from the server's `/metrics`.
async fn metric(server: &TestServer, name: &str) -> Result<f64> {
    let (_, body) = server::http_get(&format!("{}/metrics", server.metrics_url())).await?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .with_context(|| format!("no {name} in /metrics"))
}

/// The reasons of the Events on object `name`.
async fn event_reasons(world: &World, name: &str) -> Result<Vec<String>> {
    let api: Api<Event> = Api::namespaced(world.cp.admin().await?, "default");
    let selector = format!("involvedObject.name={name},involvedObject.kind=EC2NodeClass");
    let events = api.list(&ListParams::default().fields(&selector)).await?;
    Ok(events.items.into_iter().filter_map(|e| e.reason).collect())
}

/// Fields of `spec` owned by a manager with an Apply operation.
fn applied_fields(class: &DynamicObject, manager: &str) -> Vec<String> {
    let entries = class.metadata.managed_fields.clone().unwrap_or_default();
    let mut fields: Vec<String> = entries
        .iter()
        .filter(|e| {
            e.manager.as_deref() == Some(manager) && e.operation.as_deref() == Some("Apply")
        })
        .filter_map(|e| e.fields_v1.as_ref()?.0.get("f:spec")?.as_object().cloned())
        .flat_map(|spec| spec.keys().cloned().collect::<Vec<_>>())
        .collect();
    fields.sort();
    fields
}

#[tokio::test]
async fn a_users_class_is_restored_after_every_edit() -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let world = World::start_with(&serve_flags(&node, &[])).await?;
    let rendered = node.rendered()?;
    let admin = world.cp.admin().await?;
    let api = ec2nodeclasses(&admin);
    karpenter::create_ec2nodeclass(&admin, "default", "#!/bin/bash\necho mine\n").await?;

    let kept = |c: &DynamicObject| spec(c)["userData"] == rendered.as_str();
    let class = wait_for(&api, "default", "restored", kept).await?;
    // Exactly what render-userdata prints, and the AMIs sorted by arch.
    assert_eq!(spec(&class)["userData"], rendered.as_str());
    assert_eq!(spec(&class)["amiFamily"], "Custom");
    assert_eq!(
        spec(&class)["amiSelectorTerms"],
        json!([{"id": AMD64}, {"id": ARM64}])
    );
    // The user's other fields stay, and autonode owns exactly its three.
    assert_eq!(spec(&class)["role"], "KarpenterNodeRole-test");
    assert!(spec(&class)["subnetSelectorTerms"].is_array());
    assert_eq!(
        applied_fields(&class, "autonode-server"),
        ["f:amiFamily", "f:amiSelectorTerms", "f:userData"]
    );

    // A user's later edit is reverted too.
    let edit = json!({"spec": {"userData": "edited", "amiFamily": "AL2",
                               "amiSelectorTerms": [{"alias": "al2@latest"}]}});
    api.patch("default", &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    let class = wait_for(&api, "default", "restored again", |c| {
        kept(c) && spec(c)["amiFamily"] == "Custom" && spec(c)["amiSelectorTerms"][0]["id"] == AMD64
    })
    .await?;
    assert_eq!(spec(&class)["userData"], rendered.as_str());

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reasons = event_reasons(&world, "default").await?;
        let restored = reasons.iter().filter(|r| *r == "NodeClassRestored").count();
        if restored >= 2 {
            break;
        }
        if Instant::now() > deadline {
            bail!("expected two NodeClassRestored Events, got {reasons:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric(&world.server, "autonode_nodeclass_writes_total").await?,
        2.0
    );
    Ok(())
}

#[tokio::test]
async fn an_unchanged_class_is_never_written_and_unselected_ones_are_left_alone() -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let selector = "--nodeclass-selector=autonode.dev/managed=true";
    let world = World::start_with(&serve_flags(&node, &[selector])).await?;
    let rendered = node.rendered()?;
    let admin = world.cp.admin().await?;
    let api = ec2nodeclasses(&admin);
    karpenter::create_ec2nodeclass(&admin, "foreign", "mine").await?;
    karpenter::create_ec2nodeclass(&admin, "kept", "mine").await?;
    let label = json!({"metadata": {"labels": {"autonode.dev/managed": "true"}}});
    api.patch("kept", &PatchParams::default(), &Patch::Merge(&label))
        .await?;
    let class = wait_for(&api, "kept", "restored", |c| {
        spec(c)["userData"] == rendered.as_str()
    })
    .await?;

    // Three resyncs (1 s each) later: compared, never written again.
    let checks = metric(&world.server, "autonode_nodeclass_checks_total").await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&world.server, "autonode_nodeclass_checks_total").await? < checks + 3.0 {
        if Instant::now() > deadline {
            bail!("fewer than three resyncs in 20s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        metric(&world.server, "autonode_nodeclass_writes_total").await?,
        1.0
    );
    let after = api.get("kept").await?;
    assert_eq!(
        after.metadata.resource_version,
        class.metadata.resource_version
    );
    assert_eq!(after.metadata.managed_fields, class.metadata.managed_fields);

    let foreign = api.get("foreign").await?;
    assert_eq!(spec(&foreign)["userData"], "mine");
    assert_eq!(spec(&foreign)["amiFamily"], "AL2023");
    assert!(event_reasons(&world, "foreign").await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn the_agent_reads_what_render_userdata_prints() -> Result<()> {
    let pinned = NodeFlags::new(&[])?;
    let config = Config::resolve(Document::from_user_data(pinned.rendered()?.as_bytes())?)?;
    assert_eq!(config.server_url.to_string(), format!("{PUBLIC_URL}/"));
    assert_eq!(config.cluster_name, CLUSTER);
    assert_eq!(config.deadline, Duration::from_secs(480));
    let pin: [u8; 32] = Sha256::digest(der(&pinned.ca_pem)?).into();
    assert_eq!(config.server_trust, ServerTrust::Sha256Pin(pin));

    let pem = NodeFlags::new(&["--join-ca-form=pem"])?;
    let rendered = pem.rendered()?;
    assert_eq!(rendered, pem.rendered()?, "byte-stable");
    let config = Config::resolve(Document::from_user_data(rendered.as_bytes())?)?;
    assert_eq!(
        config.server_trust,
        ServerTrust::Ca(vec![der(&pem.ca_pem)?])
    );
    Ok(())
}

fn der(pem: &str) -> Result<Vec<u8>> {
    let first = rustls_pemfile::certs(&mut pem.as_bytes()).next();
    Ok(first.context("no certificate")??.to_vec())
}

#[tokio::test]
async fn install_crds_installs_karpenters_crds_into_a_bare_cluster() -> Result<()> {
    let cp = ControlPlane::start_without_crds().await?;
    let admin = cp.admin().await?;
    server::apply_manifest(
        &admin,
        include_str!("../../../packaging/guest/rbac-install-crds.yaml"),
    )
    .await?;
    let cloud = autonode_tests::fakecloud::FakeCloud::new()?;
    let ec2 = cloud.start_ec2(REGION)?;
    let settings = cloud_settings(&cloud, &ec2);
    // Ready means its NodeClaim cache synced: the CRDs are there.
    let flags = ["--install-crds".to_string()];
    let first = TestServer::start(&cp, &settings, &flags).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for name in [
        "nodeclaims.karpenter.sh",
        "nodepools.karpenter.sh",
        "ec2nodeclasses.karpenter.k8s.aws",
    ] {
        let crd = crds.get(name).await?;
        let managers: Vec<_> = crd.metadata.managed_fields.unwrap_or_default();
        assert!(
            managers
                .iter()
                .any(|m| m.manager.as_deref() == Some("autonode-server")),
            "{name} not installed by autonode-server"
        );
    }
    karpenter::create_ec2nodeclass(&admin, "default", "x").await?;
    drop(first);

    // A second start finds them and updates them in place.
    let second = TestServer::start(&cp, &settings, &flags).await?;
    assert!(second.log().contains("Karpenter CRD installed"));
    assert!(ec2nodeclasses(&admin).get("default").await.is_ok());
    Ok(())
}
