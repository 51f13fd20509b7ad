//! A simulated EC2 instance for the real agent binary: its own network
//! namespace where the fake IMDS answers on 169.254.169.254:80, the
//! autonode-server port forwarded in from host loopback, and a directory
//! standing in for the machine's root filesystem.

use crate::cloud::fakecloud::imds::{Imds, IMDS_ADDR};
use crate::cloud::fakecloud::{Instance, TestCa};
use crate::network::netns::{self, Forward, NetNs};
use crate::server::binary;
use crate::server::world::World;
use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use kube::api::ObjectMeta;
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Output;
use tempfile::TempDir;

/// The agent config an EC2NodeClass's userData would carry for `world`.
/// The agent's IMDS endpoint override, which a simulated node must not
/// inherit from the test's environment.
pub const IMDS_ENDPOINT_ENV: &str = "AWS_EC2_METADATA_SERVICE_ENDPOINT";

/// Where simulated nodes' root directories are made, when set.
pub const NODE_DISK_ENV: &str = "AUTONODE_NODE_DISK";

pub fn user_data(world: &World) -> String {
    format!(
        "server-url = \"{}\"\nserver-ca = \"\"\"\n{}\"\"\"\ncluster-name = \"autonode-test\"\n\n[options]\ndeadline = \"60s\"\n",
        world.server.url(),
        world.server.ca_pem()
    )
}

/// The agent binary [`SimulatedNode::run_agent`] runs: `$AUTONODE_AGENT_BIN`
/// when set (the benchmarks point it at the static release build), else
/// the one built next to the tests.
pub fn agent_binary() -> Result<PathBuf> {
    match std::env::var_os("AUTONODE_AGENT_BIN") {
        Some(path) => Ok(PathBuf::from(path)),
        None => binary("autonode-agent"),
    }
}

/// Karpenter's part for a machine that runs the agent: a NodeClaim, an
/// instance whose userData is [`user_data`], its providerID; then boots
/// it. Returns the NodeClaim's name and the machine.
pub async fn launch_machine(world: &World) -> Result<(String, SimulatedNode)> {
    let user_data = user_data(world);
    let (claim, instance) = world
        .launch(|i| Instance {
            user_data: user_data.into_bytes(),
            ..i
        })
        .await?;
    Ok((claim, SimulatedNode::boot(world, &instance)?))
}

/// One machine: namespace, IMDS, forwarded server, root directory.
// Field order is drop order: servers stop before the namespace goes.
pub struct SimulatedNode {
    pub imds: Imds,
    _forward: Forward,
    pub root: TempDir,
    pub netns: NetNs,
    pub instance: Instance,
}

impl SimulatedNode {
    /// Boots the "machine" for `instance` (whose userData must be set).
    pub fn boot(world: &World, instance: &Instance) -> Result<Self> {
        let server: SocketAddr = world
            .server
            .url()
            .trim_start_matches("https://")
            .parse()
            .context("server URL is not ip:port")?;
        // The same address inside, so the userData URL works unchanged.
        Self::boot_at(instance, world.cloud.ca(), server, server)
    }

    /// Boots the machine for `instance`, its identity signed by `ca`, with
    /// `server_inside` (the address its userData names) forwarded to the
    /// server at `server_host` on host loopback.
    pub fn boot_at(
        instance: &Instance,
        ca: &TestCa,
        server_inside: SocketAddr,
        server_host: SocketAddr,
    ) -> Result<Self> {
        let netns = NetNs::new()?;
        let imds = Imds::start_on(netns.bind(IMDS_ADDR)?, instance, ca, None)?;
        let forward = netns::forward(&netns, server_inside, server_host)?;
        // A node has a disk of its own: `$AUTONODE_NODE_DISK` names a
        // directory on another filesystem than the control plane's (the
        // benchmark mounts one), so the agent's syncs wait for its own
        // writes only.
        let parent = std::env::var_os(NODE_DISK_ENV).map(PathBuf::from);
        let root = tempfile::Builder::new()
            .prefix("autonode-node-")
            .tempdir_in(parent.unwrap_or_else(std::env::temp_dir))?;
        write_fake_systemctl(root.path(), 0)?;
        write_kubelet_unit(root.path())?;
        // Stands in for /dev/console, which exists on every machine.
        std::fs::write(root.path().join("console.log"), "")?;
        Ok(Self {
            imds,
            _forward: forward,
            root,
            netns,
            instance: instance.clone(),
        })
    }

    /// Makes every later systemctl call fail (still recorded), as on a
    /// machine whose image cannot start kubelet: the agent's start phase
    /// fails for good.
    pub fn break_systemctl(&self) -> Result<()> {
        write_fake_systemctl(self.root.path(), 1)
    }

    /// Runs the agent binary inside the namespace with [`Self::agent_args`]
    /// and `extra`.
    pub async fn run_agent(&self, extra: &[&str]) -> Result<Output> {
        self.run_agent_binary(&agent_binary()?, extra).await
    }

