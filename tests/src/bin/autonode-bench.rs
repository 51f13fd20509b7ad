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
//! 2. **burst**: a fresh control plane and server; N instances with their
//!    NodeClaims and signed documents made first, then N joins at once
//!    through the join protocol (no agent processes), each retrying 503 after
//!    `Retry-After` as the agent does, until every one has its certificates
//!    or has finally failed. The machines speak from 250 loopback addresses,
//!    so the server's per-source limits see a fleet. The server's peak RSS
//!    is its `VmHWM`.
//! 3. **hostile burst**: the same again on a fresh control plane, while 64
//!    slow-body clients (from 127.0.0.2) and 16 callers repeating a document
//!    of an account the server does not allow (from 127.0.0.3) run beside it.
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

use anyhow::{anyhow, bail, ensure, Context, Result};
use autonode_shared::csr::{self, Purpose};
use autonode_shared::protocol::{JoinRequest, JoinResponse, JOIN_PATH};
use autonode_tests::controlplane::unique;
use autonode_tests::fakecloud::Instance;
use autonode_tests::hostile::{self, Answers, Attackers};
use autonode_tests::joiner::{self, CsrShape, NodeKeys};
use autonode_tests::karpenter;
use autonode_tests::node::{self, SimulatedNode};
use autonode_tests::world::{World, ACCOUNT, REGION};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{json, Map, Value};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: autonode-bench [--joins N] [--bare N] [--burst N] [--warmup N] \
[--agent PATH] [--identity FILE] [--out FILE]";

/// Agent runs and bare CSRs not counted, to warm connections and caches.
const WARMUP: usize = 3;
/// Launch calls (NodeClaim create + providerID) in flight at once.
const LAUNCH_CONCURRENCY: usize = 16;
/// A burst join that has not succeeded by then has failed.
const BURST_DEADLINE: Duration = Duration::from_secs(300);

struct Options {
    joins: usize,
    bare: usize,
    burst: usize,
    warmup: usize,
    agent: PathBuf,
    identity: Option<PathBuf>,
    out: PathBuf,
}

