//! A real machine for the agent: the test image (`tests/setup/build-vm-image`:
//! Debian 12, systemd, containerd, kubelet, the agent's own `.deb`) booted
//! under QEMU with software emulation (TCG: no KVM needed), its serial
//! console captured to a file under `target/vm/console/`. There is one
//! image per [`Arch`]: an x86_64 PC and an arm64 `virt` machine, both
//! emulated on whatever the host is.
//!
//! **Network.** QEMU's user-mode network (libslirp) with `restrict=on`: the
//! guest reaches nothing but the forwards the test sets up, so its
//! 169.254.169.254 is the fake IMDS and never whatever answers that address
//! on the host. slirp forwards (`guestfwd`) only addresses inside its
//! virtual network, and kubelet refuses a link-local node IP, so the
//! network is 160.0.0.0/4: it holds both 169.254.169.254 and 172.31.0.0/16,
//! where the guest gets [`GUEST_IP`] by DHCP, as an instance of a default
//! VPC would. Each forward runs one `socat` per connection to a port on host
//! loopback.
//!
//! The machine dies with its [`Vm`] (and with the test process: QEMU runs
//! under `setpriv --pdeathsig KILL`); the disk is booted with `-snapshot`,
//! so its writes go to a temporary file QEMU has already unlinked.

use crate::cloud::fakecloud::{private_dns_name, Imds, Instance};
use crate::harness::pki::Ca;
use crate::harness::poll::{self, Seen};
use crate::harness::process::Daemon;
use crate::karpenter::standin::ec2nodeclasses;
use crate::server::world::World;
use anyhow::{bail, ensure, Context, Result};
use kube::api::DynamicObject;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The guest's address (DHCP from slirp), and so its instance's private IP.
pub const GUEST_IP: Ipv4Addr = Ipv4Addr::new(172, 31, 0, 15);
/// Where the guest finds the control plane: forwards to the API server and
/// autonode-server listen on this address inside the guest's network.
pub const CONTROL_PLANE_IP: Ipv4Addr = Ipv4Addr::new(172, 31, 0, 10);
/// The API server's port as the guest sees it.
pub const GUEST_API_PORT: u16 = 6443;
/// autonode-server's port as the guest sees it.
pub const GUEST_SERVER_PORT: u16 = 8443;

/// slirp's network, less the guest's address: see the module's
/// documentation for why so wide.
const NETWORK: &str = "net=160.0.0.0/4,host=172.31.0.1,dns=172.31.0.3";

/// The image's pod sandbox image, which it loads into containerd at boot
/// (`tests/setup/build-vm-image`): the one image a pod can run there, as
/// the guest reaches no registry. Its entrypoint sleeps.
pub const LOCAL_IMAGE: &str = "localhost/autonode-test/pause:1";
/// Kernel command line, less the console (see [`Arch::console`]):
/// Debian 12's defaults otherwise (cgroup v2, on which the kubelet
/// under test registers, becomes Ready and runs pods). `loglevel=4` keeps
/// kernel chatter, slow over an emulated UART, off the console; systemd's
/// unit status lines stay.
const KERNEL_ARGS: &str = "root=/dev/vda rw loglevel=4 panic=-1";

