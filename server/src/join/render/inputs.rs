//! Finding the inputs of a node's config, then rendering it with
//! [`render`].
//!
//! Inputs, from watch-backed caches (not a GET per join, so a scale-out of
//! a thousand machines costs no API calls here):
//!
//! - the NodeClaim (given): taints, startup taints, labels and
//!   `spec.nodeClassRef`. Karpenter copies what the NodePool says about the
//!   node onto the NodeClaim when it creates it, so the NodePool itself is
//!   not read: it may have changed since.
//! - its EC2NodeClass: `spec.kubelet`, and the annotation
//!   [`IGNITION_ANNOTATION`] naming the ConfigMap or Secret with the
//!   class's Ignition config.
//! - ConfigMaps and Secrets in one namespace of the guest cluster
//!   (`--ignition-namespace`, default `autonode-system`): the base config
//!   every node gets (`--base-ignition`) and the classes' configs, each
//!   under the key [`IGNITION_KEY`]. A reference is `<name>` or
//!   `configmap/<name>` for a ConfigMap, `secret/<name>` for a Secret (for
//!   configs that carry credentials: the join answer is the only place a
//!   Secret's config goes, to an attested node over TLS).
//!
//! A referenced object that is missing, lacks the key or holds a config
//! the agent would refuse is an operator's error that can be fixed while
//! the agent keeps retrying: [`ConfigError`], which the join answers as
//! unavailable (503, retried until the agent's deadline), and a Warning Event says why on the
//! EC2NodeClass (on the NodeClaim when there is no class).
//!
//! Rendering is kept ([`render::Memo`]) under the UID and resourceVersion of
//! every ConfigMap and Secret it read, and the class's KubeletConfiguration:
//! while none of them is written, a join's config is a lookup; a written one
//! is checked anew, so what a broken config is refused with is the same.
//!
//! A NodeClaim whose EC2NodeClass is not found (in the cache, nor then by a
//! GET) gets the server's defaults and the base config, with a warning in
//! the log: Karpenter keeps a class that NodeClaims still use (a finalizer),
//! so this is a NodeClaim created by hand or by something other than
//! Karpenter's AWS provider.

use crate::join::render::{self, ClusterSettings, IgnitionError, NodeFacts};
use crate::kube::cache::{self, Cache};
use crate::kube::events::Events;
use crate::kube::karpenter::{Ec2NodeClass, Ec2NodeClassSpec, NodeClaim};
use crate::kube::reason::Reason;
use crate::primitives::told::Told;
use autonode_shared::ignition::Config;
use autonode_shared::protocol::KubeletSettings;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

/// Defined with every other `autonode.dev/*` name in [`crate::kube::marks`].
pub use crate::kube::marks::IGNITION_ANNOTATION;
/// The ConfigMap or Secret key holding an Ignition config (JSON, as Butane
/// writes it).
pub const IGNITION_KEY: &str = "config.ign";
/// Default namespace of the Ignition ConfigMaps.
pub const DEFAULT_NAMESPACE: &str = "autonode-system";
/// How long a join waits for the caches' first list.
const SYNC_WAIT: Duration = Duration::from_secs(10);
/// At most one Event per object and message this often: every agent of a
/// class retries while its config is broken.
const EVENT_INTERVAL: Duration = Duration::from_secs(60);
/// (object, message) pairs whose last Event is remembered: past it the
/// least recently asked are forgotten, and told again.
const REPORTED_CAPACITY: usize = 1024;

/// Where the operator's Ignition configs are.
#[derive(Debug, Clone)]
pub struct NodeConfigSettings {
    /// Namespace of the Ignition ConfigMaps and Secrets.
    pub namespace: String,
    /// Where the base config every node gets is, if anywhere.
    pub base_ignition: Option<Source>,
    /// Whether Ignition configs may come from Secrets. Off, the server
    /// never lists or watches Secrets, so its guest RBAC need not grant
    /// them (RBAC cannot narrow a list or watch to some Secrets).
    pub secrets: bool,
}

/// Where an Ignition config is kept: a ConfigMap or a Secret in the
/// Ignition namespace, under [`IGNITION_KEY`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    ConfigMap(String),
    Secret(String),
}

