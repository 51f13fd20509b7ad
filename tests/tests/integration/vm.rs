//! The AMI in miniature: a real machine (the test image under QEMU) boots,
//! runs the agent from its package, and becomes a Ready node of the test
//! control plane; or, refused, never starts kubelet.
//!
//! Each scenario runs once per architecture, in a module named by it
//! (`vm::amd64::…`, `vm::arm64::…`), so one architecture can run alone:
//! `tests/vm/run vm::arm64::`. Both machines are emulated
//! whatever the host (an x86_64 PC, an arm64 `virt` board).
//!
//! Run alone with `tests/vm/run`. Slow by nature (software emulation): the
//! test group in `.config/nextest.toml` runs these one at a time.

use anyhow::{ensure, Context, Result};
use autonode_tests::cloud::fakecloud::{Imds, Instance};
use autonode_tests::harness::poll::{self, Seen};
use autonode_tests::machines::vm::{self, Arch, Image, Report, Vm, VmWorld};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

/// From QEMU's start to the agent's report: firmware, kernel, systemd,
/// DHCP, the agent's run, all emulated and sharing 2 cores with the rest
/// of the suite.
const BOOT_TIMEOUT: Duration = Duration::from_secs(360);
/// From the agent's success to a Ready node: kubelet's start (a 100 MB Go
/// binary under emulation), registration, containerd's status.
const READY_TIMEOUT: Duration = Duration::from_secs(360);

/// The scenarios, once per architecture: `$arch` is the module's name.
macro_rules! scenarios {
    ($arch:ident, $value:expr) => {
        mod $arch {
            use super::*;

            #[tokio::test]
            async fn a_machine_boots_runs_the_agent_and_becomes_a_ready_node() -> Result<()> {
                joins($value).await
            }

            #[tokio::test]
            async fn a_machine_without_a_nodeclaim_is_refused_and_kubelet_never_starts(
            ) -> Result<()> {
                refused($value).await
            }
        }
    };
}

scenarios!(amd64, Arch::Amd64);
scenarios!(arm64, Arch::Arm64);

async fn joins(arch: Arch) -> Result<()> {
    let image = Image::get(arch)?;
    let env = VmWorld::start().await?;
    check_ami_terms(&env).await?;
    let (claim, instance) = env.world.launch(|_| env.instance(arch)).await?;
    let imds = env.world.cloud.start_imds(&instance)?;
    // What the agent proves itself with says what the machine is.
    let architecture = format!("\"architecture\" : \"{}\"", arch.ec2_name());
    ensure!(
        imds.document().contains(&architecture),
        "the identity document is not a {} machine's: {}",
        arch.ec2_name(),
        imds.document()
    );
    let vm = Vm::boot(&image, &arch.scoped("join"), &env.forwards(&imds)?)?;
    let outcome = joins_and_becomes_ready(&env, &vm, arch, &claim, &instance, &imds).await;
    vm.explain(outcome)
}

/// The class names both architectures' AMIs, from the server's
/// `--ami-ids` (the class was created with another AMI: upkeep replaced
/// it), one `{id}` term each, ordered by architecture.
async fn check_ami_terms(env: &VmWorld) -> Result<()> {
    let terms = env.ami_selector_terms().await?;
    let want = json!([{"id": Arch::Amd64.ami_id()}, {"id": Arch::Arm64.ami_id()}]);
    ensure!(terms == want, "amiSelectorTerms {terms}, expected {want}");
    Ok(())
}

