//! The kubelet settings a node is told: its KubeletConfiguration (the
//! EC2NodeClass's `spec.kubelet`, field for field), registration taints and
//! the NodeClaim's labels kubelet may set on itself.

use super::{ClusterSettings, NodeFacts};
use crate::kube::karpenter::{KubeletSpec, NodeClaim, Taint, UNREGISTERED_TAINT};
use autonode_shared::labels::kubelet_may_set;
use autonode_shared::protocol::KubeletSettings;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// Where the agent writes kubelet's config (the shared contract's path);
/// the generated Ignition layer writes the same file, so an operator's
/// entry at this path visibly loses in the rendered config.
pub const KUBELET_CONFIG_PATH: &str = autonode_shared::contract::kubelet::CONFIG;

/// The kubelet settings for this node; `class` is its EC2NodeClass's
/// `spec.kubelet`, if any.
pub fn kubelet(
    cluster: &ClusterSettings,
    class: Option<&KubeletSpec>,
    node: &NodeFacts<'_>,
) -> KubeletSettings {
    KubeletSettings {
        config: kubelet_configuration(cluster, class.unwrap_or(&KubeletSpec::default())),
        provider_id: node.provider_id.to_string(),
        node_ip: node.node_ip.clone(),
        register_with_taints: registration_taints(node.claim),
        node_labels: node_labels(node.claim),
    }
}

/// A KubeletConfiguration: authentication through the API server only,
/// certificate rotation and graceful shutdown on, then the class's
/// settings.
fn kubelet_configuration(cluster: &ClusterSettings, class: &KubeletSpec) -> Value {
    let mut config = Map::new();
    let mut set = |key: &str, value: Value| {
        config.insert(key.to_string(), value);
    };
    set("apiVersion", json!("kubelet.config.k8s.io/v1beta1"));
    set("kind", json!("KubeletConfiguration"));
    set(
        "authentication",
        json!({
            "anonymous": { "enabled": false },
            "webhook": { "enabled": true },
            "x509": { "clientCAFile": autonode_shared::contract::kubelet::CLUSTER_CA },
        }),
    );
    set("authorization", json!({ "mode": "Webhook" }));
    set("cgroupDriver", json!("systemd"));
    set("clusterDomain", json!(cluster.cluster_domain));
    // Client certificates renew themselves; serving certificates come from
    // CSRs the approver judges.
    set("rotateCertificates", json!(true));
    set("serverTLSBootstrap", json!(true));
    // Karpenter drains before terminating, but a spot interruption or a
    // manual stop must still give pods time to exit.
    set("shutdownGracePeriod", json!("45s"));
    set("shutdownGracePeriodCriticalPods", json!("15s"));
    set(
        "clusterDNS",
        json!(class.cluster_dns.as_ref().unwrap_or(&cluster.cluster_dns)),
    );
    for (key, value) in class_settings(class) {
        set(key, value);
    }
    Value::Object(config)
}

/// `EC2NodeClass.spec.kubelet`'s settings under their KubeletConfiguration
/// names (`clusterDNS` is handled with the server's default). Unset fields
/// are left out, so kubelet's defaults apply.
fn class_settings(class: &KubeletSpec) -> Vec<(&'static str, Value)> {
    let fields = [
        ("maxPods", class.max_pods.map(Value::from)),
        ("podsPerCore", class.pods_per_core.map(Value::from)),
        ("systemReserved", class.system_reserved.as_ref().map(map)),
        ("kubeReserved", class.kube_reserved.as_ref().map(map)),
        ("evictionHard", class.eviction_hard.as_ref().map(map)),
        ("evictionSoft", class.eviction_soft.as_ref().map(map)),
        (
            "evictionSoftGracePeriod",
            class.eviction_soft_grace_period.as_ref().map(map),
        ),
        (
            "evictionMaxPodGracePeriod",
            class.eviction_max_pod_grace_period.map(Value::from),
        ),
        (
            "imageGCHighThresholdPercent",
            class.image_gc_high_threshold_percent.map(Value::from),
        ),
        (
            "imageGCLowThresholdPercent",
            class.image_gc_low_threshold_percent.map(Value::from),
        ),
        ("cpuCFSQuota", class.cpu_cfs_quota.map(Value::from)),
    ];
    fields
        .into_iter()
        .filter_map(|(key, value)| Some((key, value?)))
        .collect()
}

fn map(entries: &BTreeMap<String, String>) -> Value {
    Value::Object(
        entries
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect(),
    )
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
