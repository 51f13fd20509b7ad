//! What autonode parses of a NodeClaim's metadata, and nothing more.
//!
//! Of a NodeClaim the server keeps its identity, its labels, its NodePool
//! owner and autonode's marks ([`super::nodeclaim::strip`]), and it judges
//! each mark by its seal or, for a mark written before seals, by who
//! manages it in managedFields ([`super::marks::keep_own`]). Parsed as
//! k8s-openapi's `ObjectMeta`, every watch event and every write's answer
//! built the whole of managedFields (Karpenter's trees of every label,
//! condition and capacity) and every annotation a NodePool's template
//! copies on, to drop them a moment later: in a profile of a 1,000-join
//! burst, 2.8% of the server's CPU went to building managedFields alone.
//! [`read_meta`] (the `deserialize_with` of
//! [`super::karpenter::NodeClaim`]'s metadata) builds the identity, the
//! labels, the owner references, the marks with their seals, and of
//! managedFields the entries that manage a mark, each with its manager and
//! its tree cut to the marks (`MANAGED_MARKS`): what `keep_own` reads.
//! serde steps over the rest without building it, as
//! [`super::class_meta`] does for EC2NodeClasses.

use crate::kube::cache::Identity;
use crate::kube::class_meta::{read_kept_annotations, Keep};
use crate::kube::marks::NODECLAIM_MARKS;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, ObjectMeta, OwnerReference,
};
use serde::de::{DeserializeSeed, Deserializer};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Each of [`NODECLAIM_MARKS`] as managedFields name it (`f:` and the
/// annotation), kept whole.
const MANAGED_MARKS: Keep = Keep::Keys(&[
    ("f:autonode.dev/binding", Keep::Whole),
    ("f:autonode.dev/bootstrap-failed", Keep::Whole),
    ("f:autonode.dev/failure-reason", Keep::Whole),
    ("f:autonode.dev/reported", Keep::Whole),
    ("f:autonode.dev/name-last-held", Keep::Whole),
]);

/// What of a managedFields tree is kept: who manages each mark.
const KEPT_FIELDS: Keep = Keep::Keys(&[(
    "f:metadata",
    Keep::Keys(&[("f:annotations", MANAGED_MARKS)]),
)]);

/// A NodeClaim's metadata as autonode reads it (see the module).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimMeta {
    #[serde(flatten)]
    identity: Identity,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerReference>>,
    #[serde(default, deserialize_with = "read_marks")]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "read_managers")]
    managed_fields: Option<Vec<ManagedFieldsEntry>>,
}

/// Reads a NodeClaim's `metadata` (a `deserialize_with`): see the module.
pub fn read_meta<'de, D: Deserializer<'de>>(from: D) -> Result<ObjectMeta, D::Error> {
    let meta = Option::<ClaimMeta>::deserialize(from)?.unwrap_or_default();
    Ok(ObjectMeta {
        labels: meta.labels,
        owner_references: meta.owner_references,
        annotations: meta.annotations,
        managed_fields: meta.managed_fields,
        ..meta.identity.into()
    })
}

/// Whether annotation `key` is one of autonode's marks or a mark's seal.
fn is_mark(key: &str) -> bool {
    let mark = key.strip_suffix(SEAL_SUFFIX).unwrap_or(key);
    NODECLAIM_MARKS.contains(&mark)
}

/// What [`crate::kube::marks::seal_key`] adds to a mark's name.
const SEAL_SUFFIX: &str = "-seal";

fn read_marks<'de, D: Deserializer<'de>>(
    from: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    read_kept_annotations(from, is_mark, |_, value| Some(value))
}

/// One managedFields entry: its manager, and its tree cut to the marks.
#[derive(Deserialize)]
struct Entry {
    #[serde(default)]
    manager: Option<String>,
    #[serde(default, rename = "fieldsV1", deserialize_with = "read_kept_fields")]
    fields_v1: Option<Value>,
}

fn read_kept_fields<'de, D: Deserializer<'de>>(from: D) -> Result<Option<Value>, D::Error> {
    KEPT_FIELDS.deserialize(from)
}

