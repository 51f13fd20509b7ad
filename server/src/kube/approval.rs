//! The one way autonode approves a CSR: a write to the `approval`
//! subresource that names the object it judged by UID.
//!
//! Both approvers (the join's [`crate::kube::issuer`] and the renewal
//! [`crate::controllers::approver`]) judge a CSR as they saw it and then approve it by
//! name. A name is not an object: between the judgement and the write, the
//! CSR can be deleted and another created under the same name, asking for
//! something else. `metadata.uid` in the patch is a precondition the API
//! server checks against the object it is about to change, so the approval
//! lands on the judged object or on nothing.

use crate::kube::reason::Reason;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};
use kube::api::{Api, Patch};

/// Why an approval was not written.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    /// The object under the name is not the judged one (deleted, or
    /// replaced): nothing was approved.
    #[error("CSR {name} is no longer the object judged (UID {uid}): {detail}")]
    Substituted {
        name: String,
        uid: String,
        detail: String,
    },
    #[error("approving CSR {name}: {source}")]
    Api {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// What an approval says: the condition's reason and message.
#[derive(Debug, Clone, Copy)]
pub struct Verdict<'a> {
    pub reason: Reason,
    pub message: &'a str,
}

/// Approves CSR `name` if, and only if, it is still the object with `uid`.
pub async fn approve(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    uid: &str,
    verdict: Verdict<'_>,
) -> Result<(), ApprovalError> {
    let status = CertificateSigningRequestStatus {
        conditions: Some(vec![CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some(verdict.reason.as_str().into()),
            message: Some(verdict.message.into()),
            ..Default::default()
        }]),
        certificate: None,
    };
    let patch = serde_json::json!({ "metadata": { "uid": uid }, "status": status });
    match api
        .patch_approval(
            name,
            &crate::kube::marks::patch_params(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // 404: gone; 409: another UID under the name (the precondition);
        // 422: the API server's other wording of the same refusal.
        Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409 | 422) => {
            Err(ApprovalError::Substituted {
                name: name.to_string(),
                uid: uid.to_string(),
                detail: status.message,
            })
        }
        Err(source) => Err(ApprovalError::Api {
            name: name.to_string(),
            source,
        }),
    }
}
