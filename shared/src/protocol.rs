//! The join protocol between autonode-agent and autonode-server.
//!
//! JSON over HTTPS; the agent pins the server's CA. Field names are
//! camelCase like the Kubernetes objects they end up in. Every message has
//! a version in its path (`/v1/...`) so the two halves can be upgraded
//! independently: a server keeps serving every version agents baked into
//! live AMIs still speak.
//!
//! Status codes carry the retry policy: 4xx is a refusal and final, 429 and
//! 5xx are transient and retried (honouring `Retry-After`). A refusal body
//! is an [`ErrorResponse`] that deliberately says little; the precise reason
//! is in the server's log, an Event and a metric label, keyed by the
//! `requestId` the caller sees.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Path of the join endpoint.
pub const JOIN_PATH: &str = "/v1/join";
/// Path of the progress report endpoint.
pub const REPORT_PATH: &str = "/v1/report";
/// Path of the attestation challenge (servers of 0.3.0 and later; an
/// older server answers 404, and the agent then joins through
/// [`JOIN_PATH`] without evidence).
pub const CHALLENGE_PATH: &str = "/v2/challenge";
/// Path of the join that carries attestation evidence ([`JoinRequestV2`]).
pub const JOIN_V2_PATH: &str = "/v2/join";
/// Largest request body the server reads; a join is a few KiB (with a
/// NitroTPM document, about 10).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Header a response carries so logs on both sides can be correlated.
pub const REQUEST_ID_HEADER: &str = "x-autonode-request-id";
/// Header an agent's requests carry since 0.3.0: how many whole seconds it
/// will keep trying (what is left of its deadline). A server of 0.3.0 or
/// later that turns a join away for its queue then tells the agent its
/// turn up to that far off (less the time an attempt needs; at most five
/// minutes), where it tells an agent that does not say at most 30 s, the
/// longest backoff of every released agent. Older servers ignore it.
pub const PATIENCE_HEADER: &str = "x-autonode-patience";

/// The instance's proof of identity, exactly as IMDS served it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceIdentity {
    /// Body of `/latest/dynamic/instance-identity/rsa2048`: base64 PKCS#7
    /// SignedData whose content is the identity document. The document
    /// itself is never sent separately: only the signed content counts.
    pub rsa2048: String,
}

/// `POST /v1/join`: the agent asks to become a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinRequest {
    pub identity: InstanceIdentity,
    /// PEM CSR for the kubelet's client certificate
    /// (CN `system:node:<name>`, O `system:nodes`, no SANs).
    pub client_csr: String,
    /// PEM CSR for the kubelet's serving certificate (SANs: the node's DNS
    /// names and IPs).
    pub serving_csr: String,
    /// The agent's version, for logs and compatibility decisions.
    pub agent_version: String,
}

/// `POST /v2/challenge`: the agent asks for a nonce to attest with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChallengeRequest {
    /// The agent's version, for logs.
    pub agent_version: String,
}

/// The server's challenge: a nonce any replica accepts once, until it
/// expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChallengeResponse {
    /// Base64 (standard, padded) of the nonce's bytes: what the agent asks
    /// the NitroTPM to sign as the document's `nonce`, byte for byte.
    pub nonce: String,
    /// Seconds the nonce stays valid from when it was made.
    pub expires_in_seconds: u64,
}

/// `POST /v2/join`: a [`JoinRequest`] with the machine's attestation
/// evidence, or why it has none. The answer is a [`JoinResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinRequestV2 {
    pub identity: InstanceIdentity,
    /// As in [`JoinRequest::client_csr`].
    pub client_csr: String,
    /// As in [`JoinRequest::serving_csr`].
    pub serving_csr: String,
    /// The agent's version, for logs and compatibility decisions.
    pub agent_version: String,
    /// The attestation evidence, or why there is none.
    pub attestation: Attestation,
}

impl JoinRequestV2 {
    /// The request without its evidence, as a `/v1` join reads.
    pub fn split(self) -> (JoinRequest, Attestation) {
        let request = JoinRequest {
            identity: self.identity,
            client_csr: self.client_csr,
            serving_csr: self.serving_csr,
            agent_version: self.agent_version,
        };
        (request, self.attestation)
    }
}

