//! Which node labels kubelet may set on its own Node.
//!
//! The NodeRestriction admission plugin refuses a kubelet that registers
//! with labels in the `kubernetes.io` or `k8s.io` namespaces unless they are
//! on a short list; a kubelet started with such a label never registers.
//! NodeClaim labels are filtered through [`kubelet_may_set`] before they
//! become `--node-labels`; Karpenter applies the rest itself after
//! registration.

/// Keys in the restricted namespaces that kubelet may still set.
const ALLOWED_KEYS: [&str; 10] = [
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
];

/// Prefixes in the restricted namespaces that kubelet may still set.
const ALLOWED_NAMESPACES: [&str; 2] = ["kubelet.kubernetes.io", "node.kubernetes.io"];

/// Whether kubelet may register its Node with a label of this key.
pub fn kubelet_may_set(key: &str) -> bool {
    let Some((namespace, _)) = key.split_once('/') else {
        return true; // unprefixed keys are nobody's namespace
    };
    if !is_restricted(namespace) {
        return true;
    }
    if namespace == "node-restriction.kubernetes.io" {
        return false;
    }
    ALLOWED_KEYS.contains(&key)
        || ALLOWED_NAMESPACES
            .iter()
            .any(|ns| namespace == *ns || namespace.ends_with(&format!(".{ns}")))
}

fn is_restricted(namespace: &str) -> bool {
    ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|d| namespace == *d || namespace.ends_with(&format!(".{d}")))
}

#[cfg(test)]
mod tests {
    use super::kubelet_may_set;

    #[test]
    fn karpenter_and_custom_labels_pass() {
        assert!(kubelet_may_set("karpenter.sh/nodepool"));
        assert!(kubelet_may_set("team"));
        assert!(kubelet_may_set("example.com/role"));
    }

    #[test]
    fn the_allowed_kubernetes_labels_pass() {
        assert!(kubelet_may_set("kubernetes.io/arch"));
        assert!(kubelet_may_set("topology.kubernetes.io/zone"));
        assert!(kubelet_may_set("node.kubernetes.io/instance-type"));
        assert!(kubelet_may_set("kubelet.kubernetes.io/anything"));
    }

    #[test]
    fn other_kubernetes_labels_are_dropped() {
        assert!(!kubelet_may_set("node-role.kubernetes.io/worker"));
        assert!(!kubelet_may_set("node-restriction.kubernetes.io/pool"));
        assert!(!kubelet_may_set("kubernetes.io/role"));
        assert!(!kubelet_may_set("example.k8s.io/x"));
        assert!(!kubelet_may_set("k8s.io/x"));
    }
}
