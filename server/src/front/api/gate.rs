//! Who gets in: the join API's caps on connections, on TLS handshakes
//! being answered and on joins in flight, globally and per source address,
//! and the count of whom they turned away.
//!
//! The global caps bound what the server spends; the per-source ones keep
//! one address from taking all of it, so an honest machine elsewhere still
//! gets a connection and a join slot while one source floods.
//!
//! A place under a connection cap is held only while it is used: a
//! connection inside a join or a report, its body read and parsed, keeps
//! its place; any other (handshaking, sending headers or a body, idle
//! between requests) gives it up to a newcomer over the cap, the one idle
//! longest first ([`Gate::connection`]). Without that, whatever shares the nodes'
//! NAT address held every place of that source with connections that never
//! joined, and every booting node behind it was closed on accept.

use super::queue::{Caller, Holding, Queue};
use super::refusals::Refusals;
use crate::kube::metrics::{AdmissionLabels, Metrics};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The join API's load limits and timeouts.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Joins processed at once (after admission); more wait for a place
    /// (up to `join_queue_wait`), then get 503.
    pub max_concurrent_joins: usize,
    /// How long an admitted join waits, in order of arrival, for a place
    /// under `max_concurrent_joins` before it is answered 503. Waiting
    /// here instead of in the agent's backoff keeps a burst's joins going
    /// the moment a place frees, and spares a retry's TLS handshake and
    /// admission. Every agent so far waits 60 s for an answer.
    pub join_queue_wait: Duration,
    /// Joins one source may have in flight; more get 429. 0: no limit.
    pub max_joins_per_source: usize,
    /// Open connections at once; past it a newcomer takes the place of
    /// the one longest not in a join or report, or is closed on accept.
    pub max_connections: usize,
    /// Open connections from one source, likewise. 0: no limit.
    pub max_connections_per_source: usize,
    /// ClientHellos answered at once (the server's signature, made off the
    /// worker threads); more wait their turn, in order of arrival, within
    /// the handshake timeout.
    pub max_handshakes: usize,
    /// Handshakes one source may have waiting for or making that answer;
    /// more are closed at once. 0: no limit.
    pub max_handshakes_per_source: usize,
    /// Joins and reports one source may have refused (403) a second, after
    /// a burst of twice that; past it, its next handshakes wait until the
    /// budget has one again (`refusals`). 0: no limit.
    pub refusals_per_source: u32,
    /// Time allowed for the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time allowed for the request headers (on a kept-alive connection,
    /// counted from the previous answer: its idle time), and again for the
    /// body.
    pub body_timeout: Duration,
    /// Seconds a refused-for-load caller is told to wait.
    pub retry_after_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_concurrent_joins: 256,
            join_queue_wait: Duration::from_secs(10),
            max_joins_per_source: 8,
            max_connections: 4096,
            max_connections_per_source: 64,
            max_handshakes: 2,
            max_handshakes_per_source: 32,
            refusals_per_source: 16,
            handshake_timeout: Duration::from_secs(3),
            body_timeout: Duration::from_secs(5),
            retry_after_secs: 2,
        }
    }
}

/// Why a caller was turned away before any join work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turned {
    /// The global connection cap: closed on accept, or an older connection
    /// doing nothing closed to make room.
    Connections,
    /// Its source's connection cap: likewise.
    SourceConnections,
    /// The global join cap: 503.
    Joins,
    /// Its source's join cap: 429.
    SourceJoins,
    /// No place to answer its ClientHello came before its handshake's
    /// deadline: closed.
    Handshakes,
    /// Its source's handshake cap: closed at once.
    SourceHandshakes,
    /// Its source's budget of refused documents would not have a refusal
    /// left before its handshake's deadline: closed at once.
    SourceRefusals,
    /// Its ClientHello needed a HelloRetryRequest: closed, since the
    /// second ClientHello would be answered outside the handshake caps.
    HelloRetry,
    HandshakeTimeout,
    HeaderTimeout,
    BodyTimeout,
    BodyTooLarge,
}

