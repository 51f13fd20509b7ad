//! `spec.usages`: what the server puts on the CSR objects it creates, and
//! what it accepts on the ones kubelet creates itself.

use std::collections::HashSet;

use super::{CsrError, KeyKind, CLIENT_SIGNER, SERVING_SIGNER};

const USAGE_DIGITAL_SIGNATURE: &str = "digital signature";
const USAGE_KEY_ENCIPHERMENT: &str = "key encipherment";
const USAGE_CLIENT_AUTH: &str = "client auth";
const USAGE_SERVER_AUTH: &str = "server auth";

/// Which kubelet certificate a CSR is for. Serialized as its
/// [`as_str`](Purpose::as_str) word, as the server's binding records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Purpose {
    /// Client certificate (signer [`CLIENT_SIGNER`]).
    Client,
    /// Serving certificate (signer [`SERVING_SIGNER`]).
    Serving,
}

impl Purpose {
    /// Both purposes, in the order a join asks for them.
    pub const ALL: [Purpose; 2] = [Purpose::Client, Purpose::Serving];

    /// `client` or `serving`: the word in CSR object names, binding records
    /// and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Client => "client",
            Purpose::Serving => "serving",
        }
    }

    /// The extended usage this purpose requires ("client auth"/"server auth").
    fn auth_usage(self) -> &'static str {
        match self {
            Purpose::Client => USAGE_CLIENT_AUTH,
            Purpose::Serving => USAGE_SERVER_AUTH,
        }
    }

    /// The kube-controller-manager signer for this purpose.
    pub fn signer(self) -> &'static str {
        match self {
            Purpose::Client => CLIENT_SIGNER,
            Purpose::Serving => SERVING_SIGNER,
        }
    }
}

/// Checks `spec.usages` of a CSR object kubelet created itself (renewals).
///
/// The rule: `"digital signature"` and the purpose's `"client auth"` /
/// `"server auth"` are required; `"key encipherment"` is optional, except
/// for RSA keys where it is required; nothing else; no duplicates.
///
/// Why: kube-controller-manager up to 1.24 signs only exactly {digital
/// signature, key encipherment, client/server auth}; 1.25+ also signs the
/// set without key encipherment. Kubelet up to 1.26 always sends all three;
/// 1.27+ drops key encipherment for non-RSA keys only. So an RSA CSR
/// without it did not come from kubelet, and any other set would either not
/// be signed or grant more than a kubelet needs.
pub fn check_usages(usages: &[String], purpose: Purpose, key: &KeyKind) -> Result<(), CsrError> {
    let allowed = usages_for(purpose);
    let mut seen = HashSet::new();
    for usage in usages {
        if !allowed.contains(&usage.as_str()) {
            return Err(CsrError::UnexpectedUsage {
                unexpected: usage.clone(),
                found: usages.to_vec(),
                allowed: allowed.to_vec(),
            });
        }
        if !seen.insert(usage.as_str()) {
            return Err(CsrError::DuplicateUsage {
                duplicate: usage.clone(),
                found: usages.to_vec(),
            });
        }
    }
    let mut required = vec![USAGE_DIGITAL_SIGNATURE, purpose.auth_usage()];
    if matches!(key, KeyKind::Rsa { .. }) {
        required.push(USAGE_KEY_ENCIPHERMENT);
    }
    match required.into_iter().find(|r| !seen.contains(r)) {
        Some(missing) => Err(CsrError::MissingUsage {
            missing,
            found: usages.to_vec(),
        }),
        None => Ok(()),
    }
}

/// The usages the server puts on CSR objects it creates: all three, which
/// every kube-controller-manager version signs, whatever the key type.
pub fn usages_for(purpose: Purpose) -> [&'static str; 3] {
    [
        USAGE_DIGITAL_SIGNATURE,
        USAGE_KEY_ENCIPHERMENT,
        purpose.auth_usage(),
    ]
}
