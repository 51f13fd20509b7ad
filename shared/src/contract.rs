//! Facts both halves must agree on, named once: the deadline's bounds, the
//! providerID format, and the paths of kubelet's files. The server renders
//! and checks with these; the agent writes and reads with them.

use std::time::Duration;

/// Karpenter deletes an instance that has not registered by then, so no
/// agent deadline may be longer.
pub const MAX_DEADLINE: Duration = Duration::from_secs(900);
/// The agent's deadline when the config sets none: below Karpenter's
/// 15-minute registration limit, leaving kubelet time to register.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);

/// `aws:///<availability-zone>/<instance-id>`, as Karpenter records it.
pub fn aws_provider_id(availability_zone: &str, instance_id: &str) -> String {
    format!("aws:///{availability_zone}/{instance_id}")
}

/// The zone and instance id in an AWS provider ID, if it is one.
pub fn parse_aws_provider_id(provider_id: &str) -> Option<(&str, &str)> {
    let rest = provider_id.strip_prefix("aws:///")?;
    let (zone, instance) = rest.split_once('/')?;
    (!zone.is_empty() && instance.starts_with("i-") && !instance.contains('/'))
        .then_some((zone, instance))
}

/// Where kubelet's files live on a node: the agent writes them, the server
/// renders kubelet's config to point at them.
pub mod kubelet {
    pub const KUBECONFIG: &str = "/var/lib/kubelet/kubeconfig";
    pub const PKI_DIR: &str = "/var/lib/kubelet/pki";
    pub const CLIENT_CURRENT: &str = "/var/lib/kubelet/pki/kubelet-client-current.pem";
    pub const SERVER_CURRENT: &str = "/var/lib/kubelet/pki/kubelet-server-current.pem";
    pub const CLUSTER_CA: &str = "/etc/kubernetes/pki/ca.crt";
    pub const CONFIG: &str = "/etc/kubernetes/kubelet/config.json";
    pub const ENV_FILE: &str = "/etc/autonode/kubelet.env";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_round_trip() {
        let id = aws_provider_id("us-west-2a", "i-0123456789abcdef0");
        assert_eq!(id, "aws:///us-west-2a/i-0123456789abcdef0");
        assert_eq!(
            parse_aws_provider_id(&id),
            Some(("us-west-2a", "i-0123456789abcdef0"))
        );
        assert_eq!(parse_aws_provider_id("aws://us-west-2a/i-1"), None);
        assert_eq!(parse_aws_provider_id("aws:///us-west-2a/x-1"), None);
        assert_eq!(parse_aws_provider_id("aws:////i-1"), None);
    }
}
