//! The EC2NodeClass admission policy
//! (`packaging/guest/admission-manage-nodeclasses.yaml`) on a real API
//! server, with the real autonode-server keeping the classes: a class
//! editor's change of a kept field is refused, her other edits pass, the
//! server's own writes pass, and an editor patching in a loop never has her
//! values read back.

use crate::nodeclass::{fully_kept, spec, wait_for, NodeFlags, AMD64, ARM64};
use anyhow::{ensure, Context, Result};
use autonode_tests::harness::poll::{self, Seen};
use autonode_tests::karpenter::standin::{self, ec2nodeclasses, grant_on_nodeclasses};
use autonode_tests::kube::controlplane::serves_kind;
use autonode_tests::server::world::World;
use autonode_tests::server::{serves_nodeclass_admission, GuestRbac, Setup};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The editor: a guest user who may read, create and change EC2NodeClasses
/// (what a team owning its classes is given), nothing more.
const EDITOR: &str = "eve";
const EDITOR_VERBS: [&str; 6] = ["get", "list", "watch", "create", "update", "patch"];

/// Her values: a join server and AMI of her own, IMDS open to pods.
const HER_USER_DATA: &str =
    "server-url = \"https://eve.example:8443\"\nserver-ca-sha256 = \"00\"\n";
const HER_AMI: &str = "ami-0eeeeeeeeeeeeeee5";

/// The serve flags: userData flags, `extra`, a 1 s resync.
fn flags(node: &NodeFlags, extra: &[&str]) -> Vec<String> {
    let mut flags = node.flags.clone();
    flags.push("--nodeclass-resync=1".into());
    flags.extend(extra.iter().map(|s| s.to_string()));
    flags
}

/// The upkeep flags with both AMIs kept.
fn ami_flag() -> String {
    format!("--ami-ids=amd64={AMD64},arm64={ARM64}")
}

/// A world whose server runs with `flags`, under the guest files those
/// flags call for, the admission policy among them when `policy`.
async fn world(flags: &[String], policy: bool) -> Result<World> {
    let mut rbac = GuestRbac::for_flags(flags);
    rbac.nodeclass_admission = policy;
    let setup = Setup {
        extra_args: flags,
        rbac: Some(rbac),
        ..Setup::default()
    };
    World::start_setup(&setup).await
}

/// Whether this world's API server runs the policy; checks that the
/// harness's version gate says the same as discovery does.
async fn runs_policy(world: &World) -> Result<bool> {
    let admin = world.cp.admin().await?;
    let group = "admissionregistration.k8s.io/v1";
    let served = serves_kind(&admin, group, "ValidatingAdmissionPolicy").await;
    let version = world.cp.version();
    ensure!(
        served == serves_nodeclass_admission(version),
        "{version}: the API is served: {served}; the version gate says otherwise"
    );
    if !served {
        eprintln!("{version}: no ValidatingAdmissionPolicy v1; the upkeep alone reverts edits");
    }
    Ok(served)
}

/// The editor's view of the classes, once her grant is in place.
async fn editor(world: &World) -> Result<Api<DynamicObject>> {
    grant_on_nodeclasses(&world.cp.admin().await?, EDITOR, &EDITOR_VERBS).await?;
    Ok(ec2nodeclasses(&world.cp.client_as(EDITOR, None).await?))
}

/// An `amiFamily: Custom` class the policy lets anyone create: no
/// userData, the metadata options left to their defaults.
async fn create_plain_class(client: &Client, name: &str) -> Result<DynamicObject> {
    let spec = standin::custom_spec(json!({}));
    standin::create_nodeclass(client, name, json!({}), spec).await
}

/// The refusal a write met: its status code and message.
fn refusal<T>(result: kube::Result<T>) -> Result<Option<(u16, String)>> {
    match result {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(status)) => Ok(Some((status.code, status.message))),
        Err(e) => Err(e).context("a class write"),
    }
}

/// The editor's merge patch of class `name`, refused or not.
async fn patch(
    api: &Api<DynamicObject>,
    name: &str,
    body: &Value,
) -> Result<Option<(u16, String)>> {
    refusal(
        api.patch(name, &PatchParams::default(), &Patch::Merge(body))
            .await,
    )
}

