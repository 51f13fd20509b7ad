//! The verdict on a join's attestation evidence, for a class that must
//! attest: each check names what it stops (docs/design.md, threat model),
//! and each failure is its own refusal reason.
//!
//! In order, cheapest first: the evidence is there; its nonce is one of
//! ours, unexpired, unused ([`super::nonce`]); the document verifies to
//! the pinned Nitro root at its own time (certificates last hours); it
//! carries that same nonce and was made after it; it is a NitroTPM's; its
//! `module_id` names the instance of the identity document (and so of the
//! NodeClaim, which the join matched by that instance); its `user_data` is
//! the digest of the CSRs' two keys; its PCRs are one of the boots the
//! class admits.

use super::nonce::{NonceError, Nonces};
use super::policy::ClassPolicy;
use autonode_shared::nitro::{self, Document, Failure, Kind, Memo, NitroError, Root};
use autonode_shared::protocol::{attested_keys_digest, Attestation};
use base64::Engine;
use std::time::{Duration, SystemTime};

/// Clock difference tolerated between AWS's signer and this server.
const SKEW: Duration = Duration::from_secs(30);

/// Why a class's attestation refused a join.
#[derive(Debug, thiserror::Error)]
pub enum AttestationRefusal {
    #[error("class {class} requires NitroTPM attestation (--attestation-policy) and the agent sent none: {why}")]
    Missing { class: String, why: String },
    #[error("class {class}: {source}")]
    Nonce {
        class: String,
        #[source]
        source: NonceError,
    },
    #[error("class {class}: the NitroTPM document does not verify: {source}")]
    Document {
        class: String,
        #[source]
        source: NitroError,
    },
    #[error("class {class}: the document is not base64: {detail}")]
    Undecodable { class: String, detail: String },
    #[error("class {class}: the document is a Nitro Enclave's, not a NitroTPM's")]
    NotNitroTpm { class: String },
    #[error("class {class}: the document's nonce is not the one this join redeemed")]
    NonceMismatch { class: String },
    #[error("class {class}: the document was made at {made:?}, outside the nonce's life ({nonce:?} to now)")]
    Stale {
        class: String,
        made: SystemTime,
        nonce: SystemTime,
    },
    #[error("class {class}: the document is instance {module_id:?}'s, the identity document {instance_id}'s")]
    OtherInstance {
        class: String,
        module_id: String,
        instance_id: String,
    },
    #[error(
        "class {class}: the document's user_data is not the digest of this join's two CSR keys"
    )]
    KeysMismatch { class: String },
    #[error("class {class}: instance {instance_id} booted PCRs {pcrs} that none of the class's measurements ({allowed}) admits")]
    PcrsNotAllowed {
        class: String,
        instance_id: String,
        pcrs: String,
        allowed: String,
    },
}

impl AttestationRefusal {
    /// The refusal's label (metrics, Events).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing { .. } => "attestation_missing",
            Self::Nonce { source, .. } => match source {
                NonceError::Unknown => "attestation_nonce_unknown",
                NonceError::Expired(_) => "attestation_nonce_expired",
                NonceError::Replayed => "attestation_nonce_replayed",
            },
            Self::Document { source, .. } => match source.kind() {
                Failure::Malformed => "attestation_malformed",
                Failure::Untrusted => "attestation_untrusted",
                Failure::Expired => "attestation_expired",
                Failure::Signature => "attestation_signature",
            },
            Self::Undecodable { .. } | Self::NotNitroTpm { .. } => "attestation_malformed",
            Self::NonceMismatch { .. } => "attestation_nonce_mismatch",
            Self::Stale { .. } => "attestation_stale",
            Self::OtherInstance { .. } => "attestation_instance_mismatch",
            Self::KeysMismatch { .. } => "attestation_keys_mismatch",
            Self::PcrsNotAllowed { .. } => "attestation_pcrs_not_allowed",
        }
    }

    /// Whether the refusal is the machine's own: only a document that
    /// passed every other check (AWS-signed for this instance, with our
    /// fresh nonce, vouching for this join's keys) whose PCRs the class
    /// does not admit. Nothing else: anyone holding a leaked identity
    /// document can send no evidence, or someone else's.
    pub fn is_the_machines(&self) -> bool {
        matches!(self, Self::PcrsNotAllowed { .. })
    }
}

/// What a join's evidence is judged against.
pub struct Judged<'a> {
    pub class: &'a str,
    pub policy: &'a ClassPolicy,
    pub instance_id: &'a str,
    /// DER SubjectPublicKeyInfo of the client and serving CSRs' keys.
    pub keys: [&'a [u8]; 2],
}

