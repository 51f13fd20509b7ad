//! EC2NodeClass upkeep: keeps the fields that make Karpenter's instances
//! join through autonode equal to what this server renders.
//!
//! For every EC2NodeClass (or those matching a label selector) these fields
//! are autonode's: `spec.userData` (the agent's config, see
//! [`crate::controllers::nodeclass::userdata`], in the format the class's [`FORMAT_ANNOTATION`]
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
//! first NodeClaims launched under them fail. The guard's state is written
//! on the class, in the same apply as the fields it decides, with the
//! class's resourceVersion as a precondition: a decision made on a stale
//! read is refused by the API server and made again on the class as it is.

pub mod rollout;
pub mod userdata;

use crate::controllers::nodeclass::userdata::{Format, Rendered, UnknownFormat, FORMAT_ANNOTATION};
use crate::kube::cache::Cache;
use crate::kube::events::Events;
use crate::kube::karpenter::{Condition, Ec2NodeClass, Ec2NodeClassSpec, NodeClaim};
use crate::kube::marks;
use crate::kube::metrics::Metrics;
use crate::kube::nodeclaim::NodeClaims;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{self, applier, trigger_self, trigger_with, Action};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use rollout::{Plan, Values};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use thiserror::Error;

/// The field managers: the one that owns the kept fields, and the one that
/// takes over what autonode no longer keeps (see [`handover`]). Defined with
/// every other name autonode writes under, in [`crate::kube::marks`].
pub use crate::kube::marks::{FIELD_MANAGER, HANDOVER_MANAGER};
/// The `amiFamily` under which Karpenter passes userData verbatim.
pub const AMI_FAMILY: &str = "Custom";
/// The Event reason when fields were restored.
pub const RESTORED: &str = "NodeClassRestored";
/// The Warning Event reason when, not enforcing, a class lets pods read IMDS.
pub const EXPOSED: &str = "InstanceMetadataExposed";
/// The Event reason when autonode let go of a class's AMI selection.
pub const AMI_RELEASED: &str = "AmiSelectionReleased";
/// The Warning Event reason when a class's [`FORMAT_ANNOTATION`] names no
/// format, and the class is left as it is.
pub const FORMAT_UNKNOWN: &str = "UserDataFormatUnknown";

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
    /// [`FORMAT_ANNOTATION`] names.
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
    /// Label selector limiting which classes are kept; all when `None`.
    pub selector: Option<String>,
    /// How often each class is compared again without a watch event.
    pub resync: Duration,
    pub metrics: Metrics,
    pub events: Events,
    /// How the rollout guard judges new AMI or userData values.
    pub rollout: rollout::Settings,
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
}

/// Why `--ami-ids` is unusable.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AmiIdsError {
    #[error("AMI id entry {0:?}: expected <arch>=ami-<hex>, e.g. amd64=ami-0123456789abcdef0")]
    Entry(String),
    #[error("architecture {0:?} is given more than once")]
    Duplicate(String),
}

/// `amiSelectorTerms` from `arch=ami-…` entries: one `{id}` term per
/// architecture, ordered by architecture so equal settings give equal terms;
/// `None` when there are no entries.
pub fn ami_selector_terms(entries: &[String]) -> Result<Option<Vec<Value>>, AmiIdsError> {
    let mut by_arch = BTreeMap::new();
    for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let bad = || AmiIdsError::Entry(entry.to_string());
        let (arch, id) = entry.split_once('=').ok_or_else(bad)?;
        let hex = id.strip_prefix("ami-").ok_or_else(bad)?;
        if arch.is_empty() || hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        if by_arch.insert(arch.to_string(), id.to_string()).is_some() {
            return Err(AmiIdsError::Duplicate(arch.to_string()));
        }
    }
    Ok((!by_arch.is_empty()).then(|| {
        by_arch
            .into_values()
            .map(|id| json!({ "id": id }))
            .collect()
    }))
}

/// The userData format `class` asks for with [`FORMAT_ANNOTATION`], as
/// the class is now: [`Format::Toml`] when it is absent, an error naming
/// the value when it names no format.
///
/// The annotation is trusted as it stands, whoever set it: it is the
/// choice of the class's owners, who may as well write the userData
/// itself; it only picks which of autonode's own renderings is kept.
pub fn format_of(class: &Ec2NodeClass) -> Result<Format, UnknownFormat> {
    match class.annotations().get(FORMAT_ANNOTATION) {
        Some(value) => Format::parse(value),
        None => Ok(Format::default()),
    }
}

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

/// A field below `spec`, as its path of keys (`["metadataOptions",
/// "httpTokens"]`).
pub type SpecPath = Vec<String>;

