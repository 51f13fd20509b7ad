//! The join as the node sees it: the request it sends (its identity and
//! two CSRs) and the check of the answer before anything in it is used.
//! The exchange itself is [`crate::server_client`]'s.

use crate::csr::{self, CsrError};
use crate::imds::Identity;
use autonode_shared::protocol::{InstanceIdentity, JoinRequest, JoinResponse};
use rcgen::KeyPair;
use std::net::IpAddr;

/// The server's answer does not fit this node: a refusal.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unfit(pub String);

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

/// Values that end up in flags must be plain tokens: no spaces, quotes or
/// `$`, which would change the command line systemd builds.
pub(crate) fn is_token(value: &str) -> bool {
    !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"\"'\\$`,;".contains(&b))
}

/// Checks the server's answer against this node before any of it reaches
/// kubelet: it must name this instance, and every value that ends up on
/// kubelet's command line must be a plain token.
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
