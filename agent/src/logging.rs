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

/// CPU seconds this process used (user and system), and those of its
/// children it waited for (`kubelet --version`, `systemctl`), from
/// /proc/self/stat (kernel ticks of 10 ms, as [`process_age`]); `None`
/// without /proc. Read at exit: the agent's share of a boot's CPU.
pub fn cpu_time() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_cpu_time(&stat)
}

fn parse_cpu_time(stat: &str) -> Option<(f64, f64)> {
    // utime, stime, cutime, cstime: fields 14 to 17, the 12th to 15th
    // after the command name.
    let ticks: Vec<f64> = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let [user, system, children_user, children_system] = ticks[..] else {
        return None;
    };
    Some((
        (user + system) / 100.0,
        (children_user + children_system) / 100.0,
    ))
}

/// This process's peak resident memory in KiB (`VmHWM` in
/// /proc/self/status); `None` without /proc. Its own, from the exec on:
/// the `ru_maxrss` a parent reads from `wait4` also holds the memory the
/// process had before its exec, a copy of the parent's, so a large parent
/// would read its own size there.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_peak_rss_kib(&status)
}

fn parse_peak_rss_kib(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    line.trim().strip_suffix("kB")?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_peak_rss_from_proc_status() {
        let status =
            "Name:\tautonode-agent\nVmPeak:\t  20000 kB\nVmHWM:\t    3904 kB\nVmRSS:\t 3800 kB\n";
        assert_eq!(super::parse_peak_rss_kib(status), Some(3904));
        assert_eq!(super::parse_peak_rss_kib("VmRSS:\t 3800 kB\n"), None);
        assert_eq!(super::parse_peak_rss_kib("VmHWM:\t 3800 pages\n"), None);
        assert!(super::peak_rss_kib().is_some_and(|k| k > 0));
    }

    #[test]
    fn reads_cpu_time_from_proc_stat() {
        // A name with spaces and a parenthesis, as /proc/self/stat has it.
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 20 5 20 0 1 0 12345 0 0";
        assert_eq!(super::parse_cpu_time(stat), Some((0.1, 0.25)));
        assert_eq!(super::parse_cpu_time("42 (x) S 1"), None);
        assert!(super::cpu_time().is_some());
    }
}
