//! Kubernetes Events on NodeClaims and EC2NodeClasses: what operators see
//! in `kubectl describe nodeclaim` (or `ec2nodeclass`).
//!
//! Both are cluster-scoped. Core/v1 Events in the `default` namespace
//! are how every API server version accepts Events about cluster-scoped
//! objects (1.20's events.k8s.io/v1 refuses them), so autonode writes those.
//! Published in the background: an Event is worth a log line if it fails,
//! never a slower or failed join.
//!
//! Anyone who can make the server refuse something (a replayed join, a
//! forged report) can make it publish an Event, so Events are correlated
//! the way client-go's recorder does it (`EventCorrelator`), in a
//! `Correlator` of our own:
//!
//! - Identical Events (same object, UID included; type; reason; message)
//!   are one Event: the first creates it, later ones raise its `count` and
//!   `lastTimestamp` (a PATCH).
//! - Similar Events (same object, type and reason, messages differing, as a
//!   refusal's note with its request id does): from the
//!   [`MAX_SIMILAR`]th distinct message within [`SIMILAR_WINDOW`], they are
//!   one Event `"(combined from similar events): <latest message>"`.
//! - Each object has a token bucket of [`BURST`] writes refilled by one
//!   every [`REFILL`]. A write the bucket refuses is counted
//!   (`autonode_events_dropped_total{reason="rate_limited"}`) and not lost:
//!   the Event's count goes on in memory and is written when the next
//!   token comes.
//!
//! Memory is bounded: each of the three maps holds at most
//! [`CACHE_ENTRIES`] entries and forgets idle ones; writes wait in a queue
//! of [`QUEUE`] (past it they are dropped and counted, `queue_full`).

use crate::kube::metrics::{EventDropLabels, Metrics};
use crate::kube::reason::Reason;
use crate::logfmt;
use crate::primitives::bounded::Bounded;
use crate::primitives::clock::{Clock, KubeTime};
use crate::primitives::limiter::{Bucket, Rate};
use crate::primitives::told::Told;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The component name on every Event.
pub const COMPONENT: &str = "autonode-server";

/// Writes (creates or count updates) one object's Events may make at once.
/// client-go's figure: far above the handful an object gets in a healthy
/// life (Attested, NodeRegistered, NodeReady, a few agent reports), so
/// nothing real is delayed, while a flood of refusals costs the API server
/// 25 writes, not one per request.
pub const BURST: u32 = 25;

/// One more write per object per this, once the burst is spent
/// (client-go's too): a flood that goes on for an hour costs 12 more
/// writes, each carrying the count so far.
pub const REFILL: Duration = Duration::from_secs(300);

/// Each object's Event writes: [`BURST`], then one per [`REFILL`].
fn rate() -> Rate {
    Rate::new(BURST, REFILL)
}

/// Distinct messages of one object, type and reason within
/// [`SIMILAR_WINDOW`] before further ones are combined (client-go's 10).
/// An agent's progress through its six phases stays apart.
pub const MAX_SIMILAR: usize = 10;

/// How long similar messages are remembered (client-go's 10 minutes).
pub const SIMILAR_WINDOW: Duration = Duration::from_secs(600);

/// Most entries in each of the correlator's maps (client-go's LRU size).
/// The largest holds an Event (message ≤ ~1 KiB) per entry: a few MB at
/// worst.
pub const CACHE_ENTRIES: usize = 4096;

/// Writes waiting for the API server. Past it a write is dropped (counted)
/// rather than making the caller wait.
pub const QUEUE: usize = 1024;

/// How long an Event's record is kept for aggregation: the API server's
/// default `--event-ttl`, after which the Event itself is gone.
const SEEN_TTL: Duration = Duration::from_secs(3600);

/// Longest message kept in an Event, before the note of what was cut.
const NOTE_LIMIT: usize = 1000;

/// The prefix of an Event that stands for several similar ones.
pub const COMBINED: &str = "(combined from similar events): ";

/// Publishes Events as `autonode-server`.
#[derive(Clone)]
pub struct Events {
    inner: Arc<Inner>,
}

struct Inner {
    correlator: Mutex<Correlator>,
    /// What was last told, per topic and object: see [`Events::is_news`].
    told: Told,
    /// `autonode_events_dropped_total`.
    dropped: Family<EventDropLabels, Counter>,
    queue: mpsc::Sender<Box<Write>>,
    source: EventSource,
}

