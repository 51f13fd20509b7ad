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
//! What is remembered: the NodeClaims bound to the name while they live;
//! once they are gone, each IP-based name's latest holders as of their
//! deletion ([`History`], for a certificate's lifetime: by time, not by
//! how many other NodeClaims went since); and the
//! [`marks::NAME_LAST_HELD`] mark the join writes with a new binding when
//! it knew of an earlier holder, so that the leader judging renewals
//! months later knows it without having seen the earlier NodeClaim.

use crate::kube::binding;
use crate::kube::karpenter::NodeClaim;
use crate::kube::marks;
use crate::primitives::bounded::Bounded;
use k8s_openapi::jiff::Timestamp;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The most node names [`History`] remembers. Only a bound NodeClaim
/// (an attested join of a running EC2 instance) with an IP-based name is
/// remembered, one entry per name however often it changes hands, so the
/// entries are at most the VPC's addresses that ever held a node: churning
/// NodeClaims that never bound adds none. 65,536 is a /16, the largest
/// CIDR block a VPC has; an entry is a few hundred bytes (under 20 MiB in all).
pub const MAX_NAMES: usize = 65_536;

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
/// not IP-based: no other instance can have held it. `live` and `gone`
/// are the NodeClaim cache's NodeClaims bound to `name` and its history
/// ([`NodeClaims`](crate::kube::nodeclaim::NodeClaims)`::bound_to`,
/// `::history`).
pub fn last_held_by_others(
    (live, gone): (Vec<Arc<NodeClaim>>, &History),
    name: &str,
    instance_id: &str,
    now: Timestamp,
) -> Option<Timestamp> {
    if !is_ip_based(name) {
        return None;
    }
    let another = |claim: &NodeClaim| {
        binding::recorded(claim)
            .ok()
            .flatten()
            .is_some_and(|r| r.instance_id != instance_id)
    };
    // The store first, then the history: a NodeClaim the store no longer
    // holds was recorded there before it was dropped.
    let live = live
        .iter()
        .filter(|claim| another(claim))
        .flat_map(|claim| [Some(now), marked(claim)])
        .flatten();
    let gone = gone.latest_other(name, instance_id);
    live.chain(gone).max()
}

/// Who held each IP-based node name, of the bound NodeClaims this
/// replica's watch saw go: per name its two latest holders, each as of its
/// NodeClaim's deletion (or the mark it carried, when later). Kept for a
/// certificate's lifetime (`--signing-duration`) after last use, whatever
/// else is deleted meanwhile; at most [`MAX_NAMES`] names, the least
/// recently used forgotten first when full (see [`Bounded`]).
#[derive(Clone)]
pub struct History {
    names: Arc<Mutex<Bounded<String, Holders>>>,
}

/// A name's two latest holders: enough to say when the name was last held
/// by an instance other than any one given.
#[derive(Debug, Default)]
struct Holders([Option<(String, Timestamp)>; 2]);

impl Holders {
    /// `instance` held the name until `held`.
    fn add(&mut self, instance: &str, held: Timestamp) {
        let [first, second] = &mut self.0;
        let mut all: Vec<(String, Timestamp)> = [first.take(), second.take()]
            .into_iter()
            .flatten()
            .filter(|(i, t)| i != instance || *t > held)
            .collect();
        if all.iter().all(|(i, _)| i != instance) {
            all.push((instance.to_string(), held));
        }
        all.sort_by_key(|(_, t)| std::cmp::Reverse(*t));
        let mut latest = all.into_iter();
        self.0 = [latest.next(), latest.next()];
    }

    /// When an instance other than `instance` last held the name.
    fn latest_other(&self, instance: &str) -> Option<Timestamp> {
        self.0
            .iter()
            .flatten()
            .filter(|(i, _)| i != instance)
            .map(|(_, t)| *t)
            .max()
    }
}

impl History {
    /// Empty; each name is kept for `lifetime` (the signer's) after its
    /// last use.
    pub fn new(lifetime: Duration) -> Self {
        Self {
            names: Arc::new(Mutex::new(Bounded::new(lifetime, MAX_NAMES))),
        }
    }

    /// Records `claim`, which the watch saw go at `now` (`at` on the
    /// monotonic clock), if it was bound under an IP-based name (its
    /// marks judged: see [`crate::kube::nodeclaim::strip`]).
    pub fn record(&self, claim: &NodeClaim, now: Timestamp, at: Instant) {
        let Some(record) = binding::recorded(claim).ok().flatten() else {
            return;
        };
        if !is_ip_based(&record.node_name) {
            return;
        }
        let deleted = claim.metadata.deletion_timestamp.as_ref().map(|t| t.0);
        let held = deleted.unwrap_or(now).min(now);
        // The name may have changed hands more than once.
        let held = marked(claim).map_or(held, |earlier| earlier.max(held));
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        names
            .get_or_insert_with(record.node_name, at, Holders::default)
            .add(&record.instance_id, held);
    }

