//! Network namespaces that look, from inside, like an EC2 instance's
//! network: IMDS at 169.254.169.254:80, the autonode-server wherever the
//! test forwards it. Needs root and `ip` (iproute2).
//!
//! A namespace holds only `lo` (with 169.254.169.254/32 added), so nothing
//! inside it can reach anything but what the test serves into it.
//! Listeners are bound inside from the test process itself: a short-lived
//! thread enters the namespace, binds, and exits; the socket stays in the
//! namespace it was made in, and the test's tokio runtime serves it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Context as _};
use nix::sched::CloneFlags;
use tokio::net::TcpStream;
use tokio::task::{JoinHandle, JoinSet};

use crate::cloud::fakecloud::{BoundSocket, IMDS_ADDR};

const PREFIX: &str = "autonode-";
const NETNS_DIR: &str = "/var/run/netns";

/// A network namespace `autonode-<pid>-<n>`, deleted on drop (panics too).
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates the namespace, brings `lo` up and gives it 169.254.169.254/32.
    pub fn new() -> anyhow::Result<Self> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        remove_stale();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PREFIX}{}-{n}", std::process::id());
        ip(&["netns", "add", &name])?;
        // From here on Drop cleans up, whatever fails next.
        let ns = Self { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        let imds_ip = format!("{}/32", IMDS_ADDR.ip());
        ip(&["-n", &ns.name, "addr", "add", &imds_ip, "dev", "lo"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/var/run/netns/<name>`, the handle `setns` takes.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.name)
    }

    /// Runs `f` on a thread that has entered the namespace; the thread
    /// ends with `f`, so no other code ever runs inside by accident.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
        let file = std::fs::File::open(self.path())
            .with_context(|| format!("opening {}", self.path().display()))?;
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    nix::sched::setns(&file, CloneFlags::CLONE_NEWNET)
                        .context("setns into the namespace")?;
                    Ok(f())
                })
                .join()
                .map_err(|_| anyhow::anyhow!("thread in namespace panicked"))?
        })
    }

    /// A socket bound to `addr` inside the namespace, not yet listening
    /// (see [`crate::cloud::fakecloud::Imds::start_on`]).
    pub fn bind(&self, addr: SocketAddr) -> anyhow::Result<BoundSocket> {
        self.run(|| BoundSocket::bind(addr))?
            .with_context(|| format!("binding {addr} in {}", self.name))
    }

    /// A listening std socket bound to `addr` inside the namespace.
    pub fn listen(&self, addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
        self.run(|| std::net::TcpListener::bind(addr))?
            .with_context(|| format!("listening on {addr} in {}", self.name))
    }

    /// `ip netns exec <name> <program>`: a command to run inside.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        // The test may hang or panic: never leave the process behind.
        command.kill_on_drop(true);
        command
    }

    /// The same as [`Self::command`], for std.
    pub fn std_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "delete", &self.name]) {
            eprintln!("netns: deleting {}: {e:#}", self.name);
        }
    }
}

/// Deletes namespaces left by test processes that died without dropping
/// theirs (SIGKILL, abort), so they do not pile up on a developer machine.
fn remove_stale() {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !PathBuf::from(format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "delete", &name]);
        }
    }
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !output.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// A TCP forwarder from inside a namespace to the host; stops on drop.
#[derive(Debug)]
pub struct Forward {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Forward {
    /// The address it listens on, inside the namespace.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Listens on `ns_addr` inside `ns` and relays each connection to
/// `host_addr` in the test's own namespace (e.g. the autonode-server on
/// host loopback), so the agent inside reaches it as `ns_addr`. Must be
/// called within a tokio runtime.
pub fn forward(ns: &NetNs, ns_addr: SocketAddr, host_addr: SocketAddr) -> anyhow::Result<Forward> {
    let listener = ns.listen(ns_addr)?;
    let addr = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let task = tokio::spawn(async move {
        // Dropping the set (task aborted) aborts every relay with it.
        let mut relays = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((inbound, _)) => {
                        relays.spawn(relay(inbound, host_addr));
                    }
                    Err(e) => eprintln!("netns forward {addr}: accept failed: {e}"),
                },
                Some(_) = relays.join_next() => {}
            }
        }
    });
    Ok(Forward { addr, task })
}

/// Relays one connection to `host_addr` until either side closes.
pub(crate) async fn relay(mut inbound: TcpStream, host_addr: SocketAddr) {
    match TcpStream::connect(host_addr).await {
        // An error here is just one side hanging up; nothing to report.
        Ok(mut outbound) => {
            // A relay must not add Nagle's delay to either side: with it,
            // an answer written right after the server's TLS session
            // tickets waited for the agent's delayed ACK (about 20 ms).
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
        }
        // Refusing the inbound side (by dropping it) is what the agent
        // would see if the server were down.
        Err(e) => eprintln!("netns forward to {host_addr}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::fakecloud::signer::tests::shared_ca;
    use crate::cloud::fakecloud::{Imds, Instance};
    use std::io::{Read as _, Write as _};
    use std::sync::Arc;

    /// What a process inside gets from IMDS, with nothing but bash.
    const PUT_TOKEN: &str = r#"exec 3<>/dev/tcp/169.254.169.254/80
printf 'PUT /latest/api/token HTTP/1.1\r\nHost: 169.254.169.254\r\nX-aws-ec2-metadata-token-ttl-seconds: 60\r\nConnection: close\r\n\r\n' >&3
cat <&3"#;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_process_inside_reaches_imds_at_the_link_local_address() {
        let ns = NetNs::new().expect("create namespace");
        let socket = ns.bind(IMDS_ADDR).expect("bind IMDS inside");
        let imds = Imds::start_on(socket, &Instance::builder().build(), &shared_ca(), None)
            .expect("start IMDS");
        assert_eq!(imds.addr(), IMDS_ADDR);
        let output = ns
            .command("bash")
            .args(["-c", PUT_TOKEN])
            .output()
            .await
            .expect("run bash inside");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        let token = text.rsplit("\r\n\r\n").next().expect("a body");
        assert_eq!(token.len(), 56, "{text}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forward_reaches_host_loopback_from_inside() {
        let ns = Arc::new(NetNs::new().expect("create namespace"));
        let host = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind host");
        let host_addr = host.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = host.accept().await {
                let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, b"hello from host").await;
            }
        });
        let inside = ns.clone();
        // Before forwarding, the same address inside the namespace is dead.
        let refused = tokio::task::spawn_blocking(move || {
            inside.run(|| std::net::TcpStream::connect(host_addr).map(drop))
        })
        .await
        .expect("join")
        .expect("run inside");
        assert!(refused.is_err());

        // Same address inside as outside, so configs work unchanged.
        let forwarder = forward(&ns, host_addr, host_addr).expect("forward");
        assert_eq!(forwarder.addr(), host_addr);
        let inside = ns.clone();
        let greeting = tokio::task::spawn_blocking(move || {
            inside.run(|| {
                let mut stream = std::net::TcpStream::connect(host_addr)?;
                stream.write_all(b"hi")?;
                let mut text = String::new();
                stream.read_to_string(&mut text)?;
                Ok::<_, std::io::Error>(text)
            })
        })
        .await
        .expect("join")
        .expect("run inside")
        .expect("talk to the host through the forward");
        assert_eq!(greeting, "hello from host");
    }

    #[test]
    fn namespace_is_deleted_on_drop_even_on_panic() {
        let ns = NetNs::new().expect("create namespace");
        let path = ns.path();
        assert!(path.exists());
        let result = std::panic::catch_unwind(move || {
            let _ns = ns;
            panic!("test failure inside");
        });
        assert!(result.is_err());
        assert!(!path.exists(), "{} left behind", path.display());
    }
}
