//! The floor a join stands on: what the API server must do for a machine
//! with no autonode in the way. The bare kubelet CSR (create, approve,
//! signature), and the join's API writes alone (the binding's NodeClaim
//! patch beside the two CSR creates, both approvals, both signatures),
//! made straight from the bench's client, one at a time or a burst of
//! them at once.

use crate::sequential::trace;
use anyhow::{Context, Result};
use autonode_server::kube::approval;
use autonode_shared::csr::{self, Purpose};
use autonode_tests::callers::joiner::CsrShape;
use autonode_tests::kube::controlplane::unique;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::ByteString;
use kube::api::{Api, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Label on the bench's own CSRs (the bare path and the join's writes).
pub(crate) const BARE_LABEL: &str = "autonode-bench/bare";

/// One watch over the bench's own CSRs, as the server keeps one over its
/// joins' (and kubelet one over its own, on its warm HTTP/2 connection):
/// a waiter registers the names it expects before it creates them, and is
/// told when each is signed. One watch, not one per CSR: kube-rs speaks
/// HTTP/1.1 only, and a watch per CSR would cost a connection's setup each.
#[derive(Clone)]
pub(crate) struct Signatures {
    waiting: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>,
}

impl Signatures {
    /// Starts the watch (it ends with the runtime).
    pub(crate) fn watch(api: Api<CertificateSigningRequest>) -> Self {
        use kube::runtime::{watcher, WatchStreamExt};
        let signatures = Self {
            waiting: Arc::default(),
        };
        let waiting = signatures.waiting.clone();
        tokio::spawn(async move {
            let config = watcher::Config::default().labels(&format!("{BARE_LABEL}=true"));
            let stream = watcher(api, config).default_backoff().applied_objects();
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(csr) = event else { continue };
                let issued = csr
                    .status
                    .as_ref()
                    .and_then(|s| s.certificate.as_ref())
                    .is_some_and(|c| !c.0.is_empty());
                let name = csr.metadata.name.unwrap_or_default();
                let mut waiting = waiting.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(tell) = issued.then(|| waiting.remove(&name)).flatten() {
                    let _ = tell.send(());
                }
            }
        });
        signatures
    }

    /// Registers `names` now; the future resolves once all are signed, or
    /// fails after `within`.
    pub(crate) fn expect(
        &self,
        names: &[String],
        within: Duration,
    ) -> impl Future<Output = Result<()>> + use<> {
        let receivers: Vec<_> = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            names
                .iter()
                .map(|name| {
                    let (tell, told) = oneshot::channel();
                    waiting.insert(name.clone(), tell);
                    told
                })
                .collect()
        };
        let names = names.to_vec();
        async move {
            tokio::time::timeout(within, futures::future::try_join_all(receivers))
                .await
                .with_context(|| format!("CSRs {names:?} not signed within {within:?}"))?
                .context("the CSR watch ended")?;
            Ok(())
        }
    }
}

/// What kubelet's TLS bootstrap does on the API server: create a client
/// CSR, (an approver) approve it, wait for kube-controller-manager's
/// certificate. The key is made beforehand.
pub(crate) async fn bare_csr(
    api: &Api<CertificateSigningRequest>,
    signatures: &Signatures,
) -> Result<Duration> {
    let key = rcgen::KeyPair::generate()?;
    let name = format!("bare-{}", unique());
    let csr = bench_csr(&name, Purpose::Client, &CsrShape::client(&name), &key)?;
    let signed = signatures.expect(std::slice::from_ref(&name), Duration::from_secs(30));
    let started = Instant::now();
    let csr = api.create(&PostParams::default(), &csr).await?;
    let created = started.elapsed();
    approve(api, &csr).await?;
    let approved = started.elapsed();
    signed.await?;
    if trace() {
        eprintln!(
            "bare CSR: created {created:?} approved {approved:?} signed {:?}",
            started.elapsed()
        );
    }
    Ok(started.elapsed())
}

/// One machine's share of the join's API writes, made ready beforehand
/// (keys generated, CSR objects built) so that only the API work is timed.
pub(crate) struct Writes {
    claim: String,
    binding: Patch<serde_json::Value>,
    client: CertificateSigningRequest,
    serving: CertificateSigningRequest,
}

