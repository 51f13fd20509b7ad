//! An index kept in step with a cache's store: which objects carry a given
//! key (a NodeClaim's providerID, the node name its binding records).
//!
//! Why: the join, the approver and the feedback controller each looked
//! NodeClaims up by scanning the whole store, several times per join, so a
//! burst's cost grew with its square (every join scanned every NodeClaim):
//! a tenth of the server's CPU in a burst of 1,000 machines, a third of it
//! at 5,000 (docs/benchmarks.md). The index answers in constant time.
//!
//! The index only narrows: it names candidates, and the reader takes each
//! from the store and judges the object as the store holds it (see
//! [`Index::candidates`]'s callers). An entry the index still holds for an
//! object that no longer carries the key costs a lookup; an entry missing
//! would hide an object, so the task that applies the watch's events keeps
//! every key of both the old and the new version while the store changes
//! ([`Index::before`], then [`Index::after`]): a reader between the two
//! finds the object under either, as a scan of the store would.

use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::Resource;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, PoisonError, RwLock};

/// What an object is found by: its keys, each tagged by the caller
/// (`provider:…`, `node:…`), so one index serves several lookups.
pub type KeysOf<K> = fn(&K) -> Vec<String>;

/// Objects by key. Cheap to clone: every clone is the same index.
pub struct Index<K>
where
    K: Resource,
    K::DynamicType: Eq + Hash + Clone,
{
    keys_of: KeysOf<K>,
    inner: Arc<RwLock<Inner<K>>>,
}

struct Inner<K>
where
    K: Resource,
    K::DynamicType: Eq + Hash + Clone,
{
    live: Keyed<K>,
    /// The list under way, swapped in when it is done, as the store swaps
    /// its own.
    listing: Keyed<K>,
}

/// Both directions, so an object's old keys can be dropped.
struct Keyed<K>
where
    K: Resource,
    K::DynamicType: Eq + Hash + Clone,
{
    by_key: HashMap<String, HashSet<ObjectRef<K>>>,
    keys: HashMap<ObjectRef<K>, Vec<String>>,
}

impl<K> Default for Keyed<K>
where
    K: Resource,
    K::DynamicType: Eq + Hash + Clone,
{
    fn default() -> Self {
        Self {
            by_key: HashMap::new(),
            keys: HashMap::new(),
        }
    }
}

impl<K> Keyed<K>
where
    K: Resource,
    K::DynamicType: Eq + Hash + Clone,
{
    /// Adds `keys` to the object's, dropping none.
    fn add(&mut self, object: ObjectRef<K>, keys: Vec<String>) {
        for key in &keys {
            self.by_key
                .entry(key.clone())
                .or_default()
                .insert(object.clone());
        }
        let held = self.keys.entry(object).or_default();
        for key in keys {
            if !held.contains(&key) {
                held.push(key);
            }
        }
    }

    /// Leaves the object only `keep` (none: forgets it).
    fn retain(&mut self, object: &ObjectRef<K>, keep: &[String]) {
        let Some(held) = self.keys.get_mut(object) else {
            return;
        };
        for key in held.iter().filter(|k| !keep.contains(k)) {
            if let Some(objects) = self.by_key.get_mut(key) {
                objects.remove(object);
                if objects.is_empty() {
                    self.by_key.remove(key);
                }
            }
        }
        held.retain(|k| keep.contains(k));
        if held.is_empty() {
            self.keys.remove(object);
        }
    }
}

impl<K> Clone for Index<K>
where
    K: Resource,
    K::DynamicType: Eq + Hash + Clone,
{
    fn clone(&self) -> Self {
        Self {
            keys_of: self.keys_of,
            inner: self.inner.clone(),
        }
    }
}

