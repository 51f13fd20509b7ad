//! Checked layers and rendered configs, kept while their sources are
//! unchanged.
//!
//! Checking an operator's layer decodes, gunzips and hashes every data URL
//! in it, and checking the merged config does all of that again: per join
//! that is most of rendering, for a result that changes only when an
//! operator writes a ConfigMap, a Secret or an EC2NodeClass. So both are
//! kept, under the version of every object they were made from (its UID and
//! resourceVersion, which every write changes; the caller names it). A join
//! whose sources are unchanged pays for a lookup and a copy; a written
//! source is a new version, checked anew, so a layer changed into something
//! invalid is refused exactly as without the memo. Only what passed is
//! kept: a refusal is judged (and worded) afresh each time.
//!
//! Bounded: one layer per source object (a new version replaces the old
//! one, so an object rewritten in a loop holds one entry), a rendered
//! config lives only while every layer it was made from is the kept one,
//! [`Memo::retain`] drops objects that no longer exist, and either map is
//! emptied when it reaches its cap.

use autonode_shared::ignition::Config;
use serde_json::Value;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// At most this many kept layers (distinct Ignition objects in use).
const MAX_LAYERS: usize = 256;
/// At most this many kept rendered configs (one per class and kubelet
/// configuration in use).
const MAX_RENDERED: usize = 256;

/// The layers one rendered config was made from, each at its version, and
/// the KubeletConfiguration its generated layer writes (compact JSON).
#[derive(PartialEq, Eq, Hash)]
struct RenderKey<K> {
    layers: Vec<(K, String)>,
    kubelet: String,
}

struct Inner<K> {
    /// Per source object: the version that passed and what it parsed to.
    layers: HashMap<K, (String, Arc<Config>)>,
    rendered: HashMap<RenderKey<K>, Arc<Value>>,
}

/// What rendering already judged, per source version. `K` names a source
/// object (kind and name); versions are opaque strings.
pub struct Memo<K> {
    inner: Mutex<Inner<K>>,
}

impl<K: Clone + Eq + Hash> Default for Memo<K> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                layers: HashMap::new(),
                rendered: HashMap::new(),
            }),
        }
    }
}

impl<K: Clone + Eq + Hash> Memo<K> {
    /// The checked layer of `source` at `version`: the kept one, else
    /// `check`'s (kept when it passes; when it fails, the source's older
    /// version is dropped too, as it is no longer what the object holds).
    pub fn layer<E>(
        &self,
        source: &K,
        version: &str,
        check: impl FnOnce() -> Result<Config, E>,
    ) -> Result<Arc<Config>, E> {
        if let Some((kept, config)) = self.lock().layers.get(source) {
            if kept == version {
                return Ok(config.clone());
            }
        }
        // Checked unlocked: other joins go on meanwhile.
        let checked = check().map(Arc::new);
        let mut inner = self.lock();
        match &checked {
            Ok(config) => {
                if inner.layers.len() >= MAX_LAYERS && !inner.layers.contains_key(source) {
                    inner.layers.clear();
                }
                let entry = (version.to_string(), config.clone());
                inner.layers.insert(source.clone(), entry);
            }
            Err(_) => {
                inner.layers.remove(source);
            }
        }
        inner.drop_stale_rendered();
        checked
    }

    /// The config rendered from `layers` (each source at its version, lowest
    /// precedence first) and `kubelet`: the kept one, else `render`'s (kept
    /// when it succeeds and every layer it used is still the kept version).
    /// A source without a version (`None`) is never kept.
    pub fn rendered<E>(
        &self,
        layers: &[(K, Option<String>)],
        kubelet: &Value,
        render: impl FnOnce() -> Result<Value, E>,
    ) -> Result<Arc<Value>, E> {
        let key = layers
            .iter()
            .map(|(source, version)| Some((source.clone(), version.clone()?)))
            .collect::<Option<Vec<_>>>()
            .map(|layers| RenderKey {
                layers,
                kubelet: kubelet.to_string(),
            });
        let Some(key) = key else {
            return render().map(Arc::new);
        };
        if let Some(kept) = self.lock().rendered.get(&key) {
            return Ok(kept.clone());
        }
        let value = Arc::new(render()?);
        let mut inner = self.lock();
        if inner.is_current(&key) {
            if inner.rendered.len() >= MAX_RENDERED {
                inner.rendered.clear();
            }
            inner.rendered.insert(key, value.clone());
        }
        Ok(value)
    }

    /// Drops every kept layer whose source `exists` says is gone, and the
    /// rendered configs made from it.
    pub fn retain(&self, exists: impl Fn(&K) -> bool) {
        let mut inner = self.lock();
        inner.layers.retain(|source, _| exists(source));
        inner.drop_stale_rendered();
    }

