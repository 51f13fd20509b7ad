//! The workspace's `rust-version` is the oldest Rust that builds it: no
//! lower than what the locked dependencies declare. It once said 1.85 while
//! the lock file needed 1.89 and then more, so a user on the stated version
//! got a dependency's MSRV error instead of ours. Read from
//! `cargo metadata --locked --offline`: every package of the lock file
//! with its `rust_version`; the highest among the dependencies is the
//! floor. A dependency update that raises the floor fails here, naming the
//! packages, until `rust-version` in Cargo.toml follows.
//!
//! Needs nothing but the checkout and the already fetched dependencies.

use anyhow::{bail, ensure, Context, Result};
use std::path::Path;
use std::process::Command;

/// A `rust-version` ("1.94" or "1.94.1"), comparable; a missing patch is 0,
/// as cargo reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct RustVersion(u64, u64, u64);

impl RustVersion {
    fn parse(text: &str) -> Result<Self> {
        let mut parts = text.split('.').map(|p| {
            p.parse::<u64>()
                .with_context(|| format!("rust-version {text:?} is not N.N[.N]"))
        });
        let major = parts.next().context("empty rust-version")??;
        let minor = parts.next().transpose()?.unwrap_or(0);
        let patch = parts.next().transpose()?.unwrap_or(0);
        ensure!(
            parts.next().is_none(),
            "rust-version {text:?} has four parts"
        );
        Ok(Self(major, minor, patch))
    }
}

impl std::fmt::Display for RustVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// The verdict on one `cargo metadata` document: the workspace's
/// rust-version (all members must state the same one) and the floor the
/// dependencies set; Err naming every dependency that needs more than the
/// workspace states.
fn check(metadata: &serde_json::Value) -> Result<(RustVersion, RustVersion)> {
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .context("no workspace_members")?
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    let packages = metadata["packages"].as_array().context("no packages")?;
    let mut stated = None;
    let mut needs = Vec::new();
    for package in packages {
        let name = package["name"].as_str().unwrap_or("?");
        let version = package["version"].as_str().unwrap_or("?");
        let rust = package["rust_version"].as_str();
        if members.contains(&package["id"].as_str().unwrap_or_default()) {
            let rust = RustVersion::parse(
                rust.with_context(|| format!("workspace member {name} states no rust-version"))?,
            )?;
            match stated {
                None => stated = Some((rust, name)),
                Some((other, first)) => ensure!(
                    other == rust,
                    "workspace members disagree: {first} says {other}, {name} says {rust} \
                     (each should inherit rust-version.workspace)"
                ),
            }
        } else if let Some(rust) = rust {
            needs.push((RustVersion::parse(rust)?, format!("{name} {version}")));
        }
    }
    let (stated, _) = stated.context("no workspace members in the metadata")?;
    let floor = needs
        .iter()
        .map(|(rust, _)| *rust)
        .max()
        .unwrap_or(RustVersion(0, 0, 0));
    let mut over: Vec<String> = needs
        .iter()
        .filter(|(rust, _)| *rust > stated)
        .map(|(rust, package)| format!("{package} needs {rust}"))
        .collect();
    if !over.is_empty() {
        over.sort();
        bail!(
            "Cargo.toml's rust-version is {stated}, but the locked dependencies need {floor}: \
             set workspace.package.rust-version to {floor}.\n{}",
            over.join("\n")
        );
    }
    Ok((stated, floor))
}

#[test]
fn rust_version_covers_the_locked_dependencies() -> Result<()> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace");
    // The cargo that runs the tests (cargo and nextest set CARGO), so the
    // lock file is read as the build reads it.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .current_dir(workspace)
        .output()
        .context("running cargo metadata")?;
    ensure!(
        output.status.success(),
        "cargo metadata --locked --offline failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let (stated, floor) = check(&metadata)?;
    // Sanity: the lock file has hundreds of packages, most stating a
    // rust-version; a floor of nothing means the metadata was misread.
    ensure!(
        floor >= RustVersion(1, 60, 0),
        "floor {floor} is implausibly low"
    );
    eprintln!("rust-version {stated}; the locked dependencies need {floor}");
    Ok(())
}

/// The checker itself, on a made-up lock: it must refuse a workspace that
/// states less than a dependency needs, name that dependency, and accept
/// equal or higher.
#[test]
fn check_refuses_a_rust_version_below_a_dependency() -> Result<()> {
    let metadata = |stated: &str| {
        serde_json::json!({
            "workspace_members": ["path+file:///w/agent#0.1.0", "path+file:///w/server#0.1.0"],
            "packages": [
                {"id": "path+file:///w/agent#0.1.0", "name": "agent", "version": "0.1.0", "rust_version": stated},
                {"id": "path+file:///w/server#0.1.0", "name": "server", "version": "0.1.0", "rust_version": stated},
                {"id": "registry+x#old@1.0.0", "name": "old", "version": "1.0.0", "rust_version": "1.60"},
                {"id": "registry+x#none@1.0.0", "name": "none", "version": "1.0.0", "rust_version": null},
                {"id": "registry+x#new@2.3.0", "name": "new", "version": "2.3.0", "rust_version": "1.89.1"},
            ],
        })
    };
    let err = check(&metadata("1.85"))
        .expect_err("1.85 < 1.89.1")
        .to_string();
    assert!(err.contains("new 2.3.0 needs 1.89.1"), "{err}");
    assert!(
        err.contains("set workspace.package.rust-version to 1.89.1"),
        "{err}"
    );
    assert!(!err.contains("old 1.0.0"), "{err}");
    // A patch release counts: 1.89 is 1.89.0, below 1.89.1.
    assert!(check(&metadata("1.89")).is_err());
    let floor = RustVersion(1, 89, 1);
    assert_eq!(check(&metadata("1.89.1"))?, (floor, floor));
    assert_eq!(check(&metadata("1.90"))?, (RustVersion(1, 90, 0), floor));

    // Members that disagree are refused too: one of them would be wrong.
    let mut split = metadata("1.90");
    split["packages"][1]["rust_version"] = "1.80".into();
    assert!(check(&split).unwrap_err().to_string().contains("disagree"));
    Ok(())
}
