//! Earlier revisions of autonode, for the skew tests: the agents baked
//! into AMIs months ago and the servers an upgrade replaces. The list is
//! `tests/skew/revisions` (docs/upgrading.md says what it promises);
//! `tests/setup/build-revisions` builds each revision's agent and server
//! from this repository's history and caches them by commit, like the
//! Kubernetes binaries (`tests/run` builds them before the tests; a test
//! finds them already there). A release's agent is the one it ships:
//! `tests/setup/build-releases` builds its `.deb` for amd64 and arm64 from
//! the commit its record (`packaging/releases/`) names, held to the
//! record's hashes, and the tests run the binary those packages hold.

use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::task::AbortHandle;

/// One earlier revision, built.
#[derive(Debug, Clone)]
pub struct Revision {
    /// The full commit.
    pub commit: String,
    /// Its name in the list (a release, or the date of a pre-release
    /// revision).
    pub name: String,
    dir: PathBuf,
    /// A release's packages (`tests/setup/build-releases`' directory).
    packages: Option<PathBuf>,
}

/// An architecture a release's agent is packaged for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// x86_64, run natively.
    Amd64,
    /// aarch64, run under QEMU's user-mode emulation (the binfmt_misc
    /// handler `tests/setup/install-arm64` registers).
    Arm64,
}

impl Arch {
    /// As Debian names it (the `.deb`'s architecture).
    pub fn deb(self) -> &'static str {
        match self {
            Self::Amd64 => "amd64",
            Self::Arm64 => "arm64",
        }
    }
}

impl Revision {
    /// Its `autonode-agent`: a release's as its amd64 package ships it
    /// (static, release-built), any other revision's a debug build.
    pub fn agent(&self) -> PathBuf {
        match &self.packages {
            Some(dir) => packaged_agent(dir, Arch::Amd64),
            None => self.dir.join("autonode-agent"),
        }
    }

    /// Whether it is a release, whose agent is its package's.
    pub fn is_release(&self) -> bool {
        self.packages.is_some()
    }

    /// A release's agent as its `arch` package ships it (the file the
    /// `.deb` installs as `/usr/bin/autonode-agent`). An arm64 binary runs
    /// here under QEMU's user-mode emulation, through the kernel's
    /// binfmt_misc handler: an error says when there is none.
    pub fn packaged_agent(&self, arch: Arch) -> Result<PathBuf> {
        let dir = self
            .packages
            .as_ref()
            .with_context(|| format!("{} is no release: it has no packages", self.label()))?;
        if arch == Arch::Arm64 && !Path::new(ARM64_BINFMT).exists() {
            bail!("no binfmt_misc handler for aarch64 ({ARM64_BINFMT}): run tests/setup/install-arm64");
        }
        Ok(packaged_agent(dir, arch))
    }

    /// Its `autonode-server` (a debug build).
    pub fn server(&self) -> PathBuf {
        self.dir.join("autonode-server")
    }

    /// Its Helm chart's directory.
    pub fn chart(&self) -> PathBuf {
        self.dir.join("helm/autonode-server")
    }

    /// What its agent says its version is (`autonode-agent --version`):
    /// `(major, minor, patch)`.
    pub fn agent_version(&self) -> Result<(u64, u64, u64)> {
        let output = std::process::Command::new(self.agent())
            .arg("--version")
            .output()
            .with_context(|| format!("running {} --version", self.agent().display()))?;
        let text = String::from_utf8_lossy(&output.stdout);
        let version = text.split_whitespace().nth(1).unwrap_or_default();
        let mut parts = version.split('.').map(str::parse::<u64>);
        match (parts.next(), parts.next(), parts.next()) {
            (Some(Ok(a)), Some(Ok(b)), Some(Ok(c))) => Ok((a, b, c)),
            _ => bail!("{}: no version in {text:?}", self.label()),
        }
    }

