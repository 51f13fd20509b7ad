//! EC2NodeClass upkeep: keeps the fields that make Karpenter's instances
//! join through autonode equal to what this server renders.
//!
//! For every EC2NodeClass (or those the operator names, see
//! [`Settings::names`]) these fields are autonode's: `spec.userData` (the agent's config, see
//! [`crate::controllers::nodeclass::userdata`], in the format the class's [`FORMAT_ANNOTATION`](userdata::FORMAT_ANNOTATION)
//! names; see [`format_of`]), `spec.amiFamily` (`Custom`, so Karpenter passes
//! userData verbatim), when AMI ids are configured `spec.amiSelectorTerms`
//! (`[{id: …}]`, one per architecture), and, unless turned off, three keys
//! of `spec.metadataOptions` (see [`MetadataOptionsPolicy`]). When one of
//! them differs, by a user's edit or because the class is new, the
//! controller restores them all with server-side apply as field manager
//! [`FIELD_MANAGER`], forced, so it owns exactly those fields and nothing
//! else, and records a Normal Event on the class.
//!
//! The metadata options are what keeps a pod on a node from reading the
//! instance identity document, the bearer credential a machine joins
//! with: IMDSv2 only (`httpTokens: required`, so every read needs a token)
//! and `httpPutResponseHopLimit: 1` (the token's answer does not survive
//! the extra hop into a pod's network namespace). `httpEndpoint: enabled`
//! is kept because the agent itself reads IMDS. Only those three keys are
//! applied: server-side apply then owns just them, so the user's other keys
//! (`httpProtocolIPv6`) stay theirs and untouched. Karpenter's drift
//! covers metadataOptions too, so a class that had weaker options gets its
//! nodes replaced once: the point, since those nodes exposed the document.
//!
//! A field autonode kept and no longer does (metadata options once
//! enforcing is turned off; `amiSelectorTerms` once `--ami-ids` is unset)
//! is handed over at its value, once, rather than removed (see
//! [`released`] and [`handover`]): removing `amiSelectorTerms`, which the
//! CRD requires, would be refused on every try.
//!
//! It writes only when a value differs, or once to let go of what it no
//! longer keeps. Karpenter hashes userData and the
//! AMI selection: a needless write is harmless to Karpenter only because it
//! is byte-identical, and it still costs an API write and a watch event for
//! every replica and every Karpenter, every resync. So the controller
//! compares first, and counts its writes in `autonode_nodeclass_writes_total`.
//!
//! What it keeps of userData and the AMI goes through the rollout guard
//! ([`crate::controllers::nodeclass::rollout`]): new values are on trial until a node launched
//! under them is Ready, and are put back to the last good ones when the
//! first NodeClaims launched under them fail. The class is written in one
//! apply of the fields the guard decides (and a copy of its state, for a
//! server before the store), with the class's resourceVersion as a
//! precondition: a decision made on a stale read is refused by the API
//! server and made again on the class as it is. The guard's state is then
//! recorded in its store ([`rollout::store`]), a ConfigMap class editors
//! cannot write; the time of that apply, from its response, starts a trial.

mod ami;
mod exposure;
mod fields;
mod format;
mod guard;
mod handover;
mod reconcile;
pub mod rollout;
pub mod userdata;

pub use ami::{ami_selector_terms, AmiIdsError};
pub use exposure::exposures;
pub use fields::{applied, drift};
pub use format::format_of;
pub use handover::{applied_paths, handover, owned_metadata_options, released, SpecPath};

use crate::controllers::nodeclass::userdata::{Format, Rendered};
use crate::kube::cache::Cache;
use crate::kube::events::Events;
use crate::kube::karpenter::{Ec2NodeClass, NodeClaim};
use crate::kube::metrics::Metrics;
use crate::kube::nodeclaim::NodeClaims;
use futures::StreamExt;
use kube::runtime::controller::{self, applier, trigger_self, trigger_with, Action};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client};
use rollout::Values;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use thiserror::Error;

/// The field managers: the one that owns the kept fields, and the one that
/// takes over what autonode no longer keeps (see [`handover`]). Defined with
/// every other name autonode writes under, in [`crate::kube::marks`].
pub use crate::kube::marks::{FIELD_MANAGER, HANDOVER_MANAGER};
/// The `amiFamily` under which Karpenter passes userData verbatim.
pub const AMI_FAMILY: &str = "Custom";

/// EC2NodeClasses kept at once. A class editor may make a class large (up
/// to the API server's object limit) and classes many: each reconcile
/// holds its class's rendered userData and an API request, so they are
/// bounded like every loop the server drives.
const KEPT_AT_ONCE: u16 = 4;

/// `metadataOptions.httpTokens` kept: IMDSv2 only, every read needs a token.
pub const HTTP_TOKENS: &str = "required";
/// `metadataOptions.httpPutResponseHopLimit` kept: a token's answer reaches
/// the host's processes, not a pod one hop further.
pub const HOP_LIMIT: i64 = 1;
/// `metadataOptions.httpEndpoint` kept: the agent reads IMDS.
pub const HTTP_ENDPOINT: &str = "enabled";

