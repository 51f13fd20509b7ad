//! A leader killed among a full fleet, and how soon another replica does
//! the leader's work.
//!
//! The leader (the World's first replica) is killed with SIGKILL: no
//! hand-over, its Lease stays held until it expires. The **Lease is free**
//! at its last `renewTime` plus `leaseDurationSeconds`, as read right after
//! the kill (the time any other replica may take it). Then, at once, a
//! node asks for a client renewal and a machine that joined before the
//! kill registers its Node, Ready. `failover_s` runs from the Lease being
//! free until the new leader has both approved the renewal (its Approved
//! condition) and reported the Node Ready (the feedback controller's
//! `AutonodeBootstrapped` condition True on the machine's NodeClaim),
//! each seen by polling every [`POLL`]. The Lease's own timing is written
//! beside it: its duration, the kill to the Lease being free, the Lease
//! taken again.

use crate::fill::{self, Machine};
use crate::measure::{leads, round};
use anyhow::{bail, Context, Result};
use autonode_tests::callers::joiner::CsrShape;
use autonode_tests::karpenter::standin as karpenter;
use autonode_tests::server::world::World;
use autonode_tests::server::TestServer;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use serde_json::{json, Value};
use std::time::Duration;

/// How often the outcome is looked at.
const POLL: Duration = Duration::from_millis(100);
/// Longer than any takeover should take; past it the run fails.
const GIVE_UP: Duration = Duration::from_secs(300);
/// Where the harness's servers keep their Lease (the server's default).
const LEASE_NAMESPACE: &str = "autonode-system";
const LEASE: &str = "autonode-server";

/// When each step of the takeover was seen.
#[derive(Default)]
struct Seen {
    acquired: Option<Timestamp>,
    approved: Option<Timestamp>,
    reported: Option<Timestamp>,
}

/// Kills `world`'s server (the leader); `others` are the replicas that
/// may take over. `spare` has joined but has no Node yet; `renewing` is
/// a node of the fleet.
pub(crate) async fn failover(
    world: &World,
    admin: &kube::Client,
    others: [&TestServer; 2],
    spare: &Machine,
    renewing: &Machine,
) -> Result<Value> {
    let pem = CsrShape::client(renewing.node_name()).csr(&rcgen::KeyPair::generate()?)?;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
    let held = leases.get(LEASE).await?.spec.unwrap_or_default();
    let holder = held.holder_identity.clone();

    world.server.kill();
    let killed = Timestamp::now();
    // Its last renewal: nobody renews it now.
    let spec = leases.get(LEASE).await?.spec.unwrap_or_default();
    if spec.holder_identity != holder {
        bail!("the Lease changed hands before the leader was killed");
    }
    let renewed = spec.renew_time.context("a Lease without renewTime")?.0;
    let duration = spec
        .lease_duration_seconds
        .context("no leaseDurationSeconds")?;
    let free = renewed + SignedDuration::from_secs(i64::from(duration));

    let csr = fill::renewal(admin, renewing.node_name(), &pem).await?;
    fill::register_one(&Api::all(admin.clone()), spare, 0).await?;
    let seen = watch_takeover(admin, &leases, holder, &csr, &spare.claim).await?;

    let after = |t: Option<Timestamp>| t.map(|t| round(secs(t, free), 2));
    let done = seen.approved.max(seen.reported);
    let mut new_leader = Value::Null;
    for (i, server) in others.iter().enumerate() {
        if leads(server).await? {
            new_leader = json!({
                "replica": if i == 0 { "follower" } else { "started among the fleet" },
                "peak_rss_mib": round(server.peak_rss_bytes()? as f64 / 1048576.0, 1),
                "rss_mib": round(server.rss_bytes()? as f64 / 1048576.0, 1),
            });
        }
    }
    Ok(json!({
        "failover_s": after(done),
        "since_kill_s": done.map(|t| round(secs(t, killed), 2)),
        "lease_duration_s": duration,
        "lease_free_after_kill_s": round(secs(free, killed), 2),
        "lease_taken_s": after(seen.acquired),
        "renewal_approved_s": after(seen.approved),
        "ready_reported_s": after(seen.reported),
        "new_leader": new_leader,
    }))
}

/// Polls the Lease, the renewal and the NodeClaim until the renewal is
/// approved and the node reported Ready.
async fn watch_takeover(
    admin: &kube::Client,
    leases: &Api<Lease>,
    old_holder: Option<String>,
    csr: &str,
    claim: &str,
) -> Result<Seen> {
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let claims = karpenter::nodeclaims(admin);
    let give_up = tokio::time::Instant::now() + GIVE_UP;
    let mut seen = Seen::default();
    while seen.approved.is_none() || seen.reported.is_none() {
        if tokio::time::Instant::now() > give_up {
            bail!(
                "no takeover within {GIVE_UP:?}: renewal approved {}, Ready reported {}",
                seen.approved.is_some(),
                seen.reported.is_some()
            );
        }
        tokio::time::sleep(POLL).await;
        let now = Timestamp::now();
        if seen.acquired.is_none() {
            let spec = leases.get(LEASE).await?.spec.unwrap_or_default();
            if spec.holder_identity != old_holder {
                seen.acquired = Some(spec.acquire_time.map_or(now, |t| t.0));
            }
        }
        if seen.approved.is_none() && approved(&csrs.get(csr).await?) {
            seen.approved = Some(now);
        }
        if seen.reported.is_none() && fill::bootstrapped(&claims.get(claim).await?) {
            seen.reported = Some(now);
        }
    }
    Ok(seen)
}

fn approved(csr: &CertificateSigningRequest) -> bool {
    let conditions = csr.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Approved"))
}

/// Seconds from `since` to `t` (negative if before).
fn secs(t: Timestamp, since: Timestamp) -> f64 {
    t.duration_since(since).as_secs_f64()
}
