//! A real Kubernetes control plane on loopback, one per test.
//!
//! etcd, kube-apiserver and kube-controller-manager (and kube-scheduler when
//! asked: [`ControlPlane::start_with_scheduler`]) of the version under test:
//! a release pinned under `tests/kube/` and built from the Go module proxy
//! by `tests/setup/build-kube` (the newest pinned by default, or
//! `AUTONODE_KUBE_VERSION`'s: [`crate::kube::version::under_test`]), or the
//! binaries in `AUTONODE_KUBE_BIN`. Flags that differ between versions are
//! chosen by the version each binary reports ([`apiserver_version_args`],
//! [`controller_manager_version_args`]). The control plane has
//! client-certificate authentication, `Node,RBAC` authorization, the
//! `NodeRestriction` admission plugin, service-account keys, and
//! kube-controller-manager's csrsigning controller signing with a CA made for
//! this run. The real Karpenter CRDs are installed before [`ControlPlane::start`]
//! returns.
//!
//! Everything lives in one temporary directory and a handful of child
//! processes, all owned by the [`ControlPlane`] value: dropping it (at the
//! end of a test, or while a test panics) kills the processes and removes
//! the directory. The children also run under `setpriv --pdeathsig KILL`, so
//! a test process killed outright (a nextest timeout) takes them with it.

