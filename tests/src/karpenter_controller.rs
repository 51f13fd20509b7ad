//! The real Karpenter: the AWS provider's controller, built from the Go
//! module proxy by `tests/setup/build-karpenter`, run against a test's
//! control plane and [`crate::moto`].
//!
//! ([`crate::karpenter`] plays Karpenter's part instead, for the tests
//! that need its objects and not its decisions.)
//!
//! What a cloud-free run needs, and why:
//! - `AWS_REGION`: else the AWS SDK asks IMDS for it, and there is none.
//! - `AWS_ENDPOINT_URL`: every AWS service the SDK calls goes to moto;
//!   Karpenter has no endpoint setting of its own.
//! - `CLUSTER_ENDPOINT`: else Karpenter asks EKS (DescribeCluster) for it.
//! - `ISOLATED_VPC=true`: no Pricing API (moto has none); Karpenter's
//!   static price table instead.
//! - no `INTERRUPTION_QUEUE`: no SQS.
//! - `DISABLE_LEADER_ELECTION=true`: one replica, and no Lease to wait for.
//! - its own metrics and health ports: tests run side by side.

use crate::controlplane::{free_port, install_crds, ControlPlane};
use crate::moto::{Moto, REGION};
use crate::poll::Look;
use crate::process::Daemon;
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tempfile::TempDir;

/// The provider release `tests/karpenter/go.mod` pins.
pub const KARPENTER_VERSION: &str = "1.15.1";

/// The cluster name Karpenter is told (it tags what it launches with it).
pub const CLUSTER_NAME: &str = "autonode-test";

const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Where `tests/setup/build-karpenter` put the controller and its CRDs.
pub fn cache_dir() -> Result<PathBuf> {
    let dir = crate::cache::root()?.join(format!("karpenter-v{KARPENTER_VERSION}"));
    if !dir.join("controller").exists() {
        bail!(
            "no Karpenter controller in {}: run tests/setup/build-karpenter \
             (or tests/setup/install-deps)",
            dir.display()
        );
    }
    Ok(dir)
}

/// The CRDs of the module the controller was built from: (file name, YAML),
/// sorted by name.
pub fn crds() -> Result<Vec<(String, String)>> {
    let dir = cache_dir()?.join("crds");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let name = path
                .file_name()
                .context("a CRD file without a name")?
                .to_string_lossy()
                .into_owned();
            let yaml = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            files.push((name, yaml));
        }
    }
    if files.is_empty() {
        bail!("no CRDs in {}", dir.display());
    }
    files.sort();
    Ok(files)
}

/// Installs the controller's own CRDs (not the ones the project ships,
/// which are an older Karpenter's) and waits until they serve.
pub async fn install_karpenter_crds(cp: &ControlPlane) -> Result<()> {
    let crds = crds()?;
    let borrowed: Vec<(&str, &str)> = crds
        .iter()
        .map(|(name, yaml)| (name.as_str(), yaml.as_str()))
        .collect();
    install_crds(&cp.admin().await?, &borrowed).await
}

/// A running Karpenter controller. Dropping it kills the process; its log
/// is printed when the test panics (or with `AUTONODE_TEST_LOGS=1`).
pub struct KarpenterController {
    // Field order is drop order: the process dies before its directory.
    daemon: Daemon,
    dir: TempDir,
}

impl KarpenterController {
    /// Starts the controller against `cp` and `moto` and waits until its
    /// readiness probe answers. The CRDs must be installed first
    /// ([`install_karpenter_crds`]): without them it exits.
    pub async fn start(cp: &ControlPlane, moto: &Moto) -> Result<Self> {
        Self::start_with_env(cp, moto, &[]).await
    }

    /// Like [`Self::start`], with `extra` added to the controller's
    /// environment (e.g. `FEATURE_GATES`).
    pub async fn start_with_env(
        cp: &ControlPlane,
        moto: &Moto,
        extra: &[(&str, &str)],
    ) -> Result<Self> {
        let controller = cache_dir()?.join("controller");
        let dir = tempfile::Builder::new()
            .prefix("autonode-karpenter-")
            .tempdir()
            .context("creating Karpenter's directory")?;
        let kubeconfig = cp.admin_kubeconfig().display().to_string();
        let metrics = free_port()?.to_string();
        let health = free_port()?;
        let health_port = health.to_string();
        let env = [
            ("KUBECONFIG", kubeconfig.as_str()),
            ("AWS_REGION", REGION),
            ("AWS_ENDPOINT_URL", moto.url()),
            // Any key: moto checks no signature.
            ("AWS_ACCESS_KEY_ID", "AKIAAUTONODETEST0000"),
            ("AWS_SECRET_ACCESS_KEY", "autonode-test-secret"),
            // No instance metadata here, and the SDK must not wait for it.
            ("AWS_EC2_METADATA_DISABLED", "true"),
            ("CLUSTER_NAME", CLUSTER_NAME),
            ("CLUSTER_ENDPOINT", cp.url()),
            ("ISOLATED_VPC", "true"),
            ("DISABLE_LEADER_ELECTION", "true"),
            ("METRICS_PORT", metrics.as_str()),
            ("HEALTH_PROBE_PORT", health_port.as_str()),
            ("LOG_LEVEL", "debug"),
        ];
        let env: Vec<(&str, &str)> = env.iter().chain(extra).copied().collect();
        let daemon = Daemon::spawn_with_env("karpenter", &controller, &[], dir.path(), &env)?;
        let karpenter = Self { daemon, dir };
        karpenter.wait_ready(health).await?;
        Ok(karpenter)
    }

    async fn wait_ready(&self, port: u16) -> Result<()> {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let url: hyper::Uri = format!("http://127.0.0.1:{port}/readyz").parse()?;
        let ready = || async {
            let response = client.get(url.clone()).await;
            Ok(response
                .is_ok_and(|r| r.status().is_success())
                .then_some(()))
        };
        self.daemon
            .wait_for(
                "success from Karpenter's /readyz",
                START_TIMEOUT,
                Duration::from_millis(250),
                ready,
            )
            .await
    }

    /// [`crate::poll::until`] while the controller lives: fails at once if it
    /// exits, and with its log's tail if `within` passes.
    pub async fn wait_for<L, F, Fut>(
        &self,
        what: &str,
        within: Duration,
        every: Duration,
        probe: F,
    ) -> Result<L::Value>
    where
        L: Look,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<L>>,
    {
        self.daemon.wait_for(what, within, every, probe).await
    }

    /// Fails with the log's tail if the controller has exited.
    pub fn check_alive(&self) -> Result<()> {
        self.daemon.check_alive()
    }

    /// The last `lines` lines of the controller's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.daemon.log_tail(lines)
    }

    /// The controller's whole log so far (JSON lines).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("karpenter.log")
    }

    /// The controller's private directory (its log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for KarpenterController {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("AUTONODE_TEST_LOGS").is_some() {
            eprintln!("Karpenter's log:\n{}", self.log_tail(60));
        }
    }
}
