//! Earlier revisions of autonode, for the skew tests: the agents baked
//! into AMIs months ago and the servers an upgrade replaces. The list is
//! `tests/skew/revisions` (docs/upgrading.md says what it promises);
//! `tests/setup/build-revisions` builds each revision's agent and server
//! from this repository's history and caches them by commit, like the
//! Kubernetes binaries (`tests/run` builds them before the tests; a test
//! finds them already there).

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
}

impl Revision {
    /// Its `autonode-agent` (a debug build).
    pub fn agent(&self) -> PathBuf {
        self.dir.join("autonode-agent")
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

    /// `name (short commit)`, for messages.
    pub fn label(&self) -> String {
        let short: String = self.commit.chars().take(7).collect();
        format!("{} ({short})", self.name)
    }
}

/// Every revision of the list, oldest first, built (cached builds answer at
/// once; a missing one is built now, which takes minutes).
pub fn all() -> Result<Vec<Revision>> {
    let listed = listed()?;
    if listed.is_empty() {
        bail!("tests/skew/revisions lists no revision");
    }
    let script = crate::harness::bench::repo_root().join("tests/setup/build-revisions");
    let output = std::process::Command::new(&script)
        .args(listed.iter().map(|(commit, _)| commit))
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
    if dirs.len() != listed.len() {
        bail!(
            "build-revisions printed {} directories for {} revisions",
            dirs.len(),
            listed.len()
        );
    }
    Ok(listed
        .into_iter()
        .zip(dirs)
        .map(|((commit, name), dir)| Revision { commit, name, dir })
        .collect())
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
