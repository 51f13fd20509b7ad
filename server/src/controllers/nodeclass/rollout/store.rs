//! Where the rollout guard keeps its state: the ConfigMap [`STORE_NAME`] in
//! the leader namespace (`--leader-namespace`, where the leader Lease is),
//! one `data` key per class name. Not on the class: whoever may edit an
//! EC2NodeClass could delete the annotation (or the seal key could change
//! with `--tls-key`), and a guard that starts afresh forgets what it
//! refused. Whoever may write ConfigMaps in that namespace is trusted
//! already (they write the Ignition ConfigMaps, root on every node), so
//! the store carries no seal, and a new key loses nothing.
//!
//! This module is the ConfigMap's only writer, and only the leader runs
//! it: writes carry the resourceVersion read (a 409 reads again), and a
//! copy is kept in memory while leading, read once and again only after a
//! conflict. Each entry names the class's UID: a class deleted and made
//! again under its name starts afresh, and entries of classes gone are
//! dropped on the next write. A server whose guest RBAC predates the store
//! (403) is told so once and keeps the state on the class alone
//! ([`Lookup::Unavailable`]), asking again every [`RETRY_FORBIDDEN`].

use super::State;
use crate::kube::marks::FIELD_MANAGER;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The ConfigMap's name, in the leader namespace.
pub const STORE_NAME: &str = "autonode-rollout";
/// The most bytes of `data` the store grows to: under the 1 MiB an object
/// may hold, with room for its metadata (and a trial's start, filled in
/// after the size was checked). A server before per-class budgets refuses
/// past it too, so it stays: a store this server writes never stops an
/// older replica during a rolling upgrade.
pub const MAX_BYTES: usize = 900 * 1024;
/// The most bytes one class's entry (its name and text) may hold: its
/// budget. Whoever may edit a class (or launch NodeClaims from it) can
/// grow its state only within it, so one class's growth blocks only its
/// own record. What autonode records is bounded: values it rendered, a
/// retry value or its digest, at most [`super::MAX_TRACKED`] NodeClaims
/// with notes cut at [`crate::kube::marks::MAX_NOTE`].
pub const ENTRY_BUDGET: usize = 16 * 1024;
/// How many classes' entries the store holds: each takes a budget's room
/// (an older server's larger entry, as many as it spans), so a class that
/// has an entry can always grow within its budget. A class past them is
/// not recorded until one frees (a class deleted); see
/// `crate::controllers::nodeclass` for what it still gets.
pub const SLOTS: usize = MAX_BYTES / ENTRY_BUDGET;
/// How long a server refused the store (403) keeps to the annotation
/// before asking again: RBAC applied later is picked up without a restart,
/// and a refused server does not ask on every reconcile.
pub const RETRY_FORBIDDEN: Duration = Duration::from_secs(300);
/// How many times a write re-reads after a conflict before giving up (the
/// reconcile is then retried).
const ATTEMPTS: usize = 3;
/// How many digests of the class's sealed copies an entry remembers (see
/// [`Entry::seen`]): a few more than the copies one rollout writes.
pub const SEEN: usize = 8;

/// One class's entry: its UID, the guard's state, and the sealed copies
/// of it already seen on the class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub uid: String,
    pub state: State,
    /// The [`copy_digest`]s of the last [`SEEN`] copies of the state found
    /// on the class when this entry was recorded: autonode's own copies
    /// and those it took over. A copy among them is never taken over (an
    /// old copy put back on the class is a replay); one that is not may be
    /// a state a server before the store sealed since (a downgrade's
    /// leader: see [`super::newer_copy`]). Servers before it ignore it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seen: Vec<String>,
}

/// The digest by which an entry remembers a copy: the SHA-256 (base64) of
/// the annotation's text, seal and all.
pub fn copy_digest(text: &str) -> String {
    use base64::Engine;
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// What the store holds for a class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The entry recorded for this class (this UID).
    Found(Box<Entry>),
    /// Nothing for this class: the guard reads the class's annotation
    /// (a state a server before the store wrote carries over).
    Absent,
    /// The store may not be read or written (RBAC without it): the guard
    /// keeps its state on the class alone.
    Unavailable,
}

/// What became of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Written, at this time by the API server's clock (Unix seconds).
    Written { at: Option<i64> },
    /// Refused (403): from now on the store is [`Lookup::Unavailable`]
    /// for [`RETRY_FORBIDDEN`].
    Refused,
}

