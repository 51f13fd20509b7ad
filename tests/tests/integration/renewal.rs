//! After the join: kubelet's own CSRs (client renewals, serving
//! certificates) are approved only when they are the node's own.

use crate::feedback::wait_deleted;
use anyhow::{Context, Result};
use autonode_server::controllers::approver::LOOKUP_BURST;
use autonode_shared::protocol::JoinResponse;
use autonode_tests::callers::joiner::CsrShape;
use autonode_tests::cloud::fakecloud::Instance;
use autonode_tests::harness::pki::Ca;
use autonode_tests::harness::poll;
use autonode_tests::server::world::World;
use autonode_tests::server::Setup;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::wait::await_condition;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

pub(crate) const CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub(crate) const SERVING: &str = "kubernetes.io/kubelet-serving";

#[tokio::test]
async fn only_a_nodes_own_renewals_are_approved() -> Result<()> {
    let world = World::start().await?;
    let x = Joined::new(&world, |i| i).await?;
    register(&x.client, &x.name, &x.provider_id()).await?;
    let csrs: Api<CertificateSigningRequest> = Api::all(x.client.clone());
    let (name, instance) = (&x.name, &x.instance);

    // Made by this node, for another node's name: refused by the API
    // server at create (NodeRestriction, 1.31 on), or else left pending by
    // autonode (checked below).
    let other = "ip-10-1-1-1.us-west-2.compute.internal";
    let foreign_client = foreign_renewal(&world, &csrs, other).await?;
    // Serving, with an address the instance does not have.
    let mut foreign_ip = CsrShape::serving(instance);
    foreign_ip
        .ips
        .push(IpAddr::V4(Ipv4Addr::new(10, 250, 0, 9)));
    let foreign_serving = serving(&csrs, "serving-foreign", &foreign_ip).await?;

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
    let own = renewal(&csrs, "renew-own", name).await?;
    let own_serving = serving(&csrs, "serving-own", &CsrShape::serving(instance)).await?;
    let admin: Api<CertificateSigningRequest> = Api::all(world.cp.admin().await?);
    for csr in [&own, &own_serving] {
        issued(&admin, csr)
            .await
            .with_context(|| format!("{csr} was not approved and signed"))?;
    }

    // The others were judged and left pending.
    let judged = [
        Some(&foreign_serving),
        Some(&wrong_usages),
        foreign_client.as_ref(),
    ];
    for csr in judged.into_iter().flatten() {
        left_pending(&world, csr).await?;
        assert!(undecided(&admin, csr).await?, "{csr} was decided");
    }
    Ok(())
}

/// The attacker may delete and create CSRs (a cleanup job's grant, say)
/// but not approve them. A node asks for a serving certificate the
/// approver will approve; while the approver is judging it (its EC2 lookup
/// is slow here), the attacker deletes it and creates, under the same name,
/// one for an address the instance does not have. An approval written by
/// name lands on the new object: the old approver approved it. Approval is
/// by the judged object's UID, so it lands on nothing, and the new object
/// is judged on its own and left pending.
#[tokio::test]
async fn a_csr_replaced_while_it_is_judged_is_not_approved() -> Result<()> {
    let world = World::start().await?;
    let x = Joined::new(&world, |i| i).await?;
    register(&x.client, &x.name, &x.provider_id()).await?;
    let csrs: Api<CertificateSigningRequest> = Api::all(x.client.clone());
    let admin: Api<CertificateSigningRequest> = Api::all(world.cp.admin().await?);

    world.ec2.faults().set_delay(Duration::from_secs(4));
    let before = world.ec2.faults().arrived();
    let name = format!(
        "serving-swap-{}",
        autonode_tests::kube::controlplane::unique()
    );
    let own = CsrShape::serving(&x.instance);
    submit_named(&csrs, &name, SERVING, "server auth", &own).await?;
    // The approver has started judging once its EC2 lookup is under way.
    poll::until(
        "lookup of the instance by the approver",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async { Ok((world.ec2.faults().arrived() != before).then_some(())) },
    )
    .await?;
    admin.delete(&name, &DeleteParams::default()).await?;
    let mut foreign = CsrShape::serving(&x.instance);
    foreign.ips.push(IpAddr::V4(Ipv4Addr::new(10, 250, 0, 9)));
    submit_named(&csrs, &name, SERVING, "server auth", &foreign).await?;
    world.ec2.faults().set_delay(Duration::ZERO);

    assert!(
        !approved_within(&admin, &name, Duration::from_secs(10)).await?,
        "the replacement CSR {name} was approved on the judgement of the one it replaced"
    );
    left_pending(&world, &name).await?;
    Ok(())
}

