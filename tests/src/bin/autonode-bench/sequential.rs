//! Joins one at a time with the real agent binary, interleaved with the
//! bare kubelet CSR path and the join's API writes alone, on one control
//! plane: what a join costs over the floor it stands on.

use crate::floor::{bare_csr, join_writes, Signatures, Writes};
use crate::layer;
use crate::measure::{
    cpu_seconds, join_steps, keep_logs, metric, ms, percentile, round, server_metrics, trace,
};
use crate::options::Options;
use crate::requests;
use anyhow::{ensure, Context, Result};
use autonode_tests::cloud::fakecloud::Instance;
use autonode_tests::karpenter::standin as karpenter;
use autonode_tests::kube::controlplane::unique;
use autonode_tests::machines::node::{self, SimulatedNode};
use autonode_tests::machines::vm;
use autonode_tests::server::world::World;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::Api;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// Agent joins interleaved with bare CSRs on one control plane.
pub(crate) async fn sequential(options: &Options, results: &mut Map<String, Value>) -> Result<()> {
    let world = match options.ignition_kib {
        0 => World::start().await?,
        _ => World::start_with(&[format!("--base-ignition={}", layer::CONFIGMAP)]).await?,
    };
    let admin = world.cp.admin().await?;
    if options.ignition_kib > 0 {
        let text = layer::base_layer(options.ignition_kib);
        autonode_tests::server::ignition::put_configmap(&admin, layer::CONFIGMAP, &text).await?;
    }
    let user_data = node::user_data(&world);
    // The class the NodeClaims name exists, as it does under Karpenter:
    // without it every join would also GET it from the API server.
    karpenter::create_custom_nodeclass(&admin, "default", &user_data).await?;
    let runs = options.warmup + options.joins;
    // Karpenter's part for every join first, so the server's NodeClaim
    // cache holds them all before anything is timed.
    let mut instances = Vec::with_capacity(runs);
    for _ in 0..runs {
        let (_, instance) = world
            .launch(|i| Instance {
                user_data: user_data.clone().into_bytes(),
                ..i
            })
            .await?;
        instances.push(instance);
    }
    // And NodeClaims for the join's writes alone to bind (no providerID:
    // no join will ask for them).
    let writes_claims = karpenter::nodeclaims(&admin);
    let mut write_targets = Vec::with_capacity(options.warmup + options.bare);
    for _ in 0..options.warmup + options.bare {
        let name = format!("writes-{}", unique());
        karpenter::create_nodeclaim(&admin, &name, "default").await?;
        write_targets.push(name);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    // One long-lived watch over the bench's CSRs, on a client of its own
    // (see `Signatures`).
    let csrs: Api<CertificateSigningRequest> = Api::all(admin);
    let signatures = Signatures::watch(Api::all(world.cp.admin().await?));
    let no_429s = AtomicU64::new(0);
    let mut joins = Vec::with_capacity(options.joins);
    let mut exits = Vec::with_capacity(options.joins);
    let mut bares = Vec::with_capacity(options.bare);
    let mut writes = Vec::with_capacity(options.bare);
    let mut max_rss_kib = 0;
    let mut cpu = Vec::with_capacity(options.joins);
    let rounds = options.warmup + options.joins.max(options.bare);
    // The server's CPU per join (warmup included): what rendering costs it
    // shows here even where a join's latency hides it behind API writes.
    let server = world.server.pid();
    let server_cpu_before = cpu_seconds(server)?;
    let audited = requests::mark(&world.cp)?;
    for round in 0..rounds {
        let counted = round >= options.warmup;
        if let Some(instance) = instances.get(round) {
            let node = SimulatedNode::boot(&world, instance)?;
            let run = run_agent(&node, &options.agent).await?;
            if counted {
                joins.push(run.credentials);
                exits.push(run.elapsed);
                max_rss_kib = max_rss_kib.max(run.max_rss_kib);
                cpu.push(run.cpu);
            }
        }
        // One NodeClaim to bind per bare round, warmup included.
        if let Some(target) = write_targets.get(round) {
            let elapsed = bare_csr(&csrs, &signatures).await?;
            let prepared = Writes::prepare(target)?;
            let written =
                join_writes(&csrs, &writes_claims, &prepared, &signatures, &no_429s).await?;
            if counted {
                bares.push(elapsed);
                writes.push(written);
            }
        }
        if counted && (round - options.warmup + 1).is_multiple_of(25) {
            eprintln!(
                "  {} rounds: join p50 {:.1} ms, bare CSR p50 {:.1} ms, join's writes p50 {:.1} ms",
                round - options.warmup + 1,
                ms(percentile(&joins, 0.5)),
                ms(percentile(&bares, 0.5)),
                ms(percentile(&writes, 0.5)),
            );
        }
    }
    let server_cpu = cpu_seconds(server)? - server_cpu_before;
    // What the joins asked of the API server, the feedback controller's
    // writes (a second after each join) included.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let requests = requests::since(&world.cp, &audited)?;
    results.insert("api_requests_per_join".into(), requests.per_join(runs));
    let metrics = server_metrics(&world).await?;
    // The server's own time per join (its histograms' means): the rest of
    // an agent's run is the agent's work on the node. Includes the warmup
    // joins.
    let mean_ms = |name: &str, labels: &str| -> Result<f64> {
        let count = metric(&metrics, &format!("{name}_count{labels}"))?;
        let sum = metric(&metrics, &format!("{name}_sum{labels}"))?;
        Ok(round(sum / count.max(1.0) * 1000.0, 1))
    };
    results.insert(
        "join_server_mean_ms".into(),
        mean_ms("autonode_join_duration_seconds", "")?.into(),
    );
    let mut steps = Map::new();
    for step in join_steps() {
        let labels = format!("{{step=\"{step}\"}}");
        let mean = mean_ms("autonode_join_step_duration_seconds", &labels)?;
        steps.insert(step.into(), mean.into());
    }
    results.insert("join_server_steps_mean_ms".into(), steps.into());
    keep_logs(&world, "sequential")?;
    let samples = |v: &[Duration]| v.iter().map(|d| round(ms(*d), 2)).collect::<Vec<f64>>();
    results.insert(
        "samples".into(),
        json!({
            "join_ms": samples(&joins),
            "agent_exit_ms": samples(&exits),
            "bare_csr_ms": samples(&bares),
            "join_writes_ms": samples(&writes),
        }),
    );
    let join_p50 = ms(percentile(&joins, 0.5));
    let bare_p50 = ms(percentile(&bares, 0.5));
    let put = |results: &mut Map<String, Value>, key: &str, value: f64| {
        results.insert(key.into(), round(value, 1).into());
    };
    results.insert("joins".into(), joins.len().into());
    results.insert("ignition_kib".into(), options.ignition_kib.into());
    let per_join = server_cpu * 1000.0 / runs.max(1) as f64;
    results.insert("server_cpu_per_join_ms".into(), round(per_join, 2).into());
    put(results, "join_p50_ms", join_p50);
    put(results, "join_p99_ms", ms(percentile(&joins, 0.99)));
    put(results, "join_min_ms", ms(percentile(&joins, 0.0)));
    put(results, "agent_exit_p50_ms", ms(percentile(&exits, 0.5)));
    results.insert("bare_csrs".into(), bares.len().into());
    put(results, "bare_csr_p50_ms", bare_p50);
    put(results, "bare_csr_p99_ms", ms(percentile(&bares, 0.99)));
    results.insert(
        "join_vs_bare_ratio".into(),
        round(join_p50 / bare_p50, 2).into(),
    );
    let writes_p50 = ms(percentile(&writes, 0.5));
    put(results, "join_writes_p50_ms", writes_p50);
    results.insert(
        "join_writes_vs_bare_ratio".into(),
        round(writes_p50 / bare_p50, 2).into(),
    );
    results.insert(
        "join_vs_join_writes_ratio".into(),
        round(join_p50 / writes_p50, 2).into(),
    );
    results.insert("agent_peak_rss_bytes".into(), (max_rss_kib * 1024).into());
    put(results, "agent_cpu_ms", ms(percentile(&cpu, 0.5)));
    Ok(())
}

/// One agent run, reaped with `wait4`.
pub(crate) struct AgentRun {
    /// Until kubelet's credentials were written and synced.
    credentials: Duration,
    /// Until the agent exited.
    elapsed: Duration,
    /// The agent's own peak, from its `exiting` line; `ru_maxrss` when an
    /// agent from before that logs none.
    max_rss_kib: u64,
    cpu: Duration,
}

/// Runs the agent on `node` as `SimulatedNode::run_agent` does, but
/// entering the namespace itself (no `ip netns exec` in between), so the
/// child is the agent and `wait4` reports the agent's own resources.
pub(crate) async fn run_agent(node: &SimulatedNode, agent: &Path) -> Result<AgentRun> {
    use std::os::unix::process::CommandExt;
    let root = node.root.path().to_path_buf();
    let netns = std::fs::File::open(node.netns.path())?;
    let log = std::fs::File::create(root.join("agent.log"))?;
    let trace = trace();
    let wrap = std::env::var("AUTONODE_BENCH_WRAP").unwrap_or_default();
    let mut wrap = wrap.split_whitespace();
    let mut command = match wrap.next() {
        Some(program) => {
            let mut c = std::process::Command::new(program);
            c.args(wrap).arg(agent);
            c
        }
        None => std::process::Command::new(agent),
    };
    command
        .args(node.agent_args())
        .args(trace.then_some("--verbose"))
        .env_remove(node::IMDS_ENDPOINT_ENV)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(std::process::Stdio::piped());
    // SAFETY: setns is a plain system call, safe between fork and exec.
    unsafe {
        command.pre_exec(move || {
            nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)
        });
    }
    let (credentials, elapsed, status, usage) =
        tokio::task::spawn_blocking(move || -> Result<_> {
            let started = Instant::now();
            let mut child = command.spawn().context("starting the agent")?;
            let pid = child.id() as nix::libc::pid_t;
            let stderr = child.stderr.take().context("the agent's stderr")?;
            let credentials = read_log(stderr, log, started, trace)?;
            let mut status = 0;
            // SAFETY: an all-zero rusage is valid; wait4 fills it in.
            let mut usage: nix::libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: valid pointers to locals; reaps only our own child.
            let reaped = unsafe { nix::libc::wait4(pid, &mut status, 0, &mut usage) };
            let elapsed = started.elapsed();
            if trace {
                let now = time::OffsetDateTime::now_utc();
                eprintln!("agent ran {:?} until {now}", elapsed);
            }
            ensure!(reaped == pid, "wait4: {}", std::io::Error::last_os_error());
            Ok((credentials, elapsed, status, usage))
        })
        .await??;
    let log = std::fs::read_to_string(root.join("agent.log")).unwrap_or_default();
    if let Some(dir) = std::env::var_os("AUTONODE_BENCH_LOGS") {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(PathBuf::from(dir).join("agent.log"), &log)?;
    }
    ensure!(
        nix::libc::WIFEXITED(status) && nix::libc::WEXITSTATUS(status) == 0,
        "the agent failed (wait status {status:#x}):\n{log}"
    );
    for file in [
        "/var/lib/kubelet/kubeconfig",
        "/var/lib/kubelet/pki/kubelet-client-current.pem",
    ] {
        ensure!(
            node.path(file).exists(),
            "the agent exited 0 without {file}"
        );
    }
    let tv = |t: nix::libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    let credentials = credentials
        .with_context(|| format!("the agent never logged {CREDENTIALS_WRITTEN}:\n{log}"))?;
    Ok(AgentRun {
        credentials,
        elapsed,
        max_rss_kib: logged_peak_rss_kib(&log).unwrap_or(usage.ru_maxrss as u64),
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
    })
}

