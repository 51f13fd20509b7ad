//! Turning validated CSRs into certificates through the Kubernetes API.
//!
//! autonode does not sign anything itself: it creates a
//! `CertificateSigningRequest` with the kubelet signer, approves it, and
//! waits for kube-controller-manager to sign. One watch over autonode's own
//! CSRs feeds every waiting join, instead of a watch per join.
//!
//! Every node credential may create CSR objects under any name, so a name
//! proves nothing. The join's objects are created with `generateName` (a
//! create never lands on an object someone else made first), found again
//! only by the name and UID the binding recorded, approved with that UID as
//! a precondition, and the certificate signed into them is checked against
//! the CSR that was judged before it goes back to the node.

use crate::kube::approval::{self, ApprovalError};
use crate::kube::binding::CsrRef;
use crate::kube::cache::{self, Cache};
use crate::kube::csr_outcome::{self, CsrOutcome, Outcome};
use crate::kube::marks;
use crate::kube::reason::Reason;
use crate::primitives::bounded::Bounded;
use autonode_shared::csr::{self, usages_for, ParsedCsr, Purpose};
use autonode_shared::issued::{self, IssuedError};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, Client};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Label on every CSR autonode creates (anyone may set it: it selects
/// what the watch keeps, and decides nothing).
pub const MANAGED_LABEL: &str = marks::CSR_MANAGED_LABEL;

/// What to ask for.
pub struct IssueRequest<'a> {
    /// The start of the object's name; the API server completes it
    /// (`generateName`), so no one can have taken it beforehand.
    pub name_prefix: String,
    /// Gives the signer and the usages.
    pub purpose: Purpose,
    pub request_pem: &'a str,
    /// The CSR as it was judged: what the certificate must certify.
    pub judged: &'a ParsedCsr,
    pub labels: BTreeMap<String, String>,
    /// Why autonode approves it (shown in `kubectl describe csr`).
    pub approval_message: String,
    /// The certificate's lifetime (`spec.expirationSeconds`); the signer
    /// gives at most its `--cluster-signing-duration`, at least 10 minutes.
    pub lifetime: Duration,
}

/// How long the certificates of a join last.
#[derive(Debug, Clone, Copy)]
pub struct Lifetimes {
    /// What a join asks for: bounded, so a certificate taken from a machine
    /// (or from a join's answer) is not good for the signer's year; kubelet
    /// renews at 70 to 90 % of it through the renewal approver.
    pub join: Duration,
    /// kube-controller-manager's `--cluster-signing-duration`: what a
    /// certificate gets when its CSR asks for no lifetime, as kubelet's own
    /// renewals do. The longest a node credential can last.
    pub signing: Duration,
}

/// A join's certificates last a week unless `--join-certificate-lifetime`
/// says otherwise: kubelet renews them after five or six days, which leaves
/// a day or more to ride out an approver or EC2 outage.
pub const DEFAULT_JOIN_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);
/// kube-controller-manager's default `--cluster-signing-duration` (8760h).
pub const DEFAULT_SIGNING_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// A CSR object's name and UID, as a binding records it.
pub fn reference(purpose: Purpose, csr: &CertificateSigningRequest) -> CsrRef {
    CsrRef {
        purpose,
        name: csr.metadata.name.clone().unwrap_or_default(),
        uid: csr.metadata.uid.clone().unwrap_or_default(),
    }
}

/// Why a certificate could not be had.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// kube-controller-manager refused or failed to sign.
    #[error("kube-controller-manager refused to sign {csr}: {message}")]
    SigningFailed { csr: String, message: String },
    /// The object under the name is not the one the join created.
    #[error("CSR object {csr} is not the one this join created and judged: {detail}")]
    Substituted { csr: String, detail: String },
    /// The signed certificate does not certify what was judged.
    #[error("CSR {csr}: {source}")]
    CertificateMismatch {
        csr: String,
        #[source]
        source: IssuedError,
    },
    #[error("CSR watch ended")]
    WatchEnded,
    #[error("CSR {csr} not signed within {timeout:?}: is kube-controller-manager's csrsigning controller running?")]
    NotSigned { csr: String, timeout: Duration },
    #[error("kube API: {0}")]
    Api(#[from] kube::Error),
}

/// Creates, approves and waits for CSRs.
#[derive(Clone)]
pub struct Issuer {
    api: Api<CertificateSigningRequest>,
    waiters: Arc<Mutex<Waiters>>,
    timeout: Duration,
}