/// The attacker holds node X's credential: the client certificate of X's
/// kubelet, taken from a compromised X, valid for months after X is gone.
/// NodeRestriction and the Node authorizer (1.20 and 1.37 alike) let a node
/// create only the Node object of its own name, not delete it, and do not
/// look at `spec.providerID` on create. So once X's machine is terminated and its
/// Node and NodeClaim deleted (Karpenter's part, played here by the
/// admin), the attacker, as X, creates Node X again pointing at instance Y,
/// a live node that joined through autonode, and asks for what the approver
/// judges by that providerID: a serving certificate under X's name for Y's
/// DNS name and address (to answer the API server's calls to Y's kubelet)
/// and a client renewal (to keep X's credential alive for good). The old
/// approver approved both: it only asked that some NodeClaim had the
/// providerID, and judged serving SANs against Y's EC2 facts.
#[tokio::test]
async fn a_node_pointing_at_another_instance_is_left_pending() -> Result<()> {
    let world = World::start().await?;
    let x = Joined::new(&world, |i| i).await?;
    let y = Joined::new(&world, |i| i).await?;
    // kubelet on X registers as it should...
    register(&x.client, &x.name, &x.provider_id()).await?;
    // ...X's machine goes away, and its Node and NodeClaim with it...
    let admin = world.cp.admin().await?;
    x.goes_away(&world, &admin).await?;
    // ...and the attacker, as X, creates Node X again with Y's providerID.
    register(&x.client, &x.name, &y.provider_id())
        .await
        .context("node X re-creating its Node with Y's providerID")?;
    // Let the approver's watches catch up, so that what it judges is the
    // attacker's Node (it leaves the CSRs pending either way; this is for
    // the reason asserted below).
    tokio::time::sleep(Duration::from_secs(2)).await;

    let csrs: Api<CertificateSigningRequest> = Api::all(x.client.clone());
    let as_y = CsrShape {
        common_name: format!("system:node:{}", x.name),
        organisation: Some("system:nodes"),
        dns: vec![y.instance.private_dns_name.clone()],
        ips: vec![IpAddr::V4(y.instance.private_ip)],
    };
    let as_y = serving(&csrs, "serving-as-y", &as_y).await?;
    let via_y = renewal(&csrs, "renew-via-y", &x.name).await?;
    let admin: Api<CertificateSigningRequest> = Api::all(world.cp.admin().await?);
    for csr in [&as_y, &via_y] {
        let line = left_pending(&world, csr).await?;
        assert!(line.contains("not_its_node"), "{line}");
        assert!(undecided(&admin, csr).await?, "{csr} was decided");
    }
    Ok(())
}

/// In a Local Zone the providerID's zone (`us-west-2-lax-1a`) does not end
/// in the region plus a letter. The old approver trimmed trailing letters
/// off the zone to get a region (`us-west-2-lax-1`), so its EC2 lookup for
/// the serving CSR failed (the fake EC2 refuses a request signed for another
/// region, as AWS does) and the CSR stayed pending. The region now comes
/// from the binding the join recorded.
#[tokio::test]
async fn a_local_zone_nodes_serving_certificate_is_approved() -> Result<()> {
    let world = World::start().await?;
    let x = Joined::new(&world, |mut i| {
        i.availability_zone = "us-west-2-lax-1a".into();
        i
    })
    .await?;
    register(&x.client, &x.name, &x.provider_id()).await?;
    own_csrs_are_issued(&world, &x, "lax").await
}