/// Waits until the policy refuses the editor's change of `name`'s
/// userData (a dry run): the API server loads a new policy, its binding
/// and its settings a moment after they are written.
async fn wait_in_force(api: &Api<DynamicObject>, name: &str) -> Result<()> {
    let body = json!({"spec": {"userData": HER_USER_DATA}});
    poll::until(
        "the admission policy in force",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let params = PatchParams {
                dry_run: true,
                ..PatchParams::default()
            };
            let refused = refusal(api.patch(name, &params, &Patch::Merge(&body)).await)?;
            Ok(Seen(
                refused.as_ref().filter(|r| r.0 == 403).map(|_| ()),
                format!("last answer: {refused:?}"),
            ))
        },
    )
    .await
}

/// Asserts that `refused` is the policy's refusal naming `field`.
fn assert_refused(what: &str, refused: Option<(u16, String)>, field: &str) {
    let (code, message) = refused.unwrap_or_else(|| panic!("{what}: accepted"));
    assert_eq!(code, 403, "{what}: {message}");
    let policy = message.contains("ValidatingAdmissionPolicy 'autonode-nodeclasses'");
    let says_why = ["kept by autonode-server", "autonode-server's"]
        .iter()
        .any(|why| message.contains(why));
    assert!(
        policy && says_why && message.contains(field),
        "{what}: {message}"
    );
}

/// A world with the policy, AMIs and metadata options kept, the class
/// `default` created and kept by the server (its writes pass the policy),
/// and the editor's view once the policy is in force.
async fn guarded(node: &NodeFlags) -> Result<Option<(World, Api<DynamicObject>, DynamicObject)>> {
    let world = world(&flags(node, &[&ami_flag()]), true).await?;
    if !runs_policy(&world).await? {
        return Ok(None);
    }
    let admin = world.cp.admin().await?;
    create_plain_class(&admin, "default").await?;
    let rendered = node.rendered()?;
    let api = ec2nodeclasses(&admin);
    let class = wait_for(&api, "default", "kept", fully_kept(&rendered)).await?;
    let eve = editor(&world).await?;
    wait_in_force(&eve, "default").await?;
    Ok(Some((world, eve, class)))
}

#[tokio::test]
async fn a_class_editors_change_of_each_kept_field_is_refused_and_her_other_edits_pass(
) -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let Some((world, eve, before)) = guarded(&node).await? else {
        return Ok(());
    };
    let changes = [
        (
            "userData",
            json!({"spec": {"userData": HER_USER_DATA}}),
            "spec.userData",
        ),
        (
            "amiFamily",
            json!({"spec": {"amiFamily": "AL2023"}}),
            "spec.amiFamily",
        ),
        (
            "amiSelectorTerms",
            json!({"spec": {"amiSelectorTerms": [{"id": HER_AMI}]}}),
            "spec.amiSelectorTerms",
        ),
        (
            "httpTokens",
            json!({"spec": {"metadataOptions": {"httpTokens": "optional"}}}),
            "spec.metadataOptions",
        ),
        (
            "hop limit",
            json!({"spec": {"metadataOptions": {"httpPutResponseHopLimit": 2}}}),
            "spec.metadataOptions",
        ),
        (
            "httpEndpoint",
            json!({"spec": {"metadataOptions": {"httpEndpoint": "disabled"}}}),
            "spec.metadataOptions",
        ),
        (
            "rollout state",
            json!({"metadata": {"annotations": {"autonode.dev/rollout": "{}"}}}),
            "autonode.dev/rollout",
        ),
    ];
    for (what, body, field) in &changes {
        assert_refused(what, patch(&eve, "default", body).await?, field);
    }
    // Server-side apply under a manager of her own, forced: refused alike.
    let applied = json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
                         "metadata": {"name": "default"}, "spec": {"userData": HER_USER_DATA}});
    let forced = PatchParams::apply("eve").force();
    let result = eve.patch("default", &forced, &Patch::Apply(&applied)).await;
    assert_refused("apply", refusal(result)?, "spec.userData");

    // Her other fields, and a kept one at the value it has, pass.
    let rendered = node.rendered()?;
    let hers = json!({"metadata": {"labels": {"team": "eve"}},
                      "spec": {"tags": {"team": "eve"}, "userData": rendered,
                               "metadataOptions": {"httpProtocolIPv6": "enabled"}}});
    ensure!(
        patch(&eve, "default", &hers).await?.is_none(),
        "her own edit refused"
    );
    let now = eve.get("default").await?;
    assert_eq!(spec(&now)["tags"]["team"], "eve");
    assert_eq!(spec(&now)["metadataOptions"]["httpProtocolIPv6"], "enabled");
    assert!(fully_kept(&rendered)(&now), "{}", spec(&now));
    assert_eq!(now.metadata.uid, before.metadata.uid);
    creates_are_judged(&world, &eve, &rendered).await
}