async fn joins_and_becomes_ready(
    env: &VmWorld,
    vm: &Vm,
    arch: Arch,
    claim: &str,
    instance: &Instance,
    imds: &Imds,
) -> Result<()> {
    let report = vm.agent_report(BOOT_TIMEOUT).await?;
    check_agent(&report, "success", "0")?;
    check_runtime_waited(&report)?;
    // The image was made by the recipe's provision script, which recorded
    // kubelet's version: the agent read it and never ran kubelet before
    // systemd started it. (An image without the record fails here.)
    let cost = vm::AgentCost::from_log(report.agent_log.iter().map(|(_, l)| l.as_str()))?;
    cost.check_recorded()?;
    ensure!(
        imds.tokens_issued() > 0,
        "the agent joined without a token from the test's IMDS"
    );
    // The package's kubelet drop-in reads what the agent writes, and this
    // Ignition config writes no unit: systemd has nothing to reload.
    ensure!(
        report.agent_logged("daemon-reload took_s=").is_err(),
        "the agent ran systemctl daemon-reload: {:?}",
        report.agent_log
    );

    let nodes: Api<Node> = Api::all(env.world.cp.admin().await?);
    let name = &instance.private_dns_name;
    let registered = wait_node(vm, &nodes, name, "registered", |_| true).await?;
    let boot_to_registered = vm.started().elapsed();
    // The kubelet that registered is the image's (the version under test),
    // the one the agent asked and configured for: the agent's per-version
    // settings are proven on that version.
    let node_kubelet = registered
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.kubelet_version.clone())
        .unwrap_or_default();
    let agent_kubelet = logged_pairs(&report, "kubelet version=")?
        .get("version")
        .cloned()
        .unwrap_or_default();
    ensure!(
        !node_kubelet.is_empty()
            && node_kubelet.trim_start_matches('v') == agent_kubelet.trim_start_matches('v'),
        "the Node says kubelet {node_kubelet:?}, the agent configured for {agent_kubelet:?}"
    );
    let spec = registered.spec.unwrap_or_default();
    ensure!(
        spec.provider_id == Some(instance.provider_id()),
        "providerID {:?}",
        spec.provider_id
    );
    let taints: Vec<String> = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect();
    ensure!(
        taints
            .iter()
            .any(|t| t == "karpenter.sh/unregistered:NoExecute"),
        "taints at registration: {taints:?}"
    );
    // kubelet labels its node with the architecture it was built for: the
    // image's kubelet, on the emulated machine, is the right one.
    let labels = registered.metadata.labels.unwrap_or_default();
    let node_arch = labels.get("kubernetes.io/arch").map(String::as_str);
    ensure!(
        node_arch == Some(arch.name()),
        "kubernetes.io/arch {node_arch:?} on a {} machine",
        arch.name()
    );
    wait_node(vm, &nodes, name, "Ready", is_ready).await?;
    let boot_to_ready = vm.started().elapsed();
    let load = vm::host_load();

    let reasons = env.world.event_reasons(claim, "NodeReady").await?;
    for reason in ["Attested", "AgentProgress", "NodeRegistered", "NodeReady"] {
        ensure!(
            reasons.iter().any(|r| r == reason),
            "no {reason} Event on the NodeClaim: {reasons:?}"
        );
    }
    let path = vm::record_bench(
        &arch.scoped("join"),
        json!({
            "arch": arch.name(),
            // The VM kubelet's own version, as its Node reports it
            // (`agent.kubelet_version` is the agent's reading of it).
            "kubelet_version": node_kubelet,
            "boot_to_registered_s": boot_to_registered.as_secs_f64(),
            "boot_to_ready_s": boot_to_ready.as_secs_f64(),
            "agent": agent_timings(&report)?,
            "agent_cost": cost.to_json(),
            "host_load": load,
            "imds_tokens_issued": imds.tokens_issued(),
        }),
    )?;
    eprintln!(
        "vm join ({}): Node registered {boot_to_registered:.1?} and Ready {boot_to_ready:.1?} after QEMU started; the agent took {:.2} s and {:.2} s of CPU from its fork to its exit ({:.2} s and {:.2} s from main; {:.2} s its children's), kubelet's version from={}; host load {load} ({})",
        arch.name(),
        cost.took_s,
        cost.cpu_s,
        cost.main_took_s,
        cost.main_cpu_s,
        cost.children_cpu_s,
        cost.kubelet_version_from,
        path.display()
    );
    Ok(())
}

async fn refused(arch: Arch) -> Result<()> {
    let image = Image::get(arch)?;
    let env = VmWorld::start().await?;
    // EC2 knows the instance, Karpenter never asked for it: no NodeClaim.
    let instance = env.world.cloud.launch(env.instance(arch));
    let imds = env.world.cloud.start_imds(&instance)?;
    let vm = Vm::boot(&image, &arch.scoped("refused"), &env.forwards(&imds)?)?;
    let outcome = is_refused_and_never_starts_kubelet(&env, &vm, arch, &instance).await;
    vm.explain(outcome)
}

