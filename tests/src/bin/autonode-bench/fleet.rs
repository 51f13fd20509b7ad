//! The server among a fleet that already stands (`--fleet 1000,5000,10000`):
//! for each size, a fresh control plane filled with that many joined
//! machines ([`crate::fill`]), two server replicas (a leader and a
//! follower, as the chart runs them), and then
//!
//! - **steady memory**: each replica's RSS once the fleet has settled
//!   (every renewal signed, every NodeClaim reported bootstrapped by the
//!   leader's feedback controller, then [`SETTLE`] more): `steady_rss_mib`;
//! - **a replica started among them**: a third replica started on the
//!   full cluster, its peak RSS (`VmHWM`) once ready and settled:
//!   `restart_peak_mib`;
//! - **failover** ([`crate::failover`]): the leader killed, until another
//!   replica approves a renewal and reports a new Ready node: `failover_s`.
//!
//! Each beside the memory limit the chart ships (`memory_limit_mib`, read
//! from its values.yaml).

use crate::failover::failover;
use crate::fill;
use crate::measure::{leads, round};
use anyhow::{Context, Result};
use autonode_tests::harness::bench::repo_root;
use autonode_tests::server::world::{cloud_settings, World};
use autonode_tests::server::TestServer;
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

/// How long the fleet is left alone once settled before memory is read:
/// the last writes' answers and the allocator's caches have gone quiet.
const SETTLE: Duration = Duration::from_secs(20);

/// Each size of `sizes` in turn, on a fresh control plane.
pub(crate) async fn fleet(sizes: &[usize], results: &mut Map<String, Value>) -> Result<()> {
    let limit = memory_limit_mib()?;
    results.insert("memory_limit_mib".into(), limit.into());
    let (mut steady, mut restart, mut failovers) = (Map::new(), Map::new(), Map::new());
    for &size in sizes {
        eprintln!(
            "== a fleet of {size} nodes: memory settled, a replica started among them, failover"
        );
        let figures = one_fleet(size).await?;
        eprintln!("  {figures}");
        let key = size.to_string();
        steady.insert(key.clone(), figures["steady_rss_mib"].clone());
        restart.insert(key.clone(), figures["restart_peak_mib"].clone());
        failovers.insert(key, figures["failover"].clone());
    }
    if let Some(largest) = sizes.iter().max() {
        let last = &failovers[&largest.to_string()];
        results.insert("failover_s".into(), last["failover_s"].clone());
        results.insert("failover_nodes".into(), (*largest).into());
    }
    results.insert("steady_rss_mib".into(), steady.into());
    results.insert("restart_peak_mib".into(), restart.into());
    results.insert("failover".into(), failovers.into());
    Ok(())
}

/// A fleet of `size` nodes and what it costs the server.
async fn one_fleet(size: usize) -> Result<Value> {
    let world = World::start().await?;
    let admin = world.cp.admin().await?;
    let settings = cloud_settings(&world.cloud, &world.ec2);
    let follower = TestServer::start(&world.cp, &settings, &[]).await?;
    // The first replica took the Lease when it started (there was none).
    wait_leading(&world.server).await?;

    let started = Instant::now();
    fill::classes(&world, &admin).await?;
    // One more than the fleet: a machine that joins but registers its Node
    // only once the leader is killed (the failover's new Ready node).
    let mut machines = fill::launch(&world, &admin, size + 1).await?;
    eprintln!(
        "  {} NodeClaims launched in {:.0}s",
        size + 1,
        started.elapsed().as_secs_f64()
    );
    fill::join(&world, &[&world.server, &follower], &machines).await?;
    eprintln!("  joined after {:.0}s", started.elapsed().as_secs_f64());
    let spare = machines.pop().context("no machine")?;
    fill::register(&admin, &machines).await?;
    fill::renew(&admin, &machines).await?;
    eprintln!(
        "  Nodes and renewals made after {:.0}s",
        started.elapsed().as_secs_f64()
    );
    let within = Duration::from_secs(300) + Duration::from_millis(100) * size as u32;
    fill::settle("renewals signed", within, || fill::renewals_signed(&admin)).await?;
    fill::settle("NodeClaims reported bootstrapped", within, || async {
        let (done, all) = fill::reported(&admin).await?;
        // The spare has no Node yet.
        Ok((done, all - 1))
    })
    .await?;
    let fill_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(SETTLE).await;
    let mib = |bytes: u64| round(bytes as f64 / 1048576.0, 1);
    let steady = json!({
        "leader": mib(world.server.rss_bytes()?),
        "follower": mib(follower.rss_bytes()?),
    });
    let fill_peak = json!({
        "leader": mib(world.server.peak_rss_bytes()?),
        "follower": mib(follower.peak_rss_bytes()?),
    });

    let restarted = TestServer::start(&world.cp, &settings, &[]).await?;
    tokio::time::sleep(SETTLE).await;
    let restart_peak = mib(restarted.peak_rss_bytes()?);
    let failover = failover(
        &world,
        &admin,
        [&follower, &restarted],
        &spare,
        &machines[0],
    )
    .await?;
    Ok(json!({
        "nodes": size,
        "fill_s": round(fill_s, 0),
        "steady_rss_mib": steady,
        "fill_peak_rss_mib": fill_peak,
        "restart_peak_mib": restart_peak,
        "failover": failover,
    }))
}