impl Events {
    /// A publisher identifying this replica as `instance`; starts its
    /// writer task (call within the Tokio runtime). `clock` stamps the
    /// Events and names them.
    pub fn new(client: Client, instance: String, metrics: &Metrics, clock: Clock) -> Self {
        let (queue, writes) = mpsc::channel(QUEUE);
        tokio::spawn(write_all(Api::namespaced(client, "default"), writes));
        Self {
            inner: Arc::new(Inner {
                correlator: Mutex::new(Correlator::new(clock)),
                told: Told::new(CACHE_ENTRIES),
                dropped: metrics.events_dropped.clone(),
                queue,
                source: EventSource {
                    component: Some(COMPONENT.into()),
                    host: Some(instance),
                },
            }),
        }
    }

    /// Whether `state` of `topic` on `object` is news: not what was last
    /// told about them. Remembers it. The one "tell once" of the server:
    /// a warning that a resync or every join would repeat is logged and
    /// published only when this says so. Keyed by the object's UID, so an
    /// object deleted and made again under its name is told afresh;
    /// bounded, so past [`CACHE_ENTRIES`] objects, or [`TOLD_TTL`](crate::primitives::told::TOLD_TTL) unasked,
    /// a state is told once more.
    pub fn is_news<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        topic: &'static str,
        state: &str,
    ) -> bool {
        self.inner.told.first(&told_key(object, topic), state)
    }

    /// Forgets what was told of `topic` on `object`: what it was about is
    /// over, and is told again if it comes back.
    pub fn settled<K: Resource<DynamicType = ()>>(&self, object: &K, topic: &'static str) {
        self.inner.told.clear(&told_key(object, topic));
    }

    /// A Normal event on `object` (a NodeClaim, an EC2NodeClass).
    pub fn normal<K: Resource<DynamicType = ()>>(&self, object: &K, reason: Reason, note: String) {
        self.publish(object.object_ref(&()), "Normal", reason.as_str(), &note);
    }

    /// A Warning event on `object`.
    pub fn warning<K: Resource<DynamicType = ()>>(&self, object: &K, reason: Reason, note: String) {
        self.publish(object.object_ref(&()), "Warning", reason.as_str(), &note);
    }

    /// A Warning event on the object `regarding` names: for an object the
    /// server knows only by reference (a NodeClaim's NodePool, from its
    /// owner reference).
    pub fn warning_about(&self, regarding: ObjectReference, reason: Reason, note: String) {
        self.publish(regarding, "Warning", reason.as_str(), &note);
    }

    fn publish(&self, regarding: ObjectReference, type_: &str, reason: &str, note: &str) {
        let draft = Draft {
            regarding,
            type_,
            reason,
            note: logfmt::escape_within(&note, NOTE_LIMIT),
            source: &self.inner.source,
        };
        let step = self.correlator().observe(draft, Instant::now());
        self.take(step);
    }

    /// Does what the correlator decided.
    fn take(&self, step: Step) {
        match step {
            Step::Write(write) => self.enqueue(write),
            Step::Deferred { key, at } => {
                self.dropped("rate_limited");
                let events = self.clone();
                tokio::spawn(async move { events.flush_at(key, at).await });
            }
            Step::Dropped => self.dropped("rate_limited"),
        }
    }

    /// Writes the deferred Event `key` once its object has a token again.
    async fn flush_at(&self, key: EventKey, mut at: Instant) {
        loop {
            tokio::time::sleep_until(at.into()).await;
            let step = self.correlator().flush(&key, Instant::now());
            match step {
                Step::Write(write) => return self.enqueue(write),
                Step::Deferred { at: next, .. } => at = next,
                Step::Dropped => return,
            }
        }
    }

    /// Counts a write not made when asked.
    fn dropped(&self, reason: &'static str) {
        self.inner
            .dropped
            .get_or_create(&EventDropLabels { reason })
            .inc();
    }

    fn enqueue(&self, write: Box<Write>) {
        if self.inner.queue.try_send(write).is_err() {
            self.dropped("queue_full");
        }
    }

    fn correlator(&self) -> std::sync::MutexGuard<'_, Correlator> {
        // The correlator's state is consistent after every call.
        self.inner
            .correlator
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One write to the API server: the Event as it should now be.
#[derive(Debug, Clone)]
struct Write {
    event: Event,
    /// It was created before: update its count, time and message.
    update: bool,
}

