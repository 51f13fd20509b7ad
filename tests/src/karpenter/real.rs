//! The real Karpenter: the AWS provider's controller, built from the Go
//! module proxy by `tests/setup/build-karpenter`, run against a test's
//! control plane and [`crate::cloud::moto`].
//!
//! ([`crate::karpenter::standin`] plays Karpenter's part instead, for the tests
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

use crate::cloud::moto::{Moto, REGION};
use crate::harness::poll::Look;
use crate::harness::process::Daemon;
use crate::kube::controlplane::{free_port, install_crds, ControlPlane};
use crate::kube::version::pin_under_test;
use crate::kube::version::KubeVersion;
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tempfile::TempDir;

/// The provider module every pin requires.
const PROVIDER: &str = "github.com/aws/karpenter-provider-aws";

/// A Karpenter (AWS provider) release: `major.minor.patch`, printed
/// without a `v` as the cache directories name it (`karpenter-v1.15.1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Release {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Release {
    /// `1.15.1` or `v1.15.1`.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let mut parts = text.strip_prefix('v').unwrap_or(text).split('.');
        let mut number = || parts.next()?.parse::<u32>().ok();
        let release = Self {
            major: number()?,
            minor: number()?,
            patch: number()?,
        };
        parts.next().is_none().then_some(release)
    }
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Where the pins are: one Go module per minor, `tests/karpenter/v1.MINOR/`.
pub fn pins_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/karpenter"))
}

/// The module that pins `release` (`tests/karpenter/v1.MINOR/`).
pub fn module_dir(release: Release) -> PathBuf {
    pins_dir().join(format!("v{}.{}", release.major, release.minor))
}

/// The releases pinned under `tests/karpenter/`, newest first: the
/// provider each module's go.mod requires (the list
/// `tests/setup/build-karpenter --list` prints).
pub fn pinned() -> Result<Vec<Release>> {
    let dir = pins_dir();
    let mut releases = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let go_mod = entry?.path().join("go.mod");
        let Ok(text) = std::fs::read_to_string(&go_mod) else {
            continue;
        };
        let release = text
            .lines()
            .find_map(|line| {
                let rest = line.strip_prefix("require ")?.trim();
                Release::parse(rest.strip_prefix(PROVIDER)?)
            })
            .with_context(|| format!("{}: no `require {PROVIDER} vX.Y.Z`", go_mod.display()))?;
        releases.push(release);
    }
    releases.sort_unstable_by(|a, b| b.cmp(a));
    if releases.is_empty() {
        bail!("no Karpenter pinned under {}", dir.display());
    }
    Ok(releases)
}

/// The newest pinned release: what CI runs, and what an upgrade goes to.
pub fn current() -> Result<Release> {
    Ok(pinned()?[0])
}

/// The newest pinned release of an earlier minor than [`current`]: what a
/// fleet that lags a release runs, and upgrades from.
pub fn previous() -> Result<Release> {
    let all = pinned()?;
    let now = all[0];
    all.iter()
        .copied()
        .find(|r| (r.major, r.minor) < (now.major, now.minor))
        .with_context(|| {
            format!("no Karpenter of a minor before {now} pinned under tests/karpenter/")
        })
}

/// The release under test: `AUTONODE_KARPENTER_VERSION` (`1.14` or
/// `1.14.3`, one of the pinned; `tests/run --karpenter` sets it), else
/// [`current`].
pub fn under_test() -> Result<Release> {
    pin_under_test("AUTONODE_KARPENTER_VERSION", &pinned()?, numbers)
}

/// The pinned release `wanted` (`1.14`, `1.14.3`, `v1.14.3`) names.
#[cfg(test)]
fn choose(pinned: &[Release], wanted: &str) -> Result<Release> {
    crate::kube::version::choose_pin("AUTONODE_KARPENTER_VERSION", pinned, wanted, numbers)
}

fn numbers(r: &Release) -> (u32, u32, u32) {
    (r.major, r.minor, r.patch)
}

/// The cluster name Karpenter is told (it tags what it launches with it).
pub const CLUSTER_NAME: &str = "autonode-test";

const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Where `tests/setup/build-karpenter` put the release under test's
/// controller and CRDs.
pub fn cache_dir() -> Result<PathBuf> {
    cache_dir_of(under_test()?)
}

/// Where `tests/setup/build-karpenter RELEASE` put its controller, CRDs
/// and declared Kubernetes range.
pub fn cache_dir_of(release: Release) -> Result<PathBuf> {
    let dir = crate::harness::cache::root()?.join(format!("karpenter-v{release}"));
    if !dir.join("controller").exists() {
        bail!(
            "no Karpenter {release} controller in {}: run tests/setup/build-karpenter {release} \
             (tests/run builds the one it runs)",
            dir.display()
        );
    }
    Ok(dir)
}

/// The Kubernetes minors `release` declares it supports, oldest and
/// newest (its `MinK8sVersion` and `MaxK8sVersion`, which
/// `tests/setup/build-karpenter` wrote into `kube-range` from the module
/// it built).
pub fn kube_range(release: Release) -> Result<(u32, u32)> {
    let path = cache_dir_of(release)?.join("kube-range");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (tests/setup/build-karpenter {release} writes it)",
            path.display()
        )
    })?;
    parse_kube_range(&text).with_context(|| format!("{}: {text:?}", path.display()))
}