/// A node that makes CSRs one after another, each as soon as the last was
/// approved. The old approver counted only undecided CSRs toward the cap,
/// so it approved every one, and asked EC2 for every serving CSR. Now the
/// cap counts recent approvals, and EC2 answers are cached and paced. The
/// node's CSRs are found by an index, not a scan of every CSR, and its
/// being over the cap is logged as a warning once, not once per CSR and
/// look.
#[tokio::test]
async fn csrs_in_a_loop_get_at_most_the_cap_and_bounded_ec2_calls() -> Result<()> {
    const CAP: usize = 4;
    const CSRS: usize = 12;
    let world = World::start_with(&[format!("--pending-csr-cap={CAP}")]).await?;
    let x = Joined::new(&world, |i| i).await?;
    register(&x.client, &x.name, &x.provider_id()).await?;
    let csrs: Api<CertificateSigningRequest> = Api::all(x.client.clone());
    let admin: Api<CertificateSigningRequest> = Api::all(world.cp.admin().await?);
    let calls_before = world.ec2.calls();

    let mut names = Vec::new();
    let mut waiting = true;
    for i in 0..CSRS {
        let name = if i % 2 == 0 {
            serving(&csrs, "loop-serving", &CsrShape::serving(&x.instance)).await?
        } else {
            renewal(&csrs, "loop-client", &x.name).await?
        };
        // Wait for each approval while they come; once one does not, the
        // rest are made at once.
        if waiting {
            waiting = approved_within(&admin, &name, Duration::from_secs(10)).await?;
        }
        names.push(name);
    }
    let mut approved = 0;
    for name in &names {
        if approved_within(&admin, name, Duration::ZERO).await? {
            approved += 1;
        } else {
            left_pending(&world, name).await?;
        }
    }
    // Judged again, the pending ones stay pending.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut approved_now = 0;
    for name in &names {
        approved_now += usize::from(!undecided(&admin, name).await?);
    }
    assert_eq!(approved, CAP, "approved out of {CSRS}");
    assert_eq!(approved_now, CAP);
    let calls = world.ec2.calls() - calls_before;
    assert!(
        calls <= u64::from(LOOKUP_BURST),
        "{calls} EC2 calls for {CSRS} CSRs"
    );
    // The node's being over its cap is one warning, not one per CSR and
    // look (each CSR's line is at debug).
    let warned = world.server.warn_lines("too_many_csrs");
    assert_eq!(warned, 1, "warnings that the node is over its cap");
    Ok(())
}

/// EC2 gives a terminated machine's private address, and with it its
/// IP-based name, to a machine launched later in the subnet. The attacker
/// kept node X's kubelet credential; X is terminated (its Node and
/// NodeClaim deleted, Karpenter's part) and Y gets X's address, so EC2
/// names it as X was named: Y joins and its kubelet registers the Node of
/// that name. Nothing in a CSR says which machine's certificate made it, so
/// the old approver approved, for X's credential, a client renewal (a fresh
/// key, good for the signer's year) and a serving certificate for Y's name
/// and address. Now the name is remembered as X's until every certificate
/// X could hold has expired: the join marks Y's NodeClaim with it (read
/// here after a restart has emptied the server's memory), both CSRs are
/// left pending as `name_reused`, and Y's join certificates last the
/// signer's full lifetime, so Y's kubelet works on until the window has
/// passed. X's own join certificates had the bounded join lifetime.
#[tokio::test]
async fn a_dead_nodes_credential_gets_nothing_for_the_next_machine_with_its_name() -> Result<()> {
    let [signing, join] = REUSE_LIFETIMES;
    let world = reuse_world().await?;
    let (x, x_answer) = Joined::with_answer(&world, |i| i).await?;
    register(&x.client, &x.name, &x.provider_id()).await?;
    // kube-controller-manager backdates notBefore by 5 minutes.
    let backdated = Duration::from_secs(5 * 60);
    let bounded = lifetime(&x_answer.client_certificate)?;
    assert_eq!(bounded, join + backdated, "X's join certificate");

    let admin = world.cp.admin().await?;
    x.goes_away(&world, &admin).await?;

    let (y, y_answer) = Joined::with_answer(&world, named_as(&x)).await?;
    assert_eq!(y.name, x.name, "EC2 gave Y X's name");
    for certificate in [&y_answer.client_certificate, &y_answer.serving_certificate] {
        let full = lifetime(certificate)?;
        assert!(
            full >= signing,
            "Y's join certificate lasts {full:?}: it would expire inside the window"
        );
    }
    register(&y.client, &y.name, &y.provider_id()).await?;
    // Forget what this server saw of X: only the mark on Y's NodeClaim is left.
    world.server.restart().await?;
    dead_credential_gets_nothing(&world, &x, &y).await?;

    // A machine whose name no one held before renews as always.
    let z = Joined::new(&world, |i| i).await?;
    register(&z.client, &z.name, &z.provider_id()).await?;
    own_csrs_are_issued(&world, &z, "fresh-name").await
}

