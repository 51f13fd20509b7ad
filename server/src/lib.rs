//! autonode-server as a library: the parts of the control plane half of
//! autonode that the binary, the integration tests and the test harness
//! share.
//!
//! A join request arrives through [`api`] (HTTPS, limits) and is handled
//! by [`join`], whose module docs are the one list of its steps and the
//! modules that own them. Services return their own errors; [`refusal`]
//! is where the join turns them into a verdict. Agents' progress reports
//! arrive through [`report`].
//!
//! - [`approver`]: approves kubelet's own renewal and serving CSRs.
//! - [`ec2`]: looking booting instances up in EC2 (`DescribeInstances`).
//! - [`feedback`]: autonode's condition, milestone Events and latencies on NodeClaims.
//! - [`capacity`]: a Ready node's allocatable against what Karpenter planned with.
//! - [`rollout`]: the EC2NodeClass upkeep's guard against AMI or userData that fail.
//! - [`leader`]: Lease-based leader election; controllers run on the leader only.
//! - [`karpenter`]: Karpenter's objects as far as autonode reads them.
//! - [`tls`]: the serving certificate, reloaded when it changes.
//! - [`probes`]: `/metrics`, `/healthz`, `/readyz`.
//! - [`nodeconfig`]: the inputs of a node's config (EC2NodeClass, Ignition
//!   ConfigMaps and Secrets) from watch-backed caches; [`render`] turns them
//!   into JSON.
//! - [`cache`]: watch-backed caches that say whether they have listed and
//!   are current.
//! - [`nodeclass`]: keeps EC2NodeClasses' userData ([`userdata`]) and AMIs.
//! - [`crds`]: installs or updates Karpenter's CRDs (`--install-crds`).
//! - [`watches`]: the leader's controllers on watches built once per kind.

#![forbid(unsafe_code)]

pub mod api;
pub mod approval;
pub mod approver;
pub mod backoff;
pub mod binding;
pub mod cache;
pub mod capacity;
pub mod crds;
pub mod ec2;
pub mod events;
pub mod feedback;
pub mod issuer;
pub mod join;
pub mod karpenter;
pub mod leader;
pub mod logfmt;
pub mod marks;
pub mod metrics;
pub mod nodeclaim;
pub mod nodeclass;
pub mod nodeconfig;
pub mod probes;
pub mod refusal;
pub mod render;
pub mod report;
pub mod rollout;

pub mod tls;
pub mod userdata;
pub mod watches;