/// Outcomes the watch saw decided while no join waited, kept for a join
/// that subscribes just after (its CSR signed between its read of the
/// object and its subscription): this long, and at most this many (the
/// least recently seen go first; a join that misses its certificate so
/// times out, and the agent's retry finds it issued).
const RECENT_TTL: Duration = Duration::from_secs(30);
const RECENT: usize = 1024;

/// The joins waiting for a CSR's outcome, and outcomes no join waited for
/// yet, both by the CSR's UID: one lock, so an outcome is either handed to
/// a waiter or kept for one that comes after, never lost in between.
struct Waiters {
    waiting: HashMap<String, watch::Sender<Outcome>>,
    recent: Bounded<String, Outcome>,
}

impl Issuer {
    /// Starts the watch over autonode's CSRs: a [`Cache`], so a failed
    /// watch lists again (a certificate signed while it was away still
    /// wakes its join). Each CSR's outcome goes to the join waiting for it
    /// as the watch delivers it; the cache keeps each CSR's identity
    /// alone, no certificate.
    pub fn start(client: Client, timeout: Duration) -> Self {
        let api: Api<CertificateSigningRequest> = Api::all(client);
        let config = watcher::Config::default()
            .labels(&format!("{MANAGED_LABEL}=true"))
            .page_size(cache::SMALL_PAGE);
        // The watch parses each CSR as a [`CsrOutcome`]: its identity and
        // outcome, not the request, labels or managedFields.
        let watched: Api<CsrOutcome> = Api::all(api.clone().into_client());
        let waiters = Arc::new(Mutex::new(Waiters {
            waiting: HashMap::new(),
            recent: Bounded::new(RECENT_TTL, RECENT),
        }));
        let notify = waiters.clone();
        let hand_over = move |csr: &mut CsrOutcome| wake(&notify, csr);
        let (_csrs, watching) = Cache::with_filter(watched, config, "autonode CSR", hand_over);
        tokio::spawn(watching);
        Self {
            api,
            waiters,
            timeout,
        }
    }

    /// Approves `csr` (created by [`Issuer::create`] or found by
    /// [`Issuer::find`] for `request`) unless it already is, waits for its
    /// certificate and checks it certifies what was judged.
    pub async fn finish(
        &self,
        request: &IssueRequest<'_>,
        csr: CertificateSigningRequest,
    ) -> Result<String, IssueError> {
        let name = csr.metadata.name.clone().unwrap_or_default();
        let uid = csr.metadata.uid.clone().unwrap_or_default();
        let cert = match csr_outcome::of(&csr) {
            Outcome::Issued(cert) => cert,
            Outcome::Failed(message) => return Err(failed(&name, message)),
            Outcome::Pending => {
                let mut rx = self.subscribe(&uid);
                let approved = match is_approved(&csr) {
                    true => Ok(()),
                    false => self.approve(&name, &uid, &request.approval_message).await,
                };
                let waited = match approved {
                    Ok(()) => self.wait(&name, &mut rx).await,
                    Err(e) => Err(e),
                };
                self.unsubscribe(&uid);
                waited?
            }
        };
        issued::check(&cert, request.judged)
            .map_err(|source| IssueError::CertificateMismatch { csr: name, source })?;
        Ok(cert)
    }

    /// Waits up to the timeout for the certificate of the CSR `rx` follows.
    async fn wait(
        &self,
        name: &str,
        rx: &mut watch::Receiver<Outcome>,
    ) -> Result<String, IssueError> {
        let waited = tokio::time::timeout(self.timeout, async {
            loop {
                match rx.borrow_and_update().clone() {
                    Outcome::Issued(cert) => return Ok(cert),
                    Outcome::Failed(message) => return Err(failed(name, message)),
                    Outcome::Pending => {}
                }
                if rx.changed().await.is_err() {
                    return Err(IssueError::WatchEnded);
                }
            }
        })
        .await;
        waited.map_err(|_| IssueError::NotSigned {
            csr: name.to_string(),
            timeout: self.timeout,
        })?
    }

