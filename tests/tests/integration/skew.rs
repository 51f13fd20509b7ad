//! The skew promise (docs/upgrading.md), held against real binaries of
//! earlier revisions (`tests/skew/revisions`, built by
//! `tests/setup/build-revisions`): every earlier agent joins through this
//! tree's server, and this tree's agent joins through the previous
//! release's server, in the scenarios an upgrade meets: userData as the
//! upkeep renders it, a reboot, a resumed join, instances with more than
//! one address. The real Karpenter's launch with an earlier agent is in
//! `an_earlier_agent_joins_a_machine_the_real_karpenter_launched`.

use anyhow::{Context, Result};
use autonode_tests::cloud::fakecloud::Instance;
use autonode_tests::harness::pki::Ca;
use autonode_tests::harness::poll;
use autonode_tests::karpenter::standin::{self, ec2nodeclasses, nodeclaims};
use autonode_tests::kube::events::events_of;
use autonode_tests::machines::node::{agent_binary, registration, SimulatedNode};
use autonode_tests::server::skew::{self, Arch, Revision};
use autonode_tests::server::world::World;
use autonode_tests::server::{self, Setup};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// userData as `autonode-server render-userdata` (this tree's) prints it
/// for `world`, which is what the upkeep keeps on every class.
fn rendered_user_data(world: &World) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let ca = dir.path().join("join-ca.crt");
    std::fs::write(&ca, world.server.ca_pem())?;
    server::render_user_data(&[
        format!("--public-url={}", world.server.url()),
        format!("--join-ca-file={}", ca.display()),
        "--cluster-name=autonode-test".to_string(),
    ])
}

/// A machine Karpenter launched with the rendered userData; `shape` adds
/// addresses.
async fn machine(
    world: &World,
    shape: impl FnOnce(Instance) -> Instance,
) -> Result<(String, SimulatedNode)> {
    let user_data = rendered_user_data(world)?;
    let (claim, instance) = world
        .launch(|i| {
            shape(Instance {
                user_data: user_data.into_bytes(),
                ..i
            })
        })
        .await?;
    Ok((claim, SimulatedNode::boot(world, &instance)?))
}

fn stderr(run: &Output) -> String {
    String::from_utf8_lossy(&run.stderr).into_owned()
}

/// How many joins the server granted `claim` with `result` (`joined`,
/// `resumed`).
fn grants(world: &World, claim: &str, result: &str) -> usize {
    world
        .server
        .log()
        .lines()
        .filter(|l| l.contains("join granted") && l.contains(claim) && l.contains(result))
        .count()
}

/// The ordinary life of one machine running `agent` against `world`'s
/// server: the join from rendered userData, kubelet's credential
/// registering the Node, a reboot that joins nothing again, and a join
/// resumed with the same keys on a disk that lost the rest.
async fn ordinary_life(world: &World, agent: &Path, who: &str) -> Result<()> {
    let (claim, node) = machine(world, |i| i).await?;
    let run = node.run_agent_binary(agent, &[]).await?;
    assert_eq!(
        run.status.code(),
        Some(0),
        "{who}: the join failed:\n{}",
        stderr(&run)
    );
    assert!(
        node.systemctl_calls().contains("kubelet.service"),
        "{who}: kubelet not started"
    );

    // A reboot: the agent sees its own finished join and asks nothing.
    let again = node.run_agent_binary(agent, &[]).await?;
    assert_eq!(
        again.status.code(),
        Some(0),
        "{who}: the reboot failed:\n{}",
        stderr(&again)
    );
    assert_eq!(
        grants(world, &claim, "joined"),
        1,
        "{who}: joined again on reboot"
    );

    // A join resumed: the same keys, nothing else of the first run.
    let resumed = SimulatedNode::boot(world, &node.instance)?;
    skew::carry_keys(node.root.path(), resumed.root.path())?;
    let run = resumed.run_agent_binary(agent, &[]).await?;
    assert_eq!(
        run.status.code(),
        Some(0),
        "{who}: the resumed join failed:\n{}",
        stderr(&run)
    );
    assert_eq!(grants(world, &claim, "resumed"), 1, "{who}: not resumed");

    // kubelet's credential works: the Node registers.
    let kubelet = resumed.kubelet_client().await?;
    Api::<Node>::all(kubelet)
        .create(&PostParams::default(), &registration(&resumed.instance))
        .await
        .with_context(|| format!("{who}: the Node's registration"))?;
    Ok(())
}

/// Secondary private IPv4s and several IPv6s on the primary interface, as
/// the VPC CNI leaves an instance (and as IMDS then lists them).
fn multi_address(i: Instance) -> Instance {
    let [a, b, c, d] = i.private_ip.octets();
    let ipv6 = |n: u16| Ipv6Addr::new(0x2600, 0x1f14, 0xabc, u16::from(c), 0, 0, u16::from(d), n);
    Instance {
        secondary_ips: vec![
            Ipv4Addr::new(a, b, c, d.wrapping_add(100)),
            Ipv4Addr::new(a, b, c, d.wrapping_add(101)),
        ],
        ipv6s: vec![ipv6(1), ipv6(2), ipv6(3)],
        ..i
    }
}

