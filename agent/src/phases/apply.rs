//! The apply phase: Ignition, kubelet's files, kubelet enabled.

use super::keys::NodeKeys;
use super::{record, started, succeeded, Run};
use crate::failure::{fail_as, Failure, Kind, OrFail as _};
use autonode_agent::fsutil::Durability;
use autonode_agent::ignition::{self, units};
use autonode_agent::imds::Identity;
use autonode_agent::kubelet;
use autonode_shared::protocol::{JoinResponse, Phase};
use std::path::{Path, PathBuf};

/// The units to start, and whether systemd must reload first.
pub(super) struct Units {
    pub enabled: Vec<String>,
    pub reload: bool,
}

/// The version of the kubelet under the root: the image's record, the
/// cache, its build information or `kubelet --version`
/// ([`kubelet::Probe`]); started early, finished in [`run`].
pub(super) fn probe_kubelet(run: &Run) -> Result<kubelet::Probe, Failure> {
    let path = &run.settings.node.kubelet_path;
    let program = run.root.join(path);
    let program = program.map_err(fail_as(Kind::Config, Phase::Apply, "--kubelet-path"))?;
    let record = run.root.join(kubelet::VERSION_RECORD);
    let record = record.map_err(fail_as(Kind::Failed, Phase::Apply, "kubelet's record"))?;
    let cache = run.state_dir.join(kubelet::VERSION_CACHE);
    Ok(kubelet::Probe::start(kubelet::Places {
        kubelet: &program,
        named: Path::new(path),
        cache: &cache,
        record: &record,
    }))
}

pub(super) fn run(
    run: &Run,
    identity: &Identity,
    answer: &JoinResponse,
    keys: &NodeKeys,
    probe: kubelet::Probe,
) -> Result<Units, Failure> {
    started(Phase::Apply);
    let units = write(run, identity, answer, keys, probe)?;
    let written = kubelet::FILES
        .iter()
        .map(|path| run.root.join(path))
        .collect::<Result<Vec<PathBuf>, _>>()
        .map_err(fail_as(Kind::Failed, Phase::Apply, "kubelet paths"))?;
    // kubelet's files are synced before apply is recorded.
    let written: Vec<&Path> = written.iter().map(PathBuf::as_path).collect();
    record(run, Phase::Apply, Some(&answer.node_name), &written)?;
    succeeded(Phase::Apply, &format!("node={}", answer.node_name));
    Ok(units)
}

fn write(
    run: &Run,
    identity: &Identity,
    answer: &JoinResponse,
    keys: &NodeKeys,
    probe: kubelet::Probe,
) -> Result<Units, Failure> {
    let applied = ignition::apply(&run.root, &answer.ignition);
    let applied = applied.or_fail_in(Phase::Apply, "applying the Ignition config")?;
    log::info!(
        "ignition: {} entries changed; enabled units {:?}",
        applied.changed,
        applied.enabled_units
    );
    let version = kubelet_version(probe)?;
    let kubelet = kubelet::Kubelet {
        path: &run.settings.node.kubelet_path,
        version,
    };
    let changed = kubelet::write(&run.root, answer, &keys.for_kubelet(), identity, kubelet);
    let changed = changed.or_fail_in(Phase::Apply, "writing kubelet's files")?;
    log::info!("kubelet: {changed} files changed");
    // Enabling a known unit: whatever fails is this node's, not a refusal.
    units::enable(&run.root, kubelet::UNIT, Durability::Deferred).map_err(fail_as(
        Kind::Failed,
        Phase::Apply,
        "enabling kubelet.service",
    ))?;
    let retired = kubelet::retire_old_dropin(&run.root);
    let retired = retired.or_fail_in(Phase::Apply, "removing an older agent's kubelet drop-in")?;
    let reload = retired || kubelet::ignition_touches_units(&answer.ignition);
    Ok(Units {
        enabled: applied.enabled_units,
        reload,
    })
}

fn kubelet_version(probe: kubelet::Probe) -> Result<kubelet::KubeletVersion, Failure> {
    let asked = std::time::Instant::now();
    let answer = probe.finish();
    let kubelet::Answer { version, found } =
        answer.or_fail_in(Phase::Apply, "finding kubelet's version")?;
    // key=value, for the VM test's timings (tests/tests/integration/vm.rs).
    log::info!(
        "kubelet version={version} from={} took_s={:.3} waited_s={:.3}",
        found.name(),
        found.took().as_secs_f64(),
        asked.elapsed().as_secs_f64()
    );
    // Still supported (images baked before the record existed must keep
    // joining), but it put a 100 MB binary's start on the boot's path.
    if let kubelet::Found::Ran(took) = found {
        log::warn!(
            "ran `kubelet --version` ({:.1} s) because the image did not record kubelet's version when it was baked: record it in {} (packaging/bake/provision does; packaging/examples/AMI.md)",
            took.as_secs_f64(),
            kubelet::VERSION_RECORD
        );
    }
    Ok(version)
}