/// The fields below `spec` that `manager`'s applies own, per the class's
/// managedFields: a map's keys one by one, a list or a value whole (sorted;
/// empty: none).
pub fn applied_paths(meta: &ObjectMeta, manager: &str) -> Vec<SpecPath> {
    /// Collects the owned leaves below `node`, a managedFields tree.
    fn leaves(node: &Value, at: &mut SpecPath, out: &mut Vec<SpecPath>) {
        let children: Vec<(&str, &Value)> = node
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(key, child)| Some((key.strip_prefix("f:")?, child)))
            .collect();
        // No field below (a value, or a list whose items are `k:`/`v:`
        // entries): owned whole.
        if children.is_empty() {
            if !at.is_empty() {
                out.push(at.clone());
            }
            return;
        }
        for (key, child) in children {
            at.push(key.to_string());
            leaves(child, at, out);
            at.pop();
        }
    }
    let mut paths = Vec::new();
    let applied = meta.managed_fields.iter().flatten().filter(|entry| {
        entry.manager.as_deref() == Some(manager) && entry.operation.as_deref() == Some("Apply")
    });
    for entry in applied {
        if let Some(spec) = entry.fields_v1.as_ref().and_then(|f| f.0.get("f:spec")) {
            leaves(spec, &mut Vec::new(), &mut paths);
        }
    }
    paths.sort_unstable();
    paths.dedup();
    paths
}

/// The keys of `spec.metadataOptions` that [`FIELD_MANAGER`]'s applies own,
/// per the class's managedFields (sorted; empty: none).
pub fn owned_metadata_options(meta: &ObjectMeta) -> Vec<String> {
    applied_paths(meta, FIELD_MANAGER)
        .into_iter()
        .filter_map(|path| match <[String; 2]>::try_from(path) {
            Ok([options, key]) if options == "metadataOptions" => Some(key),
            _ => None,
        })
        .collect()
}

/// The fields autonode's applies own and its next apply, [`applied`] with
/// `desired`, leaves out: each must be handed over first (sorted; empty:
/// none).
pub fn released(meta: &ObjectMeta, desired: &Desired) -> Vec<SpecPath> {
    // Which fields, not their values: any format will do.
    let next = applied("", desired, Format::default());
    applied_paths(meta, FIELD_MANAGER)
        .into_iter()
        .filter(|path| value_at(&next["spec"], path).is_none())
        .collect()
}

/// The value at `path` below `spec`, if it has one.
fn value_at<'a>(spec: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter()
        .try_fold(spec, |at, key| at.get(key))
        .filter(|value| !value.is_null())
}

