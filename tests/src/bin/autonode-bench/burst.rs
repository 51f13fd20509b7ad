//! Many joins at once over the join protocol, from a fleet of loopback
//! addresses, optionally beside hostile clients: throughput and the
//! server's memory under load.

use crate::floor::{join_writes, Signatures, Writes};
use crate::measure::{cpu_seconds, keep_logs, ms, percentile, round, vm_hwm_bytes, Cores};
use crate::options::{BURST_DEADLINE, LAUNCH_CONCURRENCY};
use crate::requests;
use anyhow::{anyhow, bail, ensure, Context, Result};
use autonode_shared::protocol::{JoinRequest, JoinResponse, JOIN_PATH, PATIENCE_HEADER};
use autonode_tests::callers::hostile::{self, Answers, Attackers};
use autonode_tests::callers::joiner::{self, NodeKeys};
use autonode_tests::cloud::fakecloud::Instance;
use autonode_tests::karpenter::standin as karpenter;
use autonode_tests::kube::controlplane::unique;
use autonode_tests::machines::node::{self};
use autonode_tests::server::server_user;
use autonode_tests::server::world::{World, ACCOUNT, REGION};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use kube::api::Api;
use serde_json::{Map, Value};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which burst: the clean one (beside its floor, the same machines'
/// API writes alone at once), the hostile one, or the large one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Clean,
    Hostile,
    Large,
}

impl Kind {
    /// The prefix of its keys in the results.
    fn prefix(self) -> &'static str {
        match self {
            Kind::Clean => "burst",
            Kind::Hostile => "hostile_burst",
            Kind::Large => "burst_large",
        }
    }
}

