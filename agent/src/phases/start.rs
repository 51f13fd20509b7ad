//! The start phase: the units Ignition enabled, and kubelet.

use super::apply::Units;
use super::keys::NodeKeys;
use super::{record, started, succeeded, Run};
use crate::failure::{Failure, OrFail as _};
use autonode_agent::kubelet;
use autonode_agent::report::Reporter;
use autonode_shared::protocol::{JoinResponse, Outcome, Phase};

pub(super) fn run(
    run: &mut Run,
    answer: &JoinResponse,
    units: Units,
    reporter: &Reporter,
    keys: &NodeKeys,
) -> Result<(), Failure> {
    started(Phase::Start);
    let node = &run.settings.node;
    let result = kubelet::start(
        &node.systemctl,
        &units.enabled,
        units.reload,
        node.start_kubelet,
    );
    result.or_fail_in(Phase::Start, "starting kubelet")?;
    record(run, Phase::Start, Some(&answer.node_name), &[])?;
    run.state
        .flush()
        .or_fail_in(Phase::Start, "recording progress")?;
    succeeded(Phase::Start, &format!("node={}", answer.node_name));
    let message = "kubelet started".to_string();
    let key = Some(&keys.client);
    reporter.send_later(
        &mut run.reports,
        Phase::Start,
        Outcome::Succeeded,
        message,
        key,
    );
    Ok(())
}
