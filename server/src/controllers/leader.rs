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
//! A leader also stops on its own clock: once [`Election::renew_deadline`]
//! has passed since the start of its last successful renewal, it steps
//! down, even while a renewal is still in flight. Without that, a renewal
//! held up (a busy worker thread, a slow API server) kept a replica leading
//! after the others had seen its Lease expire and taken it: two leaders for
//! as long as the request hung (seen in the fleet benchmark, up to 30 s).
//! The deadline is shorter than the Lease, so the replica has stopped
//! before any other may take over.

use crate::primitives::clock::{Clock, KubeTime};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

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
    /// Runs forever, publishing whether this replica leads.
    pub async fn run(self, client: Client, leading: watch::Sender<bool>) {
        let api: Api<Lease> = Api::namespaced(client, &self.namespace);
        let (every, deadline) = (self.renew_every, self.renew_deadline);
        let identity = self.identity.clone();
        keep_leading(every, deadline, &identity, leading, || {
            self.try_acquire_or_renew(&api)
        })
        .await;
    }

    /// One round: `Ok(true)` when this replica holds the Lease afterwards.
    async fn try_acquire_or_renew(&self, api: &Api<Lease>) -> Result<bool, kube::Error> {
        let now = self.clock.stamp();
        let Some(mut lease) = api.get_opt(&self.name).await? else {
            let created = api
                .create(&PostParams::default(), &self.lease(now, now, 0))
                .await;
            return conflict_is_loss(created.map(|_| true));
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
                .map(|_| true),
        )
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
                tracing::warn!(identity, deadline_secs = deadline.as_secs_f64(), "leader election: no renewal within the deadline; stepping down before the Lease can expire");
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

/// Runs the task `start` makes while this replica leads, and stops it
/// (aborts it) as soon as leadership is lost; starts it again on regaining.
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
        let task = tokio::spawn(start());
        while *leading.borrow_and_update() {
            if leading.changed().await.is_err() {
                break;
            }
        }
        tracing::info!(controller = what, "no longer leading: stopping");
        task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let rounds = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = rounds.clone();
        let start = Instant::now();
        tokio::spawn(keep_leading(every, deadline, "test", tx, move || {
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                if n == 0 {
                    Ok(true)
                } else {
                    // Every later renewal hangs.
                    std::future::pending::<()>().await;
                    Ok(true)
                }
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
