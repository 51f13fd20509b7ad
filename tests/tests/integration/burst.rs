//! Many machines at once, as a Karpenter scale-out brings them.

use anyhow::Result;
use autonode_tests::callers::joiner::{self, Answer, NodeKeys};
use autonode_tests::server::world::World;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, ListParams};
use std::collections::BTreeSet;
use std::time::Duration;

const NODES: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_joins_at_once_give_two_hundred_nodes() -> Result<()> {
    // Distinct machines, though all from 127.0.0.1: no per-source caps.
    let world = World::start_with(&[
        "--max-connections-per-source=0".into(),
        "--max-handshakes-per-source=0".into(),
        "--max-joins-per-source=0".into(),
    ])
    .await?;
    let mut requests = Vec::with_capacity(NODES);
    for _ in 0..NODES {
        let (_, instance) = world.launch(|i| i).await?;
        let keys = NodeKeys::generate()?;
        requests.push(joiner::honest_request(&instance, world.cloud.ca(), &keys)?);
    }
    let joins = requests.into_iter().map(|request| {
        let joiner = world.joiner.clone();
        tokio::spawn(async move {
            // Like the agent: 503 means come back shortly.
            for _ in 0..60 {
                match joiner.join(&request).await? {
                    Answer::Refused(503, _) => tokio::time::sleep(Duration::from_millis(500)).await,
                    answer => return Ok(answer),
                }
            }
            anyhow::bail!("still unavailable after 60 tries")
        })
    });
    let mut names = BTreeSet::new();
    for join in futures::future::join_all(joins).await {
        names.insert(join??.granted().node_name);
    }
    assert_eq!(names.len(), NODES, "distinct node names");

    let csrs: Api<CertificateSigningRequest> = Api::all(world.cp.admin().await?);
    let ours = csrs
        .list(&ListParams::default().labels("autonode.dev/managed=true"))
        .await?
        .items;
    assert_eq!(
        ours.len(),
        2 * NODES,
        "one client and one serving CSR per node"
    );
    for csr in &ours {
        let status = csr.status.clone().unwrap_or_default();
        let approvals = status
            .conditions
            .unwrap_or_default()
            .iter()
            .filter(|c| c.type_ == "Approved")
            .count();
        assert_eq!(
            approvals, 1,
            "{:?} approved {approvals} times",
            csr.metadata.name
        );
        assert!(status.certificate.is_some());
    }
    Ok(())
}
