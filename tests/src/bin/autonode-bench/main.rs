//! autonode-bench: the join benchmarks (not a test; `tests/bench/run` runs it).
//!
//! Against a real control plane on this machine, with the release builds:
//!
//! 1. **join vs bare CSR**: one join at a time, the real agent binary
//!    (`$AUTONODE_AGENT_BIN`, the static release build) on a simulated
//!    instance, timed from the agent's start to kubelet's credentials
//!    written and synced (the agent's `phase=apply succeeded` line, read
//!    from its stderr as it comes), and to its exit 0 (kubelet started
//!    through the fake systemctl, reports sent); interleaved with
//!    the bare Kubernetes path a kubelet bootstrap takes on the same API
//!    server (create a client CSR, approve it, wait for the certificate).
//!    Each agent run is reaped with `wait4`, which gives its peak RSS and CPU
//!    time.
//!    With `--ignition-kib N`, the server has a base Ignition layer of that
//!    size to check and merge into every join's config.
//! 2. **burst**: a fresh control plane and server; N instances with their
//!    NodeClaims and signed documents made first. First the floor: the
//!    same N machines' API writes alone (the binding's patch, two CSR
//!    creates, two approvals, two signatures), all started at once as the
//!    server's ServiceAccount; then N joins at once through the join
//!    protocol (no agent processes), each retrying 503 after
//!    `Retry-After` as the agent does, until every one has its
//!    certificates or has finally failed. The machines speak from 250
//!    loopback addresses, so the server's per-source limits see a fleet.
//!    The server's peak RSS is its `VmHWM`; its API requests are counted
//!    from the API server's audit log.
//! 3. **hostile burst**: `--hostile-burst` joins again on a fresh control plane,
//!    while 64 slow-body clients (from 127.0.0.2) and 16 callers repeating
//!    a document of an account the server does not allow (from 127.0.0.3)
//!    run beside it.
//! 4. **large burst**: `--burst-large` joins at once (5,000) on a fresh
//!    control plane: how the burst scales, and the server's memory.
//! 5. **stock path**: `--stock` kubelet TLS bootstraps at once (1,000) on
//!    a fresh control plane without autonode: the path a fleet would
//!    otherwise join by (`stock`).
//! 6. **fleet**: `--fleet 1000,5000,10000`: the server among a fleet that
//!    stands (its replicas' memory, a replica started among them, the
//!    leader killed): see [`fleet`].
//! 7. **renewal wave**: `--renewal-wave` joined nodes' client renewals and
//!    serving CSRs at once, approved by the server; beside it the stock
//!    approvers (`wave`).
//! 8. **attested**: `--attested N`: joins proving a NitroTPM boot beside
//!    plain ones, one of each in turn on one server (`attested`).
//!
//! Writes the numbers as JSON (merged with `tests/bench/identity`'s when
//! `--identity` names its file), the raw timings beside it
//! (`*.samples.json`), and prints a table.
//!
//! For finding where time goes: `AUTONODE_BENCH_LOGS=DIR` keeps the
//! server's and control plane's logs (and the last agent's),
//! `AUTONODE_BENCH_TRACE=1` prints each agent run and bare CSR's timings
//! (and each line the agent logs, with the time since its start),
//! `AUTONODE_BENCH_WRAP="strace -f -tt -o FILE"` runs the agent under a tool.

mod attested;
mod burst;
mod failover;
mod fill;
mod fleet;
mod floor;
mod layer;
mod measure;
mod options;
mod requests;
mod sequential;
mod stock;
mod table;
mod wave;

use anyhow::{bail, ensure, Context, Result};
use burst::{burst, Kind};
use measure::{machine, round};
use options::Options;
use sequential::sequential;
use serde_json::{Map, Value};
use std::time::Instant;
use table::table;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let options = Options::parse()?;
    ensure!(
        options.agent.exists(),
        "no agent binary at {}",
        options.agent.display()
    );
    let open_files = measure::raise_open_files().context("raising the open-files limit")?;
    autonode_tests::kube::controlplane::set_controller_manager_qps(options.kcm_qps);
    let mut results = Map::new();
    results.insert("open_files_limit".into(), open_files.into());
    results.insert("kcm_qps".into(), options.kcm_qps.into());
    let started = Instant::now();

    if options.joins > 0 {
        eprintln!("== agent joins and bare CSRs, one at a time");
        sequential(&options, &mut results).await?;
    }
    if options.burst > 0 {
        eprintln!(
            "== burst of {} joins, after their API writes alone",
            options.burst
        );
        burst(options.burst, Kind::Clean, &mut results).await?;
    }
    if options.hostile_burst > 0 {
        eprintln!(
            "== burst of {} joins beside slow bodies and foreign documents",
            options.hostile_burst
        );
        burst(options.hostile_burst, Kind::Hostile, &mut results).await?;
    }
    if options.burst_large > 0 {
        eprintln!("== burst of {} joins", options.burst_large);
        burst(options.burst_large, Kind::Large, &mut results).await?;
    }
    if options.stock > 0 {
        eprintln!(
            "== {} kubelet TLS bootstraps at once, the stock way",
            options.stock
        );
        stock::burst(options.stock, &mut results).await?;
    }
    if !options.fleet.is_empty() {
        fleet::fleet(&options.fleet, &mut results).await?;
    }
    if options.attested > 0 {
        eprintln!("== {} attested joins beside plain ones", options.attested);
        attested::attested(options.attested, &mut results).await?;
    }
    if options.renewal_wave > 0 {
        eprintln!(
            "== renewal wave: {} nodes' client and serving CSRs at once",
            options.renewal_wave
        );
        let stock = options.renewal_wave_stock.min(options.renewal_wave);
        wave::wave(options.renewal_wave, stock, &mut results).await?;
    }
    results.insert(
        "agent_size_bytes".into(),
        std::fs::metadata(&options.agent)?.len().into(),
    );
    results.insert(
        "agent_path".into(),
        options.agent.display().to_string().into(),
    );
    results.insert(
        "bench_seconds".into(),
        round(started.elapsed().as_secs_f64(), 1).into(),
    );
    if let Some(identity) = &options.identity {
        let text = std::fs::read_to_string(identity)
            .with_context(|| format!("reading {}", identity.display()))?;
        let Value::Object(more) = serde_json::from_str(&text)? else {
            bail!("{} is not a JSON object", identity.display());
        };
        for (key, value) in more {
            let key = if key == "core" || key == "openssl_version" {
                format!("identity_{key}")
            } else {
                key
            };
            results.insert(key, value);
        }
    }
    results.insert("machine".into(), machine());
    // The binaries that ran (AUTONODE_KUBE_BIN's when set), as they say.
    let apiserver = autonode_tests::kube::controlplane::kube_bin_dir()?.join("kube-apiserver");
    let version = autonode_tests::kube::controlplane::binary_version(&apiserver)?;
    results.insert("kubernetes".into(), version.to_string().into());

    if let Some(dir) = options.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // The raw timings go beside the results, not in them.
    if let Some(samples) = results.remove("samples") {
        let path = options.out.with_extension("samples.json");
        std::fs::write(&path, serde_json::to_string(&samples)? + "\n")?;
    }
    let results = Value::Object(results);
    std::fs::write(&options.out, serde_json::to_string_pretty(&results)? + "\n")?;
    print!("{}", table(&results));
    eprintln!("wrote {}", options.out.display());
    Ok(())
}
