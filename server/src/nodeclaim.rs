//! Finding an instance's NodeClaim, and the rules it must pass.
//!
//! Lookups come from a watch-backed cache (a kube-runtime reflector), never
//! a LIST per join: a scale-out of a thousand machines must not become a
//! thousand LISTs of every NodeClaim.

use crate::binding::Record;
use crate::cache::{self, Cache};
use crate::karpenter::NodeClaim;
use crate::marks;
use crate::refusal::{JoinError, Refusal};
use kube::api::{DeleteParams, Patch, Preconditions};
use kube::{Api, Client};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

/// How long a join waits for the cache to show a NodeClaim it lacks.
pub const CACHE_GRACE: Duration = Duration::from_secs(3);

/// The NodeClaim cache.
#[derive(Clone)]
pub struct NodeClaims {
    cache: Cache<NodeClaim>,
    api: Api<NodeClaim>,
}

impl NodeClaims {
    /// Starts watching NodeClaims in the background.
    pub fn start(client: Client) -> Self {
        let api: Api<NodeClaim> = Api::all(client);
        Self {
            cache: Cache::start_filtered(api.clone(), "NodeClaim", strip),
            api,
        }
    }

    /// Waits until the first full list has arrived.
    pub async fn ready(&self) -> Result<(), JoinError> {
        self.cache
            .status
            .wait_listed()
            .await
            .map_err(|e| JoinError::Unavailable(format!("NodeClaim cache: {e}")))
    }

    /// Whether the cache has listed since its watch last failed (which
    /// implies it has listed): what `/readyz` asks. While it has not (the
    /// API server was away, the watch is backing off), a NodeClaim missing
    /// from the cache may just be one it has not seen: not a reason to
    /// refuse a machine.
    pub fn is_fresh(&self) -> bool {
        self.cache.status.is_fresh()
    }

