//! What each node is told: kubelet settings and its Ignition config.
//!
//! Pure: inputs in, JSON out. [`crate::nodeconfig`] finds the inputs (the
//! NodeClaim, its EC2NodeClass, the operator's Ignition configs) and calls
//! this. Deterministic: the same inputs give byte-identical output (maps are
//! ordered, entries are sorted, nothing reads a clock or a random source).
//!
//! **Kubelet.** A `kubelet.config.k8s.io/v1beta1` KubeletConfiguration with
//! `EC2NodeClass.spec.kubelet` mapped field for field (the names are the
//! same in both), so the node's allocatable is what Karpenter bin-packed
//! with. Where the class is silent the server's flags (`clusterDNS`) or
//! kubelet's own defaults apply; nothing is invented. In particular an unset
//! `maxPods` stays unset (kubelet: 110) although Karpenter v1, for
//! `amiFamily: Custom`, then assumes the instance type's ENI-limited pod
//! count: classes should set `maxPods` (and `kubeReserved`, for which
//! Karpenter likewise assumes a pods- and CPU-based default).
//!
//! **Ignition.** Three layers, merged in order: the operator's base config
//! for the cluster < the EC2NodeClass's config < what autonode generates
//! (kubelet's config file). An entry at the same path (files, directories
//! and links share one namespace, as on disk), or a unit, user or group of
//! the same name, in a later layer replaces the earlier entry whole;
//! nothing is merged field by field. The result's version is the newest of
//! the layers'. Each layer, and the result, is checked by
//! [`autonode_shared::ignition::parse`], the agent's own check: a config a
//! node would refuse is refused here, at render time, and never served.

use crate::karpenter::{KubeletSpec, NodeClaim, Taint, UNREGISTERED_TAINT};
use autonode_shared::ignition::{self as spec, Config, SpecError};
use autonode_shared::labels::kubelet_may_set;
use autonode_shared::protocol::KubeletSettings;
use base64::Engine as _;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// Where the agent writes kubelet's config (agent/src/kubelet.rs `CONFIG`);
/// the generated Ignition layer writes the same file, so an operator's
/// entry at this path visibly loses in the rendered config.
pub const KUBELET_CONFIG_PATH: &str = "/etc/kubernetes/kubelet/config.json";
/// The spec version of the generated layer (and of a config without
/// operator layers). The merged config takes the newest layer's version,
/// so operator layers up to [`spec::MAX_MINOR`] keep theirs.
const GENERATED_MINOR: u32 = 4;
const _: () = assert!(GENERATED_MINOR <= spec::MAX_MINOR);

/// Cluster-wide settings that go into every node's config.
#[derive(Debug, Clone, Default)]
pub struct ClusterSettings {
    /// IPs of the cluster DNS service, for `clusterDNS`, unless the
    /// EC2NodeClass sets its own.
    pub cluster_dns: Vec<String>,
    /// The cluster's DNS domain.
    pub cluster_domain: String,
}

/// The facts about one node that its config depends on.
pub struct NodeFacts<'a> {
    pub claim: &'a NodeClaim,
    pub provider_id: &'a str,
    pub node_ip: String,
}

/// Why an operator's Ignition config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IgnitionError {
    #[error("{origin}: not JSON: {error}")]
    Json { origin: String, error: String },
    #[error("{origin}: {error}")]
    Spec { origin: String, error: SpecError },
    /// The merge of checked layers broke a rule (a defect: each layer was
    /// valid, and later entries replace earlier ones whole).
    #[error("the merged Ignition config is refused: {0}")]
    Merged(SpecError),
    #[error("writing the merged Ignition config: {0}")]
    Write(#[from] serde_json::Error),
}

/// The kubelet settings for this node; `class` is its EC2NodeClass's
/// `spec.kubelet`, if any.
pub fn kubelet(
    cluster: &ClusterSettings,
    class: Option<&KubeletSpec>,
    node: &NodeFacts<'_>,
) -> KubeletSettings {
    KubeletSettings {
        config: kubelet_configuration(cluster, class.unwrap_or(&KubeletSpec::default())),
        provider_id: node.provider_id.to_string(),
        node_ip: node.node_ip.clone(),
        register_with_taints: registration_taints(node.claim),
        node_labels: node_labels(node.claim),
    }
}

