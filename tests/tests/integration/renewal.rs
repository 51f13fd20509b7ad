//! After the join: kubelet's own CSRs (client renewals, serving
//! certificates) are approved only when they are the node's own.

use anyhow::{Context, Result};
use autonode_tests::joiner::{self, CsrShape, NodeKeys};
use autonode_tests::pki::CertPair;
use autonode_tests::world::World;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::wait::await_condition;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

const CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const SERVING: &str = "kubernetes.io/kubelet-serving";

#[tokio::test]
async fn only_a_nodes_own_renewals_are_approved() -> Result<()> {
    let world = World::start().await?;
    let (_, instance) = world.launch(|i| i).await?;
    let keys = NodeKeys::generate()?;
    let response = world
        .joiner
        .join(&joiner::honest_request(&instance, world.cloud.ca(), &keys)?)
        .await?
        .granted();
    let node = world
        .cp
        .client_with_cert(&CertPair {
            cert_pem: response.client_certificate.clone(),
            key_pem: keys.client.serialize_pem(),
        })
        .await?;
    register(&node, &response.node_name, &response.kubelet.provider_id).await?;
    let csrs: Api<CertificateSigningRequest> = Api::all(node.clone());
    let name = &response.node_name;

    // Made by this node, for another node's name.
    let other = CsrShape::client("ip-10-1-1-1.us-west-2.compute.internal");
    let foreign_client = submit(&csrs, "renew-foreign", CLIENT, "client auth", &other).await?;
    // Serving, with an address the instance does not have.
    let mut foreign_ip = CsrShape::serving(&instance);
    foreign_ip
        .ips
        .push(IpAddr::V4(Ipv4Addr::new(10, 250, 0, 9)));
    let foreign_serving = submit(
        &csrs,
        "serving-foreign",
        SERVING,
        "server auth",
        &foreign_ip,
    )
    .await?;

    // The node's own name, but usages no kubelet asks for.
    let wrong_usages = submit(
        &csrs,
        "renew-usages",
        CLIENT,
        "code signing",
        &CsrShape::client(name),
    )
    .await?;

    // The node's own client renewal and serving certificate.
    let own = submit(
        &csrs,
        "renew-own",
        CLIENT,
        "client auth",
        &CsrShape::client(name),
    )
    .await?;
    let own_serving = submit(
        &csrs,
        "serving-own",
        SERVING,
        "server auth",
        &CsrShape::serving(&instance),
    )
    .await?;
    let admin: Api<CertificateSigningRequest> = Api::all(world.cp.admin().await?);
    for csr in [&own, &own_serving] {
        issued(&admin, csr)
            .await
            .with_context(|| format!("{csr} was not approved and signed"))?;
    }

    // The others were judged and left pending.
    let log = world.server.log();
    for csr in [&foreign_client, &foreign_serving, &wrong_usages] {
        assert!(
            log.lines()
                .any(|l| l.contains(csr.as_str()) && l.contains("left pending")),
            "{csr} was not judged"
        );
        let status = admin.get(csr).await?.status.unwrap_or_default();
        assert!(
            status.conditions.unwrap_or_default().is_empty(),
            "{csr} was decided"
        );
        assert!(status.certificate.is_none());
    }
    Ok(())
}

async fn register(node: &kube::Client, name: &str, provider_id: &str) -> Result<()> {
    let object = Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(provider_id.to_string()),
            ..Default::default()
        }),
        status: None,
    };
    Api::<Node>::all(node.clone())
        .create(&PostParams::default(), &object)
        .await?;
    Ok(())
}

/// Submits a CSR as kubelet would; returns its name.
async fn submit(
    api: &Api<CertificateSigningRequest>,
    prefix: &str,
    signer: &str,
    purpose_usage: &str,
    shape: &CsrShape<'_>,
) -> Result<String> {
    let key = rcgen::KeyPair::generate()?;
    let name = format!("{prefix}-{}", autonode_tests::controlplane::unique());
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(shape.csr(&key)?.into_bytes()),
            signer_name: signer.to_string(),
            usages: Some(vec![
                "digital signature".into(),
                "key encipherment".into(),
                purpose_usage.into(),
            ]),
            ..Default::default()
        },
        status: None,
    };
    api.create(&PostParams::default(), &csr).await?;
    Ok(name)
}

async fn issued(api: &Api<CertificateSigningRequest>, name: &str) -> Result<()> {
    let cond = |csr: Option<&CertificateSigningRequest>| {
        csr.and_then(|c| c.status.as_ref())
            .and_then(|s| s.certificate.as_ref())
            .is_some()
    };
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(api.clone(), name, cond),
    )
    .await??;
    Ok(())
}