/// The apply configuration by which [`HANDOVER_MANAGER`] takes over the
/// `released` fields at their current values, and keeps those it took over
/// before, or `None` when none of them has a value.
///
/// Server-side apply removes a field when the manager that applied it
/// leaves it out of its next apply and no other manager owns it. Once
/// autonode no longer keeps a field (enforcing metadata options turned
/// off, `--ami-ids` unset), its applies leave the field out, so without a
/// handover a field only autonode owned would vanish: the metadata options
/// would become whatever the CRD's defaults are then, behind the class's
/// owner's back on a mere flag change, and `amiSelectorTerms`, which the
/// CRD requires, could not be removed at all, every apply refused. So they
/// are handed over first, unchanged (not forced: if the class changed since
/// it was read, the apply conflicts and the reconcile is retried with the
/// new values), and keep the values they have until someone edits them.
/// The same rule holds for [`HANDOVER_MANAGER`] itself, hence
/// `handed_before` (its own [`applied_paths`]), applied again each time.
pub fn handover(
    name: &str,
    spec: &Ec2NodeClassSpec,
    released: &[SpecPath],
    handed_before: &[SpecPath],
) -> Option<Value> {
    if released.is_empty() {
        return None;
    }
    let current = serde_json::to_value(spec).ok()?;
    let mut kept = json!({});
    for path in released.iter().chain(handed_before) {
        // An empty list is how the typed spec reads an absent one.
        let Some(value) = value_at(&current, path).filter(|v| v.as_array() != Some(&Vec::new()))
        else {
            continue;
        };
        let Some((last, parents)) = path.split_last() else {
            continue;
        };
        let mut at = &mut kept;
        for key in parents {
            at = &mut at[key.as_str()];
        }
        at[last.as_str()] = value.clone();
    }
    (kept.as_object().is_some_and(|k| !k.is_empty())).then(|| {
        json!({
            "apiVersion": "karpenter.k8s.aws/v1",
            "kind": "EC2NodeClass",
            "metadata": { "name": name },
            "spec": kept,
        })
    })
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

/// What each reconcile sees.
struct Context {
    api: Api<Ec2NodeClass>,
    settings: Settings,
    /// Per class name, the exposure last warned about (with the class's
    /// uid), so a class is warned about once per change, not every resync.
    warned: Mutex<HashMap<String, String>>,
    /// Per class name, the resourceVersion its last handover wrote. That
    /// version is followed at once by autonode's own apply, but its watch
    /// event wakes the class again: read from a store that has not seen the
    /// apply yet, it would look released again and be written twice.
    handed_over: Mutex<HashMap<String, String>>,
    /// Per class name, the unknown format last warned about (with the
    /// class's uid), so it is warned about once per value, not every resync.
    refused_format: Mutex<HashMap<String, String>>,
    /// The NodeClaims the rollout guard judges (the join path's cache).
    claims: NodeClaims,
    /// Per class name, the standing rollout note last told (held, refusing,
    /// with the class's uid), so it is told once, not every resync.
    standing: Mutex<HashMap<String, String>>,
}

impl Context {
    /// One server-side apply to class `name`, counted as a write.
    async fn apply(
        &self,
        name: &str,
        params: &PatchParams,
        body: Value,
    ) -> Result<Ec2NodeClass, Error> {
        let written = self
            .api
            .patch(name, params, &Patch::Apply(body))
            .await
            .map_err(|source| Error::Apply {
                name: name.to_string(),
                source,
            })?;
        self.settings.metrics.nodeclass_writes.inc();
        Ok(written)
    }

    /// Whether `class` is the version a handover of ours wrote, already
    /// superseded by the apply that followed it (forgotten once another
    /// version is seen).
    fn superseded(&self, name: &str, class: &Ec2NodeClass) -> bool {
        let mut handed = self
            .handed_over
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let version = class.metadata.resource_version.as_deref();
        if version.is_some() && handed.get(name).map(String::as_str) == version {
            return true;
        }
        handed.remove(name);
        false
    }

    /// Remembers the version a handover wrote; see [`Context::superseded`].
    fn handed_over(&self, name: &str, written: &Ec2NodeClass) {
        if let Some(version) = written.metadata.resource_version.clone() {
            self.handed_over
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name.to_string(), version);
        }
    }

    /// The format `class` asks for, or `None` after warning (once per
    /// value) that its annotation names none: the class is then left as it
    /// is, every kept field, until the annotation is fixed. Keeping the
    /// rest would need an apply, and an apply without userData would remove
    /// the class's userData (server-side apply drops what its manager
    /// leaves out).
    fn format_of(&self, class: &Ec2NodeClass, name: &str) -> Option<Format> {
        let mut refused = self
            .refused_format
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let unknown = match format_of(class) {
            Ok(format) => {
                refused.remove(name);
                return Some(format);
            }
            Err(unknown) => unknown,
        };
        let key = format!(
            "{}/{}",
            class.metadata.uid.as_deref().unwrap_or(""),
            unknown.0
        );
        if refused.get(name) == Some(&key) {
            return None;
        }
        refused.insert(name.to_string(), key);
        drop(refused);
        tracing::warn!(
            nodeclass = %name,
            annotation = FORMAT_ANNOTATION,
            value = %unknown.0,
            "EC2NodeClass left as it is: its userData format annotation is unknown"
        );
        self.settings.events.warning(
            class,
            FORMAT_UNKNOWN,
            format!(
                "annotation {FORMAT_ANNOTATION}: {unknown}. autonode-server leaves this \
                 EC2NodeClass as it is (its userData and every other field) until the \
                 annotation is fixed or removed"
            ),
        );
        None
    }

    /// Logs and records a Warning Event when `class` exposes IMDS to pods
    /// and that exposure was not already reported.
    fn warn_exposures(&self, class: &Ec2NodeClass, name: &str) {
        let found = exposures(&class.spec);
        let mut warned = self.warned.lock().unwrap_or_else(PoisonError::into_inner);
        if found.is_empty() {
            warned.remove(name);
            return;
        }
        let found = found.join("; ");
        let key = format!("{}/{found}", class.metadata.uid.as_deref().unwrap_or(""));
        if warned.get(name) == Some(&key) {
            return;
        }
        warned.insert(name.to_string(), key);
        drop(warned);
        tracing::warn!(
            nodeclass = %name,
            exposures = %found,
            "EC2NodeClass lets pods read instance metadata (--enforce-metadata-options=false)"
        );
        self.settings.events.warning(
            class,
            EXPOSED,
            format!(
                "spec.metadataOptions: {found}. Any pod on these nodes can read the instance \
                 identity document, the credential a machine joins with, and the node's IAM \
                 role credentials. autonode-server does not keep metadataOptions \
                 (--enforce-metadata-options=false)"
            ),
        );
    }
}

impl Context {
    /// The rollout guard's plan for `class`, userData in `format`.
    fn guard(&self, class: &Ec2NodeClass, name: &str, format: Format) -> Plan {
        let desired = &self.settings.desired;
        let current = Values {
            user_data: class.spec.user_data.clone().unwrap_or_default(),
            ami_selector_terms: desired
                .ami_terms
                .as_ref()
                .map(|_| class.spec.ami_selector_terms.clone()),
        };
        let cluster = rollout::cluster::Cluster {
            claims: &self.claims,
            settings: self.settings.rollout,
            events: &self.settings.events,
        };
        cluster.plan(class, name, current, desired.values(format))
    }

