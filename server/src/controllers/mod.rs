//! The leader's controllers: they run on the elected replica only, on
//! watches built once per kind, and keep Karpenter's objects and kubelet's
//! CSRs in the state autonode promises.

pub mod approver;
pub mod capacity;
pub mod crds;
pub mod feedback;
pub mod leader;
pub mod nodeclass;
pub mod watches;