    /// When an instance other than `instance_id` last held `name`, of
    /// those recorded.
    pub fn latest_other(&self, name: &str, instance_id: &str) -> Option<Timestamp> {
        self.latest_other_at(name, instance_id, Instant::now())
    }

    fn latest_other_at(&self, name: &str, instance_id: &str, at: Instant) -> Option<Timestamp> {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        names
            .get_mut(&name.to_string(), at)?
            .latest_other(instance_id)
    }
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

    const NAME: &str = "ip-10-0-0-5.us-west-2.compute.internal";

    /// A NodeClaim bound to `instance` under `node`, deleted at `deleted`.
    fn bound(instance: &str, node: &str, deleted: &str) -> NodeClaim {
        let record = serde_json::json!({
            "instanceId": instance, "region": "us-west-2", "nodeName": node,
            "clientKey": "c", "servingKey": "s", "csrs": [],
        });
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": format!("claim-{instance}"),
                "deletionTimestamp": deleted,
                "annotations": {marks::BINDING: record.to_string()},
            },
            "spec": {},
        }))
        .unwrap()
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn names(history: &History) -> usize {
        history.names.lock().unwrap().len()
    }

    #[test]
    fn a_gone_holder_is_remembered_for_the_lifetime_whatever_else_goes() {
        const LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
        let history = History::new(LIFETIME);
        let (now, t0) = (at("2026-01-01T00:00:10Z"), Instant::now());
        history.record(&bound("i-x", NAME, "2026-01-01T00:00:00Z"), now, t0);
        // Far more than the 1,024 gone NodeClaims the cache keeps: unbound
        // ones, and bound ones under names EC2 never gives again.
        for n in 0..5000 {
            let mut unbound = bound(&format!("i-{n}"), NAME, "2026-01-01T00:00:05Z");
            unbound.metadata.annotations = None;
            history.record(&unbound, now, t0);
            let name = format!("i-{n}.us-west-2.compute.internal");
            history.record(
                &bound(&format!("i-{n}"), &name, "2026-01-01T00:00:05Z"),
                now,
                t0,
            );
        }
        assert_eq!(
            names(&history),
            1,
            "only IP-based names of bound NodeClaims"
        );
        let later = t0 + LIFETIME - Duration::from_secs(1);
        let held = history.latest_other_at(NAME, "i-y", later);
        assert_eq!(held, Some(at("2026-01-01T00:00:00Z")));
        assert_eq!(history.latest_other_at(NAME, "i-x", later), None);
        // Forgotten once a lifetime has passed unused.
        let past = later + LIFETIME + Duration::from_secs(2);
        assert_eq!(history.latest_other_at(NAME, "i-y", past), None);
    }

    #[test]
    fn a_name_keeps_its_two_latest_holders() {
        let mut holders = Holders::default();
        holders.add("i-a", at("2026-01-01T00:00:01Z"));
        holders.add("i-b", at("2026-01-01T00:00:03Z"));
        holders.add("i-c", at("2026-01-01T00:00:02Z"));
        holders.add("i-b", at("2026-01-01T00:00:00Z"));
        assert_eq!(
            holders.latest_other("i-b"),
            Some(at("2026-01-01T00:00:02Z"))
        );
        assert_eq!(
            holders.latest_other("i-c"),
            Some(at("2026-01-01T00:00:03Z"))
        );
        assert_eq!(
            holders.latest_other("i-z"),
            Some(at("2026-01-01T00:00:03Z"))
        );
    }

    #[test]
    fn a_gone_holder_counts_as_of_its_deletion_or_its_own_mark() {
        let history = History::new(Duration::from_secs(3600));
        let (now, t0) = (at("2026-01-01T00:01:00Z"), Instant::now());
        let mut w = bound("i-w", NAME, "2026-01-01T00:00:30Z");
        let annotations = w.metadata.annotations.get_or_insert_default();
        annotations.insert(marks::NAME_LAST_HELD.into(), "2026-01-01T00:00:50Z".into());
        history.record(&w, now, t0);
        let held = history.latest_other_at(NAME, "i-y", t0);
        assert_eq!(held, Some(at("2026-01-01T00:00:50Z")));
        // A deletion time ahead of the watch's clock counts as seen.
        history.record(&bound("i-v", NAME, "2030-01-01T00:00:00Z"), now, t0);
        assert_eq!(history.latest_other_at(NAME, "i-y", t0), Some(now));
    }

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
