//! Metadata options that let a pod read IMDS, when autonode does not keep
//! them: found, logged and told once per change as a Warning Event.

use super::{Context, HOP_LIMIT};
use crate::kube::karpenter::{Ec2NodeClass, Ec2NodeClassSpec};
use crate::kube::reason::Reason;

/// What of `spec.metadataOptions` lets a pod on the class's nodes read IMDS
/// (empty: nothing). Absent keys are Karpenter's defaults, which are safe.
pub fn exposures(spec: &Ec2NodeClassSpec) -> Vec<String> {
    let options = spec.metadata_options.clone().unwrap_or_default();
    let mut found = Vec::new();
    if options.http_tokens.as_deref() == Some("optional") {
        found.push("httpTokens is optional (IMDSv1 answers any request, no token needed)".into());
    }
    if let Some(hops) = options
        .http_put_response_hop_limit
        .filter(|hops| *hops > HOP_LIMIT)
    {
        found.push(format!(
            "httpPutResponseHopLimit is {hops} (a pod, one hop further, gets IMDSv2 tokens)"
        ));
    }
    found
}

/// What [`Events::is_news`](crate::kube::events::Events::is_news) tells once
/// per change: the ways a class exposes IMDS to pods.
const EXPOSED_TOPIC: &str = "instance-metadata-exposed";

impl Context {
    /// Logs and records a Warning Event when `class` exposes IMDS to pods
    /// and that exposure was not already reported.
    pub(super) fn warn_exposures(&self, class: &Ec2NodeClass, name: &str) {
        let found = exposures(&class.spec);
        if found.is_empty() {
            self.settings.events.settled(class, EXPOSED_TOPIC);
            return;
        }
        let found = found.join("; ");
        if !self.settings.events.is_news(class, EXPOSED_TOPIC, &found) {
            return;
        }
        tracing::warn!(
            nodeclass = %name,
            exposures = %found,
            "EC2NodeClass lets pods read instance metadata (--enforce-metadata-options=false)"
        );
        self.settings.events.warning(
            class,
            Reason::InstanceMetadataExposed,
            format!(
                "spec.metadataOptions: {found}. Any pod on these nodes can read the instance \
                 identity document, the credential a machine joins with, and the node's IAM \
                 role credentials. autonode-server does not keep metadataOptions \
                 (--enforce-metadata-options=false)"
            ),
        );
    }
}
