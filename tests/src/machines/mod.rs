//! The machines the agent runs on: a simulated instance in a network
//! namespace, a bare one with IMDS and no server, a VM booting the test
//! image, and the launcher that makes each instance Karpenter launches
//! into moto one of them.

pub mod barenode;
pub mod launcher;
pub mod node;
pub mod vm;