impl Source {
    /// `<name>` or `configmap/<name>` is a ConfigMap, `secret/<name>` a
    /// Secret. The kind is case-insensitive, as kubectl's is.
    pub fn parse(reference: &str) -> Result<Self, NodeConfigError> {
        let bad = |why: &str| NodeConfigError::BadReference {
            reference: reference.to_string(),
            why: why.to_string(),
        };
        let (kind, name) = match reference.split_once('/') {
            Some((kind, name)) => (kind.to_ascii_lowercase(), name),
            None => ("configmap".to_string(), reference),
        };
        let valid = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !valid {
            return Err(bad("the name is not a Kubernetes object name"));
        }
        match kind.as_str() {
            "configmap" | "configmaps" | "cm" => Ok(Self::ConfigMap(name.to_string())),
            "secret" | "secrets" => Ok(Self::Secret(name.to_string())),
            _ => Err(bad("the kind is neither configmap nor secret")),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::ConfigMap(_) => "ConfigMap",
            Self::Secret(_) => "Secret",
        }
    }

    fn name(&self) -> &str {
        match self {
            Self::ConfigMap(name) | Self::Secret(name) => name,
        }
    }
}

impl std::str::FromStr for Source {
    type Err = NodeConfigError;
    fn from_str(reference: &str) -> Result<Self, Self::Err> {
        Self::parse(reference)
    }
}