impl Turned {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Turned::Connections => "connections",
            Turned::SourceConnections => "source_connections",
            Turned::Joins => "joins",
            Turned::SourceJoins => "source_joins",
            Turned::Handshakes => "handshakes",
            Turned::SourceHandshakes => "source_handshakes",
            Turned::SourceRefusals => "source_refusals",
            Turned::HelloRetry => "hello_retry",
            Turned::HandshakeTimeout => "handshake_timeout",
            Turned::HeaderTimeout => "header_timeout",
            Turned::BodyTimeout => "body_timeout",
            Turned::BodyTooLarge => "body_too_large",
        }
    }
}

/// How often, at most, turning callers away is logged at `warn` (each one
/// is counted and logged at `debug`): a flood must not become a log flood.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The caps, shared by every connection.
pub struct Gate {
    connections: Arc<Semaphore>,
    open: Arc<Mutex<Open>>,
    joins: Arc<Semaphore>,
    join_queue_wait: Duration,
    queue: Arc<Queue>,
    handshakes: Arc<Semaphore>,
    source_connections: PerSource,
    source_joins: PerSource,
    source_handshakes: PerSource,
    refusals: Refusals,
    metrics: Metrics,
    last_warned: Mutex<Option<Instant>>,
}

/// A place under a global cap and under its source's, given back when
/// dropped (the connection closes, the join is answered).
pub struct Pass {
    _global: OwnedSemaphorePermit,
    _source: SourceSlot,
    /// A join's place: its release counts into the queue's rate.
    _holding: Option<Holding>,
}

impl Gate {
    pub fn new(limits: &Limits, metrics: Metrics) -> Self {
        Self {
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            open: Arc::default(),
            joins: Arc::new(Semaphore::new(limits.max_concurrent_joins)),
            join_queue_wait: limits.join_queue_wait,
            queue: Arc::new(Queue::new(
                limits.join_queue_wait,
                Duration::from_secs(limits.retry_after_secs),
                limits.max_concurrent_joins,
            )),
            handshakes: Arc::new(Semaphore::new(limits.max_handshakes)),
            source_connections: PerSource::new(limits.max_connections_per_source),
            source_joins: PerSource::new(limits.max_joins_per_source),
            source_handshakes: PerSource::new(limits.max_handshakes_per_source),
            refusals: Refusals::new(limits.refusals_per_source),
            metrics,
            last_warned: Mutex::new(None),
        }
    }

    /// A place for a new connection from `peer`. Over a cap, the connection
    /// under that cap not [`Ticket::busy`] for longest is told to close and
    /// its place is `peer`'s; with none, `peer` is turned away.
    ///
    /// Only the accept loop calls this, so a place given up here is not
    /// taken by anyone else before `peer` takes it.
    pub fn connection(&self, peer: IpAddr) -> Result<Ticket, Turned> {
        let caps = (Turned::SourceConnections, Turned::Connections);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        // Two tries: making room under the source's cap frees a global
        // place too, so a second eviction is never needed, only allowed.
        for _ in 0..2 {
            let why = match take(&self.source_connections, &self.connections, peer, caps) {
                Ok(pass) => return Ok(open.admit(peer, pass, &self.open)),
                Err(why) => why,
            };
            let only = (why == Turned::SourceConnections).then(|| source_of(peer));
            let victim = open.evict(only).ok_or(why)?;
            self.turned(why, victim, None);
        }
        take(&self.source_connections, &self.connections, peer, caps)
            .map(|pass| open.admit(peer, pass, &self.open))
    }