/// A machine architecture the VM tests boot: its image, its QEMU, and what
/// EC2 says of an instance of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// Debian's and Kubernetes' name (`kubernetes.io/arch`), and the key
    /// of `--ami-ids` and of `tests/setup/build-vm-image --arch`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// EC2's name, as the identity document's `architecture` spells it.
    pub fn ec2_name(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64",
            Arch::Arm64 => "arm64",
        }
    }

    /// An instance type of this architecture (Graviton's for arm64).
    pub fn instance_type(self) -> &'static str {
        match self {
            Arch::Amd64 => "m5.large",
            Arch::Arm64 => "m6g.large",
        }
    }

    /// The AMI the VM tests' server names for this architecture
    /// (`--ami-ids`), and so the instance's `ami-id`.
    pub fn ami_id(self) -> &'static str {
        match self {
            Arch::Amd64 => "ami-0a1b2c3d4e5f60718",
            Arch::Arm64 => "ami-0f1e2d3c4b5a69788",
        }
    }

    /// `name` for amd64 (the names the VM tests had before arm64: console
    /// logs and `vm.json` keys keep them), `name_arm64` for arm64.
    pub fn scoped(self, name: &str) -> String {
        match self {
            Arch::Amd64 => name.to_string(),
            Arch::Arm64 => format!("{name}_arm64"),
        }
    }

    /// The QEMU that emulates this machine.
    fn qemu(self) -> &'static str {
        match self {
            Arch::Amd64 => "qemu-system-x86_64",
            Arch::Arm64 => "qemu-system-aarch64",
        }
    }

    /// The serial console: a PC's first UART, the `virt` board's PL011.
    fn console(self) -> &'static str {
        match self {
            Arch::Amd64 => "ttyS0",
            Arch::Arm64 => "ttyAMA0",
        }
    }

    /// QEMU's `-machine` and `-cpu`.
    fn machine(self) -> [(&'static str, &'static str); 2] {
        match self {
            // Every feature TCG emulates. (Taking out SVM and VMX, which
            // the guest has no use for, breaks mount(2) in the guest on
            // QEMU 7.2.)
            Arch::Amd64 => [("-machine", "q35,accel=tcg"), ("-cpu", "max")],
            // `virt` is the board Debian's arm64 kernel knows without a
            // device tree of our own (QEMU generates it). Pointer
            // authentication with QEMU's own cheap algorithm instead of
            // the architected QARMA: the guest cannot tell, and the boot
            // to Ready takes 2.5 times as long without it.
            Arch::Arm64 => [
                ("-machine", "virt,accel=tcg"),
                ("-cpu", "max,pauth-impdef=on"),
            ],
        }
    }
}

/// The built image: kernel, initrd and root filesystem.
#[derive(Debug, Clone)]
pub struct Image {
    pub dir: PathBuf,
    pub arch: Arch,
}

impl Image {
    /// The `arch` image for the current agent package, built if needed
    /// (the script is a no-op when nothing changed; `tests/run` builds
    /// both before the suite, so no test pays the cold build).
    pub fn get(arch: Arch) -> Result<Self> {
        // One build per architecture per test process; the script also
        // holds a lock.
        static BUILT: Mutex<BTreeMap<Arch, PathBuf>> = Mutex::new(BTreeMap::new());
        let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(dir) = built.get(&arch) {
            return Ok(Self {
                dir: dir.clone(),
                arch,
            });
        }
        let script = repo_root().join("tests/setup/build-vm-image");
        let output = std::process::Command::new(&script)
            .args(["--arch", arch.name()])
            .output()
            .with_context(|| format!("running {}", script.display()))?;
        if !output.status.success() {
            bail!(
                "{} failed ({}):\n{}",
                script.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let dir = PathBuf::from(String::from_utf8(output.stdout)?.trim());
        built.insert(arch, dir.clone());
        Ok(Self { dir, arch })
    }
}

/// The repository's root (the tests crate is one level down).
pub fn repo_root() -> PathBuf {
    crate::harness::bench::repo_root()
}

/// A TCP forward from an address in the guest's network to host loopback.
#[derive(Debug, Clone, Copy)]
pub struct Forward {
    pub guest: SocketAddrV4,
    pub host: SocketAddr,
}

impl Forward {
    /// slirp's `guestfwd=` value: one socat per connection.
    fn netdev_option(&self) -> String {
        format!("guestfwd=tcp:{}-cmd:socat - TCP:{}", self.guest, self.host)
    }
}

/// A booted machine. Dropping it kills QEMU; the console log stays.
pub struct Vm {
    qemu: Daemon,
    console: PathBuf,
    started: Instant,
}

impl Vm {
    /// Boots `image` with only `forwards` reachable; the console goes to
    /// `target/vm/console/<name>.log` (replaced if it exists).
    pub fn boot(image: &Image, name: &str, forwards: &[Forward]) -> Result<Self> {
        Self::boot_as(image, name, GUEST_IP, forwards)
    }

    /// Like [`Vm::boot`], the guest getting `guest_ip` by DHCP: its
    /// instance's private address, in slirp's 160.0.0.0/4 and none of
    /// slirp's own (172.31.0.1, .3) nor [`CONTROL_PLANE_IP`].
    pub fn boot_as(
        image: &Image,
        name: &str,
        guest_ip: Ipv4Addr,
        forwards: &[Forward],
    ) -> Result<Self> {
        if guest_ip.octets()[0] & 0xf0 != 160 {
            bail!("{guest_ip} is outside the guest network 160.0.0.0/4");
        }
        let dir = repo_root().join("target/vm/console");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let console = dir.join(format!("{name}.log"));
        std::fs::write(&console, "").with_context(|| format!("creating {}", console.display()))?;
        let args = qemu_args(image, &console, guest_ip, forwards);
        let started = Instant::now();
        let qemu = Daemon::spawn(
            &format!("{name}.qemu"),
            Path::new(image.arch.qemu()),
            &args,
            &dir,
        )?;
        Ok(Self {
            qemu,
            console,
            started,
        })
    }

    /// When QEMU was started: the origin of every boot time.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Where the serial console is logged.
    pub fn console_path(&self) -> &Path {
        &self.console
    }

    /// The console output so far (lossy: it is a byte stream).
    pub fn console(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.console).unwrap_or_default()).into_owned()
    }

