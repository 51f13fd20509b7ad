//! Watch-backed caches that can say whether they are to be trusted.
//!
//! Two things kube-runtime does not give, both learnt the hard way:
//!
//! - **Listed, for every waiter.** `Store::wait_until_ready` keeps a single
//!   waker (a oneshot receiver behind a mutex): with several waiters only
//!   the one that polled last is woken. A server restarted under a burst had
//!   joins waiting on its NodeClaim cache's first list; the task that was to
//!   mark it ready never woke, and `/readyz` stayed 503 for good (one run in
//!   five of `resilience::a_server_killed_mid_burst…`). Here the loop that
//!   applies the list sets a tokio `watch` flag, which wakes everyone.
//! - **Fresh again after a failure.** kube-runtime's watcher resumes a
//!   broken watch from its last resourceVersion without listing again, so
//!   nothing shows when it is back: a cache marked stale on the error stayed
//!   stale until some later 410, and `/readyz` with it (every replica, after
//!   one blip of the connection to the API server). Here a watch that fails
//!   is started over, list first, after [`WatchBackoff`], as client-go's
//!   reflector does: fresh means listed since the last failure.
//!
//! - **Gone, remembered before forgotten** (opt-in, [`Cache::start_remembering`]).
//!   A reader that lists the store and then asks what was deleted must
//!   find every object in one of the two: the task records an object as
//!   gone (as the watch last delivered it) *before* the store drops it,
//!   for a delete event and for an object a relist no longer has. A
//!   controller that learnt of deletions from [`Cache::changes`] learnt
//!   too late: the store had already dropped the object, and a reconcile
//!   run in between saw it nowhere (the rollout guard then judged a
//!   NodeClaim that autonode had marked failed as gone "with no failure
//!   recorded").
//!
//! A cache is also the one watch of its kind that controllers share (as in
//! kube-rs's `shared_stream_controllers` example): [`Cache::changes`] feeds
//! a controller's queue from the same list and watch that fill the store,
//! so every reader of a kind has the relist-after-failure fix, and the API
//! server serves one watch per kind, not one per controller.

use crate::kube::index::Index;
use crate::primitives::backoff::WatchBackoff;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::{self, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use std::collections::{HashSet, VecDeque};
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{broadcast, watch};

/// Objects per page when a cache lists. A page is held whole (the response
/// body, then the parsed objects) before anything is stripped from them.
pub const LIST_PAGE: u32 = 100;
/// Objects per page when listing what anyone holding a node credential can
/// create large (CSRs: up to the API server's 1.5 MiB object limit each,
/// as many as they like): ten such objects are a bounded spike, 500 (the
/// watcher's default) would be most of the server's memory limit. Used
/// only where the API server refuses streaming lists: elsewhere a cache
/// lists as one stream of watch events, parsed an object at a time.
pub const SMALL_PAGE: u32 = 10;
/// Changes a controller may fall behind by before it is handed the whole
/// store again (see [`Cache::changes`]). Held only while a controller reads.
const CHANGES_BUFFER: usize = 1024;

/// A cache of `K`, kept by a background task.
pub struct Cache<K>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    pub store: Store<K>,
    pub status: Status,
    /// Each object the watch applies or deletes, for [`Cache::changes`].
    changes: broadcast::Sender<Arc<K>>,
    /// Objects the watch saw go, for [`Cache::gone`].
    gone: Gone<K>,
}

impl<K> Clone for Cache<K>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            status: self.status.clone(),
            changes: self.changes.clone(),
            gone: self.gone.clone(),
        }
    }
}

/// The last objects a cache's watch saw go, newest last, each as the watch
/// last delivered it; bounded (the oldest go first), and empty when the
/// cache keeps none.
struct Gone<K> {
    objects: Arc<Mutex<VecDeque<Arc<K>>>>,
    limit: usize,
    /// Also handed every object gone, before the store drops it: for a
    /// memory kept by other rules than the last `limit`.
    also: Option<OnGone<K>>,
}

