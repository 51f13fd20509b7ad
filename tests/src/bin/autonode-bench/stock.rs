//! The stock path a fleet would otherwise join by, at once: kubelet's own
//! TLS bootstrap. Each machine, with a shared bootstrap identity, creates
//! its client CSR, which kube-controller-manager's `csrapproving`
//! controller approves (after a SubjectAccessReview of the requester) and
//! its signer signs; then, as the node, its serving CSR, which an approver
//! with one worker approves, as the usual serving-CSR approvers run.
//!
//! Measured on a fresh control plane like the bursts', with the harness's
//! kube-controller-manager client limits (100 requests a second, burst
//! 200; its default is 20): the stock path's best case. The one worker is
//! told of each serving CSR by its creator rather than by a watch, and
//! approves as the cluster admin (exempt from priority and fairness): in
//! the stock path's favour too.

use crate::floor::{again, approve, bench_csr, Signatures};
use crate::measure::{ms, percentile, round, Cores};
use anyhow::{Context, Result};
use autonode_shared::csr::Purpose;
use autonode_tests::callers::joiner::CsrShape;
use autonode_tests::kube::controlplane::{unique, ControlPlane};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, PostParams};
use serde_json::{json, Map, Value};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The group kubelet's bootstrap tokens authenticate as.
const BOOTSTRAPPERS: &str = "system:bootstrappers";

/// `count` kubelet TLS bootstraps at once; writes `bare_bootstrap_burst_s`
/// and its failures into `results`.
pub(crate) async fn burst(count: usize, results: &mut Map<String, Value>) -> Result<()> {
    let cp = ControlPlane::start_with_stock_approver().await?;
    let admin = cp.admin().await?;
    grant_bootstrappers(&admin).await?;
    let bootstrap = cp
        .client_as("system:bootstrap:bench01", Some(BOOTSTRAPPERS))
        .await?;
    let prepared = tokio::task::spawn_blocking(move || {
        (0..count)
            .map(|_| Machine::prepare())
            .collect::<Result<Vec<_>>>()
    })
    .await??;
    // Each machine creates its serving CSR as itself, with the client
    // certificate it was just issued (the CSR admission lets a node ask
    // only for its own name): a client of its own, made beforehand.
    let mut machines = Vec::with_capacity(count);
    for (machine, node) in prepared {
        let user = format!("system:node:{node}");
        let client = cp.client_as(&user, Some("system:nodes")).await?;
        machines.push((machine, client));
    }
    let signatures = Signatures::watch(Api::all(admin.clone()));
    let approver = one_worker(Api::all(admin));
    let retried = Arc::new(AtomicU64::new(0));
    tokio::time::sleep(Duration::from_secs(1)).await;

    let cores = Cores::from_now(&cp);
    let started = Instant::now();
    let runs = machines.into_iter().map(|(machine, node)| {
        let (bootstrap, node) = (Api::all(bootstrap.clone()), Api::all(node));
        let (signatures, approver, retried) =
            (signatures.clone(), approver.clone(), retried.clone());
        tokio::spawn(async move {
            machine
                .bootstrap(&bootstrap, &node, &signatures, &approver, &retried)
                .await
        })
    });
    let outcomes = futures::future::join_all(runs).await;
    let seconds = started.elapsed().as_secs_f64();
    cores.record("bare_bootstrap_burst", results);
    let (mut done, mut failures) = (Vec::new(), 0usize);
    for outcome in outcomes {
        match outcome? {
            Ok(elapsed) => done.push(elapsed),
            Err(e) => {
                if failures == 0 {
                    eprintln!("  first failure: {e:#}");
                }
                failures += 1;
            }
        }
    }
    let retried = retried.load(Ordering::Relaxed);
    eprintln!("  {count} bootstraps at once: {seconds:.1}s, {failures} failed, {retried} retried after 429");
    results.insert("bare_bootstrap_burst_429_retries".into(), retried.into());
    results.insert("bare_bootstrap_burst_s".into(), round(seconds, 1).into());
    results.insert("bare_bootstrap_burst_failures".into(), failures.into());
    results.insert(
        "bare_bootstrap_burst_p50_ms".into(),
        round(ms(percentile(&done, 0.5)), 1).into(),
    );
    Ok(())
}

/// What a cluster set up for kubelet's TLS bootstrap binds to the
/// bootstrap tokens' group: creating CSRs, and having node client CSRs
/// approved by kube-controller-manager.
async fn grant_bootstrappers(admin: &kube::Client) -> Result<()> {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    for (name, role) in [
        ("bench-bootstrappers-create", "system:node-bootstrapper"),
        (
            "bench-bootstrappers-approve",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        ),
    ] {
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": BOOTSTRAPPERS}],
        }))?;
        bindings
            .create(&PostParams::default(), &binding)
            .await
            .with_context(|| format!("binding {role} to {BOOTSTRAPPERS}"))?;
    }
    Ok(())
}

/// The serving-CSR approver's queue: one worker approves what it is sent,
/// one CSR at a time.
fn one_worker(
    api: Api<CertificateSigningRequest>,
) -> mpsc::UnboundedSender<CertificateSigningRequest> {
    let (queue, mut work) = mpsc::unbounded_channel::<CertificateSigningRequest>();
    tokio::spawn(async move {
        while let Some(csr) = work.recv().await {
            if let Err(e) = approve(&api, &csr).await {
                eprintln!("  the one-worker approver failed: {e:#}");
            }
        }
    });
    queue
}

/// One machine's two CSRs, made beforehand.
struct Machine {
    client: CertificateSigningRequest,
    serving: CertificateSigningRequest,
}

impl Machine {
    /// The machine's CSRs, and its node name.
    fn prepare() -> Result<(Self, String)> {
        let id = unique();
        let node = format!("ip-10-0-0-1.stock-{id}.internal");
        let (client_key, serving_key) = (rcgen::KeyPair::generate()?, rcgen::KeyPair::generate()?);
        let serving_shape = CsrShape {
            dns: vec![node.clone()],
            ips: vec![IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))],
            ..CsrShape::client(&node)
        };
        let machine = Self {
            client: bench_csr(
                &format!("stock-client-{id}"),
                Purpose::Client,
                &CsrShape::client(&node),
                &client_key,
            )?,
            serving: bench_csr(
                &format!("stock-serving-{id}"),
                Purpose::Serving,
                &serving_shape,
                &serving_key,
            )?,
        };
        Ok((machine, node))
    }

    /// Client CSR, approved and signed; then the serving CSR, approved
    /// by the one worker and signed. How long it took.
    async fn bootstrap(
        &self,
        bootstrap: &Api<CertificateSigningRequest>,
        node: &Api<CertificateSigningRequest>,
        signatures: &Signatures,
        approver: &mpsc::UnboundedSender<CertificateSigningRequest>,
        retried: &AtomicU64,
    ) -> Result<Duration> {
        let within = Duration::from_secs(900);
        let started = Instant::now();
        let name = |csr: &CertificateSigningRequest| csr.metadata.name.clone().unwrap_or_default();
        let client_signed = signatures.expect(&[name(&self.client)], within);
        let post = PostParams::default();
        again(retried, || bootstrap.create(&post, &self.client)).await?;
        client_signed.await?;
        let serving_signed = signatures.expect(&[name(&self.serving)], within);
        let created = again(retried, || node.create(&post, &self.serving)).await?;
        approver
            .send(created)
            .map_err(|_| anyhow::anyhow!("the approver stopped"))?;
        serving_signed.await?;
        Ok(started.elapsed())
    }
}