/// What a machine offers to prove how it booted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Attestation {
    /// A NitroTPM attestation document whose `nonce` is the server's
    /// challenge and whose `user_data` is [`attested_keys_digest`] of the
    /// request's two CSR keys.
    #[serde(rename_all = "camelCase")]
    NitroTpm {
        /// The challenge's nonce, as the server gave it (base64).
        nonce: String,
        /// Base64 (standard, padded) of the document's raw bytes
        /// (COSE_Sign1, CBOR), exactly as the NitroTPM returned them.
        document: String,
    },
    /// The machine could not attest, and says why (no NitroTPM, no
    /// `nitro-tpm-attest` tool, the tool failed).
    Unavailable {
        /// The agent's words, for the server's log and Event.
        reason: String,
    },
}

/// What a NitroTPM document's `user_data` holds for a join: SHA-256 over a
/// purpose label and the two keys' DER SubjectPublicKeyInfo, each
/// length-prefixed, so the document vouches for exactly the keys the CSRs
/// carry and no other pair.
pub fn attested_keys_digest(client_spki_der: &[u8], serving_spki_der: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for field in [
        b"autonode.dev/attested kubelet keys v1".as_slice(),
        client_spki_der,
        serving_spki_der,
    ] {
        hash.update((field.len() as u64).to_be_bytes());
        hash.update(field);
    }
    hash.finalize().into()
}

/// Answer to a successful join.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinResponse {
    /// The Node name kubelet must register as (from EC2, never the request).
    pub node_name: String,
    /// The guest cluster's API server URL.
    pub api_server: String,
    /// PEM bundle of the cluster CA(s) kubelet trusts for the API server.
    pub cluster_ca: String,
    /// PEM certificate issued for `client_csr`.
    pub client_certificate: String,
    /// PEM certificate issued for `serving_csr`.
    pub serving_certificate: String,
    /// How kubelet is to run on this node.
    pub kubelet: KubeletSettings,
    /// This node's Ignition (spec v3) config, as JSON.
    pub ignition: serde_json::Value,
}

/// What the server decided about this node's kubelet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletSettings {
    /// A `kubelet.config.k8s.io/v1beta1` KubeletConfiguration, as JSON.
    pub config: serde_json::Value,
    /// `aws:///<availability-zone>/<instance-id>`.
    pub provider_id: String,
    /// The node's primary private IP.
    pub node_ip: String,
    /// `key=value:Effect` strings for `--register-with-taints`.
    pub register_with_taints: Vec<String>,
    /// Labels for `--node-labels` (only those kubelet may set on itself).
    pub node_labels: BTreeMap<String, String>,
}

/// The agent's steps, in the order it takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// Reading the agent's configuration (userData, local file, flags).
    Config,
    /// Reading the instance identity from IMDS.
    Identity,
    /// Generating or loading the kubelet's keys and CSRs.
    Keys,
    /// Asking the server to join.
    Join,
    /// Applying the Ignition config and writing kubelet's files.
    Apply,
    /// Starting kubelet.
    Start,
}

impl Phase {
    /// Every phase, in order.
    pub const ALL: [Phase; 6] = [
        Phase::Config,
        Phase::Identity,
        Phase::Keys,
        Phase::Join,
        Phase::Apply,
        Phase::Start,
    ];

    /// The name used in logs, metrics and Events.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Config => "config",
            Phase::Identity => "identity",
            Phase::Keys => "keys",
            Phase::Join => "join",
            Phase::Apply => "apply",
            Phase::Start => "start",
        }
    }
}

/// How a phase ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// The phase completed.
    Succeeded,
    /// The phase failed but the agent is retrying.
    Retrying,
    /// The phase failed and the agent gave up: this machine will not become
    /// a node without someone's help. The server may replace it at once.
    Fatal,
}

