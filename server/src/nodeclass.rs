//! EC2NodeClass upkeep: keeps the fields that make Karpenter's instances
//! join through autonode equal to what this server renders.
//!
//! For every EC2NodeClass (or those matching a label selector) three fields
//! are autonode's: `spec.userData` (the agent's config, see
//! [`crate::userdata`]), `spec.amiFamily` (`Custom`, so Karpenter passes
//! userData verbatim) and, when AMI ids are configured,
//! `spec.amiSelectorTerms` (`[{id: …}]`, one per architecture). When one of
//! them differs, by a user's edit or because the class is new, the
//! controller restores all three with server-side apply as field manager
//! [`FIELD_MANAGER`], forced, so it owns exactly those fields and nothing
//! else, and records a Normal Event on the class.
//!
//! It writes only when a value differs. Karpenter hashes userData and the
//! AMI selection: a needless write is harmless to Karpenter only because it
//! is byte-identical, and it still costs an API write and a watch event for
//! every replica and every Karpenter, every resync. So the controller
//! compares first, and counts its writes in `autonode_nodeclass_writes_total`.

use crate::events::Events;
use crate::karpenter::{Ec2NodeClass, Ec2NodeClassSpec};
use crate::metrics::Metrics;
use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// The server-side apply field manager that owns the kept fields.
pub const FIELD_MANAGER: &str = "autonode-server";
/// The `amiFamily` under which Karpenter passes userData verbatim.
pub const AMI_FAMILY: &str = "Custom";
/// The Event reason when fields were restored.
pub const RESTORED: &str = "NodeClassRestored";

/// The values of the kept fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// The rendered userData.
    pub user_data: String,
    /// `amiSelectorTerms`, or `None` to leave them to the user.
    pub ami_terms: Option<Vec<Value>>,
}

/// What the controller keeps, and how.
#[derive(Clone)]
pub struct Settings {
    pub desired: Desired,
    /// Label selector limiting which classes are kept; all when `None`.
    pub selector: Option<String>,
    /// How often each class is compared again without a watch event.
    pub resync: Duration,
    pub metrics: Metrics,
    pub events: Events,
}

/// Why a reconcile failed (it is retried).
#[derive(Debug, Error)]
pub enum Error {
    #[error("applying EC2NodeClass {name}: {source}")]
    Apply {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Why `--ami-ids` is unusable.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AmiIdsError {
    #[error("AMI id entry {0:?}: expected <arch>=ami-<hex>, e.g. amd64=ami-0123456789abcdef0")]
    Entry(String),
    #[error("architecture {0:?} is given more than once")]
    Duplicate(String),
}

/// `amiSelectorTerms` from `arch=ami-…` entries: one `{id}` term per
/// architecture, ordered by architecture so equal settings give equal terms;
/// `None` when there are no entries.
pub fn ami_selector_terms(entries: &[String]) -> Result<Option<Vec<Value>>, AmiIdsError> {
    let mut by_arch = BTreeMap::new();
    for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let bad = || AmiIdsError::Entry(entry.to_string());
        let (arch, id) = entry.split_once('=').ok_or_else(bad)?;
        let hex = id.strip_prefix("ami-").ok_or_else(bad)?;
        if arch.is_empty() || hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        if by_arch.insert(arch.to_string(), id.to_string()).is_some() {
            return Err(AmiIdsError::Duplicate(arch.to_string()));
        }
    }
    Ok((!by_arch.is_empty()).then(|| {
        by_arch
            .into_values()
            .map(|id| json!({ "id": id }))
            .collect()
    }))
}

/// Which kept fields of `spec` differ from the settings (empty: none).
pub fn drift(spec: &Ec2NodeClassSpec, desired: &Desired) -> Vec<&'static str> {
    let mut fields = Vec::new();
    if spec.user_data.as_deref() != Some(desired.user_data.as_str()) {
        fields.push("spec.userData");
    }
    if spec.ami_family.as_deref() != Some(AMI_FAMILY) {
        fields.push("spec.amiFamily");
    }
    if let Some(terms) = &desired.ami_terms {
        if &spec.ami_selector_terms != terms {
            fields.push("spec.amiSelectorTerms");
        }
    }
    fields
}

/// The apply configuration: always every kept field, because server-side
/// apply removes a field its manager applied before and now leaves out.
pub fn applied(name: &str, desired: &Desired) -> Value {
    let mut spec = json!({ "userData": desired.user_data, "amiFamily": AMI_FAMILY });
    if let Some(terms) = &desired.ami_terms {
        spec["amiSelectorTerms"] = Value::Array(terms.clone());
    }
    json!({
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": { "name": name },
        "spec": spec,
    })
}

