//! The operator's Ignition configs in the guest cluster, where the server
//! reads them: ConfigMaps and Secrets in its Ignition namespace, under the
//! key `config.ign`.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::fmt::Debug;

/// The server's default `--ignition-namespace`.
pub const NAMESPACE: &str = "autonode-system";

/// Creates or replaces the ConfigMap `name` holding `config`.
pub async fn put_configmap(client: &Client, name: &str, config: &str) -> Result<()> {
    put::<ConfigMap>(client, name, json!({"data": {"config.ign": config}})).await
}

/// Creates or replaces the Secret `name` holding `config`.
pub async fn put_secret(client: &Client, name: &str, config: &str) -> Result<()> {
    put::<Secret>(client, name, json!({"stringData": {"config.ign": config}})).await
}

/// Server-side applies `content` (the object's data fields) as `name`.
async fn put<K>(client: &Client, name: &str, content: Value) -> Result<()>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), NAMESPACE);
    let mut object = json!({"apiVersion": "v1", "kind": K::kind(&()),
                            "metadata": {"name": name, "namespace": NAMESPACE}});
    if let (Some(object), Value::Object(content)) = (object.as_object_mut(), content) {
        object.extend(content);
    }
    api.patch(
        name,
        &PatchParams::apply("autonode-tests"),
        &Patch::Apply(&object),
    )
    .await
    .with_context(|| format!("applying Ignition {} {NAMESPACE}/{name}", K::kind(&())))?;
    Ok(())
}
