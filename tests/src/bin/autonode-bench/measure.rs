//! Reading what happened: the server's metrics, processes' CPU and peak
//! memory, percentiles, and the machine the figures come from.

use anyhow::{Context, Result};
use autonode_tests::kube::controlplane::ControlPlane;
use autonode_tests::server::world::World;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::time::Duration;

/// The server's steps of a join, as its `join_step_duration_seconds`
/// histogram labels them: the join's own list, so the two cannot differ.
pub(crate) fn join_steps() -> [&'static str; 4] {
    autonode_server::join::Step::ALL.map(autonode_server::join::Step::name)
}

/// The server's /metrics text.
pub(crate) async fn server_metrics(world: &World) -> Result<String> {
    let url = format!("{}/metrics", world.server.metrics_url());
    Ok(autonode_tests::server::http_get(&url).await?.1)
}

/// Whether `server` runs the leader's controllers (its `autonode_leader`).
pub(crate) async fn leads(server: &autonode_tests::server::TestServer) -> Result<bool> {
    let url = format!("{}/metrics", server.metrics_url());
    let (_, text) = autonode_tests::server::http_get(&url).await?;
    Ok(metric(&text, "autonode_leader").is_ok_and(|v| v == 1.0))
}

/// The value of the sample named exactly `name` (with its labels).
pub(crate) fn metric(text: &str, name: &str) -> Result<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .with_context(|| format!("no {name} in /metrics"))
}

/// With `$AUTONODE_BENCH_LOGS` set to a directory, copies the server's and
/// the control plane's logs there (for finding where the time goes).
pub(crate) fn keep_logs(world: &World, phase: &str) -> Result<()> {
    let Some(dir) = std::env::var_os("AUTONODE_BENCH_LOGS") else {
        return Ok(());
    };
    let dir = PathBuf::from(dir).join(phase);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("autonode-server.log"), world.server.log())?;
    for name in ["kube-apiserver", "kube-controller-manager", "etcd"] {
        let from = world.cp.dir().join(format!("{name}.log"));
        if from.exists() {
            std::fs::copy(&from, dir.join(format!("{name}.log")))?;
        }
    }
    Ok(())
}

/// Nearest-rank percentile (`p` in 0..=1) of unsorted durations.
pub(crate) fn percentile(values: &[Duration], p: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub(crate) fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

/// Peak resident set of a live process.
pub(crate) fn vm_hwm_bytes(pid: u32) -> Result<u64> {
    autonode_tests::harness::process::status_bytes(pid, "VmHWM:")
}

/// User + system CPU time of a live process so far.
pub(crate) fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is 3rd,
    // utime 14th and stime 15th of the whole line.
    let rest = stat.rsplit_once(')').context("odd /proc stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / hz)
}

/// The CPU the control plane's processes (etcd, kube-apiserver,
/// kube-controller-manager) and the bench itself (the callers' side:
/// agents' requests, their TLS, attackers) use over a span: where the
/// machine's cores went beside the server's.
pub(crate) struct Cores {
    pids: [(&'static str, u32); 4],
    before: [f64; 4],
}

impl Cores {
    /// From now, for the processes of `cp` and this one.
    pub(crate) fn from_now(cp: &ControlPlane) -> Self {
        let [etcd, apiserver, kcm] = cp.pids();
        let pids = [
            ("etcd", etcd),
            ("apiserver", apiserver),
            ("kcm", kcm),
            ("bench", std::process::id()),
        ];
        let before = pids.map(|(_, pid)| cpu_seconds(pid).unwrap_or(0.0));
        Cores { pids, before }
    }

    /// Records each one's CPU seconds since [`Cores::from_now`] as
    /// `{prefix}_{name}_cpu_s`.
    pub(crate) fn record(&self, prefix: &str, results: &mut Map<String, Value>) {
        for ((name, pid), before) in self.pids.iter().zip(self.before) {
            let used = cpu_seconds(*pid).unwrap_or(before) - before;
            results.insert(format!("{prefix}_{name}_cpu_s"), round(used, 1).into());
        }
    }
}

/// nproc, CPU model and memory of this machine.
pub(crate) fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    json!({
        "nproc": nproc,
        "cpu_model": model,
        "memory_bytes": memory_kib * 1024,
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
    })
}

/// Raises this process's open-files limit (and so that of the control
/// plane and servers it starts) as far as it may, at most 1,048,576: a
/// 5,000-machine burst's API writes alone hold a connection a machine and
/// more, and at a limit of 20,000 hundreds of them fail with "Too many
/// open files" (the bench's own limit, not the API server's). Without
/// CAP_SYS_RESOURCE only the soft limit goes up, to the hard one. Returns
/// the limit now, which the results record.
pub(crate) fn raise_open_files() -> Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    const WANTED: u64 = 1 << 20;
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(WANTED);
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let wanted = WANTED.min(nr_open).max(soft);
    // Raising the hard limit needs CAP_SYS_RESOURCE (the bench runs as
    // root); without it, the soft limit still goes up to the hard one.
    if setrlimit(Resource::RLIMIT_NOFILE, wanted, wanted.max(hard)).is_err() {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(getrlimit(Resource::RLIMIT_NOFILE)?.0)
}

/// Whether `AUTONODE_BENCH_TRACE` asks for each run's timings.
pub(crate) fn trace() -> bool {
    std::env::var_os("AUTONODE_BENCH_TRACE").is_some()
}
