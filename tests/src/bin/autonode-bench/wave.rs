//! The renewal wave (`--renewal-wave N`): every node of a fleet asks for
//! new certificates at once, as after a CA rotation or a mass reboot.
//!
//! On a fresh control plane and server, N machines join through the join
//! protocol (the burst's machines and client, a few hundred at a time), so
//! each NodeClaim carries its binding and each node has its keys and
//! certificates; each node then registers its Node object as itself, with
//! the client certificate the join gave it. Then, at once, every node
//! creates a client renewal and a serving CSR, as kubelet creates them
//! (requested by `system:node:<name>` in `system:nodes`, with the node's
//! own credential, fresh keys), and the bench watches them until the
//! server has approved all of them, or none more for [`STALL`]: then the
//! rest are left pending, each with the reason the server logged.
//!
//! Measured: the time until the last approval, approvals a second, each
//! CSR's time to approval, the server's CPU and its API requests per
//! approval (from the API server's audit log), its EC2 calls, and the API
//! server's priority and fairness rejections of the server's
//! ServiceAccount (the `service-accounts` flow schema) during the wave.
//!
//! Beside it (`--renewal-wave-stock N`, on a fresh control plane without
//! autonode): the stock alternatives on the same machine.
//! kube-controller-manager's `csrapproving` controller at its default
//! client limits (20 requests a second, burst 30) approving the same
//! client renewals (a node may renew its own client certificate: the
//! `selfnodeclient` role bound to `system:nodes`, as kubeadm binds it), and
//! a one-worker serving approver: the bench's own, fed by a watch,
//! approving each serving CSR it is shown without a check, as the cluster
//! admin (exempt from priority and fairness) and without a client-side
//! limit. That is the stock serving path's best case: the approvers one
//! would deploy (kubelet-csr-approver, kubelet-rubber-stamp) check more
//! and run one worker at their client's default limit.

use crate::burst::{machines, JoinClient, Machine};
use crate::floor::{again, approve, bench_csr, BARE_LABEL};
use crate::measure::{cpu_seconds, keep_logs, ms, percentile, round, vm_hwm_bytes, Cores};
use crate::options::BURST_DEADLINE;
use crate::requests;
use anyhow::{Context, Result};
use autonode_shared::csr::Purpose;
use autonode_shared::protocol::JoinResponse;
use autonode_tests::callers::joiner::CsrShape;
use autonode_tests::karpenter::standin as karpenter;
use autonode_tests::kube::controlplane::{unique, ControlPlane};
use autonode_tests::machines::node;
use autonode_tests::server::world::World;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Joins in flight at once while the fleet is made (not measured).
const JOINS_AT_ONCE: usize = 256;
/// Nodes registering (client made, Node created) at once beforehand.
const NODES_AT_ONCE: usize = 64;
/// The wave is over when no CSR has been approved for this long: the rest
/// are left pending.
const STALL: Duration = Duration::from_secs(60);

/// The renewal wave of `count` nodes, then the stock alternatives with
/// `stock` nodes (none when 0).
pub(crate) async fn wave(
    count: usize,
    stock: usize,
    results: &mut Map<String, Value>,
) -> Result<()> {
    autonode_wave(count, results).await?;
    if stock > 0 {
        eprintln!("== renewal wave of {stock} nodes, the stock way");
        stock_wave(stock, results).await?;
    }
    Ok(())
}

/// One node of the wave: its kubelet's client (its own credential) and
/// the two CSRs it is about to create.
struct Renewing {
    csrs: Api<CertificateSigningRequest>,
    client: CertificateSigningRequest,
    serving: CertificateSigningRequest,
}

impl Renewing {
    /// The node's client renewal and serving CSR, with fresh keys, as
    /// kubelet asks for them.
    fn csrs(node: &str, serving: &CsrShape) -> Result<[CertificateSigningRequest; 2]> {
        let id = unique();
        let (client_key, serving_key) = (rcgen::KeyPair::generate()?, rcgen::KeyPair::generate()?);
        Ok([
            bench_csr(
                &format!("wave-client-{id}"),
                Purpose::Client,
                &CsrShape::client(node),
                &client_key,
            )?,
            bench_csr(
                &format!("wave-serving-{id}"),
                Purpose::Serving,
                serving,
                &serving_key,
            )?,
        ])
    }

