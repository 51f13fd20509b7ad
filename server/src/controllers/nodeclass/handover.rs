//! Letting go of a field autonode no longer keeps: which fields its
//! applies own, which of them the next apply leaves out, and the handover
//! that keeps them at their values instead of removing them.

use super::fields::applied;
use super::{Context, Desired, FIELD_MANAGER};
use crate::controllers::nodeclass::userdata::Format;
use crate::kube::events::Events;
use crate::kube::karpenter::{Ec2NodeClass, Ec2NodeClassSpec};
use crate::kube::reason::Reason;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::PoisonError;

/// A field below `spec`, as its path of keys (`["metadataOptions",
/// "httpTokens"]`).
pub type SpecPath = Vec<String>;

/// The fields below `spec` that `manager`'s applies own, per the class's
/// managedFields: a map's keys one by one, a list or a value whole (sorted;
/// empty: none).
pub fn applied_paths(meta: &ObjectMeta, manager: &str) -> Vec<SpecPath> {
    /// Collects the owned leaves below `node`, a managedFields tree.
    fn leaves(node: &Value, at: &mut SpecPath, out: &mut Vec<SpecPath>) {
        let children: Vec<(&str, &Value)> = node
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(key, child)| Some((key.strip_prefix("f:")?, child)))
            .collect();
        // No field below (a value, or a list whose items are `k:`/`v:`
        // entries): owned whole.
        if children.is_empty() {
            if !at.is_empty() {
                out.push(at.clone());
            }
            return;
        }
        for (key, child) in children {
            at.push(key.to_string());
            leaves(child, at, out);
            at.pop();
        }
    }
    let mut paths = Vec::new();
    let applied = meta.managed_fields.iter().flatten().filter(|entry| {
        entry.manager.as_deref() == Some(manager) && entry.operation.as_deref() == Some("Apply")
    });
    for entry in applied {
        if let Some(spec) = entry.fields_v1.as_ref().and_then(|f| f.0.get("f:spec")) {
            leaves(spec, &mut Vec::new(), &mut paths);
        }
    }
    paths.sort_unstable();
    paths.dedup();
    paths
}

/// The keys of `spec.metadataOptions` that [`FIELD_MANAGER`]'s applies own,
/// per the class's managedFields (sorted; empty: none).
pub fn owned_metadata_options(meta: &ObjectMeta) -> Vec<String> {
    applied_paths(meta, FIELD_MANAGER)
        .into_iter()
        .filter_map(|path| match <[String; 2]>::try_from(path) {
            Ok([options, key]) if options == "metadataOptions" => Some(key),
            _ => None,
        })
        .collect()
}

/// The fields autonode's applies own and its next apply, [`applied`] with
/// `desired`, leaves out: each must be handed over first (sorted; empty:
/// none).
pub fn released(meta: &ObjectMeta, desired: &Desired) -> Vec<SpecPath> {
    // Which fields, not their values: any format will do.
    let next = applied("", desired, Format::default());
    applied_paths(meta, FIELD_MANAGER)
        .into_iter()
        .filter(|path| value_at(&next["spec"], path).is_none())
        .collect()
}

/// The value at `path` below `spec`, if it has one.
fn value_at<'a>(spec: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter()
        .try_fold(spec, |at, key| at.get(key))
        .filter(|value| !value.is_null())
}

/// The apply configuration by which [`HANDOVER_MANAGER`](super::HANDOVER_MANAGER) takes over the
/// `released` fields at their current values, and keeps those it took over
/// before, or `None` when none of them has a value.
///
/// Server-side apply removes a field when the manager that applied it
/// leaves it out of its next apply and no other manager owns it. Once
/// autonode no longer keeps a field (enforcing metadata options turned
/// off, `--ami-ids` unset), its applies leave the field out, so without a
/// handover a field only autonode owned would vanish: the metadata options
/// would become whatever the CRD's defaults are then, behind the class's
/// owner's back on a mere flag change, and `amiSelectorTerms`, which the
/// CRD requires, could not be removed at all, every apply refused. So they
/// are handed over first, unchanged (not forced: if the class changed since
/// it was read, the apply conflicts and the reconcile is retried with the
/// new values), and keep the values they have until someone edits them.
/// The same rule holds for [`HANDOVER_MANAGER`](super::HANDOVER_MANAGER) itself, hence
/// `handed_before` (its own [`applied_paths`]), applied again each time.
pub fn handover(
    name: &str,
    spec: &Ec2NodeClassSpec,
    released: &[SpecPath],
    handed_before: &[SpecPath],
) -> Option<Value> {
    if released.is_empty() {
        return None;
    }
    let current = serde_json::to_value(spec).ok()?;
    let mut kept = json!({});
    for path in released.iter().chain(handed_before) {
        // An empty list is how the typed spec reads an absent one.
        let Some(value) = value_at(&current, path).filter(|v| v.as_array() != Some(&Vec::new()))
        else {
            continue;
        };
        let Some((last, parents)) = path.split_last() else {
            continue;
        };
        let mut at = &mut kept;
        for key in parents {
            at = &mut at[key.as_str()];
        }
        at[last.as_str()] = value.clone();
    }
    (kept.as_object().is_some_and(|k| !k.is_empty())).then(|| {
        json!({
            "apiVersion": "karpenter.k8s.aws/v1",
            "kind": "EC2NodeClass",
            "metadata": { "name": name },
            "spec": kept,
        })
    })
}

impl Context {
    /// Whether `class` is the version a handover of ours wrote, already
    /// superseded by the apply that followed it (forgotten once another
    /// version is seen).
    pub(super) fn superseded(&self, name: &str, class: &Ec2NodeClass) -> bool {
        let mut handed = self
            .handed_over
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let version = class.metadata.resource_version.as_deref();
        if version.is_some() && handed.get(name).map(String::as_str) == version {
            return true;
        }
        handed.remove(name);
        false
    }

    /// Remembers the version a handover wrote; see [`Context::superseded`].
    pub(super) fn handed_over(&self, name: &str, written: &Ec2NodeClass) {
        if let Some(version) = written.metadata.resource_version.clone() {
            self.handed_over
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name.to_string(), version);
        }
    }
}

/// Logs the fields let go of, by top-level field, and records an Event
/// when it is the AMI selection: Karpenter's AMIs are the class owners'
/// from now on.
pub(super) fn report_released(
    class: &Ec2NodeClass,
    name: &str,
    released: &[SpecPath],
    events: &Events,
) {
    let mut by_field: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for path in released {
        if let Some((field, below)) = path.split_first() {
            by_field
                .entry(field.as_str())
                .or_default()
                .extend(below.first().map(String::as_str));
        }
    }
    for (field, keys) in by_field {
        let keys = keys.join(", ");
        tracing::info!(nodeclass = %name, %keys, "EC2NodeClass {field} released at their values");
    }
    if released
        .iter()
        .any(|path| path.first().map(String::as_str) == Some("amiSelectorTerms"))
    {
        tracing::info!(
            nodeclass = %name,
            "autonode-server no longer manages the EC2NodeClass's AMI (--ami-ids is unset): \
             spec.amiSelectorTerms keep their values and are the class owners' to change"
        );
        events.normal(
            class,
            Reason::AmiSelectionReleased,
            "autonode-server no longer manages spec.amiSelectorTerms (--ami-ids is unset); \
             they keep their values and are yours to change"
                .to_string(),
        );
    }
}
