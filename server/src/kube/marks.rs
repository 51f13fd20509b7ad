//! autonode's marks on objects it does not own, and who may have made them;
//! and every `autonode.dev/*` name autonode reads or writes, in one place.
//!
//! autonode records facts on Karpenter's NodeClaims as annotations: the
//! one-shot binding, a bootstrap failure, the milestones already reported,
//! when another instance last held a reused node name. Annotations are not
//! autonode's alone to write: Karpenter copies a NodePool's
//! `spec.template.metadata.annotations` onto every NodeClaim it creates, so
//! whoever may edit a NodePool can put any `autonode.dev/*` value on a
//! NodeClaim before autonode ever sees it. A pre-seeded binding would
//! refuse the real machine as a "replay" (or let a chosen key resume); a
//! pre-seeded failure would get a healthy machine marked failed.
//!
//! Nor does managedFields settle it. autonode writes marks with merge
//! patches, and a write of the value already there takes no ownership:
//! a NodePool author who puts in the template the very value autonode
//! will write (`name-last-held` is the earlier holder's deletion time,
//! which anyone who may read NodeClaims can read; `reported` is a list of
//! milestone names) stays the mark's co-owner, and a rule of "autonode
//! its only manager" then drops autonode's own mark: the name-reuse
//! window forgotten after a restart, a failure unseen.
//!
//! So every mark is written with a seal beside it ([`seal_key`]): a MAC,
//! under the replicas' key ([`StateKey`], the rollout guard's), over the
//! NodeClaim's UID, the mark's name and its exact value. No one without
//! the key can make one, and none opens on another NodeClaim (a UID exists
//! only once the NodeClaim does, after its template was copied). A mark
//! counts when its seal opens, whoever else manages the field: nothing can
//! be pre-seeded to erase it, and nothing can be forged, not even by a
//! client sending `fieldManager=autonode-server`.
//!
//! Marks written before seals (by an older autonode-server, or by one
//! still running during a rolling upgrade, which leaves a stale seal
//! behind) count as they did: when managedFields name [`FIELD_MANAGER`]
//! as their only writer. No NodePool author can produce that; a client
//! sending autonode's field manager name on purpose can, and such a
//! principal may write NodeClaims, so is trusted (docs/design.md, threat
//! model). An older server reads the marks as before and ignores the seals.
//!
//! [`keep_own`] removes every mark that fails both tests from an object's
//! metadata, so the code that reads marks never sees a foreign one.

pub use crate::kube::seal::StateKey;
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

/// How the [`BOOTSTRAP_FAILED`] note of a NodeClaim failed because an
/// impostor Node was Registered for it begins (see
/// [`crate::kube::impostor`]). The note is sealed like every mark, so only
/// autonode can have written it.
const IMPOSTOR_NOTE: &str = "impostor: ";

/// The [`BOOTSTRAP_FAILED`] note for a NodeClaim failed because an
/// impostor Node took it (`why`).
pub fn impostor_note(why: &str) -> String {
    format!("{IMPOSTOR_NOTE}{why}")
}

/// Whether autonode failed the NodeClaim with `meta` (as kept by
/// [`keep_own`]) because an impostor Node took it: its machine's failure
/// is someone else's doing, no verdict on what it was launched with.
pub fn failed_for_impostor(meta: &ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(BOOTSTRAP_FAILED))
        .is_some_and(|note| note.starts_with(IMPOSTOR_NOTE))
}

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

/// What a mark's seal is a MAC for (see [`StateKey::mac`]).
const SEAL_PURPOSE: &[u8] = b"autonode.dev/nodeclaim mark v1";

/// The annotation holding the seal of `mark` (one of [`NODECLAIM_MARKS`]):
/// beside the mark, not in it, so an older autonode-server, which reads
/// the mark's value as it always did, still can.
pub fn seal_key(mark: &str) -> String {
    format!("{mark}-seal")
}

/// The seal of `mark` set to `value` on the NodeClaim with `uid`: the
/// mark's name is under the MAC too, so a seal does not open for another
/// mark of the same value.
pub fn seal(key: &StateKey, uid: &str, mark: &str, value: &str) -> String {
    key.mac(SEAL_PURPOSE, uid, &format!("{mark}={value}"))
}

/// Whether `mac` is [`seal`]'s for these; never for an object without a UID.
fn opens(key: &StateKey, uid: &str, mark: &str, value: &str, mac: &str) -> bool {
    !uid.is_empty() && key.opens(SEAL_PURPOSE, uid, &format!("{mark}={value}"), mac)
}

/// `annotations` (marks to write, as a JSON object: a string sets a mark,
/// `null` removes it) with each mark's seal beside it, for the NodeClaim
/// with `uid`. A write of marks goes through here, in the same patch as the
/// marks, so no mark is ever written without its seal.
pub fn with_seals(
    key: &StateKey,
    uid: &str,
    mut annotations: serde_json::Map<String, serde_json::Value>,
) -> serde_json::Map<String, serde_json::Value> {
    let seals: Vec<(String, serde_json::Value)> = annotations
        .iter()
        .filter(|(mark, _)| NODECLAIM_MARKS.contains(&mark.as_str()))
        .map(|(mark, value)| {
            let sealed = value
                .as_str()
                .map(|v| serde_json::Value::from(seal(key, uid, mark, v)));
            (seal_key(mark), sealed.unwrap_or(serde_json::Value::Null))
        })
        .collect();
    annotations.extend(seals);
    annotations
}

