//! `autonode-server identity verify`: the operator's view of what the join
//! API would conclude about an identity signature.
//!
//! It uses the same trust store as the server (AWS's embedded certificates
//! plus the operator's `--certs`), so "does this node's signature verify
//! here?" can be answered from a shell, before any NodeClaim is involved.
//! Policy (accounts, regions, age) is not applied: this checks the
//! signature and shows the document.

use anyhow::{anyhow, Context as _};
use autonode_shared::identity::{self, TrustStore};
use clap::{Args, Subcommand};
use std::io::Read as _;
use std::path::{Path, PathBuf};

/// `identity …` subcommands.
#[derive(Debug, Args)]
pub struct IdentityArgs {
    #[command(subcommand)]
    command: IdentityCommand,
}

#[derive(Debug, Subcommand)]
enum IdentityCommand {
    /// Verify an rsa2048 identity signature and print the signed document
    /// as JSON; exit non-zero with the reason if it is refused.
    Verify(VerifyArgs),
}

#[derive(Debug, Args)]
struct VerifyArgs {
    /// File holding what IMDS returns from
    /// /latest/dynamic/instance-identity/rsa2048 ("-" for stdin).
    #[arg(long, value_name = "FILE")]
    signature: PathBuf,
    /// Extra certificates to trust beside AWS's: a directory of
    /// <region>.pem / any.pem files, or one such file.
    #[arg(long, value_name = "DIR|FILE")]
    certs: Option<PathBuf>,
}

/// Run an `identity` subcommand.
pub fn run(args: IdentityArgs) -> anyhow::Result<()> {
    match args.command {
        IdentityCommand::Verify(v) => verify(&v),
    }
}

fn verify(args: &VerifyArgs) -> anyhow::Result<()> {
    let trust = trust_store(args.certs.as_deref())?;
    let input = read_input(&args.signature)?;
    let verified =
        identity::verify(&input, &trust).map_err(|e| anyhow!("refused ({}): {e}", e.label()))?;
    // Print the signed content itself (every field AWS put there, known to
    // us or not), re-indented; it parsed as a document, so it is JSON.
    let value: serde_json::Value = serde_json::from_slice(verified.content_bytes())?;
    println!("{}", serde_json::to_string_pretty(&value)?);
    Ok(())
}

fn trust_store(certs: Option<&Path>) -> anyhow::Result<TrustStore> {
    let mut trust = TrustStore::aws();
    if let Some(path) = certs {
        let added = if path.is_dir() {
            trust.load_dir(path)
        } else {
            trust.load_file(path)
        };
        added.with_context(|| format!("loading certificates from {}", path.display()))?;
    }
    Ok(trust)
}

fn read_input(path: &Path) -> anyhow::Result<Vec<u8>> {
    if path == Path::new("-") {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf)?;
        return Ok(buf);
    }
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}