use crate::harness::pki::{Ca, CertPair};
use crate::harness::process::Daemon;
use crate::kube::version::KubeVersion;
use anyhow::{bail, Context, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tempfile::TempDir;

/// The Karpenter v1.14.1 CRDs, byte-exact, as the project ships them.
pub use autonode_shared::karpenter_crds::CRDS as KARPENTER_CRDS;

const START_TIMEOUT: Duration = Duration::from_secs(90);

/// A running control plane. Dropping it stops everything and removes its files.
pub struct ControlPlane {
    // Field order is drop order: processes die before their directory goes.
    scheduler: Option<Daemon>,
    controller_manager: Daemon,
    apiserver: Daemon,
    etcd: Daemon,
    ca: Ca,
    url: String,
    admin_kubeconfig: PathBuf,
    version: KubeVersion,
    dir: TempDir,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager, waits until
    /// the API answers, and installs the Karpenter CRDs.
    pub async fn start() -> Result<Self> {
        Self::start_reachable_at(&[]).await
    }

    /// Like [`ControlPlane::start`], with the API server's certificate also
    /// valid for `extra_ips`: the addresses a machine that is not this host
    /// (a VM) uses to reach it through a forward.
    pub async fn start_reachable_at(extra_ips: &[IpAddr]) -> Result<Self> {
        let cp = Self::start_bare(extra_ips, Extra::None).await?;
        install_crds(&cp.admin().await?, &KARPENTER_CRDS).await?;
        Ok(cp)
    }

    /// Like [`ControlPlane::start`], with kube-scheduler running too (as
    /// `system:kube-scheduler`), for tests where pods must be placed on
    /// nodes (a real Karpenter provisions for pods the scheduler could not
    /// place). Off by default: most tests schedule nothing, and it is one
    /// more process per test.
    pub async fn start_with_scheduler() -> Result<Self> {
        let cp = Self::start_bare(&[], Extra::Scheduler).await?;
        install_crds(&cp.admin().await?, &KARPENTER_CRDS).await?;
        Ok(cp)
    }

    /// For the real Karpenter: kube-scheduler running (Karpenter provisions
    /// for the pods it could not place), kube-controller-manager's node
    /// lifecycle controller too (it lifts the `node.kubernetes.io/not-ready`
    /// taint the API server puts on every new Node once the Node is Ready,
    /// which Karpenter waits for before it calls a node Initialized; nodes
    /// must then renew their Lease), and no CRDs (the controller's own, from
    /// its module, are installed by `karpenter::real`).
    pub async fn start_for_karpenter() -> Result<Self> {
        Self::start_bare(&[], Extra::SchedulerAndNodeLifecycle).await
    }

    /// Like [`ControlPlane::start_for_karpenter`], the API server's
    /// certificate also valid for `extra_ips` (where VMs reach it).
    pub async fn start_for_karpenter_reachable_at(extra_ips: &[IpAddr]) -> Result<Self> {
        Self::start_bare(extra_ips, Extra::SchedulerAndNodeLifecycle).await
    }

    /// Without the Karpenter CRDs, and with kube-controller-manager's
    /// `csrapproving` controller, which approves node client CSRs whose
    /// requester may create them (kubelet's stock TLS bootstrap): for the
    /// benchmark of the path a fleet would join by without autonode. Off
    /// everywhere else, so that no test's CSR is approved by anyone but the
    /// code under test.
    pub async fn start_with_stock_approver() -> Result<Self> {
        Self::start_bare(&[], Extra::StockApprover).await
    }

    /// Like [`ControlPlane::start_with_stock_approver`], with
    /// kube-controller-manager's client limits left at their defaults (20
    /// requests a second, burst 30), as a cluster that has not raised them
    /// runs its `csrapproving` controller: the renewal wave's stock
    /// alternative.
    pub async fn start_with_stock_approver_at_default_limits() -> Result<Self> {
        Self::start_bare(&[], Extra::StockApproverDefaultLimits).await
    }

    /// Like [`ControlPlane::start`], without the Karpenter CRDs (for
    /// installing them some other way).
    pub async fn start_without_crds() -> Result<Self> {
        Self::start_bare(&[], Extra::None).await
    }

    async fn start_bare(extra_ips: &[IpAddr], extra: Extra) -> Result<Self> {
        let scheduler = matches!(extra, Extra::Scheduler | Extra::SchedulerAndNodeLifecycle);
        let bin = kube_bin_dir()?;
        let version = binary_version(&bin.join("kube-apiserver"))?;
        let kcm_version = binary_version(&bin.join("kube-controller-manager"))?;
        let dir = tempfile::Builder::new()
            .prefix("autonode-cp-")
            .tempdir()
            .context("creating control plane directory")?;
        let ca = Ca::new("autonode-test-cluster-ca")?;
        let files = Files::write(dir.path(), &ca, extra_ips)?;

        let etcd = start_etcd(&bin, dir.path())?;
        let admin_kubeconfig = dir.path().join("admin.kubeconfig");
        let kcm_kubeconfig = dir.path().join("kcm.kubeconfig");
        // A free port can be taken by another test's process before the
        // API server binds it (each nextest test is its own process, and
        // they choose ports independently): then it exits at once, and a
        // new port is tried.
        let mut attempts = 0;
        let (apiserver, url) = loop {
            attempts += 1;
            let api_port = free_port()?;
            let apiserver = start_apiserver(&bin, version, &files, &etcd, api_port)?;
            let url = format!("https://127.0.0.1:{api_port}");
            write_kubeconfig(&admin_kubeconfig, &url, ca.cert_pem(), &files.admin)?;
            write_kubeconfig(&kcm_kubeconfig, &url, ca.cert_pem(), &files.kcm)?;
            let client = kube_client(&admin_kubeconfig).await?;
            match wait_ready(&client, &apiserver).await {
                Ok(()) => break (apiserver, url),
                Err(_) if attempts < 3 && apiserver.log_tail(5).contains(PORT_TAKEN) => {
                    eprintln!("kube-apiserver: port {api_port} was taken meanwhile; another");
                }
                Err(e) => return Err(e),
            }
        };

        // On an early return, the locals drop in reverse order: processes
        // are killed before their directory is removed.
        let controller_manager =
            start_controller_manager(&bin, kcm_version, &files, &kcm_kubeconfig, extra)?;
        let scheduler = if scheduler {
            let kubeconfig = dir.path().join("scheduler.kubeconfig");
            write_kubeconfig(&kubeconfig, &url, ca.cert_pem(), &files.scheduler)?;
            Some(start_scheduler(&bin, &files, &kubeconfig)?)
        } else {
            None
        };
        Ok(Self {
            scheduler,
            controller_manager,
            apiserver,
            etcd,
            ca,
            url,
            admin_kubeconfig,
            version,
            dir,
        })
    }

    /// The version kube-apiserver reports: what the cluster's behaviour
    /// (APIs, admission) follows.
    pub fn version(&self) -> KubeVersion {
        self.version
    }

    /// The API server URL (`https://127.0.0.1:<port>`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster CA: it serves the API and signs every kubelet certificate.
    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// Path of a kubeconfig for `system:masters`.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// The control plane's private directory (logs, kubeconfigs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Process ids of etcd, kube-apiserver and kube-controller-manager.
    pub fn pids(&self) -> [u32; 3] {
        [
            self.etcd.pid(),
            self.apiserver.pid(),
            self.controller_manager.pid(),
        ]
    }

    /// Stops kube-apiserver (SIGKILL); etcd and kube-controller-manager
    /// keep running. Clients get connection errors until
    /// [`ControlPlane::start_apiserver`].
    pub fn stop_apiserver(&self) {
        self.apiserver.kill();
    }

    /// Starts kube-apiserver again with the same port, flags and etcd, and
    /// waits until it is ready.
    pub async fn start_apiserver(&self) -> Result<()> {
        self.apiserver.restart()?;
        wait_ready(&self.admin().await?, &self.apiserver).await
    }

    /// A client with cluster-admin rights.
    pub async fn admin(&self) -> Result<Client> {
        kube_client(&self.admin_kubeconfig).await
    }

    /// A client authenticated by a certificate this cluster's CA issues for
    /// `user` in `group`.
    pub async fn client_as(&self, user: &str, group: Option<&str>) -> Result<Client> {
        let pair = self.ca.client(user, group)?;
        self.client_with_cert(&pair).await
    }

    /// A client authenticated by the given certificate and key.
    pub async fn client_with_cert(&self, pair: &CertPair) -> Result<Client> {
        let path = self
            .dir
            .path()
            .join(format!("client-{}.kubeconfig", unique()));
        write_kubeconfig(&path, &self.url, self.ca.cert_pem(), pair)?;
        kube_client(&path).await
    }

    /// Writes a kubeconfig for `pair` at `path` (for processes under test).
    pub fn write_kubeconfig(&self, path: &Path, pair: &CertPair) -> Result<()> {
        write_kubeconfig(path, &self.url, self.ca.cert_pem(), pair)
    }

    /// The API server's audit events so far (writes to NodeClaims; status
    /// writes with the objects written and returned; the server's other
    /// writes), in
    /// the order it logged them.
    pub fn audit_events(&self) -> Result<Vec<serde_json::Value>> {
        let path = self.dir.path().join(AUDIT_LOG);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        // The last line may be half written.
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect())
    }

    /// The last lines of each component's log, for a failing test's output.
    pub fn log_tails(&self, lines: usize) -> String {
        [&self.etcd, &self.apiserver, &self.controller_manager]
            .into_iter()
            .chain(self.scheduler.as_ref())
            .map(|d| d.log_tail(lines))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // A test that fails by returning Err does not panic; set
        // AUTONODE_TEST_LOGS=1 to see the logs then too.
        if std::thread::panicking() || std::env::var_os("AUTONODE_TEST_LOGS").is_some() {
            eprintln!("control plane logs:\n{}", self.log_tails(40));
        }
    }
}

