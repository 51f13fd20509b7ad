//! Playing Karpenter's part: NodeClaims, NodePools and EC2NodeClasses as
//! Karpenter v1 writes them.

use anyhow::{Context, Result};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::Client;
use serde_json::{json, Value};

/// `karpenter.sh/v1` NodeClaim.
pub fn nodeclaim_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim"))
}

/// `karpenter.k8s.aws/v1` EC2NodeClass.
pub fn ec2nodeclass_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "karpenter.k8s.aws",
        "v1",
        "EC2NodeClass",
    ))
}

/// The NodeClaim API (cluster-scoped).
pub fn nodeclaims(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &nodeclaim_resource())
}

/// The annotations of NodeClaim `name` as the API server has them now.
pub async fn annotations(
    client: &Client,
    name: &str,
) -> Result<std::collections::BTreeMap<String, String>> {
    let claim = nodeclaims(client).get(name).await?;
    Ok(claim.metadata.annotations.unwrap_or_default())
}

/// The field manager Karpenter's writes are recorded under here.
pub const FIELD_MANAGER: &str = "karpenter";

/// Creates a NodeClaim for `node_class` the way Karpenter does before it
/// launches the instance (no status yet).
pub async fn create_nodeclaim(
    client: &Client,
    name: &str,
    node_class: &str,
) -> Result<DynamicObject> {
    create_nodeclaim_annotated(client, name, node_class, json!({})).await
}

/// Like [`create_nodeclaim`], with `annotations` as Karpenter copies them
/// from the NodePool's `spec.template.metadata.annotations`.
pub async fn create_nodeclaim_annotated(
    client: &Client,
    name: &str,
    node_class: &str,
    annotations: Value,
) -> Result<DynamicObject> {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {
            "name": name,
            "labels": {"karpenter.sh/nodepool": "default"},
            "annotations": annotations,
        },
        "spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": node_class},
            "requirements": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
            ],
        },
    }))?;
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    nodeclaims(client)
        .create(&params, &object)
        .await
        .with_context(|| format!("creating NodeClaim {name}"))
}

/// Sets `status.providerID` through the status subresource, as Karpenter
/// does once the instance is launched.
pub async fn set_provider_id(
    client: &Client,
    name: &str,
    provider_id: &str,
) -> Result<DynamicObject> {
    let patch = json!({"status": {"providerID": provider_id}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    nodeclaims(client)
        .patch_status(name, &params, &Patch::Merge(&patch))
        .await
        .with_context(|| format!("setting providerID of NodeClaim {name}"))
}

/// The EC2NodeClass API (cluster-scoped).
pub fn ec2nodeclasses(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ec2nodeclass_resource())
}

/// Creates an EC2NodeClass as a user would for Karpenter's own AMIs: the
/// required selector terms, a role, `amiFamily: AL2023` and `user_data`.
pub async fn create_ec2nodeclass(
    client: &Client,
    name: &str,
    user_data: &str,
) -> Result<DynamicObject> {
    let spec = json!({
        "amiFamily": "AL2023",
        "amiSelectorTerms": [{"alias": "al2023@latest"}],
        "role": "KarpenterNodeRole-test",
        "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "test"}}],
        "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "test"}}],
        "userData": user_data,
    });
    create_nodeclass(client, name, json!({}), spec).await
}

/// An EC2NodeClass as an operator writes it for autonode: `amiFamily:
/// Custom`, the AMI, `spec.kubelet`, and `render-userdata`'s output.
/// (`default` is the class [`crate::server::world::World::launch`]'s NodeClaims
/// name.)
pub async fn create_custom_nodeclass(
    client: &Client,
    name: &str,
    user_data: &str,
) -> Result<DynamicObject> {
    let mut spec =
        custom_spec(json!({"maxPods": 29, "kubeReserved": {"cpu": "70m", "memory": "442Mi"}}));
    spec["userData"] = user_data.into();
    create_nodeclass(client, name, json!({}), spec).await
}

/// The spec of an `amiFamily: Custom` class with `kubelet` as its
/// `spec.kubelet`: the selector terms and role Karpenter requires.
pub fn custom_spec(kubelet: Value) -> Value {
    json!({
        "amiFamily": "Custom",
        "amiSelectorTerms": [{"id": "ami-0123456789abcdef0"}],
        "role": "KarpenterNodeRole-test",
        "securityGroupSelectorTerms": [{"id": "sg-0123456789abcdef0"}],
        "subnetSelectorTerms": [{"id": "subnet-0123456789abcdef0"}],
        "kubelet": kubelet,
    })
}

/// Creates the EC2NodeClass `name` with `annotations` and `spec`.
pub async fn create_nodeclass(
    client: &Client,
    name: &str,
    annotations: Value,
    spec: Value,
) -> Result<DynamicObject> {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    }))?;
    ec2nodeclasses(client)
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating EC2NodeClass {name}"))
}

/// Grants the guest user `user` `verbs` on EC2NodeClasses, nothing more
/// (a ClusterRole and binding named after the user).
pub async fn grant_on_nodeclasses(admin: &Client, user: &str, verbs: &[&str]) -> Result<()> {
    let name = format!("nodeclass-{user}");
    let manifest = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [{"apiGroups": ["karpenter.k8s.aws"], "resources": ["ec2nodeclasses"],
                   "verbs": verbs}],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    });
    let yaml = format!("{manifest}\n---\n{binding}");
    crate::kube::manifest::apply_manifest(admin, &yaml)
        .await
        .with_context(|| format!("granting {user} {verbs:?} on EC2NodeClasses"))
}
