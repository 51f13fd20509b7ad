//! The keys phase: the node's two keys, durable before the join can use
//! them.

use super::{record, started, succeeded, Run};
use crate::failure::{Failure, OrFail as _};
use autonode_agent::keys;
use autonode_agent::kubelet;
use autonode_shared::protocol::Phase;
use rcgen::KeyPair;

/// The kubelet's client and serving keys.
pub(super) struct NodeKeys {
    pub client: KeyPair,
    pub serving: KeyPair,
}

impl NodeKeys {
    pub fn for_kubelet(&self) -> kubelet::Keys<'_> {
        kubelet::Keys {
            client: &self.client,
            serving: &self.serving,
        }
    }
}

pub(super) fn run(run: &Run) -> Result<NodeKeys, Failure> {
    started(Phase::Keys);
    // A key a join may have used is kept: the server may have bound it.
    let never_used = run.resumed.is_none_or(|phase| phase < Phase::Keys);
    let (client, new) = keys::load_or_generate(&run.state.client_key(), never_used)
        .or_fail_in(Phase::Keys, "client key")?;
    let (serving, _) = keys::load_or_generate(&run.state.serving_key(), never_used)
        .or_fail_in(Phase::Keys, "serving key")?;
    record(run, Phase::Keys, None, &[])?;
    succeeded(
        Phase::Keys,
        if new { "(new keys)" } else { "(existing keys)" },
    );
    Ok(NodeKeys { client, serving })
}
