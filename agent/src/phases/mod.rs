//! config → identity → keys → join → apply → start, one way. Each phase is
//! a function that takes what it needs and returns what it makes; this
//! module runs them in order and owns what they share ([`Run`]).
//!
//! Each phase logs `phase=<name> started` and `phase=<name> succeeded`, is
//! recorded in the state directory, and is reported to the server; a
//! failure is reported here and returned for `main` to log and exit with.

mod apply;
mod config;
mod identity;
mod join;
mod keys;
mod start;

use crate::failure::{Failure, OrFail as _};
use autonode_agent::config::{Flags, Settings};
use autonode_agent::fsutil::Root;
use autonode_agent::kubelet;
use autonode_agent::proxy::Route;
use autonode_agent::report::{Reporter, REPORT_BUDGET};
use autonode_agent::retry::Deadline;
use autonode_agent::server_client::ServerClient;
use autonode_agent::state::StateDir;
use autonode_shared::clock::Clock;
use autonode_shared::protocol::{Outcome, Phase};
use std::path::{Path, PathBuf};
use tokio::task::JoinSet;

/// What the phases after config share.
struct Run {
    root: Root,
    settings: Settings,
    deadline: Deadline,
    /// The state directory, under the root.
    state_dir: PathBuf,
    state: StateDir,
    /// The last phase an earlier run recorded.
    resumed: Option<Phase>,
    /// Reports sent in the background, waited for before exit.
    reports: JoinSet<()>,
    /// Where "now" comes from (certificate expiry, the server's certificate
    /// checked in TLS, report timestamps): the agent's one read of wall time.
    clock: Clock,
}

/// The whole join, from the flags to kubelet started.
pub async fn run(flags: &Flags, root: Root) -> Result<(), Failure> {
    let started_at = tokio::time::Instant::now();
    let (settings, state_dir) = config::run(flags, &root).await?;
    let deadline = Deadline::after(
        settings
            .config
            .deadline
            .saturating_sub(started_at.elapsed()),
    );
    let mut run = Run {
        root,
        settings,
        deadline,
        state: StateDir::new(state_dir.clone()),
        state_dir,
        resumed: None,
        reports: JoinSet::new(),
        clock: Clock::SYSTEM,
    };
    if already_joined(&mut run)? {
        return Ok(());
    }
    let identity = identity::run(&run.settings, run.deadline).await?;
    let client = ServerClient::new(&run.settings.config, run.clock)
        .or_fail_in(Phase::Config, "server trust")?;
    log_route(&run.settings);
    let reporter = Reporter::new(client.clone(), identity.rsa2048.clone(), run.clock);
    // kubelet's version is probed while the agent makes keys and waits on
    // the server.
    let prepared = apply::probe_kubelet(&run).and_then(|probe| Ok((probe, keys::run(&run)?)));
    let (result, keys) = match prepared {
        Ok((probe, keys)) => {
            let result = join_and_start(&mut run, &identity, &client, &reporter, &keys, probe);
            (result.await, Some(keys))
        }
        Err(failure) => (Err(failure), None),
    };
    if let Err(failure) = &result {
        let message = format!("{:#}", failure.error);
        let key = keys.as_ref().map(|keys| &keys.client);
        reporter
            .send(failure.phase, Outcome::Fatal, &message, key)
            .await;
    }
    // Progress reports had their own budget; don't wait longer than that.
    let _ = tokio::time::timeout(REPORT_BUDGET, async {
        while run.reports.join_next().await.is_some() {}
    })
    .await;
    result
}

/// join → apply → start. One progress report, at the end: the join request
/// itself tells the server everything earlier reports would, and they would
/// compete with it. A join that keeps failing is reported as `Retrying`; a
/// failure is reported by the caller.
async fn join_and_start(
    run: &mut Run,
    identity: &autonode_agent::imds::Identity,
    client: &ServerClient,
    reporter: &Reporter,
    keys: &keys::NodeKeys,
    probe: autonode_agent::kubelet::Probe,
) -> Result<(), Failure> {
    let answer = join::run(run, identity, client, reporter, keys).await?;
    let units = apply::run(run, identity, &answer, keys, probe)?;
    start::run(run, &answer, units, reporter, keys)
}

fn log_route(settings: &Settings) {
    let config = &settings.config;
    let route = config
        .proxy
        .route(config.server_url.host().unwrap_or_default());
    match route {
        Route::Direct => log::debug!("server connection: {route}"),
        _ => log::info!("server connection: {route}"),
    }
}

fn started(phase: Phase) {
    log::info!("phase={} started", phase.as_str());
}

fn succeeded(phase: Phase, detail: &str) {
    log::info!("phase={} succeeded {detail}", phase.as_str());
}

fn record(
    run: &Run,
    phase: Phase,
    node_name: Option<&str>,
    written: &[&Path],
) -> Result<(), Failure> {
    let recorded = run.state.record(phase, node_name, written);
    recorded.or_fail_in(phase, "recording progress")
}

/// A second run after success: verify and stop, without joining again.
fn already_joined(run: &mut Run) -> Result<bool, Failure> {
    let state = run.state.load().or_fail_in(Phase::Config, "state")?;
    run.resumed = state.completed;
    if state.completed != Some(Phase::Start) {
        if let Some(phase) = state.completed {
            log::info!("resuming after phase={}", phase.as_str());
        }
        return Ok(false);
    }
    match kubelet::verify_joined(&run.root, run.clock.unix()) {
        Ok(()) => {
            log::info!(
                "already joined as {}; nothing to do",
                state.node_name.unwrap_or_default()
            );
            Ok(true)
        }
        Err(problem) => {
            log::warn!("an earlier run joined, but {problem}; setting up again");
            Ok(false)
        }
    }
}
