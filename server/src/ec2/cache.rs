//! A short-lived, bounded cache of EC2's answers about instances.
//!
//! `DescribeInstances` is drawn from the account's EC2 API budget, which
//! Karpenter shares: a controller that asks EC2 on every event can throttle
//! the autoscaler itself. What the approver asks (an instance's private DNS
//! name and addresses) does not change while the instance lives, so one
//! answer may serve every question about that instance for a while.
//!
//! Only answers are kept, never errors: an instance EC2 does not know yet
//! (eventual consistency) or a lookup EC2 throttled must be asked again, and
//! how often is the caller's rate limit's business, not this cache's.
//!
//! Memory is bounded twice, by the server's one bounded map: entries expire
//! after the TTL, and the map never holds more than its capacity (expired
//! entries go first, then the least recently used).
//!
//! A question asked while EC2 is being asked the same one waits for that
//! answer rather than asking again: a node's two CSRs, judged at the same
//! moment, both missed the cache and made two calls (6,076 for 3,000 nodes
//! in a renewal wave, docs/benchmarks.md). What waits is bounded by the
//! callers, each waiting on one lookup.

use super::{Ec2Instance, InstanceLookup, LookupError, LookupFuture};
use crate::primitives::bounded::Bounded;
use futures::future::{BoxFuture, FutureExt, Shared};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// `(region, instance ID)`: the same ID in two regions is two instances.
type Key = (String, String);

/// One kept answer and when EC2 gave it.
struct Entry {
    instance: Ec2Instance,
    stored: Instant,
}

/// A lookup on its way to EC2, which every caller asking the same may await.
type Asking = Shared<BoxFuture<'static, Result<Ec2Instance, LookupError>>>;

/// An [`InstanceLookup`] that remembers successful answers for `ttl`.
pub struct LookupCache {
    inner: Arc<dyn InstanceLookup>,
    ttl: Duration,
    capacity: usize,
    entries: Mutex<Bounded<Key, Entry>>,
    asking: Mutex<HashMap<Key, Asking>>,
}

impl LookupCache {
    /// Caches `inner`'s answers for `ttl`, at most `capacity` of them.
    pub fn new(inner: Arc<dyn InstanceLookup>, ttl: Duration, capacity: usize) -> Self {
        Self {
            inner,
            ttl,
            capacity,
            // An entry unused for the TTL is older than the TTL too.
            entries: Mutex::new(Bounded::new(ttl, capacity)),
            asking: Mutex::default(),
        }
    }

    /// The kept answer for the instance, if it is younger than the TTL.
    /// Never asks EC2.
    pub fn cached(&self, region: &str, instance_id: &str) -> Option<Ec2Instance> {
        self.cached_at(region, instance_id, Instant::now())
    }

    /// Asks EC2 (or waits for the same question already asked of it) and
    /// keeps a successful answer.
    pub async fn refresh(
        &self,
        region: &str,
        instance_id: &str,
    ) -> Result<Ec2Instance, LookupError> {
        let key = (region.to_string(), instance_id.to_string());
        let asking = self.ask(&key);
        let answer = asking.clone().await;
        {
            let mut all = self.asking.lock().unwrap_or_else(PoisonError::into_inner);
            // Only this question's: a later one may have begun since.
            if all.get(&key).is_some_and(|a| a.ptr_eq(&asking)) {
                all.remove(&key);
            }
        }
        let instance = answer?;
        self.insert_at(region, instance_id, instance.clone(), Instant::now());
        Ok(instance)
    }

    /// The lookup of `key` on its way to EC2, begun now if there is none.
    fn ask(&self, key: &Key) -> Asking {
        let mut all = self.asking.lock().unwrap_or_else(PoisonError::into_inner);
        all.entry(key.clone())
            .or_insert_with(|| {
                let inner = self.inner.clone();
                let (region, instance_id) = key.clone();
                async move { inner.describe_instance(&region, &instance_id).await }
                    .boxed()
                    .shared()
            })
            .clone()
    }