/// An agent refused for good with a reason that replaces its machine:
/// exit 2 at once, its NodeClaim deleted (Karpenter replaces the machine
/// now, not after 15 minutes), the agent's own log and an Event on the
/// NodeClaim each holding all of their `words`, and the server's log
/// naming the `reason` with the NodeClaim.
async fn assert_refused_and_replaced(
    world: &World,
    (claim, run): (&str, &Output),
    (agent_words, event_words): (&[&str], &[&str]),
    reason: &str,
    who: &str,
) -> Result<()> {
    let agent_log = stderr(run);
    assert_eq!(
        run.status.code(),
        Some(2),
        "{who}: not refused for good:\n{agent_log}"
    );
    assert!(
        agent_words.iter().all(|w| agent_log.contains(w)),
        "{who}: the agent's log lacks {agent_words:?}: {agent_log}"
    );
    let admin = world.cp.admin().await?;
    crate::feedback::wait_deleted(&nodeclaims(&admin), claim)
        .await
        .with_context(|| format!("{who}: the NodeClaim refused as {reason} was not deleted"))?;
    let refused = world.event_reasons(claim, "JoinRefused").await?;
    assert!(refused.iter().any(|r| r == "JoinRefused"), "{refused:?}");
    let events = events_of(&admin, claim).await?;
    let said = events
        .iter()
        .filter_map(|e| e.message.as_deref())
        .any(|m| event_words.iter().all(|w| m.contains(w)));
    assert!(said, "{who}: no Event says {event_words:?}: {events:?}");
    let log = world.server.log();
    assert!(
        log.lines().any(|l| l.contains(reason) && l.contains(claim)),
        "{who}: the server's log does not name the reason"
    );
    Ok(())
}

/// An earlier agent refused on a multi-address instance: the Event, the
/// server's log and the agent's own log say the AMI's agent is too old and
/// which version fixes it.
async fn assert_too_old(world: &World, claim: &str, run: &Output, who: &str) -> Result<()> {
    let words = (
        &["too old", "0.2.0"][..],
        &["too old", "autonode-agent 0.2.0 or later"][..],
    );
    assert_refused_and_replaced(world, (claim, run), words, "agent_too_old", who).await
}

/// Every earlier agent's ordinary life through this tree's server: a
/// release's as its packages ship it (the static release binary of its
/// amd64 `.deb`, and of its arm64 one under QEMU's user-mode emulation),
/// the revisions between releases as debug builds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_earlier_agent_joins_the_current_server_boots_again_and_resumes() -> Result<()> {
    let world = World::start().await?;
    let mut packaged = 0;
    for revision in skew::all()? {
        ordinary_life(&world, &revision.agent(), &revision.label()).await?;
        if revision.is_release() {
            let arm64 = revision.packaged_agent(Arch::Arm64)?;
            let who = format!("{}'s arm64 package, under qemu-user", revision.label());
            ordinary_life(&world, &arm64, &who).await?;
            packaged += 1;
        }
    }
    assert!(
        packaged > 0,
        "no release in tests/skew/revisions: no package ran"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_current_agent_joins_the_previous_releases_server() -> Result<()> {
    let previous = skew::previous_release()?;
    let binary = previous.server();
    let world = World::start_setup(&Setup {
        binary: Some(&binary),
        ..Setup::default()
    })
    .await?;
    let who = format!("this agent on {}'s server", previous.label());
    ordinary_life(&world, &agent_binary()?, &who).await?;
    // The current agent on a multi-address instance names only the
    // primary address, which every server signs.
    let (_, node) = machine(&world, multi_address).await?;
    let run = node.run_agent(&[]).await?;
    assert_eq!(
        run.status.code(),
        Some(0),
        "{who}, multi-address:\n{}",
        stderr(&run)
    );
    // It asked for a challenge first, and on the 404 joined through /v1.
    assert!(
        stderr(&run).contains("the server has no /v2 "),
        "{who}: no fallback to /v1 said:\n{}",
        stderr(&run)
    );
    Ok(())
}

/// Every earlier agent before 0.2.0 on an instance with secondary IPv4s
/// and several IPv6s: refused for good with the reason said (an earlier
/// server refused it as `serving_csr`, which dooms nothing: the machine
/// waited out Karpenter's 15 minutes and its replacement failed the same
/// way). Agents of 0.2.0 on, this tree's among them, join the same shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_agent_on_a_multi_address_instance_is_told_it_is_too_old_and_replaced(
) -> Result<()> {
    let world = World::start().await?;
    for revision in skew::all()? {
        let who = format!("{} multi-address", revision.label());
        let (claim, node) = machine(&world, multi_address).await?;
        let run = node.run_agent_binary(&revision.agent(), &[]).await?;
        if revision.agent_version()? >= (0, 2, 0) {
            assert_eq!(run.status.code(), Some(0), "{who}:\n{}", stderr(&run));
            continue;
        }
        assert_too_old(&world, &claim, &run, &who).await?;
        assert!(
            world.csrs_for(&node.instance).await?.is_empty(),
            "{who}: CSRs were created"
        );
    }
    let (_, node) = machine(&world, multi_address).await?;
    let run = node.run_agent(&[]).await?;
    assert_eq!(
        run.status.code(),
        Some(0),
        "this agent, multi-address:\n{}",
        stderr(&run)
    );
    Ok(())
}

