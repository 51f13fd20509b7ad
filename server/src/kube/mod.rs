//! Kubernetes plumbing shared by the join and the leader's controllers:
//! watch-backed caches, Events, autonode's marks, the NodeClaim store, CSR
//! issuing and approval, Karpenter's types and the metrics.

pub mod approval;
pub mod binding;
pub mod budget;
pub mod cache;
pub mod class_meta;
pub mod condition;
pub mod csr_outcome;
pub mod events;
pub mod impostor;
pub mod index;
pub mod issuer;
pub mod karpenter;
pub mod marks;
pub mod metrics;
pub mod node;
pub mod nodeclaim;
pub mod reason;
pub mod reuse;
pub mod seal;