/// Where the Kubernetes binaries are: `AUTONODE_KUBE_BIN`, or the cache
/// `tests/setup/build-kube` fills for the version under test
/// ([`crate::kube::version::under_test`]).
pub fn kube_bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("AUTONODE_KUBE_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let version = crate::kube::version::under_test()?;
    let dir = crate::harness::cache::root()?.join(format!("kube-{version}"));
    if !dir.join("kube-apiserver").exists() {
        let bare = version.to_string();
        let bare = bare.trim_start_matches('v');
        bail!(
            "no Kubernetes binaries in {}: run tests/setup/build-kube {bare} first",
            dir.display()
        );
    }
    Ok(dir)
}

/// The version `binary --version` reports, asked once per binary per test
/// process.
pub fn binary_version(binary: &Path) -> Result<KubeVersion> {
    static KNOWN: Mutex<Option<HashMap<PathBuf, KubeVersion>>> = Mutex::new(None);
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    let known = known.get_or_insert_with(HashMap::new);
    if let Some(version) = known.get(binary) {
        return Ok(*version);
    }
    let version = KubeVersion::of_binary(binary)?;
    known.insert(binary.to_path_buf(), version);
    Ok(version)
}

/// kube-apiserver's flags that depend on its version.
pub fn apiserver_version_args(version: KubeVersion) -> Vec<String> {
    let mut args = Vec::new();
    // Insecure serving: off by default since 1.20, the flag (then only
    // accepting 0) gone in 1.24.
    if !version.at_least(1, 24) {
        args.push("--insecure-port=0".into());
    }
    // The endpoint reconciler publishes the advertise address as the
    // `kubernetes` Service's endpoint, and Endpoints may not hold a
    // loopback address. From 1.37 kube-apiserver checks that at start and
    // refuses to run ("cannot use public IP 127.0.0.1 with endpoint
    // reconciler"); before, it started and only failed each write. Nothing
    // here reaches the API through that Service: no reconciler.
    if version.at_least(1, 37) {
        args.push("--endpoint-reconciler-type=none".into());
    }
    args
}