/// A new class may not come with kept values of the creator's; one without
/// them is created and then kept by the server.
async fn creates_are_judged(world: &World, eve: &Api<DynamicObject>, rendered: &str) -> Result<()> {
    let class = |name: &str, extra: Value| -> Result<DynamicObject> {
        let mut spec = standin::custom_spec(json!({}));
        for (key, value) in extra.as_object().into_iter().flatten() {
            spec[key] = value.clone();
        }
        Ok(serde_json::from_value(json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
            "metadata": {"name": name}, "spec": spec,
        }))?)
    };
    let refused = [
        (
            "create with userData",
            json!({"userData": HER_USER_DATA}),
            "spec.userData",
        ),
        (
            "create with AL2023",
            json!({"amiFamily": "AL2023", "amiSelectorTerms": [{"alias": "al2023@latest"}]}),
            "spec.amiFamily",
        ),
        (
            "create with IMDS open",
            json!({"metadataOptions": {"httpTokens": "optional", "httpPutResponseHopLimit": 2}}),
            "spec.metadataOptions",
        ),
    ];
    for (what, extra, field) in refused {
        let result = eve
            .create(&PostParams::default(), &class("hers", extra)?)
            .await;
        assert_refused(what, refusal(result)?, field);
    }
    eve.create(&PostParams::default(), &class("hers", json!({}))?)
        .await
        .context("a plain class of hers")?;
    let api = ec2nodeclasses(&world.cp.admin().await?);
    wait_for(&api, "hers", "kept by the server", fully_kept(rendered)).await?;
    Ok(())
}

#[tokio::test]
async fn only_what_the_server_keeps_is_locked() -> Result<()> {
    // Only `kept` is kept, without AMIs or metadata options.
    let node = NodeFlags::new(&[])?;
    let extra = ["--nodeclass-names=kept", "--enforce-metadata-options=false"];
    let world = world(&flags(&node, &extra), true).await?;
    if !runs_policy(&world).await? {
        return Ok(());
    }
    let admin = world.cp.admin().await?;
    create_plain_class(&admin, "kept").await?;
    create_plain_class(&admin, "other").await?;
    let rendered = node.rendered()?;
    let api = ec2nodeclasses(&admin);
    wait_for(&api, "kept", "kept", |c| {
        spec(c)["userData"] == rendered.as_str()
    })
    .await?;
    let eve = editor(&world).await?;
    wait_in_force(&eve, "kept").await?;

    let free = json!({"spec": {"amiSelectorTerms": [{"id": HER_AMI}],
                               "metadataOptions": {"httpTokens": "optional"}}});
    ensure!(
        patch(&eve, "kept", &free).await?.is_none(),
        "unkept fields refused"
    );
    let body = json!({"spec": {"userData": HER_USER_DATA}});
    assert_refused(
        "userData",
        patch(&eve, "kept", &body).await?,
        "spec.userData",
    );
    // A class the server does not keep is wholly hers, created or edited.
    ensure!(
        patch(&eve, "other", &body).await?.is_none(),
        "other class refused"
    );
    let mut theirs = standin::custom_spec(json!({}));
    theirs["userData"] = HER_USER_DATA.into();
    let object = json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
                        "metadata": {"name": "third"}, "spec": theirs});
    eve.create(&PostParams::default(), &serde_json::from_value(object)?)
        .await
        .context("an unkept class with userData")?;
    Ok(())
}

/// What the loop saw: the editor's patches accepted and refused, the
/// sampler's reads and how many of them showed any of her values.
#[derive(Debug, Default)]
struct LoopCount {
    accepted: u64,
    refused: u64,
    reads: u64,
    hers: u64,
}

/// Whether `class` shows any of the editor's values.
fn shows_hers(class: &DynamicObject) -> bool {
    let s = spec(class);
    s["userData"] == HER_USER_DATA
        || s["amiSelectorTerms"][0]["id"] == HER_AMI
        || s["metadataOptions"]["httpTokens"] == "optional"
        || s["metadataOptions"]["httpPutResponseHopLimit"] == 2
}

