//! The join path played by an attacker, on the real control plane: each test
//! is an attack that worked against an earlier autonode (named in its doc
//! comment) and must fail now. docs/design.md's threat model points here.

use crate::nodeconfig::join_granted;
use anyhow::{ensure, Context, Result};
use autonode_server::kube::issuer::{IssueError, IssueRequest, Issuer};
use autonode_shared::csr::{self, Purpose};
use autonode_shared::issued;
use autonode_shared::protocol::JoinResponse;
use autonode_tests::callers::joiner::{self, Answer, CsrShape, NodeKeys};
use autonode_tests::cloud::fakecloud::Instance;
use autonode_tests::harness::poll;
use autonode_tests::karpenter::standin;
use autonode_tests::kube::events::event_reasons;
use autonode_tests::server::ignition as guest_ignition;
use autonode_tests::server::world::World;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The names autonode-server gave its CSR objects before they were made
/// with `generateName`: `autonode-<instance>-<purpose>-<key fingerprint>`.
fn predictable_name(instance: &Instance, purpose: &str, key_pem: &str) -> Result<String> {
    let parsed = csr::parse_csr(key_pem.as_bytes())?;
    let fingerprint = parsed.public_key_fingerprint();
    Ok(format!(
        "autonode-{}-{purpose}-{}",
        instance.instance_id,
        &fingerprint[..16]
    ))
}