impl Options {
    fn parse() -> Result<Self> {
        let mut options = Options {
            joins: 100,
            bare: 100,
            burst: 1000,
            warmup: WARMUP,
            agent: node::agent_binary()?,
            identity: None,
            out: PathBuf::from("target/bench/results.json"),
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--joins" => options.joins = value()?.parse()?,
                "--bare" => options.bare = value()?.parse()?,
                "--burst" => options.burst = value()?.parse()?,
                "--warmup" => options.warmup = value()?.parse()?,
                "--agent" => options.agent = value()?.into(),
                "--identity" => options.identity = Some(value()?.into()),
                "--out" => options.out = value()?.into(),
                "-h" | "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown argument {other}\n{USAGE}"),
            }
        }
        ensure!(options.joins > 0 && options.bare > 0, "{USAGE}");
        Ok(options)
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let options = Options::parse()?;
    ensure!(
        options.agent.exists(),
        "no agent binary at {}",
        options.agent.display()
    );
    let mut results = Map::new();
    let started = Instant::now();

    eprintln!("== agent joins and bare CSRs, one at a time");
    sequential(&options, &mut results).await?;
    if options.burst > 0 {
        eprintln!("== burst of {} joins", options.burst);
        burst(options.burst, false, &mut results).await?;
        eprintln!(
            "== burst of {} joins beside slow bodies and foreign documents",
            options.burst
        );
        burst(options.burst, true, &mut results).await?;
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
    results.insert(
        "kubernetes".into(),
        autonode_tests::controlplane::KUBE_VERSION.into(),
    );

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

/// Agent joins interleaved with bare CSRs on one control plane.
async fn sequential(options: &Options, results: &mut Map<String, Value>) -> Result<()> {
    let world = World::start().await?;
    let admin = world.cp.admin().await?;
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

    // kube-rs speaks HTTP/1.1 only: a watch per CSR would hold a connection
    // and close it when dropped, and each new connection's setup costs about
    // 40 ms here. kubelet's watch shares its warm HTTP/2 connection; one
    // long-lived watch over the bare CSRs, on a client of its own, is the
    // same cost.
    let csrs: Api<CertificateSigningRequest> = Api::all(admin);
    let signed = watch_signed(Api::all(world.cp.admin().await?));
    let mut joins = Vec::with_capacity(options.joins);
    let mut exits = Vec::with_capacity(options.joins);
    let mut bares = Vec::with_capacity(options.bare);
    let mut writes = Vec::with_capacity(options.bare);
    let mut max_rss_kib = 0;
    let mut cpu = Vec::with_capacity(options.joins);
    let rounds = options.warmup + options.joins.max(options.bare);
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
            let elapsed = bare_csr(&csrs, &signed).await?;
            let written = join_writes(&csrs, &writes_claims, target, &signed).await?;
            if counted {
                bares.push(elapsed);
                writes.push(written);
            }
        }
        if counted && (round - options.warmup + 1) % 25 == 0 {
            eprintln!(
                "  {} rounds: join p50 {:.1} ms, bare CSR p50 {:.1} ms, join's writes p50 {:.1} ms",
                round - options.warmup + 1,
                ms(percentile(&joins, 0.5)),
                ms(percentile(&bares, 0.5)),
                ms(percentile(&writes, 0.5)),
            );
        }
    }
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
    for step in JOIN_STEPS {
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
struct AgentRun {
    /// Until kubelet's credentials were written and synced.
    credentials: Duration,
    /// Until the agent exited.
    elapsed: Duration,
    max_rss_kib: u64,
    cpu: Duration,
}

/// Runs the agent on `node` as `SimulatedNode::run_agent` does, but
/// entering the namespace itself (no `ip netns exec` in between), so the
/// child is the agent and `wait4` reports the agent's own resources.
async fn run_agent(node: &SimulatedNode, agent: &Path) -> Result<AgentRun> {
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
        max_rss_kib: usage.ru_maxrss as u64,
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
    })
}

/// The agent's line once kubelet's files are written and synced.
const CREDENTIALS_WRITTEN: &str = "phase=apply succeeded";

