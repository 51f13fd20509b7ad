//! Where each per-node setting goes for the kubelet this node runs: into
//! the KubeletConfiguration where that kubelet reads it there, as a flag
//! where it does not.
//!
//! Flags that moved into the configuration are deprecated in the kubelets
//! that have the field (a 1.34 kubelet warns about both below), and the
//! configuration is the one place a later kubelet will keep:
//!
//! | setting | KubeletConfiguration field since | older kubelets |
//! | --- | --- | --- |
//! | registration taints | `registerWithTaints`, 1.23 (kubernetes/kubernetes#105437) | `--register-with-taints` |
//! | container runtime | `containerRuntimeEndpoint`, 1.27 (kubernetes/kubernetes#112136) | the AMI's `--container-runtime-endpoint` |
//!
//! The runtime endpoint is written only when the server's configuration has
//! none and this node has a runtime the agent recognises; before 1.27 it
//! stays the AMI's flag, which knows the runtime better than a guess would.

use super::version::KubeletVersion;
use super::KubeletError;
use crate::fsutil::Root;
use autonode_shared::protocol::JoinResponse;
use serde_json::{json, Map, Value};

/// The first kubelet with `registerWithTaints` in its configuration.
const REGISTER_WITH_TAINTS_SINCE: (u32, u32) = (1, 23);
/// The first kubelet with `containerRuntimeEndpoint` in its configuration.
const RUNTIME_ENDPOINT_SINCE: (u32, u32) = (1, 27);

/// Container runtimes by the binaries that give them away, and the socket
/// each listens on by default. containerd first: the common one, and the
/// one Docker's packages install too.
const RUNTIMES: [(&[&str], &str); 2] = [
    (
        &["/usr/bin/containerd", "/usr/local/bin/containerd"],
        "unix:///run/containerd/containerd.sock",
    ),
    (
        &["/usr/bin/crio", "/usr/local/bin/crio"],
        "unix:///var/run/crio/crio.sock",
    ),
];

/// What the agent writes for one kubelet: its configuration and the flags
/// that are not in it.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub config: Value,
    pub flags: Vec<String>,
}

/// Which of the moved settings a kubelet reads from its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub taints_in_config: bool,
    pub runtime_in_config: bool,
}

impl Placement {
    pub fn for_version(version: KubeletVersion) -> Self {
        let (major, minor) = REGISTER_WITH_TAINTS_SINCE;
        let taints_in_config = version.at_least(major, minor);
        let (major, minor) = RUNTIME_ENDPOINT_SINCE;
        Placement {
            taints_in_config,
            runtime_in_config: version.at_least(major, minor),
        }
    }
}

/// The container runtime endpoint of this node, if it has a runtime the
/// agent recognises.
pub fn runtime_endpoint(root: &Root) -> Option<&'static str> {
    RUNTIMES.iter().find_map(|(binaries, endpoint)| {
        binaries
            .iter()
            .filter_map(|binary| root.join(binary).ok())
            .any(|path| path.is_file())
            .then_some(*endpoint)
    })
}

/// The server's configuration and the node's flags, with each moved
/// setting where `placement` puts it. `endpoint` is this node's runtime
/// ([`runtime_endpoint`]).
pub fn settings(
    answer: &JoinResponse,
    placement: Placement,
    endpoint: Option<&str>,
) -> Result<Settings, KubeletError> {
    let mut config = match &answer.kubelet.config {
        Value::Object(map) => map.clone(),
        other => {
            return Err(KubeletError::Refused(format!(
                "the KubeletConfiguration is not a JSON object: {other}"
            )))
        }
    };
    let taints = &answer.kubelet.register_with_taints;
    if placement.taints_in_config && !taints.is_empty() {
        add_taints(&mut config, taints)?;
    }
    if placement.runtime_in_config && !config.contains_key("containerRuntimeEndpoint") {
        if let Some(endpoint) = endpoint {
            config.insert("containerRuntimeEndpoint".into(), endpoint.into());
        }
    }
    let mut flags = super::node_flags(answer);
    if !placement.taints_in_config && !taints.is_empty() {
        flags.push(format!("--register-with-taints={}", taints.join(",")));
    }
    Ok(Settings {
        config: Value::Object(config),
        flags,
    })
}

/// Appends `taints` (`key[=value]:Effect`) to the configuration's own
/// `registerWithTaints`, skipping any it already has.
fn add_taints(config: &mut Map<String, Value>, taints: &[String]) -> Result<(), KubeletError> {
    let entry = config
        .entry("registerWithTaints")
        .or_insert_with(|| Value::Array(Vec::new()));
    let Value::Array(list) = entry else {
        return Err(KubeletError::Refused(format!(
            "the KubeletConfiguration's registerWithTaints is not a list: {entry}"
        )));
    };
    for taint in taints {
        let taint = taint_object(taint)?;
        if !list.contains(&taint) {
            list.push(taint);
        }
    }
    Ok(())
}