    /// Writes the [`rollout::STATUS_CONDITION`] `plan` calls for on
    /// `class`, when it differs from the one there: through the status
    /// subresource, every condition as read with ours replaced, with the
    /// resourceVersion read as a precondition (409 when the class changed
    /// since: its watch event decides again). Karpenter's own status writes
    /// are merge patches computed from the object it read, so a condition
    /// of ours survives them. Best effort: a failure is logged.
    async fn mark_status(&self, class: &Ec2NodeClass, name: &str, plan: &Plan) {
        let (status, reason, message) = rollout::status_condition(plan);
        let conditions = class
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let ours = conditions
            .iter()
            .find(|c| c.type_ == rollout::STATUS_CONDITION);
        let same = ours.is_some_and(|c| {
            c.status == status
                && c.reason.as_deref() == Some(reason)
                && c.message.as_deref() == Some(message.as_str())
        });
        if same {
            return;
        }
        let since = match ours.filter(|c| c.status == status) {
            Some(c) => c.last_transition_time.clone(),
            None => time::OffsetDateTime::now_utc()
                .replace_nanosecond(0)
                .ok()
                .and_then(|t| {
                    t.format(&time::format_description::well_known::Rfc3339)
                        .ok()
                }),
        };
        let mut next: Vec<Condition> = conditions
            .iter()
            .filter(|c| c.type_ != rollout::STATUS_CONDITION)
            .cloned()
            .collect();
        next.push(Condition {
            type_: rollout::STATUS_CONDITION.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(message),
            last_transition_time: since,
            observed_generation: class.metadata.generation,
        });
        let patch = json!({
            "metadata": {"resourceVersion": class.metadata.resource_version},
            "status": {"conditions": next},
        });
        match self
            .api
            .patch_status(name, &marks::patch_params(), &Patch::Merge(&patch))
            .await
        {
            // A status write: not one of autonode_nodeclass_writes_total,
            // which counts what changes a class's nodes.
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::debug!(nodeclass = %name, "EC2NodeClass changed before its rollout condition was written; deciding again")
            }
            Err(error) => {
                tracing::warn!(nodeclass = %name, %error, "could not write the EC2NodeClass's AutonodeRollout condition")
            }
        }
    }

    /// Logs, Events and counts what `plan` says happened to `class`.
    fn announce(&self, class: &Ec2NodeClass, name: &str, plan: &Plan) {
        let teller = rollout::tell::Teller {
            events: &self.settings.events,
            metrics: &self.settings.metrics,
            standing: &self.standing,
            settings: self.settings.rollout,
        };
        teller.announce(class, name, plan);
    }
}