/// `POST /v1/report`: the agent says how far it got.
///
/// Authenticated by the identity document; once the instance is bound to a
/// client key, also by `proof`, an ECDSA signature with that key over
/// [`ReportRequest::signed_bytes`], so a process that merely read the
/// identity document cannot fake a failure and get a healthy node replaced.
/// Before the binding nothing vouches for a report: the server shows it but
/// acts on none. A signed report must carry a `timestamp` near the server's
/// clock and is accepted once (the server's `report::REPORT_WINDOW`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReportRequest {
    pub identity: InstanceIdentity,
    pub phase: Phase,
    pub outcome: Outcome,
    /// Human-readable detail (truncated by the server).
    pub message: String,
    /// Seconds since the Unix epoch when the agent wrote the report.
    pub timestamp: i64,
    /// Proof of possession of the bound client key, when the agent has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<KeyProof>,
}

/// A signature by the node's client key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeyProof {
    /// The public key, as base64 DER SubjectPublicKeyInfo.
    pub public_key: String,
    /// Base64 DER ECDSA signature (SHA-256) over the signed bytes.
    pub signature: String,
}

impl ReportRequest {
    /// The bytes `proof` signs: every field but the proof, in a fixed,
    /// unambiguous layout (each field length-prefixed).
    pub fn signed_bytes(&self) -> Vec<u8> {
        let timestamp = self.timestamp.to_string();
        let fields: [&[u8]; 6] = [
            b"autonode-report-v1",
            self.identity.rsa2048.as_bytes(),
            self.phase.as_str().as_bytes(),
            self.outcome.as_str().as_bytes(),
            self.message.as_bytes(),
            timestamp.as_bytes(),
        ];
        let mut out = Vec::new();
        for field in fields {
            out.extend_from_slice(&(field.len() as u64).to_be_bytes());
            out.extend_from_slice(field);
        }
        out
    }
}

impl Outcome {
    /// The name used in logs, metrics and Events.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Retrying => "retrying",
            Outcome::Fatal => "fatal",
        }
    }
}

