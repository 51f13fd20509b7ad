//! The launcher: every instance the real Karpenter launches into moto
//! becomes a machine.
//!
//! moto keeps instances as records; nothing boots. The launcher watches
//! moto and, for each running instance a fleet launched, does what EC2 and
//! the AMI would:
//!
//! - reads the launch template version the fleet used
//!   (DescribeFleets, DescribeLaunchTemplateVersions) for its userData;
//! - boots a [`SimulatedNode`]: a network namespace where IMDS answers for
//!   that instance (the id, zone, addresses, DNS name and launch time moto
//!   reports, an identity document signed by the test cloud's key, the
//!   template's userData byte for byte), and the server's address the
//!   userData names forwarded to autonode-server;
//! - runs the real agent binary there, as systemd would at boot;
//! - once the agent has started kubelet (the machine's systemctl records
//!   it), registers the Node as kubelet would, with the credentials the
//!   agent wrote: the providerID, the `karpenter.sh/unregistered` taint,
//!   kubelet's labels, and a Ready status with the instance type's capacity
//!   ([`kubelet_node`]); then renews the node's Lease every
//!   [`LEASE_RENEWAL`], kubelet's heartbeat, which kube-controller-manager's
//!   node lifecycle controller reads.
//!
//! With [`MachineKind::Vm`], each instance becomes a real machine instead:
//! the test image (`tests/src/machines/vm.rs`: the agent from its package,
//! containerd and the real kubelet of the version under test) under QEMU,
//! taking moto's address for the instance by DHCP, with IMDS for the same
//! [`Instance`] (one path for the facts) served from host loopback and
//! forwarded to its 169.254.169.254, and the API server and autonode-server
//! forwarded to it at [`vm::CONTROL_PLANE_IP`]. The agent runs at boot as
//! systemd starts it, and kubelet registers the Node itself.
//!
//! An instance moto reports terminated (Karpenter deleted its NodeClaim)
//! has its machine stopped: the agent killed, IMDS and the forward closed,
//! the namespace deleted (or QEMU killed). [`Launcher::break_next`] gives
//! the next simulated machines an image whose kubelet cannot start, so
//! their agent fails for good.

use crate::cloud::fakecloud::{Instance, InstanceState, TestCa};
use crate::cloud::moto::{Moto, MotoInstance, REGION};
use crate::machines::node::{registration, SimulatedNode};
use crate::machines::vm::{self, Arch, Image, Vm};
use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How often moto is asked for new and terminated instances.
const POLL: Duration = Duration::from_millis(500);

/// Where machines find autonode-server, and who signs their identity.
#[derive(Clone)]
pub struct Cluster {
    /// The CA that plays AWS's identity-signing role (the server trusts it).
    pub identity_ca: Arc<TestCa>,
    /// The server's address as the userData names it (inside a machine).
    pub server_inside: SocketAddr,
    /// Where the server listens on host loopback.
    pub server_host: SocketAddr,
    /// Where the API server listens on host loopback (VMs reach it
    /// through a forward).
    pub api_host: SocketAddr,
    /// What each instance becomes.
    pub kind: MachineKind,
}

/// The server as a simulated machine reaches it: its own loopback,
/// forwarded into its namespace.
pub const SIMULATED_SERVER_INSIDE: SocketAddr =
    SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8443);

/// What an instance becomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MachineKind {
    /// A network namespace: the agent binary, then the registering
    /// kubelet stand-in (seconds; pods are bound, never run).
    #[default]
    Simulated,
    /// The amd64 test image under QEMU's emulation: the agent, containerd
    /// and the real kubelet (minutes; pods run, from
    /// [`vm::LOCAL_IMAGE`]).
    Vm,
}

impl MachineKind {
    /// The server's address as the userData names it: each simulated
    /// machine's own loopback (forwarded into its namespace), or where
    /// the VMs' network forwards it.
    pub fn server_inside(self) -> SocketAddr {
        match self {
            Self::Simulated => SIMULATED_SERVER_INSIDE,
            Self::Vm => SocketAddr::new(vm::CONTROL_PLANE_IP.into(), vm::GUEST_SERVER_PORT),
        }
    }

    /// The addresses, besides loopback, the API server's and the server's
    /// certificates must be valid for: where the machines reach them.
    pub fn reachable_ips(self) -> Vec<IpAddr> {
        match self {
            Self::Simulated => Vec::new(),
            Self::Vm => vec![vm::CONTROL_PLANE_IP.into()],
        }
    }

