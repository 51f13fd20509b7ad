//! What each node is told: kubelet settings and its Ignition config.
//!
//! Rendered on every join from the NodeClaim and the server's settings.
//! Deterministic: the same inputs give byte-identical output (maps are
//! ordered, nothing reads a clock or a random source).

use crate::karpenter::{NodeClaim, Taint, UNREGISTERED_TAINT};
use autonode_shared::labels::kubelet_may_set;
use autonode_shared::protocol::KubeletSettings;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Cluster-wide settings that go into every node's config.
#[derive(Debug, Clone, Default)]
pub struct ClusterSettings {
    /// IPs of the cluster DNS service, for `clusterDNS`.
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

/// The kubelet settings for this node.
pub fn kubelet(cluster: &ClusterSettings, node: &NodeFacts<'_>) -> KubeletSettings {
    KubeletSettings {
        config: kubelet_configuration(cluster),
        provider_id: node.provider_id.to_string(),
        node_ip: node.node_ip.clone(),
        register_with_taints: registration_taints(node.claim),
        node_labels: node_labels(node.claim),
    }
}

/// The node's Ignition config: nothing beyond what autonode itself writes,
/// until an operator's base config is merged in.
pub fn ignition() -> Value {
    json!({ "ignition": { "version": "3.4.0" } })
}

/// A KubeletConfiguration with certificate rotation and graceful shutdown
/// on, and authentication through the API server only.
fn kubelet_configuration(cluster: &ClusterSettings) -> Value {
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": { "enabled": false },
            "webhook": { "enabled": true },
            "x509": { "clientCAFile": "/etc/kubernetes/pki/ca.crt" },
        },
        "authorization": { "mode": "Webhook" },
        "cgroupDriver": "systemd",
        "clusterDNS": cluster.cluster_dns,
        "clusterDomain": cluster.cluster_domain,
        "rotateCertificates": true,
        "serverTLSBootstrap": true,
        "shutdownGracePeriod": "45s",
        "shutdownGracePeriodCriticalPods": "15s",
    })
}

/// `karpenter.sh/unregistered:NoExecute` always, then the NodeClaim's taints
/// and startup taints, without duplicates.
pub fn registration_taints(claim: &NodeClaim) -> Vec<String> {
    let unregistered = Taint {
        key: UNREGISTERED_TAINT.into(),
        value: None,
        effect: "NoExecute".into(),
    };
    let mut out: Vec<String> = Vec::new();
    let all = std::iter::once(&unregistered)
        .chain(&claim.spec.taints)
        .chain(&claim.spec.startup_taints);
    for taint in all {
        let text = match &taint.value {
            Some(value) if !value.is_empty() => format!("{}={}:{}", taint.key, value, taint.effect),
            _ => format!("{}:{}", taint.key, taint.effect),
        };
        if !out.contains(&text) {
            out.push(text);
        }
    }
    out
}

/// The NodeClaim's labels that kubelet may set on itself.
pub fn node_labels(claim: &NodeClaim) -> BTreeMap<String, String> {
    claim
        .labels()
        .into_iter()
        .filter(|(key, _)| kubelet_may_set(key))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> NodeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "labels": {
                "karpenter.sh/nodepool": "default",
                "node-role.kubernetes.io/worker": "",
                "topology.kubernetes.io/zone": "us-west-2a",
            }},
            "spec": {
                "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
                "startupTaints": [{"key": "cilium.io/agent-not-ready", "effect": "NoExecute"},
                                  {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn taints_start_with_unregistered_and_have_no_duplicates() {
        assert_eq!(
            registration_taints(&claim()),
            [
                "karpenter.sh/unregistered:NoExecute",
                "dedicated=gpu:NoSchedule",
                "cilium.io/agent-not-ready:NoExecute",
            ]
        );
    }

    #[test]
    fn labels_kubelet_may_not_set_are_dropped() {
        let labels = node_labels(&claim());
        assert_eq!(
            labels.keys().collect::<Vec<_>>(),
            ["karpenter.sh/nodepool", "topology.kubernetes.io/zone"]
        );
    }

    #[test]
    fn rendering_is_deterministic() {
        let cluster = ClusterSettings {
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
        };
        let claim = claim();
        let facts = NodeFacts {
            claim: &claim,
            provider_id: "aws:///us-west-2a/i-1",
            node_ip: "10.0.0.1".into(),
        };
        let a = serde_json::to_vec(&kubelet(&cluster, &facts)).unwrap();
        let b = serde_json::to_vec(&kubelet(&cluster, &facts)).unwrap();
        assert_eq!(a, b);
    }
}