    fn names(&self) -> [String; 2] {
        [&self.client, &self.serving].map(|c| c.metadata.name.clone().unwrap_or_default())
    }

    /// Creates the client renewal, then the serving CSR (again after 429,
    /// as client-go does), on the node's one connection as kubelet's two
    /// certificate managers share its one HTTP/2 connection (kube-rs speaks
    /// HTTP/1.1: both at once would be two connections a node, and 10,000
    /// nodes more file descriptors than a process here may have). Each
    /// one's name and when, from `started`, its create returned.
    async fn renew(self, retried: &AtomicU64, started: Instant) -> Result<[(String, Duration); 2]> {
        let post = PostParams::default();
        let create = |csr: &CertificateSigningRequest| {
            let name = csr.metadata.name.clone().unwrap_or_default();
            let (csrs, csr, post) = (&self.csrs, csr.clone(), &post);
            async move {
                again(retried, || csrs.create(post, &csr)).await?;
                anyhow::Ok((name, started.elapsed()))
            }
        };
        let client = create(&self.client).await?;
        Ok([client, create(&self.serving).await?])
    }
}

async fn autonode_wave(count: usize, results: &mut Map<String, Value>) -> Result<()> {
    let world = World::start().await?;
    let admin = world.cp.admin().await?;
    karpenter::create_custom_nodeclass(&admin, "default", &node::user_data(&world)).await?;
    let fleet = join_fleet(&world, &admin, count).await?;
    let names: Vec<String> = fleet.iter().flat_map(Renewing::names).collect();
    let seen = Seen::watch(Api::all(admin.clone()));
    // The feedback controller's writes for the new Nodes are over: the
    // wave's requests are the wave's.
    settle(&world.cp).await?;

    let audited = requests::mark(&world.cp)?;
    let rejected_before = apf_rejected(&admin).await?;
    let pid = world.server.pid();
    let cpu_before = cpu_seconds(pid)?;
    let cores = Cores::from_now(&world.cp);
    let ec2_before = world.ec2.calls();
    let retried = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let created = create_all(fleet, &retried, started);
    let outcome = seen.until_approved(&names, started).await;
    let server_cpu = cpu_seconds(pid)? - cpu_before;
    let ec2_calls = world.ec2.calls() - ec2_before;
    cores.record("renewal_wave", results);
    let created = created.await??;
    let failed = names.len() - created.times.len();
    let waited = seen.since_created(&created.times, started);
    let signed_s = seen.until_signed(&names, started).await;
    let rejected = apf_rejected(&admin).await? - rejected_before;
    // The approvals' last requests are in the audit log by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counted = requests::since(&world.cp, &audited)?;
    let reasons = pending_reasons(&world.server.log(), &outcome.pending);
    keep_logs(&world, "renewal_wave")?;

    let approved = outcome.approved.len();
    eprintln!(
        "  {} CSRs of {count} nodes: {approved} approved in {:.1}s ({:.0}/s), {} left pending {reasons:?}, \
         {failed} creates failed, {} retried after 429; all created at {:.1}s, signed at {signed_s:?}",
        names.len(),
        outcome.seconds,
        outcome.per_second(),
        outcome.pending.len(),
        retried.load(Ordering::Relaxed),
        created.last.as_secs_f64(),
    );
    let key = |name: &str| format!("renewal_wave_{name}");
    results.insert(key("nodes"), count.into());
    results.insert(key("csrs"), names.len().into());
    results.insert(key("approved"), approved.into());
    results.insert(key("seconds"), round(outcome.seconds, 1).into());
    results.insert(key("per_s"), round(outcome.per_second(), 1).into());
    results.insert(
        key("created_s"),
        round(created.last.as_secs_f64(), 1).into(),
    );
    results.insert(
        key("approval_p50_ms"),
        round(ms(percentile(&waited, 0.5)), 0).into(),
    );
    results.insert(
        key("approval_p99_ms"),
        round(ms(percentile(&waited, 0.99)), 0).into(),
    );
    results.insert(
        key("approval_max_ms"),
        round(ms(percentile(&waited, 1.0)), 0).into(),
    );
    results.insert(key("signed_s"), signed_s.map(|s| round(s, 1)).into());
    results.insert(key("pending"), outcome.pending.len().into());
    results.insert(key("pending_reasons"), json!(reasons));
    results.insert(key("create_failures"), failed.into());
    results.insert(
        key("create_429_retries"),
        retried.load(Ordering::Relaxed).into(),
    );
    results.insert(key("server_cpu_s"), round(server_cpu, 1).into());
    results.insert(
        key("server_cpu_per_approval_ms"),
        round(server_cpu * 1000.0 / approved.max(1) as f64, 2).into(),
    );
    results.insert(key("server_peak_rss_bytes"), vm_hwm_bytes(pid)?.into());
    results.insert(key("ec2_calls"), ec2_calls.into());
    results.insert(key("apf_rejected"), rejected.into());
    results.insert(
        key("api_requests_per_approval"),
        per_approval(&counted, approved),
    );
    Ok(())
}

