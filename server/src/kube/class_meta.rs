//! What autonode parses of an EC2NodeClass's metadata, and nothing more.
//!
//! Whoever may create an EC2NodeClass decides how large it is: 25,000
//! empty annotation keys make a class of about 660 KB of JSON (each key
//! is listed again in managedFields), several MB once parsed as
//! k8s-openapi's `ObjectMeta`; eight such classes took the leader from 41
//! to 162 MiB, and 24 past its 256 MiB limit. [`read_meta`] (the
//! `deserialize_with` of [`super::karpenter::Ec2NodeClass`]'s metadata)
//! builds the class's identity, the annotations autonode reads (each value
//! bounded, see [`ANNOTATIONS`]), and of managedFields what autonode reads:
//! its own managers' entries with, of their trees, the fields it keeps
//! ([`KEPT_FIELDS`]), and one other manager's entry that owns the rollout
//! annotation, if any (enough for [`super::marks::is_own`]). serde steps
//! over the rest without building it, as [`super::cache::Identity`] does
//! for the objects that need their identity only.

use crate::kube::cache::Identity;
use crate::kube::marks::{
    capped, FIELD_MANAGER, FORMAT_ANNOTATION, HANDOVER_MANAGER, HOLD_ANNOTATION,
    IGNITION_ANNOTATION, RETRY_ANNOTATION, ROLLOUT_ANNOTATION,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, ObjectMeta, Time,
};
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt;

/// The most bytes of a retry value kept as it is (a label value's limit);
/// a longer one is kept as its digest (see [`retry_token`]), and the
/// admission policy refuses one.
pub const MAX_RETRY: usize = 63;
/// The most bytes of the rollout state's annotation kept: far over any
/// state autonode writes (its store's per-class budget, sealed). A longer
/// one is cut, and then does not open: the guard starts afresh.
pub const MAX_ROLLOUT_TEXT: usize = 128 * 1024;
/// The most bytes kept of an annotation that holds a word (a format,
/// `true`) or a reference (a ConfigMap or Secret name): a longer value is
/// cut, and then names nothing (it is told as such).
pub const MAX_WORD: usize = 512;
/// The most bytes of `spec.userData` kept: EC2 takes 16 KiB at most, so a
/// longer one never launched anything; cut, it still differs from the
/// rendered one and is restored.
pub const MAX_USER_DATA: usize = 64 * 1024;

/// The annotations autonode reads of a class, and the most bytes kept of
/// each (the retry value: see [`retry_token`]).
pub const ANNOTATIONS: [(&str, usize); 5] = [
    (ROLLOUT_ANNOTATION, MAX_ROLLOUT_TEXT),
    (HOLD_ANNOTATION, MAX_WORD),
    (RETRY_ANNOTATION, MAX_RETRY),
    (FORMAT_ANNOTATION, MAX_WORD),
    (IGNITION_ANNOTATION, MAX_WORD),
];

/// The most managedFields entries of autonode's managers kept: one per
/// manager, operation and subresource is what the API server keeps.
const OWN_ENTRIES: usize = 8;

/// What of a managedFields tree is kept: every key below, or the keys
/// named, each with what is kept below it.
#[derive(Debug, Clone, Copy)]
pub enum Keep {
    Whole,
    Keys(&'static [(&'static str, Keep)]),
}

/// `f:` + [`ROLLOUT_ANNOTATION`], as managedFields name it.
const OWNED_ROLLOUT: &str = "f:autonode.dev/rollout";

