//! The integration suite: every scenario runs the real binaries against a
//! real etcd, kube-apiserver and kube-controller-manager, with only the cloud
//! (IMDS, EC2) faked.
//!
//! One test binary, one module per area: each extra binary would link kube,
//! rustls and the AWS signer again, which costs minutes of link time and
//! gigabytes of disk on a clean CI machine.

mod agent_imds;
mod agent_join;
mod agent_proxy;
mod alerts;
mod attacks;
mod attested;
mod budget;
mod burst;
mod capacity;
mod controlplane;
mod docs_links;
mod ec2_lookup;
mod events;
mod feedback;
mod helm;
mod hostile;
mod ignition_check;
mod ignition_oracle;
mod imports;
mod join;
mod karpenter_budget;
mod karpenter_lifecycle;
mod karpenter_real;
mod karpenter_rollout;
mod karpenter_upgrade;
mod karpenter_vm;
mod layout;
mod limits;
mod memory;
mod msrv;
mod nodeclass;
mod nodeclass_admission;
mod nodeconfig;
mod packaging;
mod rbac;
mod release_signing;
mod renewal;
mod reports;
mod resilience;
mod rollout;
mod skew;
mod surface;
mod userdata_oracle;
mod versions;
mod vm;