/// Writes Events one at a time, in order (a count update never overtakes
/// its Event's creation), until every [`Events`] is dropped.
async fn write_all(api: Api<Event>, mut writes: mpsc::Receiver<Box<Write>>) {
    while let Some(write) = writes.recv().await {
        let reason = write.event.reason.clone().unwrap_or_default();
        if let Err(e) = write_one(&api, *write).await {
            tracing::warn!(error = %e, reason, "could not publish Event");
        }
    }
}

async fn write_one(api: &Api<Event>, write: Write) -> Result<(), kube::Error> {
    let event = write.event;
    if write.update {
        let name = event.metadata.name.clone().unwrap_or_default();
        let patch = serde_json::json!({
            "count": event.count,
            "lastTimestamp": event.last_timestamp,
            "message": event.message,
        });
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            // Expired (--event-ttl) or its creation was lost: create it
            // with the count so far.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            other => return other.map(drop),
        }
    }
    api.create(&PostParams::default(), &event).await.map(drop)
}

/// An Event as a caller asks for it, before correlation.
struct Draft<'a> {
    regarding: ObjectReference,
    type_: &'a str,
    reason: &'a str,
    /// Escaped and cut.
    note: String,
    source: &'a EventSource,
}

/// The object an Event is about, by identity (a NodeClaim deleted and
/// recreated under the same name is another object).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ObjectKey {
    api_version: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
}

impl ObjectKey {
    fn of(regarding: &ObjectReference) -> Self {
        Self {
            api_version: regarding.api_version.clone(),
            kind: regarding.kind.clone(),
            namespace: regarding.namespace.clone(),
            name: regarding.name.clone(),
            uid: regarding.uid.clone(),
        }
    }
}

/// Events that differ in their message only. The source is left out: a
/// correlator serves one [`Events`], whose source never changes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SimilarKey {
    object: ObjectKey,
    type_: String,
    reason: String,
}

/// One Event on the API server: similar ones and a message (by its hash:
/// the message itself is in the record), or [`None`] for the combined one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EventKey {
    similar: SimilarKey,
    message: Option<u64>,
}

/// What to do about an observed Event.
#[derive(Debug)]
enum Step {
    Write(Box<Write>),
    /// Rate limited; nothing is waiting for this Event's next token yet:
    /// call [`Correlator::flush`] at `at`.
    Deferred {
        key: EventKey,
        at: Instant,
    },
    /// Rate limited; the count is written with an earlier deferred write.
    Dropped,
}

/// Recent distinct messages of similar Events.
struct Similar {
    messages: Vec<u64>,
}

/// An Event as last decided, and whether the API server has it.
struct Seen {
    event: Event,
    written: bool,
    /// A write is deferred to then.
    deferred: Option<Instant>,
}

/// Aggregates and rate-limits one source's Events; pure, the time passed
/// in.
struct Correlator {
    similar: Bounded<SimilarKey, Similar>,
    /// Boxed: an Event is over a kilobyte inline, and a map holds twice
    /// its entries' room (4,096 entries took 12 MiB unboxed at 3,000 nodes).
    seen: Bounded<EventKey, Box<Seen>>,
    buckets: Bounded<ObjectKey, Bucket>,
    hasher: RandomState,
    /// The last Event name's suffix, kept unique.
    last_suffix: u128,
    /// The Events' timestamps and names.
    clock: Clock,
}

impl Correlator {
    fn new(clock: Clock) -> Self {
        Self {
            similar: Bounded::new(SIMILAR_WINDOW, CACHE_ENTRIES),
            seen: Bounded::new(SEEN_TTL, CACHE_ENTRIES),
            // An idle bucket is full again after this: the same as new.
            buckets: Bounded::new(REFILL * BURST, CACHE_ENTRIES),
            hasher: RandomState::new(),
            last_suffix: 0,
            clock,
        }
    }

