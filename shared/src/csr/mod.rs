//! Kubelet certificate signing requests: parsing and the approval rules.
//!
//! The server auto-approves a kubelet CSR only when every rule here passes,
//! so this module is deliberately strict: it accepts what kubelet (and the
//! agent) actually produce and refuses everything else, with one
//! [`CsrError`] variant per refusal so the server's log, Event and metric
//! label say exactly why.
//!
//! The flow is: [`parse_csr`] (PEM, DER, key policy, proof of possession),
//! then [`check_client_csr`] or [`check_serving_csr`] with names the server
//! took from EC2/the NodeClaim (never from the request), and for CSR objects
//! kubelet created itself, [`check_usages`] on `spec.usages`.
//!
//! Decisions worth knowing:
//!
//! - Subject: kube reads only CN (user) and O (groups), but the signers copy
//!   the whole subject into the certificate. Kubelet never sets anything
//!   else, so any other subject attribute is refused rather than signed.
//! - Names: Go's parser takes the *last* CN; two CNs are refused here so no
//!   reader can disagree about the user. SANs are collected from every
//!   extension request attribute and duplicate extensions are refused, so we
//!   never check fewer names than the signer copies.
//! - SAN types other than DNS, IP, email and URI are refused outright:
//!   kubelet never asks for them.
//! - IPv4 SANs must be 4-byte; an IPv4-mapped IPv6 SAN is compared as IPv6
//!   and so does not match an allowed IPv4 address.
//! - Keys are checked in [`parse_csr`] before the signature, because ring
//!   cannot verify RSA under 2048 bits at all and the refusal should name the
//!   key, not claim a bad signature.
//!
//! The parts: `parse` (PEM and DER to a [`ParsedCsr`], with the key policy
//! and the self-signature), `rules` (the names a client or serving CSR may
//! carry), `usages` (`spec.usages` of CSR objects) and `error` (one
//! [`CsrError`] variant per refusal).

mod error;
mod parse;
mod rules;
mod usages;

#[cfg(test)]
mod tests;

pub use error::CsrError;
pub(crate) use parse::{add_general_name, read_subject, Sans};
pub use parse::{check_key, parse_csr, KeyKind, ParsedCsr};
pub use rules::{check_client_csr, check_serving_csr, node_name_from_username};
pub use usages::{check_usages, usages_for, Purpose};

/// Prefix of a node's user name (and of its certificate's CN).
pub const NODE_USER_PREFIX: &str = "system:node:";
/// The one organization (group) a node certificate carries.
pub const NODES_GROUP: &str = "system:nodes";
/// Signer of kubelet client certificates.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Signer of kubelet serving certificates.
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// Largest PEM input accepted. An RSA-8192 CSR with a few SANs is ~3 KiB;
/// the bound keeps hostile input cheap to refuse.
pub const MAX_CSR_PEM_BYTES: usize = 64 * 1024;

/// Smallest and largest RSA modulus accepted, in bits. The upper bound caps
/// verification cost (ring refuses larger moduli too).
pub const RSA_MIN_BITS: usize = 2048;
/// See [`RSA_MIN_BITS`].
pub const RSA_MAX_BITS: usize = 8192;