    /// The console's path and last `lines` lines, for failure messages.
    pub fn console_tail(&self, lines: usize) -> String {
        let text = self.console();
        let all: Vec<&str> = text.lines().collect();
        let start = all.len().saturating_sub(lines);
        format!(
            "--- console: {} (last {lines} lines) ---\n{}\n{}",
            self.console.display(),
            all[start..].join("\n"),
            self.qemu.log_tail(10)
        )
    }

    /// `outcome`, with the console's path and tail added to an error: how
    /// a failed scenario is diagnosed, in CI too.
    pub fn explain<T>(&self, outcome: Result<T>) -> Result<T> {
        outcome.map_err(|e| anyhow::anyhow!("{e:#}\n{}", self.console_tail(80)))
    }

    /// Fails if QEMU has exited (with its own log's tail; [`Vm::explain`]
    /// adds the console's).
    pub fn check_alive(&self) -> Result<()> {
        self.qemu.check_alive()
    }

    /// Polls the console until a line contains `needle`; returns that line.
    pub async fn wait_for_line(&self, needle: &str, timeout: Duration) -> Result<String> {
        let what = format!("{needle:?} on the console");
        poll::until(&what, timeout, Duration::from_millis(500), || async {
            if let Some(line) = self.console().lines().find(|l| l.contains(needle)) {
                return Ok(Some(line.to_string()));
            }
            self.check_alive()?;
            Ok(None)
        })
        .await
    }

    /// What the test image reports once the agent has run (see
    /// `tests/vm/image/usr/local/sbin/autonode-test-report`).
    pub async fn agent_report(&self, timeout: Duration) -> Result<Report> {
        self.wait_for_line(&format!("{REPORT_PREFIX}done"), timeout)
            .await?;
        Ok(Report::parse(&self.console()))
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        // A failed assertion panics past [`Vm::explain`].
        if std::thread::panicking() {
            eprintln!("{}", self.console_tail(80));
        }
    }
}

/// How the test image's report lines start.
const REPORT_PREFIX: &str = "autonode-test-report: ";

/// The test image's report: `systemctl show` properties of the agent and
/// kubelet, systemd's messages about kubelet, the agent's log.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// `<unit>.<Property>` (for instance `autonode-agent.Result`) to value.
    pub properties: BTreeMap<String, String>,
    /// What systemd logged about kubelet.service.
    pub systemd: Vec<String>,
    /// The agent's log lines and when each was logged (since the kernel
    /// started).
    pub agent_log: Vec<(Duration, String)>,
}