/// Names the API server's `--feature-gates` for every control plane of a
/// run (e.g. `WatchList=false`), when set and not empty.
pub const FEATURE_GATES_ENV: &str = "AUTONODE_KUBE_FEATURE_GATES";

/// kube-controller-manager's flags that depend on its version.
pub fn controller_manager_version_args(version: KubeVersion) -> Vec<String> {
    let mut args = Vec::new();
    // Insecure serving: a no-op since 1.22, the flag gone in 1.24.
    if !version.at_least(1, 24) {
        args.push("--port=0".into());
    }
    args
}

/// The API server's audit log, in the control plane's directory.
const AUDIT_LOG: &str = "audit.log";

/// What the API server audits: writes to NodeClaims' status with the
/// objects written and returned (who wrote what, and what a write dropped:
/// [`ControlPlane::audit_events`]); writes to NodeClaims
/// themselves by who and when; every other request of autonode-server's
/// ServiceAccount by what and when (what a machine may leave behind; what
/// a join costs the API server, `autonode-bench`); nothing else. A few
/// lines per machine.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: RequestResponse
  verbs: [update, patch]
  resources: [{group: karpenter.sh, resources: [nodeclaims/status]}]
- level: Metadata
  verbs: [create, update, patch, delete]
  resources: [{group: karpenter.sh, resources: [nodeclaims]}]
- level: Metadata
  users: ["system:serviceaccount:autonode-system:autonode-server"]
- level: None
"#;

/// Certificates and keys the components read, written into the directory.
struct Files {
    dir: PathBuf,
    admin: CertPair,
    kcm: CertPair,
    scheduler: CertPair,
}

impl Files {
    fn write(dir: &Path, ca: &Ca, extra_ips: &[IpAddr]) -> Result<Self> {
        let mut ips = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
        ips.extend_from_slice(extra_ips);
        let serving = ca.server(&["localhost", "kubernetes.default.svc"], &ips)?;
        let service_accounts = rcgen::KeyPair::generate().context("service account key")?;
        let put = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text).with_context(|| format!("writing {name}"))
        };
        put("ca.crt", &ca.pair().cert_pem)?;
        put("ca.key", &ca.pair().key_pem)?;
        put("apiserver.crt", &serving.cert_pem)?;
        put("apiserver.key", &serving.key_pem)?;
        put("sa.key", &service_accounts.serialize_pem())?;
        put("sa.pub", &service_accounts.public_key_pem())?;
        put("audit-policy.yaml", AUDIT_POLICY)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            admin: ca.client("autonode-test-admin", Some("system:masters"))?,
            kcm: ca.client("system:kube-controller-manager", None)?,
            // The user the built-in system:kube-scheduler role is bound to.
            scheduler: ca.client("system:kube-scheduler", None)?,
        })
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