/// What [`Cache::start_remembering`] hands each object gone (kept in the `Gone` list).
pub type OnGone<K> = Arc<dyn Fn(&K) + Send + Sync>;

/// What a cache runs on every object before keeping it (see
/// [`Cache::start_filtered`]).
type Filter<K> = Arc<dyn Fn(&mut K) + Send + Sync>;

impl<K> Clone for Gone<K> {
    fn clone(&self) -> Self {
        Self {
            objects: self.objects.clone(),
            limit: self.limit,
            also: self.also.clone(),
        }
    }
}

impl<K> Gone<K> {
    fn new(limit: usize, also: Option<OnGone<K>>) -> Self {
        Self {
            objects: Arc::default(),
            limit,
            also,
        }
    }

    /// Whether anything is done with gone objects.
    fn wanted(&self) -> bool {
        self.limit > 0 || self.also.is_some()
    }

    fn record(&self, object: Arc<K>) {
        if let Some(also) = &self.also {
            also(&object);
        }
        if self.limit == 0 {
            return;
        }
        let mut objects = self.objects.lock().unwrap_or_else(PoisonError::into_inner);
        if objects.len() >= self.limit {
            objects.pop_front();
        }
        objects.push_back(object);
    }

    fn matching(&self, keep: impl Fn(&K) -> bool) -> Vec<Arc<K>> {
        let objects = self.objects.lock().unwrap_or_else(PoisonError::into_inner);
        objects.iter().filter(|o| keep(o)).cloned().collect()
    }
}

/// Whether a cache has listed, and whether it is current.
#[derive(Debug, Clone)]
pub struct Status {
    listed: watch::Receiver<bool>,
    fresh: Arc<AtomicBool>,
    /// What it holds, for logs and `/readyz`.
    pub what: &'static str,
}

/// The cache's task ended before its first list.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the cache's watch ended before its first list")]
pub struct WatchEnded;