    /// How many answers are kept (expired ones included until evicted).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn cached_at(&self, region: &str, instance_id: &str, now: Instant) -> Option<Ec2Instance> {
        let key = (region.to_string(), instance_id.to_string());
        let mut entries = self.lock();
        let entry = entries.get_mut(&key, now)?;
        // Kept for the TTL after EC2 gave it, however often it is asked.
        if now.saturating_duration_since(entry.stored) < self.ttl {
            return Some(entry.instance.clone());
        }
        entries.remove(&key);
        None
    }

    fn insert_at(&self, region: &str, instance_id: &str, instance: Ec2Instance, now: Instant) {
        if self.capacity == 0 {
            return;
        }
        let key = (region.to_string(), instance_id.to_string());
        let entry = Entry {
            instance,
            stored: now,
        };
        self.lock().insert(key, now, entry);
    }

    fn lock(&self) -> MutexGuard<'_, Bounded<Key, Entry>> {
        // The map stays consistent across a panic elsewhere: every change
        // is a single insert, remove or eviction.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl InstanceLookup for LookupCache {
    /// The kept answer, or EC2's (then kept).
    fn describe_instance<'a>(&'a self, region: &'a str, instance_id: &'a str) -> LookupFuture<'a> {
        Box::pin(async move {
            match self.cached(region, instance_id) {
                Some(instance) => Ok(instance),
                None => self.refresh(region, instance_id).await,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ec2::tests::running as instance;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers every lookup with a running instance, counting the calls.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl InstanceLookup for Counting {
        fn describe_instance<'a>(&'a self, _: &'a str, id: &'a str) -> LookupFuture<'a> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { Ok(instance(id)) })
        }
    }

    fn cache(ttl: u64, capacity: usize) -> (Arc<Counting>, LookupCache) {
        let counting = Arc::new(Counting::default());
        let cache = LookupCache::new(counting.clone(), Duration::from_secs(ttl), capacity);
        (counting, cache)
    }

    #[tokio::test]
    async fn a_second_question_within_the_ttl_is_answered_from_the_cache() {
        let (ec2, cache) = cache(60, 10);
        for _ in 0..3 {
            let got = cache.describe_instance("us-west-2", "i-1").await.unwrap();
            assert_eq!(got.instance_id, "i-1");
        }
        assert_eq!(ec2.0.load(Ordering::SeqCst), 1);
        // Another region is another instance.
        cache.describe_instance("eu-west-1", "i-1").await.unwrap();
        assert_eq!(ec2.0.load(Ordering::SeqCst), 2);
    }

    /// Answers after a pause, counting the calls.
    #[derive(Default)]
    struct Slow(AtomicUsize);

    impl InstanceLookup for Slow {
        fn describe_instance<'a>(&'a self, _: &'a str, id: &'a str) -> LookupFuture<'a> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if id == "i-gone" {
                    return Err(LookupError::NotFound {
                        instance_id: id.to_string(),
                    });
                }
                Ok(instance(id))
            })
        }
    }

    #[tokio::test]
    async fn questions_asked_while_ec2_is_asked_the_same_share_its_answer() {
        let ec2 = Arc::new(Slow::default());
        let cache = LookupCache::new(ec2.clone(), Duration::from_secs(60), 10);
        let (a, b, c) = tokio::join!(
            cache.refresh("r", "i-1"),
            cache.refresh("r", "i-1"),
            cache.refresh("r", "i-2"),
        );
        assert_eq!(a.unwrap().instance_id, "i-1");
        assert_eq!(b.unwrap().instance_id, "i-1");
        assert_eq!(c.unwrap().instance_id, "i-2");
        assert_eq!(ec2.0.load(Ordering::SeqCst), 2, "one call an instance");
        // A failure is shared too, and not kept: the next question asks again.
        let (x, y) = tokio::join!(cache.refresh("r", "i-gone"), cache.refresh("r", "i-gone"));
        assert!(matches!(x, Err(LookupError::NotFound { .. })));
        assert!(matches!(y, Err(LookupError::NotFound { .. })));
        assert_eq!(ec2.0.load(Ordering::SeqCst), 3);
        assert!(cache.refresh("r", "i-gone").await.is_err());
        assert_eq!(ec2.0.load(Ordering::SeqCst), 4);
        // Nothing left waiting, and a later refresh asks EC2 again.
        assert!(cache.asking.lock().unwrap().is_empty());
        cache.refresh("r", "i-1").await.unwrap();
        assert_eq!(ec2.0.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn entries_expire_after_the_ttl() {
        let (_, cache) = cache(60, 10);
        let t0 = Instant::now();
        cache.insert_at("r", "i-1", instance("i-1"), t0);
        assert!(cache
            .cached_at("r", "i-1", t0 + Duration::from_secs(59))
            .is_some());
        assert!(cache
            .cached_at("r", "i-1", t0 + Duration::from_secs(60))
            .is_none());
        assert!(cache.is_empty(), "an expired entry is dropped when seen");
    }

    #[test]
    fn a_full_cache_drops_expired_entries_then_the_least_recently_used() {
        let (_, cache) = cache(60, 3);
        let t0 = Instant::now();
        cache.insert_at("r", "i-1", instance("i-1"), t0);
        cache.insert_at("r", "i-2", instance("i-2"), t0 + Duration::from_secs(30));
        cache.insert_at("r", "i-3", instance("i-3"), t0 + Duration::from_secs(40));
        // i-1 has expired by now: it goes, the others stay.
        let t1 = t0 + Duration::from_secs(61);
        cache.insert_at("r", "i-4", instance("i-4"), t1);
        assert_eq!(cache.len(), 3);
        assert!(cache.cached_at("r", "i-1", t1).is_none());
        assert!(cache.cached_at("r", "i-2", t1).is_some());
        // Nothing expired: the least recently used (i-3; i-2 was just
        // asked for) makes room.
        cache.insert_at("r", "i-5", instance("i-5"), t1);
        assert_eq!(cache.len(), 3);
        for (id, kept) in [("i-2", true), ("i-3", false), ("i-4", true), ("i-5", true)] {
            assert_eq!(cache.cached_at("r", id, t1).is_some(), kept, "{id}");
        }
        // Replacing a kept entry evicts nothing.
        cache.insert_at("r", "i-5", instance("i-5"), t1);
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn a_cache_of_capacity_zero_keeps_nothing() {
        let (_, cache) = cache(60, 0);
        cache.insert_at("r", "i-1", instance("i-1"), Instant::now());
        assert!(cache.is_empty());
    }
}
