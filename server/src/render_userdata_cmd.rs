//! `autonode-server render-userdata`: prints the EC2NodeClass userData the
//! server keeps, for operators who manage their classes themselves (or want
//! to see what `serve` writes). The flags are `serve`'s own
//! ([`NodeConfigArgs`], flattened into it), so both render the same bytes.
//! `--format` picks the form, as a class's `autonode.dev/userdata-format`
//! annotation does for `serve`.

use crate::config;
use anyhow::{Context, Result};
use autonode_server::userdata::{self, CaForm, Format, NodeConfig};
use clap::{Args, ValueEnum};
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// What nodes are told in userData: shared by `serve` and `render-userdata`.
#[derive(Debug, Clone, Args)]
pub struct NodeConfigArgs {
    /// The join API's URL as nodes reach it, e.g.
    /// https://autonode.example.com:8443 (goes into userData).
    #[arg(long, env = "AUTONODE_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// PEM of the CA that signs --tls-cert (goes into userData as its
    /// SHA-256 pin, or as PEM with --join-ca-form=pem).
    #[arg(long, env = "AUTONODE_JOIN_CA_FILE")]
    pub join_ca_file: Option<PathBuf>,

    /// How userData names the join CA: `pin` (sha256 of its DER; short,
    /// needs the CA in the served chain) or `pem` (the certificates).
    #[arg(long, env = "AUTONODE_JOIN_CA_FORM", value_enum, default_value = "pin")]
    pub join_ca_form: JoinCaForm,

    /// The cluster's name, as the agent reports it (goes into userData).
    #[arg(long, env = "AUTONODE_CLUSTER_NAME")]
    pub cluster_name: Option<String>,

    /// The agent's overall deadline in seconds (at most 900); the agent's
    /// default (600) when unset.
    #[arg(
        long = "agent-deadline",
        env = "AUTONODE_AGENT_DEADLINE",
        value_name = "SECONDS",
        value_parser = clap::value_parser!(u64).range(1..=900)
    )]
    pub agent_deadline_secs: Option<u64>,
}

/// `render-userdata`'s arguments: `serve`'s userData flags and the form.
#[derive(Debug, Clone, Args)]
pub struct RenderArgs {
    #[command(flatten)]
    pub node: NodeConfigArgs,

    /// `toml` (the agent's config itself) or `ignition` (an Ignition spec
    /// 3.0.0 config writing that config to the agent's local config file,
    /// for Flatcar, Fedora CoreOS and RHCOS, whose Ignition reads userData).
    #[arg(long, value_enum, default_value = "toml")]
    pub format: FormatArg,
}

/// `--format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    Toml,
    Ignition,
}

impl From<FormatArg> for Format {
    fn from(arg: FormatArg) -> Self {
        match arg {
            FormatArg::Toml => Format::Toml,
            FormatArg::Ignition => Format::Ignition,
        }
    }
}

/// `--join-ca-form` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum JoinCaForm {
    Pin,
    Pem,
}

impl NodeConfigArgs {
    /// Whether any setting that only userData needs was given.
    pub fn is_set(&self) -> bool {
        self.public_url.is_some() || self.join_ca_file.is_some() || self.cluster_name.is_some()
    }

    /// The validated settings; every one of the three must be given.
    pub fn node_config(&self) -> Result<NodeConfig> {
        let missing = |flag: &str| format!("{flag} is required to render userData");
        let url = self
            .public_url
            .as_deref()
            .with_context(|| missing("--public-url"))?;
        let ca_file = self
            .join_ca_file
            .as_deref()
            .with_context(|| missing("--join-ca-file"))?;
        let name = self
            .cluster_name
            .as_deref()
            .with_context(|| missing("--cluster-name"))?;
        let form = match self.join_ca_form {
            JoinCaForm::Pin => CaForm::Pin,
            JoinCaForm::Pem => CaForm::Pem,
        };
        let deadline = self.agent_deadline_secs.map(Duration::from_secs);
        Ok(NodeConfig::new(
            url,
            &config::read(ca_file)?,
            form,
            name,
            deadline,
        )?)
    }
}

/// Prints the rendered userData in the chosen form, exactly the bytes
/// `serve` keeps on a class annotated with that form.
pub fn run(args: RenderArgs) -> Result<()> {
    let rendered = userdata::render_as(&args.node.node_config()?, args.format.into());
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(rendered.as_bytes())?;
    stdout.flush()?;
    Ok(())
}
