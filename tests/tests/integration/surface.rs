//! The public surface, frozen (issue 49, item 5): every name an operator,
//! an AMI baker or their tooling may depend on, read from the tree as it
//! is, must be the list in `tests/public-surface.txt`. docs/upgrading.md,
//! "Deprecation", says how each kind may change; this test makes a change
//! deliberate: a name added or removed fails here until the list says so
//! (marked `+` or `-` until the next release is cut) and CHANGELOG.md's
//! Unreleased section names it.
//!
//! The kinds: the binaries' flags and environment variables (their
//! `--help`, every subcommand), the chart's values (values.yaml's keys),
//! metric names (the server's registry) and label names, refusal reasons
//! (the `reason` label's values), Event and condition reasons, condition
//! types, `autonode.dev/` annotations and labels, and the files the
//! agent's packages install (with the unit's name).
//!
//! Needs the built binaries and the checkout: seconds.

use anyhow::{ensure, Context, Result};
use autonode_tests::machines::node::agent_binary;
use autonode_tests::server::server_binary;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const LIST: &str = "tests/public-surface.txt";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

fn read_in(root: &Path, path: &str) -> Result<String> {
    fs::read_to_string(root.join(path)).with_context(|| format!("reading {path}"))
}

fn read(path: &str) -> Result<String> {
    read_in(&repo(), path)
}

/// The flags and environment variables of `binary` and of every
/// subcommand under it, from `--help`.
fn flags(binary: &Path, name: &str, path: &[String], out: &mut BTreeSet<String>) -> Result<()> {
    let output = Command::new(binary).args(path).arg("--help").output()?;
    ensure!(output.status.success(), "{name} {path:?} --help failed");
    let help = String::from_utf8_lossy(&output.stdout).into_owned();
    let command = std::iter::once(name.to_string())
        .chain(path.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    let mut in_commands = false;
    for line in help.lines() {
        let trimmed = line.trim_start();
        if line == "Commands:" {
            in_commands = true;
            continue;
        }
        if in_commands {
            match trimmed.split_whitespace().next() {
                Some("help") => {}
                Some(sub) if line.starts_with("  ") => {
                    let mut deeper = path.to_vec();
                    deeper.push(sub.to_string());
                    flags(binary, name, &deeper, out)?;
                }
                _ => in_commands = false,
            }
            continue;
        }
        // `--long …` or `-s, --long …`.
        let option = trimmed.strip_prefix("--").or_else(|| {
            let short = trimmed.strip_prefix('-')?;
            short.split_once(", --").map(|(_, long)| long)
        });
        if let Some(option) = option {
            let flag: String = option
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if !flag.is_empty() && flag != "help" && flag != "version" {
                out.insert(format!("flag {command} --{flag}"));
            }
        }
        for env in line.split("[env: ").skip(1) {
            let var: String = env
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.insert(format!("env {var}"));
        }
    }
    Ok(())
}

/// values.yaml's keys, as dotted paths to each leaf (a map with entries is
/// walked; an empty map, a list or a scalar is a leaf).
fn values(prefix: &str, value: &serde_yaml::Value, out: &mut BTreeSet<String>) {
    match value {
        serde_yaml::Value::Mapping(map) if !map.is_empty() => {
            for (key, inner) in map {
                let key = key.as_str().unwrap_or_default();
                let path = if prefix.is_empty() {
                    key.to_string()
                } else {
                    format!("{prefix}.{key}")
                };
                values(&path, inner, out);
            }
        }
        _ => {
            out.insert(format!("value {prefix}"));
        }
    }
}

/// The string literals of `text` that follow `opening` on a line (or on
/// the next line when the opening ends it), up to a `#[cfg(test)]`.
fn literals_after(text: &str, opening: &str) -> Vec<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut out = Vec::new();
    let mut lines = code.lines().peekable();
    while let Some(line) = lines.next() {
        let Some((_, rest)) = line.split_once(opening) else {
            continue;
        };
        let rest = if rest.trim().is_empty() {
            lines.peek().copied().unwrap_or_default()
        } else {
            rest
        };
        if let Some(literal) = rest
            .trim()
            .strip_prefix('"')
            .and_then(|r| r.split('"').next())
        {
            out.push(literal.to_string());
        }
    }
    out
}

