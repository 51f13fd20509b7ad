//! One-shot binding of an instance to its keys and its CSR objects.
//!
//! The identity document is a bearer credential that never expires, so the
//! first verified join records on the NodeClaim which keys it presented
//! (client and serving, by SHA-256 of their SubjectPublicKeyInfo) and which
//! CSR objects it created for them (by name and UID). Later joins for the
//! same instance must present the same two keys: the agent restarting is
//! fine, anyone else holding the document is not.
//!
//! What a resume may change: the CSR bytes (the agent signs them anew each
//! run) and, within what EC2 says the instance owns, the serving CSR's
//! names. What it may not: either key. A resume reuses the recorded CSR
//! objects when they still exist under their recorded UIDs and ask for
//! what the resumed request asks; otherwise it gets new objects, and the
//! record is updated to name them.
//!
//! Every write carries the resourceVersion the decision was made on, so two
//! racing joins cannot both bind: the loser gets a conflict, re-reads, and
//! is judged against the winner's record. The record is trusted only as
//! autonode's own mark ([`marks::keep_own`]): one copied from a NodePool
//! template is ignored, and overwritten by the first real join.

use crate::kube::karpenter::{parse_aws_provider_id, NodeClaim};
use crate::kube::marks;
use crate::kube::node::Node;
use autonode_shared::csr::Purpose;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What the binding records: everything later decisions about this
/// instance rest on, written once by the join that attested it (as the
/// [`marks::BINDING`] annotation, JSON) and trusted only as autonode's own
/// mark (see [`marks::keep_own`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Record {
    /// The instance the identity document named.
    pub instance_id: String,
    /// The document's region: where to look the instance up in EC2 later
    /// (the zone cannot be trimmed to it: Local Zones such as
    /// `us-west-2-lax-1a` and Wavelength zones do not end in a letter).
    pub region: String,
    /// The node name EC2 gave (its private DNS name).
    pub node_name: String,
    /// Lowercase hex SHA-256 of the client key's SubjectPublicKeyInfo.
    pub client_key: String,
    /// Lowercase hex SHA-256 of the serving key's SubjectPublicKeyInfo.
    pub serving_key: String,
    /// The CSR objects the join created for these keys.
    pub csrs: Vec<CsrRef>,
}

/// A CSR object the join created, by name and UID: a later object of the
/// same name (deleted and re-created by someone else) is not this one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CsrRef {
    /// Recorded as `client` or `serving`.
    pub purpose: Purpose,
    pub name: String,
    pub uid: String,
}

/// The binding recorded on `claim`, if any. Only meaningful on a NodeClaim
/// that went through [`marks::keep_own`] (the NodeClaim cache's objects and
/// [`NodeClaims::get_fresh`](crate::kube::nodeclaim::NodeClaims::get_fresh)'s do).
pub fn recorded(claim: &NodeClaim) -> Result<Option<Record>, Unreadable> {
    let Some(value) = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(marks::BINDING))
    else {
        return Ok(None);
    };
    serde_json::from_str(value)
        .map(Some)
        .map_err(|e| Unreadable(e.to_string()))
}

/// The Node of `claim`, once its kubelet registered it: the one place that
/// decides which Node a NodeClaim's machine is (feedback, and through its
/// condition the rollout guard, and the capacity check all ask here).
///
/// Never by providerID alone: a node may create its own Node object with
/// any `spec.providerID` (NodeRestriction lets it choose), so a Node
/// carrying another instance's providerID would make that machine look
/// registered and Ready. The Node must be the one named as the binding
/// recorded when the instance joined (EC2's name for it, which only that
/// machine's kubelet may register under), for the bound instance, and
/// agree with Karpenter's `status.nodeName` once that is set. The renewal
/// approver makes the same checks from the Node's side, with a reason for
/// each refusal.
pub fn node_of(claim: &NodeClaim, nodes: &Store<Node>) -> Option<Arc<Node>> {
    let record = recorded(claim).ok()??;
    let node = nodes.get(&ObjectRef::new(&record.node_name))?;
    is_its_node(claim, &record, &node).then_some(node)
}

/// Whether `node` is the Node of `claim`, whose binding is `record`.
pub fn is_its_node(claim: &NodeClaim, record: &Record, node: &Node) -> bool {
    let Some(provider_id) = claim.provider_id() else {
        return false;
    };
    let node_provider_id = node.provider_id();
    let named = claim.status.as_ref().and_then(|s| s.node_name.as_deref());
    node.name_any() == record.node_name
        && node_provider_id == Some(provider_id)
        && parse_aws_provider_id(provider_id).is_some_and(|(_, id)| id == record.instance_id)
        && named.is_none_or(|n| n == record.node_name)
}

/// autonode's own binding annotation does not parse (written by another
/// version of autonode, or edited with autonode's field manager).
#[derive(Debug, Clone, thiserror::Error)]
#[error("the binding annotation cannot be read: {0}")]
pub struct Unreadable(pub String);

