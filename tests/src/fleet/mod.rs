//! Scenarios around the real Karpenter ([`crate::karpenter::real`]): one
//! test's cluster, a machine's life to its removal, and a Deployment
//! followed to its pod on a VM. Above [`crate::machines`], whose launcher
//! they run.

pub mod cluster;
pub mod journey;
pub mod vm;