/// `count` joins at once on a fresh control plane and server.
pub(crate) async fn burst(
    count: usize,
    kind: Kind,
    results: &mut Map<String, Value>,
) -> Result<()> {
    let world = World::start().await?;
    let prefix = kind.prefix();
    let admin = world.cp.admin().await?;
    // The class the NodeClaims name exists, as it does under Karpenter:
    // without it every join would also GET it from the API server.
    karpenter::create_custom_nodeclass(&admin, "default", &node::user_data(&world)).await?;
    let requests = prepare(&world, &admin, count).await?;
    if kind == Kind::Clean {
        let alone = writes_alone(&world, &admin, count).await?;
        results.insert(
            "burst_writes_alone_s".into(),
            round(alone.seconds, 1).into(),
        );
        results.insert("burst_writes_alone_failures".into(), alone.failures.into());
        results.insert(
            "burst_writes_alone_429_retries".into(),
            alone.retries.into(),
        );
        // The joins' turn on a control plane as quiet as the floor's was.
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let audited = requests::mark(&world.cp)?;
    let hostile = kind == Kind::Hostile;
    let pid = world.server.pid();
    let cpu_before = cpu_seconds(pid)?;
    let cores = Cores::from_now(&world.cp);
    let client = JoinClient::new(world.server.url(), world.server.ca_pem())?;
    let foreign = Answers::default();
    let attackers = match hostile {
        true => attack(&world, &foreign)?,
        false => Attackers::default(),
    };
    let deadline = BURST_DEADLINE.mul_f64((count as f64 / 1000.0).max(1.0));
    let started = Instant::now();
    let joins = requests.into_iter().enumerate().map(|(machine, request)| {
        let client = client.clone();
        tokio::spawn(async move { client.join_like_agent(machine, &request, deadline).await })
    });
    let outcomes = futures::future::join_all(joins).await;
    let seconds = started.elapsed().as_secs_f64();
    drop(attackers);
    let server_cpu = cpu_seconds(pid)? - cpu_before;
    cores.record(prefix, results);

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
    let key = |name: &str| format!("{prefix}_{name}");
    results.insert(key("nodes"), granted.len().into());
    results.insert(key("seconds"), round(seconds, 1).into());
    results.insert(key("failures"), failures.into());
    results.insert(key("503_answers"), busy.into());
    results.insert(
        key("join_p50_ms"),
        round(ms(percentile(&granted, 0.5)), 1).into(),
    );
    results.insert(
        key("join_max_ms"),
        round(ms(percentile(&granted, 1.0)), 1).into(),
    );
    results.insert(key("server_cpu_s"), round(server_cpu, 1).into());
    results.insert(
        key("server_cpu_per_join_ms"),
        round(server_cpu * 1000.0 / count.max(1) as f64, 2).into(),
    );
    results.insert(key("server_peak_rss_bytes"), peak_rss.into());
    if kind == Kind::Clean {
        if let Some(alone) = results.get("burst_writes_alone_s").and_then(Value::as_f64) {
            let ratio = round(seconds / alone.max(0.001), 2);
            results.insert("burst_ratio".into(), ratio.into());
        }
        // What the joins asked of the API server, the feedback
        // controller's writes (a second after each join) included.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let counted = requests::since(&world.cp, &audited)?;
        results.insert(
            "burst_api_requests_per_join".into(),
            counted.per_join(count),
        );
    }
    if hostile {
        let foreign = std::mem::take(&mut *foreign.lock().map_err(|_| anyhow!("poisoned"))?);
        let refused = foreign.iter().filter(|(status, _)| *status == 403).count();
        results.insert(key("foreign_answers"), foreign.len().into());
        results.insert(key("foreign_refused"), refused.into());
    }
    if kind == Kind::Large {
        // Named by its size too, and against the clean burst of the run.
        results.insert(format!("burst_{count}_s"), round(seconds, 1).into());
        if let Some(clean) = results.get("burst_seconds").and_then(Value::as_f64) {
            let ratio = round(seconds / clean.max(0.001), 2);
            results.insert("burst_large_vs_burst_ratio".into(), ratio.into());
        }
    }
    if kind == Kind::Clean {
        // The key earlier results carry, for `tests/bench/compare`.
        results.insert("server_peak_rss_bytes".into(), peak_rss.into());
    }
    Ok(())
}

/// Karpenter's part for `count` machines, a few at a time (NodeClaim,
/// instance, providerID), and what each agent would send: its keys, CSRs
/// and signed document.
async fn prepare(world: &World, admin: &kube::Client, count: usize) -> Result<Vec<JoinRequest>> {
    let machines = machines(world, admin, count).await?;
    Ok(machines.into_iter().map(|m| m.request).collect())
}

/// A machine made ready to join: its instance, its keys and the request
/// its agent sends.
pub(crate) struct Machine {
    pub(crate) instance: Instance,
    pub(crate) request: JoinRequest,
    pub(crate) keys: NodeKeys,
}

/// Like [`prepare`], keeping each machine's instance and keys (for what
/// its kubelet does after the join).
pub(crate) async fn machines(
    world: &World,
    admin: &kube::Client,
    count: usize,
) -> Result<Vec<Machine>> {
    let prepared = Instant::now();
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
    let ca = world.cloud.ca().clone();
    let machines = tokio::task::spawn_blocking(move || {
        instances
            .into_iter()
            .map(|instance| {
                let keys = NodeKeys::generate()?;
                let request = joiner::honest_request(&instance, &ca, &keys)?;
                Ok(Machine {
                    instance,
                    request,
                    keys,
                })
            })
            .collect::<Result<Vec<Machine>>>()
    })
    .await??;
    // The server's NodeClaim watch has seen the last providerID by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!(
        "  {count} instances, NodeClaims and requests ready in {:.1}s",
        prepared.elapsed().as_secs_f64()
    );
    Ok(machines)
}

/// The floor of a burst: the join's API writes alone ([`join_writes`])
/// for `count` machines, all started at once, as the server's
/// ServiceAccount (so the API server's priority and fairness treats them
/// as it treats the server's), on NodeClaims no join asks for.
pub(crate) struct Alone {
    seconds: f64,
    failures: usize,
    retries: u64,
}