async fn is_refused_and_never_starts_kubelet(
    env: &VmWorld,
    vm: &Vm,
    arch: Arch,
    instance: &Instance,
) -> Result<()> {
    let report = vm.agent_report(BOOT_TIMEOUT).await?;
    check_agent(&report, "exit-code", "2")?; // 2: refused
    let boot_to_failed = vm.started().elapsed();
    let kubelet_started = report.get("kubelet.ExecMainStartTimestampMonotonic")?;
    ensure!(kubelet_started == "0", "kubelet was started");
    // The agent's own message, and systemd's refusal to start kubelet
    // (the package's drop-in: kubelet Requires= the agent).
    let console = vm.console();
    for expected in [
        "autonode-agent: phase=join failed",
        "join refused",
        "Dependency failed for kubelet.service",
    ] {
        ensure!(
            console.contains(expected),
            "{expected:?} is not on the console"
        );
    }

    // Nothing was asked for or approved: this cluster has no CSR at all.
    let admin = env.world.cp.admin().await?;
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone())
        .list(&ListParams::default())
        .await?;
    ensure!(csrs.items.is_empty(), "CSRs exist: {:?}", csrs.items);
    let nodes: Api<Node> = Api::all(admin);
    let node = nodes.get_opt(&instance.private_dns_name).await?;
    ensure!(node.is_none(), "a Node exists: {node:?}");
    let refusal_logged = env
        .world
        .server
        .log()
        .lines()
        .any(|l| l.contains("join refused") && l.contains(&instance.instance_id));
    ensure!(
        refusal_logged,
        "the server did not log the refusal of {}",
        instance.instance_id
    );
    vm::record_bench(
        &arch.scoped("refused"),
        json!({
            "arch": arch.name(),
            "boot_to_agent_failed_s": boot_to_failed.as_secs_f64(),
            "agent_run_s": agent_run_time(&report)?.as_secs_f64(),
        }),
    )?;
    Ok(())
}

/// The agent unit's result and exit status, from the test image's report.
fn check_agent(report: &Report, result: &str, status: &str) -> Result<()> {
    let got = (
        report.get("autonode-agent.Result")?,
        report.get("autonode-agent.ExecMainStatus")?,
    );
    ensure!(
        got == (result, status),
        "autonode-agent.service: Result={} ExecMainStatus={}, expected {result}/{status}",
        got.0,
        got.1
    );
    Ok(())
}

/// Where the agent's time went, by the guest's clock (seconds): its whole
/// run as systemd saw it; from systemd starting it (sandbox set-up, exec)
/// to its first log line; from there to its first phase; its own work from
/// config to kubelet's files written (IMDS, keys, join, apply); how the
/// agent learnt kubelet's version (its build information, the cache or
/// `kubelet --version`), what that cost and how long the agent waited;
/// whether `systemctl daemon-reload` ran and its time; from the start
/// phase to exit (any `systemctl start`, the final report).
fn agent_timings(report: &Report) -> Result<serde_json::Value> {
    let start = report.monotonic("autonode-agent.ExecMainStartTimestampMonotonic")?;
    let exit = report.monotonic("autonode-agent.ExecMainExitTimestampMonotonic")?;
    let first = report.agent_logged(" starting")?;
    let config = report.agent_logged("phase=config started")?;
    let applied = report.agent_logged("phase=apply succeeded")?;
    let start_phase = report.agent_logged("phase=start started")?;
    let reload = logged_pairs(report, "daemon-reload took_s=").ok();
    let version = logged_pairs(report, "kubelet version=")?;
    let starting = logged_pairs(report, "autonode-agent ")?;
    let seconds = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
    Ok(json!({
        "run_s": agent_run_time(report)?.as_secs_f64(),
        "started_after_kernel_s": start.as_secs_f64(),
        "exec_to_first_log_s": seconds(first.checked_sub(start)),
        "fork_to_main_s": number(&starting, "since_fork_s"),
        "first_log_to_config_s": seconds(config.checked_sub(first)),
        "config_to_applied_s": seconds(applied.checked_sub(config)),
        "kubelet_version": version.get("version"),
        "kubelet_version_from": version.get("from"),
        "kubelet_version_took_s": number(&version, "took_s"),
        "kubelet_version_waited_s": number(&version, "waited_s"),
        "daemon_reload_ran": reload.is_some(),
        "daemon_reload_s": reload.and_then(|pairs| number(&pairs, "took_s")),
        "start_to_exit_s": seconds(exit.checked_sub(start_phase)),
    }))
}

