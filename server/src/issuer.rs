//! Turning validated CSRs into certificates through the Kubernetes API.
//!
//! autonode does not sign anything itself: it creates a
//! `CertificateSigningRequest` with the kubelet signer, approves it, and
//! waits for kube-controller-manager to sign. One watch over autonode's own
//! CSRs feeds every waiting join, instead of a watch per join.

use crate::backoff::WatchBackoff;
use crate::refusal::{JoinError, Refusal};
use autonode_shared::csr::{usages_for, Purpose};
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Label on every CSR autonode creates.
pub const MANAGED_LABEL: &str = "autonode.dev/managed";
/// The approval condition's reason: says who approved and why.
pub const APPROVAL_REASON: &str = "AutonodeAttested";

/// What to ask for.
pub struct IssueRequest<'a> {
    /// Deterministic per instance, purpose and key: a resumed join finds
    /// its CSR again instead of creating a second one.
    pub name: String,
    /// Gives the signer and the usages.
    pub purpose: Purpose,
    pub request_pem: &'a str,
    pub labels: BTreeMap<String, String>,
    /// Why autonode approves it (shown in `kubectl describe csr`).
    pub approval_message: String,
}

/// Where a CSR stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Pending,
    Issued(String),
    Failed(String),
}

/// Creates, approves and waits for CSRs.
#[derive(Clone)]
pub struct Issuer {
    api: Api<CertificateSigningRequest>,
    store: Store<CertificateSigningRequest>,
    waiters: Arc<Mutex<HashMap<String, watch::Sender<Outcome>>>>,
    timeout: Duration,
}

