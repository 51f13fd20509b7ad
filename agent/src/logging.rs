//! Where the agent's log goes: the journal when systemd runs it (it sets
//! `JOURNAL_STREAM`), stderr otherwise; failures also go to the console so
//! they show in the EC2 console output, where an operator looks first when
//! a machine never became a node.

use log::{LevelFilter, Log, Metadata, Record};
use std::io::Write as _;
use std::path::Path;

struct Stderr;

impl Log for Stderr {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if self.enabled(record.metadata()) {
            let _ = writeln!(
                std::io::stderr().lock(),
                "autonode-agent {}: {}",
                record.level(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

static STDERR: Stderr = Stderr;

/// Installs the logger; `verbose` adds debug messages.
pub fn init(verbose: bool) {
    let level = if verbose {
        LevelFilter::Debug
    } else {
        LevelFilter::Info
    };
    let journal = std::env::var_os("JOURNAL_STREAM").is_some()
        && systemd_journal_logger::JournalLog::new()
            .map(|j| j.with_syslog_identifier("autonode-agent".into()))
            .and_then(|j| j.install().map_err(std::io::Error::other))
            .is_ok();
    if !journal {
        let _ = log::set_logger(&STDERR);
    }
    log::set_max_level(level);
}

/// Writes `message` to the console, best effort: a missing or unwritable
/// console must not hide the failure from the other log.
pub fn to_console(console: &Path, message: &str) {
    let written = std::fs::OpenOptions::new()
        .write(true)
        .open(console)
        .and_then(|mut f| writeln!(f, "autonode-agent: {message}"));
    if let Err(e) = written {
        log::debug!("console {}: {e}", console.display());
    }
}

/// Seconds since this process was forked, from /proc (both times count
/// from boot, in kernel ticks of 10 ms); `None` without /proc.
pub fn process_age() -> Option<f64> {
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let uptime: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces: count fields after its ')'.
    // starttime is field 22, the 20th after the name.
    let ticks: f64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    Some((uptime - ticks / 100.0).max(0.0))
}
