//! Staying up under hostile load: what anyone holding a node credential
//! can create does not grow the server's memory.
//!
//! Every node may create CSRs, of any signer, with any labels and up to
//! 256 KiB of annotations each, and (within what the API server accepts) a
//! request of any size. The issuer's watch selects CSRs by a label anyone
//! may set; the leader's approver watched every CSR, whole. A review took a
//! server from 38 to 166 MiB with 300 such CSRs, against a 256 MiB limit;
//! and a restarted replica lists them all again.
//!
//! Whoever may create EC2NodeClasses likewise makes them as large as the
//! API server takes, and the leader's upkeep and every replica's join
//! cache watch them all.

use anyhow::{ensure, Context, Result};
use autonode_tests::callers::joiner::CsrShape;
use autonode_tests::harness::poll;
use autonode_tests::kube::controlplane::unique;
use autonode_tests::server::world::World;
use futures::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, PostParams};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const SERVING: &str = "kubernetes.io/kubelet-serving";
/// A signer no one approves for: what the issuer's label watch saw.
const OTHER: &str = "example.com/anything";
/// CSRs the attacker makes.
const CSRS: usize = 300;
/// Of annotations on each: most of the API server's 256 KiB limit.
const ANNOTATION_BYTES: usize = 200 * 1024;
/// How much the server may grow over its baseline once it has seen them
/// all. Measured: +7–8 MiB (39 to 47 MiB), and +6 MiB (46 to 52) since the
/// server allocates with jemalloc; the server before this kept the CSRs
/// whole and grew by 130 MiB (41 to 171 MiB).
const GROWTH_BOUND: u64 = 32 << 20;
/// The peak of a replica restarted among them (listing them all again),
/// over the first one's baseline. Measured: 70–72 MiB, 31–33 over; 51 MiB,
/// 5 over, with jemalloc.
const RESTART_BOUND: u64 = 48 << 20;

/// One CSR of the attack: its signer, whether it carries autonode's label,
/// and its request (PEM).
struct Shape {
    signer: &'static str,
    managed: bool,
    request: Arc<str>,
    usage: &'static str,
}

#[tokio::test]
async fn csrs_a_node_can_create_do_not_grow_the_server() -> Result<()> {
    let world = World::start().await?;
    let node = world.join_new(|i| i).await?;
    let csrs: Api<CertificateSigningRequest> = Api::all(node.client.clone());
    // A kubelet CSR judged: the leader's approver is up and has listed.
    let first = create(&csrs, "warm", &small(&node.response.node_name, CLIENT)?).await?;
    left_pending(&world, &[first]).await?;
    let baseline = world.server.rss_bytes()?;

    let foreign_refused = world.cp.version().at_least(1, 31);
    let judged = attack(&csrs, &node.response.node_name, foreign_refused).await?;
    let lines = left_pending(&world, &judged).await?;
    // The issuer's watch is not waited on by anything: give it a moment.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = world.server.rss_bytes()?;
    let growth = after.saturating_sub(baseline);
    eprintln!(
        "server RSS: baseline {} MiB, after {CSRS} CSRs {} MiB (+{} KiB)",
        baseline >> 20,
        after >> 20,
        growth >> 10
    );
    assert!(growth < GROWTH_BOUND, "grew by {} MiB", growth >> 20);
    let too_large = lines.iter().filter(|l| l.contains("csr_too_large")).count();
    // The oversized third, less those with autonode's label (every other
    // one), which the approver's watches leave out.
    assert_eq!(too_large, CSRS / 6, "oversized requests skipped as such");

    // A replica started now lists them all again.
    world.server.restart().await?;
    let again = create(&csrs, "again", &small(&node.response.node_name, CLIENT)?).await?;
    left_pending(&world, &[again]).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let peak = world.server.peak_rss_bytes()?;
    eprintln!("restarted server: peak RSS {} MiB", peak >> 20);
    assert!(
        peak < baseline + RESTART_BOUND,
        "restarted, peaked at {} MiB",
        peak >> 20
    );
    // And it still does its work.
    world
        .join_new(|i| i)
        .await
        .context("a join after the attack")?;
    Ok(())
}