/// Copies the agent's stderr to `log` as it comes (and, with `trace`, to
/// ours with timestamps); when it logged [`CREDENTIALS_WRITTEN`], counted
/// from `started`.
fn read_log(
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

/// What kubelet's TLS bootstrap does on the API server: create a client
/// CSR, (an approver) approve it, wait for kube-controller-manager's
/// certificate with a watch on that one name. The key is made beforehand.
async fn bare_csr(
    api: &Api<CertificateSigningRequest>,
    signed: &tokio::sync::broadcast::Sender<String>,
) -> Result<Duration> {
    let key = rcgen::KeyPair::generate()?;
    let name = format!("bare-{}", unique());
    let csr = bench_csr(&name, Purpose::Client, &CsrShape::client(&name), &key)?;
    let mut signed = signed.subscribe();
    let started = Instant::now();
    api.create(&PostParams::default(), &csr).await?;
    let created = started.elapsed();
    approve(api, &name).await?;
    let approved = started.elapsed();
    wait_signed(&mut signed, &[name]).await?;
    if trace() {
        eprintln!(
            "bare CSR: created {created:?} approved {approved:?} signed {:?}",
            started.elapsed()
        );
    }
    Ok(started.elapsed())
}

/// The API writes no join can do without, made straight from a client in
/// the order the server makes them: the binding patch on a NodeClaim beside
/// the client and serving CSRs' creation, then both approvals, then both
/// signatures by kube-controller-manager. A join's time beyond this is
/// autonode's own (agent, TLS, attestation, rendering, its watches).
async fn join_writes(
    csrs: &Api<CertificateSigningRequest>,
    claims: &Api<kube::api::DynamicObject>,
    claim: &str,
    signed: &tokio::sync::broadcast::Sender<String>,
) -> Result<Duration> {
    let id = unique();
    let node = format!("ip-10-0-0-1.writes-{id}.internal");
    let serving_shape = CsrShape {
        dns: vec![node.clone()],
        ips: vec![std::net::Ipv4Addr::new(10, 0, 0, 1).into()],
        ..CsrShape::client(&node)
    };
    let (client_key, serving_key) = (rcgen::KeyPair::generate()?, rcgen::KeyPair::generate()?);
    let client = bench_csr(
        &format!("writes-client-{id}"),
        Purpose::Client,
        &CsrShape::client(&node),
        &client_key,
    )?;
    let serving = bench_csr(
        &format!("writes-serving-{id}"),
        Purpose::Serving,
        &serving_shape,
        &serving_key,
    )?;
    let names = [&client, &serving].map(|c| c.metadata.name.clone().unwrap_or_default());
    let binding =
        Patch::Merge(json!({"metadata": {"annotations": {"autonode-bench/binding": id}}}));
    let (post, patch) = (PostParams::default(), PatchParams::default());
    let mut signed = signed.subscribe();
    let started = Instant::now();
    let (bound, client, serving) = tokio::join!(
        claims.patch(claim, &patch, &binding),
        csrs.create(&post, &client),
        csrs.create(&post, &serving),
    );
    bound?;
    client?;
    serving?;
    let (client, serving) = tokio::join!(approve(csrs, &names[0]), approve(csrs, &names[1]));
    client?;
    serving?;
    wait_signed(&mut signed, &names).await?;
    Ok(started.elapsed())
}

/// A CSR object as a kubelet or the server creates it, labelled for the
/// bench's watch.
fn bench_csr(
    name: &str,
    purpose: Purpose,
    shape: &CsrShape,
    key: &rcgen::KeyPair,
) -> Result<CertificateSigningRequest> {
    Ok(CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(BARE_LABEL.to_string(), "true".to_string())].into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(shape.csr(key)?.into_bytes()),
            signer_name: purpose.signer().into(),
            usages: Some(csr::usages_for(purpose).map(String::from).to_vec()),
            ..Default::default()
        },
        status: None,
    })
}

async fn approve(api: &Api<CertificateSigningRequest>, name: &str) -> Result<()> {
    let approval = json!({"status": CertificateSigningRequestStatus {
        conditions: Some(vec![CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some("BenchApproved".into()),
            message: Some("autonode-bench: approved by the bench itself".into()),
            ..Default::default()
        }]),
        certificate: None,
    }});
    api.patch_approval(name, &PatchParams::default(), &Patch::Merge(&approval))
        .await?;
    Ok(())
}

/// Waits until every CSR in `names` has been signed.
async fn wait_signed(
    signed: &mut tokio::sync::broadcast::Receiver<String>,
    names: &[String],
) -> Result<()> {
    let mut left: Vec<&String> = names.iter().collect();
    tokio::time::timeout(Duration::from_secs(30), async {
        while !left.is_empty() {
            let name = signed.recv().await?;
            left.retain(|n| **n != name);
        }
        anyhow::Ok(())
    })
    .await
    .with_context(|| format!("CSRs {names:?} not signed within 30s"))?
}

/// Whether `AUTONODE_BENCH_TRACE` asks for each run's timings.
fn trace() -> bool {
    std::env::var_os("AUTONODE_BENCH_TRACE").is_some()
}

/// Label on the bench's own CSRs (the bare path and the join's writes).
const BARE_LABEL: &str = "autonode-bench/bare";

/// One watch over the bench's own CSRs: sends the name of each as it is
/// signed.
fn watch_signed(api: Api<CertificateSigningRequest>) -> tokio::sync::broadcast::Sender<String> {
    use kube::runtime::{watcher, WatchStreamExt};
    let (tx, _) = tokio::sync::broadcast::channel(64);
    let sender = tx.clone();
    tokio::spawn(async move {
        let config = watcher::Config::default().labels(&format!("{BARE_LABEL}=true"));
        let stream = watcher(api, config).default_backoff().applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let Ok(csr) = event else { continue };
            let issued = csr
                .status
                .as_ref()
                .and_then(|s| s.certificate.as_ref())
                .is_some_and(|c| !c.0.is_empty());
            if issued {
                let _ = sender.send(csr.metadata.name.unwrap_or_default());
            }
        }
    });
    tx
}

