//! autonode's test harness.
//!
//! - [`controlplane`]: a real etcd, kube-apiserver and kube-controller-manager
//!   on loopback, with the real Karpenter CRDs installed.
//!
//! The cloud is the only stand-in; everything Kubernetes is real.

pub mod controlplane;
