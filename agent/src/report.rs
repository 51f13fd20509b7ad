//! Telling the server how far the agent got, so the control plane knows
//! why a machine never became a node.
//!
//! Best effort by design: a report gets a few quick tries within
//! [`REPORT_BUDGET`] of its own (even after the join deadline has passed, so
//! the final failure still goes out) and its failure is only logged.
//! Once the client key exists, each report carries a [`KeyProof`], so a
//! process that merely read the identity document cannot fake a failure.

use crate::retry::{Deadline, RetryPolicy};
use crate::server_client::ServerClient;
use autonode_shared::clock::Clock;
use autonode_shared::protocol::{
    InstanceIdentity, KeyProof, Outcome, Phase, ReportRequest, REPORT_PATH,
};
use base64::Engine as _;
use rcgen::{KeyPair, PublicKeyData as _, SigningKey as _};
use std::time::Duration;
use tokio::task::JoinSet;

/// The longest one report may hold up the agent.
pub const REPORT_BUDGET: Duration = Duration::from_secs(10);
const REPORT_TRY_TIMEOUT: Duration = Duration::from_secs(4);
/// The server truncates anyway; keep requests small.
const MAX_MESSAGE: usize = 2048;

/// A join that keeps failing is reported as `Retrying` from this many
/// failures in a row: one or two are the server scaling or a cache
/// catching up, not news.
pub const RETRYING_AFTER: u32 = 3;
/// And then at most this often, however fast the agent retries.
pub const RETRYING_INTERVAL: Duration = Duration::from_secs(60);

/// Decides which failed join attempts are reported as `Retrying`.
#[derive(Debug, Default)]
pub struct RetryNotices {
    last: Option<tokio::time::Instant>,
}

impl RetryNotices {
    /// Whether attempt `attempt`'s failure, at `now`, gets a report.
    pub fn due(&mut self, attempt: u32, now: tokio::time::Instant) -> bool {
        let quiet_long_enough = self
            .last
            .is_none_or(|last| now.duration_since(last) >= RETRYING_INTERVAL);
        let due = attempt >= RETRYING_AFTER && quiet_long_enough;
        if due {
            self.last = Some(now);
        }
        due
    }
}

/// Builds a report, signed by `key` when there is one.
pub fn build(
    rsa2048: &str,
    phase: Phase,
    outcome: Outcome,
    message: &str,
    timestamp: i64,
    key: Option<&KeyPair>,
) -> ReportRequest {
    let mut message = message.to_string();
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    let mut report = ReportRequest {
        identity: InstanceIdentity {
            rsa2048: rsa2048.to_string(),
        },
        phase,
        outcome,
        message,
        timestamp,
        proof: None,
    };
    report.proof = key.and_then(|key| sign(key, &report.signed_bytes()));
    report
}

fn sign(key: &KeyPair, bytes: &[u8]) -> Option<KeyProof> {
    let b64 = base64::engine::general_purpose::STANDARD;
    match key.sign(bytes) {
        Ok(signature) => Some(KeyProof {
            public_key: b64.encode(key.subject_public_key_info()),
            signature: b64.encode(signature),
        }),
        Err(e) => {
            log::warn!("report: cannot sign with the client key: {e}");
            None
        }
    }
}

/// Sends reports for one run of the agent.
#[derive(Clone)]
pub struct Reporter {
    client: ServerClient,
    rsa2048: String,
    clock: Clock,
}

impl Reporter {
    pub fn new(client: ServerClient, rsa2048: String, clock: Clock) -> Self {
        Reporter {
            client,
            rsa2048,
            clock,
        }
    }

    /// Sends one report without waiting for it: the task goes onto
    /// `reports`, which the run waits for (within [`REPORT_BUDGET`]) before
    /// it exits.
    pub fn send_later(
        &self,
        reports: &mut JoinSet<()>,
        phase: Phase,
        outcome: Outcome,
        message: String,
        key: Option<&KeyPair>,
    ) {
        let reporter = self.clone();
        // rcgen's KeyPair is not Clone: the task gets its own from the PEM.
        let key_pem = key.map(KeyPair::serialize_pem);
        reports.spawn(async move {
            let key = key_pem.and_then(|pem| KeyPair::from_pem(&pem).ok());
            reporter.send(phase, outcome, &message, key.as_ref()).await;
        });
    }

    /// Sends one report; logs and forgets a failure.
    pub async fn send(&self, phase: Phase, outcome: Outcome, message: &str, key: Option<&KeyPair>) {
        let timestamp = self.clock.unix();
        let report = build(&self.rsa2048, phase, outcome, message, timestamp, key);
        let body = match serde_json::to_vec(&report) {
            Ok(body) => body,
            Err(e) => return log::warn!("report: {e}"),
        };
        let deadline = Deadline::after(REPORT_BUDGET);
        let sent = self
            .client
            .post(
                REPORT_PATH,
                body.into(),
                &RetryPolicy::REPORT,
                &deadline,
                REPORT_TRY_TIMEOUT,
                |_| {},
            )
            .await;
        if let Err(e) = sent {
            log::warn!(
                "report phase={} outcome={outcome:?} not delivered: {e}",
                phase.as_str()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retrying_is_reported_from_the_third_failure_then_once_a_minute() {
        let start = tokio::time::Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut notices = RetryNotices::default();
        assert!(!notices.due(1, at(0)));
        assert!(!notices.due(2, at(1)));
        assert!(notices.due(3, at(3)));
        assert!(!notices.due(4, at(7)));
        assert!(!notices.due(5, at(62)));
        assert!(notices.due(6, at(63)));
        assert!(!notices.due(7, at(93)));
    }

    #[test]
    fn proof_verifies_with_the_public_key() {
        let key = KeyPair::generate().unwrap();
        let report = build("sig", Phase::Join, Outcome::Fatal, "refused", 7, Some(&key));
        let proof = report.proof.clone().unwrap();
        let b64 = base64::engine::general_purpose::STANDARD;
        let spki = b64.decode(&proof.public_key).unwrap();
        assert_eq!(spki, key.subject_public_key_info());
        let signature = b64.decode(&proof.signature).unwrap();
        let public = ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_ASN1,
            key.public_key_raw(),
        );
        public.verify(&report.signed_bytes(), &signature).unwrap();
        // And the server's own check accepts it.
        autonode_shared::proof::verify(&proof, &report.signed_bytes()).unwrap();
    }

    #[test]
    fn no_key_no_proof_and_long_messages_truncate() {
        let report = build(
            "sig",
            Phase::Identity,
            Outcome::Retrying,
            &"é".repeat(5000),
            7,
            None,
        );
        assert!(report.proof.is_none());
        assert!(report.message.len() <= MAX_MESSAGE);
    }
}
