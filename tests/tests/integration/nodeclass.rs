//! EC2NodeClass upkeep, `render-userdata` and `--install-crds`, against a
//! real control plane with autonode-server running under the shipped RBAC.

use anyhow::{bail, Context, Result};
use autonode_agent::config::{document_from_user_data, parse_document, Config};
use autonode_agent::trust::ServerTrust;
use autonode_tests::harness::pki::Ca;
use autonode_tests::harness::poll::{self, OnTimeout, Seen};
use autonode_tests::karpenter::standin::{self, ec2nodeclasses};
use autonode_tests::kube::controlplane::ControlPlane;
use autonode_tests::server::world::{cloud_settings, World, REGION};
use autonode_tests::server::{self, TestServer};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::time::Duration;
use tempfile::TempDir;

const PUBLIC_URL: &str = "https://autonode.example.com:8443";
const CLUSTER: &str = "prod-eu-1";
pub(crate) const AMD64: &str = "ami-0123456789abcdef0";
pub(crate) const ARM64: &str = "ami-0fedcba987654321f";

/// The userData flags, with a join CA of their own (rendering does not
/// need it to be the serving certificate's).
pub(crate) struct NodeFlags {
    _dir: TempDir,
    ca_pem: String,
    pub(crate) flags: Vec<String>,
}

impl NodeFlags {
    pub(crate) fn new(extra: &[&str]) -> Result<Self> {
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
    pub(crate) fn rendered(&self) -> Result<String> {
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

pub(crate) fn spec(class: &DynamicObject) -> &Value {
    &class.data["spec"]
}

/// Polls the class until `done` holds.
pub(crate) async fn wait_for(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    done: impl Fn(&DynamicObject) -> bool,
) -> Result<DynamicObject> {
    poll::until(
        &format!("EC2NodeClass {name} {what}"),
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            let class = api.get(name).await?;
            let saw = spec(&class).to_string();
            Ok(Seen(done(&class).then_some(class), saw))
        },
    )
    .await
}

/// A counter from the server's `/metrics`.
async fn metric(server: &TestServer, name: &str) -> Result<f64> {
    let (_, body) = server::http_get(&format!("{}/metrics", server.metrics_url())).await?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .with_context(|| format!("no {name} in /metrics"))
}

/// The reasons of the Events on object `name`, one per occurrence.
async fn event_reasons(world: &World, name: &str) -> Result<Vec<String>> {
    Ok(events_of(world, name)
        .await?
        .into_iter()
        .map(|(_, reason, _)| reason)
        .collect())
}

/// The Events on object `name`: (type, reason, message), one per
/// occurrence (the server aggregates repeats into one Event's `count`).
async fn events_of(world: &World, name: &str) -> Result<Vec<(String, String, String)>> {
    let api: Api<Event> = Api::namespaced(world.cp.admin().await?, "default");
    let selector = format!("involvedObject.name={name},involvedObject.kind=EC2NodeClass");
    let events = api.list(&ListParams::default().fields(&selector)).await?;
    Ok(events
        .items
        .into_iter()
        .flat_map(|e| {
            let times = usize::try_from(e.count.unwrap_or(1).max(1)).unwrap_or(1);
            let text = |s: Option<String>| s.unwrap_or_default();
            std::iter::repeat_n((text(e.type_), text(e.reason), text(e.message)), times)
        })
        .collect())
}

/// Polls the Events on `name` until `count` of them have `reason`.
async fn wait_for_events(
    world: &World,
    name: &str,
    reason: &str,
    count: usize,
) -> Result<Vec<(String, String, String)>> {
    poll::until(
        &format!("{count} {reason} Events on {name}"),
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            let events = events_of(world, name).await?;
            let found: Vec<_> = events.iter().filter(|e| e.1 == reason).cloned().collect();
            Ok(Seen(
                (found.len() >= count).then_some(found),
                format!("got {events:?}"),
            ))
        },
    )
    .await
}

/// Waits until the server has compared its classes `n` more times.
async fn resyncs(server: &TestServer, n: f64) -> Result<()> {
    let checks = metric(server, "autonode_nodeclass_checks_total").await?;
    poll::until(
        &format!("{n} more resyncs"),
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let now = metric(server, "autonode_nodeclass_checks_total").await?;
            Ok((now >= checks + n).then_some(()))
        },
    )
    .await
}