/// Creates the attack's CSRs; returns the names of those of the kubelet
/// signers without autonode's label (which the approver judges and leaves
/// pending; it does not watch labelled ones, which the issuer's watch
/// selects instead).
/// `foreign_refused`: the API server refuses a node's kubelet-client CSR
/// for another node's name at create (NodeRestriction, from 1.31), so the
/// kubelet-client ones renew the node's own name with a fresh key instead,
/// which autonode leaves pending too (as the warm-up's shows).
async fn attack(
    csrs: &Api<CertificateSigningRequest>,
    node: &str,
    foreign_refused: bool,
) -> Result<Vec<String>> {
    // Someone else's client certificate: never approved.
    let renewal: Arc<str> = CsrShape::client("ip-10-9-9-9.us-west-2.compute.internal")
        .csr(&key()?)?
        .into();
    let client_renewal: Arc<str> = if foreign_refused {
        CsrShape::client(node).csr(&key()?)?.into()
    } else {
        renewal.clone()
    };
    let oversized: Arc<str> = oversized_request(node)?.into();
    assert!(oversized.len() > autonode_shared::csr::MAX_CSR_PEM_BYTES);
    let shapes: Vec<Shape> = (0..CSRS)
        .map(|i| match i % 3 {
            0 => Shape {
                signer: OTHER,
                managed: true,
                request: renewal.clone(),
                usage: "client auth",
            },
            1 => Shape {
                signer: CLIENT,
                managed: i % 2 == 0,
                request: client_renewal.clone(),
                usage: "client auth",
            },
            _ => Shape {
                signer: SERVING,
                managed: i % 2 == 0,
                request: oversized.clone(),
                usage: "server auth",
            },
        })
        .collect();
    let created: Vec<(String, &Shape)> =
        stream::iter(&shapes)
            .map(|shape| async move {
                Ok::<_, anyhow::Error>((create(csrs, "big", shape).await?, shape))
            })
            .buffer_unordered(8)
            .try_collect()
            .await?;
    Ok(created
        .into_iter()
        .filter(|(_, shape)| shape.signer != OTHER && !shape.managed)
        .map(|(name, _)| name)
        .collect())
}

/// A client renewal of `node`'s name, with `signer`.
fn small(node: &str, signer: &'static str) -> Result<Shape> {
    Ok(Shape {
        signer,
        managed: false,
        request: CsrShape::client(node).csr(&key()?)?.into(),
        usage: "client auth",
    })
}

/// A serving CSR for `node` with enough names to be several times the
/// size limit (the API server takes it: it only parses it).
pub(crate) fn oversized_request(node: &str) -> Result<String> {
    let dns = (0..2500)
        .map(|i| format!("name-{i:05}-padding-padding-padding.{node}"))
        .collect();
    let shape = CsrShape {
        common_name: format!("system:node:{node}"),
        organisation: Some("system:nodes"),
        dns,
        ips: vec![],
    };
    shape.csr(&key()?)
}

fn key() -> Result<rcgen::KeyPair> {
    Ok(rcgen::KeyPair::generate()?)
}

/// Creates a CSR of `shape` with [`ANNOTATION_BYTES`] of annotations.
async fn create(
    api: &Api<CertificateSigningRequest>,
    prefix: &str,
    shape: &Shape,
) -> Result<String> {
    let name = format!("{prefix}-{}", unique());
    let labels = shape
        .managed
        .then(|| BTreeMap::from([("autonode.dev/managed".to_string(), "true".to_string())]));
    let annotations = BTreeMap::from([("padding".to_string(), "x".repeat(ANNOTATION_BYTES))]);
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels,
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(shape.request.as_bytes().to_vec()),
            signer_name: shape.signer.to_string(),
            usages: Some(vec![
                "digital signature".into(),
                "key encipherment".into(),
                shape.usage.into(),
            ]),
            ..Default::default()
        },
        status: None,
    };
    api.create(&PostParams::default(), &csr)
        .await
        .with_context(|| format!("creating {name}"))?;
    Ok(name)
}

/// The server's log lines saying each of `csrs` was left pending, once
/// there is one for every one.
async fn left_pending(world: &World, csrs: &[String]) -> Result<Vec<String>> {
    poll::until(
        "judgement of every CSR",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            let log = world.server.log();
            let found: Vec<String> = csrs
                .iter()
                .filter_map(|csr| {
                    log.lines()
                        .find(|l| l.contains(csr.as_str()) && l.contains("left pending"))
                        .map(str::to_string)
                })
                .collect();
            Ok((found.len() == csrs.len()).then_some(found))
        },
    )
    .await
}