/// The entries that manage a mark; the others say nothing of the marks.
fn read_managers<'de, D: Deserializer<'de>>(
    from: D,
) -> Result<Option<Vec<ManagedFieldsEntry>>, D::Error> {
    let entries = Option::<Vec<Entry>>::deserialize(from)?;
    Ok(entries.map(|entries| {
        entries
            .into_iter()
            .filter_map(|entry| {
                Some(ManagedFieldsEntry {
                    manager: entry.manager,
                    fields_v1: Some(FieldsV1(entry.fields_v1?)),
                    ..ManagedFieldsEntry::default()
                })
            })
            .collect()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::karpenter::NodeClaim;
    use crate::kube::marks::{self, seal_key, FIELD_MANAGER};
    use serde_json::json;

    #[test]
    fn the_kept_fields_name_every_mark_and_the_seals_are_recognised() {
        let Keep::Keys(named) = MANAGED_MARKS else {
            panic!("the marks are kept by name");
        };
        let named: Vec<&str> = named.iter().map(|(name, _)| *name).collect();
        let marks: Vec<String> = NODECLAIM_MARKS.iter().map(|m| format!("f:{m}")).collect();
        assert_eq!(named, marks);
        for mark in NODECLAIM_MARKS {
            assert!(is_mark(mark) && is_mark(&seal_key(mark)), "{mark}");
        }
        assert!(!is_mark("autonode.dev/other") && !is_mark("karpenter.sh/x-seal"));
    }

    /// A NodeClaim as Karpenter leaves it, with a NodePool template's
    /// annotations, autonode's binding (sealed or not) and Karpenter's
    /// managedFields.
    fn claim(managers: Value) -> Value {
        json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {
                "name": "c", "uid": "u1", "resourceVersion": "7", "generation": 1,
                "labels": {"karpenter.sh/nodepool": "p"},
                "finalizers": ["karpenter.sh/termination"],
                "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                                     "name": "p", "uid": "pu"}],
                "annotations": {
                    "team": "x".repeat(10_000),
                    marks::BINDING: "{}",
                    seal_key(marks::BINDING): "mac",
                },
                "managedFields": managers,
            },
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                      "name": "default"}},
        })
    }

    #[test]
    fn a_claim_keeps_its_identity_labels_owners_and_marks_only() {
        let managers = json!([
            {"manager": "karpenter", "operation": "Update", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:labels": {"f:karpenter.sh/nodepool": {}},
                                         "f:annotations": {"f:team": {}}},
                          "f:status": {"f:conditions": {}}}},
            {"manager": FIELD_MANAGER, "operation": "Update", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:annotations": {
                 format!("f:{}", marks::BINDING): {},
                 format!("f:{}", seal_key(marks::BINDING)): {}}}}},
        ]);
        let claim: NodeClaim = serde_json::from_value(claim(managers)).unwrap();
        let meta = &claim.metadata;
        assert_eq!(
            (meta.name.as_deref(), meta.uid.as_deref(), meta.generation),
            (Some("c"), Some("u1"), Some(1))
        );
        assert_eq!(meta.resource_version.as_deref(), Some("7"));
        assert!(meta.finalizers.is_none());
        assert_eq!(meta.labels.as_ref().unwrap()["karpenter.sh/nodepool"], "p");
        assert_eq!(meta.owner_references.as_ref().unwrap()[0].kind, "NodePool");
        let annotations: Vec<&String> = meta.annotations.as_ref().unwrap().keys().collect();
        assert_eq!(annotations, [marks::BINDING, &seal_key(marks::BINDING)]);
        let managed = meta.managed_fields.as_ref().unwrap();
        assert_eq!(managed.len(), 1, "karpenter's entry manages no mark");
        assert_eq!(managed[0].manager.as_deref(), Some(FIELD_MANAGER));
        let tree = &managed[0].fields_v1.as_ref().unwrap().0;
        assert_eq!(
            tree,
            &json!({"f:metadata": {"f:annotations": {format!("f:{}", marks::BINDING): {}}}})
        );
        assert!(marks::is_own(meta, marks::BINDING));
    }

    #[test]
    fn a_co_manager_of_a_mark_is_kept_so_the_mark_is_not_autonodes_alone() {
        let owned = json!({"f:metadata": {"f:annotations": {
            format!("f:{}", marks::BINDING): {}}}});
        let managers = json!([
            {"manager": "karpenter", "operation": "Update", "fieldsV1": owned},
            {"manager": FIELD_MANAGER, "operation": "Update", "fieldsV1": owned},
        ]);
        let claim: NodeClaim = serde_json::from_value(claim(managers)).unwrap();
        assert_eq!(claim.metadata.managed_fields.as_ref().unwrap().len(), 2);
        assert!(!marks::is_own(&claim.metadata, marks::BINDING));
    }

    #[test]
    fn metadata_without_annotations_or_managed_fields_reads_as_none() {
        let claim: NodeClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "annotations": null, "managedFields": null},
        }))
        .unwrap();
        assert!(claim.metadata.annotations.is_none() && claim.metadata.managed_fields.is_none());
        let claim: NodeClaim = serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
        assert_eq!(claim.metadata.name.as_deref(), Some("c"));
    }
}
