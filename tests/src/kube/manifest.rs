//! Multi-document YAML manifests: cut into their documents (the one place
//! the harness and the tests do so), put together again, and applied to
//! or deleted from a cluster, each document under the API it belongs to.

use anyhow::{Context, Result};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{pinned_kind, Scope};
use kube::Client;
use serde_json::Value;

/// Every document of a multi-document YAML text, as JSON, empty ones
/// (helm's leading `---`, comment-only sources) left out.
pub fn documents(yaml: &str) -> Result<Vec<Value>> {
    use serde::Deserialize as _;
    let mut docs = Vec::new();
    for document in serde_yaml::Deserializer::from_str(yaml) {
        let value = Value::deserialize(document).context("a YAML document")?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// `docs` as one manifest the cluster takes: JSON is YAML, one document
/// per object.
pub fn join<'a>(docs: impl IntoIterator<Item = &'a Value>) -> String {
    let texts: Vec<String> = docs.into_iter().map(Value::to_string).collect();
    texts.join("\n---\n")
}

/// Server-side applies every document of a YAML manifest.
pub async fn apply_manifest(client: &Client, yaml: &str) -> Result<()> {
    for (api, object, kind) in manifest_objects(client, yaml).await? {
        let name = object.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply("autonode-tests").force(),
            &Patch::Apply(&object),
        )
        .await
        .with_context(|| format!("applying {kind} {name}"))?;
    }
    Ok(())
}

/// Deletes every object of a YAML manifest that exists.
pub async fn delete_manifest(client: &Client, yaml: &str) -> Result<()> {
    for (api, object, kind) in manifest_objects(client, yaml).await? {
        let name = object.metadata.name.clone().unwrap_or_default();
        match api.delete(&name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {kind} {name}")),
        }
    }
    Ok(())
}

/// Each document of a YAML manifest, the API it belongs to, and its kind.
async fn manifest_objects(
    client: &Client,
    yaml: &str,
) -> Result<Vec<(Api<DynamicObject>, DynamicObject, String)>> {
    let mut objects = Vec::new();
    for document in documents(yaml)? {
        let object: DynamicObject = serde_json::from_value(document)?;
        let types = object
            .types
            .clone()
            .context("manifest object without apiVersion/kind")?;
        let gvk = GroupVersionKind::try_from(&types)?;
        let (resource, caps) = pinned_kind(client, &gvk).await?;
        object
            .metadata
            .name
            .as_ref()
            .context("manifest object without a name")?;
        let api: Api<DynamicObject> = match (&caps.scope, &object.metadata.namespace) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        };
        objects.push((api, object, gvk.kind));
    }
    Ok(objects)
}