/// The agent's own peak RSS, as its `exiting` line says (`peak_rss_kib=`).
/// `wait4`'s `ru_maxrss` would not do: Linux carries the memory a process
/// had before its exec into it, and before the exec the agent was a copy of
/// this bench (41 MiB read that way, where the agent's own is a tenth).
fn logged_peak_rss_kib(log: &str) -> Option<u64> {
    // Lines read `autonode-agent LEVEL: message`.
    let messages = log
        .lines()
        .filter_map(|l| l.split_once(": ").map(|(_, m)| m));
    vm::logged_pairs(messages, "exiting ")?
        .get("peak_rss_kib")?
        .parse()
        .ok()
}

/// The agent's line once kubelet's files are written and synced.
pub(crate) const CREDENTIALS_WRITTEN: &str = "phase=apply succeeded";

/// Copies the agent's stderr to `log` as it comes (and, with `trace`, to
/// ours with timestamps); when it logged [`CREDENTIALS_WRITTEN`], counted
/// from `started`.
pub(crate) fn read_log(
    stderr: impl std::io::Read,
    mut log: std::fs::File,
    started: Instant,
    trace: bool,
) -> Result<Option<Duration>> {
    use std::io::{BufRead as _, Write as _};
    let mut credentials = None;
    for line in std::io::BufReader::new(stderr).lines() {
        let line = line.context("reading the agent's stderr")?;
        if trace {
            let now = time::OffsetDateTime::now_utc().time();
            eprintln!("  {now} +{:6.1} ms  {line}", ms(started.elapsed()));
        }
        if credentials.is_none() && line.contains(CREDENTIALS_WRITTEN) {
            credentials = Some(started.elapsed());
        }
        writeln!(log, "{line}")?;
    }
    Ok(credentials)
}