/// `key[=value]:Effect`, the flag's syntax, as a core/v1 Taint.
fn taint_object(taint: &str) -> Result<Value, KubeletError> {
    let bad = || KubeletError::Refused(format!("taint {taint:?} is not key[=value]:Effect"));
    let (key_value, effect) = taint.rsplit_once(':').ok_or_else(bad)?;
    if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
        return Err(bad());
    }
    let (key, value) = match key_value.split_once('=') {
        Some((key, value)) => (key, Some(value)),
        None => (key_value, None),
    };
    if key.is_empty() {
        return Err(bad());
    }
    let mut object = json!({"key": key, "effect": effect});
    if let (Some(value), Value::Object(map)) = (value.filter(|v| !v.is_empty()), &mut object) {
        map.insert("value".into(), value.into());
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use autonode_shared::protocol::KubeletSettings;

    const CONTAINERD: &str = "unix:///run/containerd/containerd.sock";

    fn answer() -> JoinResponse {
        JoinResponse {
            node_name: "ip-10-0-0-1.us-west-2.compute.internal".into(),
            api_server: "https://10.0.0.2:6443".into(),
            cluster_ca: String::new(),
            client_certificate: String::new(),
            serving_certificate: String::new(),
            kubelet: KubeletSettings {
                config: json!({"kind": "KubeletConfiguration", "maxPods": 110}),
                provider_id: "aws:///us-west-2a/i-0123456789abcdef0".into(),
                node_ip: "10.0.0.1".into(),
                register_with_taints: vec![
                    "karpenter.sh/unregistered:NoExecute".into(),
                    "dedicated=gpu:NoSchedule".into(),
                ],
                node_labels: Default::default(),
            },
            ignition: json!({}),
        }
    }

    fn for_version(minor: u32) -> Settings {
        let placement = Placement::for_version(KubeletVersion::new(1, minor, 0));
        settings(&answer(), placement, Some(CONTAINERD)).unwrap()
    }

    fn has_taint_flag(settings: &Settings) -> bool {
        settings.flags.contains(
            &"--register-with-taints=karpenter.sh/unregistered:NoExecute,dedicated=gpu:NoSchedule"
                .to_string(),
        )
    }

    #[test]
    fn before_1_23_taints_are_a_flag_and_the_runtime_is_the_amis() {
        for minor in [20, 22] {
            let settings = for_version(minor);
            assert!(has_taint_flag(&settings), "1.{minor}: {:?}", settings.flags);
            assert_eq!(settings.config, answer().kubelet.config, "1.{minor}");
        }
    }

    #[test]
    fn from_1_23_taints_are_in_the_config() {
        let want = json!([
            {"key": "karpenter.sh/unregistered", "effect": "NoExecute"},
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
        ]);
        for minor in [23, 26] {
            let settings = for_version(minor);
            assert!(
                !has_taint_flag(&settings),
                "1.{minor}: {:?}",
                settings.flags
            );
            assert!(
                !settings.flags.iter().any(|f| f.contains("taints")),
                "1.{minor}"
            );
            assert_eq!(settings.config["registerWithTaints"], want, "1.{minor}");
            assert!(settings.config.get("containerRuntimeEndpoint").is_none());
            assert_eq!(settings.config["maxPods"], 110);
        }
    }

    #[test]
    fn from_1_27_the_runtime_endpoint_is_in_the_config_too() {
        for minor in [27, 34] {
            let settings = for_version(minor);
            assert!(!has_taint_flag(&settings), "1.{minor}");
            assert_eq!(settings.config["containerRuntimeEndpoint"], CONTAINERD);
            assert_eq!(
                settings.config["registerWithTaints"][0]["effect"],
                "NoExecute"
            );
        }
        // No runtime found: kubelet's own default, nothing invented.
        let placement = Placement::for_version(KubeletVersion::new(1, 34, 1));
        let settings = settings(&answer(), placement, None).unwrap();
        assert!(settings.config.get("containerRuntimeEndpoint").is_none());
        // The server's own endpoint wins.
        let mut own = answer();
        own.kubelet.config["containerRuntimeEndpoint"] = "unix:///custom.sock".into();
        let settings = super::settings(&own, placement, Some(CONTAINERD)).unwrap();
        assert_eq!(
            settings.config["containerRuntimeEndpoint"],
            "unix:///custom.sock"
        );
    }

    #[test]
    fn the_servers_own_taints_are_kept_and_not_repeated() {
        let mut own = answer();
        own.kubelet.config["registerWithTaints"] = json!([
            {"key": "team", "value": "a", "effect": "NoSchedule"},
            {"key": "karpenter.sh/unregistered", "effect": "NoExecute"},
        ]);
        let placement = Placement::for_version(KubeletVersion::new(1, 30, 0));
        let settings = settings(&own, placement, None).unwrap();
        let keys: Vec<&str> = settings.config["registerWithTaints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap())
            .collect();
        assert_eq!(keys, ["team", "karpenter.sh/unregistered", "dedicated"]);
    }

    #[test]
    fn malformed_taints_and_configs_are_refused() {
        let placement = Placement::for_version(KubeletVersion::new(1, 34, 0));
        for taint in ["no-effect", "k:Sometimes", ":NoSchedule", "=v:NoSchedule"] {
            let mut bad = answer();
            bad.kubelet.register_with_taints = vec![taint.into()];
            let err = settings(&bad, placement, None).unwrap_err();
            assert!(matches!(err, KubeletError::Refused(_)), "{taint}: {err}");
        }
        let mut bad = answer();
        bad.kubelet.config = json!(["not", "an", "object"]);
        assert!(settings(&bad, placement, None).is_err());
        let mut bad = answer();
        bad.kubelet.config["registerWithTaints"] = json!("x:NoSchedule");
        assert!(settings(&bad, placement, None).is_err());
    }

    #[test]
    fn finds_the_nodes_runtime_by_its_binary() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        assert_eq!(runtime_endpoint(&root), None);
        std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        std::fs::write(dir.path().join("usr/bin/crio"), "").unwrap();
        assert_eq!(
            runtime_endpoint(&root),
            Some("unix:///var/run/crio/crio.sock")
        );
        std::fs::write(dir.path().join("usr/bin/containerd"), "").unwrap();
        assert_eq!(runtime_endpoint(&root), Some(CONTAINERD));
    }
}