/// etcd from the Kubernetes binaries' directory (`tests/setup/build-kube`
/// builds the version that release is tested with), else the one on PATH
/// (an `AUTONODE_KUBE_BIN` without one).
fn start_etcd(bin: &Path, dir: &Path) -> Result<Daemon> {
    let client = free_port()?;
    let peer = free_port()?;
    let data = dir.join("etcd");
    let url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let args = vec![
        format!("--data-dir={}", data.display()),
        format!("--listen-client-urls={url}"),
        format!("--advertise-client-urls={url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=default={peer_url}"),
        "--log-level=warn".into(),
    ];
    let ours = bin.join("etcd");
    let program = if ours.exists() {
        ours.as_path()
    } else {
        Path::new("etcd")
    };
    let etcd = Daemon::spawn("etcd", program, &args, dir)?;
    etcd.set_endpoint(url);
    Ok(etcd)
}

fn start_apiserver(
    bin: &Path,
    version: KubeVersion,
    files: &Files,
    etcd: &Daemon,
    port: u16,
) -> Result<Daemon> {
    let mut args = vec![
        format!("--etcd-servers={}", etcd.endpoint()),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", files.path("apiserver-certs")),
        format!("--tls-cert-file={}", files.path("apiserver.crt")),
        format!("--tls-private-key-file={}", files.path("apiserver.key")),
        format!("--client-ca-file={}", files.path("ca.crt")),
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        format!("--service-account-key-file={}", files.path("sa.pub")),
        format!(
            "--service-account-signing-key-file={}",
            files.path("sa.key")
        ),
        // Signing key, issuer and audience: what the TokenRequest API
        // (`serviceaccounts/<name>/token`, how the server's token is made
        // on every version) needs.
        "--service-account-issuer=https://kubernetes.default.svc".into(),
        "--api-audiences=https://kubernetes.default.svc".into(),
        "--service-cluster-ip-range=10.96.0.0/16".into(),
        format!("--audit-policy-file={}", files.path("audit-policy.yaml")),
        format!("--audit-log-path={}", files.path(AUDIT_LOG)),
        "--audit-log-format=json".into(),
        "--profiling=false".into(),
        "--v=1".into(),
    ];
    args.extend(apiserver_version_args(version));
    // A run with some of the API server's features off (`WatchList=false`:
    // a guest whose API server refuses streaming lists).
    if let Ok(gates) = std::env::var(FEATURE_GATES_ENV) {
        if !gates.is_empty() {
            args.push(format!("--feature-gates={gates}"));
        }
    }
    Daemon::spawn(
        "kube-apiserver",
        &bin.join("kube-apiserver"),
        &args,
        &files.dir,
    )
}

/// What kube-controller-manager and kube-scheduler share: one kubeconfig
/// for the API and for checking who calls their own port, that port on
/// loopback, no leader election (one replica).
fn component_args(kubeconfig: &Path) -> Result<Vec<String>> {
    let kubeconfig = kubeconfig.display();
    Ok(vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--authentication-kubeconfig={kubeconfig}"),
        format!("--authorization-kubeconfig={kubeconfig}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={}", free_port()?),
        "--leader-elect=false".into(),
        "--profiling=false".into(),
        "--v=1".into(),
    ])
}

/// What runs besides etcd, kube-apiserver and the controllers every test
/// relies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extra {
    None,
    Scheduler,
    SchedulerAndNodeLifecycle,
    StockApprover,
    StockApproverDefaultLimits,
}

