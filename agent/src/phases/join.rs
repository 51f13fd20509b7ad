//! The join phase: a saved answer whose client certificate is still valid,
//! else the server's answer to this node's request.

use super::keys::NodeKeys;
use super::{record, started, succeeded, Run};
use crate::failure::{Failure, OrFail as _};
use autonode_agent::imds::Identity;
use autonode_agent::nitrotpm::NitroTpm;
use autonode_agent::report::{Reporter, RetryNotices};
use autonode_agent::retry::Retrying;
use autonode_agent::server_client::{Attester, JoinError, ServerClient};
use autonode_agent::{join, kubelet};
use autonode_shared::protocol::{JoinResponse, Outcome, Phase};

pub(super) async fn run(
    run: &mut Run,
    identity: &Identity,
    client: &ServerClient,
    reporter: &Reporter,
    keys: &NodeKeys,
) -> Result<JoinResponse, Failure> {
    started(Phase::Join);
    if let Some(answer) = saved_answer(run, identity) {
        succeeded(
            Phase::Join,
            &format!("node={} (saved answer)", answer.node_name),
        );
        return Ok(answer);
    }
    // The CSRs are the keys' to make: a failure counts as the keys phase's.
    let request = join::request(identity, &keys.client, &keys.serving).or_fail(Phase::Keys)?;
    let asked = std::time::Instant::now();
    // A join that keeps failing is news for the NodeClaim (an Event), so
    // that "retrying, and why" is visible without the node's console.
    let (deadline, reports) = (run.deadline, &mut run.reports);
    let mut notices = RetryNotices::default();
    let observe = |retrying: &Retrying<'_, JoinError>| {
        if notices.due(retrying.attempt, tokio::time::Instant::now()) {
            let message = format!(
                "attempt {} failed: {}; retrying in {:.0}s",
                retrying.attempt,
                retrying.error,
                retrying.delay.as_secs_f64()
            );
            let key = Some(&keys.client);
            reporter.send_later(reports, Phase::Join, Outcome::Retrying, message, key);
        }
    };
    let tpm = NitroTpm::from_env();
    let attester = Attester {
        tpm: &tpm,
        keys_digest: join::keys_digest(&keys.client, &keys.serving),
    };
    let answer = client.join(&request, &attester, &deadline, observe).await;
    let answer = answer.or_fail_in(Phase::Join, "joining")?;
    log::debug!("the server answered in {:?}", asked.elapsed());
    // Checked before it is saved, and so before its Ignition runs.
    let kept = join::keep_answer(&run.state, identity, &answer);
    kept.or_fail(Phase::Join)?;
    record(run, Phase::Join, Some(&answer.node_name), &[])?;
    succeeded(Phase::Join, &format!("node={}", answer.node_name));
    Ok(answer)
}

/// An earlier run's answer, while its client certificate is valid and it
/// fits this node (checked again: the state directory is only a file).
fn saved_answer(run: &Run, identity: &Identity) -> Option<JoinResponse> {
    let now = run.clock.unix();
    run.state.load_response().ok().flatten().filter(|answer| {
        join::check_answer(answer, identity).is_ok()
            && kubelet::not_after(answer.client_certificate.as_bytes())
                .is_some_and(|expiry| expiry > now)
    })
}