/// Why the store was not read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("reading ConfigMap {STORE_NAME}: {0}")]
    Read(#[source] kube::Error),
    #[error("writing ConfigMap {STORE_NAME}: {0}")]
    Write(#[source] kube::Error),
    #[error("ConfigMap {STORE_NAME} changed {ATTEMPTS} times while it was written")]
    Conflicts,
    #[error(
        "ConfigMap {STORE_NAME} holds the rollout state of {SLOTS} classes (each may take up to \
         {ENTRY_BUDGET} bytes of its {MAX_BYTES}), and this class has none there yet: its state \
         is not recorded until another class is deleted; meanwhile only what is safe without a \
         record is applied (the rendered values to a class with no last good values, a revert \
         to recorded good values), and new AMI/userData are not"
    )]
    Full { entries: usize },
    #[error(
        "this class's rollout state would take {bytes} bytes of ConfigMap {STORE_NAME}, over the \
         {ENTRY_BUDGET} each class may take: it is not recorded; only what is safe without a \
         record is applied (a revert to recorded good values), and new AMI/userData are not"
    )]
    OverBudget { bytes: usize },
    #[error("encoding a rollout state: {0}")]
    Encode(#[from] serde_json::Error),
}

/// The store's text as last read or written, and its resourceVersion
/// (`None`: the ConfigMap does not exist yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub version: Option<String>,
    pub data: BTreeMap<String, String>,
}

/// The store of one leadership term.
pub struct Store {
    api: Api<ConfigMap>,
    copy: tokio::sync::Mutex<Option<Snapshot>>,
    /// When the store was last refused (403).
    forbidden: std::sync::Mutex<Option<Instant>>,
    /// Whether the refusal was logged (once per process).
    warned: AtomicBool,
}

/// The entry of class `name` with `uid` in `data`: `None` when there is
/// none, it is another (earlier) class's of that name, or it does not
/// parse (logged: then the class's annotation is read instead).
pub fn decode(data: &BTreeMap<String, String>, name: &str, uid: &str) -> Option<Entry> {
    let text = data.get(name)?;
    match serde_json::from_str::<Entry>(text) {
        Ok(entry) if entry.uid == uid => Some(entry),
        Ok(_) => None,
        Err(error) => {
            tracing::warn!(nodeclass = %name, %error, configmap = STORE_NAME, "rollout state in the store does not parse; ignored");
            None
        }
    }
}

/// `data` with class `name`'s entry set to `state`, the class's `copy`
/// (its annotation's text, when it has one) added to what the entry has
/// seen, and the entries of classes that are not `live` (by name and UID)
/// dropped: refused when the entry is over its [`ENTRY_BUDGET`], or the
/// other classes' take every one of the [`SLOTS`].
pub fn next_data(
    data: &BTreeMap<String, String>,
    name: &str,
    uid: &str,
    (state, copy): (&State, Option<&str>),
    live: &(dyn Fn(&str, &str) -> bool + Sync),
) -> Result<BTreeMap<String, String>, StoreError> {
    let mut next: BTreeMap<String, String> = data
        .iter()
        .filter(|(key, text)| *key == name || entry_live(key, text, live))
        .map(|(key, text)| (key.clone(), text.clone()))
        .collect();
    let mut seen = decode(data, name, uid).map(|e| e.seen).unwrap_or_default();
    if let Some(digest) = copy.map(copy_digest).filter(|d| !seen.contains(d)) {
        seen.push(digest);
    }
    let extra = seen.len().saturating_sub(SEEN);
    seen.drain(..extra);
    let entry = Entry {
        uid: uid.to_string(),
        state: state.clone(),
        seen,
    };
    let text = serde_json::to_string(&entry)?;
    let bytes = name.len() + text.len();
    if bytes > ENTRY_BUDGET {
        return Err(StoreError::OverBudget { bytes });
    }
    let others: usize = next
        .iter()
        .filter(|(key, _)| *key != name)
        .map(|(key, text)| slots(key.len() + text.len()))
        .sum();
    if others + 1 > SLOTS {
        return Err(StoreError::Full {
            entries: next.len(),
        });
    }
    next.insert(name.to_string(), text);
    Ok(next)
}

/// The slots an entry of `bytes` takes: one, or as many budgets as an
/// older server's larger entry spans.
fn slots(bytes: usize) -> usize {
    bytes.div_ceil(ENTRY_BUDGET).max(1)
}

