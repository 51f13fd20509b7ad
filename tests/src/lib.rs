//! autonode's test harness.
//!
//! - [`bench`](mod@bench): figures the tests write to `target/bench/`.
//! - [`barenode`]: an instance with IMDS (IPv4 or IPv6) and no server, for
//!   the agent binary's IMDS and proxy behaviour.
//! - [`blip`]: a loopback relay whose connections a test can cut.
//! - [`cache`]: where the setup scripts keep what they build.
//! - [`controlplane`]: a real etcd, kube-apiserver and kube-controller-manager
//!   on loopback, with the real Karpenter CRDs installed.
//! - [`helm`]: the Helm chart rendered by the real helm.
//! - [`ignition`]: the operator's Ignition ConfigMaps and Secrets.
//! - [`ignition_oracle`]: the real Ignition as the judge of autonode's
//!   Ignition support, and the corpus of cases it judges.
//! - [`fakecloud`]: the fake AWS: IMDSv2 for an instance, EC2
//!   `DescribeInstances`, and a test CA that signs identity documents in
//!   AWS's exact PKCS#7 shape; with faults on demand.
//! - [`netns`]: network namespaces where an agent finds IMDS at
//!   169.254.169.254:80, and forwarders from them to host loopback.
//! - [`joiner`]: the join protocol spoken directly (refusal and load tests).
//! - [`node`]: a simulated instance (netns, IMDS, root dir) for the agent binary.
//! - [`karpenter`]: playing Karpenter's part (NodeClaims and friends).
//! - [`karpenter_controller`]: the real Karpenter controller, against moto.
//! - [`karpenter_cluster`]: one scenario's cluster around the real
//!   Karpenter: control plane, moto, autonode-server, launcher.
//! - [`karpenter_journey`]: a machine's life under the real Karpenter, to
//!   its removal: what it leaves behind, what its disk can still do.
//! - [`karpenter_vm`]: a Deployment scaled up, followed to its pod running
//!   on a VM the real Karpenter launched and autonode joined.
//! - [`launcher`]: each instance Karpenter launches into moto becomes a
//!   machine running the agent, then a registering kubelet stand-in; or a
//!   VM running the test image, the real kubelet.
//! - [`kubeversion`]: the Kubernetes version of a binary, for flags that
//!   differ between versions.
//! - [`moto`]: moto, a third-party EC2, for the real Karpenter.
//! - [`pki`]: throwaway CAs and certificates for a test run.
//! - [`poll`]: polling until something holds, the one loop behind every
//!   wait.
//! - [`promql`]: metric and label names in PromQL expressions and in a
//!   scrape, to check alerts and dashboards against what is exported.
//! - [`proxy`]: an HTTP CONNECT proxy stand-in that records what it tunnels.
//! - [`process`]: child processes that die with their test.
//! - [`server`]: autonode-server as a real process, under the shipped RBAC.
//! - [`skew`]: earlier revisions' agents and servers, built from this
//!   repository's history, for the skew tests.
//! - [`world`]: one test's control plane, fake cloud and server together.
//! - [`vm`]: the test image booted under QEMU, a real machine for the agent.
//!
//! The cloud is the only stand-in; everything Kubernetes is real.

pub mod barenode;
pub mod bench;
pub mod blip;
pub mod cache;
pub mod controlplane;
pub mod events;
pub mod fakecloud;
pub mod helm;
pub mod hostile;
pub mod ignition;
pub mod ignition_oracle;
pub mod joiner;
pub mod karpenter;
pub mod karpenter_cluster;
pub mod karpenter_controller;
pub mod karpenter_journey;
pub mod karpenter_vm;
pub mod kubeversion;
pub mod launcher;
pub mod moto;
pub mod netns;
pub mod node;
pub mod pki;
pub mod poll;
pub mod process;
pub mod promql;
pub mod proxy;
pub mod server;
pub mod skew;
pub mod vm;
pub mod world;