    /// The `autonode-server serve` flags the machines need.
    pub fn server_args(self) -> Vec<String> {
        match self {
            Self::Simulated => Vec::new(),
            Self::Vm => vm::guest_server_args().into(),
        }
    }

    /// What the cluster must hold before a machine joins: for VMs, the
    /// base Ignition config that [`Self::server_args`] names (the CNI
    /// network).
    pub async fn prepare(self, admin: &kube::Client) -> Result<()> {
        match self {
            Self::Simulated => Ok(()),
            Self::Vm => vm::put_base_ignition(admin).await,
        }
    }
}

/// What happened to one machine, for the tests to read.
#[derive(Clone, Debug)]
pub struct Machine {
    pub instance_id: String,
    /// The Node name (the instance's private DNS name).
    pub node_name: String,
    pub booted: Instant,
    /// Whether it was given a [`Flaw`].
    pub broken: bool,
    /// The flaw it was given, if any.
    pub flaw: Option<Flaw>,
    /// When the agent exited, and with what.
    pub agent: Option<AgentExit>,
    /// When the kubelet stand-in created the Node.
    pub registered: Option<Instant>,
    /// When the machine was stopped (its instance terminated).
    pub stopped: Option<Instant>,
    /// Why the launcher could not boot it or register its Node.
    pub error: Option<String>,
    /// Its root directory (its disk) while it runs: deleted when it stops.
    pub root: Option<PathBuf>,
    /// A VM's serial console log (the test image's report is on it).
    pub console: Option<PathBuf>,
    /// The instance as its IMDS describes it, once booted.
    pub instance: Option<Instance>,
}

/// The agent's run on a machine.
#[derive(Clone, Debug)]
pub struct AgentExit {
    pub at: Instant,
    pub code: Option<i32>,
    /// The end of its log (its standard error; a VM's journal).
    pub log_tail: String,
}

/// What is wrong with a machine the launcher is told to make broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// Its image cannot start kubelet (systemctl fails): the agent joins,
    /// then fails for good and reports it.
    KubeletWontStart,
    /// Its signed identity document names another image than the one EC2
    /// says it runs: the server refuses the join for good
    /// (`image_mismatch`), before anything is bound.
    SignedForAnotherImage,
    /// Its agent does not start until [`Launcher::release_late_machines`]
    /// (a slow boot): whatever happens to its NodeClaim before, happens
    /// before the join.
    AgentStartsLate,
    /// Its agent joins, but its kubelet does not register the Node until
    /// [`Launcher::release_late_machines`]: whatever happens to its NodeClaim
    /// before, happens between the join and the registration.
    KubeletStartsLate,
}

/// The image a [`Flaw::SignedForAnotherImage`] document names: one moto
/// never registered.
const ANOTHER_IMAGE: &str = "ami-0ffffffffffffffff";

#[derive(Default)]
struct Shared {
    machines: Mutex<BTreeMap<String, Machine>>,
    /// The flaws the next machines get, in launch order.
    flaws: Mutex<std::collections::VecDeque<Flaw>>,
    /// The agent binary simulated machines run from now on, if not the
    /// tree's ([`Launcher::run_agent`]).
    agent: Mutex<Option<PathBuf>>,
    /// Whether machines given [`Flaw::AgentStartsLate`] or
    /// [`Flaw::KubeletStartsLate`] may go on.
    late_released: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn machines(&self) -> MutexGuard<'_, BTreeMap<String, Machine>> {
        self.machines.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, id: &str, f: impl FnOnce(&mut Machine)) {
        if let Some(machine) = self.machines().get_mut(id) {
            f(machine);
        }
    }

    /// Waits until late machines may go on ([`Flaw::AgentStartsLate`],
    /// [`Flaw::KubeletStartsLate`]).
    async fn late_machines_released(&self) {
        while !self.late_released.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(POLL).await;
        }
    }

    /// The agent binary the next simulated machine runs.
    fn agent(&self) -> Result<PathBuf> {
        let chosen = self.agent.lock().unwrap_or_else(|e| e.into_inner()).clone();
        chosen.map_or_else(crate::machines::node::agent_binary, Ok)
    }

    fn take_flaw(&self) -> Option<Flaw> {
        self.flaws
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }
}