impl<K> Index<K>
where
    K: Resource,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    /// An empty index of the keys `keys_of` gives each object.
    pub fn new(keys_of: KeysOf<K>) -> Self {
        Self {
            keys_of,
            inner: Arc::new(RwLock::new(Inner {
                live: Keyed::default(),
                listing: Keyed::default(),
            })),
        }
    }

    /// The objects last seen with `key`: candidates, to be taken from the
    /// store and judged there.
    pub fn candidates(&self, key: &str) -> Vec<ObjectRef<K>> {
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        inner
            .live
            .by_key
            .get(key)
            .map(|objects| objects.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Before the store applies `event`: the new version's keys join the
    /// old's, so the object is found under both until [`Index::after`].
    pub fn before(&self, event: &watcher::Event<K>) {
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let inner = &mut *inner;
        match event {
            watcher::Event::Apply(object) => {
                inner
                    .live
                    .add(ObjectRef::from_obj(object), (self.keys_of)(object));
            }
            watcher::Event::Init => inner.listing = Keyed::default(),
            watcher::Event::InitApply(object) => {
                inner
                    .listing
                    .add(ObjectRef::from_obj(object), (self.keys_of)(object));
            }
            watcher::Event::InitDone => {
                let listed: Vec<_> = inner
                    .listing
                    .keys
                    .iter()
                    .map(|(o, k)| (o.clone(), k.clone()))
                    .collect();
                for (object, keys) in listed {
                    inner.live.add(object, keys);
                }
            }
            watcher::Event::Delete(_) => {}
        }
    }

    /// After the store applied `event`: what the store no longer holds
    /// under a key leaves the index.
    pub fn after(&self, event: &watcher::Event<K>) {
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Apply(object) => {
                let keys = (self.keys_of)(object);
                inner.live.retain(&ObjectRef::from_obj(object), &keys);
            }
            watcher::Event::Delete(object) => {
                inner.live.retain(&ObjectRef::from_obj(object), &[]);
            }
            watcher::Event::InitDone => {
                inner.live = std::mem::take(&mut inner.listing);
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn object(name: &str, key: Option<&str>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            data: key.map(|k| BTreeMap::from([("key".to_string(), k.to_string())])),
            ..Default::default()
        }
    }

    fn keys(object: &ConfigMap) -> Vec<String> {
        object
            .data
            .as_ref()
            .and_then(|d| d.get("key"))
            .map(|k| vec![format!("k:{k}")])
            .unwrap_or_default()
    }

    fn names(index: &Index<ConfigMap>, key: &str) -> Vec<String> {
        let mut names: Vec<_> = index.candidates(key).into_iter().map(|o| o.name).collect();
        names.sort();
        names
    }

    fn apply(index: &Index<ConfigMap>, event: watcher::Event<ConfigMap>) {
        index.before(&event);
        index.after(&event);
    }

    #[test]
    fn a_changed_key_is_found_under_both_while_the_store_changes_then_under_the_new() {
        let index = Index::new(keys);
        apply(&index, watcher::Event::Apply(object("a", Some("1"))));
        assert_eq!(names(&index, "k:1"), ["a"]);
        let changed = watcher::Event::Apply(object("a", Some("2")));
        index.before(&changed);
        assert_eq!(names(&index, "k:1"), ["a"]);
        assert_eq!(names(&index, "k:2"), ["a"]);
        index.after(&changed);
        assert!(names(&index, "k:1").is_empty());
        assert_eq!(names(&index, "k:2"), ["a"]);
        apply(&index, watcher::Event::Delete(object("a", Some("2"))));
        assert!(names(&index, "k:2").is_empty());
        assert!(index.inner.read().unwrap().live.keys.is_empty());
    }

    #[test]
    fn a_relist_replaces_the_index_when_it_is_done() {
        let index = Index::new(keys);
        apply(&index, watcher::Event::Apply(object("old", Some("1"))));
        apply(&index, watcher::Event::Apply(object("b", None)));
        apply(&index, watcher::Event::Init);
        apply(&index, watcher::Event::InitApply(object("new", Some("1"))));
        // Until the list is done the store still holds the old objects.
        assert_eq!(names(&index, "k:1"), ["old"]);
        let done = watcher::Event::InitDone;
        index.before(&done);
        assert_eq!(names(&index, "k:1"), ["new", "old"]);
        index.after(&done);
        assert_eq!(names(&index, "k:1"), ["new"]);
        apply(&index, watcher::Event::Apply(object("b", Some("1"))));
        assert_eq!(names(&index, "k:1"), ["b", "new"]);
    }
}