/// The signer's lifetime and the join's, in the name-reuse tests: the
/// harness's signer signs for at most a day (its CA's own validity).
const REUSE_LIFETIMES: [Duration; 2] = [Duration::from_secs(24 * 3600), Duration::from_secs(3600)];

/// A world whose server knows [`REUSE_LIFETIMES`].
async fn reuse_world() -> Result<World> {
    let [signing, join] = REUSE_LIFETIMES;
    World::start_with(&[
        format!("--signing-duration={}", signing.as_secs()),
        format!("--join-certificate-lifetime={}", join.as_secs()),
    ])
    .await
}

/// `instance` with `x`'s address and name, as EC2 gives them again.
fn named_as(x: &Joined) -> impl FnOnce(Instance) -> Instance + '_ {
    |i| Instance {
        private_ip: x.instance.private_ip,
        private_dns_name: x.instance.private_dns_name.clone(),
        local_hostname: x.instance.local_hostname.clone(),
        ..i
    }
}

/// X's kubelet credential, its machine gone, asks for a client renewal and
/// a serving certificate for Y's name and address: both are left pending
/// as `name_reused`, with a `NodeNameReused` Event.
async fn dead_credential_gets_nothing(world: &World, x: &Joined, y: &Joined) -> Result<()> {
    let as_x: Api<CertificateSigningRequest> = Api::all(x.client.clone());
    let renewed = renewal(&as_x, "renew-dead", &x.name).await?;
    let served = serving(&as_x, "serving-dead", &CsrShape::serving(&y.instance)).await?;
    let csrs: Api<CertificateSigningRequest> = Api::all(world.cp.admin().await?);
    for csr in [&renewed, &served] {
        let line = left_pending_within(world, csr, Duration::from_secs(30)).await?;
        assert!(line.contains("name_reused"), "{line}");
        assert!(undecided(&csrs, csr).await?, "{csr} was decided");
        // Said where `kubectl describe csr` shows it, not only in a log.
        world.event_reasons(csr, "NodeNameReused").await?;
    }
    Ok(())
}

/// Item 2 of issue 35. The join's `autonode.dev/name-last-held` mark is the
/// earlier holder's deletion time, which anyone who may read NodeClaims
/// reads. A NodePool author puts that very value in the template: Karpenter
/// copies it onto Y's NodeClaim, the join writes the same value (a merge
/// patch that changes nothing takes no ownership), and Karpenter stays its
/// co-owner. Before marks were sealed, a mark counted only with autonode
/// its only manager: after a restart the mark was dropped, and the dead
/// node's credential was renewed and given a serving certificate for Y.
/// Now the mark's seal (a MAC only the replicas can make, over Y's
/// NodeClaim's UID and the value) counts, whoever else manages the value.
#[tokio::test]
async fn a_name_reuse_mark_copied_from_a_nodepool_does_not_erase_the_window() -> Result<()> {
    let world = reuse_world().await?;
    let (x, y) = dead_x_and_ys_copied_mark(&world).await?;
    // Forget what this server saw of X: only the marks on Y's NodeClaim are left.
    world.server.restart().await?;
    dead_credential_gets_nothing(&world, &x, &y).await
}