    /// A file of its tree as committed (`git show COMMIT:PATH` in this
    /// repository's history): what the build caches do not keep, such as
    /// its guest RBAC.
    pub fn file(&self, path: &str) -> Result<String> {
        let output = std::process::Command::new("git")
            .arg("-C")
            .arg(crate::harness::bench::repo_root())
            .args(["show", &format!("{}:{path}", self.commit)])
            .output()
            .context("running git show")?;
        if !output.status.success() {
            bail!(
                "{}: git show {path}: {}",
                self.label(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8(output.stdout)?)
    }

    /// The guest RBAC files its `packaging/guest/kustomization.yaml` lists
    /// (what `kubectl apply -k packaging/guest` of its tree applies), as
    /// `(name, text)`.
    pub fn guest_rbac(&self) -> Result<Vec<(String, String)>> {
        let kustomization = self.file("packaging/guest/kustomization.yaml")?;
        let mut files = Vec::new();
        for line in kustomization.lines() {
            let Some(name) = line.trim().strip_prefix("- ") else {
                continue;
            };
            let name = name.trim();
            files.push((
                name.to_string(),
                self.file(&format!("packaging/guest/{name}"))?,
            ));
        }
        if files.is_empty() {
            bail!("{}: its guest kustomization lists no file", self.label());
        }
        Ok(files)
    }

    /// `name (short commit)`, for messages.
    pub fn label(&self) -> String {
        let short: String = self.commit.chars().take(7).collect();
        format!("{} ({short})", self.name)
    }
}

/// The kernel's handler that runs aarch64 binaries under QEMU.
const ARM64_BINFMT: &str = "/proc/sys/fs/binfmt_misc/qemu-aarch64";

/// The agent binary a package of `arch` holds, unpacked under `dir`.
fn packaged_agent(dir: &Path, arch: Arch) -> PathBuf {
    dir.join(arch.deb()).join("usr/bin/autonode-agent")
}

/// Every revision of the list, oldest first, built (cached builds answer at
/// once; a missing one is built now, which takes minutes), each release's
/// packages with it.
pub fn all() -> Result<Vec<Revision>> {
    let listed = listed()?;
    if listed.is_empty() {
        bail!("tests/skew/revisions lists no revision");
    }
    let commits: Vec<&str> = listed.iter().map(|(commit, _)| commit.as_str()).collect();
    let dirs = setup_dirs("tests/setup/build-revisions", &commits)?;
    // The releases of the list: a name vX.Y.Z with a record of that commit.
    let mut releases = Vec::new();
    for (commit, name) in &listed {
        if let Some(version) = release_of(name, commit)? {
            releases.push(version);
        }
    }
    let versions: Vec<&str> = releases.iter().map(String::as_str).collect();
    let mut packages = setup_dirs("tests/setup/build-releases", &versions)?.into_iter();
    let mut out = Vec::new();
    for ((commit, name), dir) in listed.into_iter().zip(dirs) {
        let packages = match release_of(&name, &commit)? {
            Some(_) => Some(packages.next().context("build-releases printed too few")?),
            None => None,
        };
        out.push(Revision {
            commit,
            name,
            dir,
            packages,
        });
    }
    Ok(out)
}

/// The release `name` (`vX.Y.Z`) is, when `packaging/releases/X.Y.Z.toml`
/// records it; an error when that record names another commit.
fn release_of(name: &str, commit: &str) -> Result<Option<String>> {
    let Some(version) = name.strip_prefix('v') else {
        return Ok(None);
    };
    let path =
        crate::harness::bench::repo_root().join(format!("packaging/releases/{version}.toml"));
    let Ok(record) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let recorded = record
        .lines()
        .find_map(|l| l.strip_prefix("commit = \""))
        .map(|c| c.trim_end_matches('"'));
    if recorded != Some(commit) {
        bail!(
            "tests/skew/revisions names {commit} as {name}, {} {recorded:?}",
            path.display()
        );
    }
    Ok(Some(version.to_string()))
}

/// Runs the setup `script` (a path from the repository's root) with `args`
/// and returns the directories it prints, one per argument.
fn setup_dirs(script: &str, args: &[&str]) -> Result<Vec<PathBuf>> {
    if args.is_empty() {
        return Ok(Vec::new());
    }
    let script = crate::harness::bench::repo_root().join(script);
    let output = std::process::Command::new(&script)
        .args(args)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "{} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let dirs: Vec<PathBuf> = String::from_utf8(output.stdout)?
        .lines()
        .map(PathBuf::from)
        .collect();
    if dirs.len() != args.len() {
        bail!(
            "{} printed {} directories for {} arguments",
            script.display(),
            dirs.len(),
            args.len()
        );
    }
    Ok(dirs)
}

/// The previous release: the list's last line.
pub fn previous_release() -> Result<Revision> {
    all()?
        .pop()
        .context("tests/skew/revisions lists no revision")
}

/// `(commit, name)` of every line of `tests/skew/revisions`, in order.
pub fn listed() -> Result<Vec<(String, String)>> {
    let path = crate::harness::bench::repo_root().join("tests/skew/revisions");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text).with_context(|| format!("in {}", path.display()))
}

fn parse(text: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(commit), Some(name), None) = (words.next(), words.next(), words.next()) else {
            bail!("{line:?}: expected a commit and a name");
        };
        if commit.len() != 40 || !commit.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("{commit:?} is not a full commit hash");
        }
        out.push((commit.to_string(), name.to_string()));
    }
    Ok(out)
}