impl Report {
    /// Reads the report's lines out of the console output. (The journal
    /// copies them there behind its own `[time] unit[pid]: ` prefix.)
    pub fn parse(console: &str) -> Self {
        let mut report = Self::default();
        for line in console.lines() {
            let Some((_, rest)) = line.split_once(REPORT_PREFIX) else {
                continue;
            };
            if let Some(message) = rest.strip_prefix("systemd: ") {
                report.systemd.push(message.to_string());
            } else if let Some(entry) = rest.strip_prefix("agent: ") {
                report.agent_log.extend(journal_entry(entry));
            } else if let Some((key, value)) = rest.split_once('=') {
                report.properties.insert(key.into(), value.trim().into());
            }
        }
        report
    }

    /// A property's value, or an error naming what the report holds.
    pub fn get(&self, key: &str) -> Result<&str> {
        self.properties
            .get(key)
            .map(String::as_str)
            .with_context(|| format!("no {key} in the test image's report: {self:?}"))
    }

    /// A `…TimestampMonotonic` property as a duration since the kernel
    /// started (zero: never happened).
    pub fn monotonic(&self, key: &str) -> Result<Duration> {
        let micros: u64 = self
            .get(key)?
            .parse()
            .with_context(|| format!("{key} is not a number"))?;
        Ok(Duration::from_micros(micros))
    }

    /// When the agent first logged a line containing `needle`.
    pub fn agent_logged(&self, needle: &str) -> Result<Duration> {
        self.agent_log
            .iter()
            .find(|(_, message)| message.contains(needle))
            .map(|(at, _)| *at)
            .with_context(|| format!("the agent never logged {needle:?}: {:?}", self.agent_log))
    }
}

/// The `key=value` pairs of the first of `lines` that starts with
/// `prefix` (the agent's `kubelet version=… from=…` and `exiting …` lines).
pub fn logged_pairs<'a>(
    lines: impl IntoIterator<Item = &'a str>,
    prefix: &str,
) -> Option<BTreeMap<String, String>> {
    let line = lines.into_iter().find(|l| l.starts_with(prefix))?;
    Some(
        line.split_whitespace()
            .filter_map(|pair| pair.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// Where the agent's kubelet version came from when the image recorded it
/// at bake time (packaging/bake/provision; the agent's `Found::Recorded`).
pub const KUBELET_VERSION_RECORDED: &str = "recorded";

/// What the agent's run cost, from its log: how it learnt kubelet's
/// version, and its last line's wall time and CPU seconds from the fork to
/// its exit (with what systemd does in the forked process before the
/// exec: the unit's sandbox), the same from its `main` on, and its
/// children's CPU. The unit runs it with `--no-start-kubelet` and systemd
/// starts kubelet when it exits (once the runtime is up too): this is the
/// agent's share of the boot up to kubelet's start.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentCost {
    pub kubelet_version_from: String,
    pub took_s: f64,
    pub cpu_s: f64,
    pub main_took_s: f64,
    pub main_cpu_s: f64,
    pub children_cpu_s: f64,
    /// The agent's own peak RSS; `None` from an agent that logs none
    /// (0.2.0 and before).
    pub peak_rss_kib: Option<u64>,
}

impl AgentCost {
    pub fn from_log<'a>(lines: impl IntoIterator<Item = &'a str> + Clone) -> Result<Self> {
        let version = logged_pairs(lines.clone(), "kubelet version=")
            .context("the agent never logged kubelet's version")?;
        let exiting = logged_pairs(lines, "exiting ")
            .context("the agent never logged its `exiting` line (an agent from before it?)")?;
        let number = |key: &str| -> Result<f64> {
            exiting
                .get(key)
                .and_then(|v| v.parse().ok())
                .with_context(|| {
                    format!("no number {key}= in the agent's exiting line: {exiting:?}")
                })
        };
        Ok(AgentCost {
            kubelet_version_from: version.get("from").cloned().unwrap_or_default(),
            took_s: number("took_s")?,
            cpu_s: number("cpu_s")?,
            main_took_s: number("main_took_s")?,
            main_cpu_s: number("main_cpu_s")?,
            children_cpu_s: number("children_cpu_s")?,
            peak_rss_kib: exiting.get("peak_rss_kib").and_then(|v| v.parse().ok()),
        })
    }

    /// The image recorded kubelet's version and the agent used it: no
    /// `kubelet --version` on the boot's path.
    pub fn check_recorded(&self) -> Result<()> {
        ensure!(
            self.kubelet_version_from == KUBELET_VERSION_RECORDED,
            "the agent learnt kubelet's version from={} instead of the image's record (from={KUBELET_VERSION_RECORDED}): was the image made without packaging/bake/provision?",
            self.kubelet_version_from
        );
        Ok(())
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "kubelet_version_from": self.kubelet_version_from,
            "took_s": self.took_s,
            "cpu_s": self.cpu_s,
            "main_took_s": self.main_took_s,
            "main_cpu_s": self.main_cpu_s,
            "children_cpu_s": self.children_cpu_s,
            "peak_rss_kib": self.peak_rss_kib,
        })
    }
}

