//! Who gets in: the join API's caps on connections and on joins in flight,
//! globally and per source address, and the count of whom they turned away.
//!
//! The global caps bound what the server spends; the per-source ones keep
//! one address from taking all of it, so an honest machine elsewhere still
//! gets a connection and a join slot while one source floods.

use crate::kube::metrics::{AdmissionLabels, Metrics};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The join API's load limits and timeouts.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Joins processed at once (after admission); more get 503.
    pub max_concurrent_joins: usize,
    /// Joins one source may have in flight; more get 429. 0: no limit.
    pub max_joins_per_source: usize,
    /// Open connections at once; more are closed on accept.
    pub max_connections: usize,
    /// Open connections from one source; more are closed on accept.
    /// 0: no limit.
    pub max_connections_per_source: usize,
    /// Time allowed for the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time allowed for the request headers, and again for the body.
    pub body_timeout: Duration,
    /// Seconds a refused-for-load caller is told to wait.
    pub retry_after_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_concurrent_joins: 256,
            max_joins_per_source: 8,
            max_connections: 4096,
            max_connections_per_source: 64,
            handshake_timeout: Duration::from_secs(3),
            body_timeout: Duration::from_secs(5),
            retry_after_secs: 2,
        }
    }
}

/// Why a caller was turned away before any join work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turned {
    /// The global connection cap: closed on accept.
    Connections,
    /// Its source's connection cap: closed on accept.
    SourceConnections,
    /// The global join cap: 503.
    Joins,
    /// Its source's join cap: 429.
    SourceJoins,
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
    joins: Arc<Semaphore>,
    source_connections: PerSource,
    source_joins: PerSource,
    metrics: Metrics,
    last_warned: Mutex<Option<Instant>>,
}

/// A place under a global cap and under its source's, given back when
/// dropped (the connection closes, the join is answered).
pub struct Pass {
    _global: OwnedSemaphorePermit,
    _source: SourceSlot,
}

impl Gate {
    pub fn new(limits: &Limits, metrics: Metrics) -> Self {
        Self {
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            joins: Arc::new(Semaphore::new(limits.max_concurrent_joins)),
            source_connections: PerSource::new(limits.max_connections_per_source),
            source_joins: PerSource::new(limits.max_joins_per_source),
            metrics,
            last_warned: Mutex::new(None),
        }
    }

    /// A place for a new connection from `peer`.
    pub fn connection(&self, peer: IpAddr) -> Result<Pass, Turned> {
        let why = (Turned::SourceConnections, Turned::Connections);
        take(&self.source_connections, &self.connections, peer, why)
    }

    /// A place for an admitted join from `peer`.
    pub fn join(&self, peer: IpAddr) -> Result<Pass, Turned> {
        take(
            &self.source_joins,
            &self.joins,
            peer,
            (Turned::SourceJoins, Turned::Joins),
        )
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

    #[test]
    fn ipv6_counts_by_its_64_and_mapped_ipv4_as_ipv4() {
        let limiter = PerSource::new(1);
        let _held = limiter.try_acquire(ip("2001:db8:1:2::1"));
        assert!(limiter.try_acquire(ip("2001:db8:1:2:ffff::9")).is_none());
        assert!(limiter.try_acquire(ip("2001:db8:1:3::1")).is_some());
        let _v4 = limiter.try_acquire(ip("192.0.2.7"));
        assert!(limiter.try_acquire(ip("::ffff:192.0.2.7")).is_none());
    }

    #[test]
    fn the_gate_checks_the_source_before_the_global_cap() {
        let limits = Limits {
            max_connections: 3,
            max_connections_per_source: 2,
            max_concurrent_joins: 1,
            max_joins_per_source: 1,
            ..Limits::default()
        };
        let gate = Gate::new(&limits, Metrics::new());
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        let _held = [gate.connection(a).ok(), gate.connection(a).ok()];
        assert_eq!(gate.connection(a).err(), Some(Turned::SourceConnections));
        let _third = gate.connection(b).ok();
        assert_eq!(gate.connection(b).err(), Some(Turned::Connections));
        let _join = gate.join(a).ok();
        assert_eq!(gate.join(a).err(), Some(Turned::SourceJoins));
        assert_eq!(gate.join(b).err(), Some(Turned::Joins));
    }
}