/// The fields autonode reads in managedFields: who owns the rollout
/// annotation, and which of the kept fields autonode's applies own (see
/// `crate::controllers::nodeclass::handover`). These are the only fields
/// its applies have ever written.
pub const KEPT_FIELDS: Keep = Keep::Keys(&[
    (
        "f:metadata",
        Keep::Keys(&[("f:annotations", Keep::Keys(&[(OWNED_ROLLOUT, Keep::Whole)]))]),
    ),
    (
        "f:spec",
        Keep::Keys(&[
            ("f:userData", Keep::Whole),
            ("f:amiFamily", Keep::Whole),
            ("f:amiSelectorTerms", Keep::Whole),
            (
                "f:metadataOptions",
                Keep::Keys(&[
                    ("f:httpEndpoint", Keep::Whole),
                    ("f:httpProtocolIPv6", Keep::Whole),
                    ("f:httpPutResponseHopLimit", Keep::Whole),
                    ("f:httpTokens", Keep::Whole),
                ]),
            ),
        ]),
    ),
]);

/// What a retry value is compared and recorded as: itself when it is at
/// most [`MAX_RETRY`] bytes (or already a digest), else `sha256:` and its
/// SHA-256 in hex. Two values differ exactly when their tokens do (but for
/// a value written as another's digest, which retries nothing unasked).
pub fn retry_token(value: &str) -> String {
    if value.len() <= MAX_RETRY || is_digest(value) {
        return value.to_string();
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, value.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Whether `value` is a [`retry_token`] digest.
fn is_digest(value: &str) -> bool {
    value
        .strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// An EC2NodeClass's metadata as autonode reads it (see the module).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClassMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default, deserialize_with = "read_annotations")]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "read_managed_fields")]
    managed_fields: Option<Vec<ManagedFieldsEntry>>,
}

/// Reads a class's `metadata` (a `deserialize_with`): see the module.
pub fn read_meta<'de, D: Deserializer<'de>>(from: D) -> Result<ObjectMeta, D::Error> {
    let meta = Option::<ClassMeta>::deserialize(from)?.unwrap_or_default();
    let identity = Identity {
        name: meta.name,
        uid: meta.uid,
        resource_version: meta.resource_version,
        generation: meta.generation,
        creation_timestamp: meta.creation_timestamp,
        deletion_timestamp: meta.deletion_timestamp,
        ..Identity::default()
    };
    Ok(ObjectMeta {
        annotations: meta.annotations,
        managed_fields: meta.managed_fields,
        ..identity.into()
    })
}

/// Reads `spec.userData`, cut at [`MAX_USER_DATA`] (a `deserialize_with`).
pub fn read_user_data<'de, D: Deserializer<'de>>(from: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(from)?.map(|text| capped(&text, MAX_USER_DATA)))
}

/// The value of annotation `key` as kept, or `None` when autonode does not
/// read it.
fn kept_annotation(key: &str, value: &str) -> Option<String> {
    let (_, max) = ANNOTATIONS.iter().find(|(name, _)| *name == key)?;
    Some(if key == RETRY_ANNOTATION {
        retry_token(value)
    } else {
        capped(value, *max)
    })
}

fn read_annotations<'de, D: Deserializer<'de>>(
    from: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    let read = |key: &str| ANNOTATIONS.iter().any(|(name, _)| *name == key);
    read_kept_annotations(from, read, |key, value| kept_annotation(key, &value))
}

/// Reads a map of annotations, keeping those whose key `read` names, as
/// `kept` keeps them (`None`: not at all); serde steps over every other
/// value without building it.
pub fn read_kept_annotations<'de, D: Deserializer<'de>>(
    from: D,
    read: fn(&str) -> bool,
    kept: fn(&str, String) -> Option<String>,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Annotations {
        read: fn(&str) -> bool,
        kept: fn(&str, String) -> Option<String>,
    }
    impl<'de> Visitor<'de> for Annotations {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map of annotations")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut annotations = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if (self.read)(&key) {
                    if let Some(value) = (self.kept)(&key, map.next_value()?) {
                        annotations.insert(key, value);
                    }
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(Some(annotations))
        }
    }
    from.deserialize_any(Annotations { read, kept })
}

/// One managedFields entry, its tree cut to [`KEPT_FIELDS`].
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    #[serde(default)]
    manager: Option<String>,
    #[serde(default)]
    operation: Option<String>,
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    time: Option<Time>,
    #[serde(default)]
    fields_type: Option<String>,
    #[serde(default)]
    subresource: Option<String>,
    #[serde(default, rename = "fieldsV1", deserialize_with = "read_kept_fields")]
    fields_v1: Option<Value>,
}

