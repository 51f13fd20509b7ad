use super::*;
use crate::kube::karpenter::KubeletSpec;
use autonode_shared::ignition::{self as spec, Config};
use base64::Engine as _;
use serde_json::json;

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
    let merged = ignition::<Config>(&[], &json!({"kind": "KubeletConfiguration"})).unwrap();
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