/// Creates, as `client`, a CSR object named `name` asking `signer` to
/// certify `pem`. `Ok(false)` when the API server refuses it (NodeRestriction
/// refuses node-created kubelet CSRs for another node's name from 1.31 on:
/// there the attack ends sooner).
async fn plant(client: &Client, name: &str, signer: &str, pem: &str) -> Result<bool> {
    let usages = match signer {
        csr::CLIENT_SIGNER => csr::usages_for(Purpose::Client),
        _ => csr::usages_for(Purpose::Serving),
    };
    let object = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            // What autonode's own objects carry: labels decide nothing.
            labels: Some(BTreeMap::from([(
                "autonode.dev/managed".to_string(),
                "true".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(pem.as_bytes().to_vec()),
            signer_name: signer.to_string(),
            usages: Some(usages.iter().map(|u| u.to_string()).collect()),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(false),
        Err(e) => Err(e).with_context(|| format!("planting CSR {name}")),
    }
}

fn is_approved(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Approved"))
}

/// Asserts the certificates a node got certify its own keys and names.
fn assert_certifies(response: &JoinResponse, client_pem: &str, serving_pem: &str) -> Result<()> {
    let client = csr::parse_csr(client_pem.as_bytes())?;
    let serving = csr::parse_csr(serving_pem.as_bytes())?;
    issued::check(&response.client_certificate, &client).context("client certificate")?;
    issued::check(&response.serving_certificate, &serving).context("serving certificate")?;
    Ok(())
}

/// Attack: a compromised node watches CSRs. A victim's join fails after
/// creating its CSR objects (here: its class names an Ignition ConfigMap
/// that does not exist yet, a 503) and the server deletes them; the
/// attacker re-creates objects under the same names, for the victim's node
/// name with the attacker's own keys. When autonode named objects
/// predictably and took an existing one on a 409, the victim's retry
/// approved the planted objects and the attacker read a credential for the
/// victim's node. Now the join's objects are made with `generateName`, so
/// the retry never meets them: they stay unapproved, and the victim's
/// certificates certify the victim's keys.
#[tokio::test]
async fn csrs_planted_under_a_failed_joins_names_are_never_approved() -> Result<()> {
    let world = World::start().await?;
    let admin = world.cp.admin().await?;
    let annotations = json!({"autonode.dev/ignition": "not-there-yet"});
    let spec = standin::custom_spec(json!({"maxPods": 29}));
    standin::create_nodeclass(&admin, "broken", annotations, spec).await?;

    // The attacker: one honest node.
    let attacker = world.join_new(|i| i).await?;
    let (attacker_keys, attacker_client) = (&attacker.keys, attacker.client.clone());

    // The attacker watches CSR names, as its credential allows.
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let watch = {
        let seen = seen.clone();
        let api: Api<CertificateSigningRequest> = Api::all(attacker_client.clone());
        tokio::spawn(async move {
            let mut events =
                std::pin::pin!(watcher(api, watcher::Config::default()).touched_objects());
            while let Some(Ok(csr)) = events.next().await {
                if let Some(name) = csr.metadata.name {
                    seen.lock().unwrap().insert(name);
                }
            }
        })
    };

    // The victim's join fails after its objects were created.
    let (_, victim) = world.launch_in("broken", json!({}), |i| i).await?;
    let keys = NodeKeys::generate()?;
    let request = joiner::honest_request(&victim, world.cloud.ca(), &keys)?;
    let answer = world.joiner.join(&request).await?;
    ensure!(answer.status() == 503, "expected 503, got {answer:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    watch.abort();

    // The attacker plants objects under every name the victim's join used
    // (and under the names older servers would have used), asking for the
    // victim's node name and more, with the attacker's keys.
    let prefix = format!("autonode-{}-", victim.instance_id);
    let mut names: BTreeSet<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|n| n.starts_with(&prefix))
        .cloned()
        .collect();
    ensure!(
        !names.is_empty(),
        "the attacker saw none of the victim's CSR objects"
    );
    names.insert(predictable_name(&victim, "client", &request.client_csr)?);
    names.insert(predictable_name(&victim, "serving", &request.serving_csr)?);
    let evil_client = CsrShape::client(&victim.private_dns_name).csr(&attacker_keys.client)?;
    let mut evil_serving = CsrShape::serving(&victim);
    evil_serving.dns.push("kubernetes.default.svc".into());
    evil_serving.ips.push("10.96.0.1".parse::<IpAddr>()?);
    let evil_serving = evil_serving.csr(&attacker_keys.serving)?;
    let mut planted = Vec::new();
    for name in &names {
        let (signer, pem) = match name.contains("-client-") {
            true => (csr::CLIENT_SIGNER, &evil_client),
            false => (csr::SERVING_SIGNER, &evil_serving),
        };
        if plant(&attacker_client, name, signer, pem).await? {
            planted.push(name.clone());
        }
    }

    // The operator fixes the config; the victim retries with its keys.
    guest_ignition::put_configmap(
        &admin,
        "not-there-yet",
        r#"{"ignition":{"version":"3.2.0"}}"#,
    )
    .await?;
    // A 503 while a cache catches up is retried.
    let response = join_granted(
        &world,
        &request,
        Duration::from_secs(30),
        Duration::from_millis(300),
    )
    .await?;
    assert_certifies(&response, &request.client_csr, &request.serving_csr)?;

    let csrs: Api<CertificateSigningRequest> = Api::all(admin);
    for name in &planted {
        let object = csrs.get(name).await?;
        assert!(!is_approved(&object), "planted CSR {name} was approved");
    }
    Ok(())
}

/// Attack: an honest node, once joined, asks again with its own client key
/// and a new serving key (for names of its choosing within the rules, or
/// under a name it planted beforehand). When only the client key was bound,
/// that counted as a resume and was granted. Now both keys are bound: it is
/// refused as a possible replay, and nothing new is approved.
#[tokio::test]
async fn a_resume_with_another_serving_key_is_refused_as_a_replay() -> Result<()> {
    let world = World::start().await?;
    let (claim, instance) = world.launch(|i| i).await?;
    let keys = NodeKeys::generate()?;
    let request = joiner::honest_request(&instance, world.cloud.ca(), &keys)?;
    world.joiner.join(&request).await?.granted();
    let approved_before = approved_for(&world, &instance).await?;

    // The same keys resume (the agent restarted).
    let again = joiner::honest_request(&instance, world.cloud.ca(), &keys)?;
    let resumed = world.joiner.join(&again).await?.granted();
    assert_certifies(&resumed, &again.client_csr, &again.serving_csr)?;

    let other = NodeKeys::generate()?;
    let mut swapped = joiner::honest_request(&instance, world.cloud.ca(), &keys)?;
    swapped.serving_csr = CsrShape::serving(&instance).csr(&other.serving)?;
    let answer = world.joiner.join(&swapped).await?;
    let Answer::Refused(403, body) = answer else {
        panic!("a resume with another serving key was answered {answer:?}");
    };
    let line = world
        .server
        .log()
        .lines()
        .find(|l| l.contains(&body.request_id))
        .map(str::to_string)
        .context("no log line for the refusal")?;
    assert!(line.contains("possible_replay"), "{line}");
    let reasons = world.event_reasons(&claim, "PossibleReplay").await?;
    assert!(reasons.iter().any(|r| r == "PossibleReplay"));
    assert_eq!(
        approved_for(&world, &instance).await?,
        approved_before,
        "a refused resume approved something"
    );
    Ok(())
}

/// The approved CSR objects for `instance`, by name.
async fn approved_for(world: &World, instance: &Instance) -> Result<BTreeSet<String>> {
    Ok(world
        .csrs_for(instance)
        .await?
        .into_iter()
        .filter(is_approved)
        .filter_map(|c| c.metadata.name)
        .collect())
}

/// Attack: whoever may edit a NodePool puts `autonode.dev/*` annotations in
/// its template, and Karpenter copies them onto every NodeClaim: a binding
/// to keys the real machine does not have (an earlier autonode refused the
/// machine as a "replay") and a bootstrap failure (it marked a healthy
/// machine failed). Only marks written under autonode's field manager
/// count now: the machine joins, its binding is autonode's, and the
/// feedback condition is not False.
#[tokio::test]
async fn autonode_annotations_copied_from_a_nodepool_count_for_nothing() -> Result<()> {
    let world = World::start().await?;
    let forged = json!({
        "autonode.dev/client-key-sha256": "ab".repeat(32),
        "autonode.dev/binding": json!({
            "instanceId": "i-0000000000000000", "region": "us-west-2", "nodeName": "x",
            "clientKey": "ab".repeat(32), "servingKey": "cd".repeat(32), "csrs": [],
        }).to_string(),
        "autonode.dev/bootstrap-failed": "forged failure",
        "autonode.dev/reported": "registered,ready",
    });
    let (claim, instance) = world.launch_annotated(forged, |i| i).await?;
    let keys = NodeKeys::generate()?;
    let request = joiner::honest_request(&instance, world.cloud.ca(), &keys)?;
    let response = world.joiner.join(&request).await?.granted();
    assert_certifies(&response, &request.client_csr, &request.serving_csr)?;

    let admin = world.cp.admin().await?;
    let claims = standin::nodeclaims(&admin);
    let object = claims.get(&claim).await?;
    let binding = object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("autonode.dev/binding"))
        .context("no binding")?;
    let record: serde_json::Value = serde_json::from_str(binding)?;
    assert_eq!(record["instanceId"], instance.instance_id.as_str());
    let owners: Vec<&str> = object
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| {
            e.fields_v1.as_ref().is_some_and(|f| {
                f.0["f:metadata"]["f:annotations"]
                    .get("f:autonode.dev/binding")
                    .is_some()
            })
        })
        .filter_map(|e| e.manager.as_deref())
        .collect();
    assert_eq!(
        owners,
        ["autonode-server"],
        "the binding is autonode's alone"
    );

    // The leader's feedback judges the NodeClaim: attested, not failed.
    let c = poll::until(
        "AutonodeBootstrapped condition",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let object = claims.get(&claim).await?;
            Ok(object.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "AutonodeBootstrapped")
                .cloned())
        },
    )
    .await?;
    assert_ne!(c["status"], "False", "a forged failure counted: {c}");
    assert_eq!(c["reason"], "Attested", "{c}");
    Ok(())
}