    /// A place for an admitted join from `peer`: under its source's cap at
    /// once (over it: [`Turned::SourceJoins`]), then under the global one,
    /// waiting for it in order of arrival up to the queue's wait (then
    /// [`Turned::Joins`]); at once [`Turned::Joins`] when more wait already
    /// than the queue can serve in that time (see [`Queue`]). The source's
    /// place is held while it waits, so one source queues no more than its
    /// cap.
    pub async fn join(&self, peer: IpAddr) -> Result<Pass, Turned> {
        let caps = (Turned::SourceJoins, Turned::Joins);
        let source = self.source_joins.try_acquire(peer).ok_or(caps.0)?;
        let global = match self.joins.clone().try_acquire_owned() {
            Ok(global) => global,
            Err(_) if !self.queue.has_room(Instant::now()) => return Err(caps.1),
            Err(_) => {
                let _waiting = self.queue.enter();
                let place = self.joins.clone().acquire_owned();
                tokio::time::timeout(self.join_queue_wait, place)
                    .await
                    .map_err(|_| caps.1)?
                    .map_err(|_| caps.1)?
            }
        };
        Ok(Pass {
            _global: global,
            _source: source,
            _holding: Some(self.queue.hold()),
        })
    }

    /// A place to answer `peer`'s ClientHello (the costly part of a TLS
    /// handshake: the server's signature): once its source's budget of
    /// refusals has one left (waiting for it until `deadline`, else
    /// [`Turned::SourceRefusals`]), under its source's cap at once
    /// (over it: [`Turned::SourceHandshakes`]), then under the global one,
    /// waiting for it in order of arrival until `deadline` (then
    /// [`Turned::Handshakes`]). The source's place is held while it waits,
    /// so one source has no more than its cap in the line, and a flood
    /// from a few sources does not push everyone else's handshakes back.
    pub async fn handshake(
        &self,
        peer: IpAddr,
        deadline: tokio::time::Instant,
    ) -> Result<Pass, Turned> {
        self.refusals
            .paid(source_of(peer), deadline)
            .await
            .map_err(|_| Turned::SourceRefusals)?;
        let source = self
            .source_handshakes
            .try_acquire(peer)
            .ok_or(Turned::SourceHandshakes)?;
        let place = self.handshakes.clone().acquire_owned();
        let global = tokio::time::timeout_at(deadline, place)
            .await
            .map_err(|_| Turned::Handshakes)?
            .map_err(|_| Turned::Handshakes)?;
        Ok(Pass {
            _global: global,
            _source: source,
            _holding: None,
        })
    }

    /// How long a join turned away now (for either join cap) should wait
    /// before it comes back: its turn in the queue when the queue is past
    /// what it can serve (as far off as the caller's patience allows; the
    /// same turn again to an instance told one), else `--retry-after`'s
    /// floor.
    pub fn retry_after(&self, caller: &Caller<'_>) -> Duration {
        self.queue.retry_after(Instant::now(), caller)
    }

    /// Counts a join or report refused to `peer` into its source's budget
    /// of refusals.
    pub fn refused(&self, peer: IpAddr) {
        self.refusals.charge(source_of(peer));
    }

    /// Counts and logs a caller turned away.
    pub fn turned(&self, why: Turned, peer: IpAddr, request_id: Option<&str>) {
        let reason = why.reason();
        self.metrics
            .join_admission_refused
            .get_or_create(&AdmissionLabels { reason })
            .inc();
        let request_id = request_id.unwrap_or("-");
        tracing::debug!(%peer, request_id, reason, "join API turned a caller away");
        if self.warn_due() {
            tracing::warn!(%peer, request_id, reason, "join API turning callers away (counted in autonode_join_admission_refused_total; logged at most every 10 s)");
        }
    }

    fn warn_due(&self) -> bool {
        let mut last = self
            .last_warned
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < WARN_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }
}

/// The connections holding a place, and those not busy by how long they
/// have been so.
#[derive(Default)]
struct Open {
    /// Gives ticket ids and idle times alike: later is larger.
    next: u64,
    entries: HashMap<u64, Entry>,
    /// The ticket ids of connections not busy, by when they became so. A
    /// connection that just answered a join counts from its answer, so it
    /// is the last to give its place while the answer is still being sent.
    idle: BTreeMap<u64, u64>,
}