/// Why the binding refuses a join for good: the same request, retried,
/// would meet the same record (or the same absence).
#[derive(Debug, thiserror::Error)]
pub enum BindingRefusal {
    /// The recorded binding does not parse: refused, not ignored.
    #[error("NodeClaim {nodeclaim}: {}", .source.0)]
    Unreadable {
        nodeclaim: String,
        #[source]
        source: Unreadable,
    },
    /// Another key is bound: someone else may hold the document.
    #[error("possible replay: instance {instance_id} (NodeClaim {nodeclaim}) is bound to client key {bound}, this join used {offered}")]
    PossibleReplay {
        instance_id: String,
        nodeclaim: String,
        bound: String,
        offered: String,
    },
    /// The NodeClaim was deleted during the join.
    #[error("NodeClaim {0} was deleted during this join")]
    Gone(String),
}

/// Why a join cannot bind, or could not write its binding.
#[derive(Debug, thiserror::Error)]
pub enum BindingError {
    /// The binding refuses the join (see [`BindingRefusal`]).
    #[error(transparent)]
    Refused(#[from] BindingRefusal),
    /// Another join wrote the binding first; a retry is judged on it.
    #[error(
        "the binding of NodeClaim {0} changed during this join; the retry is judged on the new one"
    )]
    Changed(String),
    #[error("kube API: {0}")]
    Api(#[from] kube::Error),
}

/// How the join relates to the binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// First join: the record is now written.
    New,
    /// The same keys joined before: the agent is resuming.
    Resumed,
}

/// The keys a join presents, as fingerprints.
#[derive(Debug, Clone, Copy)]
pub struct Keys<'a> {
    pub client: &'a str,
    pub serving: &'a str,
}

/// What the recorded binding says about a join presenting `keys`: `None`
/// when there is none (the join binds), the record when the same keys
/// joined before (the join resumes), a refusal when any key differs.
pub fn judge(
    claim: &NodeClaim,
    instance_id: &str,
    keys: Keys<'_>,
) -> Result<Option<Record>, BindingError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let record = recorded(claim).map_err(|source| BindingRefusal::Unreadable {
        nodeclaim: name.clone(),
        source,
    })?;
    let Some(record) = record else {
        return Ok(None);
    };
    if record.client_key == keys.client && record.serving_key == keys.serving {
        return Ok(Some(record));
    }
    Err(BindingError::Refused(BindingRefusal::PossibleReplay {
        instance_id: instance_id.to_string(),
        nodeclaim: name,
        bound: format!(
            "client {} serving {}",
            short(&record.client_key),
            short(&record.serving_key)
        ),
        offered: format!(
            "client {} serving {}",
            short(keys.client),
            short(keys.serving)
        ),
    }))
}

/// The first 16 hex digits of a fingerprint, for messages.
fn short(fingerprint: &str) -> &str {
    fingerprint.get(..16).unwrap_or(fingerprint)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            instance_id: "i-1".into(),
            region: "us-west-2".into(),
            node_name: "ip-10-0-0-1.us-west-2.compute.internal".into(),
            client_key: "c".repeat(64),
            serving_key: "s".repeat(64),
            csrs: vec![CsrRef {
                purpose: Purpose::Client,
                name: "autonode-i-1-client-x".into(),
                uid: "u1".into(),
            }],
        }
    }

    fn claim(record: Option<&str>) -> NodeClaim {
        let mut c = NodeClaim::default();
        c.metadata.name = Some("c".into());
        if let Some(value) = record {
            c.metadata.annotations = Some([(marks::BINDING.to_string(), value.to_string())].into());
        }
        c
    }

    fn keys<'a>(client: &'a str, serving: &'a str) -> Keys<'a> {
        Keys { client, serving }
    }

    #[test]
    fn unbound_claims_need_a_write() {
        let (c, s) = ("c".repeat(64), "s".repeat(64));
        assert_eq!(judge(&claim(None), "i-1", keys(&c, &s)).unwrap(), None);
    }

    #[test]
    fn the_same_two_keys_resume() {
        let json = serde_json::to_string(&record()).unwrap();
        let (c, s) = ("c".repeat(64), "s".repeat(64));
        assert_eq!(
            judge(&claim(Some(&json)), "i-1", keys(&c, &s)).unwrap(),
            Some(record())
        );
    }

    #[test]
    fn another_client_or_serving_key_is_a_possible_replay() {
        let json = serde_json::to_string(&record()).unwrap();
        let (c, s, other) = ("c".repeat(64), "s".repeat(64), "o".repeat(64));
        for (client, serving) in [(&other, &s), (&c, &other)] {
            let err = judge(&claim(Some(&json)), "i-1", keys(client, serving)).unwrap_err();
            let replay = matches!(
                err,
                BindingError::Refused(BindingRefusal::PossibleReplay { .. })
            );
            assert!(replay, "{err}");
        }
    }

    #[test]
    fn an_unreadable_record_is_refused_not_ignored() {
        let (c, s) = ("c".repeat(64), "s".repeat(64));
        let err = judge(&claim(Some("ab12")), "i-1", keys(&c, &s)).unwrap_err();
        let unreadable = matches!(
            err,
            BindingError::Refused(BindingRefusal::Unreadable { .. })
        );
        assert!(unreadable, "{err}");
    }
}
