//! The Helm chart (`packaging/helm/autonode-server`) rendered by the real
//! helm, and the current kubectl beside it, both put in the cache by
//! `tests/setup/install-helm`.

use crate::kube::manifest;
use crate::kube::version::KubeVersion;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// helm's version in the cache (`tests/setup/install-helm`'s HELM_VERSION).
pub const HELM_VERSION: &str = "4.1.4";
/// kubectl's version in the cache (`tests/setup/install-helm`'s
/// KUBECTL_VERSION): one Kustomize of today for the chart's tests, whatever
/// Kubernetes version the harness runs (the oldest, 1.26's kubectl, has
/// Kustomize 4.5.7).
pub const KUBECTL_VERSION: &str = "1.34.5";

fn tool(dir: &str, name: &str) -> Result<PathBuf> {
    let path = crate::harness::cache::root()?
        .join("tools")
        .join(dir)
        .join(name);
    if !path.exists() {
        bail!(
            "no {}: run tests/setup/install-helm (tests/setup/install-deps does)",
            path.display()
        );
    }
    Ok(path)
}

/// The cached helm binary.
pub fn helm_binary() -> Result<PathBuf> {
    tool(&format!("helm-v{HELM_VERSION}"), "helm")
}

/// The cached kubectl binary (not the control plane's).
pub fn kubectl_binary() -> Result<PathBuf> {
    tool(&format!("kubectl-v{KUBECTL_VERSION}"), "kubectl")
}

/// The chart's directory in the workspace.
pub fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/helm/autonode-server")
}

/// What a command printed: exit status, stdout, stderr.
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `program` with `args` (no shell), collecting its output.
pub fn run(program: &Path, args: &[&str]) -> Result<Run> {
    let output = Command::new(program)
        .args(args)
        // These commands need no repositories or plugins; keep helm's
        // config, cache and data directories out of the user's home.
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("autonode-helm/config"),
        )
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("autonode-helm/cache"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("autonode-helm/data"),
        )
        .output()
        .with_context(|| format!("running {}", program.display()))?;
    Ok(Run {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

/// helm with `args`, which must succeed; its stdout.
pub fn helm(args: &[&str]) -> Result<String> {
    let run = run(&helm_binary()?, args)?;
    if !run.ok {
        bail!(
            "helm {} failed:\n{}{}",
            args.join(" "),
            run.stdout,
            run.stderr
        );
    }
    Ok(run.stdout)
}

/// `helm template` of the chart as release `autonode-server` in namespace
/// `namespace`, with `args` (`--set`, `-f`, ...) appended: its objects.
pub fn template(namespace: &str, args: &[&str]) -> Result<Vec<Value>> {
    let chart = chart_dir();
    let chart = chart.to_string_lossy();
    let mut all = vec![
        "template",
        "autonode-server",
        &chart,
        "--namespace",
        namespace,
    ];
    all.extend_from_slice(args);
    manifest::documents(&helm(&all)?)
}

/// The guest cluster's RBAC the chart renders for `args` (`cluster=guest`)
/// and a guest cluster at `version`, as one manifest the harness can apply.
pub fn guest_rbac_manifest(args: &[&str], version: KubeVersion) -> Result<String> {
    let version = version.to_string();
    let mut all = vec!["--set", "cluster=guest", "--kube-version", &version];
    all.extend_from_slice(args);
    Ok(manifest::join(&template("default", &all)?))
}

/// The object of `kind` among `docs`, which must hold exactly one.
pub fn only<'a>(docs: &'a [Value], kind: &str) -> Result<&'a Value> {
    let mut found = docs.iter().filter(|d| d["kind"] == kind);
    let first = found.next().with_context(|| format!("no {kind}"))?;
    if found.next().is_some() {
        bail!("more than one {kind}");
    }
    Ok(first)
}