/// Attack on the approval itself: between the moment the join read its CSR
/// object and the moment it approves, the object under that name is
/// replaced by another (deleted and re-created by someone else). Approval
/// carries the UID the join created, so the API server refuses it, and the
/// replacement stays unapproved.
#[tokio::test]
async fn approval_is_bound_to_the_uid_the_join_created() -> Result<()> {
    let world = World::start().await?;
    let admin = world.cp.admin().await?;
    let issuer = Issuer::start(admin.clone(), Duration::from_secs(10));
    let (_, instance) = world.launch(|i| i).await?;
    let keys = NodeKeys::generate()?;
    let pem = CsrShape::client(&instance.private_dns_name).csr(&keys.client)?;
    let judged = csr::parse_csr(pem.as_bytes())?;
    let request = IssueRequest {
        name_prefix: format!("autonode-{}-client-", instance.instance_id),
        purpose: Purpose::Client,
        request_pem: &pem,
        judged: &judged,
        labels: BTreeMap::new(),
        approval_message: "test".into(),
        lifetime: autonode_server::kube::issuer::DEFAULT_JOIN_LIFETIME,
    };
    let created = issuer.create(&request).await?;
    let name = created.metadata.name.clone().context("no name")?;

    // Replaced under the same name by another object.
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    csrs.delete(&name, &DeleteParams::default()).await?;
    let other_keys = NodeKeys::generate()?;
    let other = CsrShape::client(&instance.private_dns_name).csr(&other_keys.client)?;
    ensure!(plant(&admin, &name, csr::CLIENT_SIGNER, &other).await?);

    let outcome = issuer.finish(&request, created).await;
    assert!(
        matches!(outcome, Err(IssueError::Substituted { .. })),
        "{outcome:?}"
    );
    assert!(
        !is_approved(&csrs.get(&name).await?),
        "the replacement was approved"
    );
    Ok(())
}