/// Fat EC2NodeClasses the attacker makes (issue 48, item 2):
/// `AUTONODE_FAT_CLASSES`, else 24. 24 already took the server before
/// past the shipped limit (to 307 MiB) and take the suite's run a few
/// minutes; the figures in docs/design.md are of 160 (about 105 MB of
/// classes through the API server, past nextest's 10 minutes on two busy
/// cores): `AUTONODE_FAT_CLASSES=160 cargo test -p autonode-tests --test
/// integration memory::fat_ec2nodeclasses_do_not_grow_the_server -- --nocapture`.
fn fat_classes() -> usize {
    std::env::var("AUTONODE_FAT_CLASSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}
/// Empty annotation keys on each: about 660 KB of JSON per class, most
/// of it the keys listed again in managedFields.
const FAT_KEYS: usize = 25_000;
/// The memory limit the chart and the Kustomize base ship.
const SHIPPED_LIMIT: u64 = 256 << 20;
/// How much the leader may grow once it keeps them all. Measured: +19–22
/// MiB (40 to 59, 41 to 62 MiB), most of it what the allocator keeps of
/// the pages and watch events parsed; a replica restarted among them
/// peaked at 73 MiB. With jemalloc: +8 MiB (44 to 52), peaks of 54 and 50
/// MiB. The server before kept every class whole,
/// managedFields included: 8 such classes took it from 41 to 162 MiB.
const CLASS_GROWTH_BOUND: u64 = 32 << 20;

/// The serve flags that turn the EC2NodeClass upkeep on (a join CA file
/// in `dir`). The Lease is the default 15 s, not a short one: a leader
/// steps down when a renewal takes longer than a third of its Lease, and
/// this control plane, busy applying 660 KB classes, took 0.3 to 1.4 s to
/// answer each Lease request; with a 3 s Lease the leader stepped down and
/// back 62 times in four minutes and its upkeep never finished.
fn upkeep_flags(dir: &std::path::Path) -> Result<Vec<String>> {
    let ca_file = dir.join("join-ca.pem");
    std::fs::write(
        &ca_file,
        autonode_tests::harness::pki::Ca::new("memory-join-ca")?.cert_pem(),
    )?;
    Ok(vec![
        "--public-url=https://autonode.example.com:8443".into(),
        format!("--join-ca-file={}", ca_file.display()),
        "--cluster-name=memory".into(),
    ])
}

/// A counter or gauge from the server's `/metrics`, 0 when absent.
async fn metric(world: &World, name: &str) -> Result<f64> {
    let url = format!("{}/metrics", world.server.metrics_url());
    let (_, body) = autonode_tests::server::http_get(&url).await?;
    Ok(body
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0))
}

/// Waits until the leader has done `at_least` of `name` (its upkeep).
async fn upkeep_reached(world: &World, name: &str, at_least: f64) -> Result<()> {
    let reached = poll::until(
        &format!("{name} at {at_least}"),
        Duration::from_secs(600),
        Duration::from_millis(500),
        || async { Ok((metric(world, name).await? >= at_least).then_some(())) },
    )
    .await;
    if reached.is_err() {
        let log = world.server.log();
        let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN")).collect();
        eprintln!(
            "{name} at {}; the server's last warnings:\n{}",
            metric(world, name).await?,
            warnings[warnings.len().saturating_sub(10)..].join("\n")
        );
    }
    reached
}

/// Creates the fat class `name`: [`FAT_KEYS`] empty annotations.
async fn create_fat_class(admin: &kube::Client, name: String) -> Result<()> {
    let annotations: serde_json::Map<String, serde_json::Value> = (0..FAT_KEYS)
        .map(|i| (format!("k{i:05}"), serde_json::Value::from("")))
        .collect();
    let spec = autonode_tests::karpenter::standin::custom_spec(serde_json::json!({}));
    let created = autonode_tests::karpenter::standin::create_nodeclass(
        admin,
        &name,
        serde_json::Value::Object(annotations),
        spec,
    )
    .await;
    match created {
        Ok(_) => Ok(()),
        // A create the API server took but answered too late is sent
        // again (it is slow with a hundred such classes): made already.
        Err(e) if format!("{e:#}").contains("AlreadyExists") => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whoever may create EC2NodeClasses makes them as large as the API server
/// takes: the leader's upkeep keeps every class, and every replica's join
/// caches them. Neither builds what autonode does not read, so the leader
/// stays near its baseline, and a replica restarted among them (listing
/// them all again, then leading) peaks well under the shipped limit.
#[tokio::test]
async fn fat_ec2nodeclasses_do_not_grow_the_server() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let world = World::start_with(&upkeep_flags(dir.path())?).await?;
    let admin = world.cp.admin().await?;
    // A plain class written once: the upkeep leads and has listed.
    let spec = autonode_tests::karpenter::standin::custom_spec(serde_json::json!({}));
    autonode_tests::karpenter::standin::create_nodeclass(
        &admin,
        "plain",
        serde_json::json!({}),
        spec,
    )
    .await?;
    let writes = "autonode_nodeclass_writes_total";
    upkeep_reached(&world, writes, 1.0).await?;
    let baseline = world.server.rss_bytes()?;

    let started = std::time::Instant::now();
    stream::iter(0..fat_classes())
        .map(|i| create_fat_class(&admin, format!("fat-{i:03}")))
        .buffer_unordered(4)
        .try_collect::<Vec<()>>()
        .await?;
    eprintln!(
        "created {} fat classes in {:?}",
        fat_classes(),
        started.elapsed()
    );
    // Each class written once by the upkeep: every one seen, parsed, kept.
    upkeep_reached(&world, writes, 1.0 + fat_classes() as f64).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = world.server.rss_bytes()?;
    let leader_peak = world.server.peak_rss_bytes()?;
    let growth = after.saturating_sub(baseline);
    eprintln!(
        "leader RSS: baseline {} MiB, with {} fat classes {} MiB (+{} KiB), \
         peak {} MiB; shipped limit {} MiB",
        baseline >> 20,
        fat_classes(),
        after >> 20,
        growth >> 10,
        leader_peak >> 20,
        SHIPPED_LIMIT >> 20
    );
    assert!(growth < CLASS_GROWTH_BOUND, "grew by {} MiB", growth >> 20);
    assert!(
        leader_peak < SHIPPED_LIMIT,
        "peaked at {} MiB",
        leader_peak >> 20
    );

    // A replica started now lists them all again, and leads. Listing 105
    // MB of classes from this busy control plane takes longer than the
    // harness's 30 s wait for /readyz: waited for here.
    let restarted = std::time::Instant::now();
    if let Err(error) = world.server.restart().await {
        eprintln!("restarted replica not ready yet: {error:#}");
        let url = format!("{}/readyz", world.server.metrics_url());
        poll::until(
            "the restarted replica ready",
            Duration::from_secs(600),
            Duration::from_millis(500),
            || async {
                let answer = autonode_tests::server::http_get(&url).await;
                Ok(answer.is_ok_and(|(status, _)| status == 200).then_some(()))
            },
        )
        .await?;
    }
    eprintln!("restarted replica ready after {:?}", restarted.elapsed());
    let checks = "autonode_nodeclass_checks_total";
    upkeep_reached(&world, checks, 1.0 + fat_classes() as f64).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let peak = world.server.peak_rss_bytes()?;
    eprintln!(
        "restarted replica: peak RSS {} MiB; shipped limit {} MiB",
        peak >> 20,
        SHIPPED_LIMIT >> 20
    );
    assert!(
        peak < SHIPPED_LIMIT,
        "restarted, peaked at {} MiB",
        peak >> 20
    );
    // And it still does its work.
    world
        .join_new(|i| i)
        .await
        .context("a join after the attack")?;
    Ok(())
}

/// Every cache lists as one stream of watch events where the API server
/// serves it (on 1.37 by default: no `list` request from the server, no
/// warning), and in pages where it refuses (a run with
/// `AUTONODE_KUBE_FEATURE_GATES=WatchList=false`: the server's lists, and
/// the warning once); either way the caches fill and joins work. One run
/// per branch proves that branch.
#[tokio::test]
async fn caches_list_as_one_stream_where_the_api_server_serves_it_and_in_pages_where_not(
) -> Result<()> {
    let world = World::start().await?;
    world.join_new(|i| i).await?;
    let refused = std::env::var(autonode_tests::kube::controlplane::FEATURE_GATES_ENV)
        .is_ok_and(|gates| gates.replace(' ', "").contains("WatchList=false"));
    let user = format!(
        "system:serviceaccount:{}:{}",
        autonode_tests::server::SERVER_SERVICE_ACCOUNT.0,
        autonode_tests::server::SERVER_SERVICE_ACCOUNT.1
    );
    let events = world.cp.audit_events()?;
    let server = |verb: &str| {
        events
            .iter()
            .filter(|e| e["user"]["username"] == user.as_str() && e["verb"] == verb)
            .filter_map(|e| e["requestURI"].as_str())
            .collect::<Vec<_>>()
    };
    let lists = server("list");
    let streams = server("watch")
        .into_iter()
        .filter(|uri| uri.contains("sendInitialEvents=true"))
        .count();
    let warned = world.server.warn_lines("refuses streaming lists");
    eprintln!(
        "WatchList refused: {refused}; the server's lists {}, streaming lists {streams}, warnings {warned}",
        lists.len()
    );
    if refused {
        ensure!(!lists.is_empty(), "no list though streams are refused");
        ensure!(warned == 1, "told {warned} times, not once");
    } else {
        ensure!(
            lists.is_empty(),
            "listed where a stream was served: {lists:?}"
        );
        ensure!(streams > 0, "no streaming list");
        ensure!(warned == 0, "warned that streams are refused");
    }
    Ok(())
}
