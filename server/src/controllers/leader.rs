//! Leader election with a `coordination.k8s.io/v1` Lease.
//!
//! Every replica serves joins; only the leader runs the controllers (CSR
//! approver, EC2NodeClass upkeep, NodeClaim feedback), so two replicas never
//! judge the same object at once. The leader renews the Lease every
//! [`Election::renew_every`]; when it stops (crash, partition), another
//! replica takes over once the Lease has gone unrenewed for its duration.
//! Writes carry the resourceVersion they were decided on, so two replicas
//! racing for an expired Lease cannot both win.
//!
//! Two rules keep a leader from leading past its Lease:
//!
//! - **Its own thread.** The election runs on a thread of its own (named
//!   `election`) with its own single-threaded runtime and its own client
//!   ([`Election::start`]), as the probes do: the worker threads are what
//!   the joins and the controllers keep busy, and a renewal queued behind
//!   them (parsing a list of 10,000 Nodes, fat EC2NodeClasses) went out
//!   after the Lease had expired for the others. Two replicas led at once
//!   in the fleet benchmark (docs/benchmarks.md, "Two leaders").
//! - **A renew deadline.** A leader whose renewal has not succeeded within
//!   [`Election::renew_deadline`] of the start of its last successful one
//!   stops leading, in flight or not (a partition, an API server that does
//!   not answer): the deadline is shorter than the Lease, so it has
//!   stopped before any other replica may take the Lease. The controllers
//!   are dropped at their next poll after that ([`while_leading`]).

use crate::primitives::clock::{Clock, KubeTime};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use prometheus_client::metrics::gauge::Gauge;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use thiserror::Error;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

/// Why the election could not be started.
#[derive(Debug, Error)]
pub enum ElectionError {
    #[error("the election's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("the election's client: {0}")]
    Client(kube::Error),
    #[error("the election's thread: {0}")]
    Thread(std::io::Error),
}

/// Lease settings.
#[derive(Debug, Clone)]
pub struct Election {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How often the leader renews, and others check.
    pub renew_every: Duration,
    /// How long after the start of its last successful renewal a leader
    /// keeps leading without another: less than `lease_duration`, so that
    /// it has stepped down before another replica may take the Lease.
    pub renew_deadline: Duration,
    /// What "now" is for renewals and expiry.
    pub clock: Clock,
}