/// Why [`NodeConfig::render`] has no config for a node now. All of it can
/// be fixed while the agent retries.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The EC2NodeClass cache has not listed yet.
    #[error("{0}")]
    Classes(#[source] NodeConfigError),
    /// Reading an EC2NodeClass the cache lacks failed.
    #[error("kube API: {0}")]
    Api(#[from] kube::Error),
    /// The operator's config is missing or invalid (reported in an Event).
    #[error("node config: {0}")]
    Invalid(#[source] NodeConfigError),
}

/// Why a node's config cannot be rendered now.
#[derive(Debug, thiserror::Error)]
pub enum NodeConfigError {
    #[error("the {0} cache has not synced")]
    NotSynced(&'static str),
    #[error(
        "Ignition reference {reference:?}: {why} (want <name>, configmap/<name> or secret/<name>)"
    )]
    BadReference { reference: String, why: String },
    #[error("{kind} {namespace}/{name} ({purpose}) does not exist")]
    Missing {
        kind: &'static str,
        namespace: String,
        name: String,
        purpose: String,
    },
    #[error("{kind} {namespace}/{name} ({purpose}) has no key {IGNITION_KEY:?} in data")]
    MissingKey {
        kind: &'static str,
        namespace: String,
        name: String,
        purpose: String,
    },
    #[error("Secret {name} ({purpose}) cannot be read: Ignition from Secrets is turned off (--ignition-secrets=false)")]
    SecretsOff { name: String, purpose: String },
    #[error("Secret {namespace}/{name} ({purpose}): key {IGNITION_KEY:?} is not UTF-8 text")]
    NotText {
        namespace: String,
        name: String,
        purpose: String,
    },
    #[error(transparent)]
    Ignition(#[from] IgnitionError),
}

/// The caches and settings per-node config is rendered from.
#[derive(Clone)]
pub struct NodeConfig {
    classes: Cache<Ec2NodeClass>,
    class_api: Api<Ec2NodeClass>,
    configmaps: Cache<ConfigMap>,
    /// `None` when Ignition from Secrets is turned off.
    secrets: Option<Cache<Secret>>,
    settings: Arc<NodeConfigSettings>,
    events: Events,
    /// Which (object, message) Events were published, and when (the one
    /// "tell once", told again each [`EVENT_INTERVAL`]).
    reported: Arc<Told>,
    /// Layers checked and configs rendered, per version of their sources.
    memo: Arc<render::Memo<Source>>,
}

impl NodeConfig {
    /// Starts watching EC2NodeClasses and the Ignition namespace's
    /// ConfigMaps and Secrets in the background.
    pub fn start(client: Client, settings: NodeConfigSettings, events: Events) -> Self {
        let class_api = Api::all(client.clone());
        let classes = Cache::start_paged(
            class_api.clone(),
            "EC2NodeClass",
            strip_class,
            cache::SMALL_PAGE,
        );
        let configmaps = Cache::start_filtered(
            Api::namespaced(client.clone(), &settings.namespace),
            "Ignition ConfigMap",
            strip_configmap,
        );
        let secrets = settings.secrets.then(|| {
            Cache::start_filtered(
                Api::namespaced(client, &settings.namespace),
                "Ignition Secret",
                strip_secret,
            )
        });
        Self {
            classes,
            class_api,
            configmaps,
            secrets,
            settings: Arc::new(settings),
            events,
            reported: Arc::new(Told::again_after(EVENT_INTERVAL, REPORTED_CAPACITY)),
            memo: Arc::default(),
        }
    }

    /// The node's kubelet settings and Ignition config.
    pub async fn render(
        &self,
        cluster: &ClusterSettings,
        facts: &NodeFacts<'_>,
    ) -> Result<(KubeletSettings, serde_json::Value), ConfigError> {
        let class = self.class_of(facts.claim).await?;
        // Once per class generation: maxPods or kubeReserved left unset.
        crate::join::render::unset::warn_unset(&self.events, class.as_deref());
        let kubelet_spec = class.as_ref().and_then(|c| c.spec.kubelet.as_ref());
        let kubelet = render::kubelet(cluster, kubelet_spec, facts);
        let ignition = self.ignition(class.as_deref(), &kubelet.config).await;
        match ignition {
            Ok(ignition) => Ok((kubelet, ignition)),
            Err(e) => {
                self.report(class.as_deref(), facts.claim, &e);
                Err(ConfigError::Invalid(e))
            }
        }
    }

    /// The first cache that has not had its first full list yet, if any
    /// (`/readyz`): until then a join would wait on it.
    pub fn unsynced(&self) -> Option<&'static str> {
        let secrets = self.secrets.as_ref().map(|c| &c.status);
        [
            Some(&self.classes.status),
            Some(&self.configmaps.status),
            secrets,
        ]
        .into_iter()
        .flatten()
        .find_map(|status| (!status.is_listed()).then_some(status.what))
    }

    /// The NodeClaim's EC2NodeClass, if it names one that exists.
    async fn class_of(&self, claim: &NodeClaim) -> Result<Option<Arc<Ec2NodeClass>>, ConfigError> {
        let Some(reference) = &claim.spec.node_class_ref else {
            return Ok(None);
        };
        let (kind, group) = (Ec2NodeClass::kind(&()), Ec2NodeClass::group(&()));
        if reference.kind != kind || reference.group != group {
            return Ok(None);
        }
        wait(&self.classes).await.map_err(ConfigError::Classes)?;
        let found = self.find_class(&reference.name).await?;
        if found.is_none() {
            tracing::warn!(
                nodeclaim = claim.metadata.name.as_deref().unwrap_or("-"),
                ec2nodeclass = %reference.name,
                "EC2NodeClass not found; rendering with the server's defaults"
            );
        }
        Ok(found)
    }

    /// The class named `name`: from the cache, else (a class created just
    /// before its NodeClaim, while the watch catches up) from the API
    /// server. Karpenter launches only from classes that exist, so the GET
    /// is rare.
    async fn find_class(&self, name: &str) -> Result<Option<Arc<Ec2NodeClass>>, ConfigError> {
        if let Some(class) = self.classes.store.get(&ObjectRef::new(name)) {
            return Ok(Some(class));
        }
        Ok(self.class_api.get_opt(name).await?.map(Arc::new))
    }

    /// The node's Ignition config: as rendered before from the same
    /// versions of its layers and the same KubeletConfiguration, else
    /// rendered now. Each object is read from its cache once, so the result
    /// is kept under the version it was made from.
    async fn ignition(
        &self,
        class: Option<&Ec2NodeClass>,
        kubelet_config: &serde_json::Value,
    ) -> Result<serde_json::Value, NodeConfigError> {
        let wanted = self.wanted(class).await?;
        let objects: Vec<_> = wanted
            .iter()
            .map(|(source, _)| self.object(source))
            .collect();
        let versions: Vec<_> = wanted
            .iter()
            .zip(&objects)
            .map(|((source, _), object)| {
                (source.clone(), object.as_ref().and_then(Object::version))
            })
            .collect();
        let rendered = self.memo.rendered(&versions, kubelet_config, || {
            tracing::debug!(layers = wanted.len(), "rendering Ignition anew");
            self.memo.retain(|source| self.object(source).is_some());
            let layers = wanted
                .iter()
                .zip(&objects)
                .map(|((source, purpose), object)| self.layer(source, purpose, object.as_ref()))
                .collect::<Result<Vec<_>, _>>()?;
            Ok::<_, NodeConfigError>(render::ignition(&layers, kubelet_config)?)
        })?;
        Ok(rendered.as_ref().clone())
    }

    /// The operator's layers, lowest precedence first (base, then class),
    /// once their caches have listed.
    async fn wanted(
        &self,
        class: Option<&Ec2NodeClass>,
    ) -> Result<Vec<(Source, String)>, NodeConfigError> {
        let class_source = match class.and_then(class_reference) {
            Some((reference, purpose)) => Some((Source::parse(&reference)?, purpose)),
            None => None,
        };
        let base_source = self
            .settings
            .base_ignition
            .clone()
            .map(|source| (source, "base Ignition, --base-ignition".to_string()));
        let wanted: Vec<_> = base_source.into_iter().chain(class_source).collect();
        for (source, purpose) in &wanted {
            match source {
                Source::ConfigMap(_) => wait(&self.configmaps).await?,
                Source::Secret(name) => wait(self.secret_cache(name, purpose)?).await?,
            }
        }
        Ok(wanted)
    }

    /// The object `source` names, as its cache holds it now (`None` also
    /// when Secrets are off: [`Self::wanted`] says so first).
    fn object(&self, source: &Source) -> Option<Object> {
        let namespace = &self.settings.namespace;
        match source {
            Source::ConfigMap(name) => {
                let key = ObjectRef::new(name).within(namespace);
                self.configmaps.store.get(&key).map(Object::ConfigMap)
            }
            Source::Secret(name) => {
                let key = ObjectRef::new(name).within(namespace);
                self.secrets.as_ref()?.store.get(&key).map(Object::Secret)
            }
        }
    }

    /// One ConfigMap's or Secret's config (`object`, read by
    /// [`Self::object`]), parsed and checked, or as checked before at the
    /// same version.
    fn layer(
        &self,
        source: &Source,
        purpose: &str,
        object: Option<&Object>,
    ) -> Result<Arc<Config>, NodeConfigError> {
        let check = || {
            let text = self.text(source, purpose, object)?;
            let origin = format!(
                "{} {}/{} ({purpose})",
                source.kind(),
                self.settings.namespace,
                source.name()
            );
            Ok(render::parse_layer(&origin, &text)?)
        };
        match object.and_then(Object::version) {
            Some(version) => self.memo.layer(source, &version, check),
            None => check().map(Arc::new),
        }
    }

    /// The text of `object`'s [`IGNITION_KEY`], or why there is none.
    fn text(
        &self,
        source: &Source,
        purpose: &str,
        object: Option<&Object>,
    ) -> Result<String, NodeConfigError> {
        let namespace = &self.settings.namespace;
        let (kind, name) = (source.kind(), source.name());
        let missing = || NodeConfigError::Missing {
            kind,
            namespace: namespace.clone(),
            name: name.to_string(),
            purpose: purpose.to_string(),
        };
        let no_key = || NodeConfigError::MissingKey {
            kind,
            namespace: namespace.clone(),
            name: name.to_string(),
            purpose: purpose.to_string(),
        };
        match object.ok_or_else(missing)? {
            Object::ConfigMap(map) => {
                let data = map.data.as_ref().and_then(|d| d.get(IGNITION_KEY));
                data.cloned().ok_or_else(no_key)
            }
            Object::Secret(secret) => {
                let data = secret.data.as_ref().and_then(|d| d.get(IGNITION_KEY));
                let bytes = data.ok_or_else(no_key)?.0.clone();
                String::from_utf8(bytes).map_err(|_| NodeConfigError::NotText {
                    namespace: namespace.clone(),
                    name: name.to_string(),
                    purpose: purpose.to_string(),
                })
            }
        }
    }

    /// The Secret cache, or why a config in Secret `name` cannot be read.
    fn secret_cache(&self, name: &str, purpose: &str) -> Result<&Cache<Secret>, NodeConfigError> {
        self.secrets
            .as_ref()
            .ok_or_else(|| NodeConfigError::SecretsOff {
                name: name.to_string(),
                purpose: purpose.to_string(),
            })
    }

    /// A Warning Event on the class (else the NodeClaim), at most once per
    /// [`EVENT_INTERVAL`] for the same object and message.
    fn report(&self, class: Option<&Ec2NodeClass>, claim: &NodeClaim, error: &NodeConfigError) {
        if matches!(error, NodeConfigError::NotSynced(_)) {
            return;
        }
        let message = error.to_string();
        let object = match class {
            Some(c) => format!("ec2nodeclass/{}", c.metadata.name.as_deref().unwrap_or("")),
            None => format!("nodeclaim/{}", claim.metadata.name.as_deref().unwrap_or("")),
        };
        // Keyed by both, so each message of an object has its own interval.
        if !self.reported.first(&format!("{object}\n{message}"), "") {
            return;
        }
        match class {
            Some(class) => self
                .events
                .warning(class, Reason::NodeConfigInvalid, message),
            None => self
                .events
                .warning(claim, Reason::NodeConfigInvalid, message),
        }
    }
}

/// A ConfigMap or Secret as its cache holds it, read once per join.
enum Object {
    ConfigMap(Arc<ConfigMap>),
    Secret(Arc<Secret>),
}

impl Object {
    /// The object's UID and resourceVersion: every write changes the one,
    /// deleting and re-creating it the other. `None` if either is missing
    /// (never from the API server), and then nothing is kept.
    fn version(&self) -> Option<String> {
        let meta: &ObjectMeta = match self {
            Self::ConfigMap(map) => &map.metadata,
            Self::Secret(secret) => &secret.metadata,
        };
        Some(format!(
            "{}/{}",
            meta.uid.as_deref()?,
            meta.resource_version.as_deref()?
        ))
    }
}

/// The class's Ignition reference and what it is for, if it has one.
fn class_reference(class: &Ec2NodeClass) -> Option<(String, String)> {
    let reference = class
        .metadata
        .annotations
        .as_ref()?
        .get(IGNITION_ANNOTATION)?;
    let purpose = format!(
        "Ignition of EC2NodeClass {}",
        class.metadata.name.as_deref()?
    );
    (!reference.is_empty()).then(|| (reference.clone(), purpose))
}

/// What the EC2NodeClass cache keeps: the class's identity, of its spec
/// `kubelet`, and of its annotations only [`IGNITION_ANNOTATION`] (the
/// class's type parses little more: see [`cache`] and
/// [`crate::kube::class_meta`]).
fn strip_class(class: &mut Ec2NodeClass) {
    class.spec = Ec2NodeClassSpec {
        kubelet: class.spec.kubelet.take(),
        ..Ec2NodeClassSpec::default()
    };
    class.status = None;
    let ignition = class
        .metadata
        .annotations
        .take()
        .and_then(|mut a| a.remove_entry(IGNITION_ANNOTATION));
    cache::identity_only(&mut class.metadata);
    class.metadata.annotations = ignition.map(|entry| BTreeMap::from([entry]));
}

/// What the Ignition ConfigMap cache keeps: the name and [`IGNITION_KEY`].
/// Other ConfigMaps of the namespace (and `kubectl apply`'s copy of the
/// whole data in an annotation) are nothing to a join.
fn strip_configmap(map: &mut ConfigMap) {
    cache::identity_only(&mut map.metadata);
    map.binary_data = None;
    map.data = only_ignition(map.data.take());
}

/// What the Ignition Secret cache keeps: the name and [`IGNITION_KEY`]. The
/// namespace's other Secrets are not held in memory at all.
fn strip_secret(secret: &mut Secret) {
    cache::identity_only(&mut secret.metadata);
    secret.string_data = None;
    secret.data = only_ignition(secret.data.take());
}

/// `data` with only [`IGNITION_KEY`] left, if it has it.
fn only_ignition<V>(data: Option<BTreeMap<String, V>>) -> Option<BTreeMap<String, V>> {
    let entry = data?.remove_entry(IGNITION_KEY)?;
    Some(BTreeMap::from([entry]))
}

/// Waits (bounded) for `cache`'s first full list.
async fn wait<K>(cache: &Cache<K>) -> Result<(), NodeConfigError>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    let status = &cache.status;
    match tokio::time::timeout(SYNC_WAIT, status.wait_listed()).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(NodeConfigError::NotSynced(status.what)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_name_is_a_configmap() {
        assert_eq!(
            Source::parse("base").unwrap(),
            Source::ConfigMap("base".into())
        );
        assert_eq!(
            Source::parse("configmap/gpu.v2").unwrap(),
            Source::ConfigMap("gpu.v2".into())
        );
        assert_eq!(
            Source::parse("cm/x").unwrap(),
            Source::ConfigMap("x".into())
        );
    }

    #[test]
    fn secret_slash_name_is_a_secret() {
        assert_eq!(
            Source::parse("secret/registry-auth").unwrap(),
            Source::Secret("registry-auth".into())
        );
        assert_eq!(
            Source::parse("Secret/x").unwrap(),
            Source::Secret("x".into())
        );
    }

    #[test]
    fn other_kinds_and_bad_names_are_refused() {
        for reference in [
            "",
            "pod/x",
            "secret/",
            "configmap/",
            "a/b/c",
            "Base",
            "x y",
            "../etc",
        ] {
            let err = Source::parse(reference).unwrap_err();
            assert!(
                matches!(err, NodeConfigError::BadReference { .. }),
                "{reference:?}: {err}"
            );
        }
        let long = "x".repeat(254);
        assert!(Source::parse(&long).is_err());
    }

    #[test]
    fn caches_keep_only_what_a_join_reads() {
        use serde_json::json;
        let big = "x".repeat(10_000);
        let meta = json!({
            "name": "gpu", "namespace": DEFAULT_NAMESPACE, "uid": "u1",
            "labels": {"l": "v"}, "managedFields": [{"manager": "kubectl"}],
            "annotations": {IGNITION_ANNOTATION: "secret/gpu", "other": big},
        });
        let mut class: Ec2NodeClass = serde_json::from_value(json!({"metadata": meta, "spec": {
                "amiFamily": "Custom", "userData": big, "kubelet": {"maxPods": 110}}}))
        .unwrap();
        strip_class(&mut class);
        assert_eq!(
            class.metadata.annotations,
            Some(BTreeMap::from([(
                IGNITION_ANNOTATION.to_string(),
                "secret/gpu".to_string()
            )]))
        );
        assert!(class.metadata.labels.is_none() && class.metadata.managed_fields.is_none());
        assert_eq!(class.spec.ami_family, None);
        assert_eq!(class.spec.user_data, None);
        assert_eq!(
            class.spec.kubelet.as_ref().and_then(|k| k.max_pods),
            Some(110)
        );
        assert_eq!(
            class_reference(&class).map(|r| r.0).as_deref(),
            Some("secret/gpu")
        );

        let data = json!({IGNITION_KEY: "{}", "other": big});
        let mut map: ConfigMap = serde_json::from_value(
            json!({"metadata": meta, "data": data, "binaryData": {"b": "eA=="}}),
        )
        .unwrap();
        strip_configmap(&mut map);
        let kept = serde_json::to_value(&map).unwrap();
        let identity = json!({"name": "gpu", "namespace": DEFAULT_NAMESPACE, "uid": "u1"});
        let kind = |kind: &str| json!({"apiVersion": "v1", "kind": kind, "metadata": identity});
        let mut want = kind("ConfigMap");
        want["data"] = json!({IGNITION_KEY: "{}"});
        assert_eq!(kept, want);

        let mut secret: Secret = serde_json::from_value(
            json!({"metadata": meta, "data": {"token": "eA==", "other": "eQ=="}}),
        )
        .unwrap();
        strip_secret(&mut secret);
        assert_eq!(serde_json::to_value(&secret).unwrap(), kind("Secret"));
    }
}
