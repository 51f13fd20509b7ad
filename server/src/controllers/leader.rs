//! Leader election with a `coordination.k8s.io/v1` Lease.
//!
//! Every replica serves joins; only the leader runs the controllers (CSR
//! approver, EC2NodeClass upkeep, NodeClaim feedback), so two replicas never
//! judge the same object at once. The leader renews the Lease every
//! [`Election::renew_every`]; when it stops (crash, partition), another
//! replica takes over once the Lease has gone unrenewed for its duration.
//! Writes carry the resourceVersion they were decided on, so two replicas
//! racing for an expired Lease cannot both win.

use crate::primitives::clock::{Clock, KubeTime};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use std::time::Duration;
use tokio::sync::watch;

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
    /// What "now" is for renewals and expiry.
    pub clock: Clock,
}

impl Election {
    /// Runs forever, publishing whether this replica leads.
    pub async fn run(self, client: Client, leading: watch::Sender<bool>) {
        let api: Api<Lease> = Api::namespaced(client, &self.namespace);
        let mut tick = tokio::time::interval(self.renew_every);
        loop {
            tick.tick().await;
            let now_leading = match self.try_acquire_or_renew(&api).await {
                Ok(leads) => leads,
                Err(e) => {
                    tracing::warn!(error = %e, lease = %self.name, "leader election: cannot reach the Lease");
                    // Without a renewal we may already have lost it: stop
                    // acting as leader rather than risk two leaders.
                    false
                }
            };
            if *leading.borrow() != now_leading {
                tracing::info!(identity = %self.identity, leading = now_leading, "leadership changed");
                leading.send_replace(now_leading);
            }
        }
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
