//! The command line: flags, help text and the exit-code table.

use crate::ignition_cmd;
use autonode_agent::config::{self, Flags, Node};
use clap::Parser;
use std::path::PathBuf;

const EXIT_CODES: &str = "\
Exit codes:
  0  joined (or already joined: a second run verifies and exits)
  1  failed on this node (a file could not be written, systemctl failed, ...)
  2  refused: the server refused the join, or sent something the agent refuses
  3  gave up: no answer from IMDS or the server by the deadline
  4  bad local config: userData, the local config file or flags

Every absolute path the agent writes (and --config-file, --state-dir) is
resolved under --root.

Proxy: the connection to the server (the join and the progress reports)
goes through the HTTP proxy in `[options] https-proxy`, else $HTTPS_PROXY,
else $https_proxy (HTTP CONNECT; TLS to the server end to end), except for
hosts in `[options] no-proxy`, else $NO_PROXY, else $no_proxy. The config
wins over the environment. IMDS is never reached through a proxy.";

/// Makes this EC2 instance a Kubernetes node: reads its identity from IMDSv2,
/// proves it to autonode-server, and starts kubelet with the credentials and
/// configuration it receives.
#[derive(Debug, Parser)]
#[command(name = "autonode-agent", version, about, after_help = EXIT_CODES)]
pub struct Cli {
    /// Local config file overriding userData (TOML, same keys); may be absent.
    #[arg(long, value_name = "PATH", default_value = config::LOCAL_FILE)]
    pub config_file: String,
    /// Do not read the config from userData (the local file and flags must
    /// then hold all of it).
    #[arg(long)]
    pub no_user_data: bool,
    /// Overrides `server-url`.
    #[arg(long, value_name = "URL")]
    pub server_url: Option<String>,
    /// Overrides `server-ca` with the PEM in this file.
    #[arg(long, value_name = "PATH")]
    pub server_ca_file: Option<PathBuf>,
    /// Overrides `server-ca-sha256`.
    #[arg(long, value_name = "HEX")]
    pub server_ca_sha256: Option<String>,
    /// Overrides `cluster-name`.
    #[arg(long, value_name = "NAME")]
    pub cluster_name: Option<String>,
    /// Overrides `options.deadline` ("90s", "10m"; at most 15m).
    #[arg(long, value_name = "DURATION")]
    pub deadline: Option<String>,
    /// Overrides `options.state-dir`.
    #[arg(long, value_name = "PATH")]
    pub state_dir: Option<PathBuf>,
    /// Directory every path is written under (tests use a temp dir).
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub root: PathBuf,
    /// IMDS base URL (plain http), e.g. a stand-in on loopback.
    ///
    /// The endpoint is, first match wins: this flag;
    /// $AWS_EC2_METADATA_SERVICE_ENDPOINT; the endpoint of the mode from
    /// --imds-endpoint-mode, then `[options] imds-endpoint-mode` in the local
    /// config file, then $AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE; else IPv4,
    /// http://169.254.169.254. An explicit endpoint beats any mode, as in the
    /// AWS SDKs.
    #[arg(long, value_name = "URL")]
    pub imds_endpoint: Option<String>,
    /// IMDS endpoint mode: IPv4 (http://169.254.169.254) or IPv6
    /// (http://[fd00:ec2::254]); any case. See --imds-endpoint for precedence.
    #[arg(long, value_name = "MODE")]
    pub imds_endpoint_mode: Option<String>,
    /// systemctl to run (`daemon-reload` when units changed, then
    /// `start --no-block <units> kubelet.service`).
    #[arg(
        long,
        alias = "start-command",
        value_name = "PATH",
        default_value = "systemctl"
    )]
    pub systemctl: String,
    /// kubelet binary the kubelet.service drop-in runs.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/kubelet")]
    pub kubelet_path: String,
    /// Leave starting kubelet.service to systemd, as the package's unit
    /// does (its `Wants=kubelet.service` queues kubelet behind the agent);
    /// only the units Ignition enabled are started.
    #[arg(long)]
    pub no_start_kubelet: bool,
    /// Where failures are echoed for the EC2 console output.
    #[arg(long, value_name = "PATH", default_value = "/dev/console")]
    pub console: PathBuf,
    /// Log debug messages too.
    #[arg(long, short)]
    pub verbose: bool,
    /// A tool instead of a join (`ignition apply`).
    #[command(subcommand)]
    pub tool: Option<Tool>,
}

/// Tools run by hand or by tests instead of a join.
#[derive(Debug, clap::Subcommand)]
pub enum Tool {
    /// Ignition tools.
    #[command(subcommand)]
    Ignition(ignition_cmd::IgnitionCommand),
}

impl Cli {
    /// The flags the config phase layers over the local file and userData.
    pub fn flags(&self) -> Flags {
        Flags {
            config_file: self.config_file.clone(),
            no_user_data: self.no_user_data,
            server_url: self.server_url.clone(),
            server_ca_file: self.server_ca_file.clone(),
            server_ca_sha256: self.server_ca_sha256.clone(),
            cluster_name: self.cluster_name.clone(),
            deadline: self.deadline.clone(),
            state_dir: self.state_dir.clone(),
            imds_endpoint: self.imds_endpoint.clone(),
            imds_endpoint_mode: self.imds_endpoint_mode.clone(),
            node: Node {
                systemctl: self.systemctl.clone(),
                kubelet_path: self.kubelet_path.clone(),
                start_kubelet: !self.no_start_kubelet,
            },
        }
    }
}
