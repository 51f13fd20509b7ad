//! autonode-agent: run by systemd at boot, before kubelet.
//!
//! config → identity → keys → join → apply → start.

#![forbid(unsafe_code)]

use clap::Parser;

/// Makes this EC2 instance a Kubernetes node: reads its identity from IMDSv2,
/// proves it to autonode-server, and starts kubelet with the credentials and
/// configuration it receives.
#[derive(Debug, Parser)]
#[command(name = "autonode-agent", version, about)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    anyhow::bail!("the join flow is being built (issue 4)")
}
