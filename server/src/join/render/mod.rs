//! What each node is told: kubelet settings and its Ignition config.
//!
//! Pure: inputs in, JSON out. [`crate::join::render::inputs`] finds the inputs (the
//! NodeClaim, its EC2NodeClass, the operator's Ignition configs) and calls
//! this. Deterministic: the same inputs give byte-identical output (maps are
//! ordered, entries are sorted, nothing reads a clock or a random source).
//!
//! **Kubelet.** A `kubelet.config.k8s.io/v1beta1` KubeletConfiguration with
//! `EC2NodeClass.spec.kubelet` mapped field for field (the names are the
//! same in both), so the node's allocatable is what Karpenter bin-packed
//! with. Where the class is silent the server's flags (`clusterDNS`) or
//! kubelet's own defaults apply; nothing is invented. In particular an unset
//! `maxPods` stays unset (kubelet: 110) although Karpenter v1, for
//! `amiFamily: Custom`, then assumes the instance type's ENI-limited pod
//! count: classes should set `maxPods` (and `kubeReserved`, for which
//! Karpenter likewise assumes a pods- and CPU-based default).
//!
//! **Ignition.** Three layers, merged in order: the operator's base config
//! for the cluster < the EC2NodeClass's config < what autonode generates
//! (kubelet's config file). An entry at the same path (files, directories
//! and links share one namespace, as on disk), or a unit, user or group of
//! the same name, in a later layer replaces the earlier entry whole;
//! nothing is merged field by field. The result's version is the newest of
//! the layers'. Each layer, and the result, is checked by
//! [`autonode_shared::ignition::parse`], the agent's own check: a config a
//! node would refuse is refused here, at render time, and never served.
//!
//! The parts: `kubelet` (the KubeletConfiguration, taints and labels),
//! `ignition` (checking the operator's layers and merging them under the
//! generated one), `memo` (what was checked and rendered, kept per version
//! of the objects it came from, so a join does not check it all again) and
//! `error` (why an operator's config cannot be used).

mod error;
mod ignition;
pub mod inputs;
mod kubelet;
mod memo;
pub mod unset;

#[cfg(test)]
mod tests;

pub use error::IgnitionError;
pub use ignition::{ignition, parse_layer};
pub use kubelet::{kubelet, node_labels, registration_taints, KUBELET_CONFIG_PATH};
pub use memo::Memo;

use crate::kube::karpenter::NodeClaim;

/// Cluster-wide settings that go into every node's config.
#[derive(Debug, Clone, Default)]
pub struct ClusterSettings {
    /// IPs of the cluster DNS service, for `clusterDNS`, unless the
    /// EC2NodeClass sets its own.
    pub cluster_dns: Vec<String>,
    /// The cluster's DNS domain.
    pub cluster_domain: String,
}

/// The facts about one node that its config depends on.
pub struct NodeFacts<'a> {
    pub claim: &'a NodeClaim,
    pub provider_id: &'a str,
    pub node_ip: String,
}