/// The fields under `spec` (or `spec.<below>`) owned by a manager with an
/// Apply operation.
fn applied_under(class: &DynamicObject, manager: &str, below: &[&str]) -> Vec<String> {
    let entries = class.metadata.managed_fields.clone().unwrap_or_default();
    let mut fields: Vec<String> = entries
        .iter()
        .filter(|e| {
            e.manager.as_deref() == Some(manager) && e.operation.as_deref() == Some("Apply")
        })
        .filter_map(|e| {
            let mut at = e.fields_v1.as_ref()?.0.get("f:spec")?;
            for key in below {
                at = at.get(*key)?;
            }
            at.as_object().cloned()
        })
        .flat_map(|spec| spec.keys().cloned().collect::<Vec<_>>())
        .filter(|key| key != ".")
        .collect();
    fields.sort();
    fields
}

/// Fields of `spec` owned by a manager with an Apply operation.
fn applied_fields(class: &DynamicObject, manager: &str) -> Vec<String> {
    applied_under(class, manager, &[])
}

/// The keys of `spec.metadataOptions` a manager's applies own.
fn applied_metadata_options(class: &DynamicObject, manager: &str) -> Vec<String> {
    applied_under(class, manager, &["f:metadataOptions"])
}

/// Whether the class has the metadata options autonode keeps.
pub(crate) fn imds_locked(class: &DynamicObject) -> bool {
    let options = &spec(class)["metadataOptions"];
    options["httpTokens"] == "required"
        && options["httpPutResponseHopLimit"] == 1
        && options["httpEndpoint"] == "enabled"
}

/// A user's edit weakening IMDS (and setting a key autonode does not keep).
fn weakened_imds(hops: u32) -> Value {
    json!({"spec": {"metadataOptions": {"httpTokens": "optional",
        "httpPutResponseHopLimit": hops, "httpProtocolIPv6": "enabled"}}})
}

#[tokio::test]
async fn a_users_class_is_restored_after_every_edit() -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let world = World::start_with(&serve_flags(&node, &[])).await?;
    let rendered = node.rendered()?;
    let admin = world.cp.admin().await?;
    let api = ec2nodeclasses(&admin);
    standin::create_ec2nodeclass(&admin, "default", "#!/bin/bash\necho mine\n").await?;

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
        [
            "f:amiFamily",
            "f:amiSelectorTerms",
            "f:metadataOptions",
            "f:userData"
        ]
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

    poll::until(
        "two NodeClassRestored Events",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let reasons = event_reasons(&world, "default").await?;
            let restored = reasons.iter().filter(|r| *r == "NodeClassRestored").count();
            Ok(Seen(
                (restored >= 2).then_some(()),
                format!("got {reasons:?}"),
            ))
        },
    )
    .await?;
    assert_eq!(
        metric(&world.server, "autonode_nodeclass_writes_total").await?,
        2.0
    );
    Ok(())
}

#[tokio::test]
async fn an_unchanged_class_is_never_written_and_unnamed_ones_are_left_alone() -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let world = World::start_with(&serve_flags(&node, &["--nodeclass-names=kept,other"])).await?;
    let rendered = node.rendered()?;
    let admin = world.cp.admin().await?;
    let api = ec2nodeclasses(&admin);
    standin::create_ec2nodeclass(&admin, "foreign", "mine").await?;
    standin::create_ec2nodeclass(&admin, "kept", "mine").await?;
    // Restored, and the rollout guard's status condition written after
    // it: the snapshot is of the class once autonode has nothing left to
    // say, so a later write would be a real one.
    let class = wait_for(
        &api,
        "kept",
        "restored and its rollout condition written",
        |c| {
            spec(c)["userData"] == rendered.as_str()
                && c.data["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "AutonodeRollout")
        },
    )
    .await?;

    // Three resyncs (1 s each) later: compared, never written again.
    resyncs(&world.server, 3.0).await?;
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
    let config = Config::resolve(document_from_user_data(pinned.rendered()?.as_bytes())?)?;
    assert_eq!(config.server_url.to_string(), format!("{PUBLIC_URL}/"));
    assert_eq!(config.cluster_name, CLUSTER);
    assert_eq!(config.deadline, Duration::from_secs(480));
    let pin: [u8; 32] = Sha256::digest(der(&pinned.ca_pem)?).into();
    assert_eq!(config.server_trust, ServerTrust::Sha256Pin(pin));

    let pem = NodeFlags::new(&["--join-ca-form=pem"])?;
    let rendered = pem.rendered()?;
    assert_eq!(rendered, pem.rendered()?, "byte-stable");
    let config = Config::resolve(document_from_user_data(rendered.as_bytes())?)?;
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
    autonode_tests::kube::manifest::apply_manifest(
        &admin,
        include_str!("../../../packaging/guest/rbac-install-crds.yaml"),
    )
    .await?;
    let cloud = autonode_tests::cloud::fakecloud::FakeCloud::new()?;
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
    standin::create_ec2nodeclass(&admin, "default", "x").await?;
    drop(first);

    // A second start finds them and updates them in place.
    let second = TestServer::start(&cp, &settings, &flags).await?;
    assert!(second.log().contains("Karpenter CRD installed"));
    assert!(ec2nodeclasses(&admin).get("default").await.is_ok());
    Ok(())
}