impl<K> Cache<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    /// Starts watching `api` in the background. `filter` runs on every
    /// object as the API server sent it (managedFields still there) and
    /// strips what the cache's readers do not read; managedFields are
    /// dropped after it in any case: they can outweigh a small object.
    pub fn start_filtered(api: Api<K>, what: &'static str, filter: fn(&mut K)) -> Self {
        Self::start_paged(api, what, filter, LIST_PAGE)
    }

    /// Like [`Cache::start_filtered`], listing `page` objects at a time:
    /// [`SMALL_PAGE`] for a kind whose every object its writer may make
    /// large.
    pub fn start_paged(api: Api<K>, what: &'static str, filter: fn(&mut K), page: u32) -> Self {
        let config = watcher::Config::default().page_size(page);
        let (cache, task) = Self::with_config(api, config, what, filter);
        tokio::spawn(task);
        cache
    }

    /// Like [`Cache::start_filtered`] (with a `filter` that may hold
    /// state, such as a key), also keeping the last `gone` objects the
    /// watch saw deleted (or a relist no longer had), for [`Cache::gone`],
    /// and handing each, filtered, to `on_gone` before the store drops it;
    /// and keeping `index` in step with the store.
    pub fn start_remembering(
        api: Api<K>,
        what: &'static str,
        filter: impl Fn(&mut K) + Send + Sync + 'static,
        (gone, on_gone): (usize, OnGone<K>),
        index: Index<K>,
    ) -> Self {
        let config = watcher::Config::default().page_size(LIST_PAGE);
        let gone = Gone::new(gone, Some(on_gone));
        let filter = Arc::new(filter);
        let (cache, task) = Self::build(api, config, what, filter, false, (gone, Some(index)));
        tokio::spawn(task);
        cache
    }

    /// Like [`Cache::start_filtered`], but the watch runs only while the
    /// returned future is polled: a controller that runs on the leader
    /// polls it beside itself, so a replica that stops leading stops
    /// watching (a spawned task would go on, and add another each time the
    /// replica led again).
    pub fn new(
        api: Api<K>,
        what: &'static str,
        filter: fn(&mut K),
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let config = watcher::Config::default().page_size(LIST_PAGE);
        Self::with_config(api, config, what, filter)
    }

    /// Like [`Cache::new`], with the watch's own selectors and page size.
    pub fn with_config(
        api: Api<K>,
        config: watcher::Config,
        what: &'static str,
        filter: fn(&mut K),
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        Self::with_filter(api, config, what, filter)
    }

    /// Like [`Cache::with_config`], with a `filter` that may hold state
    /// (the issuer's hands each CSR's outcome to the join waiting for it,
    /// then keeps none of it).
    pub fn with_filter(
        api: Api<K>,
        config: watcher::Config,
        what: &'static str,
        filter: impl Fn(&mut K) + Send + Sync + 'static,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        Self::build(
            api,
            config,
            what,
            Arc::new(filter),
            false,
            (Gone::new(0, None), None),
        )
    }

    /// Like [`Cache::with_config`], keeping objects as parsed,
    /// managedFields included: for a controller that reads who owns which
    /// field (the EC2NodeClass upkeep, whose type parses of managedFields
    /// only what it reads: see [`crate::kube::class_meta`]).
    pub fn whole(
        api: Api<K>,
        config: watcher::Config,
        what: &'static str,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        Self::build(
            api,
            config,
            what,
            Arc::new(|_: &mut K| {}),
            true,
            (Gone::new(0, None), None),
        )
    }

    fn build(
        api: Api<K>,
        config: watcher::Config,
        what: &'static str,
        filter: Filter<K>,
        keep_managed_fields: bool,
        (gone, index): (Gone<K>, Option<Index<K>>),
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (store, writer) = reflector::store();
        let (listed_tx, listed) = watch::channel(false);
        let (changes, _) = broadcast::channel(CHANGES_BUFFER);
        let fresh = Arc::new(AtomicBool::new(false));
        let task = Task {
            api,
            config,
            writer,
            listed: listed_tx,
            fresh: fresh.clone(),
            what,
            filter,
            keep_managed_fields,
            changes: changes.clone(),
            gone: gone.clone(),
            relisted: HashSet::new(),
            index,
        };
        let status = Status {
            listed,
            fresh,
            what,
        };
        let cache = Self {
            store,
            status,
            changes,
            gone,
        };
        (cache, task.run())
    }

    /// Every object the cache holds once it has listed, then each object
    /// its watch applies or deletes from then on, and every object again
    /// after each relist: a controller's queue.
    /// A reader that falls more than `CHANGES_BUFFER` changes behind is
    /// handed the whole store again, so it misses nothing (a wake-up too
    /// many costs a reconcile that finds nothing to do). Ends when the
    /// cache's watch ends before its first list.
    pub fn changes(&self) -> impl futures::Stream<Item = Arc<K>> + Send + 'static {
        let feed = Changes {
            receiver: self.changes.subscribe(),
            store: self.store.clone(),
            status: self.status.clone(),
            backlog: VecDeque::new(),
            listed: false,
        };
        futures::stream::unfold(feed, |mut feed| async move {
            let next = feed.next().await?;
            Some((next, feed))
        })
    }

    /// The objects this cache saw go that `keep` picks, each as it last
    /// was (none unless started with [`Cache::start_remembering`]). Read
    /// the store first, then this: an object the store no longer held is
    /// here by then.
    pub fn gone(&self, keep: impl Fn(&K) -> bool) -> Vec<Arc<K>> {
        self.gone.matching(keep)
    }
}

/// The reading half of [`Cache::changes`].
struct Changes<K>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    receiver: broadcast::Receiver<Arc<K>>,
    store: Store<K>,
    status: Status,
    /// Objects to hand out before the next change.
    backlog: VecDeque<Arc<K>>,
    listed: bool,
}

