//! The identity phase: who this instance is, from IMDS.

use super::{started, succeeded};
use crate::failure::{Failure, OrFail as _};
use autonode_agent::config::Settings;
use autonode_agent::imds::Identity;
use autonode_agent::retry::Deadline;
use autonode_shared::protocol::Phase;

pub(super) async fn run(settings: &Settings, deadline: Deadline) -> Result<Identity, Failure> {
    started(Phase::Identity);
    let imds = settings.imds.client(deadline).or_fail(Phase::Identity)?;
    let identity = imds.identity().await;
    let identity = identity.or_fail_in(Phase::Identity, "reading the instance identity")?;
    succeeded(
        Phase::Identity,
        &format!(
            "instance={} hostname={} ips={:?}",
            identity.provider_id(),
            identity.local_hostname,
            identity.ips
        ),
    );
    Ok(identity)
}
