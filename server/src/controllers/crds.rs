//! `--install-crds`: installs or updates Karpenter's CRDs in the guest
//! cluster at start, for clusters where nothing else ships them.
//!
//! The CRDs are the ones the project is tested with
//! (`shared/data/karpenter-crds`, embedded byte for byte). They go in with
//! server-side apply as field manager [`FIELD_MANAGER`], forced, so a
//! newer server version's CRDs replace an older one's fields.
//!
//! API servers that predate `x-kubernetes-validations` (CEL; 1.20 in the
//! tests) refuse to build a server-side apply patch with a field their
//! schema lacks ("field not declared in schema", a 500, which kube-client
//! logs as an error), while a plain create or update of the same object
//! simply drops the unknown field. On that refusal the CRD is
//! created, or replaced at its current resourceVersion, instead; those
//! servers then serve the CRDs without the CEL rules, as they would anyway.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::Value;
use std::time::{Duration, Instant};
use thiserror::Error;

/// The field manager of the CRDs autonode installs (see [`crate::kube::marks`]).
pub use crate::kube::marks::FIELD_MANAGER;

pub use autonode_shared::karpenter_crds::CRDS;

/// How long a CRD may take to become Established.
pub const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(60);

/// How often [`wait_established`] looks: a CRD is usually Established
/// within a second of its creation.
const POLL: Duration = Duration::from_millis(200);

/// Why the CRDs could not be installed.
#[derive(Debug, Error)]
pub enum CrdError {
    #[error("embedded {file}: {message}")]
    Embedded { file: &'static str, message: String },
    #[error("installing CRD {name}: {source}")]
    Kube {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("CRD {name} not Established after {timeout:?}")]
    NotEstablished { name: String, timeout: Duration },
}

/// Installs or updates every CRD and waits until each is Established.
pub async fn install(client: &Client) -> Result<(), CrdError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (file, yaml) in CRDS {
        let (name, object) = parse(file, yaml)?;
        apply(&api, &name, &object)
            .await
            .map_err(|source| CrdError::Kube {
                name: name.clone(),
                source,
            })?;
        wait_established(&api, &name, ESTABLISH_TIMEOUT).await?;
        tracing::info!(crd = %name, "Karpenter CRD installed");
    }
    Ok(())
}

/// The CRD's name and the whole document as JSON (unknown fields kept, so
/// a server that knows them gets them).
pub fn parse(file: &'static str, yaml: &str) -> Result<(String, Value), CrdError> {
    let embedded = |message: String| CrdError::Embedded { file, message };
    let object: Value = serde_yaml::from_str(yaml).map_err(|e| embedded(e.to_string()))?;
    let name = object["metadata"]["name"]
        .as_str()
        .ok_or_else(|| embedded("no metadata.name".into()))?
        .to_string();
    Ok((name, object))
}

async fn apply(
    api: &Api<CustomResourceDefinition>,
    name: &str,
    object: &Value,
) -> Result<(), kube::Error> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match api.patch(name, &params, &Patch::Apply(object)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status))
            if status.message.contains("field not declared in schema") =>
        {
            tracing::info!(crd = %name, "server-side apply refused unknown fields; creating or replacing instead");
            create_or_replace(api, name, object).await
        }
        Err(e) => Err(e),
    }
}

async fn create_or_replace(
    api: &Api<CustomResourceDefinition>,
    name: &str,
    object: &Value,
) -> Result<(), kube::Error> {
    let mut crd: CustomResourceDefinition =
        serde_json::from_value(object.clone()).map_err(kube::Error::SerdeError)?;
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.get_opt(name).await? {
        None => api.create(&params, &crd).await.map(|_| ()),
        Some(current) => {
            crd.metadata.resource_version = current.metadata.resource_version;
            api.replace(name, &params, &crd).await.map(|_| ())
        }
    }
}

/// Polls the CRD until its `Established` condition is `True`, for at most
/// `timeout`: only then are its objects served. A get per poll, not a watch,
/// because the guest RBAC grants no list or watch on CRDs (see
/// packaging/guest/rbac-install-crds.yaml); the test harness waits the same
/// way for the CRDs it installs.
pub async fn wait_established(
    api: &Api<CustomResourceDefinition>,
    name: &str,
    timeout: Duration,
) -> Result<(), CrdError> {
    let deadline = Instant::now() + timeout;
    loop {
        let crd = api.get(name).await.map_err(|source| CrdError::Kube {
            name: name.to_string(),
            source,
        })?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(CrdError::NotEstablished {
                name: name.to_string(),
                timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_crd_parses_with_its_name() {
        let names: Vec<String> = CRDS
            .iter()
            .map(|(file, yaml)| parse(file, yaml).unwrap().0)
            .collect();
        assert_eq!(
            names,
            [
                "nodeclaims.karpenter.sh",
                "nodepools.karpenter.sh",
                "ec2nodeclasses.karpenter.k8s.aws"
            ]
        );
        for (file, yaml) in CRDS {
            let (_, object) = parse(file, yaml).unwrap();
            let typed: CustomResourceDefinition = serde_json::from_value(object).unwrap();
            assert_eq!(typed.spec.scope, "Cluster", "{file}");
        }
    }
}