impl<K> Changes<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    async fn next(&mut self) -> Option<Arc<K>> {
        loop {
            if let Some(object) = self.backlog.pop_front() {
                return Some(object);
            }
            if !self.listed {
                // Subscribed before this wait: nothing applied after the
                // snapshot below is missed (at worst, seen twice).
                self.status.wait_listed().await.ok()?;
                self.listed = true;
                self.backlog.extend(self.store.state());
                continue;
            }
            match self.receiver.recv().await {
                Ok(object) => return Some(object),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::debug!(
                        missed,
                        "{}: a controller fell behind; handing it every object again",
                        self.status.what
                    );
                    self.backlog.extend(self.store.state());
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

impl Status {
    /// The first full list has been applied.
    pub fn is_listed(&self) -> bool {
        *self.listed.borrow()
    }

    /// Listed since the watch last failed (so listed at all): what is
    /// missing from the cache is missing from the cluster (give or take the
    /// watch's lag).
    pub fn is_fresh(&self) -> bool {
        self.fresh.load(Ordering::Acquire)
    }

    /// Waits until the first full list has been applied.
    pub async fn wait_listed(&self) -> Result<(), WatchEnded> {
        let mut listed = self.listed.clone();
        listed
            .wait_for(|listed| *listed)
            .await
            .map(|_| ())
            .map_err(|_| WatchEnded)
    }
}

/// The background half of a [`Cache`].
struct Task<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    listed: watch::Sender<bool>,
    fresh: Arc<AtomicBool>,
    what: &'static str,
    filter: Filter<K>,
    keep_managed_fields: bool,
    changes: broadcast::Sender<Arc<K>>,
    gone: Gone<K>,
    /// The objects of the list under way, to tell at its end which of the
    /// store's are gone.
    relisted: HashSet<(ObjectRef<K>, Option<String>)>,
    /// Kept in step with the store, when the cache has one.
    index: Option<Index<K>>,
}

impl<K> Task<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    /// List and watch until the watch fails; then again, after a backoff.
    /// Lists as a stream of watch events where the API server serves them
    /// (see [`Listing`]), in pages where it refuses to.
    async fn run(mut self) {
        let mut backoff = WatchBackoff::default();
        let mut listing = Listing::Streaming;
        loop {
            let events = watcher(self.api.clone(), listing.config(&self.config));
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        let (filter, keep) = (self.filter.clone(), self.keep_managed_fields);
                        let event = event.modify(|object| {
                            filter(object);
                            if !keep {
                                object.meta_mut().managed_fields = None;
                            }
                        });
                        // Recorded before the store drops it, so a reader
                        // always finds an object in one or the other.
                        self.remember_gone(&event);
                        if let Some(index) = &self.index {
                            index.before(&event);
                        }
                        self.writer.apply_watcher_event(&event);
                        if let Some(index) = &self.index {
                            index.after(&event);
                        }
                        self.announce(&event);
                        if matches!(event, watcher::Event::InitDone) {
                            self.in_sync();
                            backoff.reset();
                        }
                    }
                    Err(e) if listing.refused(&e) => {
                        listing = Listing::Paged;
                        told_paged(self.what, &e);
                        break;
                    }
                    Err(e) => {
                        self.fresh.store(false, Ordering::Release);
                        tracing::warn!(error = %e, "{} watch failed; listing again", self.what);
                        break;
                    }
                }
            }
            let delay = backoff.next().unwrap_or(crate::primitives::backoff::MAX);
            tokio::time::sleep(delay).await;
        }
    }

    /// Hands the object `event` touched to whoever reads [`Cache::changes`]
    /// (cloned only when someone does). A list's objects are handed over
    /// when it is done, from the store: before that the store still holds
    /// the previous list, and a controller woken by a new object would not
    /// find it there.
    fn announce(&self, event: &watcher::Event<K>) {
        if self.changes.receiver_count() == 0 {
            return;
        }
        // No reader left is no error: it has stopped.
        match event {
            // The store's own copy, just applied: no second deep copy.
            watcher::Event::Apply(object) => {
                let kept = self.writer.as_reader().get(&ObjectRef::from_obj(object));
                let _ = self
                    .changes
                    .send(kept.unwrap_or_else(|| Arc::new(object.clone())));
            }
            watcher::Event::Delete(object) => {
                let _ = self.changes.send(Arc::new(object.clone()));
            }
            watcher::Event::InitDone => {
                for object in self.writer.as_reader().state() {
                    let _ = self.changes.send(object);
                }
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    /// Records what `event` is about to take from the store: the deleted
    /// object, an object replaced by a new one of its name (a delete the
    /// watch did not deliver), or at a list's end every object the list
    /// did not have.
    fn remember_gone(&mut self, event: &watcher::Event<K>) {
        if !self.gone.wanted() {
            return;
        }
        let key = |o: &K| (ObjectRef::from_obj(o), o.meta().uid.clone());
        let store = self.writer.as_reader();
        match event {
            watcher::Event::Delete(object) => self.gone.record(Arc::new(object.clone())),
            watcher::Event::Apply(object) => {
                if let Some(old) = store.get(&ObjectRef::from_obj(object)) {
                    if old.meta().uid != object.meta().uid {
                        self.gone.record(old);
                    }
                }
            }
            watcher::Event::Init => self.relisted.clear(),
            watcher::Event::InitApply(object) => {
                self.relisted.insert(key(object));
            }
            watcher::Event::InitDone => {
                for old in store.state() {
                    if !self.relisted.contains(&key(&old)) {
                        self.gone.record(old);
                    }
                }
                self.relisted.clear();
            }
        }
    }

    fn in_sync(&self) {
        self.listed
            .send_if_modified(|listed| !std::mem::replace(listed, true));
        if !self.fresh.swap(true, Ordering::AcqRel) {
            tracing::info!("{} cache in sync", self.what);
        }
    }
}

/// How a cache lists, first and after each failed watch.
///
/// Streaming first: one watch that starts with every object as an event
/// (`sendInitialEvents`, the API server's WatchList, on by default from
/// Kubernetes 1.32), served from the API server's watch cache. A paged
/// list with selectors costs the API server a scan of the whole kind per
/// page, each page charged by priority and fairness as a list of the whole
/// kind: a 10,000-node renewal wave relisted kubelet's CSRs in pages of 10
/// ([`SMALL_PAGE`]), 1 to 12 s a page and every other one refused 429,
/// and approved nothing in 8 minutes. A stream is parsed an event at a
/// time, so one large object, not a page of them, is the most held at
/// once, whatever the page size was chosen for.
///
/// Paged (the watch's own page size) once the API server refuses the
/// stream: before 1.27 (`resourceVersionMatch` is refused for a watch), and
/// from 1.27 to 1.31 or with the `WatchList` feature gate off
/// (`sendInitialEvents` refused). Decided by the API server's answer, not
/// its version: the gate can be off on any version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listing {
    Streaming,
    Paged,
}

impl Listing {
    fn config(self, config: &watcher::Config) -> watcher::Config {
        match self {
            Listing::Streaming => config.clone().streaming_lists(),
            Listing::Paged => config.clone(),
        }
    }

    /// Whether `error` is the API server refusing a streaming list: its
    /// first watch refused as a bad request (400, 422). Any other failure
    /// (no connection, 403, 410, 429, 5xx) is retried as it is.
    fn refused(self, error: &watcher::Error) -> bool {
        self == Listing::Streaming
            && matches!(
                error,
                watcher::Error::WatchStartFailed(kube::Error::Api(status))
                    if matches!(status.code, 400 | 422)
            )
    }
}

/// Says once per process, as a warning, that the API server refuses
/// streaming lists (every cache learns it for itself; the rest say it at
/// debug).
fn told_paged(what: &str, error: &watcher::Error) {
    static TOLD: AtomicBool = AtomicBool::new(false);
    if TOLD.swap(true, Ordering::AcqRel) {
        tracing::debug!(error = %error, "{what}: streaming list refused; listing in pages");
    } else {
        tracing::warn!(
            error = %error,
            "the API server refuses streaming lists (WatchList: off, or Kubernetes before 1.32); \
             the caches list in pages, which a large cluster's API server serves slowly (docs/operations.md)"
        );
    }
}

/// What names an object and what readers of every kind use: name,
/// namespace, UID, resourceVersion, generation, creation and deletion
/// timestamps. Labels, annotations, managedFields, owners and finalizers
/// are not part of it: whoever may write the object may make them large.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    #[serde(default)]
    pub(crate) uid: Option<String>,
    #[serde(default)]
    pub(crate) resource_version: Option<String>,
    #[serde(default)]
    pub(crate) generation: Option<i64>,
    #[serde(default)]
    pub(crate) creation_timestamp: Option<Time>,
    #[serde(default)]
    pub(crate) deletion_timestamp: Option<Time>,
}