impl StoreError {
    /// Whether the state was refused for room (the class's own budget, or
    /// every slot taken): told, not retried at once.
    pub fn is_full(&self) -> bool {
        matches!(self, Self::Full { .. } | Self::OverBudget { .. })
    }
}

/// Whether the entry `text` under `key` is of a class that still exists.
/// One that does not parse is kept: it is no one's to drop.
fn entry_live(key: &str, text: &str, live: &dyn Fn(&str, &str) -> bool) -> bool {
    serde_json::from_str::<Entry>(text).map_or(true, |entry| live(key, &entry.uid))
}

/// Whether `error` is the API server's refusal (RBAC).
fn forbidden(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 403)
}

fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// When autonode-server last wrote `map`, by the API server's clock.
fn written_at(map: &ConfigMap) -> Option<i64> {
    map.metadata
        .managed_fields
        .as_deref()?
        .iter()
        .find(|e| e.manager.as_deref() == Some(FIELD_MANAGER))?
        .time
        .as_ref()
        .map(|t| t.0.as_second())
}

impl Snapshot {
    fn of(map: ConfigMap) -> Self {
        Self {
            version: map.metadata.resource_version,
            data: map.data.unwrap_or_default(),
        }
    }
}

impl Store {
    /// The store in `namespace` (the leader namespace).
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            copy: tokio::sync::Mutex::new(None),
            forbidden: std::sync::Mutex::new(None),
            warned: AtomicBool::new(false),
        }
    }

    /// What the store holds for class `name` with `uid`.
    pub async fn lookup(&self, name: &str, uid: &str) -> Result<Lookup, StoreError> {
        if self.refused() {
            return Ok(Lookup::Unavailable);
        }
        let mut copy = self.copy.lock().await;
        if copy.is_none() {
            match self.fetch().await {
                Ok(snapshot) => *copy = Some(snapshot),
                Err(StoreError::Read(e)) if forbidden(&e) => {
                    self.refuse(&e);
                    return Ok(Lookup::Unavailable);
                }
                Err(error) => return Err(error),
            }
        }
        let data = copy.as_ref().map(|s| &s.data);
        Ok(match data.and_then(|d| decode(d, name, uid)) {
            Some(entry) => Lookup::Found(Box::new(entry)),
            None => Lookup::Absent,
        })
    }

    /// Whether class `name`'s entry set to `state` would fit (its budget,
    /// a slot), checked against the copy before the class is changed: a
    /// state that could not be recorded must not be acted on.
    pub async fn fits(
        &self,
        name: &str,
        uid: &str,
        state: &State,
        live: &(dyn Fn(&str, &str) -> bool + Sync),
    ) -> Result<(), StoreError> {
        let copy = self.copy.lock().await;
        let data = copy.as_ref().map(|s| s.data.clone()).unwrap_or_default();
        next_data(&data, name, uid, (state, None), live).map(|_| ())
    }

    /// Records `state` for class `name` with `uid`, and the class's `copy`
    /// of a state as seen (see [`Entry::seen`]), dropping the entries of
    /// classes not `live`.
    pub async fn record(
        &self,
        name: &str,
        uid: &str,
        state: (&State, Option<&str>),
        live: &(dyn Fn(&str, &str) -> bool + Sync),
    ) -> Result<Recorded, StoreError> {
        let mut copy = self.copy.lock().await;
        for _ in 0..ATTEMPTS {
            let snapshot = match copy.take() {
                Some(snapshot) => snapshot,
                None => self.fetch().await?,
            };
            let data = match next_data(&snapshot.data, name, uid, state, live) {
                Ok(data) => data,
                Err(error) => {
                    *copy = Some(snapshot);
                    return Err(error);
                }
            };
            match self.write(snapshot.version.clone(), data).await {
                Ok(map) => {
                    let at = written_at(&map);
                    *copy = Some(Snapshot::of(map));
                    return Ok(Recorded::Written { at });
                }
                Err(e) if forbidden(&e) => {
                    *copy = Some(snapshot);
                    self.refuse(&e);
                    return Ok(Recorded::Refused);
                }
                // Changed (or made) by another writer since read: read
                // again (the copy is dropped) and merge this entry anew.
                Err(e) if matches!(status_code(&e), Some(409)) => {
                    tracing::debug!(nodeclass = %name, "ConfigMap {STORE_NAME} changed since read; reading again");
                }
                Err(e) => return Err(StoreError::Write(e)),
            }
        }
        Err(StoreError::Conflicts)
    }

    /// The ConfigMap as it is (empty when it does not exist).
    async fn fetch(&self) -> Result<Snapshot, StoreError> {
        let map = self
            .api
            .get_opt(STORE_NAME)
            .await
            .map_err(StoreError::Read)?;
        Ok(map.map(Snapshot::of).unwrap_or_default())
    }

    /// Replaces the ConfigMap read at `version` by one holding `data`, or
    /// creates it when there was none.
    async fn write(
        &self,
        version: Option<String>,
        data: BTreeMap<String, String>,
    ) -> Result<ConfigMap, kube::Error> {
        let map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(STORE_NAME.into()),
                resource_version: version.clone(),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        };
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        match version {
            Some(_) => self.api.replace(STORE_NAME, &params, &map).await,
            None => self.api.create(&params, &map).await,
        }
    }

    /// Whether the store was refused less than [`RETRY_FORBIDDEN`] ago.
    pub fn refused(&self) -> bool {
        let since = self.forbidden.lock().map(|f| *f).unwrap_or(None);
        since.is_some_and(|at| at.elapsed() < RETRY_FORBIDDEN)
    }

    /// Remembers a refusal; logs the first.
    fn refuse(&self, error: &kube::Error) {
        if let Ok(mut at) = self.forbidden.lock() {
            *at = Some(Instant::now());
        }
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                configmap = STORE_NAME,
                %error,
                "{UNAVAILABLE}"
            );
        }
    }
}

