//! The real Kubernetes: a control plane per test, the version under test,
//! the Events on an object, and multi-document manifests.

pub mod controlplane;
pub mod events;
pub mod manifest;
pub mod version;
