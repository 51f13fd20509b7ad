//! An instance with IMDS and no server: the agent binary in its own network
//! namespace, for what happens before and around the join (which IMDS
//! endpoint, which proxy, which refusals). Cheaper than
//! [`crate::machines::node::SimulatedNode`], which needs a whole [`crate::server::world::World`].
//!
//! IMDS answers at 169.254.169.254:80 or, for an instance whose metadata
//! options enable IPv6, only at `[fd00:ec2::254]:80` (the address added to
//! the namespace's `lo`), so a test can tell which one the agent used.

use crate::cloud::fakecloud::imds::{Imds, IMDS_ADDR};
use crate::cloud::fakecloud::{FakeCloud, Instance};
use crate::machines::node::{agent_binary, IMDS_ENDPOINT_ENV};
use crate::network::netns::NetNs;
use crate::network::proxy::PROXY_ENV;
use anyhow::{bail, Context as _, Result};
use std::net::{Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Output;
use tempfile::TempDir;

/// IMDS's IPv6 address on a Nitro instance.
pub const IMDS_V6_ADDR: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    80,
);

/// Variables a test's environment must not pass on to the agent: they
/// choose its IMDS endpoint, its proxy and where it logs.
const HERMETIC: [&str; 3] = [
    IMDS_ENDPOINT_ENV,
    "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE",
    "JOURNAL_STREAM",
];

/// Which of IMDS's addresses answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImdsAt {
    V4,
    V6,
}

/// One machine without a server. Field order is drop order: IMDS stops
/// before the namespace goes.
pub struct BareNode {
    pub imds: Imds,
    pub root: TempDir,
    pub netns: NetNs,
    pub instance: Instance,
    _cloud: FakeCloud,
}

impl BareNode {
    /// Boots a machine whose userData is `user_data`, IMDS at `at`. Must
    /// be called within a tokio runtime.
    pub fn boot(user_data: &str, at: ImdsAt) -> Result<Self> {
        let cloud = FakeCloud::new()?;
        let instance = cloud.launch(
            Instance::builder()
                .user_data(user_data.as_bytes().to_vec())
                .build(),
        );
        let netns = NetNs::new()?;
        let addr = match at {
            ImdsAt::V4 => IMDS_ADDR,
            ImdsAt::V6 => {
                add_ipv6_imds_address(&netns)?;
                IMDS_V6_ADDR
            }
        };
        let imds = Imds::start_on(netns.bind(addr)?, &instance, cloud.ca(), None)?;
        let root = tempfile::Builder::new()
            .prefix("autonode-bare-")
            .tempdir()?;
        std::fs::write(root.path().join("console.log"), "")?;
        Ok(Self {
            imds,
            root,
            netns,
            instance,
            _cloud: cloud,
        })
    }

    /// Writes the machine's local config file (`/etc/autonode/agent.toml`).
    pub fn write_local_config(&self, toml: &str) -> Result<()> {
        let path = self.path("/etc/autonode/agent.toml");
        std::fs::create_dir_all(path.parent().context("config path has a parent")?)?;
        std::fs::write(&path, toml)?;
        Ok(())
    }

    /// Runs the agent inside with `env` as its only proxy and IMDS
    /// settings, and `args` after the machine's own flags.
    pub async fn run_agent(&self, env: &[(&str, &str)], args: &[&str]) -> Result<Output> {
        let root = self.root.path();
        let mut command = self.netns.command(agent_binary()?);
        command
            .arg(format!("--root={}", root.display()))
            .arg(format!("--console={}", root.join("console.log").display()))
            // The runs here end before kubelet would be started.
            .arg("--systemctl=/bin/false")
            .args(args);
        for name in HERMETIC.iter().chain(PROXY_ENV.iter()) {
            command.env_remove(name);
        }
        command.envs(env.iter().copied());
        command.output().await.context("running autonode-agent")
    }

    /// Path of a file on the machine.
    pub fn path(&self, absolute: &str) -> PathBuf {
        self.root.path().join(absolute.trim_start_matches('/'))
    }

    /// What the agent wrote to the console.
    pub fn console(&self) -> String {
        std::fs::read_to_string(self.path("/console.log")).unwrap_or_default()
    }
}

/// fd00:ec2::254 on the namespace's `lo`, usable at once (no duplicate
/// address detection: nothing else is on that link).
fn add_ipv6_imds_address(netns: &NetNs) -> Result<()> {
    let address = format!("{}/128", IMDS_V6_ADDR.ip());
    let output = std::process::Command::new("ip")
        .args([
            "-n",
            netns.name(),
            "addr",
            "add",
            &address,
            "dev",
            "lo",
            "nodad",
        ])
        .output()
        .context("running ip (iproute2)")?;
    if !output.status.success() {
        bail!(
            "adding {address} in {}: {}",
            netns.name(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