impl Identity {
    /// Reads an object's `metadata` as its identity alone (a
    /// `deserialize_with` for types a watch parses): serde steps over the
    /// rest, managedFields included, without building it.
    pub fn read_meta<'de, D: Deserializer<'de>>(from: D) -> Result<ObjectMeta, D::Error> {
        Ok(Option::<Identity>::deserialize(from)?
            .unwrap_or_default()
            .into())
    }
}

impl From<Identity> for ObjectMeta {
    fn from(identity: Identity) -> Self {
        ObjectMeta {
            name: identity.name,
            namespace: identity.namespace,
            uid: identity.uid,
            resource_version: identity.resource_version,
            generation: identity.generation,
            creation_timestamp: identity.creation_timestamp,
            deletion_timestamp: identity.deletion_timestamp,
            ..ObjectMeta::default()
        }
    }
}

/// Keeps of `meta` only its [`Identity`], for an object already parsed
/// whole.
pub fn identity_only(meta: &mut ObjectMeta) {
    let identity = Identity {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        uid: meta.uid.take(),
        resource_version: meta.resource_version.take(),
        generation: meta.generation.take(),
        creation_timestamp: meta.creation_timestamp.take(),
        deletion_timestamp: meta.deletion_timestamp.take(),
    };
    *meta = identity.into();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn status() -> (watch::Sender<bool>, Status) {
        let (tx, listed) = watch::channel(false);
        let status = Status {
            listed,
            fresh: Arc::default(),
            what: "test",
        };
        (tx, status)
    }

    fn start_refused(code: u16) -> watcher::Error {
        let mut status = kube::core::Status::failure("refused", "Invalid");
        status.code = code;
        watcher::Error::WatchStartFailed(kube::Error::Api(status.boxed()))
    }

    #[test]
    fn only_a_refused_stream_turns_to_pages() {
        for code in [400, 422] {
            assert!(Listing::Streaming.refused(&start_refused(code)));
            assert!(
                !Listing::Paged.refused(&start_refused(code)),
                "already paged"
            );
        }
        for code in [403, 410, 429, 500, 503] {
            assert!(!Listing::Streaming.refused(&start_refused(code)), "{code}");
        }
        let mut gone = kube::core::Status::failure("too old", "Expired");
        gone.code = 410;
        assert!(!Listing::Streaming.refused(&watcher::Error::WatchError(gone.boxed())));
        let config = watcher::Config::default().page_size(SMALL_PAGE);
        assert_eq!(
            Listing::Streaming.config(&config).initial_list_strategy,
            watcher::InitialListStrategy::StreamingList
        );
        assert_eq!(Listing::Paged.config(&config), config);
    }

    #[tokio::test]
    async fn every_waiter_wakes() {
        let (tx, status) = status();
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let status = status.clone();
                tokio::spawn(async move { status.wait_listed().await })
            })
            .collect();
        // Let them all register before the list "arrives".
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!status.is_listed());
        tx.send_replace(true);
        for waiter in waiters {
            let woke = tokio::time::timeout(Duration::from_secs(5), waiter).await;
            assert!(matches!(woke, Ok(Ok(Ok(())))), "a waiter slept on");
        }
        assert!(status.is_listed());
        // Later waiters return at once.
        status.wait_listed().await.unwrap();
    }

    #[tokio::test]
    async fn waiters_hear_when_the_task_ends_unlisted() {
        let (tx, status) = status();
        let waiter = tokio::spawn(async move { status.wait_listed().await });
        drop(tx);
        assert!(waiter.await.unwrap().is_err());
    }
}
