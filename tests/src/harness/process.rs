//! Child processes that die with the test that started them.

use crate::harness::poll::{self, Look, OnTimeout};
use anyhow::{bail, Context, Result};
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// A long-running child process with its output in a log file.
///
/// Killed (SIGKILL, then reaped) on drop. Started under
/// `setpriv --pdeathsig KILL` so it also dies if the test process is killed
/// before any destructor can run. [`Daemon::restart`] starts it again with
/// the same program, arguments and environment (fault-injection tests).
pub struct Daemon {
    name: String,
    child: Mutex<Child>,
    log: PathBuf,
    endpoint: Mutex<String>,
    launch: Launch,
}

/// How the daemon was started, to start it again.
struct Launch {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Launch {
    /// Starts the process with its output appended to `log`.
    fn spawn(&self, name: &str, log: &Path, truncate: bool) -> Result<Child> {
        let out = OpenOptions::new()
            .create(true)
            .write(true)
            .append(!truncate)
            .truncate(truncate)
            .open(log)
            .with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        Command::new("setpriv")
            .arg("--pdeathsig=KILL")
            .arg("--")
            .arg(&self.program)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {name} ({})", self.program.display()))
    }
}

impl Daemon {
    /// Starts `program args…` with its output in `<dir>/<name>.log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], dir: &Path) -> Result<Self> {
        Self::spawn_with_env(name, program, args, dir, &[])
    }

    /// Like [`Daemon::spawn`], with extra environment variables.
    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        dir: &Path,
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let log = dir.join(format!("{name}.log"));
        let launch = Launch {
            program: program.to_path_buf(),
            args: args.to_vec(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let child = launch.spawn(name, &log, true)?;
        Ok(Self {
            name: name.to_string(),
            child: Mutex::new(child),
            log,
            endpoint: Mutex::new(String::new()),
            launch,
        })
    }

    /// Kills the process if it still runs and starts it again with the same
    /// program, arguments and environment; its output goes on in the same
    /// log.
    pub fn restart(&self) -> Result<()> {
        let mut child = self.lock();
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
        }
        let _ = child.wait();
        *child = self.launch.spawn(&self.name, &self.log, false)?;
        Ok(())
    }

    /// The process id (setpriv execs the program, so it is the program's).
    pub fn pid(&self) -> u32 {
        self.lock().id()
    }

    /// Records the address the daemon serves on.
    pub fn set_endpoint(&self, endpoint: String) {
        *self.endpoint.lock().unwrap_or_else(|e| e.into_inner()) = endpoint;
    }

    /// The address the daemon serves on, if recorded.
    pub fn endpoint(&self) -> String {
        self.endpoint
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Fails with the log's tail if the process has exited.
    pub fn check_alive(&self) -> Result<()> {
        if let Some(status) = self.lock().try_wait()? {
            bail!("{} exited with {status}:\n{}", self.name, self.log_tail(30));
        }
        Ok(())
    }

    /// [`poll::until`] while the daemon lives: fails at once if the
    /// process exits, and with the log's tail if `within` passes (waiting
    /// for it to be ready, or for what it does).
    pub async fn wait_for<L, F, Fut>(
        &self,
        what: &str,
        within: Duration,
        every: Duration,
        mut probe: F,
    ) -> Result<L::Value>
    where
        L: Look,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<L>>,
    {
        poll::until(what, within, every, || {
            let alive = self.check_alive();
            let look = probe();
            async move {
                alive?;
                look.await
            }
        })
        .await
        .on_timeout(|| format!(":\n{}", self.log_tail(40)))
    }

    /// Asks the process to stop (SIGTERM), as a Deployment rollout does,
    /// and waits up to `grace` for it to exit; then kills it. `true` if it
    /// stopped by itself.
    pub fn terminate(&self, grace: std::time::Duration) -> bool {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let pid = Pid::from_raw(i32::try_from(self.pid()).unwrap_or(i32::MAX));
        if kill(pid, Signal::SIGTERM).is_err() {
            return true;
        }
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if !matches!(self.lock().try_wait(), Ok(None)) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.kill();
        false
    }

    /// Kills the process (SIGKILL) and waits for it (idempotent).
    pub fn kill(&self) {
        let mut child = self.lock();
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
        }
        let _ = child.wait();
    }

    /// The last `lines` lines of the log, headed by the daemon's name.
    pub fn log_tail(&self, lines: usize) -> String {
        let all: Vec<String> = File::open(&self.log)
            .map(|f| BufReader::new(f).lines().map_while(Result::ok).collect())
            .unwrap_or_default();
        let start = all.len().saturating_sub(lines);
        format!("--- {} ---\n{}", self.name, all[start..].join("\n"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A size field of a live process's `/proc/<pid>/status` (`VmRSS:`,
/// `VmHWM:`, …), in bytes.
pub fn status_bytes(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    Ok(kib * 1024)
}
