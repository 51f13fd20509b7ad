//! Attested joins against a real control plane, through the real
//! autonode-server process running under the shipped guest RBAC.

use anyhow::{ensure, Result};
use autonode_tests::callers::joiner::{self, Answer, CsrShape, NodeKeys};
use autonode_tests::cloud::fakecloud::{Instance, InstanceState};
use autonode_tests::harness::pki::CertPair;
use autonode_tests::karpenter::standin;
use autonode_tests::machines::node::registration;
use autonode_tests::server::world::{in_region, World, ACCOUNT, REGION};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, PostParams};
use std::net::{IpAddr, Ipv4Addr};

#[tokio::test]
async fn an_attested_node_registers_itself_with_its_certificate() -> Result<()> {
    let world = World::start().await?;
    let (claim, instance) = world.launch(|i| i).await?;
    let keys = NodeKeys::generate()?;
    let request = joiner::honest_request(&instance, world.cloud.ca(), &keys)?;
    let response = world.joiner.join(&request).await?.granted();

    assert_eq!(response.node_name, instance.private_dns_name);
    assert_eq!(response.kubelet.provider_id, instance.provider_id());
    assert_eq!(
        response.kubelet.register_with_taints[0],
        "karpenter.sh/unregistered:NoExecute"
    );
    assert_eq!(response.api_server, world.cp.url());

    // The node's own certificate registers its Node under NodeRestriction.
    let node_client = world
        .cp
        .client_with_cert(&CertPair {
            cert_pem: response.client_certificate.clone(),
            key_pem: keys.client.serialize_pem(),
        })
        .await?;
    let node = registration(&instance);
    let created = Api::<Node>::all(node_client)
        .create(&PostParams::default(), &node)
        .await?;
    assert_eq!(
        created.spec.and_then(|s| s.provider_id),
        Some(instance.provider_id())
    );

    // The binding is recorded; the same key resumes with the same CSRs.
    let annotations = standin::annotations(&world.cp.admin().await?, &claim).await?;
    assert!(annotations.contains_key("autonode.dev/binding"));
    let again = joiner::honest_request(&instance, world.cloud.ca(), &keys)?;
    world.joiner.join(&again).await?.granted();
    assert_eq!(
        world.csrs_for(&instance).await?.len(),
        2,
        "a resumed join reuses its CSRs"
    );
    Ok(())
}