/// `count` joins at once on a fresh control plane and server.
async fn burst(count: usize, hostile: bool, results: &mut Map<String, Value>) -> Result<()> {
    let world = World::start().await?;
    let prefix = if hostile { "hostile_burst" } else { "burst" };
    let admin = world.cp.admin().await?;
    // The class the NodeClaims name exists, as it does under Karpenter:
    // without it every join would also GET it from the API server.
    karpenter::create_custom_nodeclass(&admin, "default", &node::user_data(&world)).await?;
    let prepared = Instant::now();
    // Karpenter's part, a few at a time: NodeClaim, instance, providerID.
    let instances: Vec<Instance> = futures::stream::iter(0..count)
        .map(|_| {
            let (admin, cloud) = (admin.clone(), &world.cloud);
            async move {
                let claim = format!("burst-{}", unique());
                karpenter::create_nodeclaim(&admin, &claim, "default").await?;
                let built = Instance::builder()
                    .account_id(ACCOUNT)
                    .region(REGION)
                    .build();
                let instance = cloud.launch(built);
                karpenter::set_provider_id(&admin, &claim, &instance.provider_id()).await?;
                anyhow::Ok(instance)
            }
        })
        .buffer_unordered(LAUNCH_CONCURRENCY)
        .try_collect()
        .await?;
    // What each agent would send: its keys, CSRs and signed document.
    let ca = world.cloud.ca().clone();
    let requests = tokio::task::spawn_blocking(move || {
        instances
            .iter()
            .map(|instance| joiner::honest_request(instance, &ca, &NodeKeys::generate()?))
            .collect::<Result<Vec<JoinRequest>>>()
    })
    .await??;
    // The server's NodeClaim watch has seen the last providerID by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!(
        "  {count} instances, NodeClaims and requests ready in {:.1}s",
        prepared.elapsed().as_secs_f64()
    );

    let pid = world.server.pid();
    let cpu_before = cpu_seconds(pid)?;
    let cp_pids = world.cp.pids();
    let cp_before = cp_pids.map(|p| cpu_seconds(p).unwrap_or(0.0));
    let client = JoinClient::new(world.server.url(), world.server.ca_pem())?;
    let foreign = Answers::default();
    let attackers = match hostile {
        true => attack(&world, &foreign)?,
        false => Attackers::default(),
    };
    let started = Instant::now();
    let joins = requests.into_iter().enumerate().map(|(machine, request)| {
        let client = client.clone();
        tokio::spawn(async move { client.join_like_agent(machine, &request).await })
    });
    let outcomes = futures::future::join_all(joins).await;
    let seconds = started.elapsed().as_secs_f64();
    drop(attackers);
    let server_cpu = cpu_seconds(pid)? - cpu_before;
    // Where else the machine's cores went: etcd, kube-apiserver, kcm.
    for ((name, pid), before) in ["etcd", "apiserver", "kcm"]
        .iter()
        .zip(cp_pids)
        .zip(cp_before)
    {
        let used = cpu_seconds(pid).unwrap_or(before) - before;
        results.insert(format!("{prefix}_{name}_cpu_s"), round(used, 1).into());
    }

    let (mut granted, mut failures, mut busy) = (Vec::new(), 0usize, 0u32);
    let mut first_failure = None;
    for outcome in outcomes {
        match outcome? {
            Ok(done) => {
                busy += done.busy_answers;
                granted.push(done.elapsed);
            }
            Err(e) => {
                failures += 1;
                first_failure.get_or_insert(format!("{e:#}"));
            }
        }
    }
    if let Some(e) = &first_failure {
        eprintln!("  first failure: {e}");
    }
    let peak_rss = vm_hwm_bytes(pid)?;
    keep_logs(&world, prefix)?;
    let mut put = |name: &str, value: Value| results.insert(format!("{prefix}_{name}"), value);
    put("nodes", granted.len().into());
    put("seconds", round(seconds, 1).into());
    put("failures", failures.into());
    put("503_answers", busy.into());
    put(
        "join_p50_ms",
        round(ms(percentile(&granted, 0.5)), 1).into(),
    );
    put(
        "join_max_ms",
        round(ms(percentile(&granted, 1.0)), 1).into(),
    );
    put("server_cpu_s", round(server_cpu, 1).into());
    if hostile {
        let foreign = std::mem::take(&mut *foreign.lock().map_err(|_| anyhow!("poisoned"))?);
        let refused = foreign.iter().filter(|(status, _)| *status == 403).count();
        put("foreign_answers", foreign.len().into());
        put("foreign_refused", refused.into());
        put("server_peak_rss_bytes", peak_rss.into());
    } else {
        results.insert("server_peak_rss_bytes".into(), peak_rss.into());
    }
    Ok(())
}

