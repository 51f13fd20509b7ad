//! The harness's own tests: the real control plane does what the rest of
//! the suite relies on, and leaves nothing behind.

use anyhow::{Context, Result};
use autonode_tests::karpenter::standin;
use autonode_tests::kube::controlplane::{unique, ControlPlane};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, Condition};
use std::path::Path;
use std::time::Duration;

/// Karpenter's part, then a kubelet's bootstrap by hand: NodeClaim with a
/// providerID, a client CSR approved and signed by kube-controller-manager,
/// and the issued certificate creating its own Node (and no other).
#[tokio::test]
async fn smoke_nodeclaim_csr_and_node_restriction() -> Result<()> {
    let cp = ControlPlane::start().await?;
    let admin = cp.admin().await?;
    let suffix = unique();

    let claim_name = format!("smoke-{suffix}");
    standin::create_nodeclaim(&admin, &claim_name, "default").await?;
    let provider_id = "aws:///us-west-2a/i-0123456789abcdef0";
    let claim = standin::set_provider_id(&admin, &claim_name, provider_id).await?;
    assert_eq!(claim.data["status"]["providerID"], provider_id);

    let node_name = format!(
        "ip-10-0-0-{}.us-west-2.compute.internal",
        std::process::id() % 250
    );
    let key = rcgen::KeyPair::generate()?;
    let csr_pem = client_csr(&node_name, &key)?;
    let cert_pem = issue_via_csr(&admin, &format!("smoke-{suffix}"), &csr_pem).await?;

    let pair = autonode_tests::harness::pki::CertPair {
        cert_pem,
        key_pem: key.serialize_pem(),
    };
    let node_client = cp.client_with_cert(&pair).await?;
    let nodes: Api<Node> = Api::all(node_client);
    nodes
        .create(&PostParams::default(), &node(&node_name, provider_id))
        .await
        .context("a node creating its own Node")?;
    let err = nodes
        .create(&PostParams::default(), &node("someone-else", provider_id))
        .await
        .expect_err("NodeRestriction must refuse another node's Node");
    match err {
        kube::Error::Api(status) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("unexpected error {other}"),
    }
    Ok(())
}

/// Dropping the control plane stops every process and removes its
/// directory, also when the test is unwinding from a panic.
#[tokio::test]
async fn nothing_outlives_the_control_plane() -> Result<()> {
    let cp = ControlPlane::start().await?;
    let pids = cp.pids();
    let dir = cp.dir().to_path_buf();
    assert!(pids.iter().all(|pid| alive(*pid)));
    drop(cp);
    assert_gone(&pids, &dir);

    // The same while a panic unwinds through the owner.
    let cp = ControlPlane::start().await?;
    let pids = cp.pids();
    let dir = cp.dir().to_path_buf();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _owner = cp;
        panic!("a failing test");
    }));
    assert!(outcome.is_err());
    assert_gone(&pids, &dir);
    Ok(())
}

fn client_csr(node_name: &str, key: &rcgen::KeyPair) -> Result<String> {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("system:node:{node_name}"),
    );
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    Ok(params.serialize_request(key)?.pem()?)
}

/// Creates a kubelet client CSR, approves it, and waits for the certificate.
/// The scheduler, when asked for, runs with the rights of
/// `system:kube-scheduler`: it judges a pod and records its verdict (with no
/// node in the cluster, the pod is unschedulable), which it can only do
/// authenticated and authorized as itself.
#[tokio::test]
async fn the_scheduler_when_asked_for_judges_pods() -> Result<()> {
    let cp = ControlPlane::start_with_scheduler().await?;
    let pods: Api<Pod> = Api::namespaced(cp.admin().await?, "default");
    let name = format!("unplaceable-{}", unique());
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "example.invalid/none"}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let judged = |pod: Option<&Pod>| {
        pod.and_then(|p| p.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            })
    };
    tokio::time::timeout(
        Duration::from_secs(60),
        await_condition(pods, &name, judged),
    )
    .await
    .context("the scheduler never marked the pod unschedulable")??;
    Ok(())
}

async fn issue_via_csr(client: &kube::Client, name: &str, csr_pem: &str) -> Result<String> {
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.as_bytes().to_vec()),
            signer_name: "kubernetes.io/kube-apiserver-client-kubelet".into(),
            usages: Some(vec![
                "digital signature".into(),
                "key encipherment".into(),
                "client auth".into(),
            ]),
            ..Default::default()
        },
        status: None,
    };
    csrs.create(&PostParams::default(), &csr).await?;
    let approval = CertificateSigningRequestStatus {
        conditions: Some(vec![CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some("AutonodeSmokeTest".into()),
            message: Some("approved by the harness smoke test".into()),
            ..Default::default()
        }]),
        certificate: None,
    };
    let patch = serde_json::json!({ "status": approval });
    csrs.patch_approval(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let issued = tokio::time::timeout(
        Duration::from_secs(60),
        await_condition(csrs, name, has_certificate()),
    )
    .await
    .context("kube-controller-manager did not sign within 60s")??
    .context("CSR vanished")?;
    let cert = issued
        .status
        .and_then(|s| s.certificate)
        .context("no certificate")?;
    Ok(String::from_utf8(cert.0)?)
}

fn has_certificate() -> impl Condition<CertificateSigningRequest> {
    |csr: Option<&CertificateSigningRequest>| {
        csr.and_then(|c| c.status.as_ref())
            .and_then(|s| s.certificate.as_ref())
            .is_some_and(|c| !c.0.is_empty())
    }
}

fn node(name: &str, provider_id: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some(provider_id.to_string()),
            ..Default::default()
        }),
        status: None,
    }
}

fn alive(pid: u32) -> bool {
    // A zombie would still have /proc/<pid>; the harness reaps its children.
    Path::new(&format!("/proc/{pid}")).exists()
}

fn assert_gone(pids: &[u32], dir: &Path) {
    for pid in pids {
        assert!(!alive(*pid), "process {pid} outlived the control plane");
    }
    assert!(
        !dir.exists(),
        "{} outlived the control plane",
        dir.display()
    );
}