    /// Counts `draft` in its Event and says whether to write it now.
    fn observe(&mut self, draft: Draft<'_>, now: Instant) -> Step {
        let stamp = self.clock.k8s();
        let (key, message) = self.aggregate(&draft, now);
        if let Some(seen) = self.seen.get_mut(&key, now) {
            let count = seen.event.count.unwrap_or(1).saturating_add(1);
            seen.event.count = Some(count);
            seen.event.last_timestamp = Some(stamp);
            seen.event.message = Some(message);
        } else {
            let name = self.name(&draft.regarding);
            let event = new_event(draft, name, message, stamp);
            let seen = Box::new(Seen {
                event,
                written: false,
                deferred: None,
            });
            self.seen.get_or_insert_with(key.clone(), now, || seen);
        }
        self.admit(key, now)
    }

    /// Writes the deferred Event `key` if its object has a token now.
    fn flush(&mut self, key: &EventKey, now: Instant) -> Step {
        match self.seen.get_mut(key, now) {
            Some(seen) if seen.deferred.is_some() => seen.deferred = None,
            _ => return Step::Dropped,
        }
        self.admit(key.clone(), now)
    }

    /// The Event key for `draft`, and its message: the note, or once
    /// [`MAX_SIMILAR`] distinct notes were seen, the combined form.
    fn aggregate(&mut self, draft: &Draft<'_>, now: Instant) -> (EventKey, String) {
        let similar_key = SimilarKey {
            object: ObjectKey::of(&draft.regarding),
            type_: draft.type_.to_string(),
            reason: draft.reason.to_string(),
        };
        let hash = self.hasher.hash_one(&draft.note);
        let similar = self
            .similar
            .get_or_insert_with(similar_key.clone(), now, || Similar {
                messages: Vec::new(),
            });
        if !similar.messages.contains(&hash) {
            similar.messages.push(hash);
        }
        if similar.messages.len() < MAX_SIMILAR {
            let key = EventKey {
                similar: similar_key,
                message: Some(hash),
            };
            return (key, draft.note.clone());
        }
        // Do not grow the set past the limit (client-go's PopAny).
        similar.messages.truncate(MAX_SIMILAR - 1);
        let key = EventKey {
            similar: similar_key,
            message: None,
        };
        (key, format!("{COMBINED}{}", draft.note))
    }

    /// Takes a token for `key`'s object: the Event to write, or when.
    fn admit(&mut self, key: EventKey, now: Instant) -> Step {
        let Some(seen) = self.seen.get_mut(&key, now) else {
            return Step::Dropped;
        };
        let bucket = self
            .buckets
            .get_or_insert_with(key.similar.object.clone(), now, || {
                Bucket::full(rate(), now)
            });
        match bucket.take(rate(), now).map_err(|wait| now + wait) {
            Ok(()) => {
                let write = Write {
                    event: seen.event.clone(),
                    update: seen.written,
                };
                seen.written = true;
                seen.deferred = None;
                Step::Write(Box::new(write))
            }
            Err(_) if seen.deferred.is_some() => Step::Dropped,
            Err(at) => {
                seen.deferred = Some(at);
                Step::Deferred { key, at }
            }
        }
    }

    /// A name for a new Event on `regarding`, as client-go makes them
    /// (`<object>.<hex time>`), known before the create so that updates
    /// can follow it in the queue.
    fn name(&mut self, regarding: &ObjectReference) -> String {
        let nanos = self.clock.stamp().as_nanosecond().unsigned_abs();
        self.last_suffix = nanos.max(self.last_suffix + 1);
        let suffix = format!("{:x}", self.last_suffix);
        let object = regarding.name.as_deref().unwrap_or("object");
        // A name is at most 253 characters.
        let mut end = object.len().min(252 - suffix.len());
        while !object.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}.{suffix}", &object[..end])
    }
}

fn new_event(draft: Draft<'_>, name: String, message: String, stamp: Time) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some("default".into()),
            ..Default::default()
        },
        involved_object: draft.regarding,
        type_: Some(draft.type_.into()),
        reason: Some(draft.reason.into()),
        message: Some(message),
        count: Some(1),
        first_timestamp: Some(stamp.clone()),
        last_timestamp: Some(stamp),
        // The legacy form (no eventTime/reporting*): the new form's
        // validation demands involvedObject.namespace == namespace,
        // which a cluster-scoped object cannot meet before 1.22.
        source: Some(draft.source.clone()),
        ..Default::default()
    }
}

