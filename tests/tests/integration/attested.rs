//! Attested joins (NitroTPM) on the real control plane: a class the
//! operator's policy names joins only with a fresh, AWS-signed NitroTPM
//! document of the instance itself, for the keys of its CSRs, of a boot
//! the class admits; each broken proof is refused for its own reason
//! (docs/design.md, threat model). A test Nitro PKI stands in for AWS's
//! (`--nitro-root`: same chain shape and algorithms), and a stand-in for
//! AWS's `nitro-tpm-attest` tool on the simulated instance: NitroTPM
//! exists only on EC2.

use anyhow::Result;
use autonode_shared::protocol::{Attestation, JoinRequestV2};
use autonode_tests::callers::joiner::{honest_request, NodeKeys};
use autonode_tests::cloud::fakecloud::nitro::TestNitroPki;
use autonode_tests::cloud::fakecloud::Instance;
use autonode_tests::harness::poll;
use autonode_tests::karpenter::standin::nodeclaims;
use autonode_tests::machines::node::{user_data, SimulatedNode};
use autonode_tests::server::attestation::{evidence, good_pcrs, server_flags, v2, CLASS};
use autonode_tests::server::world::World;
use autonode_tests::server::{binary, skew};
use base64::Engine;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tempfile::TempDir;

/// A world whose server makes [`CLASS`] attest with the test PKI.
struct Attested {
    world: World,
    pki: TestNitroPki,
    dir: TempDir,
}

impl Attested {
    async fn start() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let pki = TestNitroPki::generate()?;
        let world = World::start_with(&server_flags(dir.path(), &pki)?).await?;
        Ok(Self { world, pki, dir })
    }

    /// A NodeClaim of `class` and its instance.
    async fn launch(&self, class: &str) -> Result<Instance> {
        Ok(self.launch_claim(class).await?.1)
    }

    /// A NodeClaim of `class`, its name and its instance.
    async fn launch_claim(&self, class: &str) -> Result<(String, Instance)> {
        let user_data = user_data(&self.world).into_bytes();
        self.world
            .launch_in(class, serde_json::json!({}), |i| Instance {
                user_data,
                ..i
            })
            .await
    }

    /// Whether the server logged a join of NodeClaim `claim` refused for
    /// `reason`.
    fn logged_refusal(&self, claim: &str, reason: &str) -> bool {
        let claim = format!("nodeclaim=\"{claim}\"");
        let reason = format!("reason=\"{reason}\"");
        let log = self.world.server.log();
        log.lines()
            .any(|l| l.contains("join refused") && l.contains(&claim) && l.contains(&reason))
    }

    /// An honest machine's `/v2` join with `attestation`.
    fn request(
        &self,
        instance: &Instance,
        keys: &NodeKeys,
        attestation: Attestation,
    ) -> Result<JoinRequestV2> {
        let v1 = honest_request(instance, self.world.cloud.ca(), keys)?;
        Ok(v2(v1, attestation))
    }

    /// A fresh challenge's nonce and an honest document for it.
    async fn honest(&self, instance: &Instance, keys: &NodeKeys) -> Result<JoinRequestV2> {
        let nonce = self.world.joiner.challenge().await?;
        let proof = evidence(&self.pki, &instance.instance_id, &good_pcrs(), &nonce, keys)?;
        self.request(instance, keys, proof)
    }

    async fn refused(
        &self,
        request: &JoinRequestV2,
        instance: &Instance,
        reason: &str,
    ) -> Result<()> {
        let answer = self.world.joiner.join_v2(request).await?;
        self.world.assert_refused(answer, instance, reason).await
    }
}