/// Slow bodies (a source's worth, from 127.0.0.2) and documents of an
/// account the server does not allow (16 callers, from 127.0.0.3), beside
/// the burst: what `--hostile` measures the burst under.
fn attack(world: &World, answers: &Answers) -> Result<Attackers> {
    let mut attackers = Attackers::default();
    let (url, ca) = (world.server.url(), world.server.ca_pem());
    let slow = hostile::client_from(ca, hostile::OTHER_SOURCE)?;
    attackers.slow_bodies(&slow, url, 64);
    let foreign = Instance::builder()
        .account_id("999999999999")
        .region(REGION)
        .build();
    let foreign = joiner::honest_request(&foreign, world.cloud.ca(), &NodeKeys::generate()?)?;
    let stream = hostile::client_from(ca, IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)))?;
    for _ in 0..16 {
        attackers.repeat(&stream, url, &foreign, answers)?;
    }
    Ok(attackers)
}

use autonode_tests::joiner::Https;

/// The join protocol with the agent's retry rules: 429 and 5xx again after
/// `max(backoff, Retry-After)`, anything else final. Each machine speaks
/// from a loopback address of its own among [`SOURCES`], as machines in a
/// VPC have addresses of their own: the server's per-source limits see a
/// fleet, not one client.
#[derive(Clone)]
struct JoinClient {
    clients: Arc<Vec<HttpClient<Https, hostile::Body>>>,
    url: Arc<str>,
}

/// How many source addresses (127.0.1.1 on) the burst's machines use.
const SOURCES: u8 = 250;

struct Granted {
    elapsed: Duration,
    busy_answers: u32,
}

