//! autonode's marks on objects it does not own, and who may have made them;
//! and every `autonode.dev/*` name autonode reads or writes, in one place.
//!
//! autonode records facts on Karpenter's NodeClaims as annotations: the
//! one-shot binding, a bootstrap failure, the milestones already reported.
//! Annotations are not autonode's alone to write: Karpenter copies a
//! NodePool's `spec.template.metadata.annotations` onto every NodeClaim it
//! creates, so whoever may edit a NodePool can put any `autonode.dev/*`
//! value on a NodeClaim before autonode ever sees it. A pre-seeded binding
//! would refuse the real machine as a "replay" (or let a chosen key resume);
//! a pre-seeded failure would get a healthy machine marked failed.
//!
//! So a mark counts only when the API server's own record of who wrote it,
//! `metadata.managedFields`, names [`FIELD_MANAGER`] as the field's only
//! manager. Every write of a mark goes through [`patch_params`], so the API
//! server records it under that name; a write by Karpenter (or by anyone
//! else through their own client) is recorded under theirs. What this does
//! not stop: a principal with direct write access to NodeClaims who sends
//! `fieldManager=autonode-server` on purpose. Such a principal can already
//! set `status.providerID` and is trusted like Karpenter (docs/design.md,
//! threat model).
//!
//! [`keep_own`] removes every mark that fails this test from an object's
//! metadata, so the code that reads marks never sees a foreign one.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PatchParams;

/// The field manager under which autonode writes everything it writes.
pub const FIELD_MANAGER: &str = "autonode-server";
/// The field manager that takes over the EC2NodeClass fields autonode owned
/// and no longer keeps (the metadata options when enforcing them is turned
/// off, `amiSelectorTerms` when `--ami-ids` is unset), so they keep their
/// values (see `crate::controllers::nodeclass`).
pub const HANDOVER_MANAGER: &str = "autonode-server-handover";

/// The one-shot binding of an instance to its keys (see `crate::kube::binding`).
pub const BINDING: &str = "autonode.dev/binding";
/// An agent's fatal report, when deleting failed NodeClaims is turned off.
pub const BOOTSTRAP_FAILED: &str = "autonode.dev/bootstrap-failed";
/// Milestones already reported on a NodeClaim (comma-separated).
pub const REPORTED: &str = "autonode.dev/reported";
/// When another instance last held the node name this NodeClaim's binding
/// records (RFC 3339), written with a new binding when the joining replica
/// knew of one (see `crate::kube::reuse`).
pub const NAME_LAST_HELD: &str = "autonode.dev/name-last-held";

/// Every annotation autonode writes on NodeClaims: the only ones it reads
/// back, and only when [`keep_own`] finds them written by autonode.
pub const NODECLAIM_MARKS: [&str; 4] = [BINDING, BOOTSTRAP_FAILED, REPORTED, NAME_LAST_HELD];

/// Labels on the CSR objects the join creates. Anyone who may create a CSR
/// may set them too: they help operators find objects, and decide nothing.
pub const CSR_INSTANCE_LABEL: &str = "autonode.dev/instance-id";
/// See [`CSR_INSTANCE_LABEL`].
pub const CSR_NODECLAIM_LABEL: &str = "autonode.dev/nodeclaim";
/// See [`CSR_INSTANCE_LABEL`].
pub const CSR_MANAGED_LABEL: &str = "autonode.dev/managed";

/// EC2NodeClass annotation naming the ConfigMap or Secret (in the Ignition
/// namespace; see `nodeconfig::Source::parse`) with the class's Ignition
/// config. Set by operators, read by autonode: not a mark.
pub const IGNITION_ANNOTATION: &str = "autonode.dev/ignition";
/// EC2NodeClass annotation choosing the class's userData format (`toml` or
/// `ignition`; `toml` when absent; see `crate::controllers::nodeclass::userdata::Format`). Set by
/// operators, read by autonode: not a mark.
pub const FORMAT_ANNOTATION: &str = "autonode.dev/userdata-format";

/// EC2NodeClass annotation holding the rollout guard's state (see
/// `crate::controllers::nodeclass::rollout`): a mark, written by the upkeep with every apply it
/// changes, and read back only when its seal (an HMAC under a key only the
/// replicas hold, see `crate::controllers::nodeclass::rollout::seal`) opens and [`is_own`] finds
/// autonode its only writer: the manager name alone anyone may send.
pub const ROLLOUT_ANNOTATION: &str = "autonode.dev/rollout";
/// EC2NodeClass annotation asking the upkeep to hold the class's AMI and
/// userData at the values autonode applied last (value `true`).
/// Set by operators, read by autonode: not a mark.
pub const HOLD_ANNOTATION: &str = "autonode.dev/hold";
/// EC2NodeClass annotation asking the upkeep to try values it reverted once
/// more: each new value is one retry. Set by operators, read by autonode.
pub const RETRY_ANNOTATION: &str = "autonode.dev/retry-rollout";

/// The [`REPORTED`] mark on `meta`: the milestones (and checks) already
/// reported, comma-separated; empty when there is none.
pub fn reported(meta: &ObjectMeta) -> &str {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(REPORTED))
        .map(String::as_str)
        .unwrap_or_default()
}

