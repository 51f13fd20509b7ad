//! autonode-server as a library: the parts of the control plane half of
//! autonode that the binary, the integration tests and the test harness
//! share. The folders are the roles, and imports point down this list
//! (nothing on the join path imports the leader's controllers):
//!
//! - [`front`]: the HTTPS front, transport only. Joins and agents'
//!   progress reports arrive through [`front::api`] (HTTPS, limits, status
//!   codes); [`front::tls`] and [`front::probes`] beside them.
//! - [`join`]: one join, its files named for its steps; its module docs
//!   are the one list of those steps. Services return their own errors;
//!   [`join::refusal`] is where the join turns them into a verdict, and
//!   [`join::render`] turns a node's config inputs into JSON.
//! - [`attestation`]: attested joins (NitroTPM): the challenge's nonces,
//!   the operator's policy of which classes must attest, and the verdict
//!   on a join's evidence, which the join's attest step asks for.
//! - [`report`]: one agent report, its steps (authenticate, act) a file
//!   each, shaped as the join is: who the report speaks for and how far to
//!   believe it, then what it does to the NodeClaim.
//! - [`kube`]: Kubernetes plumbing both sides share: watch-backed caches,
//!   Events, marks, the NodeClaim store, CSR issuing and approval,
//!   Karpenter's objects, metrics.
//! - [`ec2`]: looking booting instances up in EC2 (`DescribeInstances`).
//! - [`primitives`]: one of each small concept the rest is built on (the
//!   bounded map, the token bucket, "tell once", the clock, the watches'
//!   backoff, quantities); they import none of the folders above.
//! - [`controllers`]: the leader's controllers (CSR approval, feedback on
//!   NodeClaims, capacity, EC2NodeClass upkeep and its rollout guard,
//!   CRDs), elected through a Lease and run on watches built once per kind.
//! - [`logfmt`]: the log formats, shared by the binary and [`kube::events`].

#![forbid(unsafe_code)]

pub mod attestation;
pub mod controllers;
pub mod ec2;
pub mod front;
pub mod join;
pub mod kube;
pub mod logfmt;
pub mod primitives;
pub mod report;

/// The test harness installs CRDs as `serve --install-crds` does, by this
/// path.
pub use controllers::crds;