/// Every proof an attacker can bring short of running on the instance
/// itself is refused, each for its own reason, and none of them spoils
/// the machine's own join that follows; the honest one joins, and its
/// nonce does not open twice.
#[tokio::test]
async fn an_attested_class_joins_only_a_fresh_proof_of_the_machines_own_boot() -> Result<()> {
    let t = Attested::start().await?;
    let instance = t.launch(CLASS).await?;
    let keys = NodeKeys::generate()?;

    // No evidence: an agent of before 0.3.0 (/v1), or one without a NitroTPM.
    let v1 = honest_request(&instance, t.world.cloud.ca(), &keys)?;
    let answer = t.world.joiner.join(&v1).await?;
    t.world
        .assert_refused(answer, &instance, "attestation_missing")
        .await?;
    let none = Attestation::Unavailable {
        reason: "no TPM".into(),
    };
    t.refused(
        &t.request(&instance, &keys, none)?,
        &instance,
        "attestation_missing",
    )
    .await?;

    // A document of another instance (its own, honestly made).
    let nonce = t.world.joiner.challenge().await?;
    let other = evidence(&t.pki, "i-0fedcba9876543210", &good_pcrs(), &nonce, &keys)?;
    t.refused(
        &t.request(&instance, &keys, other)?,
        &instance,
        "attestation_instance_mismatch",
    )
    .await?;

    // A document vouching for other keys than the CSRs'.
    let nonce = t.world.joiner.challenge().await?;
    let theirs = NodeKeys::generate()?;
    let proof = evidence(&t.pki, &instance.instance_id, &good_pcrs(), &nonce, &theirs)?;
    t.refused(
        &t.request(&instance, &keys, proof)?,
        &instance,
        "attestation_keys_mismatch",
    )
    .await?;

    // Signed under another root with AWS's shape: not the pinned one.
    let nonce = t.world.joiner.challenge().await?;
    let forger = TestNitroPki::generate()?;
    let forged = evidence(&forger, &instance.instance_id, &good_pcrs(), &nonce, &keys)?;
    t.refused(
        &t.request(&instance, &keys, forged)?,
        &instance,
        "attestation_untrusted",
    )
    .await?;

    // A nonce made by another autonode-server (another sealing key).
    let mut flags = server_flags(t.dir.path(), &t.pki)?;
    std::fs::write(t.dir.path().join("other.key"), [0xa5; 32])?;
    flags.retain(|f| !f.starts_with("--seal-key-file"));
    flags.push(format!(
        "--seal-key-file={}",
        t.dir.path().join("other.key").display()
    ));
    let (other_server, other_joiner) = t.world.second_server(&flags).await?;
    let foreign = other_joiner.challenge().await?;
    drop(other_server);
    let proof = evidence(&t.pki, &instance.instance_id, &good_pcrs(), &foreign, &keys)?;
    t.refused(
        &t.request(&instance, &keys, proof)?,
        &instance,
        "attestation_nonce_unknown",
    )
    .await?;

    // A document made for another nonce than the one the join redeems.
    let (asked, other) = (
        t.world.joiner.challenge().await?,
        t.world.joiner.challenge().await?,
    );
    let proof = evidence(&t.pki, &instance.instance_id, &good_pcrs(), &other, &keys)?;
    let Attestation::NitroTpm { document, .. } = proof else {
        unreachable!()
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let switched = Attestation::NitroTpm {
        nonce: b64.encode(&asked),
        document,
    };
    t.refused(
        &t.request(&instance, &keys, switched)?,
        &instance,
        "attestation_nonce_mismatch",
    )
    .await?;

    // The machine's own: granted, and its nonce is spent.
    let honest = t.honest(&instance, &keys).await?;
    t.world.joiner.join_v2(&honest).await?.granted();
    let Attestation::NitroTpm { nonce, .. } = &honest.attestation else {
        unreachable!()
    };
    let nonce = b64.decode(nonce)?;
    let second = t.launch(CLASS).await?;
    let keys2 = NodeKeys::generate()?;
    let replay = evidence(&t.pki, &second.instance_id, &good_pcrs(), &nonce, &keys2)?;
    t.refused(
        &t.request(&second, &keys2, replay)?,
        &second,
        "attestation_nonce_replayed",
    )
    .await?;
    Ok(())
}

/// A boot the class does not admit, proven by the machine itself, is the
/// machine's own failure: refused with its PCRs named, and the NodeClaim
/// marked failed (the machine is replaced within the failure budget).
#[tokio::test]
async fn a_boot_outside_the_policy_is_refused_and_fails_the_nodeclaim() -> Result<()> {
    let t = Attested::start().await?;
    let user_data = user_data(&t.world).into_bytes();
    let (claim, instance) = t
        .world
        .launch_in(CLASS, serde_json::json!({}), |i| Instance {
            user_data,
            ..i
        })
        .await?;
    let keys = NodeKeys::generate()?;
    let nonce = t.world.joiner.challenge().await?;
    let mut tampered = good_pcrs();
    tampered.insert(4, [0x45; 48]);
    let proof = evidence(&t.pki, &instance.instance_id, &tampered, &nonce, &keys)?;
    t.refused(
        &t.request(&instance, &keys, proof)?,
        &instance,
        "attestation_pcrs_not_allowed",
    )
    .await?;
    let log = t.world.server.log();
    assert!(
        log.contains("4=45454545"),
        "the refusal names the booted PCR 4:\n{log}"
    );
    let api = nodeclaims(&t.world.cp.admin().await?);
    poll::until(
        &format!("{claim} failed as attestation_pcrs_not_allowed"),
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async {
            let Some(claim) = api.get_opt(&claim).await? else {
                return Ok(Some(())); // replaced
            };
            let annotations = claim.metadata.annotations.unwrap_or_default();
            let mark = annotations
                .get("autonode.dev/failure-reason")
                .map(String::as_str);
            Ok((mark == Some("machine:attestation_pcrs_not_allowed")).then_some(()))
        },
    )
    .await
}

/// A nonce is good on every replica (sealed under their shared key, not
/// stored where it was made), and only for its lifetime.
#[tokio::test]
async fn a_nonce_opens_on_another_replica_until_it_expires() -> Result<()> {
    let t = Attested::start().await?;
    let flags = server_flags(t.dir.path(), &t.pki)?;
    let (_replica, joiner) = t.world.second_server(&flags).await?;
    let instance = t.launch(CLASS).await?;
    let keys = NodeKeys::generate()?;
    let early = t.world.joiner.challenge().await?;

    // A nonce of the first replica, redeemed by the second.
    let nonce = t.world.joiner.challenge().await?;
    let proof = evidence(&t.pki, &instance.instance_id, &good_pcrs(), &nonce, &keys)?;
    joiner
        .join_v2(&t.request(&instance, &keys, proof)?)
        .await?
        .granted();

    // Past its lifetime (two minutes), a nonce made before is refused.
    tokio::time::sleep(Duration::from_secs(125)).await;
    let late = t.launch(CLASS).await?;
    let keys = NodeKeys::generate()?;
    let proof = evidence(&t.pki, &late.instance_id, &good_pcrs(), &early, &keys)?;
    t.refused(
        &t.request(&late, &keys, proof)?,
        &late,
        "attestation_nonce_expired",
    )
    .await?;
    Ok(())
}

/// The stand-in for `nitro-tpm-attest`, set up to answer for `instance`
/// booted with `pcrs`: the agent's environment.
fn tpm_env(
    pki: &TestNitroPki,
    dir: &Path,
    instance: &Instance,
    pcrs: &BTreeMap<u8, [u8; 48]>,
) -> Result<[(&'static str, PathBuf); 2]> {
    let tpm = dir.join(format!("tpm-{}", instance.instance_id));
    pki.write_to(&tpm, &instance.instance_id, pcrs)?;
    Ok([
        (
            "AUTONODE_NITRO_TPM_ATTEST",
            binary("nitro-tpm-attest-standin")?,
        ),
        ("AUTONODE_TEST_NITRO_PKI", tpm),
    ])
}

fn env<'a>(pairs: &'a [(&'static str, PathBuf)]) -> Vec<(&'static str, &'a OsStr)> {
    pairs.iter().map(|(k, v)| (*k, v.as_os_str())).collect()
}

/// The real agent asks for the challenge, has the (stand-in) NitroTPM
/// sign it with its keys' digest, and joins; on a machine without a
/// NitroTPM it says so, and the attested class refuses it.
#[tokio::test]
async fn the_agent_attests_and_joins_and_without_a_nitrotpm_is_refused() -> Result<()> {
    let t = Attested::start().await?;
    let agent = autonode_tests::machines::node::agent_binary()?;

    let instance = t.launch(CLASS).await?;
    let node = SimulatedNode::boot(&t.world, &instance)?;
    let vars = tpm_env(&t.pki, t.dir.path(), &instance, &good_pcrs())?;
    let run = node.run_agent_env(&agent, &[], &env(&vars)).await?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(
        run.status.code(),
        Some(0),
        "agent failed:\n{stderr}\n{}",
        t.world.server.log()
    );
    assert!(t.world.server.log().contains("NitroTPM attestation passed"));

    let (claim, bare) = t.launch_claim(CLASS).await?;
    let node = SimulatedNode::boot(&t.world, &bare)?;
    let vars = [(
        "AUTONODE_NITRO_TPM_ATTEST",
        binary("nitro-tpm-attest-standin")?,
    )];
    let run = node.run_agent_env(&agent, &[], &env(&vars)).await?;
    assert_eq!(
        run.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let console = std::fs::read_to_string(node.path("/console.log")).unwrap_or_default();
    let said = format!("{}{console}", String::from_utf8_lossy(&run.stderr));
    assert!(said.contains("no TPM device"), "the agent says why: {said}");
    assert!(
        !node.systemctl_calls().contains("kubelet"),
        "kubelet was started"
    );
    assert!(
        t.logged_refusal(&claim, "attestation_missing"),
        "{}",
        t.world.server.log()
    );
    Ok(())
}

/// Agents baked before attestation (0.2.0) are untouched on classes the
/// policy does not name, on the same server, and refused on one it names.
#[tokio::test]
async fn agents_of_the_previous_release_join_unattested_classes_of_an_attesting_server(
) -> Result<()> {
    let t = Attested::start().await?;
    let previous = skew::previous_release()?;
    let plain = t.launch("default").await?;
    let node = SimulatedNode::boot(&t.world, &plain)?;
    let run = node.run_agent_binary(&previous.agent(), &[]).await?;
    assert_eq!(
        run.status.code(),
        Some(0),
        "{} agent:\n{}",
        previous.label(),
        String::from_utf8_lossy(&run.stderr)
    );

    let (claim, attested) = t.launch_claim(CLASS).await?;
    let node = SimulatedNode::boot(&t.world, &attested)?;
    let run = node.run_agent_binary(&previous.agent(), &[]).await?;
    assert_ne!(
        run.status.code(),
        Some(0),
        "an unattested agent joined an attested class"
    );
    assert!(
        t.logged_refusal(&claim, "attestation_missing"),
        "{}",
        t.world.server.log()
    );
    Ok(())
}
