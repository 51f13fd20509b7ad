//! The config phase: the layered config, and where the state lives.

use super::{started, succeeded};
use crate::failure::{fail_as, Failure, Kind, OrFail as _};
use autonode_agent::config::{self, Flags, Settings};
use autonode_agent::fsutil::Root;
use autonode_shared::protocol::Phase;
use std::path::PathBuf;

/// The run's settings and its state directory under `root`.
pub(super) async fn run(flags: &Flags, root: &Root) -> Result<(Settings, PathBuf), Failure> {
    started(Phase::Config);
    let settings = config::load(flags, root).await.or_fail(Phase::Config)?;
    let config = &settings.config;
    succeeded(
        Phase::Config,
        &format!(
            "server={} cluster={}",
            config.server_url, config.cluster_name
        ),
    );
    let state_dir = root
        .join(&config.state_dir.to_string_lossy())
        .map_err(fail_as(Kind::Config, Phase::Config, "state-dir"))?;
    Ok((settings, state_dir))
}