/// A world whose server runs with `extra` upkeep flags, and the class
/// `default`, created by a user, once the server has restored it.
async fn world_with_class(
    node: &NodeFlags,
    extra: &[&str],
) -> Result<(World, Api<DynamicObject>, DynamicObject)> {
    let world = World::start_with(&serve_flags(node, extra)).await?;
    let rendered = node.rendered()?;
    let admin = world.cp.admin().await?;
    let api = ec2nodeclasses(&admin);
    standin::create_ec2nodeclass(&admin, "default", "mine").await?;
    let class = wait_for(&api, "default", "restored", |c| {
        spec(c)["userData"] == rendered.as_str()
    })
    .await?;
    Ok((world, api, class))
}

#[tokio::test]
async fn a_users_weakened_metadata_options_are_reverted_and_their_other_keys_kept() -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let (world, api, _) = world_with_class(&node, &[]).await?;

    // IMDSv1 and a hop limit a pod can reach: both put back, the user's
    // IPv6 choice kept, and autonode owns exactly the three keys it keeps.
    api.patch(
        "default",
        &PatchParams::default(),
        &Patch::Merge(&weakened_imds(2)),
    )
    .await?;
    let class = wait_for(&api, "default", "IMDS locked again", imds_locked).await?;
    assert_eq!(
        spec(&class)["metadataOptions"]["httpProtocolIPv6"],
        "enabled"
    );
    assert_eq!(spec(&class)["role"], "KarpenterNodeRole-test");
    assert_eq!(
        applied_metadata_options(&class, "autonode-server"),
        [
            "f:httpEndpoint",
            "f:httpPutResponseHopLimit",
            "f:httpTokens"
        ]
    );

    let restored = wait_for_events(&world, "default", "NodeClassRestored", 2).await?;
    let notes: Vec<&str> = restored.iter().map(|e| e.2.as_str()).collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("spec.metadataOptions.httpTokens")
                && n.contains("spec.metadataOptions.httpPutResponseHopLimit")),
        "{notes:?}"
    );
    // The create, then the edit: one write each.
    assert_eq!(
        metric(&world.server, "autonode_nodeclass_writes_total").await?,
        2.0
    );
    Ok(())
}