/// One shape at a time, for an earlier agent: only a secondary IPv4, only
/// several IPv6s (the primary one alone is allowed), and a join resumed
/// after the pod network added addresses to a machine that had joined
/// with one (its NodeClaim bound to the same keys: doomed all the same).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_multi_address_shape_is_refused_as_too_old_for_an_earlier_agent() -> Result<()> {
    // Three machines of one NodePool and class fail alike here, none Ready
    // between: past the default failure budget the third would be kept
    // (budget::). This test is about each shape's verdict, so the budget
    // stays out of its way.
    let world = World::start_with(&["--failure-budget=10".into()]).await?;
    let oldest: Revision = skew::all()?.remove(0);
    let agent = oldest.agent();
    let secondary_ipv4 = |i: Instance| {
        let [a, b, c, d] = i.private_ip.octets();
        Instance {
            secondary_ips: vec![Ipv4Addr::new(a, b, c, d.wrapping_add(100))],
            ..i
        }
    };
    let (claim, node) = machine(&world, secondary_ipv4).await?;
    let run = node.run_agent_binary(&agent, &[]).await?;
    assert_too_old(&world, &claim, &run, "a secondary IPv4").await?;

    let ipv6s = |i: Instance| Instance {
        ipv6s: multi_address(i.clone()).ipv6s,
        ..i
    };
    let (claim, node) = machine(&world, ipv6s).await?;
    let run = node.run_agent_binary(&agent, &[]).await?;
    assert_too_old(&world, &claim, &run, "several IPv6s").await?;

    // Joined with one address; then pods' addresses appear and the join
    // is resumed (its answer lost, its keys kept).
    let (claim, node) = machine(&world, |i| i).await?;
    let run = node.run_agent_binary(&agent, &[]).await?;
    assert_eq!(
        run.status.code(),
        Some(0),
        "the first join:\n{}",
        stderr(&run)
    );
    let grown = world
        .cloud
        .modify(&node.instance.instance_id, |i| {
            *i = multi_address(i.clone())
        })
        .context("the instance is gone")?;
    let rebooted = SimulatedNode::boot(&world, &grown)?;
    skew::carry_keys(node.root.path(), rebooted.root.path())?;
    let run = rebooted.run_agent_binary(&agent, &[]).await?;
    assert_too_old(&world, &claim, &run, "a resumed join with added addresses").await?;
    Ok(())
}

/// The class the rolling-upgrade servers keep, and the flags both
/// generations share: the same userData settings, AMI and rollout state key
/// (a Deployment mounts the same Secrets into every replica), a short
/// lease and resync so the handovers happen within the test.
struct Fleet {
    _dir: tempfile::TempDir,
    join_ca: Ca,
    flags: Vec<String>,
}

const CLASS: &str = "default";
const AMI: &str = "ami-0aaaaaaaaaaaaaaa1";

impl Fleet {
    fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let join_ca = Ca::new("autonode-join-ca")?;
        let ca_file = dir.path().join("join-ca.pem");
        std::fs::write(&ca_file, join_ca.cert_pem())?;
        let key_file = dir.path().join("rollout-state.key");
        std::fs::write(&key_file, rand::random::<[u8; 32]>())?;
        let flags = vec![
            "--public-url=https://autonode.example.com:8443".to_string(),
            format!("--join-ca-file={}", ca_file.display()),
            "--cluster-name=autonode-test".into(),
            "--nodeclass-resync=1".into(),
            "--leader-lease=3".into(),
            format!("--rollout-state-key-file={}", key_file.display()),
            format!("--ami-ids=amd64={AMI}"),
        ];
        Ok(Self {
            _dir: dir,
            join_ca,
            flags,
        })
    }

    /// A replica running `binary` (`None`: this tree's server).
    async fn replica(&self, world: &World, binary: Option<&Path>) -> Result<server::TestServer> {
        let setup = Setup {
            extra_args: &self.flags,
            join_ca: Some(&self.join_ca),
            binary,
            ..Setup::default()
        };
        let settings = autonode_tests::server::world::cloud_settings(&world.cloud, &world.ec2);
        server::TestServer::launch(&world.cp, &settings, &setup).await
    }

    /// An agent's config pointing at the Service.
    fn user_data(&self, service: &str) -> String {
        format!(
            "server-url = \"{service}\"\nserver-ca = \"\"\"\n{}\"\"\"\ncluster-name = \"autonode-test\"\n\n[options]\ndeadline = \"180s\"\n",
            self.join_ca.cert_pem()
        )
    }
}

/// What a class carries that drift is made of, and the guard's state.
async fn kept(world: &World) -> Result<(serde_json::Value, serde_json::Value, Option<String>)> {
    let class = ec2nodeclasses(&world.cp.admin().await?).get(CLASS).await?;
    let state = class
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("autonode.dev/rollout").cloned());
    Ok((
        class.data["spec"]["userData"].clone(),
        class.data["spec"]["amiSelectorTerms"].clone(),
        state,
    ))
}

/// Machines launched one after another through the Service, alternately
/// with the previous release's agent and this one's, every 1.5 s until
/// `rolled` is set and for `after` more once it is (so that joins meet
/// every stage of the rollout however slowly the machine runs it): each
/// agent's exit code, with who it was.
async fn join_through(
    world: Arc<World>,
    service: SocketAddr,
    user_data: String,
    agents: [PathBuf; 2],
    (rolled, after): (Arc<AtomicBool>, usize),
) -> Result<Vec<(String, Option<i32>, String)>> {
    let mut runs = Vec::new();
    let mut left = after;
    for n in 0.. {
        if rolled.load(Ordering::Acquire) {
            if left == 0 {
                break;
            }
            left -= 1;
        }
        let user_data = user_data.clone().into_bytes();
        let (claim, instance) = world.launch(|i| Instance { user_data, ..i }).await?;
        let node = SimulatedNode::boot_at(&instance, world.cloud.ca(), service, service)?;
        let agent = agents[n % 2].clone();
        runs.push(tokio::spawn(async move {
            let run = node.run_agent_binary(&agent, &[]).await;
            (claim, agent, run)
        }));
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    }
    let mut out = Vec::new();
    for run in runs {
        let (claim, agent, run) = run.await?;
        let run = run?;
        out.push((
            format!("{claim} ({})", agent.display()),
            run.status.code(),
            stderr(&run),
        ));
    }
    Ok(out)
}