/// Body of every non-2xx answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorResponse {
    /// A generic message; never the precise reason for a refusal.
    pub error: String,
    /// Quote this to the operator: it finds the server's log line.
    pub request_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> ReportRequest {
        ReportRequest {
            identity: InstanceIdentity {
                rsa2048: "MIAGCSqGSIb3DQEHAqCAMIACAQEx".into(),
            },
            phase: Phase::Join,
            outcome: Outcome::Fatal,
            message: "refused".into(),
            timestamp: 1_700_000_000,
            proof: None,
        }
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = serde_json::from_str::<JoinRequest>(
            r#"{"identity":{"rsa2048":"x"},"clientCsr":"a","servingCsr":"b","agentVersion":"1","nodeName":"evil"}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("nodeName"), "{err}");
    }

    #[test]
    fn signed_bytes_cover_every_field() {
        let base = report().signed_bytes();
        let mut changed = report();
        changed.message = "refusedX".into();
        assert_ne!(base, changed.signed_bytes());
        let mut changed = report();
        changed.outcome = Outcome::Retrying;
        assert_ne!(base, changed.signed_bytes());
        let mut changed = report();
        changed.timestamp += 1;
        assert_ne!(base, changed.signed_bytes());
        // Length prefixes keep field boundaries unambiguous.
        let mut a = report();
        a.message = "ab".into();
        a.timestamp = 1;
        let mut b = report();
        b.message = "a".into();
        b.timestamp = 1;
        assert_ne!(a.signed_bytes(), b.signed_bytes());
    }

    #[test]
    fn phases_serialise_as_their_names() {
        for phase in Phase::ALL {
            let json = serde_json::to_string(&phase).unwrap();
            assert_eq!(json, format!("\"{}\"", phase.as_str()));
        }
    }

    /// The top-level and nested keys of `value`, as `a.b` paths.
    fn paths(value: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
        if let serde_json::Value::Object(map) = value {
            for (key, inner) in map {
                let path = format!("{prefix}{key}");
                out.push(path.clone());
                if !matches!(key.as_str(), "config" | "ignition" | "nodeLabels") {
                    paths(inner, &format!("{path}."), out);
                }
            }
        }
    }

    fn fields<T: Serialize>(message: &T) -> Vec<String> {
        let mut out = Vec::new();
        paths(&serde_json::to_value(message).unwrap(), "", &mut out);
        out.sort();
        out
    }

    /// Both halves read `/v1` strictly (`deny_unknown_fields`), and agents
    /// of every earlier release are in the field: a field added to an
    /// answer is refused by every older agent, one added to a request by
    /// every older server. So the `/v1` field sets never change; a message
    /// that must grow is a new path (docs/upgrading.md). If this fails,
    /// you changed the wire format: undo it, or add `/v2` beside `/v1`.
    #[test]
    fn v1_messages_keep_their_fields() {
        let join = JoinRequest {
            identity: InstanceIdentity {
                rsa2048: "x".into(),
            },
            client_csr: "c".into(),
            serving_csr: "s".into(),
            agent_version: "v".into(),
        };
        assert_eq!(
            fields(&join),
            [
                "agentVersion",
                "clientCsr",
                "identity",
                "identity.rsa2048",
                "servingCsr"
            ]
        );
        let answer = JoinResponse {
            node_name: "n".into(),
            api_server: "a".into(),
            cluster_ca: "ca".into(),
            client_certificate: "c".into(),
            serving_certificate: "s".into(),
            kubelet: KubeletSettings {
                config: serde_json::json!({}),
                provider_id: "p".into(),
                node_ip: "i".into(),
                register_with_taints: vec![],
                node_labels: BTreeMap::new(),
            },
            ignition: serde_json::json!({}),
        };
        assert_eq!(
            fields(&answer),
            [
                "apiServer",
                "clientCertificate",
                "clusterCa",
                "ignition",
                "kubelet",
                "kubelet.config",
                "kubelet.nodeIp",
                "kubelet.nodeLabels",
                "kubelet.providerId",
                "kubelet.registerWithTaints",
                "nodeName",
                "servingCertificate",
            ]
        );
        let mut signed = report();
        signed.proof = Some(KeyProof {
            public_key: "k".into(),
            signature: "s".into(),
        });
        assert_eq!(
            fields(&signed),
            [
                "identity",
                "identity.rsa2048",
                "message",
                "outcome",
                "phase",
                "proof",
                "proof.publicKey",
                "proof.signature",
                "timestamp",
            ]
        );
        let refusal = ErrorResponse {
            error: "e".into(),
            request_id: "r".into(),
        };
        assert_eq!(fields(&refusal), ["error", "requestId"]);
    }

    /// The `/v2` messages, held like `/v1`'s: servers of 0.3.0 read them
    /// strictly, so they too only ever grow by a new path.
    #[test]
    fn v2_messages_keep_their_fields() {
        let challenge = ChallengeRequest {
            agent_version: "v".into(),
        };
        assert_eq!(fields(&challenge), ["agentVersion"]);
        let nonce = ChallengeResponse {
            nonce: "n".into(),
            expires_in_seconds: 1,
        };
        assert_eq!(fields(&nonce), ["expiresInSeconds", "nonce"]);
        let join = JoinRequestV2 {
            identity: InstanceIdentity {
                rsa2048: "x".into(),
            },
            client_csr: "c".into(),
            serving_csr: "s".into(),
            agent_version: "v".into(),
            attestation: Attestation::NitroTpm {
                nonce: "n".into(),
                document: "d".into(),
            },
        };
        assert_eq!(
            fields(&join),
            [
                "agentVersion",
                "attestation",
                "attestation.nitroTpm",
                "attestation.nitroTpm.document",
                "attestation.nitroTpm.nonce",
                "clientCsr",
                "identity",
                "identity.rsa2048",
                "servingCsr"
            ]
        );
        let unavailable = Attestation::Unavailable { reason: "r".into() };
        assert_eq!(fields(&unavailable), ["unavailable", "unavailable.reason"]);
    }

    #[test]
    fn the_keys_digest_tells_the_keys_and_their_order_apart() {
        let a = attested_keys_digest(b"client", b"serving");
        assert_eq!(a, attested_keys_digest(b"client", b"serving"));
        assert_ne!(a, attested_keys_digest(b"serving", b"client"));
        // Length prefixes: moving a byte across the boundary is another pair.
        assert_ne!(a, attested_keys_digest(b"clients", b"erving"));
    }
}