/// This machine's load averages (1, 5 and 15 minutes), from
/// /proc/loadavg, to go beside timings taken under emulation.
pub fn host_load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

/// `[   21.339976] host autonode-agent[215]: message` (journalctl's
/// short-monotonic output) as its time and message.
fn journal_entry(entry: &str) -> Option<(Duration, String)> {
    let (stamp, rest) = entry.trim_start_matches('[').split_once(']')?;
    let at = Duration::try_from_secs_f64(stamp.trim().parse().ok()?).ok()?;
    let (_, message) = rest.split_once("]: ")?;
    Some((at, message.to_string()))
}

/// [`KERNEL_ARGS`] with `arch`'s console; with `AUTONODE_VM_JOURNAL=1`,
/// the whole journal (kubelet's and containerd's logs too) is copied to
/// the console log.
fn kernel_args(arch: Arch) -> String {
    let args = format!("{KERNEL_ARGS} console={}", arch.console());
    match std::env::var_os("AUTONODE_VM_JOURNAL") {
        Some(_) => format!("{args} systemd.journald.forward_to_console=1"),
        None => args,
    }
}

fn qemu_args(
    image: &Image,
    console: &Path,
    guest_ip: Ipv4Addr,
    forwards: &[Forward],
) -> Vec<String> {
    let file = |name: &str| image.dir.join(name).display().to_string();
    let mut netdev = format!("user,id=net0,restrict=on,{NETWORK},dhcpstart={guest_ip}");
    for forward in forwards {
        netdev.push(',');
        netdev.push_str(&forward.netdev_option());
    }
    let console = format!("file:{}", console.display());
    let drive = format!("file={},format=raw,if=virtio,snapshot=on", file("root.img"));
    let machine = image
        .arch
        .machine()
        .map(|(flag, value)| (flag, value.to_string()));
    let options: [(&str, String); 10] = [
        // One CPU: with two emulated ones the guest kernel locked up (soft
        // lockups in iptables and kubelet), and one leaves the other host
        // core to the rest of the suite.
        ("-smp", "1".into()),
        ("-m", "2048".into()),
        ("-display", "none".into()),
        ("-serial", console),
        ("-kernel", file("vmlinuz")),
        ("-initrd", file("initrd.img")),
        ("-append", kernel_args(image.arch)),
        ("-drive", drive),
        ("-netdev", netdev),
        // No option ROM: the kernel is booted directly, not from the network.
        ("-device", "virtio-net-pci,netdev=net0,romfile=".into()),
    ];
    ["-nodefaults", "-no-user-config", "-no-reboot"]
        .into_iter()
        .map(String::from)
        .chain(
            machine
                .into_iter()
                .chain(options)
                .flat_map(|(flag, value)| [flag.to_string(), value]),
        )
        .collect()
}

/// Merges `entries` under `key` into the JSON object at
/// `target/bench/vm.json` (other keys are kept: each scenario writes its own).
pub fn record_bench(key: &str, entries: serde_json::Value) -> Result<PathBuf> {
    crate::harness::bench::merge(
        "vm.json",
        [(key.to_string(), entries)].into_iter().collect(),
    )
}

