//! Node names EC2 gives again.
//!
//! EC2's IP-based hostnames (`ip-10-0-0-5.<region>.compute.internal`) name
//! an address, not a machine: once an instance is terminated its private
//! address, and with it its name, may go to the next instance launched in
//! the subnet. A kubelet client certificate says `system:node:<name>` and
//! nothing of the machine it was issued to, so whoever kept a dead
//! machine's certificate (valid up to kube-controller-manager's
//! `--cluster-signing-duration`, a year by default) is, to the API server,
//! the kubelet of the next machine with that name, and its renewals and
//! serving CSRs cannot be told from that kubelet's own.
//!
//! So autonode remembers which instances each such name was bound to.
//! While another instance held the name within the lifetime a certificate
//! can have (`--signing-duration`), the approver leaves that name's
//! kubelet CSRs pending (`name_reused`), and the join gives the new
//! machine certificates of that full lifetime, which outlast the window:
//! its kubelet works on and its renewals are approved once the window has
//! passed. Resource-based names (`i-0123456789abcdef0.<region>.compute.internal`)
//! are never given to another instance, so they are never in a window:
//! the recommended setting (docs/operations.md).
//!
//! What is remembered: the NodeClaims bound to the name, live and the last
//! ones this replica's watch saw deleted (as of their deletion), and the
//! [`marks::NAME_LAST_HELD`] mark the join writes with a new binding when
//! it knew of an earlier holder, so that the leader judging renewals
//! months later knows it without having seen the earlier NodeClaim.

use crate::kube::binding;
use crate::kube::karpenter::NodeClaim;
use crate::kube::marks;
use crate::kube::nodeclaim::NodeClaims;
use k8s_openapi::jiff::Timestamp;
use std::time::Duration;

/// Whether `name` is one of EC2's IP-based hostnames (`ip-` and the four
/// dashed octets of an IPv4 address, then the domain): a name EC2 gives
/// again once the address is free.
pub fn is_ip_based(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("ip-") else {
        return false;
    };
    let label = rest.split('.').next().unwrap_or_default();
    let octets: Vec<&str> = label.split('-').collect();
    octets.len() == 4 && octets.iter().all(|o| o.parse::<u8>().is_ok())
}

/// The latest time an instance other than `instance_id` held `name`, as
/// this replica knows it: `now` for a live NodeClaim bound to it, the
/// deletion time for a deleted one (`now` when the watch did not show
/// one), and any [`marks::NAME_LAST_HELD`] such a NodeClaim carried (the
/// name may have changed hands more than once). `None` for a name that is
/// not IP-based: no other instance can have held it.
pub fn last_held_by_others(
    claims: &NodeClaims,
    name: &str,
    instance_id: &str,
    now: Timestamp,
) -> Option<Timestamp> {
    if !is_ip_based(name) {
        return None;
    }
    let held_by_another = |claim: &NodeClaim| {
        // A substring test first: most bindings name other nodes, and this
        // runs over every NodeClaim for each join and judgement.
        let mentions = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(marks::BINDING))
            .is_some_and(|b| b.contains(name));
        mentions
            && binding::recorded(claim)
                .ok()
                .flatten()
                .is_some_and(|r| r.node_name == name && r.instance_id != instance_id)
    };
    let live = claims.store().state_filter(held_by_another);
    let gone = claims.gone(held_by_another);
    let live = live.iter().map(|claim| (claim, now));
    let gone = gone.iter().map(|claim| {
        let deleted = claim.metadata.deletion_timestamp.as_ref().map(|t| t.0);
        (claim, deleted.unwrap_or(now).min(now))
    });
    live.chain(gone)
        .flat_map(|(claim, held)| [Some(held), marked(claim)])
        .flatten()
        .max()
}

/// The [`marks::NAME_LAST_HELD`] mark on `claim`, if it has a readable one.
pub fn marked(claim: &NodeClaim) -> Option<Timestamp> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(marks::NAME_LAST_HELD)?
        .parse()
        .ok()
}

/// When certificates issued while the name was held at `last_held` have
/// all expired: `lifetime` (kube-controller-manager's signing duration)
/// later.
pub fn window_end(last_held: Timestamp, lifetime: Duration) -> Timestamp {
    last_held.checked_add(lifetime).unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_based_names_are_told_from_resource_based_ones() {
        for ip in [
            "ip-10-0-0-5.us-west-2.compute.internal",
            "ip-10-0-0-5.ec2.internal",
            "ip-192-168-255-1",
        ] {
            assert!(is_ip_based(ip), "{ip}");
        }
        for other in [
            "i-0123456789abcdef0.us-west-2.compute.internal",
            "i-0123456789abcdef0.ec2.internal",
            "ip-10-0-0.us-west-2.compute.internal",
            "ip-10-0-0-500.us-west-2.compute.internal",
            "ipx-10-0-0-5.ec2.internal",
            "node-1",
        ] {
            assert!(!is_ip_based(other), "{other}");
        }
    }

    #[test]
    fn the_window_ends_a_certificate_lifetime_after_the_name_was_last_held() {
        let held: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let end = window_end(held, Duration::from_secs(3600));
        assert_eq!(end.to_string(), "2026-01-01T01:00:00Z");
        assert_eq!(window_end(held, Duration::MAX), Timestamp::MAX);
    }

    #[test]
    fn a_mark_reads_back_as_a_time() {
        let mut claim = NodeClaim::default();
        assert_eq!(marked(&claim), None);
        claim.metadata.annotations = Some(
            [(
                marks::NAME_LAST_HELD.to_string(),
                "2026-01-01T00:00:00Z".to_string(),
            )]
            .into(),
        );
        assert_eq!(
            marked(&claim).map(|t| t.to_string()).as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
    }
}