/// `"1.26 1.37"` → (26, 37).
fn parse_kube_range(text: &str) -> Result<(u32, u32)> {
    let minor = |word: Option<&str>| -> Result<u32> {
        let word = word.context("two versions, MIN MAX")?;
        let (major, minor) = word.split_once('.').context("1.MINOR")?;
        if major != "1" {
            bail!("not a Kubernetes 1.x minor: {word}");
        }
        Ok(minor.parse()?)
    };
    let mut words = text.split_whitespace();
    let range = (minor(words.next())?, minor(words.next())?);
    if words.next().is_some() || range.0 > range.1 {
        bail!("not MIN MAX");
    }
    Ok(range)
}

/// Fails, saying what would run, unless `release` declares `kube`
/// supported.
pub fn check_supports(release: Release, kube: KubeVersion) -> Result<()> {
    let (min, max) = kube_range(release)?;
    if kube.major != 1 || !(min..=max).contains(&kube.minor) {
        bail!(
            "Karpenter {release} supports Kubernetes 1.{min}–1.{max}, this is {kube}: \
             `tests/run --karpenter {}.{}` chooses a pinned Kubernetes it supports",
            release.major,
            release.minor
        );
    }
    Ok(())
}

/// The CRDs of the module the release under test was built from.
pub fn crds() -> Result<Vec<(String, String)>> {
    crds_of(under_test()?)
}

/// The CRDs of the module `release` was built from: (file name, YAML),
/// sorted by name.
pub fn crds_of(release: Release) -> Result<Vec<(String, String)>> {
    let dir = cache_dir_of(release)?.join("crds");
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
    install_karpenter_crds_of(cp, under_test()?).await
}

/// Installs `release`'s CRDs (where none are yet) and waits until they
/// serve.
pub async fn install_karpenter_crds_of(cp: &ControlPlane, release: Release) -> Result<()> {
    let crds = crds_of(release)?;
    let borrowed: Vec<(&str, &str)> = crds
        .iter()
        .map(|(name, yaml)| (name.as_str(), yaml.as_str()))
        .collect();
    install_crds(&cp.admin().await?, &borrowed).await
}

/// Applies `release`'s CRDs over whatever is installed, as an upgrade
/// does (`kubectl apply --server-side` of the chart's `karpenter-crd`,
/// the upgrade guide's first step), and waits until each is Established.
/// Returns the names of the CRDs whose stored definition changed.
pub async fn apply_karpenter_crds(cp: &ControlPlane, release: Release) -> Result<Vec<String>> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};
    let client = cp.admin().await?;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let mut changed = Vec::new();
    for (file, yaml) in crds_of(release)? {
        let crd: CustomResourceDefinition =
            serde_yaml::from_str(&yaml).with_context(|| format!("parsing {file}"))?;
        let name = crd.metadata.name.clone().context("CRD without a name")?;
        let before = api.get_opt(&name).await?.map(|c| c.spec);
        let params = PatchParams::apply("autonode-tests-karpenter-upgrade").force();
        let after = api
            .patch(&name, &params, &Patch::Apply(&crd))
            .await
            .with_context(|| format!("applying CRD {name} of Karpenter {release}"))?;
        if before.as_ref() != Some(&after.spec) {
            changed.push(name.clone());
        }
        autonode_server::crds::wait_established(&api, &name, START_TIMEOUT).await?;
    }
    Ok(changed)
}

/// A running Karpenter controller. Dropping it kills the process; its log
/// is printed when the test panics (or with `AUTONODE_TEST_LOGS=1`).
pub struct KarpenterController {
    // Field order is drop order: the process dies before its directory.
    daemon: Daemon,
    dir: TempDir,
    release: Release,
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
        Self::start_release(cp, moto, under_test()?, extra).await
    }

    /// Like [`Self::start_with_env`], the controller of `release` (its
    /// CRDs installed first).
    pub async fn start_release(
        cp: &ControlPlane,
        moto: &Moto,
        release: Release,
        extra: &[(&str, &str)],
    ) -> Result<Self> {
        let controller = cache_dir_of(release)?.join("controller");
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
        let karpenter = Self {
            daemon,
            dir,
            release,
        };
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

    /// [`crate::harness::poll::until`] while the controller lives: fails at once if it
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

    /// The release this controller is.
    pub fn release(&self) -> Release {
        self.release
    }

    /// Stops the controller as a Deployment rollout does (SIGTERM, then
    /// SIGKILL after `grace`); `true` if it exited by itself.
    pub fn stop(&self, grace: Duration) -> bool {
        self.daemon.terminate(grace)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pins_name_releases_and_one_is_chosen_by_minor_or_patch() {
        let all = pinned().unwrap();
        assert!(all.windows(2).all(|w| w[0] > w[1]), "{all:?}");
        let newest = all[0];
        let minor = format!("{}.{}", newest.major, newest.minor);
        assert_eq!(choose(&all, &minor).unwrap(), newest);
        assert_eq!(choose(&all, &format!("v{newest}")).unwrap(), newest);
        let err = choose(&all, "1.2").unwrap_err().to_string();
        assert!(err.contains(&newest.to_string()), "{err}");
        // Each pin's directory is named for the minor its go.mod requires.
        for release in &all {
            assert!(module_dir(*release).join("go.sum").exists(), "{release}");
        }
    }

    #[test]
    fn parses_releases_and_ranges() {
        assert_eq!(
            Release::parse(" v1.14.3"),
            Some(Release {
                major: 1,
                minor: 14,
                patch: 3
            })
        );
        for bad in ["1.14", "1.14.3.1", "v1.x.3", ""] {
            assert_eq!(Release::parse(bad), None, "{bad:?}");
        }
        assert_eq!(parse_kube_range("1.26 1.36\n").unwrap(), (26, 36));
        for bad in ["1.26", "1.37 1.26", "2.1 2.3", "1.26 1.36 1.37", "x y"] {
            assert!(parse_kube_range(bad).is_err(), "{bad:?}");
        }
    }
}
