//! Faults the system must survive, against the real control plane: the
//! server killed in the middle of a burst, kube-apiserver gone for twenty
//! seconds, the agent killed in every phase, and callers that hold
//! connections open or send too much.
//!
//! The load driver retries connection errors and 503 the way the agent
//! does (bounded); the assertions are about outcomes, never about speed:
//! every node joins, every CSR autonode made is approved once, signed and
//! belongs to a node that got that certificate, keys survive a crash.

use anyhow::{bail, ensure, Context, Result};
use autonode_shared::protocol::{JoinRequest, JoinResponse, JOIN_PATH};
use autonode_tests::callers::joiner::{self, Answer, Joiner, NodeKeys};
use autonode_tests::cloud::fakecloud::Instance;
use autonode_tests::harness::poll::{self, OnTimeout, Seen};
use autonode_tests::karpenter::standin;
use autonode_tests::machines::node::{self, launch_machine, SimulatedNode};
use autonode_tests::network::blip::Blip;
use autonode_tests::server::world::{cloud_settings, World};
use autonode_tests::server::{http_get, Setup, TestServer};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, ListParams};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long one join attempt may take (a join waits for two signatures).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(45);
/// Pause between attempts, as the server's `Retry-After` would have it
/// (shortened: the driver is not one machine but hundreds).
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Server flags for tests whose hundreds of machines all connect from
/// 127.0.0.1: without them the per-source caps would take them for one NAT
/// gateway and ration them, which is not what these tests are about
/// (`hostile` is).
fn distinct_machines() -> Vec<String> {
    vec![
        "--max-connections-per-source=0".into(),
        "--max-handshakes-per-source=0".into(),
        "--max-joins-per-source=0".into(),
    ]
}

/// What the load driver saw, across all its joins.
#[derive(Default)]
struct Tally {
    granted: AtomicUsize,
    unavailable: AtomicUsize,
    connection_errors: AtomicUsize,
}