/// A KubeletConfiguration: authentication through the API server only,
/// certificate rotation and graceful shutdown on, then the class's
/// settings.
fn kubelet_configuration(cluster: &ClusterSettings, class: &KubeletSpec) -> Value {
    let mut config = Map::new();
    let mut set = |key: &str, value: Value| {
        config.insert(key.to_string(), value);
    };
    set("apiVersion", json!("kubelet.config.k8s.io/v1beta1"));
    set("kind", json!("KubeletConfiguration"));
    set(
        "authentication",
        json!({
            "anonymous": { "enabled": false },
            "webhook": { "enabled": true },
            "x509": { "clientCAFile": "/etc/kubernetes/pki/ca.crt" },
        }),
    );
    set("authorization", json!({ "mode": "Webhook" }));
    set("cgroupDriver", json!("systemd"));
    set("clusterDomain", json!(cluster.cluster_domain));
    // Client certificates renew themselves; serving certificates come from
    // CSRs the approver judges.
    set("rotateCertificates", json!(true));
    set("serverTLSBootstrap", json!(true));
    // Karpenter drains before terminating, but a spot interruption or a
    // manual stop must still give pods time to exit.
    set("shutdownGracePeriod", json!("45s"));
    set("shutdownGracePeriodCriticalPods", json!("15s"));
    set(
        "clusterDNS",
        json!(class.cluster_dns.as_ref().unwrap_or(&cluster.cluster_dns)),
    );
    for (key, value) in class_settings(class) {
        set(key, value);
    }
    Value::Object(config)
}

/// `EC2NodeClass.spec.kubelet`'s settings under their KubeletConfiguration
/// names (`clusterDNS` is handled with the server's default). Unset fields
/// are left out, so kubelet's defaults apply.
fn class_settings(class: &KubeletSpec) -> Vec<(&'static str, Value)> {
    let fields = [
        ("maxPods", class.max_pods.map(Value::from)),
        ("podsPerCore", class.pods_per_core.map(Value::from)),
        ("systemReserved", class.system_reserved.as_ref().map(map)),
        ("kubeReserved", class.kube_reserved.as_ref().map(map)),
        ("evictionHard", class.eviction_hard.as_ref().map(map)),
        ("evictionSoft", class.eviction_soft.as_ref().map(map)),
        (
            "evictionSoftGracePeriod",
            class.eviction_soft_grace_period.as_ref().map(map),
        ),
        (
            "evictionMaxPodGracePeriod",
            class.eviction_max_pod_grace_period.map(Value::from),
        ),
        (
            "imageGCHighThresholdPercent",
            class.image_gc_high_threshold_percent.map(Value::from),
        ),
        (
            "imageGCLowThresholdPercent",
            class.image_gc_low_threshold_percent.map(Value::from),
        ),
        ("cpuCFSQuota", class.cpu_cfs_quota.map(Value::from)),
    ];
    fields
        .into_iter()
        .filter_map(|(key, value)| Some((key, value?)))
        .collect()
}

fn map(entries: &BTreeMap<String, String>) -> Value {
    Value::Object(
        entries
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect(),
    )
}

/// `karpenter.sh/unregistered:NoExecute` always, then the NodeClaim's taints
/// and startup taints, without duplicates.
pub fn registration_taints(claim: &NodeClaim) -> Vec<String> {
    let unregistered = Taint {
        key: UNREGISTERED_TAINT.into(),
        value: None,
        effect: "NoExecute".into(),
    };
    let mut out: Vec<String> = Vec::new();
    let all = std::iter::once(&unregistered)
        .chain(&claim.spec.taints)
        .chain(&claim.spec.startup_taints);
    for taint in all {
        let text = match &taint.value {
            Some(value) if !value.is_empty() => format!("{}={}:{}", taint.key, value, taint.effect),
            _ => format!("{}:{}", taint.key, taint.effect),
        };
        if !out.contains(&text) {
            out.push(text);
        }
    }
    out
}

/// The NodeClaim's labels that kubelet may set on itself.
pub fn node_labels(claim: &NodeClaim) -> BTreeMap<String, String> {
    claim
        .labels()
        .into_iter()
        .filter(|(key, _)| kubelet_may_set(key))
        .collect()
}

