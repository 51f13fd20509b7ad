//! `autonode-agent ignition apply --root DIR FILE`: what the agent would
//! write for an Ignition config, written under a directory instead of `/`.
//!
//! It runs exactly the code a join runs (`autonode_agent::ignition::apply`)
//! and nothing else: no IMDS, no server, no kubelet, no `systemctl`. Tests
//! compare its result with the real Ignition's (tests/src/oracles/ignition.rs),
//! and an operator can see what a config would do before shipping it.

use autonode_agent::fsutil::Root;
use autonode_agent::ignition;
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const EXIT_CODES: &str = "\
Exit codes:
  0  applied (a second run changes nothing)
  1  failed on this machine: FILE unreadable, DIR missing, a write failed
  2  refused: the config is invalid or asks for what autonode does not do

Every path in the config is written under DIR, never outside it. Units are
written and enabled (links, as `systemctl enable` would make them) but never
started; users and groups go to DIR/etc/passwd and friends.";

/// `autonode-agent ignition ...`.
#[derive(Debug, Subcommand)]
pub enum IgnitionCommand {
    /// Applies an Ignition config under a directory, as a join would at `/`.
    #[command(after_help = EXIT_CODES)]
    Apply(ApplyArgs),
}

/// `autonode-agent ignition apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Directory standing for the node's `/` (must exist).
    #[arg(long, value_name = "DIR")]
    root: PathBuf,
    /// The Ignition config (JSON, spec v3).
    #[arg(value_name = "FILE")]
    file: PathBuf,
}

/// Why `apply` stopped; decides the exit code.
#[derive(Debug)]
enum Stop {
    /// The machine (1).
    Node(String),
    /// The config (2).
    Refused(String),
}

/// Runs the subcommand; prints what changed to stdout, failures to stderr.
pub fn run(command: &IgnitionCommand) -> ExitCode {
    let IgnitionCommand::Apply(args) = command;
    match apply(&args.root, &args.file) {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(Stop::Node(message)) => {
            eprintln!("autonode-agent ignition apply: {message}");
            ExitCode::from(1)
        }
        Err(Stop::Refused(message)) => {
            eprintln!("autonode-agent ignition apply: refused: {message}");
            ExitCode::from(2)
        }
    }
}

/// Reads, parses and applies `file` under `root`; the text to print.
fn apply(root: &Path, file: &Path) -> Result<String, Stop> {
    let metadata = std::fs::metadata(root).map_err(|e| {
        Stop::Node(format!(
            "--root {}: {e} (create the directory first)",
            root.display()
        ))
    })?;
    if !metadata.is_dir() {
        return Err(Stop::Node(format!(
            "--root {}: not a directory",
            root.display()
        )));
    }
    let text = std::fs::read(file).map_err(|e| Stop::Node(format!("{}: {e}", file.display())))?;
    let config: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| Stop::Refused(format!("{}: not JSON: {e}", file.display())))?;
    let applied = ignition::apply(&Root::new(root), &config).map_err(|e| {
        let message = format!("{}: {e}", file.display());
        if e.is_refusal() {
            Stop::Refused(message)
        } else {
            Stop::Node(message)
        }
    })?;
    let mut report = format!("changed: {} entries\n", applied.changed);
    for unit in &applied.enabled_units {
        report.push_str(&format!("enabled: {unit} (not started)\n"));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_config(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("config.ign");
        std::fs::write(&path, text).expect("writing the config");
        path
    }

    #[test]
    fn applies_under_the_root_and_reports_the_change() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir(&root).expect("root");
        let file = write_config(
            dir.path(),
            r#"{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"/etc/motd","contents":{"source":"data:,hi"}}]}}"#,
        );
        let report = apply(&root, &file).expect("applied");
        assert_eq!(report, "changed: 1 entries\n");
        assert_eq!(std::fs::read(root.join("etc/motd")).expect("motd"), b"hi");
        let again = apply(&root, &file).expect("applied again");
        assert_eq!(again, "changed: 0 entries\n");
    }

    #[test]
    fn a_bad_config_is_refused_and_a_missing_root_is_the_node() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        let file = write_config(dir.path(), "{not json");
        assert!(matches!(apply(&root, &file), Err(Stop::Node(m)) if m.contains("--root")));
        std::fs::create_dir(&root).expect("root");
        assert!(matches!(apply(&root, &file), Err(Stop::Refused(m)) if m.contains("not JSON")));
        let file = write_config(
            dir.path(),
            r#"{"ignition":{"version":"3.3.0"},"storage":{"disks":[{"device":"/dev/sda"}]}}"#,
        );
        assert!(matches!(apply(&root, &file), Err(Stop::Refused(_))));
        let missing = dir.path().join("absent.ign");
        assert!(matches!(apply(&root, &missing), Err(Stop::Node(_))));
    }
}
