//! Tells Karpenter's capacity guess from the node's truth.
//!
//! Karpenter bin-packs pods onto a machine before it exists, with the
//! allocatable it computes for the instance type and writes on the
//! NodeClaim (`status.allocatable`). For `amiFamily: Custom` it computes it
//! with EKS's reservations and the ENI-limited pod count unless the
//! EC2NodeClass's `spec.kubelet` says otherwise, while the node's kubelet
//! runs with what autonode rendered from that same `spec.kubelet` (kubelet's
//! defaults where it is silent). When the node turns out smaller, the pods
//! Karpenter launched it for do not fit, stay pending, and Karpenter
//! launches another machine: a quiet, expensive loop. So:
//!
//! - When a node is Ready, the feedback controller ([`crate::controllers::feedback`])
//!   calls [`Check::run`] once per NodeClaim: its Node's `status.allocatable`
//!   (cpu, memory, pods, ephemeral-storage) against the NodeClaim's. A
//!   resource short by more than the [`Tolerance`] gets a Warning Event
//!   `CapacityShortfall` on the NodeClaim and on its EC2NodeClass, naming
//!   the resource, both amounts and the `spec.kubelet` field to set, and
//!   counts in `autonode_capacity_shortfalls_total{nodeclass,resource}`.
//!   "Once" survives restarts and leader changes: [`CHECKED`] joins the
//!   milestones in the NodeClaim's [`crate::kube::marks::REPORTED`] mark, written
//!   before anything is reported.
//! - When a node's config is rendered from a class that leaves `maxPods` or
//!   `kubeReserved` unset, [`warn_unset`](crate::join::render::unset::warn_unset) says so (a log line and a Warning
//!   Event on the class), once per class generation.
//!
//! The amounts are read by [`quantity`](crate::primitives::quantity), exactly.

#[cfg(test)]
mod tests;

pub use crate::primitives::quantity::{
    Quantity, QuantityError, Resource, MAX_LEN as QUANTITY_MAX_LEN,
};

use crate::kube::events::Events;
use crate::kube::karpenter::{Ec2NodeClass, NodeClaim};
use crate::kube::metrics::{CapacityLabels, Metrics};
use crate::kube::node::Node;
use crate::kube::reason::Reason;
use kube::{Api, Client, Resource as _, ResourceExt};
use std::collections::BTreeMap;
use std::fmt;

/// The entry in a NodeClaim's [`crate::kube::marks::REPORTED`] mark once its
/// capacity was compared (whatever the comparison found).
pub const CHECKED: &str = "capacity";
/// The default of `--capacity-tolerance`, in percent.
pub const DEFAULT_TOLERANCE_PERCENT: u32 = 5;

/// Whether a NodeClaim's `reported` mark says its capacity was compared.
pub fn checked(reported: &str) -> bool {
    reported.split(',').any(|r| r == CHECKED)
}

/// How much smaller than Karpenter's figure a node may be before it is
/// reported: a share of the expected amount. Karpenter's memory figure is
/// itself an estimate (the instance type's memory less a fixed VM overhead
/// share), so a node a little under it is normal; the mismatches this is
/// for (a pod limit, a reservation or an eviction threshold the class does
/// not state) are larger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tolerance {
    percent: u32,
}

impl Tolerance {
    /// A tolerance of `percent` of the expected amount (at most 100).
    pub fn percent(percent: u32) -> Self {
        Tolerance {
            percent: percent.min(100),
        }
    }

    /// Whether `missing` of `expected` is within it.
    fn allows(self, missing: i128, expected: i128) -> bool {
        missing.saturating_mul(100) <= expected.saturating_mul(i128::from(self.percent))
    }
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance::percent(DEFAULT_TOLERANCE_PERCENT)
    }
}

/// A resource the node has less of than Karpenter expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    pub resource: Resource,
    /// The node's allocatable, as it wrote it.
    pub node: String,
    /// The NodeClaim's, as Karpenter wrote it.
    pub expected: String,
    /// How much less, in thousandths.
    pub missing: i128,
    /// `missing` as a share of what was expected, in percent (rounded down).
    pub percent: i128,
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} on the node, {} expected ({} less, {}%; set {})",
            self.resource.name(),
            self.node,
            self.expected,
            self.resource.amount(self.missing),
            self.percent,
            self.resource.fields()
        )
    }
}