/// A node that joined honestly registers a Node of its own, under its own
/// name (NodeRestriction allows no other) but carrying the providerID of
/// another instance, one that attested and whose kubelet has not come up,
/// and makes it Ready. Against autonode before the Node of a NodeClaim was
/// the one its binding names, the victim's NodeClaim got
/// `AutonodeBootstrapped=True`, the registered and ready milestones and
/// their Events (which the rollout guard counts as a Ready machine, and the
/// capacity check read the attacker's allocatable). Now it stays Attested
/// until its own kubelet registers.
#[tokio::test]
async fn a_node_carrying_another_instances_provider_id_does_not_make_that_machine_ready(
) -> Result<()> {
    use crate::feedback::{attested, wait_condition};
    use autonode_tests::machines::node::registration;
    use k8s_openapi::api::core::v1::Node;

    let (world, victim, claims) = attested().await?;
    let attacker = world.join_new(|i| i).await?;
    wait_condition(&claims, &attacker.claim, "Unknown", "Attested").await?;
    let ready = super::feedback::ready_status;

    let mut spoof = registration(&attacker.instance);
    if let Some(spec) = spoof.spec.as_mut() {
        spec.provider_id = Some(victim.instance.provider_id());
    }
    spoof.status = Some(ready());
    Api::<Node>::all(attacker.client.clone())
        .create(&PostParams::default(), &spoof)
        .await
        .context("NodeRestriction lets a node choose its Node's providerID")?;

    // The old server took it within a reconcile (1 s debounce, 3 s
    // requeue); watch for three times that.
    let admin = world.cp.admin().await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(12);
    while std::time::Instant::now() < deadline {
        let claim = claims.get(&victim.claim).await?;
        let ours = claim.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "AutonodeBootstrapped")
            .cloned();
        ensure!(
            ours.as_ref()
                .is_some_and(|c| c["status"] == "Unknown" && c["reason"] == "Attested"),
            "the victim's NodeClaim took the attacker's Node for its own: {ours:?}"
        );
        let reported = claim.metadata.annotations.unwrap_or_default();
        let reported = reported
            .get("autonode.dev/reported")
            .map_or("", String::as_str);
        ensure!(
            !reported.contains("registered") && !reported.contains("ready"),
            "milestones reported for a machine with no Node: {reported}"
        );
        let milestones: Vec<String> = event_reasons(&admin, &victim.claim)
            .await?
            .into_iter()
            .filter(|r| r == "NodeRegistered" || r == "NodeReady")
            .collect();
        ensure!(
            milestones.is_empty(),
            "milestone Events for a machine with no Node: {milestones:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Neither is the attacker's own NodeClaim: its Node names another
    // instance.
    wait_condition(&claims, &attacker.claim, "Unknown", "Attested").await?;

    // The victim's own kubelet registers: that Node is its Node.
    let mut own = registration(&victim.instance);
    own.status = Some(ready());
    Api::<Node>::all(victim.client.clone())
        .create(&PostParams::default(), &own)
        .await?;
    wait_condition(&claims, &victim.claim, "True", "NodeReady").await?;
    Ok(())
}

/// A join request for `instance` with `keys`, its agent claiming `version`.
fn claiming(
    world: &World,
    instance: &Instance,
    keys: &NodeKeys,
    version: &str,
) -> Result<autonode_shared::protocol::JoinRequest> {
    let mut request = joiner::honest_request(instance, world.cloud.ca(), keys)?;
    request.agent_version = version.into();
    Ok(request)
}

/// The server's log line of the refused join `answer`, which must be a 403.
fn refusal_line(world: &World, answer: Answer) -> Result<String> {
    let Answer::Refused(403, body) = answer else {
        anyhow::bail!("answered {answer:?}, not refused");
    };
    world
        .server
        .log()
        .lines()
        .find(|l| l.contains(&body.request_id))
        .map(str::to_string)
        .context("no log line for the refusal")
}

/// Attack (docs/design.md, the `--min-agent-version` row): someone holding
/// a leaked identity document joins with keys of their own, claiming an
/// agent older than the server's minimum, to have the machine replaced.
/// A bound machine is judged on its binding first: the join is
/// `possible_replay`, its version never read, the NodeClaim kept and the
/// machine's own resume still granted. An unbound machine's is refused as
/// `agent_below_minimum` and replaced (the row's residual: binding it
/// first with keys of their own denies that machine all the same); played
/// on every booting machine of the pool, the failure budget bounds it: a
/// third in a row is kept, marked, not replaced.
#[tokio::test]
async fn a_leaked_document_claiming_an_old_agent_has_no_bound_machine_replaced() -> Result<()> {
    let world = World::start_with(&["--min-agent-version=0.2.0".into()]).await?;
    let api = standin::nodeclaims(&world.cp.admin().await?);
    let (claim, instance) = world.launch(|i| i).await?;
    let keys = NodeKeys::generate()?;
    let own = claiming(&world, &instance, &keys, "0.2.0")?;
    world.joiner.join(&own).await?.granted();

    let forged = claiming(&world, &instance, &NodeKeys::generate()?, "0.1.0")?;
    let line = refusal_line(&world, world.joiner.join(&forged).await?)?;
    ensure!(
        line.contains("possible_replay") && !line.contains("agent_below_minimum"),
        "the bound machine's forged join: {line}"
    );
    world.joiner.join(&own).await?.granted();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kept = api.get(&claim).await?;
    ensure!(
        kept.metadata.deletion_timestamp.is_none(),
        "the bound machine's NodeClaim is being deleted"
    );

    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let (claim, instance) = world.launch(|i| i).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let forged = claiming(&world, &instance, &NodeKeys::generate()?, "0.1.0")?;
        let line = refusal_line(&world, world.joiner.join(&forged).await?)?;
        ensure!(line.contains("agent_below_minimum"), "{line}");
        let outcome = crate::budget::deleted_or_kept(&api, &claim).await?;
        outcomes.push(outcome);
    }
    ensure!(
        outcomes == ["deleted", "deleted", "kept"],
        "the unbound machines: {outcomes:?}"
    );
    Ok(())
}
