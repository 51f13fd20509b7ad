//! The kept fields: the apply configuration that writes them, which of a
//! class's differ from it, and the rollout guard's values pinned into it.

use super::{Desired, MetadataOptionsPolicy, AMI_FAMILY, HOP_LIMIT, HTTP_ENDPOINT, HTTP_TOKENS};
use crate::controllers::nodeclass::rollout::Values;
use crate::controllers::nodeclass::userdata::{Format, Rendered};
use crate::kube::karpenter::Ec2NodeClassSpec;
use serde_json::{json, Value};

/// Which kept fields of `spec` differ from the settings, userData in
/// `format` (empty: none).
pub fn drift(spec: &Ec2NodeClassSpec, desired: &Desired, format: Format) -> Vec<&'static str> {
    let mut fields = Vec::new();
    if spec.user_data.as_deref() != Some(desired.user_data.get(format)) {
        fields.push("spec.userData");
    }
    if spec.ami_family.as_deref() != Some(AMI_FAMILY) {
        fields.push("spec.amiFamily");
    }
    if let Some(terms) = &desired.ami_terms {
        if &spec.ami_selector_terms != terms {
            fields.push("spec.amiSelectorTerms");
        }
    }
    if desired.metadata_options == MetadataOptionsPolicy::Enforce {
        // Absent counts as drift: the API server fills in Karpenter's
        // defaults (the kept values), so only a schema without them leaves
        // a key out, and then it is written.
        let options = spec.metadata_options.clone().unwrap_or_default();
        if options.http_tokens.as_deref() != Some(HTTP_TOKENS) {
            fields.push("spec.metadataOptions.httpTokens");
        }
        if options.http_put_response_hop_limit != Some(HOP_LIMIT) {
            fields.push("spec.metadataOptions.httpPutResponseHopLimit");
        }
        if options.http_endpoint.as_deref() != Some(HTTP_ENDPOINT) {
            fields.push("spec.metadataOptions.httpEndpoint");
        }
    }
    fields
}

/// The apply configuration, userData in `format`: always every kept field,
/// because server-side apply removes a field its manager applied before
/// and now leaves out.
pub fn applied(name: &str, desired: &Desired, format: Format) -> Value {
    let user_data = desired.user_data.get(format);
    let mut spec = json!({ "userData": user_data, "amiFamily": AMI_FAMILY });
    if let Some(terms) = &desired.ami_terms {
        spec["amiSelectorTerms"] = Value::Array(terms.clone());
    }
    if desired.metadata_options == MetadataOptionsPolicy::Enforce {
        // Only the kept keys: the user's others (httpProtocolIPv6) stay
        // theirs, since metadataOptions is a granular map, not atomic.
        spec["metadataOptions"] = json!({
            "httpEndpoint": HTTP_ENDPOINT,
            "httpPutResponseHopLimit": HOP_LIMIT,
            "httpTokens": HTTP_TOKENS,
        });
    }
    json!({
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": { "name": name },
        "spec": spec,
    })
}

/// `desired` with userData and the AMI terms pinned to `values` (the
/// rollout guard's), in every format: the class uses one.
pub(super) fn pinned(desired: &Desired, values: &Values) -> Desired {
    Desired {
        user_data: Rendered {
            toml: values.user_data.clone(),
            ignition: values.user_data.clone(),
        },
        ami_terms: values.ami_selector_terms.clone(),
        metadata_options: desired.metadata_options,
    }
}
