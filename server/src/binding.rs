//! One-shot binding of an instance to its client key.
//!
//! The identity document is a bearer credential that never expires, so the
//! first verified join records the SHA-256 of its client public key on the
//! NodeClaim. Later joins for the same instance must present that same key:
//! the agent restarting is fine, anyone else holding the document is not.
//!
//! The write carries the resourceVersion the decision was made on, so two
//! racing joins cannot both bind: the loser gets a conflict, re-reads, and
//! is judged against the winner's key.

use crate::karpenter::{NodeClaim, BINDING_ANNOTATION};
use crate::nodeclaim::NodeClaims;
use crate::refusal::{JoinError, Refusal};
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// How the join relates to the binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// First join: the key is now recorded.
    New,
    /// The same key joined before: the agent is resuming.
    Resumed,
}

/// Binds `claim`'s instance to `key` or checks it is already bound to it.
pub async fn bind(
    claims: &NodeClaims,
    claim: &NodeClaim,
    instance_id: &str,
    key: &str,
) -> Result<Binding, JoinError> {
    if let Some(decided) = judge(claim, instance_id, key)? {
        return Ok(decided);
    }
    let name = claim.metadata.name.clone().unwrap_or_default();
    match write(
        claims,
        &name,
        claim.metadata.resource_version.as_deref(),
        key,
    )
    .await
    {
        Ok(()) => Ok(Binding::New),
        // Someone changed the NodeClaim since our cache saw it: judge again
        // on what the API server has now; a second conflict is a retry.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let fresh = claims
                .get_fresh(&name)
                .await?
                .ok_or_else(|| Refusal::NoNodeClaim(name.clone()))?;
            if let Some(decided) = judge(&fresh, instance_id, key)? {
                return Ok(decided);
            }
            write(
                claims,
                &name,
                fresh.metadata.resource_version.as_deref(),
                key,
            )
            .await?;
            Ok(Binding::New)
        }
        Err(e) => Err(e.into()),
    }
}

/// `Some` when the existing annotation decides the matter.
fn judge(claim: &NodeClaim, instance_id: &str, key: &str) -> Result<Option<Binding>, Refusal> {
    match claim.bound_key() {
        None => Ok(None),
        Some(bound) if bound == key => Ok(Some(Binding::Resumed)),
        Some(bound) => Err(Refusal::PossibleReplay {
            instance_id: instance_id.to_string(),
            nodeclaim: claim.metadata.name.clone().unwrap_or_default(),
            bound: bound.to_string(),
            offered: key.to_string(),
        }),
    }
}

async fn write(
    claims: &NodeClaims,
    name: &str,
    resource_version: Option<&str>,
    key: &str,
) -> Result<(), kube::Error> {
    // A merge patch with metadata.resourceVersion is a precondition: the
    // API server answers 409 if the object changed since that version.
    let patch = json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": { BINDING_ANNOTATION: key },
        }
    });
    claims
        .api()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(bound: Option<&str>) -> NodeClaim {
        let mut c = NodeClaim::default();
        c.metadata.name = Some("c".into());
        if let Some(key) = bound {
            c.metadata.annotations =
                Some([(BINDING_ANNOTATION.to_string(), key.to_string())].into());
        }
        c
    }

    #[test]
    fn unbound_claims_need_a_write() {
        assert_eq!(judge(&claim(None), "i-1", "k").unwrap(), None);
    }

    #[test]
    fn the_same_key_resumes() {
        assert_eq!(
            judge(&claim(Some("k")), "i-1", "k").unwrap(),
            Some(Binding::Resumed)
        );
    }

    #[test]
    fn another_key_is_a_possible_replay() {
        let err = judge(&claim(Some("k")), "i-1", "other").unwrap_err();
        assert_eq!(err.reason(), "possible_replay");
    }
}