impl JoinClient {
    fn new(base: &str, ca_pem: &str) -> Result<Self> {
        let clients = (1..=SOURCES)
            .map(|i| hostile::client_from(ca_pem, IpAddr::V4(Ipv4Addr::new(127, 0, 1, i))))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            clients: Arc::new(clients),
            url: format!("{}{JOIN_PATH}", base.trim_end_matches('/')).into(),
        })
    }

    async fn join_like_agent(&self, machine: usize, request: &JoinRequest) -> Result<Granted> {
        let body = Bytes::from(serde_json::to_vec(request)?);
        let started = Instant::now();
        let mut busy_answers = 0;
        for attempt in 1u32.. {
            let (status, retry_after, text) = match self.post(machine, body.clone()).await {
                Ok(answer) => answer,
                Err(e) => (0, None, format!("{e:#}")),
            };
            if status == 200 {
                let response: JoinResponse = serde_json::from_str(&text)?;
                ensure!(
                    response.client_certificate.contains("BEGIN CERTIFICATE")
                        && response.serving_certificate.contains("BEGIN CERTIFICATE"),
                    "granted without certificates"
                );
                return Ok(Granted {
                    elapsed: started.elapsed(),
                    busy_answers,
                });
            }
            let transient = status == 0 || status == 429 || status >= 500;
            ensure!(transient, "HTTP {status}: {text}");
            if status == 503 {
                busy_answers += 1;
            }
            // The agent's RetryPolicy::JOIN: 1 s doubling to 30 s, up to
            // half of it jittered away, never sooner than Retry-After.
            let backoff =
                Duration::from_secs(1 << (attempt - 1).min(5)).min(Duration::from_secs(30));
            let delay = backoff
                .mul_f64(1.0 - 0.5 * rand::random::<f64>())
                .max(retry_after.unwrap_or_default());
            if started.elapsed() + delay > BURST_DEADLINE {
                bail!("gave up after {attempt} attempts: HTTP {status}: {text}");
            }
            tokio::time::sleep(delay).await;
        }
        unreachable!("the loop returns or bails")
    }

    async fn post(&self, machine: usize, body: Bytes) -> Result<(u16, Option<Duration>, String)> {
        let request = hyper::Request::post(&*self.url)
            .header("content-type", "application/json")
            .body(Full::new(body).boxed())?;
        let client = &self.clients[machine % self.clients.len()];
        let response = tokio::time::timeout(Duration::from_secs(60), client.request(request))
            .await
            .context("no answer within 60s")??;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
            .map(Duration::from_secs);
        let body = response.into_body().collect().await?.to_bytes();
        Ok((
            status,
            retry_after,
            String::from_utf8_lossy(&body).into_owned(),
        ))
    }
}

/// The server's steps of a join, as its `join_step_duration_seconds`
/// histogram labels them.
const JOIN_STEPS: [&str; 4] = ["attest", "ec2", "prepare", "certificates"];

/// The server's /metrics text.
async fn server_metrics(world: &World) -> Result<String> {
    let url = format!("{}/metrics", world.server.metrics_url());
    Ok(autonode_tests::server::http_get(&url).await?.1)
}

/// The value of the sample named exactly `name` (with its labels).
fn metric(text: &str, name: &str) -> Result<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .with_context(|| format!("no {name} in /metrics"))
}