/// The cluster side of a VM test: a [`World`] whose API server and
/// autonode-server the guest reaches at [`CONTROL_PLANE_IP`], the operator's
/// base Ignition config (the CNI config, cluster-level), and an
/// `amiFamily: Custom` EC2NodeClass `default` kept by the server's upkeep
/// (`--ami-ids` for both architectures, userData as `autonode-server
/// render-userdata` prints it).
pub struct VmWorld {
    pub world: World,
    /// The EC2NodeClass's userData, which Karpenter hands the instance.
    pub user_data: String,
    /// Holds the join CA's file, which the server reads at (re)start.
    _dir: tempfile::TempDir,
}

/// The base Ignition ConfigMap (`--base-ignition`), in autonode-system.
pub const BASE_IGNITION: &str = "vm-base";
/// The CNI network kubelet needs to call the node Ready (no pods run).
const CNI_CONFLIST: &str = include_str!("../../vm/ignition/10-containerd-net.conflist");
/// The EC2NodeClass the test's NodeClaims name.
const NODECLASS: &str = "default";
/// The cluster name the userData carries.
const CLUSTER_NAME: &str = "autonode-vm-test";
/// The field manager of the server's EC2NodeClass upkeep.
const UPKEEP_MANAGER: &str = "autonode-server";

impl VmWorld {
    /// The control plane, the fake cloud and autonode-server (restarted
    /// once, see below), the base Ignition config and the class as the
    /// server's upkeep keeps it.
    pub async fn start() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let ca_file = dir.path().join("join-ca.crt");
        // The server's join CA is made when it starts, and upkeep reads
        // --join-ca-file at start: start it with a stand-in CA, then
        // restart it with its own (before any class exists to keep).
        std::fs::write(&ca_file, Ca::new("stand-in")?.cert_pem())?;
        let world =
            World::start_reachable_at(&[CONTROL_PLANE_IP.into()], &server_args(&ca_file)).await?;
        std::fs::write(&ca_file, world.server.ca_pem())?;
        world.server.restart().await?;
        let admin = world.cp.admin().await?;
        put_base_ignition(&admin).await?;
        let rendered = render_user_data(&world)?;
        crate::karpenter::standin::create_custom_nodeclass(&admin, NODECLASS, &rendered).await?;
        let class = wait_for_upkeep(&admin).await?;
        let user_data = class.data["spec"]["userData"]
            .as_str()
            .context("the EC2NodeClass has no userData")?
            .to_string();
        if user_data != rendered {
            bail!("upkeep rewrote the class's userData:\n{user_data}\nrender-userdata printed:\n{rendered}");
        }
        Ok(Self {
            world,
            user_data,
            _dir: dir,
        })
    }

    /// The EC2NodeClass's `spec.amiSelectorTerms` as they are now.
    pub async fn ami_selector_terms(&self) -> Result<serde_json::Value> {
        let admin = self.world.cp.admin().await?;
        let class = ec2nodeclasses(&admin).get(NODECLASS).await?;
        Ok(class.data["spec"]["amiSelectorTerms"].clone())
    }

    /// An instance as EC2 would start it for this cluster from `arch`'s
    /// AMI: that architecture and a type of it, the guest's address (and
    /// so its private DNS name), the class's userData.
    pub fn instance(&self, arch: Arch) -> Instance {
        let region = crate::server::world::REGION;
        Instance {
            private_ip: GUEST_IP,
            private_dns_name: private_dns_name(GUEST_IP, region),
            local_hostname: private_dns_name(GUEST_IP, region),
            user_data: self.user_data.clone().into_bytes(),
            ..Instance::builder()
                .account_id(crate::server::world::ACCOUNT)
                .region(region)
                .architecture(arch.ec2_name())
                .instance_type(arch.instance_type())
                .image_id(arch.ami_id())
                .build()
        }
    }

    /// What the guest may reach: IMDS, the API server, autonode-server.
    pub fn forwards(&self, imds: &Imds) -> Result<Vec<Forward>> {
        Ok(forwards(
            imds.addr(),
            loopback_addr(self.world.cp.url())?,
            loopback_addr(self.world.server.url())?,
        ))
    }
}

