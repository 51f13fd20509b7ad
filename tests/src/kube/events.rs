//! The Events on an object, as whoever looks at it with kubectl sees them:
//! the record autonode and Karpenter leave on NodeClaims, CSRs and
//! classes, which the tests read to check what was said and why.
//!
//! Cluster-scoped objects have their Events in `default`, the namespace
//! both autonode and Karpenter write them to.

use anyhow::Result;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use kube::Client;

/// The Events on the cluster-scoped object named `name` (a NodeClaim, a
/// CSR, a class).
pub async fn events_of(admin: &Client, name: &str) -> Result<Vec<Event>> {
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let selector = format!("involvedObject.name={name}");
    Ok(events
        .list(&ListParams::default().fields(&selector))
        .await?
        .items)
}

/// The reasons of the Events on the cluster-scoped object named `name`.
pub async fn event_reasons(admin: &Client, name: &str) -> Result<Vec<String>> {
    let events = events_of(admin, name).await?;
    Ok(events.into_iter().filter_map(|e| e.reason).collect())
}