/// Joins like the agent does: connection errors, timeouts, 429 and 503 are
/// retried until `budget` is spent; a refusal is final.
async fn join_retrying(
    joiner: &Joiner,
    request: &JoinRequest,
    tally: &Tally,
    budget: Duration,
) -> Result<JoinResponse> {
    let deadline = Instant::now() + budget;
    let mut last = String::from("no attempt");
    while Instant::now() < deadline {
        match tokio::time::timeout(ATTEMPT_TIMEOUT, joiner.join(request)).await {
            Ok(Ok(Answer::Granted(response))) => {
                tally.granted.fetch_add(1, Ordering::SeqCst);
                return Ok(*response);
            }
            Ok(Ok(Answer::Refused(status @ (429 | 503), body))) => {
                tally.unavailable.fetch_add(1, Ordering::SeqCst);
                last = format!("{status} {body:?}");
            }
            Ok(Ok(Answer::Refused(status, body))) => bail!("refused: {status} {body:?}"),
            Ok(Err(e)) => {
                tally.connection_errors.fetch_add(1, Ordering::SeqCst);
                last = format!("{e:#}");
            }
            Err(_) => last = format!("no answer within {ATTEMPT_TIMEOUT:?}"),
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
    bail!("not joined within {budget:?}; last: {last}")
}

/// A launched machine and the request its agent would send.
struct Launched {
    claim: String,
    instance: Instance,
    request: JoinRequest,
}

/// Plays Karpenter for `count` machines (a few at a time).
async fn launch_many(world: &World, count: usize) -> Result<Vec<Launched>> {
    futures::stream::iter(0..count)
        .map(|_| async {
            let (claim, instance) = world.launch(|i| i).await?;
            let keys = NodeKeys::generate()?;
            let request = joiner::honest_request(&instance, world.cloud.ca(), &keys)?;
            anyhow::Ok(Launched {
                claim,
                instance,
                request,
            })
        })
        .buffer_unordered(8)
        .try_collect()
        .await
}

/// Starts every join at once; each retries within `budget`.
fn start_burst(
    world: &World,
    machines: &[Launched],
    tally: &Arc<Tally>,
    budget: Duration,
) -> Vec<tokio::task::JoinHandle<Result<JoinResponse>>> {
    machines
        .iter()
        .map(|m| {
            let (joiner, request, tally) = (world.joiner.clone(), m.request.clone(), tally.clone());
            tokio::spawn(async move { join_retrying(&joiner, &request, &tally, budget).await })
        })
        .collect()
}

/// Waits (bounded) until the driver has `count` grants.
async fn until_granted(tally: &Tally, count: usize) -> Result<()> {
    poll::until(
        &format!("{count} joins granted"),
        Duration::from_secs(60),
        Duration::from_millis(20),
        || async { Ok((tally.granted.load(Ordering::SeqCst) >= count).then_some(())) },
    )
    .await
}

/// Every machine's answer, by instance id; all must have joined, as
/// themselves.
async fn collect(
    machines: &[Launched],
    joins: Vec<tokio::task::JoinHandle<Result<JoinResponse>>>,
) -> Result<BTreeMap<String, JoinResponse>> {
    let mut joined = BTreeMap::new();
    for (machine, join) in machines.iter().zip(joins) {
        let response = join
            .await?
            .with_context(|| format!("{} never joined", machine.instance.instance_id))?;
        assert_eq!(response.node_name, machine.instance.private_dns_name);
        joined.insert(machine.instance.instance_id.clone(), response);
    }
    Ok(joined)
}

/// No CSR approved twice, none left pending, none orphaned: autonode's
/// CSRs are exactly one client and one serving CSR per joined node, each
/// with one Approved condition (ours), each signed, and the certificate is
/// the one that node was given.
async fn assert_csrs_clean(world: &World, joined: &BTreeMap<String, JoinResponse>) -> Result<()> {
    let api: Api<CertificateSigningRequest> = Api::all(world.cp.admin().await?);
    let csrs = api
        .list(&ListParams::default().labels("autonode.dev/managed=true"))
        .await?
        .items;
    let mut purposes = BTreeSet::new();
    for csr in &csrs {
        let name = csr.metadata.name.clone().unwrap_or_default();
        let instance = csr
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("autonode.dev/instance-id"))
            .with_context(|| format!("{name} has no instance label"))?;
        let response = joined
            .get(instance)
            .with_context(|| format!("orphan: {name} belongs to no joined node"))?;
        let status = csr.status.clone().unwrap_or_default();
        let approvals: Vec<_> = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.type_ == "Approved")
            .collect();
        assert_eq!(approvals.len(), 1, "{name} approved {}×", approvals.len());
        assert_eq!(approvals[0].reason.as_deref(), Some("AutonodeAttested"));
        let certificate = status
            .certificate
            .map(|c| String::from_utf8_lossy(&c.0).into_owned())
            .with_context(|| format!("{name} is still pending"))?;
        let given = match csr.spec.signer_name.as_str() {
            "kubernetes.io/kube-apiserver-client-kubelet" => &response.client_certificate,
            "kubernetes.io/kubelet-serving" => &response.serving_certificate,
            other => bail!("{name} has signer {other}"),
        };
        assert_eq!(
            certificate.trim(),
            given.trim(),
            "{name}: not the certificate its node was given"
        );
        assert!(
            purposes.insert((instance.clone(), csr.spec.signer_name.clone())),
            "{name}: a second CSR for the same node and purpose"
        );
    }
    assert_eq!(csrs.len(), 2 * joined.len(), "two CSRs per node");
    Ok(())
}

/// The server's log without colours.
fn plain_log(world: &World) -> String {
    let log = world.server.log();
    let mut plain = String::with_capacity(log.len());
    let mut rest = log.as_str();
    while let Some(at) = rest.find("\x1b[") {
        plain.push_str(&rest[..at]);
        rest = &rest[at + 2..];
        let end = rest
            .find(|c: char| c.is_ascii_alphabetic())
            .map_or(rest.len(), |e| e + 1);
        rest = &rest[end..];
    }
    plain.push_str(rest);
    plain
}

/// `key=value` (value possibly quoted) from a text log line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    let value = line[start..].split_whitespace().next()?;
    Some(value.trim_matches('"'))
}

/// How often the server granted `claim`'s join: (joined, resumed).
fn grants(log: &str, claim: &str) -> (usize, usize) {
    let results: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("join granted") && field(l, "nodeclaim") == Some(claim))
        .filter_map(|l| field(l, "result"))
        .collect();
    (
        results.iter().filter(|r| **r == "joined").count(),
        results.iter().filter(|r| **r == "resumed").count(),
    )
}

