//! Karpenter v1.14.1's CustomResourceDefinitions, byte-exact (see
//! `shared/data/karpenter-crds/README.md`): what a cluster running
//! Karpenter has. The server installs them on request; the tests install
//! them into every control plane.

/// File name and YAML of each CRD.
pub const CRDS: [(&str, &str); 3] = [
    (
        "karpenter.sh_nodeclaims.yaml",
        include_str!("../data/karpenter-crds/karpenter.sh_nodeclaims.yaml"),
    ),
    (
        "karpenter.sh_nodepools.yaml",
        include_str!("../data/karpenter-crds/karpenter.sh_nodepools.yaml"),
    ),
    (
        "karpenter.k8s.aws_ec2nodeclasses.yaml",
        include_str!("../data/karpenter-crds/karpenter.k8s.aws_ec2nodeclasses.yaml"),
    ),
];