/// Patch parameters for every write of a mark: names [`FIELD_MANAGER`].
pub fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

/// Removes from `meta` each of [`NODECLAIM_MARKS`] that autonode did not
/// write, and returns the keys removed: a mark stays when its seal opens
/// under `key` for this object's UID, or (a mark from before seals) when
/// managedFields name autonode its only writer. Call it on an object as
/// the API server sent it, before managedFields are dropped.
pub fn keep_own(meta: &mut ObjectMeta, key: &StateKey) -> Vec<&'static str> {
    let Some(annotations) = meta.annotations.as_ref() else {
        return Vec::new();
    };
    let uid = meta.uid.as_deref().unwrap_or_default();
    let managed = meta.managed_fields.as_deref().unwrap_or_default();
    let removed: Vec<&'static str> = NODECLAIM_MARKS
        .into_iter()
        .filter(|mark| {
            let Some(value) = annotations.get(*mark) else {
                return false;
            };
            let mac = annotations.get(&seal_key(mark));
            let sealed = mac.is_some_and(|mac| opens(key, uid, mark, value, mac));
            !sealed && !written_only_by_us(managed, mark)
        })
        .collect();
    if let Some(annotations) = meta.annotations.as_mut() {
        for mark in &removed {
            annotations.remove(*mark);
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

    fn key() -> StateKey {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, [9; 32]).unwrap();
        StateKey::from_key_file(&path).unwrap()
    }

    fn meta(annotations: serde_json::Value, managed: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(json!({
            "name": "c1", "uid": "u1",
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
        assert!(keep_own(&mut m, &key()).is_empty());
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
        assert_eq!(keep_own(&mut m, &key()), vec![BINDING, BOOTSTRAP_FAILED]);
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
        assert_eq!(keep_own(&mut m, &key()), vec![REPORTED]);
    }

    #[test]
    fn a_sealed_mark_counts_whoever_else_manages_it() {
        // The NodePool author's template put the value first: Karpenter
        // co-owns it, and autonode's write of the same value took nothing.
        let held = "2026-01-01T00:00:00Z";
        let sealed = seal(&key(), "u1", NAME_LAST_HELD, held);
        let mut m = meta(
            json!({NAME_LAST_HELD: held, seal_key(NAME_LAST_HELD): sealed}),
            json!([
                entry("karpenter", NAME_LAST_HELD),
                entry(FIELD_MANAGER, &seal_key(NAME_LAST_HELD))
            ]),
        );
        assert!(keep_own(&mut m, &key()).is_empty());
        assert_eq!(m.annotations.unwrap()[NAME_LAST_HELD], held);
    }

    #[test]
    fn a_seal_opens_only_for_its_claim_mark_value_and_key() {
        let k = key();
        let dir = tempfile::tempdir().unwrap();
        let tls_key = dir.path().join("tls.key");
        std::fs::write(&tls_key, b"another").unwrap();
        let other_key = StateKey::from_tls_key(&tls_key).unwrap();
        let cases = [
            seal(&k, "u2", REPORTED, "attested"),
            seal(&k, "u1", BOOTSTRAP_FAILED, "attested"),
            seal(&k, "u1", REPORTED, "attested,ready"),
            seal(&other_key, "u1", REPORTED, "attested"),
            "forged".to_string(),
        ];
        for mac in cases {
            // Even under autonode's field manager name (anyone may send it),
            // a wrong seal alone is no proof; copied by Karpenter, no mark.
            let mut m = meta(
                json!({REPORTED: "attested", seal_key(REPORTED): mac}),
                json!([entry("karpenter", REPORTED)]),
            );
            assert_eq!(keep_own(&mut m, &k), vec![REPORTED], "{mac}");
        }
        let mut no_uid = meta(
            json!({REPORTED: "attested", seal_key(REPORTED): seal(&k, "", REPORTED, "attested")}),
            json!([entry("karpenter", REPORTED)]),
        );
        no_uid.uid = None;
        assert_eq!(keep_own(&mut no_uid, &k), vec![REPORTED]);
    }

    #[test]
    fn a_mark_from_before_seals_counts_only_as_autonodes_alone() {
        // An older server wrote it (no seal), or changed it (a stale seal).
        let stale = seal(&key(), "u1", REPORTED, "attested");
        let mut m = meta(
            json!({REPORTED: "attested,ready", seal_key(REPORTED): stale}),
            json!([entry(FIELD_MANAGER, REPORTED)]),
        );
        assert!(keep_own(&mut m, &key()).is_empty());
    }

    #[test]
    fn every_mark_written_is_sealed_and_a_removed_one_loses_its_seal() {
        let written = with_seals(
            &key(),
            "u1",
            json!({BINDING: "{}", BOOTSTRAP_FAILED: null, "resourceVersion": "7"})
                .as_object()
                .cloned()
                .unwrap(),
        );
        assert_eq!(
            written[&seal_key(BINDING)],
            seal(&key(), "u1", BINDING, "{}")
        );
        assert_eq!(written[&seal_key(BOOTSTRAP_FAILED)], json!(null));
        assert!(!written.contains_key(&seal_key("resourceVersion")));
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
        assert_eq!(keep_own(&mut m, &key()), vec![BINDING]);
    }
}
