//! The leader's controllers and the watches they share, built in one place.
//!
//! As in kube-rs's `shared_stream_controllers` example, each kind is
//! watched once per selection and handed to every controller that reads
//! it. Every watch in the server is a [`Cache`], so every one lists again
//! after a failed watch (see [`crate::kube::cache`]). Which caches exist, where
//! each is built, and why there:
//!
//! | cache | built in | runs | read by |
//! |---|---|---|---|
//! | NodeClaims | [`NodeClaims::start`] (from `serve`) | every replica | the join and reports; here, the feedback controller (store and changes) and the upkeep's rollout guard |
//! | Nodes | here, [`Leader::run`] | the leader | the approver and the feedback controller ([`crate::kube::node::Node`] is what both read, parsed as such) |
//! | autonode's CSRs, by label | [`crate::kube::issuer::Issuer::start`] | every replica | the join, waiting for its certificates |
//! | kubelet's CSRs, one per signer | [`approver::run`] | the leader | the approver only |
//! | EC2NodeClasses, stripped; Ignition ConfigMaps and Secrets | [`crate::join::render::inputs::NodeConfig::start`] | every replica | the join's render |
//! | EC2NodeClasses, whole, selected | [`nodeclass::run`] | the leader | the upkeep only |
//!
//! Why not all here: a cache read by one controller only is built by that
//! controller, beside the selectors and the strip function it alone
//! decides (the approver's two are selected by the API server on
//! `spec.signerName`, the upkeep's keeps managedFields and only the
//! selected classes); a cache the join path reads is built on every
//! replica when `serve` starts, not on the leader. Two caches of one kind
//! never stand in for each other: autonode's CSRs (selected by label,
//! keeping their outcome) and kubelet's (selected by signer, keeping what
//! judging reads) are disjoint sets, and the join's EC2NodeClass cache
//! strips what the upkeep reads. What is shared across controllers is
//! built here (Nodes) or handed in (NodeClaims).
//!
//! Everything here is polled inside one future, never spawned: a replica
//! that stops leading drops it, and every leader-only watch with it (the
//! approver and the upkeep poll their own caches' watches inside theirs).

use crate::kube::cache::Cache;
use crate::kube::events::Events;
use crate::kube::metrics::Metrics;
use crate::kube::node::Node;
use crate::kube::nodeclaim::NodeClaims;
use crate::primitives::clock::Clock;
use crate::{
    controllers::approver, controllers::capacity, controllers::feedback, controllers::nodeclass,
};
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
    /// What "now" is for the feedback controller.
    pub clock: Clock,
}

impl Leader {
    /// Builds the leader's watches and runs its controllers on them, until
    /// dropped (leadership lost) or their streams end.
    pub async fn run(self) {
        let nodes_api: Api<Node> = Api::all(self.client.clone());
        let (nodes, watching_nodes) = Cache::new(nodes_api, "Node", |_| {});
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
        let listed = nodes.status.clone();
        let feedback = feedback::run(
            self.claims,
            nodes,
            self.events,
            self.metrics,
            check,
            self.clock,
        );
        let nodeclasses = {
            let client = self.client.clone();
            async move {
                if let Some(settings) = self.nodeclasses {
                    nodeclass::run(client, settings, claims).await;
                }
            }
        };
        // Read before the Node cache has listed, a Node that exists is
        // missing: the approver would leave its kubelet's CSRs pending as
        // `no_node`, and feedback would set registered machines back. A
        // replica that has just become leader starts both once it has.
        let node_readers = async move {
            if listed.wait_listed().await.is_err() {
                tracing::warn!("approver and NodeClaim feedback not started: the Node watch ended before its first list");
                return;
            }
            futures::join!(approver, feedback);
        };
        futures::join!(watching_nodes, node_readers, nodeclasses);
    }
}