impl Issuer {
    /// Starts the watch over autonode's CSRs.
    pub fn start(client: Client, timeout: Duration) -> Self {
        let api: Api<CertificateSigningRequest> = Api::all(client);
        let (store, writer) = reflector::store();
        let config = watcher::Config::default().labels(&format!("{MANAGED_LABEL}=true"));
        let waiters: Arc<Mutex<HashMap<String, watch::Sender<Outcome>>>> = Arc::default();
        // Only outcomes are read from the cache: keep neither managedFields
        // nor the request (PEM) of the thousands of CSRs a scale-out leaves.
        let events = watcher(api.clone(), config).modify(|csr| {
            csr.managed_fields_mut().clear();
            csr.spec.request = ByteString(Vec::new());
        });
        let stream = reflector::reflector(writer, events)
            .backoff(WatchBackoff::default())
            .touched_objects();
        let notify = waiters.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(csr) => wake(&notify, &csr),
                    Err(e) => tracing::warn!(error = %e, "CSR watch interrupted; retrying"),
                }
            }
        });
        Self {
            api,
            store,
            waiters,
            timeout,
        }
    }

    /// Approves `csr` (what [`Issuer::create_or_find`] returned for
    /// `request`) unless it already is, and waits for its certificate.
    pub async fn finish(
        &self,
        request: &IssueRequest<'_>,
        csr: CertificateSigningRequest,
    ) -> Result<String, JoinError> {
        match outcome(&csr) {
            Outcome::Issued(cert) => return Ok(cert),
            Outcome::Failed(message) => return Err(failed(&request.name, message)),
            Outcome::Pending => {}
        }
        let mut rx = self.subscribe(&request.name);
        if !is_approved(&csr) {
            self.approve(&request.name, &request.approval_message)
                .await?;
        }
        let waited = tokio::time::timeout(self.timeout, async {
            loop {
                match rx.borrow_and_update().clone() {
                    Outcome::Issued(cert) => return Ok(cert),
                    Outcome::Failed(message) => return Err(failed(&request.name, message)),
                    Outcome::Pending => {}
                }
                if rx.changed().await.is_err() {
                    return Err(JoinError::Unavailable("CSR watch ended".into()));
                }
            }
        })
        .await;
        self.unsubscribe(&request.name);
        waited.map_err(|_| {
            JoinError::Unavailable(format!(
                "CSR {} not signed within {:?}: is kube-controller-manager's csrsigning controller running?",
                request.name, self.timeout
            ))
        })?
    }

    /// Deletes `csr` when the join that created it will not finish it:
    /// only if it was never approved, and only as it was then (a
    /// resourceVersion precondition), so a retried join that approved it
    /// since keeps it. Best effort: a leftover pending CSR is reaped by
    /// kube-controller-manager's CSR cleaner.
    pub async fn abandon(&self, csr: &CertificateSigningRequest) {
        if is_approved(csr) || outcome(csr) != Outcome::Pending {
            return;
        }
        let name = csr.metadata.name.clone().unwrap_or_default();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: csr.metadata.resource_version.clone(),
                uid: csr.metadata.uid.clone(),
            }),
            ..Default::default()
        };
        match self.api.delete(&name, &params).await {
            Ok(_) => tracing::debug!(csr = %name, "deleted the CSR of a join that failed"),
            // Gone, or changed since (a retried join approved it): fine.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(e) => {
                tracing::warn!(csr = %name, error = %e, "could not delete the unapproved CSR of a failed join")
            }
        }
    }

    /// Creates the CSR, or finds the one an earlier attempt of the same
    /// join (same instance, purpose and key) created. Nothing is approved.
    pub async fn create_or_find(
        &self,
        request: &IssueRequest<'_>,
    ) -> Result<CertificateSigningRequest, JoinError> {
        let mut labels = request.labels.clone();
        labels.insert(MANAGED_LABEL.into(), "true".into());
        let csr = CertificateSigningRequest {
            metadata: ObjectMeta {
                name: Some(request.name.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request.request_pem.as_bytes().to_vec()),
                signer_name: request.purpose.signer().to_string(),
                usages: Some(
                    usages_for(request.purpose)
                        .iter()
                        .map(|u| u.to_string())
                        .collect(),
                ),
                ..Default::default()
            },
            status: None,
        };
        match self.api.create(&PostParams::default(), &csr).await {
            Ok(created) => Ok(created),
            // Same name means same instance, purpose and key: a resumed join.
            Err(kube::Error::Api(status)) if status.code == 409 => {
                Ok(self.api.get(&request.name).await?)
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn approve(&self, name: &str, message: &str) -> Result<(), JoinError> {
        let status = CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: "True".into(),
                reason: Some(APPROVAL_REASON.into()),
                message: Some(message.into()),
                ..Default::default()
            }]),
            certificate: None,
        };
        let patch = serde_json::json!({ "status": status });
        self.api
            .patch_approval(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Registers interest in `name`, seeded with what the cache knows now so
    /// a certificate signed before we subscribed is not missed.
    fn subscribe(&self, name: &str) -> watch::Receiver<Outcome> {
        let known = self
            .store
            .get(&ObjectRef::new(name))
            .map(|csr| outcome(&csr))
            .unwrap_or(Outcome::Pending);
        let mut waiters = lock(&self.waiters);
        let sender = waiters
            .entry(name.to_string())
            .or_insert_with(|| watch::channel(Outcome::Pending).0);
        if known != Outcome::Pending {
            sender.send_replace(known);
        }
        sender.subscribe()
    }

    fn unsubscribe(&self, name: &str) {
        let mut waiters = lock(&self.waiters);
        if waiters.get(name).is_some_and(|s| s.receiver_count() <= 1) {
            waiters.remove(name);
        }
    }
}

fn wake(waiters: &Mutex<HashMap<String, watch::Sender<Outcome>>>, csr: &CertificateSigningRequest) {
    let state = outcome(csr);
    if state == Outcome::Pending {
        return;
    }
    let name = csr.metadata.name.as_deref().unwrap_or_default();
    if let Some(sender) = lock(waiters).get(name) {
        sender.send_replace(state);
    }
}

fn outcome(csr: &CertificateSigningRequest) -> Outcome {
    let status = csr.status.as_ref();
    if let Some(cert) = status
        .and_then(|s| s.certificate.as_ref())
        .filter(|c| !c.0.is_empty())
    {
        return Outcome::Issued(String::from_utf8_lossy(&cert.0).into_owned());
    }
    let conditions = status.and_then(|s| s.conditions.as_ref());
    let failed = conditions
        .into_iter()
        .flatten()
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

fn is_approved(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Approved" && c.status == "True")
        })
}

fn failed(name: &str, message: String) -> JoinError {
    JoinError::Refused(Refusal::SigningFailed {
        csr: name.to_string(),
        message,
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