    /// [`Self::run_agent`] with another agent binary (an earlier
    /// revision's, for the skew tests: [`crate::server::skew`]).
    pub async fn run_agent_binary(&self, binary: &Path, extra: &[&str]) -> Result<Output> {
        self.run_agent_env(binary, extra, &[]).await
    }

    /// [`Self::run_agent_binary`] with `env` set for the agent (and so for
    /// the tools it runs: the NitroTPM stand-in's settings).
    pub async fn run_agent_env(
        &self,
        binary: &Path,
        extra: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Output> {
        let mut command = self.netns.command(binary);
        command.envs(env.iter().copied());
        command
            .args(self.agent_args())
            .args(extra)
            .env_remove(IMDS_ENDPOINT_ENV);
        // Nor a proxy: the agent would honour it.
        for name in crate::network::proxy::PROXY_ENV {
            command.env_remove(name);
        }
        command.output().await.context("running autonode-agent")
    }

    /// The agent's flags for this node: its root at [`SimulatedNode::root`],
    /// systemctl replaced by a recorder, a file for the console. (Run it
    /// without [`IMDS_ENDPOINT_ENV`], so it finds IMDS where EC2 has it.)
    pub fn agent_args(&self) -> [String; 3] {
        let root = self.root.path();
        [
            format!("--root={}", root.display()),
            format!("--systemctl={}", root.join("fake-systemctl").display()),
            format!("--console={}", root.join("console.log").display()),
        ]
    }

    /// Path of a file on the machine.
    pub fn path(&self, absolute: &str) -> PathBuf {
        self.root.path().join(absolute.trim_start_matches('/'))
    }

    /// What the agent asked systemctl to do.
    pub fn systemctl_calls(&self) -> String {
        std::fs::read_to_string(self.root.path().join("systemctl.log")).unwrap_or_default()
    }

    /// A client from the kubeconfig the agent wrote for kubelet, its file
    /// references resolved under the machine's root.
    pub async fn kubelet_client(&self) -> Result<kube::Client> {
        kubelet_client_under(self.root.path()).await
    }
}

/// A client from the kubeconfig the agent wrote for kubelet on the disk
/// at `root` (a machine's, or a copy of one), its files read under `root`.
pub async fn kubelet_client_under(root: &Path) -> Result<kube::Client> {
    let on = |absolute: &str| root.join(absolute.trim_start_matches('/'));
    let text = std::fs::read_to_string(on("/var/lib/kubelet/kubeconfig"))?;
    let mut doc: serde_json::Value = serde_json::from_str(&text)?;
    for pointer in [
        "/clusters/0/cluster/certificate-authority",
        "/users/0/user/client-certificate",
        "/users/0/user/client-key",
    ] {
        if let Some(value) = doc.pointer_mut(pointer) {
            let on_node = value.as_str().context("kubeconfig path is not a string")?;
            *value = on(on_node).display().to_string().into();
        }
    }
    let kubeconfig: Kubeconfig = serde_json::from_value(doc)?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// The Node kubelet registers for `instance`: its name, its providerID and
/// the taint Karpenter requires at registration.
pub fn registration(instance: &Instance) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(instance.private_dns_name.clone()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(instance.provider_id()),
            taints: Some(vec![Taint {
                key: "karpenter.sh/unregistered".into(),
                effect: "NoExecute".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// A systemctl that only records its arguments and exits with `status`.
fn write_fake_systemctl(root: &Path, status: u8) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let path = root.join("fake-systemctl");
    let log = root.join("systemctl.log");
    // Written aside and renamed: the agent may be running it.
    let partial = root.join("fake-systemctl.partial");
    std::fs::write(
        &partial,
        format!(
            "#!/bin/sh\necho \"$@\" >> '{}'\nexit {status}\n",
            log.display()
        ),
    )?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&partial, &path)?;
    Ok(())
}

/// The kubelet an AMI ships with kubelet's package (its unit, and a
/// binary that answers `--version`); the agent starts it.
fn write_kubelet_unit(root: &Path) -> Result<()> {
    let dir = root.join("usr/lib/systemd/system");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("kubelet.service"),
        "[Unit]\nDescription=kubelet\n\n[Service]\nExecStart=/usr/bin/kubelet\n\n[Install]\nWantedBy=multi-user.target\n",
    )?;
    // The agent asks kubelet its version (`kubelet --version`) to know
    // where its settings go: this one answers with the harness's kubelet's
    // (AUTONODE_KUBE_BIN's, when set), so newer binaries take the agent's
    // branch for them.
    use std::os::unix::fs::PermissionsExt;
    let real = crate::kube::controlplane::kube_bin_dir()?.join("kubelet");
    let version = crate::kube::controlplane::binary_version(&real)?;
    let kubelet = root.join("usr/bin/kubelet");
    std::fs::create_dir_all(root.join("usr/bin"))?;
    std::fs::write(&kubelet, format!("#!/bin/sh\necho Kubernetes {version}\n"))?;
    std::fs::set_permissions(&kubelet, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}