    /// Like [`NodeClaims::by_provider_id`], but when nothing matches, gives
    /// the watch up to [`CACHE_GRACE`] to deliver a providerID Karpenter
    /// has just written, rather than refuse a machine for our cache's lag.
    pub async fn find(&self, provider_id: &str) -> Vec<Arc<NodeClaim>> {
        let deadline = tokio::time::Instant::now() + CACHE_GRACE;
        loop {
            let found = self.by_provider_id(provider_id);
            if !found.is_empty() || tokio::time::Instant::now() >= deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The NodeClaims whose `status.providerID` is exactly `provider_id`.
    /// (A scan under the cache's read lock that clones only the matches: a
    /// snapshot of every NodeClaim per lookup cost an allocation and an
    /// atomic increment per NodeClaim in the cluster.)
    pub fn by_provider_id(&self, provider_id: &str) -> Vec<Arc<NodeClaim>> {
        self.cache
            .store
            .state_filter(|c| c.provider_id() == Some(provider_id))
    }

    /// The NodeClaim as the API server has it now (for conflict handling),
    /// with only autonode's own marks.
    pub async fn get_fresh(&self, name: &str) -> Result<Option<NodeClaim>, kube::Error> {
        let mut claim = self.api.get_opt(name).await?;
        if let Some(claim) = claim.as_mut() {
            strip(claim);
        }
        Ok(claim)
    }

    /// Writes `record` as `name`'s binding, only if the NodeClaim is still
    /// at `resource_version` (the API server answers 409 otherwise).
    pub async fn write_binding(
        &self,
        name: &str,
        resource_version: Option<&str>,
        record: &Record,
    ) -> Result<(), kube::Error> {
        let value = serde_json::to_string(record).map_err(kube::Error::SerdeError)?;
        // A merge patch with metadata.resourceVersion is a precondition.
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": resource_version,
                "annotations": { marks::BINDING: value },
            }
        });
        self.api
            .patch(name, &marks::patch_params(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }

    /// Deletes a NodeClaim whose machine failed to bootstrap, so Karpenter
    /// replaces it now; only if it is still the object we judged (same
    /// uid). `Ok(false)` when it was already gone or replaced.
    pub async fn delete_failed(&self, claim: &NodeClaim) -> Result<bool, kube::Error> {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: claim.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.api.delete(&name, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The NodeClaim API.
    pub fn api(&self) -> &Api<NodeClaim> {
        &self.api
    }
}

/// What is kept of a NodeClaim (in this cache and the feedback controller's):
/// its identity, the typed spec and status (unknown fields are never
/// parsed), its labels (the renderer gives them to the node) and, of its
/// annotations, only autonode's own marks. Everything else a NodePool's
/// template copies on (annotations of any size) is dropped, as are
/// managedFields once [`keep_own_marks`] has judged the marks by them.
pub fn strip(claim: &mut NodeClaim) {
    keep_own_marks(claim);
    let marks = claim.metadata.annotations.take().and_then(|mut all| {
        all.retain(|key, _| marks::NODECLAIM_MARKS.contains(&key.as_str()));
        (!all.is_empty()).then_some(all)
    });
    let labels = claim.metadata.labels.take();
    cache::identity_only(&mut claim.metadata);
    claim.metadata.annotations = marks;
    claim.metadata.labels = labels;
}

/// Drops the `autonode.dev/*` marks on `claim` that autonode did not write
/// (see [`marks`]): from here on, nothing reads a foreign one.
fn keep_own_marks(claim: &mut NodeClaim) {
    let removed = marks::keep_own(&mut claim.metadata);
    if !removed.is_empty() {
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        tracing::warn!(nodeclaim = name, annotations = ?removed, "ignoring autonode annotations that autonode did not write (copied from a NodePool template, or set by hand)");
    }
}

/// Picks the one NodeClaim an attested instance may join as, or says why
/// there is none: exactly one match, not Registered, not deleting, and the
/// instance's `pendingTime` no earlier than the NodeClaim's creation (an
/// instance older than its claim is not the machine Karpenter launched for
/// it).
pub fn select(
    provider_id: &str,
    matches: Vec<Arc<NodeClaim>>,
    pending_time: OffsetDateTime,
) -> Result<Arc<NodeClaim>, Refusal> {
    let claim = match matches.len() {
        0 => return Err(Refusal::NoNodeClaim(provider_id.to_string())),
        1 => matches
            .into_iter()
            .next()
            .ok_or_else(|| Refusal::NoNodeClaim(provider_id.to_string()))?,
        count => {
            return Err(Refusal::ManyNodeClaims {
                provider_id: provider_id.to_string(),
                count,
            })
        }
    };
    check(&claim, pending_time)?;
    Ok(claim)
}

/// The rules one NodeClaim must pass.
pub fn check(claim: &NodeClaim, pending_time: OffsetDateTime) -> Result<(), Refusal> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    if claim.is_deleting() {
        return Err(Refusal::Deleting(name));
    }
    if claim.is_registered() {
        return Err(Refusal::AlreadyRegistered(name));
    }
    let created = claim
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| OffsetDateTime::from_unix_timestamp(t.0.as_second()).ok());
    match created {
        // The API server stores whole seconds: compare at that resolution.
        Some(created) if pending_time.unix_timestamp() >= created.unix_timestamp() => Ok(()),
        created => Err(Refusal::PendingBeforeNodeClaim {
            nodeclaim: name,
            pending: pending_time.to_string(),
            created: created
                .map(|c| c.to_string())
                .unwrap_or_else(|| "unknown".into()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use time::macros::datetime;

    fn claim(extra: serde_json::Value) -> Arc<NodeClaim> {
        let mut base = json!({
            "metadata": {"name": "c1", "creationTimestamp": "2026-01-01T10:00:00Z"},
            "spec": {},
            "status": {"providerID": "aws:///us-west-2a/i-1"},
        });
        merge(&mut base, extra);
        Arc::new(serde_json::from_value(base).unwrap())
    }

    fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
        if let (Some(b), serde_json::Value::Object(e)) = (base.as_object_mut(), extra) {
            for (k, v) in e {
                match b.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
    }

    #[test]
    fn only_labels_and_own_marks_are_kept() {
        let own = json!({
            "manager": marks::FIELD_MANAGER, "operation": "Update",
            "apiVersion": "karpenter.sh/v1", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {format!("f:{}", marks::REPORTED): {}}}},
        });
        let claim = claim(json!({"metadata": {
            "uid": "u1",
            "labels": {"team": "a"},
            "annotations": {
                marks::REPORTED: "registered",
                marks::BINDING: "copied from a NodePool",
                "big": "x".repeat(100_000),
            },
            "managedFields": [own],
            "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "o"}],
            "finalizers": ["karpenter.sh/termination"],
        }}));
        let mut claim = (*claim).clone();
        strip(&mut claim);
        let meta = serde_json::to_value(&claim.metadata).unwrap();
        assert_eq!(
            meta,
            json!({
                "name": "c1", "uid": "u1", "creationTimestamp": "2026-01-01T10:00:00Z",
                "labels": {"team": "a"},
                "annotations": {marks::REPORTED: "registered"},
            })
        );
        assert_eq!(claim.provider_id(), Some(PID));
    }

    const PID: &str = "aws:///us-west-2a/i-1";
    const AFTER: OffsetDateTime = datetime!(2026-01-01 10:00:30 UTC);

    #[test]
    fn one_fresh_claim_is_selected() {
        assert!(select(PID, vec![claim(json!({}))], AFTER).is_ok());
    }

    #[test]
    fn none_or_many_are_refused() {
        assert!(matches!(
            select(PID, vec![], AFTER),
            Err(Refusal::NoNodeClaim(_))
        ));
        let two = vec![claim(json!({})), claim(json!({}))];
        assert!(matches!(
            select(PID, two, AFTER),
            Err(Refusal::ManyNodeClaims { count: 2, .. })
        ));
    }

    #[test]
    fn registered_deleting_and_older_instances_are_refused() {
        let registered =
            claim(json!({"status": {"conditions": [{"type": "Registered", "status": "True"}]}}));
        assert!(matches!(
            select(PID, vec![registered], AFTER),
            Err(Refusal::AlreadyRegistered(_))
        ));
        let deleting = claim(json!({"metadata": {"deletionTimestamp": "2026-01-01T10:01:00Z"}}));
        assert!(matches!(
            select(PID, vec![deleting], AFTER),
            Err(Refusal::Deleting(_))
        ));
        let before = datetime!(2026-01-01 09:59:59 UTC);
        assert!(matches!(
            select(PID, vec![claim(json!({}))], before),
            Err(Refusal::PendingBeforeNodeClaim { .. })
        ));
    }
}