/// A rolling upgrade with joins in flight: two replicas of the previous
/// release's server behind a Service, replaced one at a time by this
/// tree's as a Deployment rollout does (the old replica taken out of the
/// endpoints, stopped with SIGTERM so it hands its Lease over, the new one
/// started and ready before the next), while machines with the previous
/// release's agent and this one's join through the Service. Every machine
/// joins; the class the upkeep keeps has the same userData and AMI terms
/// before and after (no drift), and its rollout-guard state is still there
/// and still authentic to the new servers (no `RolloutStateRejected`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_upgrade_with_joins_in_flight_fails_no_join_and_drifts_no_class() -> Result<()> {
    let previous = skew::previous_release()?;
    let old = previous.server();
    let fleet = Fleet::new()?;
    let world = Arc::new(
        World::start_setup(&Setup {
            extra_args: &fleet.flags,
            join_ca: Some(&fleet.join_ca),
            binary: Some(&old),
            ..Setup::default()
        })
        .await?,
    );
    let admin = world.cp.admin().await?;
    standin::create_ec2nodeclass(&admin, CLASS, "before autonode").await?;
    let old_b = fleet.replica(&world, Some(&old)).await?;
    let before = poll::until(
        "the previous release's upkeep to keep the class",
        std::time::Duration::from_secs(60),
        std::time::Duration::from_millis(250),
        || async {
            let kept = kept(&world).await?;
            Ok((kept.2.is_some() && kept.1[0]["id"] == AMI).then_some(kept))
        },
    )
    .await?;

    let service = skew::Endpoints::start(&[world.server.url(), old_b.url()]).await?;
    let addr: SocketAddr = service.url().trim_start_matches("https://").parse()?;
    let rolled = Arc::new(AtomicBool::new(false));
    let joins = tokio::spawn(join_through(
        world.clone(),
        addr,
        fleet.user_data(&service.url()),
        [previous.agent(), agent_binary()?],
        (rolled.clone(), 3),
    ));

    // The rollout: one replica at a time, each new one ready first.
    let grace = std::time::Duration::from_secs(20);
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    service.set(&[old_b.url()])?;
    let a_stopped = world.server.terminate(grace);
    let new_a = fleet.replica(&world, None).await?;
    service.set(&[old_b.url(), new_a.url()])?;
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    service.set(&[new_a.url()])?;
    let b_stopped = old_b.terminate(grace);
    let new_b = fleet.replica(&world, None).await?;
    service.set(&[new_a.url(), new_b.url()])?;
    rolled.store(true, Ordering::Release);

    let runs = joins.await??;
    let failed: Vec<&(String, Option<i32>, String)> = runs
        .iter()
        .filter(|(_, code, _)| *code != Some(0))
        .collect();
    let granted = |log: String| log.lines().filter(|l| l.contains("join granted")).count();
    let by_old = granted(world.server.log()) + granted(old_b.log());
    let by_new = granted(new_a.log()) + granted(new_b.log());
    eprintln!(
        "rolling upgrade: {} machines, {} failed joins, {by_old} granted by the previous release's \
         replicas and {by_new} by this one's; old replicas stopped by SIGTERM: {a_stopped}, {b_stopped}",
        runs.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "failed joins: {failed:#?}");
    assert!(
        by_old > 0 && by_new > 0,
        "the joins did not span the rollout: {by_old} old, {by_new} new"
    );
    assert!(
        a_stopped && b_stopped,
        "an old replica did not stop on SIGTERM"
    );

    // The new servers keep the class as the old ones did: the same bytes,
    // and a guard state they accept (a leader has run the upkeep since).
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let after = kept(&world).await?;
    assert_eq!(
        (&after.0, &after.1),
        (&before.0, &before.1),
        "the class drifted"
    );
    assert!(after.2.is_some(), "the rollout state was lost");
    let reasons = autonode_tests::kube::events::event_reasons(&admin, CLASS).await?;
    assert!(
        !reasons.iter().any(|r| r == "RolloutStateRejected"),
        "the new servers rejected the old state: {reasons:?}"
    );
    for replica in [&new_a, &new_b] {
        assert!(
            !replica.log().contains("RolloutStateRejected"),
            "{}",
            replica.log()
        );
    }
    Ok(())
}

/// The Helm releases of a server and its guest RBAC: name, namespace, and
/// the settings the guest's needs.
const HELM_RELEASES: [(&str, &str, &[&str]); 2] = [
    ("autonode-server", "hosted-cp", &[]),
    ("autonode-guest", "guest-rbac", &["--set", "cluster=guest"]),
];

/// Checks that Helm's last revision of `release` is `revision` and
/// deployed.
fn deployed_at(release: &str, namespace: &str, kubeconfig: &str, revision: char) -> Result<()> {
    let args = [
        "history",
        release,
        "--namespace",
        namespace,
        "--kubeconfig",
        kubeconfig,
    ];
    let history = autonode_tests::server::helm::helm(&args)?;
    let last = history.lines().last().unwrap_or_default();
    anyhow::ensure!(
        last.trim_start().starts_with(revision) && last.contains("deployed"),
        "{release}: {history}"
    );
    Ok(())
}