/// The CSRs created, each with when its create returned, and the last.
struct Created {
    times: HashMap<String, Duration>,
    last: Duration,
}

/// Every node's two creates at once, each node a task of its own.
fn create_all(
    fleet: Vec<Renewing>,
    retried: &Arc<AtomicU64>,
    started: Instant,
) -> tokio::task::JoinHandle<Result<Created>> {
    let creates: Vec<_> = fleet
        .into_iter()
        .map(|node| {
            let retried = retried.clone();
            tokio::spawn(async move { node.renew(&retried, started).await })
        })
        .collect();
    tokio::spawn(async move {
        let mut created = Created {
            times: HashMap::new(),
            last: Duration::ZERO,
        };
        let mut failed = 0;
        for outcome in futures::future::join_all(creates).await {
            match outcome? {
                Ok(pair) => {
                    for (name, at) in pair {
                        created.last = created.last.max(at);
                        created.times.insert(name, at);
                    }
                }
                Err(e) => {
                    if failed == 0 {
                        eprintln!("  first failed create: {e:#}");
                    }
                    failed += 1;
                }
            }
        }
        Ok(created)
    })
}

/// Waits until the server has made no request (Lease renewals aside) for
/// a few seconds, as the API server's audit log shows.
async fn settle(cp: &ControlPlane) -> Result<()> {
    let quiet = Duration::from_secs(4);
    let mut mark = requests::mark(cp)?;
    for _ in 0..30 {
        tokio::time::sleep(quiet).await;
        let made = requests::since(cp, &mark)?;
        if made.joins.is_empty() {
            return Ok(());
        }
        mark = requests::mark(cp)?;
    }
    eprintln!("  the server did not settle before the wave");
    Ok(())
}

/// `count` machines joined (a few hundred at a time: how fast is the
/// burst's question, not this one's), each then registering its Node as
/// itself. Their kubelets' clients and CSRs, ready for the wave.
async fn join_fleet(world: &World, admin: &kube::Client, count: usize) -> Result<Vec<Renewing>> {
    let made = Instant::now();
    let machines = machines(world, admin, count).await?;
    let client = JoinClient::new(world.server.url(), world.server.ca_pem())?;
    let deadline = BURST_DEADLINE.mul_f64((count as f64 / 1000.0).max(1.0));
    let joined: Vec<(Machine, JoinResponse)> =
        futures::stream::iter(machines.into_iter().enumerate())
            .map(|(i, machine)| {
                let client = client.clone();
                async move {
                    let granted = client
                        .join_like_agent(i, &machine.request, deadline)
                        .await?;
                    anyhow::Ok((machine, granted.response))
                }
            })
            .buffer_unordered(JOINS_AT_ONCE)
            .try_collect()
            .await?;
    eprintln!("  {count} joined in {:.1}s", made.elapsed().as_secs_f64());
    let fleet = futures::stream::iter(joined)
        .map(|(machine, response)| async move {
            let kubelet = world.node_client(&response, &machine.keys).await?;
            let name = response.node_name;
            register(&kubelet, &name, &machine.instance.provider_id()).await?;
            let shape = CsrShape::serving(&machine.instance);
            let [client, serving] =
                tokio::task::spawn_blocking(move || Renewing::csrs(&name, &shape)).await??;
            anyhow::Ok(Renewing {
                csrs: Api::all(kubelet),
                client,
                serving,
            })
        })
        .buffer_unordered(NODES_AT_ONCE)
        .try_collect()
        .await?;
    eprintln!(
        "  … and registered their Nodes, {:.1}s in all",
        made.elapsed().as_secs_f64()
    );
    Ok(fleet)
}

