//! The join as the node sees it: the request it sends (its identity and
//! two CSRs) and the check of the answer before anything in it is used.
//! The exchange itself is [`crate::server_client`]'s.

use crate::csr::{self, CsrError};
use crate::imds::Identity;
use crate::state::{StateDir, StateError};
use autonode_shared::protocol::{
    attested_keys_digest, InstanceIdentity, JoinRequest, JoinResponse,
};
use rcgen::{KeyPair, PublicKeyData};
use std::net::IpAddr;

/// The server's answer does not fit this node: a refusal.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unfit(pub String);

/// Why an answer was not kept.
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
    #[error("the server's answer does not fit this node: {0}")]
    Unfit(#[from] Unfit),
    #[error("saving the join answer: {0}")]
    Save(#[from] StateError),
}

/// Checks the server's answer against this node ([`check_answer`]), then
/// saves it in `state`. The check comes before anything of the answer is
/// written or used (its Ignition config runs as root later), so an answer
/// for another instance, or with values that would change kubelet's command
/// line, leaves nothing behind.
pub fn keep_answer(
    state: &StateDir,
    identity: &Identity,
    answer: &JoinResponse,
) -> Result<(), KeepError> {
    check_answer(answer, identity)?;
    Ok(state.save_response(answer)?)
}

fn refused(reason: impl Into<String>) -> Unfit {
    Unfit(reason.into())
}

/// The join request: the signed identity and a CSR for each key.
pub fn request(
    identity: &Identity,
    client_key: &KeyPair,
    serving_key: &KeyPair,
) -> Result<JoinRequest, CsrError> {
    Ok(JoinRequest {
        identity: InstanceIdentity {
            rsa2048: identity.rsa2048.clone(),
        },
        client_csr: csr::client_csr(client_key, &identity.local_hostname)?,
        serving_csr: csr::serving_csr(serving_key, &identity.local_hostname, &identity.ips)?,
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
    })
}

/// What a NitroTPM document's `user_data` must hold for a join with these
/// two keys: the digest of their SubjectPublicKeyInfo, as the CSRs carry
/// them.
pub fn keys_digest(client_key: &KeyPair, serving_key: &KeyPair) -> [u8; 32] {
    attested_keys_digest(
        &client_key.subject_public_key_info(),
        &serving_key.subject_public_key_info(),
    )
}

/// Values that end up in flags must be plain tokens: no spaces, quotes or
/// `$`, which would change the command line systemd builds.
pub(crate) fn is_token(value: &str) -> bool {
    !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"\"'\\$`,;".contains(&b))
}

/// Checks the server's answer against this node: it must name this
/// instance, and every value that ends up on kubelet's command line must be
/// a plain token. The join phase runs it on the answer as received, before
/// the answer is saved or its Ignition applied; [`crate::kubelet::write`]
/// runs it again on what it is given, as a library function must.
pub fn check_answer(answer: &JoinResponse, identity: &Identity) -> Result<(), Unfit> {
    let settings = &answer.kubelet;
    if settings.provider_id != identity.provider_id() {
        return Err(refused(format!(
            "providerID {:?} is not this instance ({})",
            settings.provider_id,
            identity.provider_id()
        )));
    }
    let name_ok = answer.node_name.len() <= 253
        && is_token(&answer.node_name)
        && answer
            .node_name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b));
    if !name_ok {
        return Err(refused(format!(
            "node name {:?} is not a DNS name",
            answer.node_name
        )));
    }
    let ip: IpAddr = settings
        .node_ip
        .parse()
        .map_err(|_| refused(format!("node IP {:?}", settings.node_ip)))?;
    if !identity.ips.contains(&ip) {
        log::warn!(
            "node IP {ip} is not among this instance's IPs {:?}",
            identity.ips
        );
    }
    if let Some(bad) = settings.register_with_taints.iter().find(|t| !is_token(t)) {
        return Err(refused(format!("taint {bad:?}")));
    }
    if let Some((k, v)) = settings
        .node_labels
        .iter()
        .find(|(k, v)| !is_token(k) || !(v.is_empty() || is_token(v)))
    {
        return Err(refused(format!("label {k:?}={v:?}")));
    }
    if !answer.api_server.starts_with("https://") || !is_token(&answer.api_server) {
        return Err(refused(format!("API server URL {:?}", answer.api_server)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::tests::{answer, identity};

    #[test]
    fn an_answer_for_another_instance_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let state = StateDir::new(dir.path().join("state"));
        let (client, serving) = (
            KeyPair::generate().expect("a key"),
            KeyPair::generate().expect("a key"),
        );
        let mut other = answer(&client, &serving);
        other.kubelet.provider_id = "aws:///us-west-2a/i-ffffffffffffffff0".into();
        let refused = keep_answer(&state, &identity(), &other).expect_err("refused");
        assert!(matches!(refused, KeepError::Unfit(_)), "{refused}");
        assert!(matches!(state.load_response(), Ok(None)));
        assert_eq!(std::fs::read_dir(dir.path()).expect("listed").count(), 0);

        let mine = answer(&client, &serving);
        keep_answer(&state, &identity(), &mine).expect("kept");
        assert!(matches!(state.load_response(), Ok(Some(_))));
    }
}