/// Whether the upkeep keeps the instance metadata options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataOptionsPolicy {
    /// Keep `httpTokens: required`, `httpPutResponseHopLimit: 1` and
    /// `httpEndpoint: enabled`.
    Enforce,
    /// Leave `metadataOptions` to the class's other managers, releasing
    /// what autonode owned; warn when a class exposes IMDS to pods.
    LeaveAlone,
}

/// The values of the kept fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// The rendered userData, in every format: each class gets the one its
    /// [`FORMAT_ANNOTATION`](userdata::FORMAT_ANNOTATION) names.
    pub user_data: Rendered,
    /// `amiSelectorTerms`, or `None` to leave them to the user.
    pub ami_terms: Option<Vec<Value>>,
    /// Whether `metadataOptions` are kept.
    pub metadata_options: MetadataOptionsPolicy,
}

/// What the controller keeps, and how.
#[derive(Clone)]
pub struct Settings {
    pub desired: Desired,
    /// The names of the classes kept; all when empty. Names, not labels:
    /// a name cannot change once the class exists, while a label is
    /// anyone's to remove who may edit the class, the very edits the
    /// upkeep reverts.
    pub names: BTreeSet<String>,
    /// How often each class is compared again without a watch event.
    pub resync: Duration,
    pub metrics: Metrics,
    pub events: Events,
    /// How the rollout guard judges new AMI or userData values.
    pub rollout: rollout::Settings,
    /// Where the rollout guard's store is (the leader namespace).
    pub store_namespace: String,
}

/// Why a reconcile failed (it is retried).
#[derive(Debug, Error)]
pub enum Error {
    #[error("applying EC2NodeClass {name}: {source}")]
    Apply {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("encoding the rollout state of EC2NodeClass {name}: {source}")]
    State {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the rollout state of EC2NodeClass {name}: {source}")]
    Store {
        name: String,
        #[source]
        source: rollout::store::StoreError,
    },
}

/// What each reconcile sees.
struct Context {
    api: Api<Ec2NodeClass>,
    settings: Settings,
    /// Per class name, the resourceVersion its last handover wrote. That
    /// version is followed at once by autonode's own apply, but its watch
    /// event wakes the class again: read from a store that has not seen the
    /// apply yet, it would look released again and be written twice.
    handed_over: Mutex<HashMap<String, String>>,
    /// The NodeClaims the rollout guard judges (the join path's cache).
    claims: NodeClaims,
    /// The rollout guard's store, of this leadership term.
    store: rollout::store::Store,
    /// The classes as watched: whose entries the store keeps.
    classes: Cache<Ec2NodeClass>,
}

impl Settings {
    /// Whether the class named `name` is kept.
    pub fn keeps(&self, name: &str) -> bool {
        self.names.is_empty() || self.names.contains(name)
    }
}

impl Desired {
    /// The values the rollout guard watches, as rendered in `format`.
    pub fn values(&self, format: Format) -> Values {
        Values {
            user_data: self.user_data.get(format).to_string(),
            ami_selector_terms: self.ami_terms.clone(),
        }
    }
}

/// Runs the controller until its stream ends. The caller decides where it
/// runs (on the leader only, when there are replicas). `claims` is the
/// NodeClaim cache the rollout guard judges trials by; a NodeClaim's change
/// wakes its class.
pub async fn run(client: Client, settings: Settings, claims: NodeClaims) {
    let api: Api<Ec2NodeClass> = Api::all(client.clone());
    // Small pages: a page is held whole before it is parsed, and whoever
    // may create a class makes it up to the API server's object limit.
    let config = watcher::Config::default().page_size(crate::kube::cache::SMALL_PAGE);
    // A cache, not kube-runtime's Controller: it lists again after a
    // failed watch (see `crate::kube::cache`), and runs only while polled here.
    let (classes, watching) = Cache::whole(api.clone(), config, "EC2NodeClass upkeep");
    let ctx = Arc::new(Context {
        api,
        store: rollout::store::Store::new(client, &settings.store_namespace),
        settings,
        handed_over: Mutex::new(HashMap::new()),
        claims: claims.clone(),
        classes: classes.clone(),
    });
    let queue = futures::stream::select(
        trigger_self(classes.changes().map(Ok::<_, Infallible>), ()),
        claim_wakes(&claims),
    );
    let config = controller::Config::default().concurrency(KEPT_AT_ONCE);
    let reconciler = |class, ctx| Box::pin(reconcile::reconcile(class, ctx));
    let controller =
        applier(reconciler, error_policy, ctx, classes.store, queue, config).for_each(|result| {
            if let Err(error) = result {
                tracing::debug!(%error, "EC2NodeClass controller");
            }
            futures::future::ready(())
        });
    futures::future::join(watching, controller).await;
}

/// The class of each NodeClaim that changes, to reconcile (a deleted
/// one's too: the rollout guard reads it from [`NodeClaims::gone`]).
fn claim_wakes(
    claims: &NodeClaims,
) -> impl futures::Stream<Item = Result<controller::ReconcileRequest<Ec2NodeClass>, Infallible>> {
    let changes = claims.changes().map(Ok::<_, Infallible>);
    trigger_with(changes, move |claim: Arc<NodeClaim>| {
        claim
            .spec
            .node_class_ref
            .as_ref()
            .map(|r| ObjectRef::<Ec2NodeClass>::new(&r.name))
    })
}

fn error_policy(_class: Arc<Ec2NodeClass>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "EC2NodeClass reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests;