/// The [`REPORTED`] mark `reported` with each of `more` added once, in the
/// order given after those it had.
pub fn with_reported(reported: &str, more: &[&str]) -> String {
    let mut all: Vec<&str> = reported.split(',').filter(|m| !m.is_empty()).collect();
    for name in more {
        if !all.contains(name) {
            all.push(name);
        }
    }
    all.join(",")
}

/// The most bytes of a reason autonode stores: in a mark, and per failure
/// in the rollout state (whose failures are bounded too, so the annotation
/// stays far below the API server's 256 KiB for all annotations).
pub const MAX_NOTE: usize = 256;

/// The most bytes of an agent's report message the server keeps (in the
/// Events and marks it makes of it; the protocol promises the cut).
pub const MAX_MESSAGE: usize = 1024;

/// `text` cut to at most `max` bytes on a char boundary, `…` marking a cut.
pub fn capped(text: &str, max: usize) -> String {
    const MORE: &str = "…";
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub(MORE.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MORE}", &text[..end])
}

/// Patch parameters for every write of a mark: names [`FIELD_MANAGER`].
pub fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

/// Removes from `meta` each of [`NODECLAIM_MARKS`] that autonode did not
/// write, and returns the keys removed. Call it on an object as the API
/// server sent it, before managedFields are dropped: without them no mark
/// can be trusted, so all are removed.
pub fn keep_own(meta: &mut ObjectMeta) -> Vec<&'static str> {
    let Some(annotations) = meta.annotations.as_mut() else {
        return Vec::new();
    };
    let managed = meta.managed_fields.as_deref().unwrap_or_default();
    let mut removed = Vec::new();
    for key in NODECLAIM_MARKS {
        if annotations.contains_key(key) && !written_only_by_us(managed, key) {
            annotations.remove(key);
            removed.push(key);
        }
    }
    removed
}

/// Whether annotation `key` on `meta` was written by [`FIELD_MANAGER`]
/// and nobody else, per managedFields (false without them).
pub fn is_own(meta: &ObjectMeta, key: &str) -> bool {
    written_only_by_us(meta.managed_fields.as_deref().unwrap_or_default(), key)
}

/// Whether `annotation` is owned by [`FIELD_MANAGER`] and nobody else.
fn written_only_by_us(
    managed: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry],
    annotation: &str,
) -> bool {
    let field = format!("f:{annotation}");
    let owners: Vec<&str> = managed
        .iter()
        .filter(|entry| {
            entry
                .fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:metadata"))
                .and_then(|m| m.get("f:annotations"))
                .is_some_and(|a| a.get(&field).is_some())
        })
        .map(|entry| entry.manager.as_deref().unwrap_or_default())
        .collect();
    !owners.is_empty() && owners.iter().all(|m| *m == FIELD_MANAGER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(annotations: serde_json::Value, managed: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(json!({
            "name": "c1",
            "annotations": annotations,
            "managedFields": managed,
        }))
        .unwrap()
    }

    fn entry(manager: &str, key: &str) -> serde_json::Value {
        json!({
            "manager": manager, "operation": "Update", "apiVersion": "karpenter.sh/v1",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {format!("f:{key}"): {}}}},
        })
    }

    #[test]
    fn a_mark_written_by_autonode_is_kept() {
        let mut m = meta(
            json!({BINDING: "x", "other": "y"}),
            json!([entry(FIELD_MANAGER, BINDING)]),
        );
        assert!(keep_own(&mut m).is_empty());
        assert_eq!(m.annotations.unwrap().len(), 2);
    }

    #[test]
    fn a_mark_written_by_another_manager_is_dropped() {
        let mut m = meta(
            json!({BINDING: "x", BOOTSTRAP_FAILED: "y", "other": "z"}),
            json!([
                entry("karpenter", BINDING),
                entry("karpenter", BOOTSTRAP_FAILED)
            ]),
        );
        assert_eq!(keep_own(&mut m), vec![BINDING, BOOTSTRAP_FAILED]);
        let left = m.annotations.unwrap();
        assert_eq!(left.keys().collect::<Vec<_>>(), vec!["other"]);
    }

    #[test]
    fn a_mark_shared_with_another_manager_is_dropped() {
        let mut m = meta(
            json!({REPORTED: "registered"}),
            json!([
                entry(FIELD_MANAGER, REPORTED),
                entry("kubectl-edit", REPORTED)
            ]),
        );
        assert_eq!(keep_own(&mut m), vec![REPORTED]);
    }

    #[test]
    fn reported_names_are_added_once_in_order() {
        assert_eq!(with_reported("", &["attested"]), "attested");
        assert_eq!(
            with_reported("attested", &["attested", "certificates"]),
            "attested,certificates"
        );
        let m = meta(json!({REPORTED: "registered"}), json!(null));
        assert_eq!(reported(&m), "registered");
        assert_eq!(reported(&ObjectMeta::default()), "");
    }

    #[test]
    fn a_capped_note_fits_and_cuts_on_a_char_boundary() {
        assert_eq!(capped("short", 256), "short");
        let long = "é".repeat(300);
        let cut = capped(&long, MAX_NOTE);
        assert!(cut.len() <= MAX_NOTE && cut.ends_with('…'), "{}", cut.len());
        assert!(cut.len() > MAX_NOTE - 5);
    }

    #[test]
    fn without_managed_fields_nothing_is_trusted() {
        let mut m = meta(json!({BINDING: "x"}), json!(null));
        assert_eq!(keep_own(&mut m), vec![BINDING]);
    }
}