/// One connection's place, and how to close it.
struct Entry {
    peer: IpAddr,
    source: IpAddr,
    /// Since when it is not busy (its key in [`Open::idle`]); `None`
    /// inside a join or a report: not to be closed for a newcomer.
    idle_since: Option<u64>,
    close: Arc<Notify>,
    _pass: Pass,
}

impl Open {
    fn tick(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn admit(&mut self, peer: IpAddr, pass: Pass, open: &Arc<Mutex<Open>>) -> Ticket {
        let id = self.tick();
        let close = Arc::new(Notify::new());
        let entry = Entry {
            peer,
            source: source_of(peer),
            idle_since: Some(id),
            close: close.clone(),
            _pass: pass,
        };
        self.entries.insert(id, entry);
        self.idle.insert(id, id);
        Ticket {
            id,
            open: open.clone(),
            close,
        }
    }

    /// Closes the connection idle longest (from source `only`, if given),
    /// giving its place back; its peer.
    fn evict(&mut self, only: Option<IpAddr>) -> Option<IpAddr> {
        let (since, id) = self
            .idle
            .iter()
            .find(|(_, id)| {
                let source = self.entries.get(id).map(|e| e.source);
                only.is_none_or(|only| source == Some(only))
            })
            .map(|(since, id)| (*since, *id))?;
        self.idle.remove(&since);
        let entry = self.entries.remove(&id)?;
        // A stored permit: the connection closes even if it is not
        // waiting yet.
        entry.close.notify_one();
        Some(entry.peer)
    }

    fn set_busy(&mut self, id: u64, busy: bool) {
        let now = self.tick();
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        match (busy, entry.idle_since) {
            (true, Some(since)) => {
                entry.idle_since = None;
                self.idle.remove(&since);
            }
            (false, None) => {
                entry.idle_since = Some(now);
                self.idle.insert(now, id);
            }
            _ => {}
        }
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        if let Some(since) = entry.idle_since {
            self.idle.remove(&since);
        }
        Some(entry)
    }
}

/// A connection's place: given back when dropped, or taken by a newcomer
/// while the connection is not [`Ticket::busy`] (then [`Ticket::closed`]
/// completes).
pub struct Ticket {
    id: u64,
    open: Arc<Mutex<Open>>,
    close: Arc<Notify>,
}

/// Keeps a connection's place while a join or report is handled.
pub struct Busy<'a>(&'a Ticket);

impl Ticket {
    /// Completes once the place was given to a newcomer: close.
    pub async fn closed(&self) {
        self.close.notified().await;
    }

    /// Holds the place until the guard is dropped; no-op if it is gone.
    pub fn busy(&self) -> Busy<'_> {
        self.set_busy(true);
        Busy(self)
    }

    fn set_busy(&self, busy: bool) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.set_busy(self.id, busy);
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.set_busy(false);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = open.remove(self.id);
        // Its place is given back outside the lock.
        drop(open);
        drop(entry);
    }
}

/// Places held, by source.
type Held = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// A place under `source`'s cap for `peer`, then under `global`: the
/// source's first, so one over its share does not touch the global cap.
fn take(
    source: &PerSource,
    global: &Arc<Semaphore>,
    peer: IpAddr,
    (source_full, global_full): (Turned, Turned),
) -> Result<Pass, Turned> {
    let source = source.try_acquire(peer).ok_or(source_full)?;
    let global = global
        .clone()
        .try_acquire_owned()
        .map_err(|_| global_full)?;
    Ok(Pass {
        _global: global,
        _source: source,
        _holding: None,
    })
}