/// The pinned root, and the shared CAs' signatures already verified
/// under it.
pub struct Trust {
    pub root: Root,
    pub memo: Memo,
}

/// The verdict: the name of the measurement the boot matched.
pub fn judge(
    nonces: &Nonces,
    trust: &Trust,
    judged: &Judged<'_>,
    evidence: Option<&Attestation>,
    now: SystemTime,
) -> Result<String, AttestationRefusal> {
    let class = || judged.class.to_string();
    let (nonce, document) = match evidence {
        Some(Attestation::NitroTpm { nonce, document }) => (nonce, document),
        Some(Attestation::Unavailable { reason }) => {
            let why = format!("it says: {}", reason.chars().take(200).collect::<String>());
            return Err(AttestationRefusal::Missing {
                class: class(),
                why,
            });
        }
        None => {
            let why = "an agent of before 0.3.0 (it joined through /v1)".to_string();
            return Err(AttestationRefusal::Missing {
                class: class(),
                why,
            });
        }
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let nonce = b64.decode(nonce).map_err(|_| NonceError::Unknown);
    let nonce = nonce.map_err(|source| AttestationRefusal::Nonce {
        class: class(),
        source,
    })?;
    let redeemed = nonces.redeem(&nonce, now);
    let redeemed = redeemed.map_err(|source| AttestationRefusal::Nonce {
        class: class(),
        source,
    })?;
    let doc = verify(trust, judged.class, document)?;
    if doc.nonce.as_deref() != Some(nonce.as_slice()) {
        return Err(AttestationRefusal::NonceMismatch { class: class() });
    }
    if doc.timestamp + SKEW < redeemed.made || doc.timestamp > now + SKEW {
        let (made, nonce) = (doc.timestamp, redeemed.made);
        return Err(AttestationRefusal::Stale {
            class: class(),
            made,
            nonce,
        });
    }
    check_document(judged, &doc)
}

/// The document, verified at its own time: its certificates last hours,
/// and its freshness is the nonce's, checked after.
fn verify(trust: &Trust, class: &str, document: &str) -> Result<Document, AttestationRefusal> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(document)
        .map_err(|e| AttestationRefusal::Undecodable {
            class: class.to_string(),
            detail: e.to_string(),
        })?;
    let at = nitro::At::DocumentTime;
    nitro::verify_with(&bytes, &trust.root, at, &trust.memo).map_err(|source| {
        AttestationRefusal::Document {
            class: class.to_string(),
            source,
        }
    })
}

/// The document's facts against the join's: its kind, instance, keys and
/// boot.
fn check_document(judged: &Judged<'_>, doc: &Document) -> Result<String, AttestationRefusal> {
    let class = || judged.class.to_string();
    if doc.kind != Kind::NitroTpm {
        return Err(AttestationRefusal::NotNitroTpm { class: class() });
    }
    if doc.instance_id() != Some(judged.instance_id) {
        return Err(AttestationRefusal::OtherInstance {
            class: class(),
            module_id: doc.module_id.chars().take(64).collect(),
            instance_id: judged.instance_id.to_string(),
        });
    }
    let digest = attested_keys_digest(judged.keys[0], judged.keys[1]);
    if doc.user_data.as_deref() != Some(digest.as_slice()) {
        return Err(AttestationRefusal::KeysMismatch { class: class() });
    }
    let measurements = &judged.policy.measurements;
    match measurements.iter().find(|m| m.admits(&doc.pcrs)) {
        Some(matched) => Ok(matched.name.clone()),
        None => Err(AttestationRefusal::PcrsNotAllowed {
            class: class(),
            instance_id: judged.instance_id.to_string(),
            pcrs: pinned_pcrs(judged.policy, doc),
            allowed: measurements
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The document's values of the PCRs the class's measurements pin, as
/// `4=ab12…` (the first 8 hex digits): what an operator compares with the
/// bake's measurements.yaml.
fn pinned_pcrs(policy: &ClassPolicy, doc: &Document) -> String {
    let pinned: std::collections::BTreeSet<u8> = policy
        .measurements
        .iter()
        .flat_map(|m| m.pcrs.keys().copied())
        .collect();
    let shown = pinned.iter().map(|i| match doc.pcrs.get(i) {
        Some(value) => format!("{i}={}…", super::hex(&value[..4])),
        None => format!("{i}=absent"),
    });
    shown.collect::<Vec<_>>().join(" ")
}
