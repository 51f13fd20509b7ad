//! The render-time warning: an EC2NodeClass that leaves `maxPods` or
//! `kubeReserved` unset gets nodes that differ from Karpenter's plan.
//!
//! Where the class is silent, kubelet's defaults apply on the node (110
//! pods, nothing reserved for kubelet), while Karpenter, for `amiFamily:
//! Custom`, plans with the instance type's ENI-limited pod count and EKS's
//! CPU- and pod-based `kubeReserved`. autonode invents neither (docs/server.md,
//! *Per-node config*), so it says so where the operator looks: a
//! log line and a Warning Event `KubeletSettingsUnset` on the class, when a
//! node's config is rendered from it, once per generation of the class (an
//! edit of its spec starts a new one) and per replica, not per join.

use crate::kube::events::Events;
use crate::kube::karpenter::{Ec2NodeClass, KubeletSpec};
use crate::kube::reason::Reason;

/// The `spec.kubelet` fields whose absence makes nodes differ from
/// Karpenter's plan, as the operator would write them.
pub fn unset_fields(kubelet: Option<&KubeletSpec>) -> Vec<&'static str> {
    let max_pods = kubelet.and_then(|k| k.max_pods).is_some();
    let kube_reserved = kubelet
        .and_then(|k| k.kube_reserved.as_ref())
        .is_some_and(|r| !r.is_empty());
    [
        (!max_pods).then_some("maxPods"),
        (!kube_reserved).then_some("kubeReserved"),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// What the operator is told about a class that leaves `unset` unset.
fn note(unset: &[&str]) -> String {
    let why: Vec<&str> = unset
        .iter()
        .map(|field| match *field {
            "maxPods" => {
                "spec.kubelet.maxPods is unset: kubelet on its nodes allows 110 pods, while \
                 Karpenter plans with the instance type's ENI-limited count"
            }
            _ => {
                "spec.kubelet.kubeReserved is unset: kubelet on its nodes reserves nothing for \
                 itself, while Karpenter plans with EKS's CPU- and pod-based reservation"
            }
        })
        .collect();
    format!(
        "{}. Set them so that Karpenter plans with what the nodes have; a node that turns out \
         smaller is reported as CapacityShortfall",
        why.join("; ")
    )
}

/// Called where a node's config is rendered from `class`: warns once per
/// class generation when it leaves `maxPods` or `kubeReserved` unset.
pub fn warn_unset(events: &Events, class: Option<&Ec2NodeClass>) {
    let Some(class) = class else {
        return;
    };
    let unset = unset_fields(class.spec.kubelet.as_ref());
    if unset.is_empty() {
        return;
    }
    let meta = &class.metadata;
    let name = meta.name.as_deref().unwrap_or_default();
    // Once per class generation: every join renders.
    let generation = meta.generation.unwrap_or_default().to_string();
    if !events.is_news(class, "kubelet-settings-unset", &generation) {
        return;
    }
    let note = note(&unset);
    tracing::warn!(ec2nodeclass = name, unset = ?unset, "{note}");
    events.warning(class, Reason::KubeletSettingsUnset, note);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_class_is_warned_about_the_fields_it_leaves_unset() {
        assert_eq!(unset_fields(None), ["maxPods", "kubeReserved"]);
        let empty_reserved = KubeletSpec {
            max_pods: Some(29),
            kube_reserved: Some(BTreeMap::new()),
            ..KubeletSpec::default()
        };
        assert_eq!(unset_fields(Some(&empty_reserved)), ["kubeReserved"]);
        let both = KubeletSpec {
            max_pods: Some(29),
            kube_reserved: Some(map(&[("cpu", "70m")])),
            ..KubeletSpec::default()
        };
        assert!(unset_fields(Some(&both)).is_empty());
        let note = note(&["maxPods", "kubeReserved"]);
        assert!(note.contains("spec.kubelet.maxPods is unset"), "{note}");
        assert!(
            note.contains("spec.kubelet.kubeReserved is unset"),
            "{note}"
        );
    }
}