#[tokio::test]
async fn with_enforcement_off_a_users_metadata_options_stay_and_are_warned_about_once() -> Result<()>
{
    let node = NodeFlags::new(&[])?;
    let off = "--enforce-metadata-options=false";
    let (world, api, class) = world_with_class(&node, &[off]).await?;
    assert!(
        world
            .server
            .log()
            .contains("--enforce-metadata-options=false: "),
        "no start warning:\n{}",
        world.server.log()
    );
    assert!(applied_metadata_options(&class, "autonode-server").is_empty());

    api.patch(
        "default",
        &PatchParams::default(),
        &Patch::Merge(&weakened_imds(2)),
    )
    .await?;
    let warned = wait_for_events(&world, "default", "InstanceMetadataExposed", 1).await?;
    assert_eq!(warned[0].0, "Warning");
    assert!(warned[0].2.contains("httpTokens is optional"), "{warned:?}");
    assert!(
        warned[0].2.contains("httpPutResponseHopLimit is 2"),
        "{warned:?}"
    );
    assert!(world
        .server
        .log()
        .contains("EC2NodeClass lets pods read instance metadata"));

    // Resyncs neither revert the edit nor repeat the warning.
    resyncs(&world.server, 3.0).await?;
    let class = api.get("default").await?;
    assert_eq!(spec(&class)["metadataOptions"]["httpTokens"], "optional");
    assert_eq!(
        spec(&class)["metadataOptions"]["httpPutResponseHopLimit"],
        2
    );
    let exposed = events_of(&world, "default").await?;
    let exposed = exposed.iter().filter(|e| e.1 == "InstanceMetadataExposed");
    assert_eq!(exposed.count(), 1);
    assert_eq!(
        metric(&world.server, "autonode_nodeclass_writes_total").await?,
        1.0
    );

    // A further change is a new warning.
    let wider = json!({"spec": {"metadataOptions": {"httpPutResponseHopLimit": 3}}});
    api.patch("default", &PatchParams::default(), &Patch::Merge(&wider))
        .await?;
    let warned = wait_for_events(&world, "default", "InstanceMetadataExposed", 2).await?;
    assert!(
        warned
            .iter()
            .any(|e| e.2.contains("httpPutResponseHopLimit is 3")),
        "{warned:?}"
    );
    Ok(())
}

#[tokio::test]
async fn turning_enforcement_off_hands_the_options_over_at_their_values() -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let lease = "--leader-lease=3";
    let (world, api, _) = world_with_class(&node, &[lease]).await?;
    api.patch(
        "default",
        &PatchParams::default(),
        &Patch::Merge(&weakened_imds(2)),
    )
    .await?;
    wait_for(&api, "default", "owned by autonode", |c| {
        imds_locked(c) && applied_metadata_options(c, "autonode-server").len() == 3
    })
    .await?;

    // The same settings with enforcement off, once the first server is
    // gone: autonode lets go of the keys, and they keep their values
    // (server-side apply would remove them, had nobody taken them over).
    world.server.kill();
    let cloud = cloud_settings(&world.cloud, &world.ec2);
    let off = serve_flags(&node, &[lease, "--enforce-metadata-options=false"]);
    let second = TestServer::start(&world.cp, &cloud, &off).await?;
    let class = wait_for(&api, "default", "released", |c| {
        applied_metadata_options(c, "autonode-server").is_empty()
    })
    .await?;
    assert!(imds_locked(&class), "{}", spec(&class));
    assert_eq!(
        spec(&class)["metadataOptions"]["httpProtocolIPv6"],
        "enabled"
    );
    assert_eq!(
        applied_metadata_options(&class, "autonode-server-handover"),
        [
            "f:httpEndpoint",
            "f:httpPutResponseHopLimit",
            "f:httpTokens"
        ]
    );
    // Still autonode's: everything else it keeps.
    assert_eq!(
        applied_fields(&class, "autonode-server"),
        ["f:amiFamily", "f:amiSelectorTerms", "f:userData"]
    );
    // Logged once the apply has returned, which may be after the watch saw it.
    poll::until(
        "release logged",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            Ok(second
                .log()
                .contains("metadataOptions released")
                .then_some(()))
        },
    )
    .await
    .on_timeout(|| format!(":\n{}", second.log()))?;

    // From now on, the user's edit stays.
    let optional = json!({"spec": {"metadataOptions": {"httpTokens": "optional"}}});
    api.patch("default", &PatchParams::default(), &Patch::Merge(&optional))
        .await?;
    wait_for_events(&world, "default", "InstanceMetadataExposed", 1).await?;
    resyncs(&second, 2.0).await?;
    let class = api.get("default").await?;
    assert_eq!(spec(&class)["metadataOptions"]["httpTokens"], "optional");
    // The handover and autonode's own apply without the keys: no more.
    assert_eq!(
        metric(&second, "autonode_nodeclass_writes_total").await?,
        2.0
    );
    Ok(())
}