/// Every node's binding was written once: one "joined" grant at most (the
/// server may be killed between the binding and its log line), and at
/// least one grant in all.
fn assert_granted_once(log: &str, machines: &[Launched]) {
    for m in machines {
        let (joined, resumed) = grants(log, &m.claim);
        assert!(joined <= 1, "{}: joined {joined} times", m.claim);
        assert!(joined + resumed >= 1, "{}: never granted", m.claim);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_burst_restarts_and_every_node_joins() -> Result<()> {
    const NODES: usize = 200;
    let world = World::start_with(&distinct_machines()).await?;
    let machines = launch_many(&world, NODES).await?;
    let tally = Arc::new(Tally::default());
    let joins = start_burst(&world, &machines, &tally, Duration::from_secs(120));

    until_granted(&tally, NODES / 5).await?;
    world.server.kill();
    let before_kill = tally.granted.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Joins arrive while the new replica lists its caches; it must still
    // turn ready within restart's 30 s (it once stayed 503 for good: only
    // one of the tasks waiting for the first list was ever woken).
    world.server.restart().await?;

    let joined = collect(&machines, joins).await?;
    assert_eq!(joined.len(), NODES);
    assert!(
        before_kill < NODES && tally.connection_errors.load(Ordering::SeqCst) > 0,
        "the kill did not cut into the burst ({before_kill} granted before it)"
    );
    assert_csrs_clean(&world, &joined).await?;
    assert_granted_once(&plain_log(&world), &machines);
    // The binding on each NodeClaim is the key the node joined with.
    let claims = standin::nodeclaims(&world.cp.admin().await?);
    for m in &machines {
        let annotations = claims.get(&m.claim).await?.metadata.annotations;
        assert!(
            annotations.is_some_and(|a| a.contains_key("autonode.dev/binding")),
            "{}: no binding",
            m.claim
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_wait_out_an_apiserver_outage_and_then_complete() -> Result<()> {
    const NODES: usize = 50;
    const LATE: usize = 10;
    const OUTAGE: Duration = Duration::from_secs(20);
    // The agent's deadline in the tests' userData (tests/src/machines/node.rs) and
    // the outage, plus what the real kube-controller-manager takes to sign
    // again: its CSR watch backs off while the API server is away (client-go
    // waits up to 30 s, doubled by jitter, and the restarted API server
    // answers 403 for a moment while its RBAC caches fill), and a join that
    // asked before then waits out one `--csr-timeout` (the harness's 30 s)
    // before its retry. Seen: a CSR created 3 s after the restart still
    // unsigned 33 s later. A real agent's default deadline is 10 minutes.
    const KCM_REWATCH: Duration = Duration::from_secs(60);
    const SIGNING_WAIT: Duration = Duration::from_secs(30);
    const BUDGET: Duration = Duration::from_secs(60 + 20)
        .saturating_add(KCM_REWATCH)
        .saturating_add(SIGNING_WAIT);
    let world = World::start_with(&distinct_machines()).await?;
    let machines = launch_many(&world, NODES).await?;
    let tally = Arc::new(Tally::default());
    // Most machines ask at once; the last few only once the API server is
    // gone (they were launched before: Karpenter's part needs the API).
    let mut joins = start_burst(&world, &machines[..NODES - LATE], &tally, BUDGET);

    until_granted(&tally, NODES / 5).await?;
    world.cp.stop_apiserver();
    let stopped = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    joins.extend(start_burst(
        &world,
        &machines[NODES - LATE..],
        &tally,
        BUDGET,
    ));
    // A replica that cannot see the cluster says so, to be taken out of
    // its Service.
    let readyz = format!("{}/readyz", world.server.metrics_url());
    poll::until(
        "503 from /readyz",
        (OUTAGE - Duration::from_secs(2)).saturating_sub(stopped.elapsed()),
        Duration::from_millis(200),
        || async { Ok((http_get(&readyz).await?.0 == 503).then_some(())) },
    )
    .await
    .on_timeout(|| "; /readyz stayed 200 while the API server was down".into())?;
    tokio::time::sleep(OUTAGE.saturating_sub(stopped.elapsed())).await;
    let during = tally.granted.load(Ordering::SeqCst);
    world.cp.start_apiserver().await?;
    eprintln!(
        "apiserver back after {:?}; {during} joins granted so far",
        stopped.elapsed()
    );

    let joined = collect(&machines, joins).await?;
    eprintln!(
        "all {NODES} joined {:?} after the apiserver stopped; 503s: {}, connection errors: {}",
        stopped.elapsed(),
        tally.unavailable.load(Ordering::SeqCst),
        tally.connection_errors.load(Ordering::SeqCst)
    );
    assert!(during < NODES, "the outage did not cut into the burst");
    assert!(
        tally.unavailable.load(Ordering::SeqCst) >= LATE,
        "joins asked during the outage are told to come back (503)"
    );
    assert_eq!(
        tally.connection_errors.load(Ordering::SeqCst),
        0,
        "the server itself must stay up"
    );
    let log = plain_log(&world);
    assert!(log.contains("join could not complete now"), "no 503 logged");
    assert_csrs_clean(&world, &joined).await?;
    assert_granted_once(&log, &machines);
    let (status, _) = http_get(&format!("{}/readyz", world.server.metrics_url())).await?;
    assert_eq!(status, 200, "the server is ready again");

    // Its watches came back: a join made now is served from fresh caches.
    let late = launch_many(&world, 1).await?;
    let tally = Tally::default();
    join_retrying(
        &world.joiner,
        &late[0].request,
        &tally,
        Duration::from_secs(30),
    )
    .await?;
    assert_eq!(tally.unavailable.load(Ordering::SeqCst), 0);
    Ok(())
}

/// Where to kill the agent: the line it logs there.
const KILL_POINTS: [&str; 6] = [
    "phase=identity started",
    "phase=keys succeeded",
    "phase=join started",
    "phase=join succeeded",
    "phase=apply started",
    "phase=start started",
];

/// Runs the agent on `node` and SIGKILLs it as soon as it logs `point`.
/// `true` if it died of the kill (it may have finished first).
async fn run_agent_until(node: &SimulatedNode, point: &str) -> Result<(bool, String)> {
    use std::os::unix::process::ExitStatusExt;
    use tokio::io::AsyncBufReadExt;
    let mut command = node.netns.command(node::agent_binary()?);
    command
        .args(node.agent_args())
        .env_remove(node::IMDS_ENDPOINT_ENV)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().context("starting autonode-agent")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut seen = String::new();
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains(point) {
                child.start_kill()?;
                break;
            }
        }
        anyhow::Ok(())
    })
    .await;
    if read.is_err() {
        child.start_kill()?;
    }
    let status = child.wait().await?;
    read.context("the agent never got there")??;
    Ok((status.signal() == Some(9), seen))
}

/// The agent's key files, if written.
fn keys(node: &SimulatedNode) -> [Option<Vec<u8>>; 2] {
    ["client.key", "serving.key"]
        .map(|f| std::fs::read(node.path(&format!("/var/lib/autonode/{f}"))).ok())
}

/// CSR names and uids for an instance.
async fn csr_ids(world: &World, instance: &Instance) -> Result<BTreeSet<(String, String)>> {
    Ok(world
        .csrs_for(instance)
        .await?
        .into_iter()
        .map(|c| {
            (
                c.metadata.name.unwrap_or_default(),
                c.metadata.uid.unwrap_or_default(),
            )
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_in_any_phase_resumes_with_the_same_keys() -> Result<()> {
    let world = World::start().await?;
    let mut machines = Vec::new();
    for point in KILL_POINTS {
        let (claim, node) = launch_machine(&world).await?;
        let instance = node.instance.clone();
        // systemctl takes a moment, as the real one does: the kill at
        // "start" lands while kubelet is being started.
        let fake = node.root.path().join("fake-systemctl");
        let recorder = std::fs::read_to_string(&fake)?;
        std::fs::write(
            &fake,
            recorder.replace("#!/bin/sh\n", "#!/bin/sh\nsleep 0.5\n"),
        )?;

        let (killed, first) = run_agent_until(&node, point).await?;
        let keys_then = keys(&node);
        let csrs_then = csr_ids(&world, &instance).await?;

        let rerun = node.run_agent(&[]).await?;
        let stderr = String::from_utf8_lossy(&rerun.stderr);
        assert_eq!(
            rerun.status.code(),
            Some(0),
            "{point}: the rerun failed:\n{first}\n---\n{stderr}"
        );
        eprintln!("{point}: killed={killed}; rerun:\n{stderr}");
        let keys_now = keys(&node);
        for (then, now) in keys_then.iter().zip(&keys_now) {
            assert!(now.is_some(), "{point}: a key file is missing");
            if then.is_some() {
                assert_eq!(then, now, "{point}: the rerun changed a key");
            }
        }
        let state = std::fs::read_to_string(node.path("/var/lib/autonode/state.json"))?;
        assert!(state.contains("\"start\""), "{point}: state {state}");
        assert!(node.systemctl_calls().contains("kubelet.service"));
        let csrs_now = csr_ids(&world, &instance).await?;
        assert_eq!(csrs_now.len(), 2, "{point}: {csrs_now:?}");
        if !csrs_then.is_empty() {
            assert_eq!(csrs_then, csrs_now, "{point}: new CSR objects");
        }
        if killed && point == "phase=join succeeded" {
            assert!(
                stderr.contains("saved answer") || stderr.contains("already joined"),
                "{point}: the rerun asked again:\n{stderr}"
            );
        }
        machines.push((point, claim, node));
    }
    // No join the server began is counted as still running.
    let (_, metrics) = http_get(&format!("{}/metrics", world.server.metrics_url())).await?;
    assert!(
        metrics.contains("autonode_joins_in_flight 0"),
        "joins left in flight:\n{metrics}"
    );
    let log = plain_log(&world);
    for (point, claim, _) in &machines {
        let (joined, resumed) = grants(&log, claim);
        eprintln!("{point}: joined {joined}, resumed {resumed}");
        assert_eq!(joined, 1, "{point}: {claim} joined {joined} times");
    }
    Ok(())
}

/// A TLS client over a blocking socket, trusting only the server's CA.
fn tls_connect(
    addr: &str,
    ca_pem: &str,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let config = autonode_tests::callers::joiner::tls_config(ca_pem)?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?.to_owned();
    let mut connection = rustls::ClientConnection::new(Arc::new(config), name)?;
    let mut socket = TcpStream::connect(addr)?;
    socket.set_read_timeout(Some(Duration::from_secs(20)))?;
    socket.set_write_timeout(Some(Duration::from_secs(20)))?;
    while connection.is_handshaking() {
        connection.complete_io(&mut socket)?;
    }
    Ok(rustls::StreamOwned::new(connection, socket))
}

/// Sends `head`, then a header byte a second, until the server hangs up.
/// How long it kept the connection.
fn slow_headers(addr: &str, ca_pem: &str, head: &str, limit: Duration) -> Result<Duration> {
    let started = Instant::now();
    let mut stream = tls_connect(addr, ca_pem)?;
    stream.sock.set_read_timeout(Some(Duration::from_secs(1)))?;
    stream.write_all(head.as_bytes())?;
    let mut buf = [0u8; 1024];
    while started.elapsed() < limit {
        if stream
            .write_all(b"x")
            .and_then(|()| stream.flush())
            .is_err()
        {
            return Ok(started.elapsed());
        }
        match stream.read(&mut buf) {
            Ok(0) => return Ok(started.elapsed()),
            // An answer (408/400) and a close are as good as a close.
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return Ok(started.elapsed()),
        }
    }
    bail!("still open after {limit:?}")
}

/// Sends (or tries to) a body of `size` bytes, with a Content-Length or
/// chunked. (bytes sent, the status line if one came back).
fn oversized(
    addr: &str,
    ca_pem: &str,
    size: usize,
    chunked: bool,
) -> Result<(usize, Option<String>)> {
    let mut stream = tls_connect(addr, ca_pem)?;
    let length = if chunked {
        "Transfer-Encoding: chunked".to_string()
    } else {
        format!("Content-Length: {size}")
    };
    let head = format!(
        "POST {JOIN_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes())?;
    let data = vec![b'['; 64 * 1024];
    let chunk = if chunked {
        [format!("{:x}\r\n", data.len()).as_bytes(), &data, b"\r\n"].concat()
    } else {
        data.clone()
    };
    let mut sent = 0;
    while sent < size {
        if stream
            .write_all(&chunk)
            .and_then(|()| stream.flush())
            .is_err()
        {
            break;
        }
        sent += data.len();
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    Ok((sent, text.lines().next().map(str::to_string)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_and_oversized_bodies_are_cut_off_and_memory_stays_bounded() -> Result<()> {
    const SILENT: usize = 100;
    const HALF_HELLO: usize = 100;
    const SLOW_HEADERS: usize = 100;
    const OVERSIZED: usize = 20;
    const CLAIMED: usize = 50 * 1024 * 1024;
    const CLOSED_WITHIN: Duration = Duration::from_secs(40);
    let world = World::start_with(&distinct_machines()).await?;
    let addr = world
        .server
        .url()
        .trim_start_matches("https://")
        .to_string();
    let ca = world.server.ca_pem().to_string();

    // Warm up (first join's allocations), then take the baseline.
    let warm = launch_many(&world, 1).await?;
    world.joiner.join(&warm[0].request).await?.granted();
    let baseline = world.server.rss_bytes()?;

    // Slowloris: connections that never say anything, that stop half-way
    // through a ClientHello, and that send their headers a byte a second.
    let mut raw = Vec::new();
    for i in 0..SILENT + HALF_HELLO {
        let mut socket = tokio::net::TcpStream::connect(&addr).await?;
        if i >= SILENT {
            use tokio::io::AsyncWriteExt;
            socket
                .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03])
                .await?;
        }
        raw.push(socket);
    }
    let opened = Instant::now();
    let silent_closed = raw
        .into_iter()
        .map(|mut socket| {
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut buf = [0u8; 256];
                let read = tokio::time::timeout(CLOSED_WITHIN, async {
                    loop {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    }
                })
                .await;
                read.is_ok()
            })
        })
        .collect::<Vec<_>>();
    let head = format!("POST {JOIN_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
    let slow = (0..SLOW_HEADERS)
        .map(|_| {
            let (addr, ca, head) = (addr.clone(), ca.clone(), head.clone());
            tokio::task::spawn_blocking(move || slow_headers(&addr, &ca, &head, CLOSED_WITHIN))
        })
        .collect::<Vec<_>>();
    // Bodies far over the limit, while the slow ones hang on.
    let big = (0..OVERSIZED)
        .map(|i| {
            let (addr, ca) = (addr.clone(), ca.clone());
            tokio::task::spawn_blocking(move || oversized(&addr, &ca, CLAIMED, i % 2 == 1))
        })
        .collect::<Vec<_>>();

    // Honest joins go through meanwhile.
    let honest = launch_many(&world, 5).await?;
    let tally = Arc::new(Tally::default());
    let joins = start_burst(&world, &honest, &tally, Duration::from_secs(60));
    let joined = collect(&honest, joins).await?;
    assert_eq!(joined.len(), 5);

    for result in futures::future::join_all(big).await {
        let (sent, status) = result??;
        eprintln!("oversized body: {} KiB sent, answer {status:?}", sent >> 10);
        // The server stops reading at the limit: what it took is the limit
        // plus socket buffers, not the body.
        assert!(
            status.as_deref().is_some_and(|s| s.contains(" 413 ")) || sent < CLAIMED / 4,
            "a {CLAIMED}-byte body was taken: sent {sent}, answer {status:?}"
        );
    }
    let peak = world.server.rss_bytes()?;
    let mut kept = Vec::new();
    for result in futures::future::join_all(slow).await {
        kept.push(result??);
    }
    for closed in futures::future::join_all(silent_closed).await {
        assert!(
            closed?,
            "a silent connection still open after {CLOSED_WITHIN:?}"
        );
    }
    eprintln!(
        "stalled connections closed {:?} after opening; slow headers kept {:?}..{:?}; RSS {} MiB → {} MiB",
        opened.elapsed(),
        kept.iter().min(),
        kept.iter().max(),
        baseline >> 20,
        peak >> 20
    );
    let after = world.server.rss_bytes()?;
    let growth = peak.max(after).saturating_sub(baseline);
    assert!(
        growth < 50 * 1024 * 1024,
        "RSS grew by {} MiB under attack",
        growth >> 20
    );

    // Still serving.
    let last = launch_many(&world, 1).await?;
    world.joiner.join(&last[0].request).await?.granted();
    Ok(())
}

/// A blip between the server and the API server (every connection cut and
/// none possible for 2 s, both ends fine): the caches list again, `/readyz`
/// comes back and joins work. kube-runtime's watcher alone resumes such a
/// watch from its last resourceVersion without listing, which gives no sign
/// that it is back: the NodeClaim cache stayed marked stale, and the
/// replica unready, until some later 410.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blip_to_the_api_server_is_survived() -> Result<()> {
    let world = World::start().await?;
    let blip = Blip::start(world.cp.url()).await?;
    let settings = cloud_settings(&world.cloud, &world.ec2);
    let api_url = blip.url();
    let setup = Setup {
        api_url: Some(&api_url),
        ..Setup::default()
    };
    let server = TestServer::launch(&world.cp, &settings, &setup).await?;
    let readyz = format!("{}/readyz", server.metrics_url());
    for round in 1..=3 {
        let failed_before = watch_failures(&server);
        let cut = Instant::now();
        ensure!(blip.outage(Duration::from_secs(2)).await > 0, "nothing cut");
        // Both waits end 20 s after the cut.
        let left = || Duration::from_secs(20).saturating_sub(cut.elapsed());
        poll::until(
            "watch failure logged",
            left(),
            Duration::from_millis(50),
            || async { Ok((watch_failures(&server) > failed_before).then_some(())) },
        )
        .await
        .on_timeout(|| format!("; round {round}: the cut went unnoticed:\n{}", server.log()))?;
        poll::until(
            "200 from /readyz",
            left(),
            Duration::from_millis(100),
            || async {
                let (status, body) = http_get(&readyz).await?;
                let saw = format!("round {round}: not ready 20 s after the cut: {body}");
                Ok(Seen((status == 200).then_some(()), saw))
            },
        )
        .await?;
    }
    let joiner = Joiner::new(server.url(), server.ca_pem())?;
    let (_, instance) = world.launch(|i| i).await?;
    let request = joiner::honest_request(&instance, world.cloud.ca(), &NodeKeys::generate()?)?;
    joiner.join(&request).await?.granted();
    Ok(())
}

/// How many times the server has logged a cache's watch failing.
fn watch_failures(server: &TestServer) -> usize {
    server
        .log()
        .lines()
        .filter(|l| l.contains("watch failed"))
        .count()
}

/// A leader cut off from the API server (every byte between them held,
/// nothing closed: its renewals hang unanswered) stops leading before the
/// other replica takes the Lease over: never two leaders. Without the
/// renew deadline the cut-off replica went on leading while its renewal
/// hung, after the other had taken the Lease. Then, let through again, it
/// stays a follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_stops_leading_before_another_takes_over() -> Result<()>
{
    let lease = vec!["--leader-lease=6".to_string()];
    let world = World::start_with(&lease).await?;
    let settings = cloud_settings(&world.cloud, &world.ec2);
    let blip = Blip::start(world.cp.url()).await?;
    let api_url = blip.url();
    let cut_off = TestServer::launch(
        &world.cp,
        &settings,
        &Setup {
            api_url: Some(&api_url),
            extra_args: &lease,
            ..Setup::default()
        },
    )
    .await?;
    // The world's server gives the Lease up to the replica behind the
    // relay, then the other starts.
    world.server.kill();
    poll::until(
        "the replica behind the relay leads",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { Ok(cut_off.leads().await?.then_some(())) },
    )
    .await?;
    let other = TestServer::start(&world.cp, &settings, &lease).await?;
    ensure!(!other.leads().await?, "two leaders before the cut");

    blip.hold();
    let held = Instant::now();
    let (mut stopped, mut took_over) = (None, None);
    while took_over.is_none() {
        ensure!(
            held.elapsed() < Duration::from_secs(30),
            "no takeover 30 s after the cut; the cut-off replica stopped leading after {stopped:?}"
        );
        let (first, second) = (cut_off.leads().await?, other.leads().await?);
        if !first && stopped.is_none() {
            stopped = Some(held.elapsed());
        }
        if second {
            took_over = Some(held.elapsed());
        }
        ensure!(
            !(first && second),
            "two leaders {:?} after the cut: the cut-off replica still leads",
            held.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("cut-off replica stopped leading {stopped:?} after the cut, the other took over at {took_over:?}");

    blip.release();
    // Three renewals' time (the Lease's 6 s): it has seen the other's Lease.
    tokio::time::sleep(Duration::from_secs(6)).await;
    ensure!(
        (cut_off.leads().await?, other.leads().await?) == (false, true),
        "let through again, the cut-off replica took the Lease back"
    );
    Ok(())
}