async fn writes_alone(world: &World, admin: &kube::Client, count: usize) -> Result<Alone> {
    let targets: Vec<String> = futures::stream::iter(0..count)
        .map(|_| {
            let admin = admin.clone();
            async move {
                let name = format!("writes-{}", unique());
                karpenter::create_nodeclaim(&admin, &name, "default").await?;
                anyhow::Ok(name)
            }
        })
        .buffer_unordered(LAUNCH_CONCURRENCY)
        .try_collect()
        .await?;
    let writes = tokio::task::spawn_blocking(move || {
        targets
            .iter()
            .map(|t| Writes::prepare(t))
            .collect::<Result<Vec<_>>>()
    })
    .await??;
    let client = world
        .cp
        .client_as(&server_user(), Some("system:serviceaccounts"))
        .await?;
    let (csrs, claims) = (Api::all(client.clone()), karpenter::nodeclaims(&client));
    let signatures = Signatures::watch(Api::all(admin.clone()));
    let retries = Arc::new(AtomicU64::new(0));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    let runs = writes.into_iter().map(|w| {
        let (csrs, claims, signatures, retries) = (
            csrs.clone(),
            claims.clone(),
            signatures.clone(),
            retries.clone(),
        );
        tokio::spawn(async move { join_writes(&csrs, &claims, &w, &signatures, &retries).await })
    });
    let outcomes = futures::future::join_all(runs).await;
    let seconds = started.elapsed().as_secs_f64();
    let mut failures = 0;
    for outcome in outcomes {
        if let Err(e) = outcome? {
            if failures == 0 {
                eprintln!("  first failure of the writes alone: {e:#}");
            }
            failures += 1;
        }
    }
    let retries = retries.load(Ordering::Relaxed);
    eprintln!("  {count} machines' API writes alone, at once: {seconds:.1}s, {failures} failed, {retries} retried after 429");
    Ok(Alone {
        seconds,
        failures,
        retries,
    })
}

/// Slow bodies (a source's worth, from 127.0.0.2) and documents of an
/// account the server does not allow (16 callers, from 127.0.0.3), beside
/// the burst: what `--hostile` measures the burst under.
pub(crate) fn attack(world: &World, answers: &Answers) -> Result<Attackers> {
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

use autonode_tests::callers::joiner::Https;

/// The join protocol with the agent's retry rules: 429 and 5xx again after
/// `max(backoff, Retry-After)`, anything else final. Each machine speaks
/// from a loopback address of its own among [`SOURCES`], as machines in a
/// VPC have addresses of their own: the server's per-source limits see a
/// fleet, not one client.
#[derive(Clone)]
pub(crate) struct JoinClient {
    clients: Arc<Vec<HttpClient<Https, hostile::Body>>>,
    url: Arc<str>,
}

/// How many source addresses (127.0.1.1 on) the burst's machines use.
pub(crate) const SOURCES: u8 = 250;

pub(crate) struct Granted {
    elapsed: Duration,
    busy_answers: u32,
    /// The server's answer: the node's name and certificates.
    pub(crate) response: JoinResponse,
}

impl JoinClient {
    pub(crate) fn new(base: &str, ca_pem: &str) -> Result<Self> {
        let clients = (1..=SOURCES)
            .map(|i| hostile::client_from(ca_pem, IpAddr::V4(Ipv4Addr::new(127, 0, 1, i))))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            clients: Arc::new(clients),
            url: format!("{}{JOIN_PATH}", base.trim_end_matches('/')).into(),
        })
    }

    pub(crate) async fn join_like_agent(
        &self,
        machine: usize,
        request: &JoinRequest,
        deadline: Duration,
    ) -> Result<Granted> {
        let body = Bytes::from(serde_json::to_vec(request)?);
        let started = Instant::now();
        let mut busy_answers = 0;
        for attempt in 1u32.. {
            // Says how long it keeps trying, as agents since 0.3.0 do, with
            // the agent's default deadline (the bench's own may be longer).
            let patience = deadline
                .min(autonode_shared::contract::DEFAULT_DEADLINE)
                .saturating_sub(started.elapsed());
            let (status, retry_after, text) = match self.post(machine, body.clone(), patience).await
            {
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
                    response,
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
            if started.elapsed() + delay > deadline {
                bail!("gave up after {attempt} attempts: HTTP {status}: {text}");
            }
            tokio::time::sleep(delay).await;
        }
        unreachable!("the loop returns or bails")
    }

    async fn post(
        &self,
        machine: usize,
        body: Bytes,
        patience: Duration,
    ) -> Result<(u16, Option<Duration>, String)> {
        let request = hyper::Request::post(&*self.url)
            .header("content-type", "application/json")
            .header(PATIENCE_HEADER, patience.as_secs())
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