/// X joined, registered and gone; Y given X's name, its NodeClaim carrying
/// the `name-last-held` value autonode writes, copied from a NodePool's
/// template beforehand; Y registered.
async fn dead_x_and_ys_copied_mark(world: &World) -> Result<(Joined, Joined)> {
    let x = Joined::new(world, |i| i).await?;
    register(&x.client, &x.name, &x.provider_id()).await?;
    let admin = world.cp.admin().await?;
    let deleted = x.goes_away_held(world, &admin).await?;

    let template = serde_json::json!({ "autonode.dev/name-last-held": deleted });
    let y = Joined::annotated(world, template, named_as(&x)).await?;
    assert_eq!(y.name, x.name, "EC2 gave Y X's name");
    let marks = autonode_tests::karpenter::standin::annotations(&admin, &y.claim).await?;
    let mark = marks.get("autonode.dev/name-last-held").map(String::as_str);
    assert_eq!(
        mark,
        Some(deleted.as_str()),
        "the attacker predicted the mark"
    );
    register(&y.client, &y.name, &y.provider_id()).await?;
    Ok((x, y))
}

/// Item 3 of issue 48. The sealing key was derived from the TLS key, and
/// cert-manager makes a new TLS key at every renewal by default: after the
/// next restart no seal opened, the NodePool author's copy of the mark
/// (the test above) was dropped again, and the dead node's credential was
/// renewed and given a serving certificate for Y. Deployed as the chart
/// and the Kustomize base now deploy it (AUTONODE_SEAL_KEY_FILE, a Secret
/// of its own), a new TLS key changes nothing sealed.
#[tokio::test]
async fn a_name_reuse_mark_outlives_a_new_tls_key() -> Result<()> {
    let [signing, join] = REUSE_LIFETIMES;
    let dir = tempfile::tempdir()?;
    let seal_key = dir.path().join("seal.key");
    std::fs::write(&seal_key, rand::random::<[u8; 32]>())?;
    let seal_key = seal_key.to_string_lossy().into_owned();
    let ca = Ca::new("autonode-join-ca")?;
    let flags = [
        format!("--signing-duration={}", signing.as_secs()),
        format!("--join-certificate-lifetime={}", join.as_secs()),
    ];
    let world = World::start_setup(&Setup {
        extra_args: &flags,
        join_ca: Some(&ca),
        env: &[("AUTONODE_SEAL_KEY_FILE", &seal_key)],
        ..Setup::default()
    })
    .await?;
    let (x, y) = dead_x_and_ys_copied_mark(&world).await?;
    // cert-manager renews the serving certificate with a new key; the
    // replica restarts (a rollout, a node drain) and has forgotten X.
    world.server.rotate_tls_key(&ca)?;
    world.server.restart().await?;
    dead_credential_gets_nothing(&world, &x, &y).await
}

/// Item 3 of issue 35. The replica that watched X's NodeClaim go used to
/// remember it among the last 1,024 NodeClaims deleted, of any kind: 1,100
/// NodeClaims created and deleted since (anyone whose pods Karpenter scales
/// for can cause that) and Y's join wrote no mark, its certificates were
/// the bounded join ones, and X's credential was renewed and given a
/// serving certificate for Y. Now a bound NodeClaim's IP-based name is
/// remembered for the signer's lifetime, and NodeClaims that never bound
/// take no room.
#[tokio::test]
async fn a_dead_nodes_name_is_remembered_through_a_churn_of_nodeclaims() -> Result<()> {
    const CHURN: usize = 1100;
    let world = reuse_world().await?;
    let x = Joined::new(&world, |i| i).await?;
    register(&x.client, &x.name, &x.provider_id()).await?;
    let admin = world.cp.admin().await?;
    x.goes_away(&world, &admin).await?;
    churn(&admin, CHURN).await?;

    let (y, y_answer) = Joined::with_answer(&world, named_as(&x)).await?;
    assert_eq!(y.name, x.name, "EC2 gave Y X's name");
    let full = lifetime(&y_answer.client_certificate)?;
    assert!(
        full >= REUSE_LIFETIMES[0],
        "Y's join certificate lasts {full:?}: X's name was forgotten"
    );
    register(&y.client, &y.name, &y.provider_id()).await?;
    dead_credential_gets_nothing(&world, &x, &y).await
}