/// With `$AUTONODE_BENCH_LOGS` set to a directory, copies the server's and
/// the control plane's logs there (for finding where the time goes).
fn keep_logs(world: &World, phase: &str) -> Result<()> {
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
fn percentile(values: &[Duration], p: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

/// Peak resident set of a live process.
fn vm_hwm_bytes(pid: u32) -> Result<u64> {
    autonode_tests::process::status_bytes(pid, "VmHWM:")
}

/// User + system CPU time of a live process so far.
fn cpu_seconds(pid: u32) -> Result<f64> {
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

/// nproc, CPU model and memory of this machine.
fn machine() -> Value {
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

/// The results as a Markdown table (what the README quotes).
fn table(results: &Value) -> String {
    let get = |key: &str| results.get(key).cloned().unwrap_or(Value::Null);
    let num = |key: &str| match get(key) {
        Value::Null => "–".to_string(),
        Value::Number(n) => thousands(&n.to_string()),
        other => other.to_string(),
    };
    let mib = |key: &str| {
        get(key)
            .as_f64()
            .map_or("–".into(), |b| format!("{:.1} MiB", b / 1048576.0))
    };
    let m = get("machine");
    let mut out = format!(
        "\nMachine: {} × {}, {:.0} GiB, Linux {}; Kubernetes {}\n\n",
        m["nproc"],
        m["cpu_model"].as_str().unwrap_or("?"),
        m["memory_bytes"].as_f64().unwrap_or(0.0) / 1073741824.0,
        m["kernel"].as_str().unwrap_or("?"),
        get("kubernetes").as_str().unwrap_or("?"),
    );
    let rows: Vec<(String, String)> = vec![
        (
            format!(
                "agent join p50 / p99 ({} joins, one at a time)",
                num("joins")
            ),
            format!("{} / {} ms", num("join_p50_ms"), num("join_p99_ms")),
        ),
        (
            "agent start to exit p50 (kubelet started, reports sent)".into(),
            format!("{} ms", num("agent_exit_p50_ms")),
        ),
        (
            format!("bare kubelet CSR p50 / p99 ({} CSRs)", num("bare_csrs")),
            format!("{} / {} ms", num("bare_csr_p50_ms"), num("bare_csr_p99_ms")),
        ),
        ("join / bare CSR (p50)".into(), num("join_vs_bare_ratio")),
        (
            "the join's API writes alone p50 (bind ∥ 2 CSRs, 2 approvals, 2 signatures)".into(),
            format!(
                "{} ms ({} × bare)",
                num("join_writes_p50_ms"),
                num("join_writes_vs_bare_ratio")
            ),
        ),
        (
            "join / its API writes alone (p50)".into(),
            num("join_vs_join_writes_ratio"),
        ),
        (
            "server's part of a join (mean, its histogram)".into(),
            format!("{} ms", num("join_server_mean_ms")),
        ),
        (
            format!("… of which {}", JOIN_STEPS.join(" / ")),
            format!(
                "{} ms",
                JOIN_STEPS
                    .map(|step| get("join_server_steps_mean_ms")[step].to_string())
                    .join(" / ")
            ),
        ),
        (
            format!("burst: {} joins at once", num("burst_nodes")),
            format!(
                "{} s, {} failed, {} answers 503",
                num("burst_seconds"),
                num("burst_failures"),
                num("burst_503_answers")
            ),
        ),
        (
            "burst: CPU of etcd / kube-apiserver / kcm".into(),
            format!(
                "{} / {} / {} s",
                num("burst_etcd_cpu_s"),
                num("burst_apiserver_cpu_s"),
                num("burst_kcm_cpu_s")
            ),
        ),
        (
            "burst: server CPU / peak RSS".into(),
            format!(
                "{} s / {}",
                num("burst_server_cpu_s"),
                mib("server_peak_rss_bytes")
            ),
        ),
        (
            "hostile burst: the same beside 64 slow bodies and 16 foreign-document streams".into(),
            format!(
                "{} s, {} failed, {} answers 503",
                num("hostile_burst_seconds"),
                num("hostile_burst_failures"),
                num("hostile_burst_503_answers")
            ),
        ),
        (
            "hostile burst: foreign documents answered / refused 403".into(),
            format!(
                "{} / {}",
                num("hostile_burst_foreign_answers"),
                num("hostile_burst_foreign_refused")
            ),
        ),
        (
            "hostile burst: server CPU / peak RSS".into(),
            format!(
                "{} s / {}",
                num("hostile_burst_server_cpu_s"),
                mib("hostile_burst_server_peak_rss_bytes")
            ),
        ),
        (
            "identity verifications / s (one core)".into(),
            num("iid_verify_per_s"),
        ),
        (
            "openssl rsa2048 verify / s (same core)".into(),
            num("openssl_rsa2048_verify_per_s"),
        ),
        ("identity / openssl".into(), num("iid_vs_openssl_ratio")),
        (
            "agent binary (static)".into(),
            format!(
                "{} bytes ({})",
                num("agent_size_bytes"),
                mib("agent_size_bytes")
            ),
        ),
        (
            "agent peak RSS / CPU per join".into(),
            format!(
                "{} / {} ms",
                mib("agent_peak_rss_bytes"),
                num("agent_cpu_ms")
            ),
        ),
    ];
    out.push_str("| measure | result |\n|---|---|\n");
    for (measure, result) in rows {
        out.push_str(&format!("| {measure} | {result} |\n"));
    }
    out
}

/// `12345.6` → `12,345.6`.
fn thousands(number: &str) -> String {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    let digits: Vec<char> = int.chars().collect();
    let mut out = String::new();
    for (i, c) in digits.iter().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 && c.is_ascii_digit() {
            out.push(',');
        }
        out.push(*c);
    }
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    out
}