    /// How many layers and rendered configs are kept (for tests).
    #[cfg(test)]
    pub fn len(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.layers.len(), inner.rendered.len())
    }

    /// The maps, even after a panic elsewhere while they were locked: every
    /// change to them is a single insert or removal, so they are whole.
    fn lock(&self) -> MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<K: Eq + Hash> Inner<K> {
    /// Whether every layer of `key` is the kept version of its source.
    fn is_current(&self, key: &RenderKey<K>) -> bool {
        key.layers.iter().all(|(source, version)| {
            self.layers
                .get(source)
                .is_some_and(|(kept, _)| kept == version)
        })
    }

    fn drop_stale_rendered(&mut self) {
        let rendered = std::mem::take(&mut self.rendered);
        self.rendered = rendered
            .into_iter()
            .filter(|(key, _)| self.is_current(key))
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::cell::Cell;

    /// A layer whose one file says `text`.
    fn config(text: &str) -> Config {
        let value = json!({"ignition": {"version": "3.2.0"}, "storage": {"files": [
            {"path": "/etc/motd", "contents": {"source": format!("data:,{text}")}}]}});
        autonode_shared::ignition::parse(&value).unwrap()
    }

    /// `memo.layer`, counting the checks it makes in `checks`.
    fn layer(
        memo: &Memo<&'static str>,
        source: &'static str,
        version: &str,
        outcome: Result<&str, &str>,
        checks: &Cell<u32>,
    ) -> Result<Arc<Config>, String> {
        memo.layer(&source, version, || {
            checks.set(checks.get() + 1);
            outcome.map(config).map_err(str::to_string)
        })
    }

    fn motd(config: &Config) -> &str {
        config.storage.files[0].contents.source.as_deref().unwrap()
    }

    #[test]
    fn the_same_version_is_checked_once() {
        let (memo, checks) = (Memo::default(), Cell::new(0));
        let first = layer(&memo, "base", "u1/1", Ok("a"), &checks).unwrap();
        let again = layer(&memo, "base", "u1/1", Err("not asked"), &checks).unwrap();
        assert_eq!(checks.get(), 1);
        assert!(Arc::ptr_eq(&first, &again));
        // Another source of the same version string is another object.
        layer(&memo, "class", "u1/1", Ok("b"), &checks).unwrap();
        assert_eq!(checks.get(), 2);
    }

    #[test]
    fn a_new_version_is_checked_anew_and_an_invalid_one_refused() {
        let (memo, checks) = (Memo::default(), Cell::new(0));
        layer(&memo, "base", "u1/1", Ok("a"), &checks).unwrap();
        let changed = layer(&memo, "base", "u1/2", Ok("b"), &checks).unwrap();
        assert_eq!((checks.get(), motd(&changed)), (2, "data:,b"));
        let broken = layer(&memo, "base", "u1/3", Err("storage.disks"), &checks);
        assert_eq!(broken.unwrap_err(), "storage.disks");
        // Still refused on the next join: a failure is never kept.
        let again = layer(&memo, "base", "u1/3", Err("storage.disks"), &checks);
        assert_eq!(
            (again.unwrap_err().as_str(), checks.get()),
            ("storage.disks", 4)
        );
        // Re-created under a new UID: a new object, checked.
        let recreated = layer(&memo, "base", "u2/1", Ok("c"), &checks).unwrap();
        assert_eq!((checks.get(), motd(&recreated)), (5, "data:,c"));
        assert_eq!(
            memo.len().0,
            1,
            "one entry per source, however often rewritten"
        );
    }

    #[test]
    fn a_rendered_config_is_kept_while_its_layers_are_unchanged() {
        let (memo, checks) = (Memo::default(), Cell::new(0));
        let renders = Cell::new(0);
        let render = |version: &str, kubelet: &Value| {
            let sources = [("base", Some(version.to_string()))];
            memo.rendered::<String>(&sources, kubelet, || {
                renders.set(renders.get() + 1);
                layer(&memo, "base", version, Ok("a"), &checks)?;
                Ok(json!({"n": renders.get()}))
            })
        };
        let kubelet = json!({"maxPods": 20});
        assert_eq!(*render("u1/1", &kubelet).unwrap(), json!({"n": 1}));
        assert_eq!(*render("u1/1", &kubelet).unwrap(), json!({"n": 1}));
        // Another class's kubelet settings: another config.
        assert_eq!(
            *render("u1/1", &json!({"maxPods": 30})).unwrap(),
            json!({"n": 2})
        );
        assert_eq!(memo.len(), (1, 2));
        // The layer written: both configs made from it go.
        assert_eq!(*render("u1/2", &kubelet).unwrap(), json!({"n": 3}));
        assert_eq!(memo.len(), (1, 1));
        // A source without a version is rendered every time.
        let unversioned = [("base", None)];
        let before = renders.get();
        for _ in 0..2 {
            memo.rendered::<String>(&unversioned, &kubelet, || {
                renders.set(renders.get() + 1);
                Ok(json!({}))
            })
            .unwrap();
        }
        assert_eq!((memo.len(), renders.get() - before), ((1, 1), 2));
    }

    #[test]
    fn objects_that_are_gone_are_dropped_with_their_configs() {
        let (memo, checks) = (Memo::default(), Cell::new(0));
        for source in ["base", "gpu", "cpu"] {
            let sources = [(source, Some("v".to_string()))];
            memo.rendered::<String>(&sources, &json!({}), || {
                layer(&memo, source, "v", Ok("a"), &checks)?;
                Ok(json!({}))
            })
            .unwrap();
        }
        assert_eq!(memo.len(), (3, 3));
        memo.retain(|source| *source != "gpu");
        assert_eq!(memo.len(), (2, 2));
        // Back again: checked anew.
        layer(&memo, "gpu", "v", Ok("a"), &checks).unwrap();
        assert_eq!(checks.get(), 4);
    }

    #[test]
    fn the_maps_are_capped() {
        let memo: Memo<String> = Memo::default();
        for i in 0..=MAX_LAYERS {
            let checked = memo.layer(&format!("cm-{i}"), "v", || Ok::<_, ()>(config("a")));
            assert!(checked.is_ok());
        }
        assert!(memo.len().0 <= MAX_LAYERS, "{:?}", memo.len());
        for i in 0..=MAX_RENDERED {
            let kubelet = json!({ "maxPods": i });
            let rendered = memo.rendered(&[], &kubelet, || Ok::<_, ()>(json!({})));
            assert!(rendered.is_ok());
        }
        assert!(memo.len().1 <= MAX_RENDERED, "{:?}", memo.len());
        assert!(memo.len().1 > 0, "what fits is kept");
    }
}