/// Parses an operator's Ignition config (JSON text) and checks it by the
/// agent's rules ([`spec::parse`], the one check the agent also runs before
/// applying: shape, versions, data URLs decoded and hashes verified, paths,
/// names, duplicates within the config). `origin` names it in errors (e.g.
/// `ConfigMap autonode-system/base`). `autonode-server ignition check` runs
/// exactly this.
pub fn parse_layer(origin: &str, text: &str) -> Result<Config, IgnitionError> {
    let value: Value = serde_json::from_str(text).map_err(|e| IgnitionError::Json {
        origin: origin.to_string(),
        error: e.to_string(),
    })?;
    spec::parse(&value).map_err(|error| IgnitionError::Spec {
        origin: origin.to_string(),
        error,
    })
}

/// The node's Ignition config: `layers` (operator configs, lowest
/// precedence first, already checked by [`parse_layer`]) merged under the
/// generated layer, which writes `kubelet_config` where the agent does.
///
/// The result is checked again by [`spec::parse`], exactly as the agent will
/// check it, so a config that would be refused on the node is never served.
pub fn ignition(layers: &[Config], kubelet_config: &Value) -> Result<Value, IgnitionError> {
    let generated = generated_layer(kubelet_config)?;
    let merged = merge(layers.iter().chain(std::iter::once(&generated)));
    let value = serde_json::to_value(&merged)?;
    spec::parse(&value).map_err(IgnitionError::Merged)?;
    Ok(value)
}

/// What autonode itself puts in every node's config.
fn generated_layer(kubelet_config: &Value) -> Result<Config, IgnitionError> {
    // The same bytes the agent writes, so applying both changes the file once.
    let bytes = serde_json::to_vec_pretty(kubelet_config)?;
    let source = format!(
        "data:;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    );
    let file = spec::File {
        path: KUBELET_CONFIG_PATH.to_string(),
        overwrite: Some(true),
        mode: Some(0o644),
        user: spec::OwnerId::default(),
        group: spec::OwnerId::default(),
        contents: spec::Contents {
            source: Some(source),
            ..Default::default()
        },
    };
    let mut config = Config::default();
    config.ignition.version = version(GENERATED_MINOR);
    config.storage.files.push(file);
    Ok(config)
}

/// One entry of the storage namespace.
enum Entry {
    File(spec::File),
    Directory(spec::Directory),
    Link(spec::Link),
}

/// Later layers replace earlier entries at the same path, unit name, user
/// name or group name; the output is sorted by path and name, whatever
/// order the inputs had. Paths need no cleaning: [`spec::parse`] refuses
/// any that is not fully simplified, so equal places are equal strings.
fn merge<'a>(layers: impl Iterator<Item = &'a Config>) -> Config {
    let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
    let mut units = BTreeMap::new();
    let mut users = BTreeMap::new();
    let mut groups = BTreeMap::new();
    let mut minor = 0;
    for layer in layers {
        // The newest layer's version, so every field any layer uses is
        // known at the merged version (fields are only ever added).
        minor = minor.max(layer.ignition.minor().unwrap_or(0));
        let storage = &layer.storage;
        for file in &storage.files {
            entries.insert(file.path.clone(), Entry::File(file.clone()));
        }
        for directory in &storage.directories {
            entries.insert(directory.path.clone(), Entry::Directory(directory.clone()));
        }
        for link in &storage.links {
            entries.insert(link.path.clone(), Entry::Link(link.clone()));
        }
        for unit in &layer.systemd.units {
            units.insert(unit.name.clone(), unit.clone());
        }
        for user in &layer.passwd.users {
            users.insert(user.name.clone(), user.clone());
        }
        for group in &layer.passwd.groups {
            groups.insert(group.name.clone(), group.clone());
        }
    }
    let mut out = Config::default();
    out.ignition.version = version(minor);
    out.passwd.users = users.into_values().collect();
    out.passwd.groups = groups.into_values().collect();
    for entry in entries.into_values() {
        match entry {
            Entry::File(file) => out.storage.files.push(file),
            Entry::Directory(directory) => out.storage.directories.push(directory),
            Entry::Link(link) => out.storage.links.push(link),
        }
    }
    out.systemd.units = units.into_values().collect();
    out
}

