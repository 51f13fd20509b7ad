//! autonode-server: the control plane half of autonode.

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

/// Decides which EC2 instances become nodes of this cluster, approves their
/// certificates and serves their configuration.
#[derive(Debug, Parser)]
#[command(name = "autonode-server", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {}
}