/// The key of what was told of `topic` on an object: the topic and the
/// object's UID (its name without one).
fn told_key<K: Resource<DynamicType = ()>>(object: &K, topic: &str) -> String {
    let meta = object.meta();
    let id = meta
        .uid
        .as_deref()
        .or(meta.name.as_deref())
        .unwrap_or_default();
    format!("{topic}/{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> EventSource {
        EventSource {
            component: Some(COMPONENT.into()),
            host: Some("replica-0".into()),
        }
    }

    fn claim(name: &str, uid: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("karpenter.sh/v1".into()),
            kind: Some("NodeClaim".into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..Default::default()
        }
    }

    /// Observes one Warning `reason` with `note` on `object`.
    fn observe(
        c: &mut Correlator,
        object: &ObjectReference,
        reason: &str,
        note: &str,
        now: Instant,
    ) -> Step {
        let source = source();
        let draft = Draft {
            regarding: object.clone(),
            type_: "Warning",
            reason,
            note: note.into(),
            source: &source,
        };
        c.observe(draft, now)
    }

    fn written(step: Step) -> Write {
        match step {
            Step::Write(write) => *write,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    #[test]
    fn identical_events_are_one_event_with_a_count() {
        let (mut c, now) = (Correlator::new(Clock::SYSTEM), Instant::now());
        let object = claim("a", "uid-1");
        let first = written(observe(&mut c, &object, "PossibleReplay", "same", now));
        assert!(!first.update);
        assert_eq!(first.event.count, Some(1));
        let second = written(observe(&mut c, &object, "PossibleReplay", "same", now));
        assert!(second.update, "the second is a count update");
        assert_eq!(second.event.count, Some(2));
        assert_eq!(second.event.metadata.name, first.event.metadata.name);
        assert_eq!(second.event.source, Some(source()));
    }

    #[test]
    fn the_key_is_object_uid_type_reason_and_message() {
        let (mut c, now) = (Correlator::new(Clock::SYSTEM), Instant::now());
        let object = claim("a", "uid-1");
        let first = written(observe(&mut c, &object, "R", "m", now));
        let names = [
            written(observe(&mut c, &claim("a", "uid-2"), "R", "m", now)),
            written(observe(&mut c, &claim("b", "uid-1"), "R", "m", now)),
            written(observe(&mut c, &object, "Other", "m", now)),
            written(observe(&mut c, &object, "R", "other message", now)),
        ];
        for write in names {
            assert!(!write.update, "{write:?} is a new Event");
            assert_ne!(write.event.metadata.name, first.event.metadata.name);
        }
        let source = source();
        let normal = Draft {
            regarding: object.clone(),
            type_: "Normal",
            reason: "R",
            note: "m".into(),
            source: &source,
        };
        assert!(!written(c.observe(normal, now)).update);
    }

    #[test]
    fn similar_events_are_combined_after_max_similar_messages() {
        let (mut c, now) = (Correlator::new(Clock::SYSTEM), Instant::now());
        let object = claim("a", "uid-1");
        for i in 1..MAX_SIMILAR {
            let write = written(observe(&mut c, &object, "R", &format!("note {i}"), now));
            assert!(!write.update && write.event.message == Some(format!("note {i}")));
        }
        let combined = written(observe(&mut c, &object, "R", "note 10", now));
        assert!(!combined.update);
        assert_eq!(
            combined.event.message.as_deref(),
            Some("(combined from similar events): note 10")
        );
        let next = written(observe(&mut c, &object, "R", "note 11", now));
        assert!(next.update);
        assert_eq!(next.event.metadata.name, combined.event.metadata.name);
        assert_eq!(next.event.count, Some(2));
        assert_eq!(
            next.event.message.as_deref(),
            Some("(combined from similar events): note 11")
        );
        // A window later, messages stand apart again.
        let later = now + SIMILAR_WINDOW + Duration::from_secs(1);
        let apart = written(observe(&mut c, &object, "R", "note 12", later));
        assert_eq!(apart.event.message.as_deref(), Some("note 12"));
    }

    #[test]
    fn a_flood_costs_the_burst_then_one_write_per_refill_with_the_full_count() {
        let (mut c, now) = (Correlator::new(Clock::SYSTEM), Instant::now());
        let object = claim("a", "uid-1");
        let mut writes = 0;
        let mut deferred = Vec::new();
        for i in 0..200 {
            match observe(&mut c, &object, "R", &format!("refused (request {i})"), now) {
                Step::Write(_) => writes += 1,
                Step::Deferred { key, at } => deferred.push((key, at)),
                Step::Dropped => {}
            }
        }
        assert_eq!(writes, BURST);
        // One pending write per Event still counting: the combined one.
        assert_eq!(deferred.len(), 1, "{deferred:?}");
        let (key, at) = deferred.pop().unwrap();
        assert_eq!(at, now + REFILL);
        assert!(matches!(c.flush(&key, now), Step::Deferred { .. }));
        let flushed = written(c.flush(&key, at));
        assert!(flushed.update);
        // 9 apart, the rest combined.
        assert_eq!(flushed.event.count, Some(200 - (MAX_SIMILAR as i32 - 1)));
        assert!(matches!(c.flush(&key, at), Step::Dropped), "nothing left");
    }

    #[test]
    fn buckets_are_per_object_and_refill() {
        let now = Instant::now();
        let mut bucket = Bucket::full(rate(), now);
        for _ in 0..BURST {
            assert!(bucket.take(rate(), now).is_ok());
        }
        assert_eq!(bucket.take(rate(), now), Err(REFILL));
        let half = now + REFILL / 2;
        assert_eq!(bucket.take(rate(), half), Err(REFILL / 2));
        assert!(bucket.take(rate(), now + REFILL).is_ok());
        assert!(bucket.take(rate(), now + REFILL).is_err());
        let idle = now + REFILL * 100;
        assert!(bucket.take(rate(), idle).is_ok(), "refills, capped");
        for _ in 1..BURST {
            assert!(bucket.take(rate(), idle).is_ok());
        }
        assert!(bucket.take(rate(), idle).is_err(), "capped at the burst");

        let (mut c, now) = (Correlator::new(Clock::SYSTEM), Instant::now());
        for i in 0..BURST {
            written(observe(&mut c, &claim("a", "1"), "R", &i.to_string(), now));
        }
        assert!(matches!(
            observe(&mut c, &claim("a", "1"), "R", "x", now),
            Step::Deferred { .. }
        ));
        written(observe(&mut c, &claim("b", "2"), "R", "x", now));
    }

    #[test]
    fn maps_stay_bounded_and_forget_idle_entries() {
        let now = Instant::now();
        let mut lru = Bounded::new(Duration::from_secs(10), 16);
        for i in 0..1000 {
            *lru.get_or_insert_with(i, now + Duration::from_millis(i), || 0) += 1;
            assert!(lru.len() <= 16);
        }
        assert!(lru.get_mut(&999, now + Duration::from_secs(1)).is_some());
        assert!(lru.get_mut(&0, now).is_none(), "the oldest went first");
        assert!(lru.get_mut(&999, now + Duration::from_secs(60)).is_none());

        let mut c = Correlator::new(Clock::SYSTEM);
        for i in 0..(3 * CACHE_ENTRIES) {
            let object = claim(&format!("c{i}"), &i.to_string());
            observe(&mut c, &object, "R", "m", now);
        }
        assert!(c.seen.len() <= CACHE_ENTRIES && c.buckets.len() <= CACHE_ENTRIES);
        assert!(c.similar.len() <= CACHE_ENTRIES);
    }

    #[test]
    fn names_are_unique_and_valid() {
        let mut c = Correlator::new(Clock::SYSTEM);
        let long = "n".repeat(253);
        let names: Vec<String> = (0..100).map(|_| c.name(&claim(&long, "u"))).collect();
        assert!(names.iter().all(|n| n.len() <= 253));
        let distinct: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), names.len());
    }

    #[test]
    fn notes_are_escaped_and_cut() {
        let (mut c, now) = (Correlator::new(Clock::SYSTEM), Instant::now());
        let note = format!(
            "bad\n2026-01-01 INFO join granted\r\u{1b}[2K{}",
            "x".repeat(5000)
        );
        let source = source();
        let draft = Draft {
            regarding: claim("a", "1"),
            type_: "Warning",
            reason: "R",
            note: logfmt::escape_within(&note, NOTE_LIMIT),
            source: &source,
        };
        let message = written(c.observe(draft, now)).event.message.unwrap();
        assert!(message.starts_with(r"bad\n2026-01-01 INFO join granted\r\x1b[2K"));
        assert!(!message.contains(['\n', '\r', '\u{1b}']));
        assert!(message.len() < NOTE_LIMIT + 40, "{}", message.len());
        assert!(message.ends_with("more bytes cut]"), "{message}");
    }
}
