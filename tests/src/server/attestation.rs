//! A server that makes one class attest (NitroTPM) against a test Nitro
//! PKI, and the evidence an honest machine of that class brings: what the
//! attested-join tests and the benchmark share.

use crate::callers::joiner::NodeKeys;
use crate::cloud::fakecloud::nitro::TestNitroPki;
use anyhow::Result;
use autonode_shared::protocol::{attested_keys_digest, Attestation, JoinRequest, JoinRequestV2};
use base64::Engine;
use rcgen::PublicKeyData;
use std::collections::BTreeMap;
use std::path::Path;

/// The class the policy makes attest; "default" is not named.
pub const CLASS: &str = "attested";

/// The boot [`CLASS`] admits.
pub fn good_pcrs() -> BTreeMap<u8, [u8; 48]> {
    BTreeMap::from([(4, [0x44; 48]), (7, [0x77; 48])])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Server flags making [`CLASS`] attest with `pki`'s root, files written
/// to `dir`: the policy, the root, and a sealing key file (`seal.key`,
/// so replicas started with the same flags share it).
pub fn server_flags(dir: &Path, pki: &TestNitroPki) -> Result<Vec<String>> {
    let pcrs = good_pcrs();
    let policy = format!(
        "classes:\n  {CLASS}:\n    require: nitrotpm\n    measurements: [good]\n\
         measurements:\n  good:\n    pcrs:\n      4: \"{}\"\n      7: \"{}\"\n",
        hex(&pcrs[&4]),
        hex(&pcrs[&7])
    );
    std::fs::write(dir.join("policy.yaml"), policy)?;
    std::fs::write(dir.join("root.pem"), pki.root_pem())?;
    std::fs::write(dir.join("seal.key"), [0x5a; 32])?;
    Ok(vec![
        format!("--attestation-policy={}", dir.join("policy.yaml").display()),
        format!("--nitro-root={}", dir.join("root.pem").display()),
        format!("--seal-key-file={}", dir.join("seal.key").display()),
    ])
}

/// What a document's `user_data` holds for a join with `keys`.
pub fn keys_digest(keys: &NodeKeys) -> [u8; 32] {
    attested_keys_digest(
        &keys.client.subject_public_key_info(),
        &keys.serving.subject_public_key_info(),
    )
}

/// A NitroTPM document of `instance_id` booted with `pcrs`, for `nonce`
/// and `keys`, signed by `pki`, as a join carries it.
pub fn evidence(
    pki: &TestNitroPki,
    instance_id: &str,
    pcrs: &BTreeMap<u8, [u8; 48]>,
    nonce: &[u8],
    keys: &NodeKeys,
) -> Result<Attestation> {
    let digest = keys_digest(keys);
    let document = pki.document(instance_id, pcrs, Some(nonce), Some(&digest))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(Attestation::NitroTpm {
        nonce: b64.encode(nonce),
        document: b64.encode(document),
    })
}

/// `request` as a `/v2` join with `attestation`.
pub fn v2(request: JoinRequest, attestation: Attestation) -> JoinRequestV2 {
    JoinRequestV2 {
        identity: request.identity,
        client_csr: request.client_csr,
        serving_csr: request.serving_csr,
        agent_version: request.agent_version,
        attestation,
    }
}
