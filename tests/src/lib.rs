//! autonode's test harness, in folders by role. Each folder imports only
//! the ones above it in this list (the imports test holds that), so a part
//! can be read without the ones that use it; the layout test holds that
//! every module is named here.
//!
//! The harness's own machinery ([`harness`]):
//! - [`harness::bench`]: figures the tests write to `target/bench/`.
//! - [`harness::cache`]: where the setup scripts keep what they build.
//! - [`harness::pki`]: throwaway CAs and certificates for a test run.
//! - [`harness::poll`]: polling until something holds, the one loop behind
//!   every wait.
//! - [`harness::process`]: child processes that die with their test.
//!
//! The real Kubernetes ([`kube`]):
//! - [`kube::controlplane`]: a real etcd, kube-apiserver and
//!   kube-controller-manager on loopback, with the real Karpenter CRDs
//!   installed.
//! - [`kube::version`]: the Kubernetes version of a binary, for flags that
//!   differ between versions, and the pins under test.
//! - [`kube::events`]: the Events on an object, as kubectl shows them.
//! - [`kube::manifest`]: multi-document YAML manifests: split, joined,
//!   applied and deleted.
//!
//! The clouds ([`cloud`]):
//! - [`cloud::fakecloud`]: the fake AWS: IMDSv2 for an instance, EC2
//!   `DescribeInstances`, and a test CA that signs identity documents in
//!   AWS's exact PKCS#7 shape; with faults on demand; and a test Nitro PKI
//!   whose NitroTPM documents have AWS's shape (`nitro-tpm-attest-standin`
//!   plays AWS's `nitro-tpm-attest` on a simulated instance).
//! - [`cloud::moto`]: moto, a third-party EC2, for the real Karpenter.
//!
//! The network between the parts ([`network`]):
//! - [`network::netns`]: network namespaces where an agent finds IMDS at
//!   169.254.169.254:80, and forwarders from them to host loopback.
//! - [`network::blip`]: a loopback relay whose connections a test can cut.
//! - [`network::proxy`]: an HTTP CONNECT proxy stand-in that records what
//!   it tunnels.
//!
//! The two Karpenters ([`karpenter`]):
//! - [`karpenter::standin`]: playing Karpenter's part (NodeClaims and
//!   friends), for tests that need its objects and not its decisions.
//! - [`karpenter::real`]: the real Karpenter controller, against moto.
//!
//! Callers of the join API that are not the agent ([`callers`]):
//! - [`callers::joiner`]: the join protocol spoken directly (refusal and
//!   load tests).
//! - [`callers::hostile`]: hostile callers: their own source addresses,
//!   bodies that never finish, documents the policy refuses.
//!
//! autonode-server and what is around it ([`server`]: the server as a real
//! process, under the shipped RBAC):
//! - [`server::attestation`]: a server that makes one class attest
//!   (NitroTPM) with a test Nitro PKI, and an honest machine's evidence.
//! - [`server::helm`]: the Helm chart rendered by the real helm.
//! - [`server::ignition`]: the operator's Ignition ConfigMaps and Secrets.
//! - [`server::skew`]: earlier revisions' agents and servers, built from
//!   this repository's history, for the skew tests.
//! - [`server::world`]: one test's control plane, fake cloud and server
//!   together.
//!
//! The machines the agent runs on ([`machines`]):
//! - [`machines::node`]: a simulated instance (netns, IMDS, root dir) for
//!   the agent binary.
//! - [`machines::barenode`]: an instance with IMDS (IPv4 or IPv6) and no
//!   server, for the agent binary's IMDS and proxy behaviour.
//! - [`machines::vm`]: the test image booted under QEMU, a real machine
//!   for the agent.
//! - [`machines::launcher`]: each instance Karpenter launches into moto
//!   becomes a machine running the agent, then a registering kubelet
//!   stand-in; or a VM running the test image, the real kubelet.
//!
//! Scenarios around the real Karpenter ([`fleet`]):
//! - [`fleet::cluster`]: one scenario's cluster around the real Karpenter:
//!   control plane, moto, autonode-server, launcher.
//! - [`fleet::journey`]: a machine's life under the real Karpenter, to its
//!   removal: what it leaves behind, what its disk can still do.
//! - [`fleet::vm`]: a Deployment scaled up, followed to its pod running on
//!   a VM the real Karpenter launched and autonode joined.
//!
//! The judges of what autonode writes ([`oracles`]):
//! - [`oracles::ignition`]: the real Ignition as the judge of autonode's
//!   Ignition support, and the corpus of cases it judges.
//! - [`oracles::promql`]: metric and label names in PromQL expressions and
//!   in a scrape, to check alerts and dashboards against what is exported.
//!
//! The cloud is the only stand-in; everything Kubernetes is real.

pub mod callers;
pub mod cloud;
pub mod fleet;
pub mod harness;
pub mod karpenter;
pub mod kube;
pub mod machines;
pub mod network;
pub mod oracles;
pub mod server;