impl Election {
    /// Starts the election on a thread of its own (named `election`), with
    /// its own single-threaded runtime and a client of its own made from
    /// `config`, so that no renewal waits behind the worker threads'
    /// work; keeps `gauge` (`autonode_leader`) at whether this replica
    /// leads, from that thread too. The receiver says whether this replica
    /// leads.
    pub fn start(
        self,
        config: kube::Config,
        gauge: Gauge,
    ) -> Result<watch::Receiver<bool>, ElectionError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ElectionError::Runtime)?;
        // The client's connection and request queue are tasks of the
        // runtime it is made in: this one.
        let client = {
            let _inside = runtime.enter();
            Client::try_from(config).map_err(ElectionError::Client)?
        };
        let (tx, rx) = watch::channel(false);
        let mut watching = rx.clone();
        std::thread::Builder::new()
            .name("election".into())
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::spawn(async move {
                        loop {
                            gauge.set(i64::from(*watching.borrow_and_update()));
                            if watching.changed().await.is_err() {
                                return;
                            }
                        }
                    });
                    self.run(client, tx).await;
                });
            })
            .map_err(ElectionError::Thread)?;
        Ok(rx)
    }

    /// Runs forever, publishing whether this replica leads.
    pub async fn run(self, client: Client, leading: watch::Sender<bool>) {
        let api: Api<Lease> = Api::namespaced(client, &self.namespace);
        let (every, deadline) = (self.renew_every, self.renew_deadline);
        let identity = self.identity.clone();
        let written = Mutex::new(None);
        keep_leading(every, deadline, &identity, leading, || {
            self.try_acquire_or_renew(&api, &written)
        })
        .await;
    }

    /// One round: `Ok(true)` when this replica holds the Lease afterwards.
    /// `written` is the Lease as this replica last wrote it, while it
    /// leads: a leader renews that one in a single request (as client-go's
    /// leader does), half the round trips of a read and a write, which is
    /// what an overloaded API server makes long.
    async fn try_acquire_or_renew(
        &self,
        api: &Api<Lease>,
        written: &Mutex<Option<Lease>>,
    ) -> Result<bool, kube::Error> {
        let now = self.clock.stamp();
        let last = written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut lease) = last {
            let spec = lease.spec.clone().unwrap_or_default();
            let acquired = spec.acquire_time.map_or(now, |t| t.0);
            lease.spec = self
                .lease(now, acquired, spec.lease_transitions.unwrap_or(0))
                .spec;
            // With the resourceVersion last written: a 409 says someone
            // else wrote it since, and it is read again below.
            match api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
            {
                Ok(lease) => return Ok(self.keep(written, lease)),
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        let Some(mut lease) = api.get_opt(&self.name).await? else {
            let created = api
                .create(&PostParams::default(), &self.lease(now, now, 0))
                .await;
            return conflict_is_loss(created.map(|lease| self.keep(written, lease)));
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        if !ours && !expired(&spec, now) {
            return Ok(false);
        }
        let (acquired, transitions) = match (ours, &spec.acquire_time) {
            (true, Some(t)) => (t.0, spec.lease_transitions.unwrap_or(0)),
            _ => (now, spec.lease_transitions.unwrap_or(0) + 1),
        };
        lease.spec = self.lease(now, acquired, transitions).spec;
        // `replace` sends the resourceVersion we read: a racing replica
        // makes this a 409 instead of a second leader.
        conflict_is_loss(
            api.replace(&self.name, &PostParams::default(), &lease)
                .await
                .map(|lease| self.keep(written, lease)),
        )
    }

    /// Remembers `lease`, just written by this replica, for its next
    /// renewal; true (it leads).
    fn keep(&self, written: &Mutex<Option<Lease>>, lease: Lease) -> bool {
        *written.lock().unwrap_or_else(PoisonError::into_inner) = Some(lease);
        true
    }

    fn lease(&self, now: Timestamp, acquired: Timestamp, transitions: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.lease_duration.as_secs().max(1) as i32),
                acquire_time: Some(MicroTime(acquired)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(transitions),
                ..Default::default()
            }),
        }
    }
}

/// Whether the holder has gone unrenewed for longer than the Lease lasts.
fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(renewed) = spec.renew_time.as_ref() else {
        return true;
    };
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(0)));
    renewed
        .0
        .checked_add(duration)
        .map_or(true, |until| until < now)
        || spec
            .holder_identity
            .as_deref()
            .unwrap_or_default()
            .is_empty()
}

/// The election's loop, apart from the Lease so that its timing can be
/// tested: every `every`, one `round` (`Ok(true)`: this replica holds the
/// Lease); a leader whose round has not succeeded within `deadline` of the
/// start of its last successful one stops leading, in flight or not.
async fn keep_leading<F, Fut>(
    every: Duration,
    deadline: Duration,
    identity: &str,
    leading: watch::Sender<bool>,
    mut round: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, kube::Error>>,
{
    let mut tick = tokio::time::interval(every);
    // A round that ran long is followed by one round, not a burst.
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The start of the last round that left this replica holding the Lease.
    let mut held_since: Option<Instant> = None;
    loop {
        tick.tick().await;
        let started = Instant::now();
        let budget = held_since.map_or(deadline, |held| {
            (held + deadline).saturating_duration_since(started)
        });
        let now_leading = match tokio::time::timeout(budget, round()).await {
            Ok(Ok(leads)) => leads,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, identity, "leader election: cannot reach the Lease");
                // Without a renewal we may already have lost it: stop
                // acting as leader rather than risk two leaders.
                false
            }
            Err(_) => {
                tracing::warn!(
                    identity,
                    deadline_secs = deadline.as_secs_f64(),
                    "leader election: no renewal within the deadline; stepping down before the Lease can expire"
                );
                false
            }
        };
        held_since = now_leading.then_some(started);
        if *leading.borrow() != now_leading {
            tracing::info!(identity, leading = now_leading, "leadership changed");
            leading.send_replace(now_leading);
        }
    }
}

fn conflict_is_loss(result: Result<bool, kube::Error>) -> Result<bool, kube::Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        other => other,
    }
}