/// The address of an `https://ip:port` URL (a server on host loopback).
pub fn loopback_addr(url: &str) -> Result<SocketAddr> {
    url.trim_start_matches("https://")
        .parse()
        .with_context(|| format!("{url} is not https://ip:port"))
}

/// What a guest may reach: its IMDS (on host loopback at `imds`) at
/// 169.254.169.254:80, and at [`CONTROL_PLANE_IP`] the API server and
/// autonode-server (on host loopback at `api_server` and `server`).
pub fn forwards(imds: SocketAddr, api_server: SocketAddr, server: SocketAddr) -> Vec<Forward> {
    vec![
        Forward {
            guest: SocketAddrV4::new(Ipv4Addr::new(169, 254, 169, 254), 80),
            host: imds,
        },
        Forward {
            guest: SocketAddrV4::new(CONTROL_PLANE_IP, GUEST_API_PORT),
            host: api_server,
        },
        Forward {
            guest: SocketAddrV4::new(CONTROL_PLANE_IP, GUEST_SERVER_PORT),
            host: server,
        },
    ]
}

/// The operator's cluster-wide Ignition config ([`BASE_IGNITION`]): the
/// CNI network.
pub async fn put_base_ignition(admin: &kube::Client) -> Result<()> {
    use base64::Engine as _;
    let conflist = base64::engine::general_purpose::STANDARD.encode(CNI_CONFLIST);
    let config = serde_json::json!({
        "ignition": {"version": "3.4.0"},
        "storage": {"files": [{
            "path": "/etc/cni/net.d/10-containerd-net.conflist",
            "mode": 0o644,
            "contents": {"source": format!("data:;base64,{conflist}")},
        }]},
    });
    crate::server::ignition::put_configmap(admin, BASE_IGNITION, &config.to_string()).await
}

/// The VM tests' `autonode-server serve` flags: where the guest reaches
/// the API server, the base Ignition config, and EC2NodeClass upkeep with
/// an AMI per architecture and the userData flags (the join CA in
/// `ca_file`). A 3 s leader lease (the shortest the server takes):
/// [`VmWorld::start`] restarts the server,
/// and its leader controllers (upkeep, the NodeClaim Events) wait for the
/// old process's lease to lapse.
fn server_args(ca_file: &Path) -> Vec<String> {
    let ami_ids: Vec<String> = [Arch::Amd64, Arch::Arm64]
        .iter()
        .map(|arch| format!("{}={}", arch.name(), arch.ami_id()))
        .collect();
    let mut args = Vec::from(guest_server_args());
    args.push(format!("--ami-ids={}", ami_ids.join(",")));
    args.push("--leader-lease=3".to_string());
    args.extend(user_data_args(ca_file));
    args
}

/// The `autonode-server serve` flags any cluster of VMs needs: the API
/// server as the guest reaches it, and the base Ignition config (the CNI
/// network, [`put_base_ignition`]).
pub fn guest_server_args() -> [String; 2] {
    [
        format!("--api-server-url=https://{CONTROL_PLANE_IP}:{GUEST_API_PORT}"),
        format!("--base-ignition={BASE_IGNITION}"),
    ]
}

/// The flags userData is rendered from, as the guest reaches the server
/// (the CA pinned by its hash, the default).
fn user_data_args(ca_file: &Path) -> [String; 3] {
    [
        format!("--public-url=https://{CONTROL_PLANE_IP}:{GUEST_SERVER_PORT}"),
        format!("--join-ca-file={}", ca_file.display()),
        format!("--cluster-name={CLUSTER_NAME}"),
    ]
}