/// Runs the controller until its stream ends. The caller decides where it
/// runs (on the leader only, when there are replicas). `claims` is the
/// NodeClaim cache the rollout guard judges trials by; a NodeClaim's change
/// wakes its class.
pub async fn run(client: Client, settings: Settings, claims: NodeClaims) {
    let api: Api<Ec2NodeClass> = Api::all(client);
    let config = match &settings.selector {
        Some(selector) => watcher::Config::default().labels(selector),
        None => watcher::Config::default(),
    };
    let ctx = Arc::new(Context {
        api: api.clone(),
        settings,
        warned: Mutex::new(HashMap::new()),
        handed_over: Mutex::new(HashMap::new()),
        refused_format: Mutex::new(HashMap::new()),
        claims: claims.clone(),
        standing: Mutex::new(HashMap::new()),
    });
    // A cache, not kube-runtime's Controller: it lists again after a
    // failed watch (see `crate::kube::cache`), and runs only while polled here.
    let (classes, watching) = Cache::whole(api, config, "EC2NodeClass upkeep");
    let queue = futures::stream::select(
        trigger_self(classes.changes().map(Ok::<_, Infallible>), ()),
        claim_wakes(&claims),
    );
    let config = controller::Config::default();
    let reconciler = |class, ctx| Box::pin(reconcile(class, ctx));
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

async fn reconcile(class: Arc<Ec2NodeClass>, ctx: Arc<Context>) -> Result<Action, Error> {
    let settings = &ctx.settings;
    settings.metrics.nodeclass_checks.inc();
    let name = class.name_any();
    if ctx.superseded(&name, &class) {
        // The apply after the handover wakes the class again, with the
        // version it wrote.
        return Ok(Action::requeue(settings.resync));
    }
    if settings.desired.metadata_options == MetadataOptionsPolicy::LeaveAlone {
        ctx.warn_exposures(&class, &name);
    }
    let Some(format) = ctx.format_of(&class, &name) else {
        return Ok(Action::requeue(settings.resync));
    };
    let plan = ctx.guard(&class, &name, format);
    let desired = pinned(&settings.desired, &plan.target);
    let fields = drift(&class.spec, &desired, format);
    let released = released(&class.metadata, &desired);
    let key = &settings.rollout.key;
    let state_changed = !rollout::read_state(&class, key)
        .ok()
        .flatten()
        .is_some_and(|read| rollout::unchanged_but_start(&read, &plan.state));
    if fields.is_empty() && released.is_empty() && !state_changed {
        tracing::debug!(nodeclass = %name, "EC2NodeClass as rendered");
        ctx.announce(&class, &name, &plan);
        ctx.mark_status(&class, &name, &plan).await;
        return Ok(Action::requeue(settings.resync));
    }
    let Some(restored) = write(&ctx, &class, &desired, format, &released, &plan).await? else {
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    // Told once: from this apply on, autonode owns none of them.
    report_released(&restored, &name, &released, &settings.events);
    if !fields.is_empty() {
        let rendered = plan.target == settings.desired.values(format);
        report_restored(
            &restored,
            &name,
            &fields,
            format,
            rendered,
            &settings.events,
        );
    }
    ctx.announce(&restored, &name, &plan);
    ctx.mark_status(&restored, &name, &plan).await;
    Ok(Action::requeue(settings.resync))
}

/// Writes `class` as `desired` (userData in `format`) with the rollout
/// guard's state from `plan`, after handing over the `released` fields;
/// with the class's resourceVersion as a precondition. `None` when the
/// class changed since it was read (often by our own write, not yet in the
/// store): it is decided again on the class as it is.
async fn write(
    ctx: &Context,
    class: &Ec2NodeClass,
    desired: &Desired,
    format: Format,
    released: &[SpecPath],
    plan: &Plan,
) -> Result<Option<Ec2NodeClass>, Error> {
    let name = class.name_any();
    let mut version = class.metadata.resource_version.clone();
    let handed_before = applied_paths(&class.metadata, HANDOVER_MANAGER);
    if let Some(body) = handover(&name, &class.spec, released, &handed_before) {
        let written = ctx
            .apply(&name, &PatchParams::apply(HANDOVER_MANAGER), body)
            .await?;
        ctx.handed_over(&name, &written);
        version = written.metadata.resource_version.clone();
    }
    let mut body = applied(&name, desired, format);
    let uid = class.metadata.uid.as_deref().unwrap_or_default();
    let state = ctx
        .settings
        .rollout
        .key
        .seal(uid, &plan.state)
        .map_err(|source| Error::State {
            name: name.clone(),
            source,
        })?;
    body["metadata"]["annotations"] = json!({ rollout::ROLLOUT_ANNOTATION: state });
    body["metadata"]["resourceVersion"] = json!(version);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match ctx.apply(&name, &params, body).await {
        Err(Error::Apply {
            source: kube::Error::Api(status),
            ..
        }) if status.code == 409 => {
            tracing::debug!(nodeclass = %name, "EC2NodeClass changed since it was read; deciding again");
            Ok(None)
        }
        other => other.map(Some),
    }
}

/// Logs and records an Event that `fields` were restored: to the rendered
/// values, or to those the rollout guard keeps instead.
fn report_restored(
    class: &Ec2NodeClass,
    name: &str,
    fields: &[&str],
    format: Format,
    rendered: bool,
    events: &Events,
) {
    let fields = fields.join(", ");
    let to = if rendered {
        "the rendered values"
    } else {
        "the values the rollout guard keeps (see the RolloutReverted, RolloutRefused or RolloutHeld Events)"
    };
    let format = format.as_str();
    tracing::info!(nodeclass = %name, %fields, %format, "EC2NodeClass restored");
    events.normal(
        class,
        RESTORED,
        format!("autonode-server restored {fields} to {to}"),
    );
}

/// `desired` with userData and the AMI terms pinned to `values` (the
/// rollout guard's), in every format: the class uses one.
fn pinned(desired: &Desired, values: &Values) -> Desired {
    Desired {
        user_data: Rendered {
            toml: values.user_data.clone(),
            ignition: values.user_data.clone(),
        },
        ami_terms: values.ami_selector_terms.clone(),
        metadata_options: desired.metadata_options,
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

/// Logs the fields let go of, by top-level field, and records an Event
/// when it is the AMI selection: Karpenter's AMIs are the class owners'
/// from now on.
fn report_released(class: &Ec2NodeClass, name: &str, released: &[SpecPath], events: &Events) {
    let mut by_field: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for path in released {
        if let Some((field, below)) = path.split_first() {
            by_field
                .entry(field.as_str())
                .or_default()
                .extend(below.first().map(String::as_str));
        }
    }
    for (field, keys) in by_field {
        let keys = keys.join(", ");
        tracing::info!(nodeclass = %name, %keys, "EC2NodeClass {field} released at their values");
    }
    if released
        .iter()
        .any(|path| path.first().map(String::as_str) == Some("amiSelectorTerms"))
    {
        tracing::info!(
            nodeclass = %name,
            "autonode-server no longer manages the EC2NodeClass's AMI (--ami-ids is unset): \
             spec.amiSelectorTerms keep their values and are the class owners' to change"
        );
        events.normal(
            class,
            AMI_RELEASED,
            "autonode-server no longer manages spec.amiSelectorTerms (--ami-ids is unset); \
             they keep their values and are yours to change"
                .to_string(),
        );
    }
}

fn error_policy(_class: Arc<Ec2NodeClass>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "EC2NodeClass reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};

    fn desired(ami_terms: Option<Vec<Value>>) -> Desired {
        Desired {
            user_data: Rendered {
                toml: "server-url = \"https://a\"\n".into(),
                ignition: "{\"ignition\":{\"version\":\"3.0.0\"}}\n".into(),
            },
            ami_terms,
            metadata_options: MetadataOptionsPolicy::Enforce,
        }
    }

    fn leave_alone() -> Desired {
        Desired {
            metadata_options: MetadataOptionsPolicy::LeaveAlone,
            ..desired(None)
        }
    }

    /// A class as the API server returns it: Karpenter's defaulted
    /// metadataOptions, which are the kept values.
    fn kept_spec(terms: &[Value]) -> Ec2NodeClassSpec {
        serde_json::from_value(json!({
            "amiFamily": "Custom", "userData": desired(None).user_data.toml,
            "amiSelectorTerms": terms, "role": "KarpenterNodeRole",
            "metadataOptions": {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled",
                                "httpPutResponseHopLimit": 1, "httpTokens": "required"},
        }))
        .unwrap()
    }

    fn options(spec: &mut Ec2NodeClassSpec) -> &mut crate::kube::karpenter::MetadataOptions {
        spec.metadata_options.as_mut().unwrap()
    }

    #[test]
    fn only_differing_fields_are_drift() {
        let terms = vec![json!({"id": "ami-0123"})];
        let kept = kept_spec(&terms);
        assert!(drift(&kept, &desired(Some(terms.clone())), Format::Toml).is_empty());
        assert!(
            drift(&kept, &desired(None), Format::Toml).is_empty(),
            "terms left alone"
        );
        let mut edited = kept.clone();
        edited.ami_family = Some("AL2023".into());
        edited.ami_selector_terms = vec![json!({"alias": "al2023@latest"})];
        assert_eq!(
            drift(&edited, &desired(Some(terms)), Format::Toml),
            ["spec.amiFamily", "spec.amiSelectorTerms"]
        );
        edited.user_data = None;
        assert_eq!(
            drift(&edited, &desired(None), Format::Toml),
            ["spec.userData", "spec.amiFamily"]
        );
    }

    fn annotated(value: Option<&str>) -> Ec2NodeClass {
        let annotations = value.map(|v| json!({ FORMAT_ANNOTATION: v, "other": "x" }));
        serde_json::from_value(json!({
            "metadata": {"name": "default", "annotations": annotations},
            "spec": {"userData": "mine"},
        }))
        .unwrap()
    }

    #[test]
    fn a_classes_annotation_chooses_its_userdata_format() {
        assert_eq!(format_of(&annotated(None)), Ok(Format::Toml));
        assert_eq!(format_of(&annotated(Some("toml"))), Ok(Format::Toml));
        assert_eq!(
            format_of(&annotated(Some("ignition"))),
            Ok(Format::Ignition)
        );
        assert_eq!(
            format_of(&annotated(Some("Ignition"))),
            Err(UnknownFormat("Ignition".into()))
        );
        assert_eq!(
            format_of(&annotated(Some(""))),
            Err(UnknownFormat(String::new()))
        );
    }

    #[test]
    fn the_chosen_format_is_what_is_compared_and_applied() {
        let want = desired(None);
        let kept = kept_spec(&[]);
        assert!(drift(&kept, &want, Format::Toml).is_empty());
        assert_eq!(drift(&kept, &want, Format::Ignition), ["spec.userData"]);
        let mut ignition = kept;
        ignition.user_data = Some(want.user_data.ignition.clone());
        assert!(drift(&ignition, &want, Format::Ignition).is_empty());
        assert_eq!(drift(&ignition, &want, Format::Toml), ["spec.userData"]);
        let body = applied("default", &want, Format::Ignition);
        assert_eq!(body["spec"]["userData"], want.user_data.ignition.as_str());
        let body = applied("default", &want, Format::Toml);
        assert_eq!(body["spec"]["userData"], want.user_data.toml.as_str());
    }

    #[test]
    fn the_rollout_guards_values_are_what_is_applied_in_every_format() {
        let want = desired(Some(vec![json!({"id": "ami-new"})]));
        let good = Values {
            user_data: "old\n".into(),
            ami_selector_terms: Some(vec![json!({"id": "ami-old"})]),
        };
        let kept = pinned(&want, &good);
        for format in [Format::Toml, Format::Ignition] {
            let body = applied("default", &kept, format);
            assert_eq!(body["spec"]["userData"], "old\n");
            assert_eq!(body["spec"]["amiSelectorTerms"], json!([{"id": "ami-old"}]));
        }
        assert_eq!(kept.metadata_options, want.metadata_options);
        let rendered = want.values(Format::Ignition);
        assert_eq!(rendered.user_data, want.user_data.ignition);
        assert_eq!(rendered.ami_selector_terms, want.ami_terms);
    }

    /// A change to a class's spec.
    type Edit = fn(&mut Ec2NodeClassSpec);

    #[test]
    fn each_weakened_metadata_option_is_drift() {
        let kept = kept_spec(&[]);
        let cases: [(&str, Edit); 4] = [
            ("spec.metadataOptions.httpTokens", |s| {
                options(s).http_tokens = Some("optional".into())
            }),
            ("spec.metadataOptions.httpPutResponseHopLimit", |s| {
                options(s).http_put_response_hop_limit = Some(2)
            }),
            ("spec.metadataOptions.httpEndpoint", |s| {
                options(s).http_endpoint = Some("disabled".into())
            }),
            ("spec.metadataOptions.httpTokens", |s| {
                options(s).http_tokens = None
            }),
        ];
        for (field, edit) in cases {
            let mut edited = kept.clone();
            edit(&mut edited);
            assert_eq!(drift(&edited, &desired(None), Format::Toml), [field]);
            assert!(
                drift(&edited, &leave_alone(), Format::Toml).is_empty(),
                "{field}"
            );
        }
        // Only the kept keys count: IPv6 is the user's.
        let mut ipv6 = kept.clone();
        options(&mut ipv6).http_protocol_ipv6 = Some("enabled".into());
        assert!(drift(&ipv6, &desired(None), Format::Toml).is_empty());
        // No metadataOptions at all (a schema without defaults): all three.
        let mut bare = kept;
        bare.metadata_options = None;
        assert_eq!(
            drift(&bare, &desired(None), Format::Toml),
            [
                "spec.metadataOptions.httpTokens",
                "spec.metadataOptions.httpPutResponseHopLimit",
                "spec.metadataOptions.httpEndpoint"
            ]
        );
    }

    #[test]
    fn the_apply_names_every_kept_field_and_nothing_else() {
        let with_terms = applied(
            "default",
            &desired(Some(vec![json!({"id": "ami-1"})])),
            Format::Toml,
        );
        let spec = with_terms["spec"].as_object().unwrap();
        let mut keys: Vec<&str> = spec.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "amiFamily",
                "amiSelectorTerms",
                "metadataOptions",
                "userData"
            ]
        );
        // The three kept keys only, so httpProtocolIPv6 stays the user's.
        assert_eq!(
            spec["metadataOptions"],
            json!({"httpEndpoint": "enabled", "httpPutResponseHopLimit": 1, "httpTokens": "required"})
        );
        assert_eq!(with_terms["metadata"], json!({"name": "default"}));
        let without = applied("default", &desired(None), Format::Toml);
        assert!(without["spec"].get("amiSelectorTerms").is_none());
        let alone = applied("default", &leave_alone(), Format::Toml);
        assert!(alone["spec"].get("metadataOptions").is_none());
    }

    #[test]
    fn weakened_options_are_exposures_and_defaults_are_not() {
        let mut spec = kept_spec(&[]);
        assert!(exposures(&spec).is_empty());
        options(&mut spec).http_endpoint = Some("disabled".into());
        options(&mut spec).http_protocol_ipv6 = Some("enabled".into());
        assert!(exposures(&spec).is_empty(), "not a way in for pods");
        options(&mut spec).http_tokens = Some("optional".into());
        assert_eq!(exposures(&spec).len(), 1);
        options(&mut spec).http_put_response_hop_limit = Some(2);
        let found = exposures(&spec);
        assert_eq!(found.len(), 2);
        assert!(
            found[1].contains("httpPutResponseHopLimit is 2"),
            "{found:?}"
        );
        spec.metadata_options = None;
        assert!(exposures(&spec).is_empty(), "Karpenter's defaults");
    }

    fn entry(manager: &str, operation: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    #[test]
    fn only_autonodes_applied_metadata_options_are_its_own() {
        let ours = json!({"f:spec": {"f:userData": {}, "f:metadataOptions": {
            ".": {}, "f:httpTokens": {}, "f:httpPutResponseHopLimit": {}, "f:httpEndpoint": {}}}});
        let users = json!({"f:spec": {"f:metadataOptions": {"f:httpProtocolIPv6": {}}}});
        let meta = ObjectMeta {
            managed_fields: Some(vec![
                entry("kubectl-edit", "Update", users.clone()),
                entry(FIELD_MANAGER, "Update", users),
                entry(FIELD_MANAGER, "Apply", ours),
            ]),
            ..Default::default()
        };
        assert_eq!(
            owned_metadata_options(&meta),
            ["httpEndpoint", "httpPutResponseHopLimit", "httpTokens"]
        );
        let released = ObjectMeta {
            managed_fields: Some(vec![entry(
                FIELD_MANAGER,
                "Apply",
                json!({"f:spec": {"f:userData": {}}}),
            )]),
            ..Default::default()
        };
        assert!(owned_metadata_options(&released).is_empty());
        assert!(owned_metadata_options(&ObjectMeta::default()).is_empty());
    }

    fn path(keys: &[&str]) -> SpecPath {
        keys.iter().map(|k| k.to_string()).collect()
    }

    #[test]
    fn the_handover_keeps_the_owned_keys_at_their_current_values() {
        let mut spec = kept_spec(&[]);
        options(&mut spec).http_put_response_hop_limit = Some(3);
        let keys = [
            path(&["metadataOptions", "httpPutResponseHopLimit"]),
            path(&["metadataOptions", "httpTokens"]),
        ];
        let body = handover("default", &spec, &keys, &[]).unwrap();
        assert_eq!(
            body["spec"],
            json!({"metadataOptions": {"httpPutResponseHopLimit": 3, "httpTokens": "required"}})
        );
        assert_eq!(body["metadata"], json!({"name": "default"}));
        assert_eq!(body["kind"], "EC2NodeClass");
        spec.metadata_options = None;
        assert!(handover("default", &spec, &keys, &[]).is_none());
        assert!(handover("default", &kept_spec(&[]), &[], &[]).is_none());
    }

    #[test]
    fn the_handover_keeps_the_ami_terms_and_what_it_took_over_before() {
        let terms = vec![json!({"id": "ami-0123"}), json!({"id": "ami-0456"})];
        let spec = kept_spec(&terms);
        let before = [path(&["metadataOptions", "httpTokens"])];
        let ami = [path(&["amiSelectorTerms"])];
        let body = handover("default", &spec, &ami, &before).unwrap();
        // Left out, the handover's own earlier fields would be removed.
        assert_eq!(
            body["spec"],
            json!({"amiSelectorTerms": terms, "metadataOptions": {"httpTokens": "required"}})
        );
        // Nothing released: nothing to hand over, whatever was before.
        assert!(handover("default", &spec, &[], &before).is_none());
        // No terms to keep (the typed spec reads an absent list as empty).
        assert!(handover("default", &kept_spec(&[]), &ami, &[]).is_none());
    }

    #[test]
    fn what_autonode_applied_and_no_longer_keeps_is_released() {
        let ours = json!({"f:spec": {"f:userData": {}, "f:amiFamily": {},
            "f:amiSelectorTerms": {}, "f:metadataOptions": {
            ".": {}, "f:httpTokens": {}, "f:httpPutResponseHopLimit": {}, "f:httpEndpoint": {}}}});
        let meta = ObjectMeta {
            managed_fields: Some(vec![
                entry("kubectl-edit", "Update", json!({"f:spec": {"f:role": {}}})),
                entry(FIELD_MANAGER, "Apply", ours),
            ]),
            ..Default::default()
        };
        assert_eq!(
            applied_paths(&meta, FIELD_MANAGER),
            [
                path(&["amiFamily"]),
                path(&["amiSelectorTerms"]),
                path(&["metadataOptions", "httpEndpoint"]),
                path(&["metadataOptions", "httpPutResponseHopLimit"]),
                path(&["metadataOptions", "httpTokens"]),
                path(&["userData"]),
            ]
        );
        let terms = Some(vec![json!({"id": "ami-0123"})]);
        assert!(released(&meta, &desired(terms.clone())).is_empty());
        // --ami-ids unset.
        assert_eq!(
            released(&meta, &desired(None)),
            [path(&["amiSelectorTerms"])]
        );
        // Enforcement off, with and without AMI ids.
        let options = [
            path(&["metadataOptions", "httpEndpoint"]),
            path(&["metadataOptions", "httpPutResponseHopLimit"]),
            path(&["metadataOptions", "httpTokens"]),
        ];
        let off = Desired {
            ami_terms: terms,
            ..leave_alone()
        };
        assert_eq!(released(&meta, &off), options);
        let mut both = vec![path(&["amiSelectorTerms"])];
        both.extend(options);
        assert_eq!(released(&meta, &leave_alone()), both);
        // Nothing applied, nothing to let go of.
        assert!(released(&ObjectMeta::default(), &leave_alone()).is_empty());
    }

    #[test]
    fn ami_ids_become_sorted_id_terms() {
        let entries = ["arm64=ami-0456".to_string(), " amd64=ami-0123 ".to_string()];
        assert_eq!(
            ami_selector_terms(&entries).unwrap(),
            Some(vec![json!({"id": "ami-0123"}), json!({"id": "ami-0456"})])
        );
        assert_eq!(ami_selector_terms(&[]).unwrap(), None);
        assert_eq!(ami_selector_terms(&[String::new()]).unwrap(), None);
        for bad in [
            "ami-0123",
            "amd64=0123",
            "=ami-01",
            "amd64=ami-xyz",
            "amd64=ami-",
        ] {
            assert!(ami_selector_terms(&[bad.into()]).is_err(), "{bad}");
        }
        let twice = ["amd64=ami-01".to_string(), "amd64=ami-02".to_string()];
        assert_eq!(
            ami_selector_terms(&twice),
            Err(AmiIdsError::Duplicate("amd64".into()))
        );
    }
}