#[tokio::test]
async fn refusals_approve_nothing_and_log_the_reason() -> Result<()> {
    let world = World::start().await?;
    let ca = world.cloud.ca();
    let honest = |instance: &Instance| -> Result<_> {
        let keys = NodeKeys::generate()?;
        joiner::honest_request(instance, ca, &keys)
    };

    // No NodeClaim for this instance at all.
    let stray = world.cloud.launch(
        Instance::builder()
            .account_id(ACCOUNT)
            .region(REGION)
            .build(),
    );
    let answer = world.joiner.join(&honest(&stray)?).await?;
    world.assert_refused(answer, &stray, "no_nodeclaim").await?;

    let metrics =
        autonode_tests::server::http_get(&format!("{}/metrics", world.server.metrics_url()))
            .await?
            .1;
    assert!(
        metrics.contains(r#"autonode_joins_total{result="refused",reason="no_nodeclaim"} 1"#),
        "{metrics}"
    );

    // Wrong account, wrong region (documents signed by the trusted CA).
    let (_, other_account) = world
        .launch(|i| Instance {
            account_id: "999999999999".into(),
            ..i
        })
        .await?;
    let answer = world.joiner.join(&honest(&other_account)?).await?;
    world
        .assert_refused(answer, &other_account, "account")
        .await?;
    // The same document with CSRs that do not parse: refused for the
    // document, which admission judges first (one RSA verification, where
    // the CSRs cost two ECDSA ones: a flood of foreign documents must not
    // buy the dearer check).
    let mut request = honest(&other_account)?;
    request.client_csr = "not a CSR".into();
    request.serving_csr = "not a CSR".into();
    let answer = world.joiner.join(&request).await?;
    world
        .assert_refused(answer, &other_account, "account_not_allowed")
        .await?;

    // A document signed by a CA nobody pinned, for an instance that does
    // have a NodeClaim: a forgery.
    let (_, forged_for) = world.launch(|i| i).await?;
    let forger = autonode_tests::cloud::fakecloud::FakeCloud::new()?;
    let keys = NodeKeys::generate()?;
    let forged = joiner::honest_request(&forged_for, forger.ca(), &keys)?;
    let answer = world.joiner.join(&forged).await?;
    world
        .assert_refused(answer, &forged_for, "signer_not_pinned")
        .await?;

    // A region not on the allow-list; a launch older than the window.
    let (_, elsewhere) = world.launch(in_region("eu-west-1")).await?;
    let answer = world.joiner.join(&honest(&elsewhere)?).await?;
    world
        .assert_refused(answer, &elsewhere, "region_not_allowed")
        .await?;
    let (_, stale) = world
        .launch(|i| Instance {
            pending_time: time::OffsetDateTime::now_utc() - time::Duration::minutes(20),
            ..i
        })
        .await?;
    let answer = world.joiner.join(&honest(&stale)?).await?;
    world.assert_refused(answer, &stale, "too_old").await?;

    // Terminated in EC2.
    let (_, gone) = world.launch(|i| i).await?;
    world.cloud.terminate(&gone.instance_id);
    let answer = world.joiner.join(&honest(&gone)?).await?;
    world
        .assert_refused(answer, &gone, "instance_not_live")
        .await?;

    // Client CSR with another node's name, with SANs; serving CSR with a
    // foreign IP.
    let (_, instance) = world.launch(|i| i).await?;
    let keys = NodeKeys::generate()?;
    let mut request = joiner::honest_request(&instance, ca, &keys)?;
    request.client_csr =
        CsrShape::client("ip-10-9-9-9.us-west-2.compute.internal").csr(&keys.client)?;
    let answer = world.joiner.join(&request).await?;
    world
        .assert_refused(answer, &instance, "client_csr")
        .await?;

    let mut with_sans = CsrShape::client(&instance.private_dns_name);
    with_sans.dns = vec![instance.private_dns_name.clone()];
    request.client_csr = with_sans.csr(&keys.client)?;
    let answer = world.joiner.join(&request).await?;
    world
        .assert_refused(answer, &instance, "client_csr")
        .await?;

    // A 1024-bit RSA client key (openssl makes what rcgen will not).
    request.client_csr = openssl_rsa_csr(
        1024,
        &format!(
            "/CN=system:node:{}/O=system:nodes",
            instance.private_dns_name
        ),
    )?;
    let answer = world.joiner.join(&request).await?;
    world
        .assert_refused(answer, &instance, "client_csr")
        .await?;

    let mut foreign_ip = CsrShape::serving(&instance);
    foreign_ip
        .ips
        .push(IpAddr::V4(Ipv4Addr::new(10, 200, 0, 1)));
    let request = autonode_shared::protocol::JoinRequest {
        serving_csr: foreign_ip.csr(&keys.serving)?,
        ..joiner::honest_request(&instance, ca, &keys)?
    };
    let answer = world.joiner.join(&request).await?;
    world
        .assert_refused(answer, &instance, "serving_csr")
        .await?;

    // Replay: the instance joins, then someone else presents its document
    // with another key.
    let (_, bound) = world.launch(|i| i).await?;
    world.joiner.join(&honest(&bound)?).await?.granted();
    let answer = world.joiner.join(&honest(&bound)?).await?;
    let Answer::Refused(403, body) = answer else {
        panic!("replay was granted")
    };
    let log = world.server.log();
    assert!(
        log.lines()
            .any(|l| l.contains(&body.request_id) && l.contains("possible_replay")),
        "no possible_replay log line"
    );
    // The replay's CSR objects were created beside the binding check and
    // deleted, unapproved, when it failed: only the honest join's remain.
    let names: Vec<_> = world
        .csrs_for(&bound)
        .await?
        .into_iter()
        .filter_map(|csr| csr.metadata.name)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");

    // A NodeClaim being deleted (held by a finalizer) and one already
    // Registered.
    let (claim, deleting) = world.launch(|i| i).await?;
    let admin = world.cp.admin().await?;
    let claims = standin::nodeclaims(&admin);
    let finalizer = serde_json::json!({"metadata": {"finalizers": ["karpenter.sh/termination"]}});
    claims
        .patch(
            &claim,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&finalizer),
        )
        .await?;
    claims.delete(&claim, &Default::default()).await?;
    wait_for_cache().await;
    let answer = world.joiner.join(&honest(&deleting)?).await?;
    world
        .assert_refused(answer, &deleting, "nodeclaim_deleting")
        .await?;

    // Registered to the machine's own Node (EC2's name for it), as
    // Karpenter records it: a late join, refused, and the NodeClaim kept
    // (an impostor's Node is `node_spoofed`: karpenter_real.rs).
    let (claim, registered) = world.launch(|i| i).await?;
    let condition = serde_json::json!({"status": {"nodeName": registered.private_dns_name, "conditions": [{
        "type": "Registered", "status": "True", "reason": "Registered", "message": "node registered",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    claims
        .patch_status(
            &claim,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&condition),
        )
        .await?;
    wait_for_cache().await;
    let answer = world.joiner.join(&honest(&registered)?).await?;
    world
        .assert_refused(answer, &registered, "nodeclaim_registered")
        .await?;
    ensure!(
        claims.get_opt(&claim).await?.is_some(),
        "a late join deleted its registered NodeClaim"
    );

    // An instance running in EC2 as stopped-then-started keeps the claim
    // but a pendingTime before the NodeClaim existed is not this launch.
    let (_, early) = world
        .launch(|i| Instance {
            pending_time: time::OffsetDateTime::now_utc() - time::Duration::minutes(5),
            ..i
        })
        .await?;
    let answer = world.joiner.join(&honest(&early)?).await?;
    world
        .assert_refused(answer, &early, "pending_before_nodeclaim")
        .await?;

    // A second NodeClaim naming the same instance (written by someone who
    // may set a NodeClaim's status): which one the machine joins as is not
    // for it to choose, so it joins as neither.
    let (_, twice) = world.launch(|i| i).await?;
    let admin = world.cp.admin().await?;
    let second = "default-second-for-one-instance";
    standin::create_nodeclaim_annotated(&admin, second, "default", serde_json::json!({})).await?;
    standin::set_provider_id(&admin, second, &twice.provider_id()).await?;
    wait_for_cache().await;
    let answer = world.joiner.join(&honest(&twice)?).await?;
    world
        .assert_refused(answer, &twice, "many_nodeclaims")
        .await?;

    let (_, stopped) = world
        .launch(|i| Instance {
            state: InstanceState::Stopped,
            ..i
        })
        .await?;
    let answer = world.joiner.join(&honest(&stopped)?).await?;
    world
        .assert_refused(answer, &stopped, "instance_not_live")
        .await?;
    Ok(())
}

/// A PEM CSR for a fresh RSA key of `bits`, made by the openssl CLI.
fn openssl_rsa_csr(bits: u32, subject: &str) -> Result<String> {
    let output = std::process::Command::new("openssl")
        .args([
            "req",
            "-new",
            "-newkey",
            &format!("rsa:{bits}"),
            "-nodes",
            "-keyout",
            "/dev/null",
            "-subj",
            subject,
        ])
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "openssl req failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// The server's NodeClaim cache follows a watch: give it a moment.
async fn wait_for_cache() {
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
}

/// Attack (review 4, item 6): a leaked identity document replayed against
/// an instance already bound, 60 times from one client. Each is refused as
/// `possible_replay`, and none asks EC2: the binding is judged on the
/// cached NodeClaim before the lookup (an earlier server made 60
/// `DescribeInstances` calls in under a second, on the account's shared
/// EC2 budget).
#[tokio::test]
async fn a_replayed_document_costs_no_ec2_lookup() -> Result<()> {
    let world = World::start().await?;
    let (_, instance) = world.launch(|i| i).await?;
    let keys = NodeKeys::generate()?;
    let honest = joiner::honest_request(&instance, world.cloud.ca(), &keys)?;
    world.joiner.join(&honest).await?.granted();
    let before = world.ec2.calls();
    let mut refused = 0;
    for _ in 0..60 {
        let thief = NodeKeys::generate()?;
        let replay = joiner::honest_request(&instance, world.cloud.ca(), &thief)?;
        if let Answer::Refused(403, _) = world.joiner.join(&replay).await? {
            refused += 1;
        }
    }
    assert_eq!(refused, 60, "every replay is refused");
    let replays = world
        .server
        .log()
        .lines()
        .filter(|l| l.contains("possible_replay"))
        .count();
    assert!(replays >= 60, "{replays} replays logged");
    assert_eq!(world.ec2.calls() - before, 0, "replays asked EC2");
    Ok(())
}

/// An instance whose NodeClaim is not bound yet, its document in other
/// hands: joins that EC2 must be asked about (here each refused after the
/// lookup, for a client CSR naming another node) are limited per instance,
/// 4 at once and then one per 5 s, answered 503 past that; another
/// instance's join is not held back.
#[tokio::test]
async fn an_unbound_instances_lookups_are_limited() -> Result<()> {
    let world = World::start().await?;
    let (_, instance) = world.launch(|i| i).await?;
    let before = world.ec2.calls();
    let mut answers = Vec::new();
    for _ in 0..20 {
        let keys = NodeKeys::generate()?;
        let request = autonode_shared::protocol::JoinRequest {
            client_csr: CsrShape::client("ip-10-9-9-9.us-west-2.compute.internal")
                .csr(&keys.client)?,
            ..joiner::honest_request(&instance, world.cloud.ca(), &keys)?
        };
        answers.push(match world.joiner.join(&request).await? {
            Answer::Refused(status, _) => status,
            Answer::Granted(_) => 200,
        });
    }
    let calls = world.ec2.calls() - before;
    assert!(calls <= 6, "{calls} EC2 calls for 20 joins: {answers:?}");
    assert!(
        answers.iter().filter(|s| **s == 503).count() >= 14,
        "{answers:?}"
    );
    assert!(
        answers.iter().all(|s| *s == 403 || *s == 503),
        "{answers:?}"
    );
    // Another instance joins at once.
    world.join_new(|i| i).await?;
    Ok(())
}

/// Marks `claim` Registered to `node`, Initialized and Ready, as Karpenter
/// does once a machine's Node is up.
async fn ready_as(claims: &Api<DynamicObject>, claim: &str, node: &str) -> Result<()> {
    let at = "2026-01-01T00:00:00Z";
    let condition = |kind: &str| {
        serde_json::json!({"type": kind, "status": "True", "reason": kind, "message": kind,
            "lastTransitionTime": at})
    };
    let status = serde_json::json!({"status": {"nodeName": node, "conditions": [
        condition("Registered"), condition("Initialized"), condition("Ready")]}});
    claims
        .patch_status(
            claim,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await?;
    Ok(())
}

/// Item 4 of issue 48. The join serves every NodeClaim, also machines of
/// classes that join some other way. Two such Ready machines, never joined
/// by autonode: one whose Node is named after its instance id (as
/// Bottlerocket names it), one named as EC2 names it. Whoever holds one
/// of their identity documents joins with it and keys of their own. Before,
/// the first's NodeClaim was failed as `node_spoofed` and deleted (its
/// Node name is not EC2's), so Karpenter terminated a healthy node; now
/// both are refused as late joins and kept: nothing proves either Node an
/// impostor. A Node that is provably another machine's (the name autonode
/// recorded when it joined that machine) is still `node_spoofed`.
#[tokio::test]
async fn a_join_with_a_foreign_machines_document_deletes_nothing_unproven() -> Result<()> {
    let world = World::start().await?;
    let ca = world.cloud.ca();
    let honest = |instance: &Instance| -> Result<_> {
        let keys = NodeKeys::generate()?;
        joiner::honest_request(instance, ca, &keys)
    };
    let admin = world.cp.admin().await?;
    let claims = standin::nodeclaims(&admin);
    let (by_id, bottlerocket) = world.launch(|i| i).await?;
    ready_as(&claims, &by_id, &bottlerocket.instance_id).await?;
    let (by_ec2, plain) = world.launch(|i| i).await?;
    ready_as(&claims, &by_ec2, &plain.private_dns_name).await?;
    wait_for_cache().await;

    for instance in [&bottlerocket, &plain] {
        let answer = world.joiner.join(&honest(instance)?).await?;
        world
            .assert_refused(answer, instance, "nodeclaim_registered")
            .await?;
    }
    // A deletion would have been asked for at once, in the background.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    for claim in [&by_id, &by_ec2] {
        let kept = claims.get_opt(claim).await?;
        ensure!(
            kept.is_some_and(|c| c.metadata.deletion_timestamp.is_none()),
            "{claim}: a healthy node's NodeClaim was deleted on a foreign join's word"
        );
    }

    // Proof: the Node is one autonode joined (its binding names it), and
    // another machine's NodeClaim is Registered to it.
    let joined = world.join_new(|i| i).await?;
    let (victim, booting) = world.launch(|i| i).await?;
    ready_as(&claims, &victim, &joined.instance.private_dns_name).await?;
    wait_for_cache().await;
    let answer = world.joiner.join(&honest(&booting)?).await?;
    world
        .assert_refused(answer, &booting, "node_spoofed")
        .await?;
    Ok(())
}