fn version(minor: u32) -> String {
    format!("3.{minor}.0")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> NodeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "labels": {
                "karpenter.sh/nodepool": "default",
                "node-role.kubernetes.io/worker": "",
                "topology.kubernetes.io/zone": "us-west-2a",
            }},
            "spec": {
                "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
                "startupTaints": [{"key": "cilium.io/agent-not-ready", "effect": "NoExecute"},
                                  {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
            },
        }))
        .unwrap()
    }

    fn cluster() -> ClusterSettings {
        ClusterSettings {
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
        }
    }

    fn facts(claim: &NodeClaim) -> NodeFacts<'_> {
        NodeFacts {
            claim,
            provider_id: "aws:///us-west-2a/i-1",
            node_ip: "10.0.0.1".into(),
        }
    }

    /// `EC2NodeClass.spec.kubelet` with every field set, as JSON text.
    const FULL_KUBELET: &str = r#"{
        "maxPods": 58, "podsPerCore": 4,
        "systemReserved": {"cpu": "100m", "memory": "100Mi", "ephemeral-storage": "1Gi"},
        "kubeReserved": {"cpu": "200m", "memory": "300Mi"},
        "evictionHard": {"memory.available": "5%", "nodefs.available": "10%"},
        "evictionSoft": {"memory.available": "10%"},
        "evictionSoftGracePeriod": {"memory.available": "1m30s"},
        "evictionMaxPodGracePeriod": 60,
        "imageGCHighThresholdPercent": 85, "imageGCLowThresholdPercent": 80,
        "cpuCFSQuota": false, "clusterDNS": ["10.100.0.10"]
    }"#;

    #[test]
    fn every_class_kubelet_field_is_in_the_kubelet_configuration() {
        let class: KubeletSpec = serde_json::from_str(FULL_KUBELET).unwrap();
        let given = serde_json::to_value(&class).unwrap();
        let given = given.as_object().unwrap();
        assert_eq!(given.len(), 12, "the fixture sets every KubeletSpec field");
        let claim = claim();
        let config = kubelet(&cluster(), Some(&class), &facts(&claim)).config;
        for (key, value) in given {
            assert_eq!(&config[key], value, "{key}");
        }
        assert_eq!(config["maxPods"], 58);
        assert_eq!(config["kubeReserved"]["memory"], "300Mi");
        assert_eq!(
            config["evictionSoftGracePeriod"]["memory.available"],
            "1m30s"
        );
        assert_eq!(config["cpuCFSQuota"], false);
        assert_eq!(
            config["clusterDNS"],
            json!(["10.100.0.10"]),
            "the class wins"
        );
        assert_eq!(config["clusterDomain"], "cluster.local");
    }

    #[test]
    fn without_a_class_the_servers_defaults_and_kubelets_apply() {
        let claim = claim();
        let config = kubelet(&cluster(), None, &facts(&claim)).config;
        assert_eq!(config["kind"], "KubeletConfiguration");
        assert_eq!(config["apiVersion"], "kubelet.config.k8s.io/v1beta1");
        assert_eq!(config["clusterDNS"], json!(["10.96.0.10"]));
        assert_eq!(config["rotateCertificates"], true);
        assert_eq!(config["serverTLSBootstrap"], true);
        assert_eq!(config["shutdownGracePeriod"], "45s");
        assert_eq!(config["shutdownGracePeriodCriticalPods"], "15s");
        for unset in ["maxPods", "kubeReserved", "evictionHard", "podsPerCore"] {
            assert!(config.get(unset).is_none(), "{unset} is not invented");
        }
    }

    #[test]
    fn taints_start_with_unregistered_and_have_no_duplicates() {
        assert_eq!(
            registration_taints(&claim()),
            [
                "karpenter.sh/unregistered:NoExecute",
                "dedicated=gpu:NoSchedule",
                "cilium.io/agent-not-ready:NoExecute",
            ]
        );
        let settings = kubelet(&cluster(), None, &facts(&claim()));
        assert_eq!(settings.register_with_taints, registration_taints(&claim()));
        assert_eq!(settings.provider_id, "aws:///us-west-2a/i-1");
    }

    #[test]
    fn labels_kubelet_may_not_set_are_dropped() {
        let labels = node_labels(&claim());
        assert_eq!(
            labels.keys().collect::<Vec<_>>(),
            ["karpenter.sh/nodepool", "topology.kubernetes.io/zone"]
        );
    }

    fn layer(text: &str) -> Config {
        parse_layer("test", text).unwrap()
    }

    const BASE: &str = r#"{"ignition": {"version": "3.2.0"}, "storage": {
        "files": [{"path": "/etc/motd", "contents": {"source": "data:,base"}},
                  {"path": "/etc/kubernetes/kubelet/config.json", "contents": {"source": "data:,%7B%7D"}},
                  {"path": "/etc/base-only", "mode": 384}],
        "directories": [{"path": "/opt/tools"}]},
        "systemd": {"units": [{"name": "a.service", "contents": "[Unit]\n"},
                              {"name": "b.service", "enabled": true}]}}"#;
    const CLASS: &str = r#"{"ignition": {"version": "3.3.0"}, "storage": {
        "links": [{"path": "/opt/tools", "target": "/usr/local/tools"}],
        "files": [{"path": "/etc/motd", "contents": {"source": "data:,class"}}]},
        "systemd": {"units": [{"name": "a.service", "mask": true}]}}"#;

    #[test]
    fn layers_merge_base_then_class_then_generated() {
        let claim = claim();
        let kubelet_config = kubelet(&cluster(), None, &facts(&claim)).config;
        let merged = ignition(&[layer(BASE), layer(CLASS)], &kubelet_config).unwrap();
        let parsed = spec::parse(&merged).expect("the agent accepts the result");
        assert_eq!(parsed.ignition.version, "3.4.0", "newest of the layers");
        let files: Vec<(&str, Option<&str>)> = parsed
            .storage
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.contents.source.as_deref()))
            .collect();
        assert_eq!(files[0], ("/etc/base-only", None));
        assert_eq!(files[2], ("/etc/motd", Some("data:,class")), "class wins");
        assert_eq!(files[1].0, KUBELET_CONFIG_PATH, "generated wins");
        let written = &parsed.storage.files[1];
        let want = serde_json::to_vec_pretty(&kubelet_config).unwrap();
        let data = written.contents.source.as_deref().unwrap();
        let data = data.strip_prefix("data:;base64,").unwrap();
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap(),
            want
        );
        // A link replaces the directory at the same place on disk.
        assert!(parsed.storage.directories.is_empty());
        assert_eq!(parsed.storage.links[0].target, "/usr/local/tools");
        // Units are replaced whole, by name.
        let units: Vec<_> = parsed
            .systemd
            .units
            .iter()
            .map(|u| (&u.name, u.mask, u.contents.is_some()))
            .collect();
        assert_eq!(
            units,
            [
                (&"a.service".to_string(), Some(true), false),
                (&"b.service".to_string(), None, false)
            ]
        );
    }

    #[test]
    fn without_operator_layers_only_the_generated_one_is_left() {
        let merged = ignition(&[], &json!({"kind": "KubeletConfiguration"})).unwrap();
        assert_eq!(merged["ignition"]["version"], "3.4.0");
        assert_eq!(merged["storage"]["files"][0]["path"], KUBELET_CONFIG_PATH);
        assert_eq!(merged["storage"]["files"][0]["overwrite"], true);
        assert_eq!(merged["storage"]["files"][0]["mode"], 0o644);
        assert!(merged.get("systemd").is_none());
    }

    #[test]
    fn users_and_groups_merge_by_name_and_the_newest_version_wins() {
        let base = layer(
            r#"{"ignition": {"version": "3.1.0"}, "passwd": {
                "users": [{"name": "core", "uid": 1000}, {"name": "ops", "groups": ["wheel"]}],
                "groups": [{"name": "wheel", "gid": 10}]}}"#,
        );
        let class = layer(
            r#"{"ignition": {"version": "3.6.0"}, "passwd": {
                "users": [{"name": "core", "shouldExist": false}],
                "groups": [{"name": "wheel", "gid": 11}]}}"#,
        );
        let merged = ignition(&[base, class], &json!({})).unwrap();
        assert_eq!(merged["ignition"]["version"], "3.6.0");
        assert_eq!(
            merged["passwd"]["users"],
            json!([{"name": "core", "shouldExist": false}, {"name": "ops", "groups": ["wheel"]}]),
            "the class's core replaces the base's whole"
        );
        assert_eq!(
            merged["passwd"]["groups"],
            json!([{"name": "wheel", "gid": 11}])
        );
        assert!(spec::parse(&merged).is_ok(), "the agent accepts it");
    }

    #[test]
    fn bad_operator_configs_are_refused_with_their_origin() {
        let cases = [
            ("{", "not JSON"),
            (
                r#"{"ignition": {"version": "3.4.0"}, "storage": {"disks": [{"device": "/dev/sdb"}]}}"#,
                "storage.disks: autonode does not support",
            ),
            (r#"{"ignition": {"version": "2.2.0"}}"#, "ignition.version"),
            (
                r#"{"ignition": {"version": "3.4.0"}, "storage": {"files": [{"path": "/a"}], "links": [{"path": "/a", "target": "/b"}]}}"#,
                "storage.links[0]: path \"/a\" appears more than once",
            ),
            (
                r#"{"ignition": {"version": "3.4.0"}, "systemd": {"units": [{"name": "x.service"}, {"name": "x.service"}]}}"#,
                "unit \"x.service\"",
            ),
            (
                r#"{"ignition": {"version": "3.4.0"}, "storage": {"files": [{"path": "etc/x"}]}}"#,
                "must be an absolute path",
            ),
            (
                r#"{"ignition": {"version": "3.4.0"}, "storage": {"directories": [{"path": "/etc/../root"}]}}"#,
                "must be fully simplified",
            ),
            // Decoded and verified at render time, not first on the node.
            (
                r#"{"ignition": {"version": "3.4.0"}, "storage": {"files": [{"path": "/a", "contents": {"source": "data:;base64,aGk%0A="}}]}}"#,
                "storage.files[0].contents.source: bad base64",
            ),
            (
                r#"{"ignition": {"version": "3.4.0"}, "storage": {"files": [{"path": "/a", "contents": {"source": "data:,ho", "verification": {"hash": "sha256-8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4"}}}]}}"#,
                "hash mismatch",
            ),
        ];
        for (text, expected) in cases {
            let err = parse_layer("ConfigMap autonode-system/base", text)
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("ConfigMap autonode-system/base: "), "{err}");
            assert!(err.contains(expected), "{err} should say {expected}");
        }
    }

    #[test]
    fn rendering_is_byte_identical_whatever_the_input_order() {
        let claim = claim();
        let render = |kubelet_text: &str, base: &str| {
            let class: KubeletSpec = serde_json::from_str(kubelet_text).unwrap();
            let settings = kubelet(&cluster(), Some(&class), &facts(&claim));
            let ignition = ignition(&[layer(base)], &settings.config).unwrap();
            (
                serde_json::to_vec(&settings).unwrap(),
                serde_json::to_vec(&ignition).unwrap(),
            )
        };
        let first = render(FULL_KUBELET, BASE);
        assert_eq!(first, render(FULL_KUBELET, BASE), "twice");
        // The same maps and entries, written in other orders.
        let reordered_kubelet = r#"{
            "clusterDNS": ["10.100.0.10"], "cpuCFSQuota": false,
            "imageGCLowThresholdPercent": 80, "imageGCHighThresholdPercent": 85,
            "evictionMaxPodGracePeriod": 60,
            "evictionSoftGracePeriod": {"memory.available": "1m30s"},
            "evictionSoft": {"memory.available": "10%"},
            "evictionHard": {"nodefs.available": "10%", "memory.available": "5%"},
            "kubeReserved": {"memory": "300Mi", "cpu": "200m"},
            "systemReserved": {"ephemeral-storage": "1Gi", "memory": "100Mi", "cpu": "100m"},
            "podsPerCore": 4, "maxPods": 58
        }"#;
        let reordered_base = r#"{"systemd": {"units": [{"enabled": true, "name": "b.service"},
                                                       {"contents": "[Unit]\n", "name": "a.service"}]},
            "storage": {"directories": [{"path": "/opt/tools"}],
                        "files": [{"mode": 384, "path": "/etc/base-only"},
                                  {"contents": {"source": "data:,%7B%7D"}, "path": "/etc/kubernetes/kubelet/config.json"},
                                  {"path": "/etc/motd", "contents": {"source": "data:,base"}}]},
            "ignition": {"version": "3.2.0"}}"#;
        assert_eq!(first, render(reordered_kubelet, reordered_base));
    }
}