/// What a server refused the store says, in its log and Events.
pub const UNAVAILABLE: &str = "the rollout guard may not use ConfigMap autonode-rollout in the \
    leader namespace (the guest RBAC predates it: apply the Role autonode-server-rollout-store \
    of packaging/guest/rbac-manage-nodeclasses.yaml, or upgrade the chart's guest RBAC); until \
    then its state is kept only in each class's autonode.dev/rollout annotation, which whoever \
    may edit the class can delete, making the guard start afresh";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::nodeclass::rollout::{Refused, Trial, Values};

    fn values(ami: &str) -> Values {
        Values {
            user_data: "#!/bin/true".into(),
            ami_selector_terms: Some(vec![serde_json::json!({"id": ami})]),
        }
    }

    /// A state after a revert: the good AMI applied, the new one refused.
    fn reverted() -> State {
        State {
            applied: values("ami-01"),
            good: Some(values("ami-01")),
            trial: None,
            refused: Some(Refused {
                values: values("ami-02"),
                failed: Vec::new(),
            }),
            retried: None,
        }
    }

    fn all_live(_: &str, _: &str) -> bool {
        true
    }

    /// `data` with a reverted state for class `name` with `uid`.
    fn put(data: &BTreeMap<String, String>, name: &str, uid: &str) -> BTreeMap<String, String> {
        next_data(data, name, uid, (&reverted(), None), &all_live).unwrap()
    }

    #[test]
    fn a_state_reads_back_for_its_class_only() {
        let data = put(&BTreeMap::new(), "a", "uid-a");
        assert_eq!(
            decode(&data, "a", "uid-a").map(|e| e.state),
            Some(reverted())
        );
        // Deleted and made again under the name: another UID, afresh.
        assert_eq!(decode(&data, "a", "uid-a2"), None);
        assert_eq!(decode(&data, "b", "uid-a"), None);
    }

    #[test]
    fn an_entry_remembers_the_last_copies_seen_on_its_class() {
        let mut data = BTreeMap::new();
        for n in 0..SEEN + 2 {
            let copy = format!("copy {n}");
            data = next_data(&data, "a", "u", (&reverted(), Some(&copy)), &all_live).unwrap();
            // The same copy again is remembered once.
            data = next_data(&data, "a", "u", (&reverted(), Some(&copy)), &all_live).unwrap();
        }
        let seen = decode(&data, "a", "u").unwrap().seen;
        assert_eq!(seen.len(), SEEN);
        assert!(!seen.contains(&copy_digest("copy 1")));
        assert_eq!(
            seen.last(),
            Some(&copy_digest(&format!("copy {}", SEEN + 1)))
        );
        // A class made again under the name starts with none seen.
        let again = next_data(&data, "a", "u2", (&reverted(), None), &all_live).unwrap();
        assert!(decode(&again, "a", "u2").unwrap().seen.is_empty());
    }

    #[test]
    fn an_entry_that_does_not_parse_reads_as_none_and_is_kept() {
        let data = BTreeMap::from([("a".to_string(), "{not json".to_string())]);
        assert_eq!(decode(&data, "a", "uid-a"), None);
        let next = next_data(&data, "b", "uid-b", (&reverted(), None), &|_, _| false).unwrap();
        assert!(next.contains_key("a") && next.contains_key("b"), "{next:?}");
    }

    #[test]
    fn a_write_drops_the_entries_of_classes_gone_but_its_own() {
        let data = put(&BTreeMap::new(), "gone", "uid-g");
        let data = put(&data, "kept", "uid-k");
        let live = |name: &str, uid: &str| name == "kept" && uid == "uid-k";
        let next = next_data(&data, "mine", "uid-m", (&reverted(), None), &live).unwrap();
        assert_eq!(next.keys().collect::<Vec<_>>(), ["kept", "mine"]);
        // A class made again under the name: its predecessor's entry goes.
        let live = |name: &str, uid: &str| name == "kept" && uid == "uid-k2";
        let next = next_data(&data, "mine", "uid-m", (&reverted(), None), &live).unwrap();
        assert_eq!(next.keys().collect::<Vec<_>>(), ["mine"]);
    }

    /// A state after a revert with `claims` NodeClaims of the longest
    /// names and notes seen under its trial, and as many failures.
    fn full(claims: usize) -> State {
        let mut state = reverted();
        let mut trial = Trial::new();
        for i in 0..claims {
            trial.claims.insert(
                format!("{}-{i:05}", "n".repeat(56)),
                crate::controllers::nodeclass::rollout::Seen {
                    uid: "0".repeat(36),
                    failed: Some("x".repeat(crate::kube::marks::MAX_NOTE)),
                    launched: true,
                },
            );
        }
        if let Some(refused) = state.refused.as_mut() {
            refused.failed = trial.failures();
        }
        state.trial = Some(trial);
        state
    }

    #[test]
    fn a_class_over_its_budget_is_refused_alone() {
        let mut data = BTreeMap::new();
        for i in 0..SLOTS - 1 {
            data = next_data(&data, &format!("c{i}"), "u", (&reverted(), None), &all_live).unwrap();
        }
        let grown = next_data(&data, "c0", "u", (&full(40), None), &all_live);
        assert!(
            matches!(grown, Err(StoreError::OverBudget { .. })),
            "{grown:?}"
        );
        // The others still fit, the last slot included.
        let data = next_data(&data, "last", "u", (&reverted(), None), &all_live).unwrap();
        assert_eq!(data.len(), SLOTS);
        let data = next_data(&data, "c1", "u", (&full(8), None), &all_live).unwrap();
        // Every slot taken: a new class waits; one that has an entry grows.
        let new = next_data(&data, "new", "u", (&reverted(), None), &all_live);
        assert!(matches!(new, Err(StoreError::Full { .. })), "{new:?}");
        assert!(new.unwrap_err().is_full());
        next_data(&data, "c2", "u", (&full(8), None), &all_live).unwrap();
        // A class deleted frees its slot.
        let live = |name: &str, _: &str| name != "c3";
        next_data(&data, "new", "u", (&reverted(), None), &live).unwrap();
        // Full to the last byte, the store is under its cap.
        let bytes: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(bytes <= SLOTS * ENTRY_BUDGET && SLOTS * ENTRY_BUDGET <= MAX_BYTES);
    }

    #[test]
    fn an_older_servers_large_entries_take_the_slots_they_span() {
        let big = serde_json::to_string(&Entry {
            uid: "u".into(),
            state: State {
                retried: Some("r".repeat(3 * ENTRY_BUDGET)),
                ..reverted()
            },
            seen: Vec::new(),
        })
        .unwrap();
        let mut data: BTreeMap<String, String> = (0..SLOTS.div_ceil(4))
            .map(|i| (format!("old{i}"), big.clone()))
            .collect();
        // Each spans four slots: none is left for a new class.
        let new = next_data(&data, "new", "u", (&reverted(), None), &all_live);
        assert!(matches!(new, Err(StoreError::Full { .. })), "{new:?}");
        // Rewritten by this server (the retry value as its digest), an
        // entry shrinks and frees its slots.
        data = next_data(&data, "old0", "u", (&reverted(), None), &all_live).unwrap();
        next_data(&data, "new", "u", (&reverted(), None), &all_live).unwrap();
    }
}
