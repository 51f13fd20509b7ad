//! Kubernetes plumbing shared by the join and the leader's controllers:
//! watch-backed caches, Events, autonode's marks, the NodeClaim store, CSR
//! issuing and approval, Karpenter's types and the metrics.

/// Implements [`kube::Resource`] for a cluster-scoped type of ours that
/// reads a Kubernetes kind partly (a `metadata: ObjectMeta` field and only
/// the fields autonode reads): its kind, API group, version and plural.
macro_rules! cluster_resource {
    ($type:ty, $kind:literal, $group:literal, $version:literal, $plural:literal) => {
        impl ::kube::Resource for $type {
            type DynamicType = ();
            type Scope = ::kube::core::ClusterResourceScope;

            fn kind(_: &()) -> ::std::borrow::Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> ::std::borrow::Cow<'_, str> {
                $group.into()
            }
            fn version(_: &()) -> ::std::borrow::Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> ::std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut ::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

pub mod approval;
pub mod binding;
pub mod budget;
pub mod cache;
pub mod claim_meta;
pub mod class_meta;
pub mod condition;
pub mod csr_outcome;
pub mod events;
pub mod impostor;
pub mod in_flight;
pub mod index;
pub mod issuer;
pub mod karpenter;
pub mod marks;
pub mod metrics;
pub mod node;
pub mod nodeclaim;
pub mod reason;
pub mod reuse;
pub mod seal;
