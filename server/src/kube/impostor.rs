//! Impostor Nodes: a node that registered a Node carrying another
//! machine's providerID, so Karpenter Registered that machine's NodeClaim
//! to it. How many of one impostor's victims autonode fails, and how a
//! repeat is told.
//!
//! A kubelet may register only the Node of its own name (NodeRestriction),
//! but with any providerID: a compromised node can take the next booting
//! machine's NodeClaim, again and again. Failing each victim (so Karpenter
//! replaces it) is right once; done for every machine that boots, it lets
//! one node stop a cluster from growing, and victims launched under a
//! rollout trial would revert a good AMI. So each impostor Node name may
//! cost [`VICTIMS_BURST`] victims per [`VICTIMS_PERIOD`] (per replica);
//! past that its victims are left as they are and the repeat is what is
//! told: a compromised node, by name in a log line and a Warning Event,
//! counted in `autonode_impostor_repeats_total` (no name in a label: an
//! attacker chooses Node names).

use crate::kube::events::Events;
use crate::kube::karpenter::NodeClaim;
use crate::kube::metrics::Metrics;
use crate::kube::reason::Reason;
use crate::primitives::limiter::Limiter;
use crate::primitives::told::Told;
use std::time::{Duration, Instant};

/// Victims one impostor Node name may cost at once.
pub const VICTIMS_BURST: u32 = 1;
/// One more victim per impostor Node name per this long.
pub const VICTIMS_PERIOD: Duration = Duration::from_secs(3600);
/// Impostor Node names tracked at once: each is a node credential of its
/// own, so more means many compromised nodes; past it every victim waits.
pub const MAX_IMPOSTORS: usize = 256;

/// Each impostor's allowance of victims, and the victims left alone
/// already told (one per replica, shared by the join and the feedback
/// controller through [`crate::kube::nodeclaim::NodeClaims::impostors`]).
pub struct Impostors {
    victims: Limiter,
    /// Victims left alone, by NodeClaim UID, with their impostor's name: a
    /// victim's agent retries its join, and each is refused again.
    withheld: Told,
}

impl Default for Impostors {
    fn default() -> Self {
        Self {
            victims: Limiter::new(VICTIMS_BURST, VICTIMS_PERIOD, MAX_IMPOSTORS),
            withheld: Told::new(MAX_IMPOSTORS),
        }
    }
}

impl Impostors {
    /// Whether `claim`, Registered to impostor Node `node`, may be failed
    /// now (one of `node`'s allowance taken). When not, says once per
    /// victim, loudly, that `node` looks compromised.
    pub fn may_fail_victim(
        &self,
        (metrics, events): (&Metrics, &Events),
        claim: &NodeClaim,
        node: &str,
    ) -> bool {
        let Err(wait) = self.victims.try_take(node, Instant::now()) else {
            return true;
        };
        let uid = claim.metadata.uid.as_deref().unwrap_or_default();
        if !self.withheld.first(uid, node) {
            return false;
        }
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let why = format!(
            "Node {node} has registered under another machine's providerID again: its node is \
             likely compromised (cordon, drain and replace it, and revoke its credential). \
             NodeClaim {name} is left as it is: the next of {node}'s victims is failed in {}s",
            wait.as_secs()
        );
        tracing::error!(node = %node, nodeclaim = %name, "{why}");
        metrics.impostor_repeats.inc();
        events.warning(claim, Reason::NodeSpoofed, why);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_impostor_costs_one_victim_per_period_and_others_are_apart() {
        let limiter = Impostors::default().victims;
        let now = Instant::now();
        assert!(limiter.try_take("ip-10-0-0-1.ec2.internal", now).is_ok());
        assert!(limiter.try_take("ip-10-0-0-1.ec2.internal", now).is_err());
        assert!(limiter.try_take("ip-10-0-0-2.ec2.internal", now).is_ok());
        let later = now + VICTIMS_PERIOD;
        assert!(limiter.try_take("ip-10-0-0-1.ec2.internal", later).is_ok());
    }
}