impl Entry {
    fn is_own(&self) -> bool {
        matches!(
            self.manager.as_deref(),
            Some(FIELD_MANAGER | HANDOVER_MANAGER)
        )
    }

    fn owns_rollout(&self) -> bool {
        let owned = self.fields_v1.as_ref().and_then(|f| {
            f.get("f:metadata")
                .and_then(|m| m.get("f:annotations"))
                .and_then(|a| a.get(OWNED_ROLLOUT))
        });
        owned.is_some()
    }

    fn into_entry(self) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: self.manager,
            operation: self.operation,
            api_version: self.api_version,
            time: self.time,
            fields_type: self.fields_type,
            subresource: self.subresource,
            fields_v1: self.fields_v1.map(FieldsV1),
        }
    }
}

fn read_kept_fields<'de, D: Deserializer<'de>>(from: D) -> Result<Option<Value>, D::Error> {
    KEPT_FIELDS.deserialize(from)
}

fn read_managed_fields<'de, D: Deserializer<'de>>(
    from: D,
) -> Result<Option<Vec<ManagedFieldsEntry>>, D::Error> {
    struct Entries;
    impl<'de> Visitor<'de> for Entries {
        type Value = Option<Vec<ManagedFieldsEntry>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of managedFields entries")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let (mut own, mut other) = (Vec::new(), None);
            while let Some(entry) = seq.next_element::<Entry>()? {
                if entry.is_own() && own.len() < OWN_ENTRIES {
                    own.push(entry.into_entry());
                } else if !entry.is_own() && other.is_none() && entry.owns_rollout() {
                    other = Some(entry.into_entry());
                }
            }
            own.extend(other);
            Ok(Some(own))
        }
    }
    from.deserialize_any(Entries)
}

impl<'de> DeserializeSeed<'de> for Keep {
    /// The tree as kept; `None` when nothing of it is.
    type Value = Option<Value>;

    fn deserialize<D: Deserializer<'de>>(self, from: D) -> Result<Option<Value>, D::Error> {
        match self {
            Keep::Whole => Value::deserialize(from).map(Some),
            Keep::Keys(keys) => from.deserialize_any(Pruning(keys)),
        }
    }
}

/// Reads a managedFields tree keeping the keys named (see [`Keep`]), and
/// stepping over everything else.
struct Pruning(&'static [(&'static str, Keep)]);

