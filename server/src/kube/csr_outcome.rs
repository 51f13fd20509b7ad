//! Where a CSR stands, and the little of a CSR the issuer's watch parses
//! to know it.
//!
//! Each change to one of a join's CSRs (created, approved, signed) comes
//! down the issuer's watch as the whole object: the request, labels, and
//! managedFields (one entry per writer, each a tree of the fields it
//! owns). Parsed as k8s-openapi's type, managedFields alone were most of
//! that watch's parsing, 4% of the server's CPU in a burst of 1,000 joins
//! (docs/benchmarks.md). [`CsrOutcome`] names the same API resource and
//! reads only the identity, the certificate and each condition's type,
//! status and message; serde steps over the rest without building it.

use crate::kube::cache::Identity;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use serde::Deserialize;

/// Where a CSR stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pending,
    /// Signed: the certificate (PEM).
    Issued(String),
    /// Denied or failed: the condition's type and message.
    Failed(String),
}

/// A `certificates.k8s.io/v1` CertificateSigningRequest as the issuer's
/// watch reads it: its identity and what makes its [`Outcome`].
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CsrOutcome {
    #[serde(default, deserialize_with = "Identity::read_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    status: Option<Status>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Status {
    #[serde(default)]
    certificate: Option<ByteString>,
    #[serde(default)]
    conditions: Option<Vec<Condition>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Condition {
    #[serde(rename = "type")]
    type_: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    message: Option<String>,
}

impl CsrOutcome {
    /// Where it stands: a certificate is an issue; else a Denied or
    /// Failed condition that is True is a failure; else pending.
    pub fn outcome(&self) -> Outcome {
        let status = self.status.as_ref();
        let certificate = status.and_then(|s| s.certificate.as_ref());
        if let Some(cert) = certificate.filter(|c| !c.0.is_empty()) {
            return Outcome::Issued(String::from_utf8_lossy(&cert.0).into_owned());
        }
        let conditions = status
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        let failed = conditions
            .iter()
            .find(|c| (c.type_ == "Failed" || c.type_ == "Denied") && c.status == "True");
        match failed {
            Some(c) => Outcome::Failed(format!(
                "{}: {}",
                c.type_,
                c.message.as_deref().unwrap_or("no message")
            )),
            None => Outcome::Pending,
        }
    }

    /// Its outcome, with its status dropped: what the issuer's watch
    /// hands the join waiting for it, keeping only the CSR's identity (a
    /// certificate, a kilobyte or more, was kept for every join's two CSRs
    /// long after their joins were done: docs/benchmarks.md, "The server
    /// among a standing fleet").
    pub fn take_outcome(&mut self) -> Outcome {
        let outcome = self.outcome();
        self.status = None;
        outcome
    }
}

/// Where the CSR `csr`, parsed whole (as a create or an approval answers),
/// stands: read as the watch reads it, so the two cannot disagree.
pub fn of(csr: &CertificateSigningRequest) -> Outcome {
    let status = csr.status.as_ref().map(|status| Status {
        certificate: status.certificate.clone(),
        conditions: status.conditions.as_ref().map(|conditions| {
            conditions
                .iter()
                .map(|c| Condition {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    message: c.message.clone(),
                })
                .collect()
        }),
    });
    CsrOutcome {
        metadata: ObjectMeta::default(),
        status,
    }
    .outcome()
}

cluster_resource!(
    CsrOutcome,
    "CertificateSigningRequest",
    "certificates.k8s.io",
    "v1",
    "certificatesigningrequests"
);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn big_csr(conditions: serde_json::Value, certificate: Option<&str>) -> serde_json::Value {
        let big = "x".repeat(200_000);
        let mut status = json!({ "conditions": conditions });
        if let Some(cert) = certificate {
            status["certificate"] = json!(cert);
        }
        json!({
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {
                "name": "c1", "uid": "u1", "resourceVersion": "7",
                "labels": {"autonode.dev/managed": "true"},
                "annotations": {"big": big},
                "managedFields": [{"manager": "kubectl", "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}}}],
            },
            "spec": {
                "request": "eHh4", "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                "usages": ["client auth"], "username": "system:node:x",
                "groups": ["system:nodes"], "extra": {"k": [big]},
            },
            "status": status,
        })
    }

    #[test]
    fn reads_identity_and_outcome_and_nothing_else() {
        let big = "x".repeat(200_000);
        let conditions = json!([
            {"type": "Approved", "status": "True", "reason": "R", "message": big},
            {"type": "Other", "status": "True", "message": big},
        ]);
        let csr: CsrOutcome =
            serde_json::from_value(big_csr(conditions, Some("Y2VydA=="))).unwrap();
        assert_eq!(csr.metadata.name.as_deref(), Some("c1"));
        assert_eq!(csr.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(csr.metadata.resource_version.as_deref(), Some("7"));
        assert!(csr.metadata.managed_fields.is_none());
        assert!(csr.metadata.annotations.is_none() && csr.metadata.labels.is_none());
        assert_eq!(csr.outcome(), Outcome::Issued("cert".into()));
    }

    #[test]
    fn reads_the_same_outcome_as_the_whole_object() {
        let cases = [
            (json!([]), None, Outcome::Pending),
            (
                json!([{"type": "Approved", "status": "True"}]),
                None,
                Outcome::Pending,
            ),
            (
                json!([{"type": "Approved", "status": "True"},
                       {"type": "Failed", "status": "True", "message": "no"}]),
                None,
                Outcome::Failed("Failed: no".into()),
            ),
            (
                json!([{"type": "Denied", "status": "True"}]),
                None,
                Outcome::Failed("Denied: no message".into()),
            ),
            (
                json!([{"type": "Denied", "status": "False"}]),
                None,
                Outcome::Pending,
            ),
            (json!([]), Some("Y2VydA=="), Outcome::Issued("cert".into())),
        ];
        for (conditions, certificate, want) in cases {
            let object = big_csr(conditions, certificate);
            let whole: CertificateSigningRequest = serde_json::from_value(object.clone()).unwrap();
            let lean: CsrOutcome = serde_json::from_value(object).unwrap();
            assert_eq!(of(&whole), want);
            assert_eq!(lean.outcome(), want);
        }
    }

    #[test]
    fn taking_the_outcome_keeps_the_identity_alone() {
        let conditions = json!([{"type": "Approved", "status": "True"}]);
        let mut csr: CsrOutcome =
            serde_json::from_value(big_csr(conditions, Some("Y2VydA=="))).unwrap();
        assert_eq!(csr.take_outcome(), Outcome::Issued("cert".into()));
        assert!(csr.status.is_none());
        assert_eq!(csr.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(csr.outcome(), Outcome::Pending);
    }

    #[test]
    fn a_csr_without_status_or_metadata_is_pending() {
        let csr: CsrOutcome = serde_json::from_value(json!({"spec": {}})).unwrap();
        assert_eq!(csr.outcome(), Outcome::Pending);
        let csr: CsrOutcome =
            serde_json::from_value(json!({"metadata": null, "status": null})).unwrap();
        assert_eq!(csr.outcome(), Outcome::Pending);
    }
}