/// The fleet's figures as a Markdown table, each beside the chart's
/// memory limit (empty when `--fleet` did not run).
pub(crate) fn table(results: &Value) -> String {
    let Some(steady) = results["steady_rss_mib"].as_object() else {
        return String::new();
    };
    let limit = &results["memory_limit_mib"];
    let mut out = format!(
        "\nThe server among a standing fleet (MiB; the chart's limit: {limit} MiB)\n\n\
         | nodes | leader RSS | follower RSS | replica started among them, peak | failover after the Lease is free (kill to free) |\n\
         |---|---|---|---|---|\n"
    );
    for (nodes, rss) in steady {
        let failover = &results["failover"][nodes];
        out.push_str(&format!(
            "| {nodes} | {} | {} | {} | {} s ({} s) |\n",
            rss["leader"],
            rss["follower"],
            results["restart_peak_mib"][nodes],
            failover["failover_s"],
            failover["lease_free_after_kill_s"],
        ));
    }
    if let Some(peak) = results["burst_large_server_peak_rss_bytes"].as_f64() {
        out.push_str(&format!(
            "\nLarge burst ({} joins at once): {} s, {} failed, peak RSS {:.1} MiB of {limit} MiB\n",
            results["burst_large_nodes"],
            results["burst_large_seconds"],
            results["burst_large_failures"],
            peak / 1048576.0
        ));
    }
    out
}

/// Waits until `server` says it leads.
async fn wait_leading(server: &TestServer) -> Result<()> {
    autonode_tests::harness::poll::until(
        "the first replica leading",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { Ok(leads(server).await?.then_some(())) },
    )
    .await
}

/// The memory limit the chart ships (`resources.limits.memory` in its
/// values.yaml), in MiB.
pub(crate) fn memory_limit_mib() -> Result<f64> {
    let path = repo_root().join("packaging/helm/autonode-server/values.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let values: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let limit = values["resources"]["limits"]["memory"]
        .as_str()
        .context("no resources.limits.memory in the chart's values")?;
    mebibytes(limit).with_context(|| format!("the chart's memory limit {limit:?}"))
}

/// `256Mi` → 256, `1Gi` → 1024 (the suffixes a memory limit is written with).
fn mebibytes(quantity: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = quantity.strip_suffix("Gi") {
        (n, 1024.0)
    } else if let Some(n) = quantity.strip_suffix("Mi") {
        (n, 1.0)
    } else if let Some(n) = quantity.strip_suffix("Ki") {
        (n, 1.0 / 1024.0)
    } else {
        (quantity, 1.0 / 1048576.0)
    };
    Some(number.parse::<f64>().ok()? * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limits_are_read_in_mebibytes() {
        assert_eq!(mebibytes("256Mi"), Some(256.0));
        assert_eq!(mebibytes("1Gi"), Some(1024.0));
        assert_eq!(mebibytes("1048576"), Some(1.0));
        assert_eq!(mebibytes("lots"), None);
    }

    #[test]
    fn the_chart_has_a_memory_limit() {
        assert!(memory_limit_mib().unwrap() > 0.0);
    }
}
