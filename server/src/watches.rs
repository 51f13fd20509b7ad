//! The leader's controllers and the watches they share, built in one place.
//!
//! As in kube-rs's `shared_stream_controllers` example, each kind is
//! watched once and handed to every controller that reads it, each watch a
//! [`Cache`] (so each relists after a failed watch, see [`crate::cache`]):
//!
//! - NodeClaims: the join path's cache ([`NodeClaims`], on every replica);
//!   the feedback controller reconciles from its store and its changes.
//! - Nodes: one cache, on the leader only, read by the approver and the
//!   feedback controller ([`cache::strip_node`] keeps what both read).
//! - CSRs: the approver's two watches, one per kubelet signer, selected by
//!   the API server on `spec.signerName` (see [`approver::run`]); the join
//!   path's watch of autonode's own CSRs ([`crate::issuer`]) selects by
//!   label and keeps other fields, so neither can stand in for the other.
//! - EC2NodeClasses: the upkeep controller's own watch ([`nodeclass::run`]):
//!   it reads the whole spec and managedFields, which the join path's class
//!   cache ([`crate::nodeconfig`]) strips, and only the selected classes;
//!   its rollout guard ([`crate::rollout`]) judges trials by the NodeClaim
//!   cache, and a NodeClaim's change wakes its class.
//!
//! Everything here is polled inside one future, never spawned: a replica
//! that stops leading drops it, and every leader-only watch with it.

use crate::cache::{self, Cache};
use crate::events::Events;
use crate::metrics::Metrics;
use crate::nodeclaim::NodeClaims;
use crate::{approver, capacity, feedback, nodeclass};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

/// What the leader runs.
#[derive(Clone)]
pub struct Leader {
    pub client: Client,
    pub claims: NodeClaims,
    pub events: Events,
    pub metrics: Metrics,
    /// The kubelet CSR approver's settings, when it is turned on.
    pub approver: Option<approver::Settings>,
    /// The EC2NodeClass upkeep's settings, when it is turned on.
    pub nodeclasses: Option<nodeclass::Settings>,
    /// How much smaller than its NodeClaim's a Ready node may be before the
    /// feedback controller reports it (see [`capacity`]).
    pub capacity: capacity::Tolerance,
}

impl Leader {
    /// Builds the leader's watches and runs its controllers on them, until
    /// dropped (leadership lost) or their streams end.
    pub async fn run(self) {
        let nodes_api: Api<Node> = Api::all(self.client.clone());
        let (nodes, watching_nodes) = Cache::new(nodes_api, "Node", cache::strip_node);
        let approver = {
            let (client, store) = (self.client.clone(), nodes.store.clone());
            async move {
                if let Some(settings) = self.approver {
                    approver::run(client, settings, store).await;
                }
            }
        };
        let check = capacity::Check::new(self.client.clone(), self.capacity);
        let claims = self.claims.clone();
        let feedback = feedback::run(self.claims, nodes, self.events, self.metrics, check);
        let nodeclasses = {
            let client = self.client.clone();
            async move {
                if let Some(settings) = self.nodeclasses {
                    nodeclass::run(client, settings, claims).await;
                }
            }
        };
        futures::join!(watching_nodes, approver, feedback, nodeclasses);
    }
}