/// Every name of the surface as the tree at `root` has it, with `binaries`
/// (the server's and the agent's) built from it.
fn surface(root: &Path, binaries: [PathBuf; 2]) -> Result<BTreeSet<String>> {
    let read = |path: &str| read_in(root, path);
    let mut out = BTreeSet::new();
    let [server, agent] = binaries;
    flags(&server, "autonode-server", &[], &mut out)?;
    flags(&agent, "autonode-agent", &[], &mut out)?;

    let chart: serde_yaml::Value =
        serde_yaml::from_str(&read("packaging/helm/autonode-server/values.yaml")?)?;
    values("", &chart, &mut out);

    let metrics = read("server/src/kube/metrics.rs")?;
    for name in literals_after(&metrics, "registry.register(") {
        out.insert(format!("metric autonode_{name}"));
    }
    let code = metrics.split("#[cfg(test)]").next().unwrap_or_default();
    for block in code.split("EncodeLabelSet)]").skip(1) {
        let body = block.split('}').next().unwrap_or_default();
        for line in body.lines() {
            let field = line
                .trim()
                .strip_prefix("pub ")
                .and_then(|f| f.split_once(':'));
            if let Some((field, _)) =
                field.filter(|(f, _)| f.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
            {
                out.insert(format!("label {field}"));
            }
        }
    }
    let label = |s: &String| s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    // The join's refusals, and those the attestation verdict names for it.
    let refusals = [
        "server/src/join/refusal.rs",
        "server/src/attestation/verdict.rs",
    ];
    for file in refusals {
        for reason in literals_after(&read(file)?, "=> ") {
            if label(&reason) {
                out.insert(format!("refusal {reason}"));
            }
        }
    }
    // The agent's own environment variables (those not behind a flag).
    for var in literals_after(&read("agent/src/nitrotpm.rs")?, "_ENV: &str = ") {
        out.insert(format!("env {var}"));
    }
    let camel = |s: &String| {
        s.starts_with(|c: char| c.is_ascii_uppercase())
            && s.bytes().all(|b| b.is_ascii_alphanumeric())
    };
    for reason in literals_after(&read("server/src/kube/reason.rs")?, "=> ") {
        if camel(&reason) {
            out.insert(format!("reason {reason}"));
        }
    }
    for condition in literals_after(&read("server/src/kube/condition.rs")?, ": &str = ") {
        out.insert(format!("condition {condition}"));
    }
    annotations(&root.join("server/src"), &mut out)?;
    annotations(&root.join("agent/src"), &mut out)?;

    let cargo = read("agent/Cargo.toml")?;
    for dest in cargo.split("dest = \"").skip(1) {
        out.insert(format!(
            "path {}",
            dest.split('"').next().unwrap_or_default()
        ));
    }
    Ok(out)
}

/// Every `autonode.dev/<name>` in the code under `dir` (tests left out).
fn annotations(dir: &Path, out: &mut BTreeSet<String>) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            annotations(&path, out)?;
            continue;
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !name.ends_with(".rs") || name == "tests.rs" {
            continue;
        }
        let text = fs::read_to_string(&path)?;
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for found in code.split("autonode.dev/").skip(1) {
            let key: String = found
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
                .collect();
            let key = key.trim_end_matches(['.', '-']);
            if !key.is_empty() {
                out.insert(format!("annotation autonode.dev/{key}"));
            }
        }
    }
    Ok(())
}

/// The list: `(current names, names marked + or - since the last release)`.
fn listed() -> Result<(BTreeSet<String>, Vec<String>)> {
    let (mut current, mut marked) = (BTreeSet::new(), Vec::new());
    for line in read(LIST)?.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(added) = line.strip_prefix("+ ") {
            current.insert(added.to_string());
            marked.push(added.to_string());
        } else if let Some(removed) = line.strip_prefix("- ") {
            marked.push(removed.to_string());
        } else {
            current.insert(line.to_string());
        }
    }
    Ok((current, marked))
}

/// The name a changelog line names an item by: its last word (the flag,
/// the variable, the value's key, the metric, the reason, the path).
/// A `serve` value by its flag's name.
fn name_of(item: &str) -> &str {
    let last = item.rsplit(' ').next().unwrap_or(item);
    match item.starts_with("value ") {
        true => last.strip_prefix("serve.").unwrap_or(last),
        false => last,
    }
}

#[test]
fn the_public_surface_is_the_list_and_each_change_is_in_the_changelog() -> Result<()> {
    let found = surface(&repo(), [server_binary()?, agent_binary()?])?;
    let (current, marked) = listed()?;
    let added: Vec<&String> = found.difference(&current).collect();
    let removed: Vec<&String> = current.difference(&found).collect();
    assert!(
        added.is_empty() && removed.is_empty(),
        "the public surface changed (docs/upgrading.md, \"Deprecation\": a name is deprecated \
         and warned for a minor release before it goes). Update {LIST}: add each new name \
         marked `+ `, mark each removed one `- ` (packaging/cut drops the marks), AND add a \
         CHANGELOG.md line under Unreleased naming it.\nNew:\n{}\nGone:\n{}",
        added
            .iter()
            .map(|s| format!("+ {s}"))
            .collect::<Vec<_>>()
            .join("\n"),
        removed
            .iter()
            .map(|s| format!("- {s}"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    let changelog = read("CHANGELOG.md")?;
    let unreleased = changelog
        .split("\n## Unreleased\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .context("CHANGELOG.md has no Unreleased section")?;
    let unsaid: Vec<&String> = marked
        .iter()
        .filter(|item| !unreleased.contains(name_of(item)))
        .collect();
    assert!(
        unsaid.is_empty(),
        "{LIST} marks these as changed since the last release, but CHANGELOG.md's Unreleased \
         section does not name them: {unsaid:?}"
    );
    // Features come in minor releases only (docs/upgrading.md): a tree on
    // its way to a patch release (X.Y.Z-dev, Z > 0) adds no name.
    let version = env!("CARGO_PKG_VERSION");
    let patch = version
        .split(['-', '+'])
        .next()
        .and_then(|v| v.rsplit('.').next());
    let is_patch = patch.is_some_and(|p| p != "0");
    let added_here: Vec<&String> = marked.iter().filter(|m| current.contains(*m)).collect();
    assert!(
        !is_patch || added_here.is_empty(),
        "{version} is a patch release, which adds no name to the public surface: {added_here:?}"
    );
    ensure!(found.len() > 150, "only {} names found", found.len());
    Ok(())
}

/// Prints the surface, for writing the list (`--run-ignored all
/// --no-capture`); of another checkout with `AUTONODE_SURFACE_ROOT`
/// (its binaries: `AUTONODE_SERVER_BIN`, `AUTONODE_AGENT_BIN`).
#[test]
#[ignore = "a tool: prints the surface"]
fn print_the_surface() -> Result<()> {
    let root = std::env::var_os("AUTONODE_SURFACE_ROOT").map_or_else(repo, PathBuf::from);
    for item in surface(&root, [server_binary()?, agent_binary()?])? {
        println!("{item}");
    }
    Ok(())
}