/// The Node object kubelet registers, as the node.
async fn register(kubelet: &kube::Client, name: &str, provider_id: &str) -> Result<()> {
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
    Api::<Node>::all(kubelet.clone())
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("registering Node {name}"))?;
    Ok(())
}

/// When the bench's CSRs were seen approved and signed, from one watch
/// (the bench's label; the join's CSRs are not watched).
#[derive(Clone, Default)]
struct Seen {
    inner: Arc<Mutex<SeenTimes>>,
}

#[derive(Default)]
struct SeenTimes {
    approved: HashMap<String, Instant>,
    signed: HashMap<String, Instant>,
}

/// How a wave ended: each approved CSR's time from the wave's start, the
/// time of the last approval, and the CSRs left pending.
struct Outcome {
    approved: Vec<Duration>,
    seconds: f64,
    pending: Vec<String>,
}

impl Outcome {
    fn per_second(&self) -> f64 {
        self.approved.len() as f64 / self.seconds.max(0.001)
    }
}

impl Seen {
    /// Starts the watch (it ends with the runtime).
    fn watch(api: Api<CertificateSigningRequest>) -> Self {
        use kube::runtime::{watcher, WatchStreamExt};
        let seen = Self::default();
        let inner = seen.inner.clone();
        tokio::spawn(async move {
            let config = watcher::Config::default().labels(&format!("{BARE_LABEL}=true"));
            let stream = watcher(api, config).default_backoff().applied_objects();
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(csr) = event else { continue };
                let now = Instant::now();
                let status = csr.status.unwrap_or_default();
                let approved = status
                    .conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Approved" && c.status == "True");
                let signed = status.certificate.is_some_and(|c| !c.0.is_empty());
                let name = csr.metadata.name.unwrap_or_default();
                let mut times = inner.lock().unwrap_or_else(PoisonError::into_inner);
                if approved {
                    times.approved.entry(name.clone()).or_insert(now);
                }
                if signed {
                    times.signed.entry(name).or_insert(now);
                }
            }
        });
        seen
    }

    /// Waits until every one of `names` is approved, or none more is for
    /// [`STALL`].
    async fn until_approved(&self, names: &[String], started: Instant) -> Outcome {
        self.until(names, |t| &t.approved).await;
        let times = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let approved: Vec<Duration> = names
            .iter()
            .filter_map(|n| times.approved.get(n))
            .map(|at| at.saturating_duration_since(started))
            .collect();
        let pending = names
            .iter()
            .filter(|n| !times.approved.contains_key(*n))
            .cloned()
            .collect();
        let last = approved.iter().max().copied().unwrap_or_default();
        Outcome {
            approved,
            seconds: last.as_secs_f64(),
            pending,
        }
    }

    /// Each approved CSR's time from its create's return to its approval
    /// (`created`: from [`create_all`], as time since the wave's start).
    fn since_created(
        &self,
        created: &HashMap<String, Duration>,
        started: Instant,
    ) -> Vec<Duration> {
        let times = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        created
            .iter()
            .filter_map(|(name, at)| {
                let approved = times.approved.get(name)?;
                Some(approved.saturating_duration_since(started + *at))
            })
            .collect()
    }

    /// Seconds from `started` until every one of `names` was signed, or
    /// `None` when some were not (within [`STALL`] of the last).
    async fn until_signed(&self, names: &[String], started: Instant) -> Option<f64> {
        self.until(names, |t| &t.signed).await;
        let times = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let at: Option<Vec<&Instant>> = names.iter().map(|n| times.signed.get(n)).collect();
        let last = at?.into_iter().max()?;
        Some(last.saturating_duration_since(started).as_secs_f64())
    }

    /// Until all `names` are in the map `which` picks, or it has not grown
    /// for [`STALL`].
    async fn until(
        &self,
        names: &[String],
        which: impl Fn(&SeenTimes) -> &HashMap<String, Instant>,
    ) {
        let (mut last_count, mut last_change) = (usize::MAX, Instant::now());
        loop {
            let count = {
                let times = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
                let map = which(&times);
                names.iter().filter(|n| map.contains_key(*n)).count()
            };
            if count == names.len() {
                return;
            }
            if count != last_count {
                (last_count, last_change) = (count, Instant::now());
            } else if last_change.elapsed() > STALL {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Why the CSRs left pending were, as the server last logged it for each:
/// reason → count (one pass over the log, whatever its size).
fn pending_reasons(log: &str, pending: &[String]) -> BTreeMap<String, usize> {
    let mut last: HashMap<&str, &str> = HashMap::new();
    for line in log.lines().filter(|l| l.contains("left pending")) {
        if let (Some(csr), Some(reason)) = (field(line, "csr"), field(line, "reason")) {
            last.insert(csr, reason);
        }
    }
    let mut reasons = BTreeMap::new();
    for name in pending {
        let reason = last.get(name.as_str()).copied().unwrap_or("none logged");
        *reasons.entry(reason.to_string()).or_default() += 1;
    }
    reasons
}

/// The value of `name` in a log line, text (`name=value`, `name="value"`)
/// or JSON (`"name":"value"`).
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let (_, rest) = line
        .split_once(&format!("\"{name}\":\""))
        .or_else(|| line.split_once(&format!(" {name}=")))?;
    let rest = rest.trim_start_matches('"');
    rest.split(['"', ' ']).next()
}

/// The server's API requests per approval, by `verb resource`.
fn per_approval(counted: &requests::Counted, approved: usize) -> Value {
    let approvals = approved.max(1) as f64;
    let per = |n: u64| (n as f64 / approvals * 1000.0).round() / 1000.0;
    let by_request: Map<String, Value> = counted
        .joins
        .iter()
        .map(|(k, n)| (k.clone(), per(*n).into()))
        .collect();
    let background: Map<String, Value> = counted
        .background
        .iter()
        .map(|(k, n)| (k.clone(), (*n).into()))
        .collect();
    json!({
        "by_request": by_request,
        "total": per(counted.joins.values().sum()),
        "floor": {"patch certificatesigningrequests/approval": 1.0},
        "floor_total": 1.0,
        "background_in_run": background,
    })
}

/// Requests the API server's priority and fairness has rejected (429) of
/// the `service-accounts` flow schema, the server's, so far.
async fn apf_rejected(admin: &kube::Client) -> Result<u64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = admin.request_text(request).await?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_flowcontrol_rejected_requests_total{")
                && l.contains("flow_schema=\"service-accounts\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// The stock alternatives: `count` nodes' client renewals approved by
/// kube-controller-manager's `csrapproving` at its default client limits,
/// their serving CSRs by one worker.
async fn stock_wave(count: usize, results: &mut Map<String, Value>) -> Result<()> {
    let cp = ControlPlane::start_with_stock_approver_at_default_limits().await?;
    let admin = cp.admin().await?;
    grant_self_renewal(&admin).await?;
    let fleet: Vec<Renewing> = futures::stream::iter(0..count)
        .map(|_| {
            let cp = &cp;
            async move {
                let name = format!("ip-10-0-0-1.wave-{}.internal", unique());
                let kubelet = cp
                    .client_as(&format!("system:node:{name}"), Some("system:nodes"))
                    .await?;
                let [client, serving] = tokio::task::spawn_blocking(move || {
                    let shape = CsrShape {
                        dns: vec![name.clone()],
                        ips: vec![IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))],
                        ..CsrShape::client(&name)
                    };
                    Renewing::csrs(&name, &shape)
                })
                .await??;
                anyhow::Ok(Renewing {
                    csrs: Api::all(kubelet),
                    client,
                    serving,
                })
            }
        })
        .buffer_unordered(NODES_AT_ONCE)
        .try_collect()
        .await?;
    let client_names: Vec<String> = fleet.iter().map(|n| n.names()[0].clone()).collect();
    let serving_names: Vec<String> = fleet.iter().map(|n| n.names()[1].clone()).collect();
    let seen = Seen::watch(Api::all(admin.clone()));
    one_worker(Api::all(admin.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;

    let retried = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let created = create_all(fleet, &retried, started);
    let (client, serving) = tokio::join!(
        seen.until_approved(&client_names, started),
        seen.until_approved(&serving_names, started)
    );
    let failed = 2 * count - created.await??.times.len();
    keep_stock_logs(&cp)?;
    eprintln!(
        "  stock: {count} client renewals approved by kcm in {:.1}s ({:.1}/s, {} pending); \
         serving CSRs by one worker in {:.1}s ({:.1}/s, {} pending); {failed} creates failed",
        client.seconds,
        client.per_second(),
        client.pending.len(),
        serving.seconds,
        serving.per_second(),
        serving.pending.len(),
    );
    let key = |name: &str| format!("renewal_wave_stock_{name}");
    results.insert(key("nodes"), count.into());
    results.insert(key("client_seconds"), round(client.seconds, 1).into());
    results.insert(key("client_per_s"), round(client.per_second(), 1).into());
    results.insert(key("client_pending"), client.pending.len().into());
    results.insert(key("serving_seconds"), round(serving.seconds, 1).into());
    results.insert(key("serving_per_s"), round(serving.per_second(), 1).into());
    results.insert(key("serving_pending"), serving.pending.len().into());
    results.insert(key("create_failures"), failed.into());
    Ok(())
}

/// With `$AUTONODE_BENCH_LOGS` set, keeps the stock control plane's
/// kube-controller-manager and kube-apiserver logs there.
fn keep_stock_logs(cp: &ControlPlane) -> Result<()> {
    let Some(dir) = std::env::var_os("AUTONODE_BENCH_LOGS") else {
        return Ok(());
    };
    let dir = std::path::PathBuf::from(dir).join("renewal_wave_stock");
    std::fs::create_dir_all(&dir)?;
    for name in ["kube-apiserver", "kube-controller-manager"] {
        let from = cp.dir().join(format!("{name}.log"));
        if from.exists() {
            std::fs::copy(&from, dir.join(format!("{name}.log")))?;
        }
    }
    Ok(())
}

/// What kubeadm binds for kubelet client certificate rotation: nodes may
/// have their own client renewals approved by kube-controller-manager.
async fn grant_self_renewal(admin: &kube::Client) -> Result<()> {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "bench-node-autoapprove-certificate-rotation"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
    }))?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .context("binding selfnodeclient to system:nodes")?;
    Ok(())
}

/// A serving-CSR approver with one worker: told of each undecided serving
/// CSR of the bench by a watch, it approves them one at a time, in the
/// order it hears of them. It ends with the runtime.
fn one_worker(api: Api<CertificateSigningRequest>) {
    use kube::runtime::{watcher, WatchStreamExt};
    let (queue, mut work) = tokio::sync::mpsc::unbounded_channel::<CertificateSigningRequest>();
    let watched = api.clone();
    tokio::spawn(async move {
        let config = watcher::Config::default()
            .labels(&format!("{BARE_LABEL}=true"))
            .fields(&format!("spec.signerName={}", Purpose::Serving.signer()));
        let stream = watcher(watched, config).default_backoff().applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let Ok(csr) = event else { continue };
            let undecided = csr
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_none_or(Vec::is_empty);
            if undecided && queue.send(csr).is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(csr) = work.recv().await {
            if let Err(e) = approve(&api, &csr).await {
                eprintln!("  the one-worker approver failed: {e:#}");
            }
        }
    });
}
