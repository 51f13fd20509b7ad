//! autonode-server: the control plane half of autonode.

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

mod identity_cmd;

/// Decides which EC2 instances become nodes of this cluster, approves their
/// certificates and serves their configuration.
#[derive(Debug, Parser)]
#[command(name = "autonode-server", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inspect and verify EC2 instance identity signatures.
    Identity(identity_cmd::IdentityArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Identity(args) => identity_cmd::run(args),
    }
}