/// `helm upgrade` from each earlier revision's chart (the previous
/// release's among them) to this one, on a real API server: the server's
/// release (namespace `hosted-cp`) and the guest RBAC's (`cluster=guest`),
/// each upgraded in place to revision 2, the Deployment then running this
/// version's image with flags rendered; each pair uninstalled before the
/// next revision's (the guest release's objects are cluster-wide).
#[tokio::test]
async fn helm_upgrade_from_every_earlier_chart_works_in_place() -> Result<()> {
    use autonode_tests::server::helm;
    let cp = autonode_tests::kube::controlplane::ControlPlane::start().await?;
    let kubeconfig = cp.admin_kubeconfig().to_string_lossy().into_owned();
    let new_chart = helm::chart_dir();
    let releases = HELM_RELEASES;
    for revision in skew::all()? {
        let who = revision.label();
        let old_chart = revision.chart();
        for (release, namespace, sets) in releases {
            for (verb, chart) in [("install", &old_chart), ("upgrade", &new_chart)] {
                let chart = chart.to_string_lossy();
                let mut args = vec![verb, release, &*chart, "--namespace", namespace];
                args.extend(["--create-namespace", "--kubeconfig", &kubeconfig]);
                args.extend(sets.iter().copied());
                helm::helm(&args).with_context(|| format!("{who}: helm {verb} {release}"))?;
            }
            deployed_at(release, namespace, &kubeconfig, '2').context(who.clone())?;
        }
        let (image, flags) = server_container(&cp).await?;
        assert!(
            image.ends_with(&format!(":{}", env!("CARGO_PKG_VERSION"))),
            "{who}: {image}"
        );
        assert!(!flags.is_empty(), "{who}: no flags");
        for (release, namespace, _) in releases {
            let args = [
                "uninstall",
                release,
                "--namespace",
                namespace,
                "--kubeconfig",
                &kubeconfig,
            ];
            helm::helm(&args).with_context(|| format!("{who}: helm uninstall {release}"))?;
        }
        // The guest chart's own namespace goes with it: the next install
        // needs it gone, not terminating.
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(cp.admin().await?);
        poll::until(
            "no namespace terminating",
            std::time::Duration::from_secs(60),
            std::time::Duration::from_millis(250),
            || async {
                let all = namespaces.list(&Default::default()).await?;
                let gone = all
                    .items
                    .iter()
                    .all(|n| n.metadata.deletion_timestamp.is_none());
                Ok(gone.then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}

/// The real Karpenter launches a machine whose AMI carries the oldest
/// earlier agent, from the class whose userData this server's upkeep
/// keeps: the old agent joins through this server, the Node registers and
/// Karpenter initializes it, as for this tree's agent.
#[tokio::test(flavor = "multi_thread")]
async fn an_earlier_agent_joins_a_machine_the_real_karpenter_launched() -> Result<()> {
    use autonode_tests::fleet::cluster::{create_pending_pod, KarpenterCluster};
    let oldest = skew::all()?.remove(0);
    let cluster = KarpenterCluster::start(&[]).await?;
    cluster.launcher.run_agent(oldest.agent());
    cluster.create_class_and_pool().await?;
    let t0 = std::time::Instant::now();
    create_pending_pod(&cluster.cp.admin().await?).await?;
    let journey = crate::karpenter_real::follow(&cluster, &[], t0).await?;
    let log = cluster.server.log();
    let granted = log
        .lines()
        .find(|l| l.contains("join granted") && l.contains(&journey.claim))
        .with_context(|| format!("{}: no grant for {}", oldest.label(), journey.claim))?;
    assert!(granted.contains("0.1.0"), "{}: {granted}", oldest.label());
    eprintln!(
        "{}'s agent: {} joined, Node {}",
        oldest.label(),
        journey.claim,
        journey.node
    );
    Ok(())
}

/// An agent refused by `--min-agent-version` (within the failure budget):
/// the Event, the server's log and the agent's own log say which agent to
/// bake.
async fn assert_below_minimum(
    world: &World,
    claim: &str,
    run: &Output,
    minimum: &str,
    who: &str,
) -> Result<()> {
    let flag = format!("--min-agent-version {minimum}");
    let bake = format!("bake autonode-agent {minimum} or later");
    let older = format!("older than this server's {flag}");
    let words = (&[flag.as_str(), &bake][..], &[older.as_str(), &bake][..]);
    assert_refused_and_replaced(world, (claim, run), words, "agent_below_minimum", who).await
}

/// `--min-agent-version` (issue 49, item 5) at the previous release: the
/// real agents of the revisions before it (which report 0.1.0) are refused
/// and their machines replaced, with the words that say what to bake; the
/// previous release's own agent and this tree's join as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn earlier_agents_below_the_minimum_are_refused_and_the_minimum_itself_joins() -> Result<()> {
    let revisions = skew::all()?;
    let previous = revisions.last().context("no previous release")?;
    let (major, minor, patch) = previous.agent_version()?;
    let minimum = format!("{major}.{minor}.{patch}");
    // Every refusal of one NodePool and class counts against one failure
    // budget: room for each revision's, so each is replaced.
    let extra_args = [
        format!("--min-agent-version={minimum}"),
        format!("--failure-budget={}", revisions.len() + 1),
    ];
    let world = World::start_setup(&Setup {
        extra_args: &extra_args,
        ..Setup::default()
    })
    .await?;
    let mut refused = 0;
    for revision in &revisions {
        let who = revision.label();
        let (claim, node) = machine(&world, |i| i).await?;
        let run = node.run_agent_binary(&revision.agent(), &[]).await?;
        if revision.agent_version()? < (major, minor, patch) {
            assert_below_minimum(&world, &claim, &run, &minimum, &who).await?;
            refused += 1;
        } else {
            assert_eq!(run.status.code(), Some(0), "{who}:\n{}", stderr(&run));
        }
    }
    assert!(refused > 0, "no revision is older than {minimum}");
    let (_, node) = machine(&world, |i| i).await?;
    let run = node.run_agent(&[]).await?;
    assert_eq!(run.status.code(), Some(0), "this agent:\n{}", stderr(&run));
    Ok(())
}

/// `--min-agent-version` at the release this tree is the pre-release of
/// (`AUTONODE_MIN_AGENT_VERSION`, as the chart's env would set it): this
/// tree's own agent (`X.Y.Z-dev`) comes before it and is refused, its
/// machine replaced, with the words that say what to bake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_agent_below_the_minimum_is_refused_and_its_machine_replaced() -> Result<()> {
    let ours = env!("CARGO_PKG_VERSION");
    let core = ours.split('-').next().unwrap_or(ours);
    // A release tree: the next patch is above it.
    let minimum = if core == ours {
        let (rest, patch) = core.rsplit_once('.').context("X.Y.Z")?;
        format!("{rest}.{}", patch.parse::<u64>()? + 1)
    } else {
        core.to_string()
    };
    let world = World::start_setup(&Setup {
        env: &[("AUTONODE_MIN_AGENT_VERSION", minimum.as_str())],
        ..Setup::default()
    })
    .await?;
    let (claim, node) = machine(&world, |i| i).await?;
    let run = node.run_agent(&[]).await?;
    assert_below_minimum(&world, &claim, &run, &minimum, "this agent").await
}

/// A server of the previous release for the rollout guard's world `world`,
/// with `flags`, leading once the one before it is gone.
async fn previous_guard(world: &World, flags: &[String]) -> Result<server::TestServer> {
    let binary = skew::previous_release()?.server();
    let setup = Setup {
        extra_args: flags,
        binary: Some(&binary),
        ..Setup::default()
    };
    let cloud = autonode_tests::server::world::cloud_settings(&world.cloud, &world.ec2);
    server::TestServer::launch(&world.cp, &cloud, &setup).await
}

/// Two machines of the rollout guard's `NEW_AMI` fail through `leader`,
/// which puts `OLD_AMI` back: the class then.
async fn new_ami_fails(
    world: &World,
    leader: &server::TestServer,
) -> Result<kube::api::DynamicObject> {
    use crate::rollout::{self as guard, ami, state, NEW_AMI, OLD_AMI};
    let joiner = autonode_tests::callers::joiner::Joiner::new(leader.url(), leader.ca_pem())?;
    for _ in 0..2 {
        let (_, instance) = guard::launch(world, NEW_AMI).await?;
        guard::fail_bootstrap(world, &joiner, &instance).await?;
    }
    guard::class_when(world, "put back", |c| {
        ami(c) == OLD_AMI && state(c)["refused"].is_object()
    })
    .await
}

/// Checks that the class is still as `reverted` left it (`OLD_AMI`, the
/// same refusal) after `who` led it.
async fn still_reverted(
    world: &World,
    reverted: &kube::api::DynamicObject,
    who: &str,
) -> Result<()> {
    use crate::rollout::{ami, state, OLD_AMI};
    let class = ec2nodeclasses(&world.cp.admin().await?).get(CLASS).await?;
    anyhow::ensure!(
        ami(&class) == OLD_AMI,
        "{who} applied the reverted AMI again: {}",
        ami(&class)
    );
    anyhow::ensure!(
        state(&class)["refused"] == state(reverted)["refused"],
        "{who} changed the refusal: {}",
        state(&class)
    );
    Ok(())
}

/// A downgrade to the previous release's server and an upgrade back keep
/// what the previous release's leader recorded meanwhile. This tree's
/// server proves `OLD_AMI` (the store records it good); the previous
/// release's server, which keeps the guard's state on the class alone,
/// tries `NEW_AMI`, whose machines fail, and puts `OLD_AMI` back; this
/// tree's server, its flags still on `NEW_AMI`, takes that refusal over
/// from the class's sealed copy into its store rather than apply the
/// reverted AMI again from its own, older record.
#[tokio::test]
async fn a_downgrade_and_upgrade_back_keep_what_the_previous_releases_leader_reverted() -> Result<()>
{
    use crate::rollout::{self as guard, ami, state, stored, NEW_AMI, OLD_AMI};
    let flags = guard::Flags::new()?;
    let (world, _) = guard::proven_world(&flags).await?;
    let before = stored(&world).await?;
    anyhow::ensure!(
        before["good"]["amiSelectorTerms"][0]["id"] == OLD_AMI,
        "the store did not record the proven AMI: {before}"
    );

    world.server.kill();
    let old = previous_guard(&world, &flags.next(NEW_AMI)).await?;
    guard::class_when(&world, "on the new AMI under the previous release", |c| {
        ami(c) == NEW_AMI && state(c)["trial"].is_object()
    })
    .await?;
    let reverted = new_ami_fails(&world, &old).await?;
    anyhow::ensure!(
        stored(&world).await? == before,
        "the previous release wrote the store: the test would prove nothing"
    );

    old.kill();
    let cloud = autonode_tests::server::world::cloud_settings(&world.cloud, &world.ec2);
    let new = server::TestServer::start(&world.cp, &cloud, &flags.next(NEW_AMI)).await?;
    guard::resyncs(&new, 3.0).await?;
    still_reverted(&world, &reverted, "the upgrade back").await?;
    let after = stored(&world).await?;
    anyhow::ensure!(
        after["refused"] == state(&reverted)["refused"]
            && after["applied"] == state(&reverted)["applied"],
        "the store did not take the refusal over: {after}"
    );
    anyhow::ensure!(!new.log().contains("RolloutStateRejected"), "{}", new.log());
    Ok(())
}

/// The previous release's rollout-guard state carried into this tree's
/// store, and this tree's read by the previous release after a downgrade:
/// the previous release's server proves `OLD_AMI` (its state on the class
/// alone); this tree's server, on `NEW_AMI`, carries that state into the
/// store (`OLD_AMI` good), tries `NEW_AMI` and reverts it when its machines
/// fail; the previous release's server, back with its flags on `NEW_AMI`,
/// reads the refusal from the class's copy and keeps `OLD_AMI`.
#[tokio::test]
async fn the_previous_releases_guard_state_is_carried_into_the_store_and_a_downgrade_reads_the_copy(
) -> Result<()> {
    use crate::rollout::{self as guard, ami, state, stored, NEW_AMI};
    let flags = guard::Flags::new()?;
    let previous = skew::previous_release()?.server();
    let (world, proven) = guard::proven_world_by(&flags, Some(&previous)).await?;
    anyhow::ensure!(
        stored(&world).await?.is_null(),
        "the previous release wrote a store"
    );

    world.server.kill();
    let cloud = autonode_tests::server::world::cloud_settings(&world.cloud, &world.ec2);
    let new = server::TestServer::start(&world.cp, &cloud, &flags.next(NEW_AMI)).await?;
    guard::class_when(&world, "on the new AMI", |c| ami(c) == NEW_AMI).await?;
    let carried = stored(&world).await?;
    anyhow::ensure!(
        carried["good"] == state(&proven)["good"],
        "the store did not carry the previous release's last good values: {carried}"
    );
    let reverted = new_ami_fails(&world, &new).await?;

    new.kill();
    let old = previous_guard(&world, &flags.next(NEW_AMI)).await?;
    // Its resync is a second: it has judged the class many times by then.
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;
    still_reverted(&world, &reverted, "the previous release").await?;
    let reasons =
        autonode_tests::kube::events::event_reasons(&world.cp.admin().await?, CLASS).await?;
    anyhow::ensure!(
        !reasons.iter().any(|r| r == "RolloutStateRejected"),
        "the previous release rejected this tree's copy: {reasons:?}\n{}",
        old.log()
    );
    Ok(())
}

/// The server container's image and flags as the Deployment in
/// `hosted-cp` has them.
async fn server_container(
    cp: &autonode_tests::kube::controlplane::ControlPlane,
) -> Result<(String, Vec<String>)> {
    let deployment =
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(cp.admin().await?, "hosted-cp")
            .get("autonode-server")
            .await?;
    let container = deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .context("no container")?;
    Ok((
        container.image.unwrap_or_default(),
        container.args.unwrap_or_default(),
    ))
}

/// `helm rollback` from this tree's chart to the previous release's: the
/// server's and the guest RBAC's releases installed from the previous
/// chart, upgraded to this one, and rolled back; the Deployment then runs
/// the previous release's image with exactly the flags its chart rendered
/// (none it would refuse, as this chart's new ones), and each release's
/// last revision is deployed.
#[tokio::test]
async fn helm_rollback_to_the_previous_releases_chart_renders_its_own_flags() -> Result<()> {
    use autonode_tests::server::helm;
    let cp = autonode_tests::kube::controlplane::ControlPlane::start().await?;
    let kubeconfig = cp.admin_kubeconfig().to_string_lossy().into_owned();
    let old_chart = skew::previous_release()?.chart();
    let new_chart = helm::chart_dir();
    let releases = HELM_RELEASES;
    let mut before = None;
    for (release, namespace, sets) in releases {
        let steps = [
            ("install", Some(&old_chart)),
            ("upgrade", Some(&new_chart)),
            ("rollback", None),
        ];
        for (verb, chart) in steps {
            let chart = chart.map(|c| c.to_string_lossy().into_owned());
            let mut args = vec![verb, release];
            match &chart {
                Some(chart) => args.extend([chart.as_str(), "--create-namespace"]),
                None => args.push("1"),
            }
            args.extend(["--namespace", namespace, "--kubeconfig", &kubeconfig]);
            if chart.is_some() {
                args.extend(sets.iter().copied());
            }
            helm::helm(&args).with_context(|| format!("helm {verb} {release}"))?;
            if release == "autonode-server" && verb == "install" {
                before = Some(server_container(&cp).await?);
            }
            if release == "autonode-server" && verb == "upgrade" {
                anyhow::ensure!(
                    before.as_ref() != Some(&server_container(&cp).await?),
                    "this chart renders what the previous one did: the rollback would prove nothing"
                );
            }
        }
        deployed_at(release, namespace, &kubeconfig, '3')?;
    }
    let (image, flags) = server_container(&cp).await?;
    let (old_image, old_flags) = before.context("no server install")?;
    let version = skew::previous_release()?.label();
    anyhow::ensure!(
        image == old_image && flags == old_flags,
        "rolled back to {version}'s chart, the Deployment runs {image} with {flags:?}, \
         not {old_image} with {old_flags:?}"
    );
    Ok(())
}

/// The previous release's own guest RBAC (the files its
/// `packaging/guest/kustomization.yaml` lists, as its tree has them: no
/// Role for the rollout store, the admission policy of its day where the
/// API server serves it) under this tree's server with its default flags,
/// as after an image upgrade whose guest RBAC was left behind. Machines
/// join (this tree's agent and the release's packaged one), a machine
/// refused for good has its NodeClaim deleted, the upkeep keeps the class
/// and the rollout guard promotes with its state on the class; what the
/// server may not do (the store) is said once in its log and by an Event
/// naming the Role to apply, and no other request of it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_server_runs_under_the_previous_releases_own_guest_rbac() -> Result<()> {
    use crate::rollout::{self as guard, ami, state, OLD_AMI};
    let revisions = skew::all()?;
    let previous = revisions.last().context("no previous release")?;
    let serves_policy =
        server::serves_nodeclass_admission(autonode_tests::kube::version::under_test()?);
    let mut docs = Vec::new();
    for (name, text) in previous.guest_rbac()? {
        if name == server::NODECLASS_ADMISSION_FILE && !serves_policy {
            continue;
        }
        docs.push(text);
    }
    let manifest = docs.join("\n---\n");
    anyhow::ensure!(
        !manifest.contains("autonode-server-rollout-store"),
        "{}'s guest RBAC has the store's Role: the test would prove nothing",
        previous.label()
    );
    let flags = guard::Flags::new()?;
    let args = flags.with_ami(OLD_AMI);
    let world = World::start_setup(&Setup {
        extra_args: &args,
        rbac_manifest: Some(&manifest),
        ..Setup::default()
    })
    .await?;
    let admin = world.cp.admin().await?;
    if serves_policy {
        server::set_nodeclass_admission_settings(&admin, &args).await?;
    }
    // A class as its creator writes it before autonode keeps it (a create
    // bringing userData is the policy's to refuse).
    let spec = standin::custom_spec(serde_json::json!({}));
    standin::create_nodeclass(&admin, CLASS, serde_json::json!({}), spec).await?;
    guard::class_when(&world, "kept, its state on the class", |c| {
        ami(c) == OLD_AMI && state(c)["trial"].is_object()
    })
    .await?;
    let told = guard::class_events(&world, "RolloutStoreUnavailable").await?;
    anyhow::ensure!(
        told.iter()
            .any(|m| m.contains("autonode-server-rollout-store")),
        "the Event does not name the Role: {told:?}"
    );

    let (claim, _) = guard::launch(&world, OLD_AMI).await?;
    guard::mark_ready(&world, &claim).await?;
    guard::class_when(&world, "promoted", |c| {
        state(c)["good"] == state(c)["applied"] && state(c)["trial"].is_null()
    })
    .await?;

    ordinary_life(&world, &agent_binary()?, "this agent").await?;
    ordinary_life(&world, &previous.agent(), &previous.label()).await?;
    // NodeClaim deletion: the oldest agent on a multi-address instance is
    // refused for good and its machine replaced.
    let oldest = revisions.first().context("no revision")?;
    let (claim, node) = machine(&world, multi_address).await?;
    let run = node.run_agent_binary(&oldest.agent(), &[]).await?;
    assert_too_old(&world, &claim, &run, &oldest.label()).await?;

    let log = world.server.log();
    let store = "may not use ConfigMap autonode-rollout";
    let warned = log.matches(store).count();
    anyhow::ensure!(
        warned == 1,
        "the store's refusal said {warned} times:\n{log}"
    );
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| {
            // The API server's 403: "… is forbidden: User … cannot …".
            l.to_ascii_lowercase().contains("forbidden") && !l.contains("autonode-rollout")
        })
        .collect();
    anyhow::ensure!(
        refused.is_empty(),
        "refused more than the store under {}'s guest RBAC:\n{}",
        previous.label(),
        refused.join("\n")
    );
    Ok(())
}

