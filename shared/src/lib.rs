//! autonode's shared library.
//!
//! Everything here is pure: bytes in, typed values or typed errors out. No
//! I/O, no clocks (a clock is passed in where time matters), no global state.
//! Both halves depend on it, so the contract between them lives here:
//!
//! - [`agentconfig`]: the agent's config document (the server writes it,
//!   the agent parses it) and the rules its values follow.
//! - [`backoff`]: the one backoff policy (initial, factor, cap, jitter,
//!   attempts) every retrying site fills with its own values.
//! - [`contract`]: the deadline's bounds, the providerID format and
//!   kubelet's file paths, named once for both halves.
//! - [`protocol`]: the JSON messages the agent and server exchange.
//! - [`identity`]: verifying AWS-signed instance identity documents
//!   (pinned certificates only) and the policy on who may join when. Its
//!   one I/O is the explicit loading of an operator's certificate files
//!   (`TrustStore::load_file`/`load_dir`); AWS's are parsed once, lazily.
//! - [`karpenter_crds`]: Karpenter's CRDs, embedded.
//! - [`labels`]: which node labels kubelet may set on itself.
//! - [`nitro`]: verifying AWS Nitro attestation documents (NitroTPM and
//!   enclaves) against a pinned root.
//! - [`pem`]: certificates written as PEM, one spelling per certificate.
//! - [`proof`]: proof that a report comes from the node's bound client key.
//! - [`csr`]: parsing kubelet CSRs and the rules for approving them.
//! - [`issued`]: checking a signed certificate against the CSR that was
//!   judged, before it goes to a node.
//! - [`ignition`]: the Ignition v3 subset autonode supports (the server
//!   validates and merges with it, the agent applies it).

#![forbid(unsafe_code)]

pub mod agentconfig;
pub mod backoff;
pub mod clock;
pub mod contract;
pub mod csr;
pub mod identity;
pub mod ignition;
pub mod issued;
pub mod karpenter_crds;
pub mod labels;
pub mod nitro;
pub mod pem;
pub mod proof;
pub mod protocol;