/// What each reconcile sees.
struct Context {
    api: Api<Ec2NodeClass>,
    settings: Settings,
}

/// Runs the controller until its stream ends. The caller decides where it
/// runs (on the leader only, when there are replicas).
pub async fn run(client: Client, settings: Settings) {
    let api: Api<Ec2NodeClass> = Api::all(client);
    let config = match &settings.selector {
        Some(selector) => watcher::Config::default().labels(selector),
        None => watcher::Config::default(),
    };
    let ctx = Arc::new(Context {
        api: api.clone(),
        settings,
    });
    Controller::new(api, config)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            if let Err(error) = result {
                tracing::debug!(%error, "EC2NodeClass controller");
            }
            futures::future::ready(())
        })
        .await;
}

async fn reconcile(class: Arc<Ec2NodeClass>, ctx: Arc<Context>) -> Result<Action, Error> {
    let settings = &ctx.settings;
    settings.metrics.nodeclass_checks.inc();
    let name = class.name_any();
    let fields = drift(&class.spec, &settings.desired);
    if fields.is_empty() {
        tracing::debug!(nodeclass = %name, "EC2NodeClass as rendered");
        return Ok(Action::requeue(settings.resync));
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let restored = ctx
        .api
        .patch(
            &name,
            &params,
            &Patch::Apply(applied(&name, &settings.desired)),
        )
        .await
        .map_err(|source| Error::Apply {
            name: name.clone(),
            source,
        })?;
    settings.metrics.nodeclass_writes.inc();
    let fields = fields.join(", ");
    tracing::info!(nodeclass = %name, %fields, "EC2NodeClass restored");
    settings.events.normal(
        &restored,
        RESTORED,
        format!("autonode-server restored {fields} to the rendered values"),
    );
    Ok(Action::requeue(settings.resync))
}

fn error_policy(_class: Arc<Ec2NodeClass>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "EC2NodeClass reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desired(ami_terms: Option<Vec<Value>>) -> Desired {
        Desired {
            user_data: "server-url = \"https://a\"\n".into(),
            ami_terms,
        }
    }

    #[test]
    fn only_differing_fields_are_drift() {
        let terms = vec![json!({"id": "ami-0123"})];
        let kept: Ec2NodeClassSpec = serde_json::from_value(json!({
            "amiFamily": "Custom", "userData": desired(None).user_data,
            "amiSelectorTerms": terms, "role": "KarpenterNodeRole",
        }))
        .unwrap();
        assert!(drift(&kept, &desired(Some(terms.clone()))).is_empty());
        assert!(drift(&kept, &desired(None)).is_empty(), "terms left alone");
        let mut edited = kept.clone();
        edited.ami_family = Some("AL2023".into());
        edited.ami_selector_terms = vec![json!({"alias": "al2023@latest"})];
        assert_eq!(
            drift(&edited, &desired(Some(terms))),
            ["spec.amiFamily", "spec.amiSelectorTerms"]
        );
        edited.user_data = None;
        assert_eq!(
            drift(&edited, &desired(None)),
            ["spec.userData", "spec.amiFamily"]
        );
    }

    #[test]
    fn the_apply_names_every_kept_field_and_nothing_else() {
        let with_terms = applied("default", &desired(Some(vec![json!({"id": "ami-1"})])));
        let spec = with_terms["spec"].as_object().unwrap();
        let mut keys: Vec<&str> = spec.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["amiFamily", "amiSelectorTerms", "userData"]);
        assert_eq!(with_terms["metadata"], json!({"name": "default"}));
        let without = applied("default", &desired(None));
        assert!(without["spec"].get("amiSelectorTerms").is_none());
    }

    #[test]
    fn ami_ids_become_sorted_id_terms() {
        let entries = ["arm64=ami-0456".to_string(), " amd64=ami-0123 ".to_string()];
        assert_eq!(
            ami_selector_terms(&entries).unwrap(),
            Some(vec![json!({"id": "ami-0123"}), json!({"id": "ami-0456"})])
        );
        assert_eq!(ami_selector_terms(&[]).unwrap(), None);
        assert_eq!(ami_selector_terms(&[String::new()]).unwrap(), None);
        for bad in [
            "ami-0123",
            "amd64=0123",
            "=ami-01",
            "amd64=ami-xyz",
            "amd64=ami-",
        ] {
            assert!(ami_selector_terms(&[bad.into()]).is_err(), "{bad}");
        }
        let twice = ["amd64=ami-01".to_string(), "amd64=ami-02".to_string()];
        assert_eq!(
            ami_selector_terms(&twice),
            Err(AmiIdsError::Duplicate("amd64".into()))
        );
    }
}