/// `tests/setup/build-releases` holds each release's packages to its
/// record: with a copy of the records in which one `.deb` hash of each is
/// changed by a digit, it fails loudly, naming both hashes, instead of
/// handing the skew tests another agent than the release's; with the
/// records as they are, it answers with the same (cached) packages.
#[test]
fn release_packages_that_are_not_the_recorded_bytes_fail_the_setup() -> Result<()> {
    let released = skew::all()?
        .into_iter()
        .filter(Revision::is_release)
        .count();
    anyhow::ensure!(released > 0, "no release in tests/skew/revisions");
    let root = autonode_tests::harness::bench::repo_root();
    let records = tempfile::tempdir()?;
    for entry in std::fs::read_dir(root.join("packaging/releases"))? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)?;
        let line = text
            .lines()
            .find(|l| l.contains(".deb\" = \""))
            .with_context(|| format!("{} lists no .deb hash", path.display()))?;
        let (name, hash) = line.split_once(" = \"").context("name = \"hash\"")?;
        let flipped = if hash.starts_with('0') { "1" } else { "0" };
        let forged = format!("{name} = \"{flipped}{}", &hash[1..]);
        let file = records.path().join(path.file_name().context("a name")?);
        std::fs::write(file, text.replace(line, &forged))?;
    }
    let script = root.join("tests/setup/build-releases");
    let run = std::process::Command::new(&script)
        .env("AUTONODE_RELEASE_RECORDS", records.path())
        .output()?;
    let said = String::from_utf8_lossy(&run.stderr);
    anyhow::ensure!(
        !run.status.success() && said.contains("are not the ones") && said.contains("< "),
        "a build other than the record was not refused:\n{said}"
    );
    let again = std::process::Command::new(&script).output()?;
    anyhow::ensure!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    Ok(())
}
