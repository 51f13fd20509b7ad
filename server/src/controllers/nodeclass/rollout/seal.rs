//! The rollout state's seal: an HMAC-SHA256 over the class's UID and the
//! state's exact bytes, carried with the state in the
//! [`super::ROLLOUT_ANNOTATION`].
//!
//! managedFields name who wrote a field, but any client may send
//! `fieldManager=autonode-server`: whoever may patch an EC2NodeClass could
//! write a state whose applied and last good values are theirs, and the
//! guard would then keep (hold, or revert to) them. The seal's key is known
//! to autonode-server's replicas only, so a state that opens under it was
//! written by autonode, for this class (its UID is under the MAC: a state
//! copied from another class, or from a deleted class of the same name,
//! does not open). What it cannot tell: an older state autonode itself
//! wrote for this same class, replayed (docs/design.md, threat model).

use super::{State, Values};
pub use crate::kube::seal::StateKey;
use serde::{Deserialize, Serialize};

/// What the MAC is over, first: the seal's purpose and version.
const PURPOSE: &[u8] = b"autonode.dev/rollout state v1";

/// Why a sealed state does not open.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OpenError {
    #[error("not a sealed rollout state (written by an older autonode-server, or by hand)")]
    Unsealed,
    #[error("the class has no UID")]
    NoUid,
    #[error("its MAC does not match: not written by autonode-server for this class, or under another key (--rollout-state-key-file, or --tls-key without it)")]
    Forged,
    #[error("not valid rollout state: {0}")]
    Parse(String),
    #[error("AMI selector terms {0} are not [{{id: ami-<hex>}}]")]
    AmiTerms(String),
}

/// The annotation's JSON: the state's exact text and its MAC (base64).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sealed {
    state: String,
    mac: String,
}

impl StateKey {
    /// The annotation text of `state` for the class with `uid`.
    pub fn seal(&self, uid: &str, state: &State) -> Result<String, serde_json::Error> {
        let text = serde_json::to_string(state)?;
        serde_json::to_string(&Sealed {
            mac: self.mac(PURPOSE, uid, &text),
            state: text,
        })
    }

    /// The state sealed in `annotation` for the class with `uid`, when its
    /// MAC matches and its AMI terms are `[{id: ami-<hex>}]`.
    pub fn open(&self, uid: Option<&str>, annotation: &str) -> Result<State, OpenError> {
        let sealed: Sealed = serde_json::from_str(annotation).map_err(|_| OpenError::Unsealed)?;
        let uid = uid.filter(|u| !u.is_empty()).ok_or(OpenError::NoUid)?;
        if !self.opens(PURPOSE, uid, &sealed.state, &sealed.mac) {
            return Err(OpenError::Forged);
        }
        let state: State =
            serde_json::from_str(&sealed.state).map_err(|e| OpenError::Parse(e.to_string()))?;
        let values = [Some(&state.applied), state.good.as_ref()]
            .into_iter()
            .chain([state.refused.as_ref().map(|r| &r.values)])
            .flatten();
        for v in values {
            check_ami_terms(v)?;
        }
        Ok(state)
    }
}

/// Refuses AMI terms other than autonode's own shape: one `{id: ami-<hex>}`
/// per term (what `--ami-ids` renders), nothing that selects by tag or name.
fn check_ami_terms(values: &Values) -> Result<(), OpenError> {
    let Some(terms) = &values.ami_selector_terms else {
        return Ok(());
    };
    let ok = |term: &serde_json::Value| {
        let Some(object) = term.as_object().filter(|o| o.len() == 1) else {
            return false;
        };
        object
            .get("id")
            .and_then(|id| id.as_str())
            .and_then(|id| id.strip_prefix("ami-"))
            .is_some_and(|hex| !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    if terms.iter().all(ok) {
        Ok(())
    } else {
        Err(OpenError::AmiTerms(
            serde_json::Value::from(terms.clone()).to_string(),
        ))
    }
}