fn start_controller_manager(
    bin: &Path,
    version: KubeVersion,
    files: &Files,
    kubeconfig: &Path,
    extra: Extra,
) -> Result<Daemon> {
    let mut controllers =
        "csrsigning,csrcleaner,serviceaccount,serviceaccount-token,namespace,garbagecollector"
            .to_string();
    let default_limits = extra == Extra::StockApproverDefaultLimits;
    if extra == Extra::StockApprover || default_limits {
        controllers.push_str(",csrapproving");
    }
    if extra == Extra::SchedulerAndNodeLifecycle {
        // deployment and replicaset: a workload's pods come back on a
        // drifted node's replacement (the rollout scenarios), and the demo
        // scales a Deployment up for Karpenter to launch a node for.
        controllers.push_str(",nodelifecycle,deployment,replicaset");
    }
    let mut args = component_args(kubeconfig)?;
    args.extend([
        // Each controller acts as its own service account, as kubeadm runs
        // it: the controller-manager's own role cannot sign CSRs.
        "--use-service-account-credentials=true".into(),
        // Only what the tests rely on: CSR signing and cleanup, service
        // accounts and their tokens, namespace deletion, garbage collection.
        // (and, for the real Karpenter, the node lifecycle: see
        // `ControlPlane::start_for_karpenter`).
        format!("--controllers={controllers}"),
        format!("--cluster-signing-cert-file={}", files.path("ca.crt")),
        format!("--cluster-signing-key-file={}", files.path("ca.key")),
        format!("--root-ca-file={}", files.path("ca.crt")),
        format!(
            "--service-account-private-key-file={}",
            files.path("sa.key")
        ),
    ]);
    if !default_limits {
        // The default client limit (20 requests/s, burst 30) caps CSR
        // signing at about 20 certificates a second, 50 s for a 500-node
        // scale-out; control planes sized for such scale-outs raise it.
        let qps = CONTROLLER_MANAGER_QPS.load(Ordering::Relaxed);
        args.extend([
            format!("--kube-api-qps={qps}"),
            format!("--kube-api-burst={}", qps.saturating_mul(2)),
        ]);
    }
    args.extend(controller_manager_version_args(version));
    Daemon::spawn(
        "kube-controller-manager",
        &bin.join("kube-controller-manager"),
        &args,
        &files.dir,
    )
}

/// kube-controller-manager's client limit (requests a second; its burst is
/// twice that) where a control plane does not keep the defaults. Each of
/// its controllers has a client of its own at this limit, so the CSR
/// signer signs at most this many certificates a second: a burst of joins
/// (two CSRs each) is held to half as many joins a second, whoever
/// approves them.
static CONTROLLER_MANAGER_QPS: AtomicU32 = AtomicU32::new(100);

/// Sets kube-controller-manager's client limit for control planes started
/// from now on (100 unless set; the bench's `--kcm-qps`).
pub fn set_controller_manager_qps(qps: u32) {
    CONTROLLER_MANAGER_QPS.store(qps.max(1), Ordering::Relaxed);
}

/// kube-scheduler, authenticated as `system:kube-scheduler`, serving its
/// own port on loopback only.
fn start_scheduler(bin: &Path, files: &Files, kubeconfig: &Path) -> Result<Daemon> {
    let args = component_args(kubeconfig)?;
    Daemon::spawn(
        "kube-scheduler",
        &bin.join("kube-scheduler"),
        &args,
        &files.dir,
    )
}

/// What kube-apiserver logs when its port was taken.
const PORT_TAKEN: &str = "address already in use";

/// Polls `/readyz` until the apiserver says ready (or has died).
async fn wait_ready(client: &Client, apiserver: &Daemon) -> Result<()> {
    let ready = || async {
        let request = http::Request::get("/readyz").body(Vec::new())?;
        let body = client.request_text(request).await;
        Ok(body.is_ok_and(|b| b.trim() == "ok").then_some(()))
    };
    apiserver
        .wait_for(
            "\"ok\" from kube-apiserver's /readyz",
            START_TIMEOUT,
            Duration::from_millis(200),
            ready,
        )
        .await
}

/// Whether the API server serves PodDisruptionBudgets as `policy/v1`
/// (from Kubernetes 1.21, so every supported version; an older one, run
/// through `AUTONODE_KUBE_BIN`, has the same schema as `policy/v1beta1`),
/// so a test applying shipped manifests can tell which version to send.
pub async fn serves_policy_v1_pdbs(client: &Client) -> bool {
    serves_kind(client, "policy/v1", "PodDisruptionBudget").await
}

/// Whether the API server serves `kind` in `group_version`, asked by
/// discovery.
pub async fn serves_kind(client: &Client, group_version: &str, kind: &str) -> bool {
    client
        .list_api_group_resources(group_version)
        .await
        .is_ok_and(|list| list.resources.iter().any(|r| r.kind == kind))
}

