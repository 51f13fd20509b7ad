//! autonode-agent: run by systemd at boot, before kubelet.
//!
//! Parses the command line, runs a tool or the join ([`phases`]), and exits
//! with the code that says how it went ([`failure::Kind`]).

#![forbid(unsafe_code)]

mod cli;
mod failure;
mod ignition_cmd;
mod phases;

use autonode_agent::fsutil::Root;
use autonode_agent::logging;
use clap::Parser;
use cli::{Cli, Tool};
use failure::{Failure, Kind};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.verbose);
    if let Some(Tool::Ignition(command)) = &cli.tool {
        return ignition_cmd::run(command);
    }
    // The first line, as early as logging allows, with how long ago the
    // process was forked: the VM test splits the agent's start-up with it
    // (systemd's sandbox and the exec before main, the journal after).
    let age = logging::process_age().map_or("unknown".into(), |s| format!("{s:.2}"));
    log::info!(
        "autonode-agent {} starting since_fork_s={age}",
        env!("CARGO_PKG_VERSION")
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let outcome = match runtime {
        Ok(runtime) => runtime.block_on(phases::run(&cli.flags(), Root::new(&cli.root))),
        Err(e) => Err(Failure {
            kind: Kind::Failed,
            phase: autonode_shared::protocol::Phase::Config,
            error: e.into(),
        }),
    };
    log_cost(if outcome.is_ok() {
        "success"
    } else {
        "failure"
    });
    let Err(failure) = outcome else {
        return ExitCode::SUCCESS;
    };
    let phase = failure.phase.as_str();
    let message = format!("phase={phase} failed: {:#}", failure.error);
    log::error!("{message}");
    logging::to_console(&cli.console, &message);
    ExitCode::from(failure.kind as u8)
}

/// The last line: what the run cost, from the fork to here (with the
/// unit's --no-start-kubelet, systemd starts kubelet once this process
/// exits, so this is the agent's share of the boot up to kubelet's start):
/// `took_s` wall, `cpu_s` its own CPU, `children_cpu_s` that of what it
/// ran. key=value, for the VM tests (tests/src/vm.rs, AgentCost).
fn log_cost(outcome: &str) {
    let took = logging::process_age().map_or("unknown".into(), |s| format!("{s:.2}"));
    let (cpu, children) = logging::cpu_time().map_or(("unknown".into(), "unknown".into()), |c| {
        (format!("{:.2}", c.0), format!("{:.2}", c.1))
    });
    log::info!("exiting outcome={outcome} took_s={took} cpu_s={cpu} children_cpu_s={children}");
}