/// Counts what each source holds, up to a limit per source.
#[derive(Clone)]
pub struct PerSource {
    /// 0: no limit (and nothing is tracked).
    limit: usize,
    held: Held,
}

/// One place a source holds; dropping it gives the place back. (Sources
/// holding nothing are forgotten, so the map is bounded by what is open.)
pub struct SourceSlot {
    held: Option<(Held, IpAddr)>,
}

impl PerSource {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            held: Arc::default(),
        }
    }

    /// A place for `peer`'s source, or `None` if it holds the limit.
    pub fn try_acquire(&self, peer: IpAddr) -> Option<SourceSlot> {
        if self.limit == 0 {
            return Some(SourceSlot { held: None });
        }
        let source = source_of(peer);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(source).or_insert(0);
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(SourceSlot {
            held: Some((self.held.clone(), source)),
        })
    }

    /// Places `peer`'s source holds now.
    #[cfg(test)]
    fn held_by(&self, peer: IpAddr) -> usize {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(&source_of(peer)).copied().unwrap_or(0)
    }

    /// Sources holding anything.
    #[cfg(test)]
    fn sources(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let Some((held, source)) = self.held.take() else {
            return;
        };
        let mut held = held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&source) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&source);
            }
        }
    }
}

/// The source a peer address counts as: an IPv4 address as it is (an
/// IPv4-mapped IPv6 one as the IPv4 it maps), an IPv6 address by its /64,
/// the block one host is usually given and can pick addresses from.
pub fn source_of(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_source_gets_its_limit_and_no_more_and_others_are_unaffected() {
        let limiter = PerSource::new(2);
        let a = [
            limiter.try_acquire(ip("10.0.0.1")),
            limiter.try_acquire(ip("10.0.0.1")),
        ];
        assert!(a.iter().all(Option::is_some));
        assert!(limiter.try_acquire(ip("10.0.0.1")).is_none());
        assert!(limiter.try_acquire(ip("10.0.0.2")).is_some());
        assert_eq!(limiter.held_by(ip("10.0.0.1")), 2);
    }

    #[test]
    fn places_come_back_when_dropped_and_idle_sources_are_forgotten() {
        let limiter = PerSource::new(1);
        let held = limiter.try_acquire(ip("10.0.0.1"));
        assert!(limiter.try_acquire(ip("10.0.0.1")).is_none());
        drop(held);
        assert_eq!(limiter.sources(), 0);
        let again = limiter.try_acquire(ip("10.0.0.1"));
        assert!(again.is_some());
        assert_eq!(limiter.sources(), 1);
    }

    #[test]
    fn zero_means_no_limit() {
        let limiter = PerSource::new(0);
        let held: Vec<_> = (0..1000)
            .map(|_| limiter.try_acquire(ip("10.0.0.1")))
            .collect();
        assert!(held.iter().all(Option::is_some));
        assert_eq!(limiter.sources(), 0);
    }

    /// A refusal counts against the peer's source, as the caps count it: an
    /// IPv6 caller's whole /64 waits for it, another /64 does not.
    #[tokio::test(start_paused = true)]
    async fn refusals_count_against_the_source_an_ipv6_one_by_its_64() {
        let limits = Limits {
            refusals_per_source: 1,
            ..Limits::default()
        };
        let gate = Gate::new(&limits, Metrics::new());
        for _ in 0..3 {
            gate.refused(ip("2001:db8::1"));
        }
        let now = tokio::time::Instant::now();
        let same = gate.handshake(ip("2001:db8::2"), now).await.err();
        assert_eq!(same, Some(Turned::SourceRefusals));
        assert!(gate.handshake(ip("2001:db8:0:1::1"), now).await.is_ok());
    }

    #[test]
    fn ipv6_counts_by_its_64_and_mapped_ipv4_as_ipv4() {
        let limiter = PerSource::new(1);
        let _held = limiter.try_acquire(ip("2001:db8:1:2::1"));
        assert!(limiter.try_acquire(ip("2001:db8:1:2:ffff::9")).is_none());
        assert!(limiter.try_acquire(ip("2001:db8:1:3::1")).is_some());
        let _v4 = limiter.try_acquire(ip("192.0.2.7"));
        assert!(limiter.try_acquire(ip("::ffff:192.0.2.7")).is_none());
    }

    fn gate(connections: usize, per_source: usize) -> Gate {
        let limits = Limits {
            max_connections: connections,
            max_connections_per_source: per_source,
            max_concurrent_joins: 1,
            max_joins_per_source: 1,
            ..Limits::default()
        };
        Gate::new(&limits, Metrics::new())
    }

    /// Whether `ticket` was told to close (without waiting for it).
    fn told_to_close(ticket: &Ticket) -> bool {
        let closed = std::pin::pin!(ticket.closed());
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        closed.poll(&mut cx).is_ready()
    }

    #[tokio::test]
    async fn the_gate_checks_the_source_before_the_global_cap() {
        let gate = gate(3, 2);
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        let held: Vec<Ticket> = [a, a, b].map(|p| gate.connection(p).unwrap()).into();
        let _busy: Vec<Busy<'_>> = held.iter().map(Ticket::busy).collect();
        assert_eq!(gate.connection(a).err(), Some(Turned::SourceConnections));
        assert_eq!(gate.connection(b).err(), Some(Turned::Connections));
        let _join = gate.join(a).await.ok();
        assert_eq!(gate.join(a).await.err(), Some(Turned::SourceJoins));
        assert_eq!(gate.join(b).await.err(), Some(Turned::Joins));
    }

    /// Past the queue's room (here, before any join finished: as many as
    /// `MIN_QUEUE`, 64) a join is turned away at once, not after the wait,
    /// and told when to come back; those waiting still get their turns.
    #[tokio::test]
    async fn past_the_queues_room_a_join_is_turned_away_at_once() {
        let limits = Limits {
            max_concurrent_joins: 1,
            join_queue_wait: Duration::from_secs(30),
            max_joins_per_source: 0,
            ..Limits::default()
        };
        let gate = Arc::new(Gate::new(&limits, Metrics::new()));
        let peer = ip("10.0.0.1");
        let held = gate.join(peer).await.unwrap();
        let waiting: Vec<_> = (0..64)
            .map(|_| {
                let gate = gate.clone();
                tokio::spawn(async move { gate.join(peer).await.map(drop) })
            })
            .collect();
        while gate.queue.waiting_now() < 64 {
            tokio::task::yield_now().await;
        }
        let started = Instant::now();
        assert_eq!(gate.join(peer).await.err(), Some(Turned::Joins));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "turned away at once"
        );
        let caller = Caller {
            instance: "i-0123456789abcdef0",
            patience: None,
        };
        assert!(gate.retry_after(&caller) >= Duration::from_secs(15));
        drop(held);
        for waiter in waiting {
            assert_eq!(waiter.await.unwrap(), Ok(()));
        }
    }

    #[tokio::test]
    async fn a_join_over_the_global_cap_waits_its_turn_then_is_turned_away() {
        let wait = Duration::from_secs(2);
        let limits = Limits {
            max_concurrent_joins: 1,
            join_queue_wait: wait,
            ..Limits::default()
        };
        let gate = Arc::new(Gate::new(&limits, Metrics::new()));
        let (a, b, c) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"));
        let first = gate.join(a).await.unwrap();
        // The second waits for the first's place, and gets it when freed.
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.join(b).await.map(|_| ()) }
        });
        tokio::time::sleep(wait / 10).await;
        assert!(!waiting.is_finished(), "it waits for a place");
        drop(first);
        assert_eq!(waiting.await.unwrap(), Ok(()));
        // With the place held past the queue's wait: 503's verdict.
        let held = gate.join(a).await.unwrap();
        let started = Instant::now();
        assert_eq!(gate.join(c).await.err(), Some(Turned::Joins));
        assert!(started.elapsed() >= wait, "turned away before its wait");
        drop(held);
    }

    /// One place to answer ClientHellos, two per source: a source's third
    /// handshake is closed at once, without touching the global line;
    /// another source's waits its turn until its deadline, and gets a
    /// place freed before it.
    #[tokio::test]
    async fn handshakes_wait_their_turn_and_a_source_holds_no_more_than_its_cap() {
        let limits = Limits {
            max_handshakes: 1,
            max_handshakes_per_source: 2,
            ..Limits::default()
        };
        let gate = Arc::new(Gate::new(&limits, Metrics::new()));
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        let soon = || tokio::time::Instant::now() + Duration::from_millis(200);
        let far = tokio::time::Instant::now() + Duration::from_secs(30);
        let answering = gate.handshake(a, far).await.unwrap();
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.handshake(a, far).await.map(drop) }
        });
        while gate.source_handshakes.held_by(a) < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            gate.handshake(a, far).await.err(),
            Some(Turned::SourceHandshakes)
        );
        assert_eq!(
            gate.handshake(b, soon()).await.err(),
            Some(Turned::Handshakes)
        );
        assert_eq!(gate.source_handshakes.held_by(b), 0, "given back");
        drop(answering);
        assert_eq!(waiting.await.unwrap(), Ok(()));
        assert!(gate.handshake(b, soon()).await.is_ok());
    }

    #[test]
    fn over_its_sources_cap_a_newcomer_takes_the_place_of_its_oldest_idle_connection() {
        let gate = gate(10, 2);
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        let other = gate.connection(b).unwrap();
        let first = gate.connection(a).unwrap();
        let second = gate.connection(a).unwrap();
        let third = gate.connection(a).unwrap();
        assert!(
            told_to_close(&first),
            "the oldest of the source's is closed"
        );
        assert!(!told_to_close(&second) && !told_to_close(&third));
        assert!(!told_to_close(&other), "another source's is not");
        assert_eq!(gate.source_connections.held_by(a), 2);
        drop(first);
        assert_eq!(gate.source_connections.held_by(a), 2, "given once");
    }

    #[test]
    fn a_connection_inside_a_join_keeps_its_place_and_gives_it_up_after() {
        let gate = gate(10, 2);
        let a = ip("10.0.0.1");
        let joining = gate.connection(a).unwrap();
        let idle = gate.connection(a).unwrap();
        let busy = joining.busy();
        let newcomer = gate.connection(a).unwrap();
        assert!(told_to_close(&idle) && !told_to_close(&joining));
        let _busy_too = newcomer.busy();
        assert_eq!(gate.connection(a).err(), Some(Turned::SourceConnections));
        drop(busy);
        assert!(gate.connection(a).is_ok());
        assert!(told_to_close(&joining), "idle again after its join");
    }

    #[test]
    fn a_connection_that_just_answered_a_join_is_the_last_to_give_its_place() {
        let gate = gate(10, 2);
        let a = ip("10.0.0.1");
        let (joined, idle) = (gate.connection(a).unwrap(), gate.connection(a).unwrap());
        drop(joined.busy());
        let _newcomer = gate.connection(a).unwrap();
        assert!(told_to_close(&idle) && !told_to_close(&joined));
    }

    #[test]
    fn over_the_global_cap_the_oldest_idle_connection_anywhere_makes_room() {
        let gate = gate(2, 0);
        let (a, b, c) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"));
        let oldest = gate.connection(a).unwrap();
        let busy_one = gate.connection(b).unwrap();
        let _busy = busy_one.busy();
        let newcomer = gate.connection(c).unwrap();
        assert!(told_to_close(&oldest) && !told_to_close(&busy_one));
        let _also = newcomer.busy();
        assert_eq!(gate.connection(a).err(), Some(Turned::Connections));
    }
}