/// Copies the agent's keys from one machine's disk to another's, as a
/// reboot keeps them: `to` then resumes `from`'s join.
pub fn carry_keys(from: &Path, to: &Path) -> Result<()> {
    let state = "var/lib/autonode";
    std::fs::create_dir_all(to.join(state))?;
    for key in ["client.key", "serving.key"] {
        std::fs::copy(from.join(state).join(key), to.join(state).join(key))
            .with_context(|| format!("copying {key}"))?;
    }
    Ok(())
}

/// A Service's stand-in for a rolling upgrade: each new connection goes to
/// the next of the ready endpoints (round robin), as kube-proxy sends a
/// Service's traffic to its ready Pods. An endpoint taken out gets no new
/// connection; its open ones go on until they close.
pub struct Endpoints {
    addr: SocketAddr,
    ready: Arc<Mutex<Vec<SocketAddr>>>,
    accept: AbortHandle,
}

impl Endpoints {
    /// Listens on loopback, sending connections to `ready` (server URLs).
    pub async fn start(ready: &[&str]) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let targets = Arc::new(Mutex::new(addresses(ready)?));
        let (shared, next) = (targets.clone(), AtomicUsize::new(0));
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let target = {
                    let ready = shared.lock().unwrap_or_else(|e| e.into_inner());
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    ready.get(n % ready.len().max(1)).copied()
                };
                // No ready endpoint: the connection is refused, as with no Pod.
                if let Some(target) = target {
                    tokio::spawn(crate::network::netns::relay(inbound, target));
                }
            }
        })
        .abort_handle();
        Ok(Self {
            addr,
            ready: targets,
            accept,
        })
    }

    /// The Service's URL.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The ready endpoints from now on.
    pub fn set(&self, ready: &[&str]) -> Result<()> {
        let ready = addresses(ready)?;
        *self.ready.lock().unwrap_or_else(|e| e.into_inner()) = ready;
        Ok(())
    }
}

impl Drop for Endpoints {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn addresses(urls: &[&str]) -> Result<Vec<SocketAddr>> {
    urls.iter()
        .map(|u| {
            u.trim_start_matches("https://")
                .trim_end_matches('/')
                .parse()
                .with_context(|| format!("{u} is not https://ip:port"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_reads_full_commits_and_names_and_refuses_anything_else() {
        let text = "# c\n\nb7f69a17c8b0e9f54d18fcce093472ace7146e0a  2026-11-23\n\
                    8502dbf6caa84d3c2db32a8547212144093a1299 v0.2.0 # cut\n";
        let parsed = parse(text).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[1].1, "v0.2.0");
        assert!(parse("b7f69a1 short\n").is_err());
        assert!(parse("b7f69a17c8b0e9f54d18fcce093472ace7146e0a\n").is_err());
        assert!(parse("b7f69a17c8b0e9f54d18fcce093472ace7146e0a a b\n").is_err());
    }

    #[test]
    fn the_repositorys_list_parses() {
        assert!(!listed().unwrap().is_empty());
    }
    // Every release cut is in the list under its name: tests/tests/integration/versions.rs
    // (with the release records and the version everywhere it is written).
}