#[tokio::test]
async fn unsetting_the_ami_ids_hands_the_terms_over_at_their_values() -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let lease = "--leader-lease=3";
    let (world, api, class) = world_with_class(&node, &[lease]).await?;
    let terms = json!([{"id": AMD64}, {"id": ARM64}]);
    assert_eq!(spec(&class)["amiSelectorTerms"], terms);
    assert!(applied_fields(&class, "autonode-server").contains(&"f:amiSelectorTerms".into()));

    // Events are published in the background: this one before the kill.
    wait_for_events(&world, "default", "NodeClassRestored", 1).await?;

    // The same settings without --ami-ids, once the first server is gone:
    // autonode lets go of the terms, and they keep their values (the CRD
    // requires them: removing them would be refused on every try).
    world.server.kill();
    let cloud = cloud_settings(&world.cloud, &world.ec2);
    let mut without = node.flags.clone();
    without.extend([lease.to_string(), "--nodeclass-resync=1".to_string()]);
    assert!(!without.iter().any(|f| f.starts_with("--ami-ids")));
    let second = TestServer::start(&world.cp, &cloud, &without).await?;
    let class = wait_for(&api, "default", "released", |c| {
        !applied_fields(c, "autonode-server").contains(&"f:amiSelectorTerms".into())
    })
    .await?;
    assert_eq!(spec(&class)["amiSelectorTerms"], terms);
    assert!(
        applied_fields(&class, "autonode-server-handover").contains(&"f:amiSelectorTerms".into())
    );
    let told = wait_for_events(&world, "default", "AmiSelectionReleased", 1).await?;
    assert!(told[0].2.contains("--ami-ids is unset"), "{told:?}");

    // What autonode still keeps is still restored: an apply without the
    // terms, which must not take them away.
    let rendered = node.rendered()?;
    let edit = json!({"spec": {"userData": "edited"}});
    api.patch("default", &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    wait_for_events(&world, "default", "NodeClassRestored", 2).await?;
    let class = wait_for(&api, "default", "restored", |c| {
        spec(c)["userData"] == rendered.as_str()
    })
    .await?;
    assert_eq!(spec(&class)["amiSelectorTerms"], terms);

    // A user's edit of the terms stays, and nothing is refused or retried.
    let mine = json!([{"id": "ami-0aaaaaaaaaaaaaaaa"}]);
    let edit = json!({"spec": {"amiSelectorTerms": mine}});
    api.patch("default", &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    resyncs(&second, 3.0).await?;
    let class = api.get("default").await?;
    assert_eq!(spec(&class)["amiSelectorTerms"], mine);
    // The handover, autonode's apply without the terms, the restore.
    assert_eq!(
        metric(&second, "autonode_nodeclass_writes_total").await?,
        3.0
    );
    let released = wait_for_events(&world, "default", "AmiSelectionReleased", 1).await?;
    assert_eq!(released.len(), 1, "{released:?}");
    let log = second.log();
    assert!(!log.contains("reconcile failed"), "{log}");
    assert_eq!(
        log.matches("no longer manages the EC2NodeClass").count(),
        1,
        "{log}"
    );
    Ok(())
}

/// What `autonode-server render-userdata --format <format>` prints for
/// `node`'s flags.
fn rendered_as(node: &NodeFlags, format: &str) -> Result<String> {
    let output = std::process::Command::new(server::binary("autonode-server")?)
        .arg("render-userdata")
        .arg(format!("--format={format}"))
        .args(&node.flags)
        .output()?;
    if !output.status.success() {
        bail!(
            "render-userdata --format={format}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// The one file an Ignition config writes: its path, mode and decoded
/// contents (from a `data:;base64,` URL, the only source it may use).
fn ignition_file(ignition: &str) -> Result<(String, u64, String)> {
    use base64::Engine as _;
    let doc: Value = serde_json::from_str(ignition).context("Ignition JSON")?;
    let files = doc["storage"]["files"]
        .as_array()
        .context("storage.files")?;
    let [file] = files.as_slice() else {
        bail!("expected one file, got {files:?}");
    };
    let source = file["contents"]["source"].as_str().context("source")?;
    let data = source
        .strip_prefix("data:;base64,")
        .with_context(|| format!("not a base64 data URL: {source}"))?;
    let contents = base64::engine::general_purpose::STANDARD.decode(data)?;
    Ok((
        file["path"].as_str().context("path")?.to_string(),
        file["mode"].as_u64().context("mode")?,
        String::from_utf8(contents)?,
    ))
}

/// Runs the real `ignition-validate` (Debian's `ignition` package) on
/// `config`; an error when the tool is missing, refuses it or warns.
fn ignition_validate(config: &str) -> Result<()> {
    const TOOL: &str = "/usr/bin/ignition-validate";
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("userdata.ign");
    std::fs::write(&path, config)?;
    let output = std::process::Command::new(TOOL)
        .arg(&path)
        .output()
        .with_context(|| format!("running {TOOL} (install Debian's ignition package)"))?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() || !said.trim().is_empty() {
        bail!("ignition-validate ({}): {said}\n{config}", output.status);
    }
    Ok(())
}

#[tokio::test]
async fn the_ignition_form_is_valid_ignition_writing_the_toml_form() -> Result<()> {
    for extra in [&[][..], &["--join-ca-form=pem"][..]] {
        let node = NodeFlags::new(extra)?;
        let toml = rendered_as(&node, "toml")?;
        assert_eq!(toml, node.rendered()?, "toml is the default");
        let ignition = rendered_as(&node, "ignition")?;
        assert_eq!(ignition, rendered_as(&node, "ignition")?, "byte-stable");
        ignition_validate(&ignition)?;

        let (path, mode, contents) = ignition_file(&ignition)?;
        assert_eq!(path, autonode_agent::config::LOCAL_FILE);
        assert_eq!(mode, 0o644);
        assert_eq!(contents, toml, "byte-identical to the TOML form");
        // The agent reads the written file as its local config.
        let config = Config::resolve(parse_document(&contents, &path)?)?;
        assert_eq!(config.cluster_name, CLUSTER);
        assert_eq!(config.server_url.to_string(), format!("{PUBLIC_URL}/"));
    }
    // The test itself can fail: a config Ignition refuses is refused.
    let relative = r#"{"ignition":{"version":"3.0.0"},"storage":{"files":[{"path":"etc/x"}]}}"#;
    assert!(ignition_validate(relative).is_err());

    let bad = std::process::Command::new(server::binary("autonode-server")?)
        .args(["render-userdata", "--format=yaml"])
        .args(&NodeFlags::new(&[])?.flags)
        .output()?;
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("ignition"));
    Ok(())
}

/// Sets (or, with `None`, removes) `class`'s userData format annotation.
async fn annotate_format(api: &Api<DynamicObject>, class: &str, value: Option<&str>) -> Result<()> {
    let patch = json!({"metadata": {"annotations": {"autonode.dev/userdata-format": value}}});
    api.patch(class, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[tokio::test]
async fn each_class_gets_the_userdata_format_its_annotation_names() -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let world = World::start_with(&serve_flags(&node, &[])).await?;
    let (toml, ignition) = (rendered_as(&node, "toml")?, rendered_as(&node, "ignition")?);
    let admin = world.cp.admin().await?;
    let api = ec2nodeclasses(&admin);
    let format = |value: &str| json!({"autonode.dev/userdata-format": value});
    let mine = || {
        let mut spec = standin::custom_spec(json!({}));
        spec["userData"] = "mine".into();
        spec
    };
    standin::create_nodeclass(&admin, "flatcar", format("ignition"), mine()).await?;
    standin::create_nodeclass(&admin, "plain", json!({}), mine()).await?;
    standin::create_nodeclass(&admin, "typo", format("Ignition"), mine()).await?;

    let has = |user_data: &str| {
        let user_data = user_data.to_string();
        move |c: &DynamicObject| spec(c)["userData"] == user_data.as_str()
    };
    wait_for(&api, "flatcar", "given Ignition", has(&ignition)).await?;
    wait_for(&api, "plain", "given TOML", has(&toml)).await?;

    // An unknown value: ignored, warned about once naming the value; the
    // class is kept, in the default form since its userData was no
    // rendering of autonode's.
    let warned = wait_for_events(&world, "typo", "UserDataFormatUnknown", 1).await?;
    assert_eq!(warned[0].0, "Warning");
    assert!(warned[0].2.contains("\"Ignition\""), "{warned:?}");
    let toml_kept = has(&toml);
    let before = wait_for(&api, "typo", "given TOML despite the typo", |c| {
        toml_kept(c)
            && c.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "AutonodeRollout")
    })
    .await?;
    resyncs(&world.server, 3.0).await?;
    let after = api.get("typo").await?;
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    let warnings = events_of(&world, "typo").await?;
    let warnings = warnings.iter().filter(|e| e.1 == "UserDataFormatUnknown");
    assert_eq!(warnings.count(), 1);
    let log = world.server.log();
    assert!(
        log.lines()
            .any(|l| l.contains("userData format annotation is unknown")
                && l.contains("typo")
                && l.contains("Ignition")),
        "{log}"
    );
    assert_eq!(
        metric(&world.server, "autonode_nodeclass_writes_total").await?,
        3.0
    );

    // Fixed, the class gets Ignition; a typo then keeps the Ignition form
    // it has; a switch back to TOML is the class's choice too.
    annotate_format(&api, "typo", Some("ignition")).await?;
    wait_for(&api, "typo", "given Ignition once fixed", has(&ignition)).await?;
    annotate_format(&api, "typo", Some("ignitoin")).await?;
    wait_for_events(&world, "typo", "UserDataFormatUnknown", 2).await?;
    resyncs(&world.server, 2.0).await?;
    assert_eq!(spec(&api.get("typo").await?)["userData"], ignition.as_str());
    annotate_format(&api, "flatcar", None).await?;
    wait_for(&api, "flatcar", "given TOML once unannotated", has(&toml)).await?;
    Ok(())
}

/// A class editor's merge patch of class `name`.
async fn merge(api: &Api<DynamicObject>, name: &str, patch: &Value) -> Result<()> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// A class editor's edit of every field the upkeep keeps: their own
/// userData (a join server of theirs), AMI and family, and IMDS open to pods.
fn attackers_edit() -> Value {
    let mut edit = weakened_imds(2);
    edit["spec"]["userData"] = "server-url = \"https://attacker.example\"".into();
    edit["spec"]["amiFamily"] = "AL2023".into();
    edit["spec"]["amiSelectorTerms"] = json!([{"id": "ami-0badbadbadbadbad0"}]);
    edit
}

/// Whether `class` has every kept field back: IMDS locked, the rendered
/// userData, the configured AMIs.
pub(crate) fn fully_kept(rendered: &str) -> impl Fn(&DynamicObject) -> bool + '_ {
    move |c| {
        imds_locked(c)
            && spec(c)["userData"] == rendered
            && spec(c)["amiFamily"] == "Custom"
            && spec(c)["amiSelectorTerms"] == json!([{"id": AMD64}, {"id": ARM64}])
    }
}

#[tokio::test]
async fn a_class_editors_unknown_format_annotation_does_not_keep_their_edits() -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let (world, api, _) = world_with_class(&node, &[]).await?;
    let rendered = node.rendered()?;

    // The attack: an annotation naming no format, with the edit, in one patch.
    let mut edit = attackers_edit();
    edit["metadata"] = json!({"annotations": {"autonode.dev/userdata-format": "none-of-yours"}});
    merge(&api, "default", &edit).await?;
    wait_for(&api, "default", "fully kept again", fully_kept(&rendered)).await?;
    let warned = wait_for_events(&world, "default", "UserDataFormatUnknown", 1).await?;
    assert!(warned[0].2.contains("none-of-yours"), "{warned:?}");

    // And it stays so: the annotation is no off switch at any later resync.
    merge(&api, "default", &attackers_edit()).await?;
    let kept = fully_kept(&rendered);
    wait_for(&api, "default", "kept after a second edit", kept).await?;
    Ok(())
}

#[tokio::test]
async fn a_class_editor_cannot_take_a_named_class_out_of_the_upkeep() -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let names = "--nodeclass-names=default";
    let (_world, api, _) = world_with_class(&node, &[names]).await?;
    let rendered = node.rendered()?;

    // Whatever labels and annotations the class carries, stripped and
    // replaced, with the edit: the name decides, and it cannot change.
    let mut edit = attackers_edit();
    edit["metadata"] = json!({
        "labels": {"autonode.dev/managed": null, "autonode.dev/unmanaged": "true"},
        "annotations": {"autonode.dev/rollout": null},
    });
    merge(&api, "default", &edit).await?;
    wait_for(&api, "default", "fully kept again", fully_kept(&rendered)).await?;
    Ok(())
}