/// `count` NodeClaims created and deleted (no finalizer, no instance), as
/// a busy or hostile cluster's pods make Karpenter do.
async fn churn(admin: &kube::Client, count: usize) -> Result<()> {
    use futures::{StreamExt, TryStreamExt};
    let claims = autonode_tests::karpenter::standin::nodeclaims(admin);
    let started = std::time::Instant::now();
    futures::stream::iter(0..count)
        .map(|n| {
            let claims = claims.clone();
            async move {
                let name = format!("churn-{n}");
                autonode_tests::karpenter::standin::create_nodeclaim(admin, &name, "default")
                    .await?;
                claims.delete(&name, &DeleteParams::default()).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<()>()
        .await?;
    eprintln!("churned {count} NodeClaims in {:?}", started.elapsed());
    Ok(())
}

/// EC2's resource-based hostnames (`i-0123456789abcdef0.<region>.compute.internal`,
/// the subnet's `private-dns-hostname-type-on-launch: resource-name`) are
/// never given to another instance: docs/operations.md recommends them. A
/// machine named so joins, and its kubelet's renewal and serving
/// certificate are approved.
#[tokio::test]
async fn a_machine_named_after_its_instance_joins_and_renews() -> Result<()> {
    let world = World::start().await?;
    let x = Joined::new(&world, |i| {
        let name = format!("{}.us-west-2.compute.internal", i.instance_id);
        Instance {
            private_dns_name: name.clone(),
            local_hostname: name,
            ..i
        }
    })
    .await?;
    assert!(x.name.starts_with("i-"), "{}", x.name);
    register(&x.client, &x.name, &x.provider_id()).await?;
    own_csrs_are_issued(&world, &x, "resource-name").await
}

/// Under the VPC CNI a node's interfaces carry pods' addresses: secondary
/// addresses of its primary interface and of further interfaces. A serving
/// certificate naming one would let the node answer as whatever has that
/// address later. The old approver allowed every private address of every
/// interface; now only the primary IPv4 (and primary IPv6) count.
#[tokio::test]
async fn a_serving_certificate_for_a_secondary_address_stays_pending() -> Result<()> {
    let world = World::start().await?;
    let secondary = [
        Ipv4Addr::new(10, 251, 0, 7),
        Ipv4Addr::new(10, 251, 1, 8),
        Ipv4Addr::new(10, 251, 1, 9),
    ];
    let x = Joined::new(&world, |i| Instance {
        secondary_ips: secondary[..1].to_vec(),
        second_interface_ips: secondary[1..].to_vec(),
        ..i
    })
    .await?;
    register(&x.client, &x.name, &x.provider_id()).await?;
    let csrs: Api<CertificateSigningRequest> = Api::all(x.client.clone());
    let admin: Api<CertificateSigningRequest> = Api::all(world.cp.admin().await?);
    // On the primary interface, and the second interface's primary one.
    for ip in &secondary[..2] {
        let mut shape = CsrShape::serving(&x.instance);
        shape.ips.push(IpAddr::V4(*ip));
        let csr = serving(&csrs, "serving-secondary", &shape).await?;
        let line = left_pending(&world, &csr).await?;
        assert!(line.contains("serving"), "{line}");
        assert!(undecided(&admin, &csr).await?, "{csr} for {ip} was decided");
    }
    let own = serving(&csrs, "serving-primary", &CsrShape::serving(&x.instance)).await?;
    issued(&admin, &own)
        .await
        .with_context(|| format!("{own} was not approved and signed"))?;
    Ok(())
}

/// `x`'s kubelet asks for a serving certificate and a client renewal of
/// its own (names starting with `prefix`): both are approved and signed.
async fn own_csrs_are_issued(world: &World, x: &Joined, prefix: &str) -> Result<()> {
    let csrs: Api<CertificateSigningRequest> = Api::all(x.client.clone());
    let serving_prefix = format!("serving-{prefix}");
    let own = [
        serving(&csrs, &serving_prefix, &CsrShape::serving(&x.instance)).await?,
        renewal(&csrs, &format!("renew-{prefix}"), &x.name).await?,
    ];
    let admin: Api<CertificateSigningRequest> = Api::all(world.cp.admin().await?);
    for csr in &own {
        issued(&admin, csr)
            .await
            .with_context(|| format!("{csr} was not approved and signed"))?;
    }
    Ok(())
}

/// How long the PEM certificate `pem` is valid, from its notBefore.
fn lifetime(pem: &str) -> Result<Duration> {
    let (_, parsed) = x509_parser::pem::parse_x509_pem(pem.as_bytes())?;
    let cert = parsed.parse_x509()?;
    let validity = cert.validity();
    let seconds = validity.not_after.timestamp() - validity.not_before.timestamp();
    Ok(Duration::from_secs(u64::try_from(seconds)?))
}

/// A node that joined through autonode, with its kubelet's credential.
struct Joined {
    claim: String,
    instance: Instance,
    name: String,
    client: kube::Client,
}

impl Joined {
    async fn new(world: &World, customise: impl FnOnce(Instance) -> Instance) -> Result<Self> {
        Ok(Self::with_answer(world, customise).await?.0)
    }

    /// The node, and the join's answer (its certificates).
    async fn with_answer(
        world: &World,
        customise: impl FnOnce(Instance) -> Instance,
    ) -> Result<(Self, JoinResponse)> {
        let joined = world.join_new(customise).await?;
        let node = Self {
            claim: joined.claim,
            instance: joined.instance,
            name: joined.response.node_name.clone(),
            client: joined.client,
        };
        Ok((node, joined.response))
    }

    fn provider_id(&self) -> String {
        self.instance.provider_id()
    }

    /// Like [`Joined::new`], its NodeClaim carrying `annotations` as
    /// Karpenter copies them from a NodePool's template.
    async fn annotated(
        world: &World,
        annotations: serde_json::Value,
        customise: impl FnOnce(Instance) -> Instance,
    ) -> Result<Self> {
        let (claim, instance) = world.launch_annotated(annotations, customise).await?;
        let keys = autonode_tests::callers::joiner::NodeKeys::generate()?;
        let request =
            autonode_tests::callers::joiner::honest_request(&instance, world.cloud.ca(), &keys)?;
        let response = world.joiner.join(&request).await?.granted();
        Ok(Self {
            claim,
            client: world.node_client(&response, &keys).await?,
            name: response.node_name,
            instance,
        })
    }

    /// Like [`Joined::goes_away`], its NodeClaim held by a finalizer
    /// (Karpenter's termination) while deleted, so it carries a
    /// `deletionTimestamp`; returns it, as anyone who may read NodeClaims
    /// sees it.
    async fn goes_away_held(&self, world: &World, admin: &kube::Client) -> Result<String> {
        use kube::api::{Patch, PatchParams};
        let claims = autonode_tests::karpenter::standin::nodeclaims(admin);
        let finalizers = |f: serde_json::Value| serde_json::json!({"metadata": {"finalizers": f}});
        let params = PatchParams::default();
        let hold = finalizers(serde_json::json!(["karpenter.sh/termination"]));
        claims
            .patch(&self.claim, &params, &Patch::Merge(&hold))
            .await?;
        self.goes_away(world, admin).await?;
        let deleting = claims.get(&self.claim).await?;
        let deleted = deleting
            .metadata
            .deletion_timestamp
            .context("no deletionTimestamp")?;
        let deleted = serde_json::to_value(&deleted)?;
        let deleted = deleted.as_str().context("a timestamp")?.to_string();
        let release = finalizers(serde_json::Value::Null);
        claims
            .patch(&self.claim, &params, &Patch::Merge(&release))
            .await?;
        wait_deleted(&claims, &self.claim).await?;
        Ok(deleted)
    }

    /// The machine is terminated, and its Node and NodeClaim deleted
    /// (Karpenter's part, played by `admin`).
    async fn goes_away(&self, world: &World, admin: &kube::Client) -> Result<()> {
        world.cloud.terminate(&self.instance.instance_id);
        Api::<Node>::all(admin.clone())
            .delete(&self.name, &DeleteParams::default())
            .await?;
        autonode_tests::karpenter::standin::nodeclaims(admin)
            .delete(&self.claim, &DeleteParams::default())
            .await?;
        wait_deleted(&Api::<Node>::all(admin.clone()), &self.name).await
    }
}

/// A client renewal this node makes for `other`'s name. Since 1.31
/// NodeRestriction refuses it at create (403: a node may only ask for its
/// own client certificate): `None`. Before, the API server takes it and
/// autonode must leave it pending: its name.
async fn foreign_renewal(
    world: &World,
    csrs: &Api<CertificateSigningRequest>,
    other: &str,
) -> Result<Option<String>> {
    let version = world.cp.version();
    let outcome = renewal(csrs, "renew-foreign", other).await;
    if version.at_least(1, 31) {
        let err = outcome
            .err()
            .context("a node's CSR for another node's name was created on 1.31 or later")?;
        let refused = matches!(
            err.downcast_ref::<kube::Error>(),
            Some(kube::Error::Api(status)) if status.code == 403
        );
        assert!(refused, "not a 403 from NodeRestriction: {err:#}");
        eprintln!(
            "foreign renewal: refused at create by the API server ({version}, NodeRestriction)"
        );
        Ok(None)
    } else {
        let name = outcome.context("a node's CSR for another node's name")?;
        eprintln!("foreign renewal: created ({version}); autonode must leave {name} pending");
        Ok(Some(name))
    }
}

/// The server's log line saying `csr` was left pending, once there is one.
async fn left_pending(world: &World, csr: &str) -> Result<String> {
    left_pending_within(world, csr, Duration::from_secs(10)).await
}

/// Like [`left_pending`], waiting up to `timeout` (a restarted server
/// lists and leads first).
async fn left_pending_within(world: &World, csr: &str, timeout: Duration) -> Result<String> {
    let what = format!("{csr} left pending");
    poll::until(&what, timeout, Duration::from_millis(100), || async {
        Ok(world
            .server
            .log()
            .lines()
            .find(|l| l.contains(csr) && l.contains("left pending"))
            .map(str::to_string))
    })
    .await
}

/// Whether `name` has no condition and no certificate.
async fn undecided(api: &Api<CertificateSigningRequest>, name: &str) -> Result<bool> {
    let status = api.get(name).await?.status.unwrap_or_default();
    Ok(status.conditions.unwrap_or_default().is_empty() && status.certificate.is_none())
}

/// Whether `name` is approved within `timeout` (looked at least once).
async fn approved_within(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    timeout: Duration,
) -> Result<bool> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let csr = api.get(name).await?;
        let approved = csr
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Approved"));
        if approved || tokio::time::Instant::now() >= deadline {
            return Ok(approved);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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

/// Submits a client renewal for `node` as kubelet would; returns its name.
async fn renewal(api: &Api<CertificateSigningRequest>, prefix: &str, node: &str) -> Result<String> {
    submit(api, prefix, CLIENT, "client auth", &CsrShape::client(node)).await
}

/// Submits a serving CSR of `shape` as kubelet would; returns its name.
async fn serving(
    api: &Api<CertificateSigningRequest>,
    prefix: &str,
    shape: &CsrShape<'_>,
) -> Result<String> {
    submit(api, prefix, SERVING, "server auth", shape).await
}

/// Submits a CSR as kubelet would; returns its name.
pub(crate) async fn submit(
    api: &Api<CertificateSigningRequest>,
    prefix: &str,
    signer: &str,
    purpose_usage: &str,
    shape: &CsrShape<'_>,
) -> Result<String> {
    let name = format!("{prefix}-{}", autonode_tests::kube::controlplane::unique());
    submit_named(api, &name, signer, purpose_usage, shape).await?;
    Ok(name)
}

/// Submits a CSR as kubelet would, under `name`.
async fn submit_named(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    signer: &str,
    purpose_usage: &str,
    shape: &CsrShape<'_>,
) -> Result<()> {
    let key = rcgen::KeyPair::generate()?;
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
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
    Ok(())
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