/// The resources `node` (its allocatable) has less of than `expected` (the
/// NodeClaim's), beyond `tolerance`. A resource either side does not state,
/// or states in a form that is not a quantity, is not compared.
pub fn shortfalls(
    expected: &BTreeMap<String, String>,
    node: &BTreeMap<String, String>,
    tolerance: Tolerance,
) -> Vec<Shortfall> {
    Resource::ALL
        .into_iter()
        .filter_map(|resource| {
            let name = resource.name();
            let (want, have) = (expected.get(name)?, node.get(name)?);
            let (want_q, have_q) = match (want.parse::<Quantity>(), have.parse::<Quantity>()) {
                (Ok(want), Ok(have)) => (want.milli(), have.milli()),
                (want, have) => {
                    tracing::debug!(resource = name, expected = ?want, node = ?have, "allocatable not compared: not a quantity");
                    return None;
                }
            };
            let missing = want_q - have_q;
            if want_q <= 0 || missing <= 0 || tolerance.allows(missing, want_q) {
                return None;
            }
            Some(Shortfall {
                resource,
                node: have.clone(),
                expected: want.clone(),
                missing,
                percent: missing.saturating_mul(100) / want_q,
            })
        })
        .collect()
}

/// The compared resources of a Node's `status.allocatable`.
pub fn node_allocatable(node: &Node) -> &BTreeMap<String, String> {
    // Only those are kept of a Node (crate::kube::node).
    &node.status.allocatable
}

/// What the operator is told about `found` on the Node `node` of a
/// NodeClaim launched from the EC2NodeClass `class`.
pub fn note(found: &[Shortfall], node: &str, class: &str) -> String {
    let each: Vec<String> = found.iter().map(Shortfall::to_string).collect();
    format!(
        "Node {node} has less allocatable than Karpenter planned for, so pods it placed here may \
         not fit and it may launch more machines: {}. Set them in EC2NodeClass {class} so that \
         Karpenter plans with what its nodes have",
        each.join("; ")
    )
}

/// The capacity check's settings and the API it reads classes through.
#[derive(Clone)]
pub struct Check {
    tolerance: Tolerance,
    classes: Api<Ec2NodeClass>,
}

impl Check {
    /// A check with `tolerance`, reading EC2NodeClasses through `client`.
    pub fn new(client: Client, tolerance: Tolerance) -> Self {
        Check {
            tolerance,
            classes: Api::all(client),
        }
    }

    /// Compares `node` (Ready) with `claim`'s expectation and reports any
    /// shortfall: a log line, a Warning Event on the NodeClaim and on its
    /// EC2NodeClass, the metric. The caller has recorded [`CHECKED`].
    pub async fn run(&self, claim: &NodeClaim, node: &Node, events: &Events, metrics: &Metrics) {
        let Some(expected) = claim.status.as_ref().map(|s| &s.allocatable) else {
            return;
        };
        let found = shortfalls(expected, node_allocatable(node), self.tolerance);
        if found.is_empty() {
            return;
        }
        let class = claim
            .spec
            .node_class_ref
            .as_ref()
            .map_or("", |r| r.name.as_str());
        for shortfall in &found {
            let labels = CapacityLabels {
                nodeclass: class.to_string(),
                resource: shortfall.resource.name(),
            };
            metrics.capacity_shortfalls.get_or_create(&labels).inc();
        }
        let (name, node_name) = (claim.name_any(), node.name_any());
        let note = note(&found, &node_name, class);
        tracing::warn!(nodeclaim = %name, node = %node_name, ec2nodeclass = class, "{note}");
        events.warning(claim, Reason::CapacityShortfall, note.clone());
        if let Some(class) = self.class_of(claim).await {
            events.warning(
                &class,
                Reason::CapacityShortfall,
                format!("NodeClaim {name}: {note}"),
            );
        }
    }

    /// The NodeClaim's EC2NodeClass as the API server has it (its UID
    /// makes the Event show in `kubectl describe`), if it names one.
    async fn class_of(&self, claim: &NodeClaim) -> Option<Ec2NodeClass> {
        let reference = claim.spec.node_class_ref.as_ref()?;
        let ours = reference.kind == Ec2NodeClass::kind(&())
            && reference.group == Ec2NodeClass::group(&());
        if !ours {
            return None;
        }
        match self.classes.get_opt(&reference.name).await {
            Ok(class) => class,
            Err(error) => {
                tracing::warn!(%error, ec2nodeclass = %reference.name, "no capacity Event on the EC2NodeClass: reading it failed");
                None
            }
        }
    }
}
