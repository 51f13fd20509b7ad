//! `autonode-server render-userdata`: prints the EC2NodeClass userData the
//! server keeps, for operators who manage their classes themselves (or want
//! to see what `serve` writes). The flags are `serve`'s own
//! ([`UserDataArgs`], flattened into it), so both render the same bytes.
//! `--format` picks the form, as a class's `autonode.dev/userdata-format`
//! annotation does for `serve`.

use crate::cmd::config::UserDataArgs;
use anyhow::Result;
use autonode_server::controllers::nodeclass::userdata::{self, Format};
use clap::{Args, ValueEnum};
use std::io::Write as _;

/// `render-userdata`'s arguments: `serve`'s userData flags and the form.
#[derive(Debug, Clone, Args)]
pub struct RenderArgs {
    #[command(flatten)]
    pub node: UserDataArgs,

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

/// Prints the rendered userData in the chosen form, exactly the bytes
/// `serve` keeps on a class annotated with that form.
pub fn run(args: RenderArgs) -> Result<()> {
    let rendered = userdata::render_as(&args.node.settings()?, args.format.into());
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(rendered.as_bytes())?;
    stdout.flush()?;
    Ok(())
}