/// The running launcher; dropping it stops every machine.
pub struct Launcher {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Launcher {
    /// Starts watching `moto` for instances (a tokio task).
    pub fn start(moto: Arc<Moto>, cluster: Cluster) -> Self {
        let shared = Arc::new(Shared::default());
        let task = tokio::spawn(watch(moto, cluster, shared.clone()));
        Self { shared, task }
    }

    /// Gives the next `count` machines an image whose kubelet cannot be
    /// started (systemctl fails): their agent joins, then fails for good.
    pub fn break_next(&self, count: usize) {
        self.flaw_next(Flaw::KubeletWontStart, count);
    }

    /// Makes the simulated machines booted from now on run `agent` (an
    /// earlier revision's, as an AMI baked months ago carries).
    pub fn run_agent(&self, agent: PathBuf) {
        *self.shared.agent.lock().unwrap_or_else(|e| e.into_inner()) = Some(agent);
    }

    /// Gives the next `count` machines `flaw`, after those already given one.
    pub fn flaw_next(&self, flaw: Flaw, count: usize) {
        let mut flaws = self.shared.flaws.lock().unwrap_or_else(|e| e.into_inner());
        flaws.extend(std::iter::repeat_n(flaw, count));
    }

    /// Lets the machines given [`Flaw::AgentStartsLate`] run their agent,
    /// and those given [`Flaw::KubeletStartsLate`] register their Node.
    pub fn release_late_machines(&self) {
        self.shared
            .late_released
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Every machine booted so far, by instance id.
    pub fn machines(&self) -> BTreeMap<String, Machine> {
        self.shared.machines().clone()
    }

    /// One machine, by instance id.
    pub fn machine(&self, instance_id: &str) -> Option<Machine> {
        self.shared.machines().get(instance_id).cloned()
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        // Aborting the watch drops its machines' tasks' handles; each
        // machine is stopped by aborting its own task.
        self.task.abort();
        if std::thread::panicking() || std::env::var_os("AUTONODE_TEST_LOGS").is_some() {
            for machine in self.shared.machines().values() {
                eprintln!("machine {machine:#?}");
            }
        }
    }
}

/// The watch loop: boots a machine for each new running fleet instance,
/// stops the machine of each terminated one.
async fn watch(moto: Arc<Moto>, cluster: Cluster, shared: Arc<Shared>) {
    let mut running: BTreeMap<String, MachineTask> = BTreeMap::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    loop {
        match moto.instances().await {
            Ok(instances) => {
                for instance in instances {
                    if instance.state == "running" && seen.insert(instance.id.clone()) {
                        let id = instance.id.clone();
                        let task = boot(moto.clone(), cluster.clone(), shared.clone(), instance);
                        running.insert(id, task);
                    } else if instance.state != "running" {
                        if let Some(task) = running.remove(&instance.id) {
                            task.stop(&shared, &instance.id);
                        }
                    }
                }
            }
            Err(e) => eprintln!("launcher: moto: {e:#}"),
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A machine's task; aborting it drops the machine.
struct MachineTask(JoinHandle<()>);

impl MachineTask {
    fn stop(self, shared: &Shared, id: &str) {
        self.0.abort();
        shared.update(id, |m| m.stopped = Some(Instant::now()));
    }
}

impl Drop for MachineTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Records the machine and starts its task.
fn boot(
    moto: Arc<Moto>,
    cluster: Cluster,
    shared: Arc<Shared>,
    described: MotoInstance,
) -> MachineTask {
    let id = described.id.clone();
    let flaw = shared.take_flaw();
    shared.machines().insert(
        id.clone(),
        Machine {
            instance_id: id.clone(),
            node_name: described.private_dns_name.clone(),
            booted: Instant::now(),
            broken: flaw.is_some(),
            flaw,
            agent: None,
            registered: None,
            stopped: None,
            error: None,
            root: None,
            console: None,
            instance: None,
        },
    );
    let task_shared = shared.clone();
    let task = tokio::spawn(async move {
        let id = described.id.clone();
        if let Err(e) = live(&moto, &cluster, &task_shared, described, flaw).await {
            task_shared.update(&id, |m| m.error = Some(format!("{e:#}")));
        }
    });
    MachineTask(task)
}

/// One machine's life: boot, the agent, kubelet's registration; then it
/// runs until its task is aborted.
async fn live(
    moto: &Moto,
    cluster: &Cluster,
    shared: &Shared,
    described: MotoInstance,
    flaw: Option<Flaw>,
) -> Result<()> {
    let id = described.id.clone();
    let (template, version) = moto
        .template_of(&id)
        .await?
        .with_context(|| format!("{id} was not launched by a fleet"))?;
    let data = moto.template_data(&template, &version).await?;
    let mut instance = instance(&described, data.user_data)?;
    if flaw == Some(Flaw::SignedForAnotherImage) {
        instance.image_id = ANOTHER_IMAGE.into();
    }
    shared.update(&id, |m| m.instance = Some(instance.clone()));
    if flaw == Some(Flaw::AgentStartsLate) {
        shared.late_machines_released().await;
    }
    match cluster.kind {
        MachineKind::Simulated => live_simulated(cluster, shared, instance, flaw).await,
        MachineKind::Vm if flaw.is_some_and(|f| f != Flaw::AgentStartsLate) => {
            bail!("a VM's image cannot be broken")
        }
        MachineKind::Vm => live_vm(cluster, shared, instance).await,
    }
}

/// A simulated machine's life: the agent in a namespace, then the
/// kubelet stand-in's registration and Lease.
async fn live_simulated(
    cluster: &Cluster,
    shared: &Shared,
    instance: Instance,
    flaw: Option<Flaw>,
) -> Result<()> {
    let id = instance.instance_id.clone();
    let node = SimulatedNode::boot_at(
        &instance,
        &cluster.identity_ca,
        cluster.server_inside,
        cluster.server_host,
    )?;
    if flaw == Some(Flaw::KubeletWontStart) {
        node.break_systemctl()?;
    }
    shared.update(&id, |m| m.root = Some(node.root.path().to_path_buf()));
    let run = node.run_agent_binary(&shared.agent()?, &[]).await?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    let log_tail: Vec<&str> = stderr.lines().rev().take(15).collect();
    let exit = AgentExit {
        at: Instant::now(),
        code: run.status.code(),
        log_tail: log_tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
    };
    shared.update(&id, |m| m.agent = Some(exit));
    if run.status.success() && node.systemctl_calls().contains("kubelet.service") {
        if flaw == Some(Flaw::KubeletStartsLate) {
            shared.late_machines_released().await;
        }
        let kubelet = node.kubelet_client().await?;
        Api::<Node>::all(kubelet.clone())
            .create(&PostParams::default(), &kubelet_node(&instance))
            .await
            .context("kubelet's registration")?;
        shared.update(&id, |m| m.registered = Some(Instant::now()));
        // The machine lives on (its namespace, IMDS) until it is stopped.
        loop {
            renew_lease(&kubelet, &instance.private_dns_name).await?;
            tokio::time::sleep(LEASE_RENEWAL).await;
        }
    }
    std::future::pending::<()>().await;
    drop(node);
    Ok(())
}

/// From QEMU's start to the test image's report of the agent's run
/// (firmware, kernel, systemd, the agent), emulated on shared cores.
const VM_BOOT_TIMEOUT: Duration = Duration::from_secs(480);

/// A VM's life: IMDS for the instance on host loopback, the amd64 test
/// image booted with moto's address for it; the agent's outcome from the
/// image's report; then it runs (kubelet registers the Node itself) until
/// its task is aborted or QEMU exits.
async fn live_vm(cluster: &Cluster, shared: &Shared, instance: Instance) -> Result<()> {
    let id = instance.instance_id.clone();
    if instance.architecture != Arch::Amd64.ec2_name() {
        bail!(
            "{id} is {}: the VM mode boots amd64 only",
            instance.architecture
        );
    }
    let imds = crate::cloud::fakecloud::Imds::start(&instance, &cluster.identity_ca)?;
    // The image's build (a no-op when cached) runs a script: off the
    // runtime's threads.
    let image = tokio::task::spawn_blocking(|| Image::get(Arch::Amd64)).await??;
    let forwards = vm::forwards(imds.addr(), cluster.api_host, cluster.server_host);
    let machine = Vm::boot_as(
        &image,
        &format!("karpenter-{id}"),
        instance.private_ip,
        &forwards,
    )?;
    let console = machine.console_path().to_path_buf();
    shared.update(&id, |m| m.console = Some(console));
    let outcome = async {
        let report = machine.agent_report(VM_BOOT_TIMEOUT).await?;
        let status = report.get("autonode-agent.ExecMainStatus")?;
        let lines: Vec<&str> = report.agent_log.iter().map(|(_, l)| l.as_str()).collect();
        let exit = AgentExit {
            at: Instant::now(),
            code: status.parse().ok(),
            log_tail: lines[lines.len().saturating_sub(40)..].join("\n"),
        };
        shared.update(&id, |m| m.agent = Some(exit));
        loop {
            machine.check_alive()?;
            tokio::time::sleep(POLL).await;
        }
    };
    let outcome: Result<()> = outcome.await;
    machine.explain(outcome)
}

/// How often the kubelet stand-in renews its Lease (kubelet's default).
pub const LEASE_RENEWAL: Duration = Duration::from_secs(10);

/// Creates or renews the node's Lease in `kube-node-lease`, as kubelet.
async fn renew_lease(kubelet: &kube::Client, node: &str) -> Result<()> {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let leases: Api<Lease> = Api::namespaced(kubelet.clone(), "kube-node-lease");
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    match leases.get_opt(node).await? {
        Some(mut lease) => {
            lease.spec.get_or_insert_with(LeaseSpec::default).renew_time = Some(now);
            leases
                .replace(node, &PostParams::default(), &lease)
                .await
                .context("renewing the node's Lease")?;
        }
        None => {
            let lease = Lease {
                metadata: kube::api::ObjectMeta {
                    name: Some(node.to_string()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(node.to_string()),
                    lease_duration_seconds: Some(40),
                    renew_time: Some(now),
                    ..Default::default()
                }),
            };
            leases
                .create(&PostParams::default(), &lease)
                .await
                .context("creating the node's Lease")?;
        }
    }
    Ok(())
}

/// The instance as IMDS describes it, from what moto reports.
pub fn instance(described: &MotoInstance, user_data: Vec<u8>) -> Result<Instance> {
    use time::format_description::well_known::Rfc3339;
    let pending_time = time::OffsetDateTime::parse(&described.launch_time, &Rfc3339)
        .with_context(|| format!("launchTime {:?}", described.launch_time))?;
    Ok(Instance {
        instance_id: described.id.clone(),
        account_id: described.owner_id.clone(),
        region: REGION.into(),
        availability_zone: described.zone.clone(),
        image_id: described.image_id.clone(),
        instance_type: described.instance_type.clone(),
        architecture: described.architecture.clone(),
        private_ip: described
            .private_ip
            .parse()
            .with_context(|| format!("privateIpAddress {:?}", described.private_ip))?,
        // Karpenter's launch templates ask for one address per instance.
        secondary_ips: Vec::new(),
        second_interface_ips: Vec::new(),
        ipv6s: Vec::new(),
        private_dns_name: described.private_dns_name.clone(),
        local_hostname: described.private_dns_name.clone(),
        mac: described.mac.clone(),
        pending_time,
        state: InstanceState::Running,
        user_data,
        reservation_id: described.reservation_id.clone(),
        network_interface_id: described.network_interface_id.clone(),
        subnet_id: described.subnet.clone(),
        vpc_id: described.vpc.clone(),
        tags: described
            .tags
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    })
}

/// The Node kubelet registers on `instance`: [`registration`]'s providerID
/// and taint, the labels kubelet sets itself, and a Ready status with an
/// m5.large's capacity (Karpenter calls a node Initialized only once it
/// is Ready and has every resource its NodeClaim requested).
pub fn kubelet_node(instance: &Instance) -> Node {
    let mut node = registration(instance);
    let arch = match instance.architecture.as_str() {
        "arm64" => "arm64",
        _ => "amd64",
    };
    node.metadata.labels = Some(
        [
            ("kubernetes.io/hostname", instance.private_dns_name.as_str()),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", arch),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    let resources: BTreeMap<String, Quantity> = [
        ("cpu", "2"),
        ("memory", "7901060Ki"),
        ("pods", "29"),
        ("ephemeral-storage", "20959212Ki"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
    .collect();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    node.status = Some(NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: instance.private_ip.to_string(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: instance.private_dns_name.clone(),
            },
        ]),
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: Some("KubeletReady".into()),
            message: Some("kubelet is posting ready status".into()),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(now),
        }]),
        ..Default::default()
    });
    node
}