/// Installs CRDs from YAML and waits until each is Established.
///
/// The CRDs' `x-kubernetes-validations` rules (CEL) are compiled and
/// enforced by every supported version (on by default from 1.25, GA in
/// 1.29): objects the tests create must pass them, as on a real cluster.
pub async fn install_crds(client: &Client, crds: &[(&str, &str)]) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (file, yaml) in crds {
        let crd: CustomResourceDefinition =
            serde_yaml::from_str(yaml).with_context(|| format!("parsing {file}"))?;
        let name = crd.metadata.name.clone().context("CRD without a name")?;
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e).with_context(|| format!("creating CRD {name}")),
        }
        // The server's own wait, as --install-crds uses it.
        autonode_server::crds::wait_established(&api, &name, START_TIMEOUT).await?;
    }
    Ok(())
}

/// Writes a kubeconfig with embedded certificates.
fn write_kubeconfig(path: &Path, url: &str, ca_pem: &str, pair: &CertPair) -> Result<()> {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {
            "server": url,
            "certificate-authority-data": b64(ca_pem),
        }}],
        "users": [{"name": "user", "user": {
            "client-certificate-data": b64(&pair.cert_pem),
            "client-key-data": b64(&pair.key_pem),
        }}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
        "current-context": "test",
    });
    let text = serde_json::to_string_pretty(&doc)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A kube client from a kubeconfig file.
pub async fn kube_client(path: &Path) -> Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .context("loading kubeconfig")?;
    Client::try_from(config).context("building kube client")
}

/// A port that was free a moment ago on 127.0.0.1.
///
/// There is a window between closing the probe socket and the component
/// binding it; the components fail loudly if they lose that race.
///
/// Chosen below the kernel's ephemeral range, not by binding port 0: a port
/// from that range, probed and released, can be taken by any outgoing
/// connection's automatic bind before the daemon binds it, and the tests
/// open thousands (the hostile-load tests' clients). That is how an etcd
/// once found its client port taken and its API server waited on nothing.
/// Below the range only an explicit bind can take a port; the probe and a
/// random start keep two tests apart.
pub fn free_port() -> Result<u16> {
    let top = ephemeral_floor().clamp(HARNESS_PORTS_FROM + 1, u16::MAX);
    let span = top - HARNESS_PORTS_FROM;
    let start = rand::random::<u16>() % span;
    (0..span)
        .map(|i| HARNESS_PORTS_FROM + (start + i) % span)
        .find(|port| TcpListener::bind((Ipv4Addr::LOCALHOST, *port)).is_ok())
        .with_context(|| format!("no free port in {HARNESS_PORTS_FROM}..{top}"))
}

/// The lowest port the harness hands out.
const HARNESS_PORTS_FROM: u16 = 10_000;

/// The first port of the kernel's ephemeral range (32768 by default).
fn ephemeral_floor() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A process-unique suffix for names.
pub fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(minor: u32) -> KubeVersion {
        KubeVersion::new(1, minor, 0)
    }

    #[test]
    fn apiserver_insecure_port_only_before_1_24() {
        assert_eq!(apiserver_version_args(v(20)), ["--insecure-port=0"]);
        assert_eq!(apiserver_version_args(v(23)), ["--insecure-port=0"]);
        for minor in [24, 27, 34, 36] {
            assert!(apiserver_version_args(v(minor)).is_empty(), "1.{minor}");
        }
    }

    #[test]
    fn apiserver_endpoint_reconciler_off_from_1_37() {
        for minor in [37, 38] {
            assert_eq!(
                apiserver_version_args(v(minor)),
                ["--endpoint-reconciler-type=none"],
                "1.{minor}"
            );
        }
    }

    #[test]
    fn controller_manager_port_only_before_1_24() {
        assert_eq!(controller_manager_version_args(v(20)), ["--port=0"]);
        for minor in [24, 27, 34] {
            assert!(
                controller_manager_version_args(v(minor)).is_empty(),
                "1.{minor}"
            );
        }
    }
}