    /// Deletes `csr` when the join that created it will not finish it:
    /// only if it was never approved, and only as it was then (a
    /// resourceVersion precondition), so a retried join that approved it
    /// since keeps it. Best effort: a leftover pending CSR is reaped by
    /// kube-controller-manager's CSR cleaner.
    pub async fn abandon(&self, csr: &CertificateSigningRequest) {
        if is_approved(csr) || csr_outcome::of(csr) != Outcome::Pending {
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

    /// Creates a new CSR object for `request` under a name the API server
    /// completes. Nothing is approved.
    pub async fn create(
        &self,
        request: &IssueRequest<'_>,
    ) -> Result<CertificateSigningRequest, IssueError> {
        let mut labels = request.labels.clone();
        labels.insert(MANAGED_LABEL.into(), "true".into());
        let csr = CertificateSigningRequest {
            metadata: ObjectMeta {
                generate_name: Some(request.name_prefix.clone()),
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
                expiration_seconds: Some(
                    i32::try_from(request.lifetime.as_secs()).unwrap_or(i32::MAX),
                ),
                ..Default::default()
            },
            status: None,
        };
        Ok(self.api.create(&PostParams::default(), &csr).await?)
    }

    /// The object `recorded` names, when it is still the one a join created
    /// (same UID), was not refused by the signer, and asks for the same key,
    /// subject and names as `request` (a resumed agent signs its CSRs anew;
    /// the bytes differ, what they ask must not). `None` otherwise: the
    /// caller creates a new one.
    pub async fn find(
        &self,
        request: &IssueRequest<'_>,
        recorded: &CsrRef,
    ) -> Result<Option<CertificateSigningRequest>, IssueError> {
        let Some(csr) = self.api.get_opt(&recorded.name).await? else {
            return Ok(None);
        };
        if csr.metadata.uid.as_deref() != Some(recorded.uid.as_str()) {
            tracing::warn!(csr = %recorded.name, "a CSR object now under a recorded name has another UID; not ours, left alone");
            return Ok(None);
        }
        if matches!(csr_outcome::of(&csr), Outcome::Failed(_)) {
            return Ok(None);
        }
        let asks_the_same = csr::parse_csr(&csr.spec.request.0)
            .is_ok_and(|parsed| issued::same_ask(&parsed, request.judged));
        Ok(asks_the_same.then_some(csr))
    }

    /// Approves the CSR `name`, only while it is the object with `uid`.
    async fn approve(&self, name: &str, uid: &str, message: &str) -> Result<(), IssueError> {
        let verdict = approval::Verdict {
            reason: Reason::AutonodeAttested,
            message,
        };
        match approval::approve(&self.api, name, uid, verdict).await {
            Ok(()) => Ok(()),
            Err(ApprovalError::Substituted { detail, .. }) => Err(IssueError::Substituted {
                csr: name.to_string(),
                detail: format!("approval with UID {uid} refused: {detail}"),
            }),
            Err(ApprovalError::Api { source, .. }) => Err(source.into()),
        }
    }

    /// Registers interest in the CSR with `uid`, seeded with its outcome if
    /// the watch saw it decided before, so a certificate signed before we
    /// subscribed is not missed. Waiters are keyed by UID: an object
    /// re-created under the same name is another object, and wakes no one.
    fn subscribe(&self, uid: &str) -> watch::Receiver<Outcome> {
        let mut waiters = lock(&self.waiters);
        let known = waiters.recent.remove(&uid.to_string());
        let sender = waiters
            .waiting
            .entry(uid.to_string())
            .or_insert_with(|| watch::channel(Outcome::Pending).0);
        if let Some(known) = known {
            sender.send_replace(known);
        }
        sender.subscribe()
    }

    fn unsubscribe(&self, uid: &str) {
        let mut waiters = lock(&self.waiters);
        let done = waiters
            .waiting
            .get(uid)
            .is_some_and(|s| s.receiver_count() <= 1);
        if done {
            waiters.waiting.remove(uid);
        }
    }
}

/// Hands the outcome of `csr` (as the watch delivered it) to the join
/// waiting for it, or keeps it a while for one about to; leaves `csr`
/// its identity alone.
fn wake(waiters: &Mutex<Waiters>, csr: &mut CsrOutcome) {
    let state = csr.take_outcome();
    if state == Outcome::Pending {
        return;
    }
    let uid = csr.metadata.uid.clone().unwrap_or_default();
    let mut waiters = lock(waiters);
    match waiters.waiting.get(&uid) {
        Some(sender) => {
            sender.send_replace(state);
        }
        None => waiters.recent.insert(uid, Instant::now(), state),
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

fn failed(name: &str, message: String) -> IssueError {
    IssueError::SigningFailed {
        csr: name.to_string(),
        message,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