/// The finding's attack: the editor repeats her edit (userData, AMI, IMDS
/// open) as fast as the API server answers, for `length`, while a sampler
/// reads the class every few milliseconds.
async fn loop_attack(world: &World, length: Duration) -> Result<LoopCount> {
    let eve = editor(world).await?;
    let reader = ec2nodeclasses(&world.cp.admin().await?);
    let edit = json!({"spec": {"userData": HER_USER_DATA,
                               "amiSelectorTerms": [{"id": HER_AMI}],
                               "metadataOptions": {"httpTokens": "optional",
                                                   "httpPutResponseHopLimit": 2}}});
    let end = Instant::now() + length;
    let editing = async {
        let mut count = LoopCount::default();
        while Instant::now() < end {
            match patch(&eve, "default", &edit).await? {
                None => count.accepted += 1,
                Some(_) => count.refused += 1,
            }
        }
        Ok::<_, anyhow::Error>(count)
    };
    let sampling = async {
        let (mut reads, mut hers) = (0, 0);
        while Instant::now() < end {
            let class = reader.get("default").await?;
            reads += 1;
            hers += u64::from(shows_hers(&class));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok::<_, anyhow::Error>((reads, hers))
    };
    let (edits, sampled) = futures::future::join(editing, sampling).await;
    let (reads, hers) = sampled?;
    let count = LoopCount {
        reads,
        hers,
        ..edits?
    };
    eprintln!("loop over {length:?}: {count:?}");
    Ok(count)
}

/// How long the loop runs: the finding sampled 20 s.
const LOOP: Duration = Duration::from_secs(21);

#[tokio::test]
async fn an_editor_patching_in_a_loop_never_has_her_values_read_back() -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let Some((world, _, _)) = guarded(&node).await? else {
        return Ok(());
    };
    let count = loop_attack(&world, LOOP).await?;
    assert_eq!(count.accepted, 0, "{count:?}");
    assert!(count.refused >= 10 * LOOP.as_secs(), "few edits: {count:?}");
    assert!(count.reads >= 10 * LOOP.as_secs(), "few reads: {count:?}");
    assert_eq!(count.hers, 0, "{count:?}");
    // And the server still keeps the class.
    let admin = ec2nodeclasses(&world.cp.admin().await?);
    let rendered = node.rendered()?;
    wait_for(&admin, "default", "kept", fully_kept(&rendered)).await?;
    Ok(())
}

/// The same loop without the policy: the upkeep alone reverts, and reads
/// show her values (the residual where the policy is not installed, and
/// before Kubernetes 1.30). Ignored: it shows the attack working, and
/// takes 20 s; `cargo nextest run --run-ignored only` runs it.
#[tokio::test]
#[ignore = "measures the attack without the policy"]
async fn without_the_policy_a_looping_editors_values_are_read_back() -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let world = world(&flags(&node, &[&ami_flag()]), false).await?;
    let admin = world.cp.admin().await?;
    create_plain_class(&admin, "default").await?;
    let rendered = node.rendered()?;
    let api = ec2nodeclasses(&admin);
    wait_for(&api, "default", "kept", fully_kept(&rendered)).await?;
    let count = loop_attack(&world, LOOP).await?;
    assert!(count.hers > 0, "{count:?}");
    Ok(())
}

/// Issue 48, item 1: the retry annotation is the editors' to set, and the
/// rollout guard records it; past 63 characters the policy refuses a new
/// value (on a create too), so no editor sizes the guard's store with it.
/// A long value set before the policy is left alone (the server records
/// its digest): her edits of other fields still pass.
#[tokio::test]
async fn a_retry_value_past_63_characters_is_refused() -> Result<()> {
    let node = NodeFlags::new(&[])?;
    let Some((_world, eve, _)) = guarded(&node).await? else {
        return Ok(());
    };
    const RETRY: &str = "autonode.dev/retry-rollout";
    let refused = |what: &str, result: Option<(u16, String)>| -> Result<()> {
        let (code, message) = result.with_context(|| format!("{what}: accepted"))?;
        ensure!(
            code == 422 && message.contains(RETRY) && message.contains("63"),
            "{what}: {code} {message}"
        );
        Ok(())
    };
    let long = json!({"metadata": {"annotations": {RETRY: "r".repeat(64)}}});
    refused(
        "a 64-character retry value",
        patch(&eve, "default", &long).await?,
    )?;
    let short = json!({"metadata": {"annotations": {RETRY: "2026-01-01T00:00:00Z"}}});
    let passed = patch(&eve, "default", &short).await?;
    ensure!(passed.is_none(), "a short retry value: {passed:?}");
    let created: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
        "metadata": {"name": "eves", "annotations": {RETRY: "r".repeat(110_000)}},
        "spec": standin::custom_spec(json!({})),
    }))?;
    refused(
        "a class created with a 110,000-byte retry value",
        refusal(eve.create(&PostParams::default(), &created).await)?,
    )
}