/// Runs the task `start` makes while this replica leads, and stops it as
/// soon as leadership is lost; starts it again on regaining. Leadership is
/// checked before each poll of the task, so a replica that has stopped
/// leading does no more of the leader's work after the poll under way,
/// however long the worker threads take to get to this loop's abort.
pub async fn while_leading<F, Fut>(mut leading: watch::Receiver<bool>, what: &'static str, start: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        while !*leading.borrow_and_update() {
            if leading.changed().await.is_err() {
                return;
            }
        }
        tracing::info!(controller = what, "leading: starting");
        let task = tokio::spawn(only_while_leading(leading.clone(), start()));
        while *leading.borrow_and_update() {
            if leading.changed().await.is_err() {
                break;
            }
        }
        tracing::info!(controller = what, "no longer leading: stopping");
        task.abort();
    }
}

/// Polls `work` until it ends or this replica stops leading, looking at
/// leadership first at every poll (dropping `work` then).
async fn only_while_leading(
    mut leading: watch::Receiver<bool>,
    work: impl std::future::Future<Output = ()>,
) {
    tokio::select! {
        biased;
        _ = leading.wait_for(|leads| !*leads) => {}
        () = work => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn spec(holder: &str, renewed_secs_ago: i64, duration: i32) -> LeaseSpec {
        let renewed = Clock::SYSTEM.stamp() - SignedDuration::from_secs(renewed_secs_ago);
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(renewed)),
            ..Default::default()
        }
    }

    /// A leader whose renewal hangs steps down at the deadline, before the
    /// Lease it last renewed can expire for the others (fails without the
    /// deadline: the hung round would keep it leading).
    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_renewal_hangs_steps_down_before_its_lease_expires() {
        let (every, deadline, lease) = (
            Duration::from_secs(5),
            Duration::from_secs(10),
            Duration::from_secs(15),
        );
        let (tx, mut rx) = watch::channel(false);
        let rounds = Arc::new(AtomicUsize::new(0));
        let counted = rounds.clone();
        let start = Instant::now();
        tokio::spawn(keep_leading(every, deadline, "test", tx, move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if n > 0 {
                    // Every renewal after the first hangs.
                    std::future::pending::<()>().await;
                }
                Ok(true)
            }
        }));
        rx.wait_for(|leads| *leads).await.expect("leads");
        rx.wait_for(|leads| !*leads).await.expect("steps down");
        let stepped_down = start.elapsed();
        assert!(
            stepped_down >= deadline && stepped_down < lease,
            "stepped down after {stepped_down:?}: the deadline is {deadline:?}, the Lease {lease:?}"
        );
    }

    /// Renewals that take a while but succeed within the deadline keep a
    /// leader leading: the deadline is no reason to flap.
    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_renewals_succeed_keeps_leading() {
        let (every, deadline) = (Duration::from_secs(5), Duration::from_secs(10));
        let (tx, mut rx) = watch::channel(false);
        let changes = Arc::new(AtomicUsize::new(0));
        tokio::spawn(keep_leading(every, deadline, "test", tx, || async {
            // Slow, but well inside the deadline.
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok(true)
        }));
        rx.wait_for(|leads| *leads).await.expect("leads");
        let counted = changes.clone();
        let watcher = tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(changes.load(Ordering::SeqCst), 0, "leadership changed");
        watcher.abort();
    }

    /// Once leadership is lost the work is not polled again, whoever runs
    /// the loop that aborts it.
    #[tokio::test]
    async fn work_is_not_polled_once_leadership_is_lost() {
        let (tx, rx) = watch::channel(true);
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = polls.clone();
        let work = async move {
            loop {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        };
        let task = tokio::spawn(only_while_leading(rx, work));
        while polls.load(Ordering::SeqCst) < 3 {
            tokio::task::yield_now().await;
        }
        tx.send_replace(false);
        let seen = polls.load(Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stopped")
            .expect("not aborted");
        assert_eq!(
            polls.load(Ordering::SeqCst),
            seen,
            "polled after losing leadership"
        );
    }

    #[test]
    fn a_renewed_lease_is_held_and_a_stale_one_is_free() {
        let now = Clock::SYSTEM.stamp();
        assert!(!expired(&spec("a", 5, 15), now));
        assert!(expired(&spec("a", 16, 15), now));
        assert!(expired(&spec("", 1, 15), now), "a released Lease is free");
        assert!(
            expired(&LeaseSpec::default(), now),
            "a Lease never renewed is free"
        );
    }
}