impl<'de> Visitor<'de> for Pruning {
    type Value = Option<Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a managedFields tree")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match self.0.iter().find(|(name, _)| *name == key) {
                Some((_, below)) => {
                    if let Some(value) = map.next_value_seed(*below)? {
                        kept.insert(key, value);
                    }
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((!kept.is_empty()).then_some(Value::Object(kept)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::karpenter::Ec2NodeClass;
    use serde_json::json;

    #[test]
    fn owned_rollout_names_the_annotation() {
        assert_eq!(OWNED_ROLLOUT, format!("f:{ROLLOUT_ANNOTATION}"));
    }

    /// A class with 2,000 foreign annotations (listed again in two
    /// managers' trees), and autonode's own.
    fn fat_class() -> Value {
        let mut annotations: Map<String, Value> =
            (0..2000).map(|i| (format!("k{i:05}"), json!(""))).collect();
        let owned: Map<String, Value> = annotations
            .keys()
            .map(|k| (format!("f:{k}"), json!({})))
            .collect();
        annotations.insert(RETRY_ANNOTATION.into(), json!("r".repeat(100_000)));
        annotations.insert(HOLD_ANNOTATION.into(), json!("true"));
        annotations.insert(ROLLOUT_ANNOTATION.into(), json!("{\"state\":\"x\"}"));
        let mut eve_tree = owned.clone();
        eve_tree.insert(OWNED_ROLLOUT.into(), json!({}));
        json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
            "metadata": {
                "name": "fat", "uid": "u1", "resourceVersion": "7", "generation": 2,
                "labels": {"a": "b"}, "finalizers": ["x"],
                "annotations": annotations,
                "managedFields": [
                    {"manager": "eve", "operation": "Apply", "time": "2025-01-01T00:00:00Z",
                     "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:annotations": eve_tree, "f:labels": {"f:a": {}}},
                                  "f:spec": {"f:tags": {"f:x": {}}, "f:userData": {}}}},
                    {"manager": "mallory", "operation": "Update",
                     "fieldsV1": {"f:metadata": {"f:annotations": owned}}},
                    {"manager": FIELD_MANAGER, "operation": "Apply", "time": "2025-01-02T00:00:00Z",
                     "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:annotations": {OWNED_ROLLOUT: {}, "f:k00001": {}}},
                                  "f:spec": {"f:userData": {}, "f:tags": {"f:y": {}},
                                             "f:metadataOptions": {"f:httpTokens": {}}}}},
                ],
            },
            "spec": {"userData": "u".repeat(MAX_USER_DATA + 10), "amiFamily": "Custom",
                     "tags": {"x": "y"}},
        })
    }

    #[test]
    fn a_fat_class_keeps_what_autonode_reads_only() {
        let class: Ec2NodeClass = serde_json::from_value(fat_class()).unwrap();
        let meta = &class.metadata;
        assert_eq!(meta.name.as_deref(), Some("fat"));
        assert_eq!(meta.uid.as_deref(), Some("u1"));
        assert_eq!(meta.generation, Some(2));
        assert!(meta.labels.is_none() && meta.finalizers.is_none());
        let annotations = meta.annotations.clone().unwrap();
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            [HOLD_ANNOTATION, RETRY_ANNOTATION, ROLLOUT_ANNOTATION]
        );
        assert_eq!(
            annotations[RETRY_ANNOTATION],
            retry_token(&"r".repeat(100_000))
        );
        assert!(is_digest(&annotations[RETRY_ANNOTATION]));
        let managed = meta.managed_fields.clone().unwrap();
        // Autonode's entry, then eve's (she owns the rollout annotation);
        // mallory's owns nothing autonode reads.
        let managers: Vec<_> = managed.iter().filter_map(|e| e.manager.clone()).collect();
        assert_eq!(managers, [FIELD_MANAGER, "eve"]);
        assert_eq!(
            managed[0].fields_v1.as_ref().unwrap().0,
            json!({"f:metadata": {"f:annotations": {OWNED_ROLLOUT: {}}},
                   "f:spec": {"f:userData": {}, "f:metadataOptions": {"f:httpTokens": {}}}})
        );
        assert_eq!(
            managed[1].fields_v1.as_ref().unwrap().0,
            json!({"f:metadata": {"f:annotations": {OWNED_ROLLOUT: {}}}, "f:spec": {"f:userData": {}}})
        );
        assert!(managed[0].time.is_some());
        assert!(!crate::kube::marks::is_own(meta, ROLLOUT_ANNOTATION));
        assert!(class.spec.user_data.unwrap().len() <= MAX_USER_DATA);
    }

    #[test]
    fn a_retry_value_is_itself_when_short_and_a_digest_when_long() {
        assert_eq!(retry_token("2"), "2");
        let long = "x".repeat(MAX_RETRY + 1);
        let token = retry_token(&long);
        assert!(is_digest(&token), "{token}");
        // A token reads as itself: a state recorded with one compares equal.
        assert_eq!(retry_token(&token), token);
        assert_ne!(retry_token(&"y".repeat(MAX_RETRY + 1)), token);
    }

    #[test]
    fn absent_and_null_metadata_parts_read_as_none() {
        let class: Ec2NodeClass = serde_json::from_value(json!({
            "metadata": {"name": "a", "annotations": null, "managedFields": null},
        }))
        .unwrap();
        assert!(class.metadata.annotations.is_none());
        assert!(class.metadata.managed_fields.is_none());
    }
}
