//! `autonode-server ignition check FILE...`: would the server serve these
//! Ignition configs?
//!
//! Runs exactly the render path's check on each file
//! ([`autonode_server::join::render::parse_layer`]: JSON, then the shared
//! `autonode_shared::ignition::parse` the agent also runs before
//! applying), so an operator can vet a ConfigMap's `config.ign` before
//! shipping it. One verdict line per file on stdout.

use autonode_server::join::render::{self, IgnitionError};
use clap::{Args, Subcommand};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

const AFTER_HELP: &str = "\
Prints one line per file on stdout: `FILE: ok` or `FILE: refused: <reason>`,
the reason naming the offending field's JSON path. Files that cannot be read
are reported on stderr.

Exit status:
  0  every file would be served
  1  at least one file is refused
  2  usage error, or a file could not be read";

/// `ignition …` subcommands.
#[derive(Debug, Args)]
pub struct IgnitionArgs {
    #[command(subcommand)]
    command: IgnitionCommand,
}

#[derive(Debug, Subcommand)]
enum IgnitionCommand {
    /// Check Ignition configs by the rules the server renders with (and the
    /// agent applies with).
    #[command(after_help = AFTER_HELP)]
    Check(CheckArgs),
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// Ignition config files (JSON, spec 3.0.0 to 3.6.0); "-" for stdin.
    #[arg(value_name = "FILE", required = true)]
    files: Vec<PathBuf>,
}

/// What checking one file found.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Ok,
    Refused(String),
    Unreadable(String),
}

/// Runs an `ignition` subcommand; the process exit status.
pub fn run(args: &IgnitionArgs) -> i32 {
    let IgnitionCommand::Check(check) = &args.command;
    let mut status = 0;
    for file in &check.files {
        let name = file.display();
        match verdict(file) {
            Verdict::Ok => println!("{name}: ok"),
            Verdict::Refused(reason) => {
                println!("{name}: refused: {reason}");
                status = status.max(1);
            }
            Verdict::Unreadable(reason) => {
                eprintln!("{name}: cannot be read: {reason}");
                status = 2;
            }
        }
    }
    // The caller exits the process, which skips destructors.
    let _ = std::io::stdout().flush();
    status
}

fn verdict(file: &Path) -> Verdict {
    let bytes = match read(file) {
        Ok(bytes) => bytes,
        Err(e) => return Verdict::Unreadable(e.to_string()),
    };
    check_bytes(&bytes)
}

fn read(file: &Path) -> std::io::Result<Vec<u8>> {
    if file == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin().read_to_end(&mut bytes)?;
        return Ok(bytes);
    }
    std::fs::read(file)
}

/// The render path's verdict on one config's bytes.
fn check_bytes(bytes: &[u8]) -> Verdict {
    // ConfigMap and Secret values reach the render path as text.
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Verdict::Refused("not UTF-8 text".into());
    };
    match render::parse_layer("", text) {
        Ok(_) => Verdict::Ok,
        Err(IgnitionError::Json { error, .. }) => Verdict::Refused(format!("not JSON: {error}")),
        Err(IgnitionError::Spec { error, .. }) => Verdict::Refused(error.to_string()),
        Err(other) => Verdict::Refused(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_name_the_field() {
        let ok = br#"{"ignition": {"version": "3.6.0"}, "passwd": {}}"#;
        assert_eq!(check_bytes(ok), Verdict::Ok);
        let disks = br#"{"ignition": {"version": "3.3.0"}, "storage": {"disks": [{"device": "/dev/sdb"}]}}"#;
        assert_eq!(
            check_bytes(disks),
            Verdict::Refused(
                "storage.disks: autonode does not support this Ignition feature; remove it from the config"
                    .into()
            )
        );
        let Verdict::Refused(reason) = check_bytes(b"{") else {
            panic!("broken JSON accepted");
        };
        assert!(reason.starts_with("not JSON: "), "{reason}");
        assert_eq!(
            check_bytes(b"\xff"),
            Verdict::Refused("not UTF-8 text".into())
        );
    }

    #[test]
    fn a_missing_file_is_unreadable_not_refused() {
        let verdict = verdict(Path::new("/nonexistent/autonode/config.ign"));
        assert!(matches!(verdict, Verdict::Unreadable(_)), "{verdict:?}");
    }
}