impl Writes {
    /// The writes for binding `claim` (a NodeClaim no join asks for).
    pub(crate) fn prepare(claim: &str) -> Result<Self> {
        let id = unique();
        let node = format!("ip-10-0-0-1.writes-{id}.internal");
        let serving_shape = CsrShape {
            dns: vec![node.clone()],
            ips: vec![std::net::Ipv4Addr::new(10, 0, 0, 1).into()],
            ..CsrShape::client(&node)
        };
        let (client_key, serving_key) = (rcgen::KeyPair::generate()?, rcgen::KeyPair::generate()?);
        let client = bench_csr(
            &format!("writes-client-{id}"),
            Purpose::Client,
            &CsrShape::client(&node),
            &client_key,
        )?;
        let serving = bench_csr(
            &format!("writes-serving-{id}"),
            Purpose::Serving,
            &serving_shape,
            &serving_key,
        )?;
        let binding =
            Patch::Merge(json!({"metadata": {"annotations": {"autonode-bench/binding": id}}}));
        Ok(Self {
            claim: claim.to_string(),
            binding,
            client,
            serving,
        })
    }
}

/// The API writes no join can do without, made straight from a client in
/// the order the server makes them: the binding patch on a NodeClaim beside
/// the client and serving CSRs' creation, then both approvals, then both
/// signatures by kube-controller-manager. A join's time beyond this is
/// autonode's own (agent, TLS, attestation, rendering, its watches).
///
/// Each request is tried again after a second when the API server's
/// priority and fairness answers 429 (a burst's queues are full), as the
/// server's own client does; `retried` counts those.
pub(crate) async fn join_writes(
    csrs: &Api<CertificateSigningRequest>,
    claims: &Api<DynamicObject>,
    writes: &Writes,
    signatures: &Signatures,
    retried: &std::sync::atomic::AtomicU64,
) -> Result<Duration> {
    let names =
        [&writes.client, &writes.serving].map(|c| c.metadata.name.clone().unwrap_or_default());
    let signed = signatures.expect(&names, Duration::from_secs(300));
    let (post, patch) = (PostParams::default(), PatchParams::default());
    let started = Instant::now();
    let (bound, client, serving) = tokio::join!(
        again(retried, || claims.patch(
            &writes.claim,
            &patch,
            &writes.binding
        )),
        again(retried, || csrs.create(&post, &writes.client)),
        again(retried, || csrs.create(&post, &writes.serving)),
    );
    bound?;
    let (client, serving) = (client?, serving?);
    let (client, serving) = tokio::join!(
        again(retried, || approve(csrs, &client)),
        again(retried, || approve(csrs, &serving)),
    );
    client?;
    serving?;
    signed.await?;
    Ok(started.elapsed())
}

/// `call` again after a second for as long as the API server answers 429
/// (as client-go's clients, kubelet's among them, do), counted in
/// `retried`.
pub(crate) async fn again<T, F, Fut, E>(
    retried: &std::sync::atomic::AtomicU64,
    call: F,
) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = std::result::Result<T, E>>,
    E: Into<anyhow::Error>,
{
    loop {
        match call().await.map_err(Into::into) {
            Err(e) if too_many(&e) => {
                retried.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            other => return other,
        }
    }
}

fn too_many(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<kube::Error>(),
            Some(kube::Error::Api(status)) if status.code == 429
        )
    })
}

/// A CSR object as a kubelet or the server creates it, labelled for the
/// bench's watch.
pub(crate) fn bench_csr(
    name: &str,
    purpose: Purpose,
    shape: &CsrShape,
    key: &rcgen::KeyPair,
) -> Result<CertificateSigningRequest> {
    Ok(CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(BARE_LABEL.to_string(), "true".to_string())].into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(shape.csr(key)?.into_bytes()),
            signer_name: purpose.signer().into(),
            usages: Some(csr::usages_for(purpose).map(String::from).to_vec()),
            ..Default::default()
        },
        status: None,
    })
}

/// Approves `csr` (as the API server returned it on creation) the way
/// the server does: [`approval::approve`], with its UID as precondition.
pub(crate) async fn approve(
    api: &Api<CertificateSigningRequest>,
    csr: &CertificateSigningRequest,
) -> Result<()> {
    let name = csr
        .metadata
        .name
        .as_deref()
        .context("a CSR without a name")?;
    let uid = csr.metadata.uid.as_deref().context("a CSR without a UID")?;
    let verdict = approval::Verdict {
        // The reason the server's join writes: the bench stands in for it.
        reason: autonode_server::kube::reason::Reason::AutonodeAttested,
        message: "autonode-bench: approved by the bench itself",
    };
    approval::approve(api, name, uid, verdict).await?;
    Ok(())
}