/// Polls the class until the server's upkeep has written it.
async fn wait_for_upkeep(admin: &kube::Client) -> Result<DynamicObject> {
    let api = ec2nodeclasses(admin);
    poll::until(
        &format!("EC2NodeClass {NODECLASS} written by the server's upkeep"),
        Duration::from_secs(60),
        Duration::from_millis(250),
        || async {
            let class = api.get(NODECLASS).await?;
            let fields = class.metadata.managed_fields.iter().flatten();
            let managers: Vec<String> = fields.filter_map(|m| m.manager.clone()).collect();
            let written = managers.iter().any(|m| m == UPKEEP_MANAGER);
            Ok(Seen(
                written.then_some(class),
                format!("managers: {managers:?}"),
            ))
        },
    )
    .await
}

/// Runs the real `autonode-server render-userdata` for this cluster as
/// the guest reaches it.
fn render_user_data(world: &World) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let ca = dir.path().join("join-ca.crt");
    std::fs::write(&ca, world.server.ca_pem())?;
    crate::server::render_user_data(&user_data_args(&ca))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The image's `KUBELET_EXTRA_ARGS` for a kubelet printing `version`
    /// (`packaging/bake/provision --kubelet-args`, which the image's build
    /// runs).
    fn kubelet_extra_args(version: &str) -> Result<String> {
        let script = repo_root().join("packaging/bake/provision");
        let output = std::process::Command::new(&script)
            .args(["--kubelet-args", version])
            .output()
            .with_context(|| format!("running {}", script.display()))?;
        if !output.status.success() {
            bail!("{}", String::from_utf8_lossy(&output.stderr));
        }
        Ok(String::from_utf8(output.stdout)?.trim().to_string())
    }

    #[test]
    fn the_agents_cost_is_read_from_its_log() {
        let log = [
            "autonode-agent 0.2.0 starting since_fork_s=0.31",
            "kubelet version=v1.37.2 from=recorded took_s=0.000 waited_s=0.000",
            "phase=start succeeded node=n",
            "exiting outcome=success took_s=1.84 cpu_s=0.42 main_took_s=1.50 main_cpu_s=0.30 children_cpu_s=0.03 peak_rss_kib=3904",
        ];
        let cost = AgentCost::from_log(log).unwrap();
        assert_eq!(cost.kubelet_version_from, "recorded");
        assert_eq!(
            (cost.took_s, cost.cpu_s, cost.children_cpu_s),
            (1.84, 0.42, 0.03)
        );
        assert_eq!((cost.main_took_s, cost.main_cpu_s), (1.50, 0.30));
        assert_eq!(cost.peak_rss_kib, Some(3904));
        assert!(cost.check_recorded().is_ok());
        let ran = [
            "kubelet version=v1.37.2 from=kubelet-version took_s=8.155 waited_s=6.508",
            log[3],
        ];
        let err = AgentCost::from_log(ran)
            .unwrap()
            .check_recorded()
            .unwrap_err();
        assert!(err.to_string().contains("from=kubelet-version"), "{err}");
        assert!(AgentCost::from_log(log[..3].iter().copied()).is_err());
    }

    #[test]
    fn kubelet_flags_follow_the_kubelet_version() {
        const ENDPOINT: &str =
            "--container-runtime-endpoint=unix:///run/containerd/containerd.sock";
        let cases = [
            (
                "Kubernetes v1.20.2",
                format!("--container-runtime=remote {ENDPOINT} --feature-gates=GracefulNodeShutdown=true"),
            ),
            ("Kubernetes v1.23.17", format!("--container-runtime=remote {ENDPOINT}")),
            // From 1.24 remote is the default, and the flag deprecated.
            ("Kubernetes v1.24.17", ENDPOINT.to_string()),
            ("Kubernetes v1.26.15", ENDPOINT.to_string()),
            // From 1.27 the agent puts the endpoint in the configuration.
            ("Kubernetes v1.27.0", String::new()),
            ("kubelet v1.34.1", String::new()),
            ("Kubernetes v1.31.0-eks-abc", String::new()),
        ];
        for (version, want) in cases {
            assert_eq!(kubelet_extra_args(version).unwrap(), want, "{version}");
        }
        assert!(kubelet_extra_args("Kubernetes").is_err());
    }
}
