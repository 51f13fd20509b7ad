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
    let at_main = (logging::process_age(), logging::cpu_time());
    let age = at_main.0.map_or("unknown".into(), |s| format!("{s:.2}"));
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
    let outcome_name = if outcome.is_ok() {
        "success"
    } else {
        "failure"
    };
    log_cost(outcome_name, at_main);
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
/// `took_s` wall and `cpu_s` CPU since the fork, which take in what
/// systemd does in the forked process before the exec (the unit's
/// sandbox); `main_took_s` and `main_cpu_s` the same from `main` on (the
/// agent's own code); `children_cpu_s` that of what it ran;
/// `peak_rss_kib` its own peak memory. key=value, for the VM tests
/// (tests/src/machines/vm.rs, AgentCost) and the benchmark.
fn log_cost(outcome: &str, at_main: (Option<f64>, Option<(f64, f64)>)) {
    let now = (logging::process_age(), logging::cpu_time());
    let show = |v: Option<f64>| v.map_or("unknown".into(), |v| format!("{:.2}", v.max(0.0)));
    let since_main = |then: Option<f64>, now: Option<f64>| Some(now? - then?);
    let (cpu_then, cpu_now) = (at_main.1.map(|c| c.0), now.1.map(|c| c.0));
    let peak = logging::peak_rss_kib().map_or("unknown".into(), |k| k.to_string());
    log::info!(
        "exiting outcome={outcome} took_s={} cpu_s={} main_took_s={} main_cpu_s={} children_cpu_s={} peak_rss_kib={peak}",
        show(now.0),
        show(cpu_now),
        show(since_main(at_main.0, now.0)),
        show(since_main(cpu_then, cpu_now)),
        show(now.1.map(|c| c.1))
    );
}
