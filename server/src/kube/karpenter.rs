//! Karpenter's v1 objects, as far as autonode reads them.
//!
//! Only the fields autonode needs are typed; serde ignores the rest. These
//! types are for reading: autonode writes to Karpenter's objects only with
//! patches that name the fields it owns (an annotation, its own condition),
//! never by sending a whole object back, so unknown fields are never lost.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Karpenter's condition type set once the Node has registered.
pub const REGISTERED: &str = "Registered";
/// The taint every node registers with until Karpenter takes it off.
pub const UNREGISTERED_TAINT: &str = "karpenter.sh/unregistered";

/// `karpenter.sh/v1` NodeClaim.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct NodeClaim {
    /// What autonode reads of it (see [`super::claim_meta`]).
    #[serde(deserialize_with = "super::claim_meta::read_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: NodeClaimSpec,
    #[serde(default)]
    pub status: Option<NodeClaimStatus>,
}

/// The parts of a NodeClaim's spec that shape the node.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimSpec {
    #[serde(default)]
    pub taints: Vec<Taint>,
    #[serde(default)]
    pub startup_taints: Vec<Taint>,
    #[serde(default)]
    pub node_class_ref: Option<NodeClassRef>,
}

/// A taint as Karpenter writes it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Taint {
    pub key: String,
    #[serde(default)]
    pub value: Option<String>,
    pub effect: String,
}

/// Which EC2NodeClass a NodeClaim was launched from.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct NodeClassRef {
    pub group: String,
    pub kind: String,
    pub name: String,
}

/// The parts of a NodeClaim's status autonode reads.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimStatus {
    #[serde(rename = "providerID", default)]
    pub provider_id: Option<String>,
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(rename = "imageID", default)]
    pub image_id: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// What Karpenter bin-packed the node with (quantities by resource),
    /// for the capacity check (`crate::controllers::capacity`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: BTreeMap<String, String>,
}

/// A status condition (metav1.Condition's shape).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl NodeClaim {
    /// `status.providerID`, if Karpenter has set it.
    pub fn provider_id(&self) -> Option<&str> {
        self.status.as_ref()?.provider_id.as_deref()
    }

    /// Whether Karpenter has marked it Registered (its Node exists).
    pub fn is_registered(&self) -> bool {
        self.condition(REGISTERED)
            .is_some_and(|c| c.status == "True")
    }

    /// Whether it is being deleted.
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// The condition of this type, if present.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
    }

    /// Labels (empty when none).
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.metadata.labels.clone().unwrap_or_default()
    }
}

cluster_resource!(NodeClaim, "NodeClaim", "karpenter.sh", "v1", "nodeclaims");

/// `karpenter.k8s.aws/v1` EC2NodeClass, as far as autonode reads it.
/// Whoever may create one makes it as large as they like: its metadata
/// is parsed as [`crate::kube::class_meta`] says, and nothing else
/// autonode does not read is built.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct Ec2NodeClass {
    #[serde(default, deserialize_with = "crate::kube::class_meta::read_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Ec2NodeClassSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Ec2NodeClassStatus>,
}

/// The parts of an EC2NodeClass's status autonode reads: its conditions
/// (Karpenter's, and autonode's [`crate::kube::condition::ROLLOUT`]).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct Ec2NodeClassStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The parts of an EC2NodeClass autonode reads or keeps.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Ec2NodeClassSpec {
    #[serde(default)]
    pub ami_family: Option<String>,
    #[serde(default)]
    pub ami_selector_terms: Vec<serde_json::Value>,
    /// Cut at [`crate::kube::class_meta::MAX_USER_DATA`].
    #[serde(default, deserialize_with = "crate::kube::class_meta::read_user_data")]
    pub user_data: Option<String>,
    /// Kubelet settings Karpenter bin-packs with; the node must match them.
    #[serde(default)]
    pub kubelet: Option<KubeletSpec>,
    /// How the instances' metadata service (IMDS) is exposed; autonode
    /// keeps the parts its security model rests on.
    #[serde(default)]
    pub metadata_options: Option<MetadataOptions>,
}

/// `EC2NodeClass.spec.metadataOptions`. Every key is optional here: the
/// API server fills in Karpenter's defaults, but a reader must not assume
/// it did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MetadataOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_endpoint: Option<String>,
    #[serde(
        rename = "httpProtocolIPv6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub http_protocol_ipv6: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_put_response_hop_limit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_tokens: Option<String>,
}

/// `EC2NodeClass.spec.kubelet`, field for field.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletSpec {
    #[serde(
        rename = "clusterDNS",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_dns: Option<Vec<String>>,
    #[serde(
        rename = "cpuCFSQuota",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_cfs_quota: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_hard: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_max_pod_grace_period: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_soft: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    #[serde(
        rename = "imageGCHighThresholdPercent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub image_gc_high_threshold_percent: Option<i32>,
    #[serde(
        rename = "imageGCLowThresholdPercent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub image_gc_low_threshold_percent: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_reserved: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pods: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_per_core: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_reserved: Option<BTreeMap<String, String>>,
}

cluster_resource!(
    Ec2NodeClass,
    "EC2NodeClass",
    "karpenter.k8s.aws",
    "v1",
    "ec2nodeclasses"
);

/// How Karpenter and kubelet name an EC2 instance; the agent names itself
/// with the same code.
pub use autonode_shared::contract::{aws_provider_id, parse_aws_provider_id};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_karpenter_status_and_ignores_the_rest() {
        let claim: NodeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "default-abc"},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                     "requirements": [], "taints": [{"key": "a", "effect": "NoSchedule"}]},
            "status": {"providerID": "aws:///us-west-2a/i-1", "imageID": "ami-1",
                       "conditions": [{"type": "Registered", "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z", "reason": "Registered", "message": ""}]}
        }))
        .unwrap();
        assert_eq!(claim.provider_id(), Some("aws:///us-west-2a/i-1"));
        assert!(claim.is_registered());
        assert!(!claim.is_deleting());
        assert_eq!(claim.spec.taints.len(), 1);
    }
}
