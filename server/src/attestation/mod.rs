//! Attested joins (NitroTPM): a join of a class the operator's policy
//! names proves a fresh boot of an admitted image, with the kubelet's keys
//! made in it.
//!
//! The identity document proves which instance asks, but it is the same
//! bytes for the instance's whole life, names an AMI rather than what
//! booted, and says nothing of where the keys were made. For a class that
//! must attest ([`policy`]), the agent first asks for a challenge
//! (`POST /v2/challenge`: a [`nonce`] any replica accepts once, for two
//! minutes), has the instance's NitroTPM sign a document whose `nonce` is
//! that challenge and whose `user_data` is the digest of its two CSR keys,
//! and joins through `POST /v2/join` with it. The attest step then judges
//! it ([`verdict`]) after the NodeClaim's rules and binding and before EC2
//! is asked. Classes the policy does not name join as before, through
//! `/v1` or `/v2`, with or without evidence (which is then not read).

pub mod nonce;
pub mod policy;
pub mod verdict;

use crate::kube::seal::StateKey;
use autonode_shared::nitro::{Memo, Root};
use autonode_shared::protocol::{Attestation as Evidence, ChallengeResponse};
use base64::Engine;
use nonce::Nonces;
use policy::{Policy, PolicyFile};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};
use verdict::{AttestationRefusal, Judged, Trust};

/// How often the policy file is looked at for a change (a mounted
/// ConfigMap changes within about a minute of its edit).
pub const POLICY_POLL: Duration = Duration::from_secs(10);

/// What attested joins need, shared by every request.
pub struct Attestation {
    nonces: Nonces,
    trust: Trust,
    policy: RwLock<Arc<Policy>>,
}

/// The shared CAs' links remembered: a zone's regional and zonal CAs are
/// two a zone and last days, so this covers a fleet across many regions.
const REMEMBERED_LINKS: usize = 256;

/// What a class's attestation concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The class need not attest; any evidence was not read.
    NotRequired,
    /// The boot matched the named measurement.
    Attested(String),
}

impl Attestation {
    /// Nonces sealed under `key`, documents checked against `root`, classes
    /// chosen by `policy`.
    pub fn new(key: StateKey, root: Root, policy: Policy) -> Self {
        Self {
            nonces: Nonces::new(key),
            trust: Trust {
                root,
                memo: Memo::new(REMEMBERED_LINKS),
            },
            policy: RwLock::new(Arc::new(policy)),
        }
    }

    /// A challenge made at `now`.
    pub fn challenge(&self, now: SystemTime) -> ChallengeResponse {
        let nonce = self.nonces.make(now);
        ChallengeResponse {
            nonce: base64::engine::general_purpose::STANDARD.encode(nonce),
            expires_in_seconds: nonce::LIFETIME.as_secs(),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_policy(&self, policy: Policy) {
        *self.policy.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(policy);
    }

    /// The verdict on a join of instance `instance_id` for class `class`
    /// (its NodeClaim's), whose CSRs carry `keys` (client, serving: DER
    /// SubjectPublicKeyInfo) and which sent `evidence` (`None`: a `/v1`
    /// join).
    pub fn judge(
        &self,
        class: Option<&str>,
        instance_id: &str,
        keys: [&[u8]; 2],
        evidence: Option<&Evidence>,
        now: SystemTime,
    ) -> Result<Verdict, AttestationRefusal> {
        let policy = self.policy();
        let Some((class, required)) = class.and_then(|c| Some((c, policy.class(c)?))) else {
            return Ok(Verdict::NotRequired);
        };
        let judged = Judged {
            class,
            policy: required,
            instance_id,
            keys,
        };
        verdict::judge(&self.nonces, &self.trust, &judged, evidence, now).map(Verdict::Attested)
    }
}

/// Reads the policy file again every [`POLICY_POLL`], forever: a change
/// takes effect on the next join; a bad change is logged once (an error,
/// with the file's words) and the policy in force kept.
pub async fn watch_policy(attestation: Arc<Attestation>, mut file: PolicyFile) {
    let mut tick = tokio::time::interval(POLICY_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match file.reload() {
            Ok(None) => {}
            Ok(Some(policy)) => {
                tracing::info!(
                    classes = policy.classes(),
                    "attestation policy changed; in force from the next join"
                );
                attestation.set_policy(policy);
            }
            Err(e) => tracing::error!(
                error = %e,
                "attestation policy NOT changed: the file's new contents are refused, and the \
                 policy read before stays in force until the file is fixed"
            ),
        }
    }
}

/// Lowercase hex: what operators compare PCRs in, and the nonce's MACed
/// text.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