/// The `key=value` pairs of the agent's first line starting with `prefix`
/// (`kubelet version=… from=… took_s=… waited_s=…`).
fn logged_pairs(report: &Report, prefix: &str) -> Result<BTreeMap<String, String>> {
    let lines = report.agent_log.iter().map(|(_, message)| message.as_str());
    vm::logged_pairs(lines, prefix)
        .with_context(|| format!("the agent never logged {prefix:?}: {:?}", report.agent_log))
}

/// A pair's value as seconds; `None` if absent or not a number ("cached").
fn number(pairs: &BTreeMap<String, String>, key: &str) -> Option<f64> {
    pairs.get(key).and_then(|v| v.parse().ok())
}

/// The agent's unit is ordered before the container runtime (the Ignition
/// config it applies may write containerd's configuration, which containerd
/// reads only when it starts): containerd started, and after the agent
/// exited. The image's report runs after containerd's start job, so a
/// containerd that never started shows as 0 here, and fails.
fn check_runtime_waited(report: &Report) -> Result<()> {
    let agent_exit = report.monotonic("autonode-agent.ExecMainExitTimestampMonotonic")?;
    let containerd = report.monotonic("containerd.ExecMainStartTimestampMonotonic")?;
    ensure!(
        !containerd.is_zero(),
        "containerd never started (state {:?}): {report:?}",
        report.get("containerd.ActiveState")
    );
    ensure!(
        !agent_exit.is_zero() && containerd >= agent_exit,
        "containerd started at {containerd:?}, before the agent exited at {agent_exit:?}"
    );
    Ok(())
}

/// The runtime check on reports as the image prints them (no VM needed):
/// containerd started after the agent exited passes; before it, or never
/// (the old check let 0 through), fails.
#[test]
fn the_runtime_check_needs_containerd_started_after_the_agent() {
    let report = |containerd_start: u64| {
        Report::parse(&format!(
            "[   20.1] autonode-test-report: autonode-agent.ExecMainExitTimestampMonotonic=20000000\n\
             [   20.2] autonode-test-report: containerd.ActiveState=active\n\
             [   20.2] autonode-test-report: containerd.ExecMainStartTimestampMonotonic={containerd_start}\n"
        ))
    };
    assert!(check_runtime_waited(&report(21_000_000)).is_ok());
    assert!(check_runtime_waited(&report(19_000_000)).is_err());
    assert!(check_runtime_waited(&report(0)).is_err());
}

/// How long the agent's process ran, by systemd's clock in the guest.
fn agent_run_time(report: &Report) -> Result<Duration> {
    let start = report.monotonic("autonode-agent.ExecMainStartTimestampMonotonic")?;
    let exit = report.monotonic("autonode-agent.ExecMainExitTimestampMonotonic")?;
    exit.checked_sub(start)
        .context("the agent exited before it started")
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Polls for Node `name` until `done` holds; the console's tail on timeout.
async fn wait_node(
    vm: &Vm,
    nodes: &Api<Node>,
    name: &str,
    what: &str,
    done: impl Fn(&Node) -> bool,
) -> Result<Node> {
    poll::until(
        &format!("Node {name} {what}"),
        READY_TIMEOUT,
        Duration::from_millis(500),
        || async {
            let node = nodes.get_opt(name).await?;
            if node.as_ref().is_some_and(&done) {
                return Ok(Seen(node, String::new()));
            }
            vm.check_alive()?;
            let status = node.and_then(|n| n.status);
            Ok(Seen(None, format!("status: {status:?}")))
        },
    )
    .await
}
