//! Writing kubelet's files and starting it.
//!
//! Layout (kubelet's own conventions, so its certificate rotation takes
//! over from the agent):
//!
//! | path | what |
//! | --- | --- |
//! | `/var/lib/kubelet/kubeconfig` | API server URL, CA, client cert (JSON, which kubeconfig loaders accept) |
//! | `/var/lib/kubelet/pki/kubelet-client-<notBefore>.pem` + `kubelet-client-current.pem` symlink | client cert + key, 0600 |
//! | `/var/lib/kubelet/pki/kubelet-server-<notBefore>.pem` + `kubelet-server-current.pem` symlink | serving cert + key, 0600 |
//! | `/etc/kubernetes/pki/ca.crt` | cluster CA |
//! | `/etc/kubernetes/kubelet/config.json` | the server's KubeletConfiguration, plus what this kubelet version reads there (`settings`) |
//! | `/etc/autonode/kubelet.env` | `KUBELET_ARGS=...`: the per-node flags; `AUTONODE_KUBELET=`: the binary |
//!
//! kubelet reads the environment file through the package's drop-in,
//! `kubelet.service.d/10-autonode-agent.conf`, which systemd loaded at boot
//! with the rest of the units: the agent writes no unit, so starting
//! kubelet needs no `systemctl daemon-reload` (`systemd`).
//!
//! The symlinked `-current.pem` files are exactly what kubelet's
//! certificate store writes, with `--cert-dir=/var/lib/kubelet/pki`: with
//! `rotateCertificates: true` and `serverTLSBootstrap: true` in the server's
//! KubeletConfiguration, kubelet renews both itself. Flags carry only what
//! is per node; everything else is the server's KubeletConfiguration.

mod buildinfo;
mod settings;
mod systemd;
mod version;

pub use settings::{runtime_endpoint, Placement};
pub use systemd::{ignition_touches_units, retire_old_dropin, start, Started, OLD_DROPIN};
pub use version::{Answer, Found, KubeletVersion, Places, Probe};

use crate::fsutil::{self, Durability, FsError, Owner, Root};
use crate::imds::Identity;
use autonode_shared::protocol::JoinResponse;
use rcgen::KeyPair;
use rustls::pki_types::{pem::PemObject, CertificateDer};
use std::path::Path;

/// The paths the server's rendered config points kubelet at.
pub use autonode_shared::contract::kubelet::{
    CLIENT_CURRENT, CLUSTER_CA, CONFIG, ENV_FILE, KUBECONFIG, PKI_DIR, SERVER_CURRENT,
};
pub const UNIT: &str = "kubelet.service";
/// The cache of kubelet's version ([`Probe`]), in the state directory.
pub const VERSION_CACHE: &str = "kubelet-version.json";
/// The image's record of its kubelet's version, written when the image is
/// baked (packaging/bake/provision), so that no boot runs `kubelet
/// --version`. In /etc/autonode, not the state directory: a bake's
/// clean-up empties that one, and the record is the image's, like its
/// optional agent.toml.
pub const VERSION_RECORD: &str = "/etc/autonode/kubelet-version";
/// Every file [`write()`] leaves in place (the dated certificate files sit
/// beside their `-current` links): what a joined node must still have, and
/// what is synced before the apply phase is recorded.
pub const FILES: [&str; 6] = [
    KUBECONFIG,
    CLIENT_CURRENT,
    SERVER_CURRENT,
    CLUSTER_CA,
    CONFIG,
    ENV_FILE,
];

/// Why kubelet could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The server's answer does not fit this node: a refusal.
    #[error("the server's kubelet settings are unusable: {0}")]
    Refused(String),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{command}: {reason}")]
    Command { command: String, reason: String },
    /// `kubelet --version` could not tell which kubelet this is.
    #[error("{program} --version: {reason}")]
    Version { program: String, reason: String },
    #[error("--kubelet-path {0:?} must be an absolute path without spaces, quotes or '$'")]
    KubeletPath(String),
}

fn refused(reason: impl Into<String>) -> KubeletError {
    KubeletError::Refused(reason.into())
}

/// The node's two keys.
pub struct Keys<'a> {
    pub client: &'a KeyPair,
    pub serving: &'a KeyPair,
}

/// The kubelet this node runs.
#[derive(Debug, Clone, Copy)]
pub struct Kubelet<'a> {
    /// What kubelet.service runs (`--kubelet-path`), outside any `--root`.
    pub path: &'a str,
    pub version: KubeletVersion,
}

/// Checks the answer against this node and writes every kubelet file, each
/// setting where `kubelet`'s version reads it (`settings`).
/// Returns how many files changed. The writes are
/// [`Durability::Deferred`]: every one is redone by a resumed apply phase,
/// which the caller records only after syncing [`FILES`].
pub fn write(
    root: &Root,
    answer: &JoinResponse,
    keys: &Keys<'_>,
    identity: &Identity,
    kubelet: Kubelet<'_>,
) -> Result<usize, KubeletError> {
    crate::join::check_answer(answer, identity).map_err(|e| KubeletError::Refused(e.0))?;
    if !kubelet.path.starts_with('/') || !crate::join::is_token(kubelet.path) {
        return Err(KubeletError::KubeletPath(kubelet.path.to_string()));
    }
    let placement = Placement::for_version(kubelet.version);
    let node = settings::settings(answer, placement, runtime_endpoint(root))?;
    let client = certificate_file(root, "client", &answer.client_certificate, keys.client)?;
    let serving = certificate_file(root, "server", &answer.serving_certificate, keys.serving)?;
    let mut changed = client + serving;
    let public = Owner::default();
    changed += usize::from(write_file(
        &root.join(CLUSTER_CA)?,
        answer.cluster_ca.as_bytes(),
        0o644,
        public,
    )?);
    let config = serde_json::to_vec_pretty(&node.config).map_err(|e| refused(e.to_string()))?;
    changed += usize::from(write_file(&root.join(CONFIG)?, &config, 0o644, public)?);
    let kubeconfig = kubeconfig(&answer.api_server);
    changed += usize::from(write_file(
        &root.join(KUBECONFIG)?,
        kubeconfig.as_bytes(),
        0o600,
        public,
    )?);
    changed += usize::from(write_file(
        &root.join(ENV_FILE)?,
        env_file(kubelet, &node.flags).as_bytes(),
        0o644,
        public,
    )?);
    Ok(changed)
}

/// Seconds since the epoch after which the certificate in `pem` expires.
pub fn not_after(pem: &[u8]) -> Option<i64> {
    let der = CertificateDer::from_pem_slice(pem).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// Checks that an earlier successful run's result is still in place: every
/// kubelet file present and the client certificate not expired. `Err`
/// says what is wrong.
pub fn verify_joined(root: &Root, now: i64) -> Result<(), String> {
    for file in FILES {
        let path = root.join(file).map_err(|e| e.to_string())?;
        if !path.is_file() {
            return Err(format!("{file} is missing"));
        }
    }
    let path = root.join(CLIENT_CURRENT).map_err(|e| e.to_string())?;
    let pem = std::fs::read(&path).map_err(|e| format!("{}: {e}", CLIENT_CURRENT))?;
    match not_after(&pem) {
        Some(expiry) if expiry > now => Ok(()),
        Some(_) => Err(format!(
            "the client certificate in {} has expired",
            CLIENT_CURRENT
        )),
        None => Err(format!("{} holds no certificate", CLIENT_CURRENT)),
    }
}

/// Writes `kubelet-<kind>-<notBefore>.pem` (cert + key, 0600) and points
/// `kubelet-<kind>-current.pem` at it. The certificate must be for `key`.
fn certificate_file(
    root: &Root,
    kind: &str,
    pem: &str,
    key: &KeyPair,
) -> Result<usize, KubeletError> {
    let der = CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| refused(format!("{kind} certificate: {e}")))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| refused(format!("{kind} certificate: {e}")))?;
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(refused(format!(
            "{kind} certificate is not for this node's {kind} key"
        )));
    }
    let stamp = cert.validity().not_before.to_datetime();
    let name = format!(
        "kubelet-{kind}-{:04}-{:02}-{:02}-{:02}-{:02}-{:02}.pem",
        stamp.year(),
        u8::from(stamp.month()),
        stamp.day(),
        stamp.hour(),
        stamp.minute(),
        stamp.second()
    );
    let contents = format!("{}\n{}", pem.trim_end(), key.serialize_pem());
    let file = root.join(&format!("{PKI_DIR}/{name}"))?;
    let mut changed = usize::from(write_file(
        &file,
        contents.as_bytes(),
        0o600,
        Owner::default(),
    )?);
    let current = root.join(&format!("{PKI_DIR}/kubelet-{kind}-current.pem"))?;
    // Relative, like kubelet's own: valid under any root.
    changed += usize::from(fsutil::symlink_with(
        Path::new(&name),
        &current,
        Durability::Deferred,
    )?);
    Ok(changed)
}

/// One of kubelet's files, deferred (see [`write`]).
fn write_file(path: &Path, contents: &[u8], mode: u32, owner: Owner) -> Result<bool, FsError> {
    fsutil::write_with(path, contents, mode, owner, Durability::Deferred)
}

fn kubeconfig(api_server: &str) -> String {
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": {"server": api_server, "certificate-authority": CLUSTER_CA}}],
        "users": [{"name": "kubelet", "user": {"client-certificate": CLIENT_CURRENT, "client-key": CLIENT_CURRENT}}],
        "contexts": [{"name": "kubelet", "context": {"cluster": "cluster", "user": "kubelet"}}],
        "current-context": "kubelet",
    });
    format!("{doc:#}\n")
}

/// The per-node kubelet flags every kubelet version takes as flags.
/// [`settings`] adds those an older kubelet has no configuration field
/// for.
fn node_flags(answer: &JoinResponse) -> Vec<String> {
    let settings = &answer.kubelet;
    let mut flags = vec![
        format!("--kubeconfig={KUBECONFIG}"),
        format!("--config={CONFIG}"),
        format!("--cert-dir={PKI_DIR}"),
        format!("--hostname-override={}", answer.node_name),
        format!("--node-ip={}", settings.node_ip),
        format!("--provider-id={}", settings.provider_id),
    ];
    if !settings.node_labels.is_empty() {
        let labels: Vec<String> = settings
            .node_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        flags.push(format!("--node-labels={}", labels.join(",")));
    }
    flags
}

/// What the package's kubelet drop-in reads: `ExecStart=/usr/bin/env
/// ${AUTONODE_KUBELET} $KUBELET_EXTRA_ARGS $KUBELET_ARGS`, the AMI's flags
/// first so the per-node ones win a conflict. Every value is a token
/// ([`crate::join::is_token`]), so the quotes are all systemd needs.
fn env_file(kubelet: Kubelet<'_>, flags: &[String]) -> String {
    format!(
        "# Written by autonode-agent for kubelet {}; read by kubelet.service\n\
         # through the package's drop-in (kubelet.service.d/10-autonode-agent.conf).\n\
         AUTONODE_KUBELET={}\nKUBELET_ARGS=\"{}\"\n",
        kubelet.version,
        kubelet.path,
        flags.join(" ")
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::imds::DocumentFacts;
    use autonode_shared::protocol::KubeletSettings;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer};

    pub(crate) fn identity() -> Identity {
        Identity {
            document: DocumentFacts {
                instance_id: "i-0123456789abcdef0".into(),
                availability_zone: "us-west-2a".into(),
                region: "us-west-2".into(),
                account_id: "123456789012".into(),
            },
            rsa2048: "sig".into(),
            local_hostname: "ip-10-0-0-1.us-west-2.compute.internal".into(),
            ips: vec!["10.0.0.1".parse().unwrap()],
        }
    }

    const OLD: Kubelet<'static> = Kubelet {
        path: "/usr/bin/kubelet",
        version: KubeletVersion::new(1, 20, 2),
    };
    const NEW: Kubelet<'static> = Kubelet {
        path: "/usr/bin/kubelet",
        version: KubeletVersion::new(1, 34, 1),
    };

    pub(crate) fn answer(client: &KeyPair, serving: &KeyPair) -> JoinResponse {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let cert = |key: &KeyPair| {
            CertificateParams::new(vec!["n".to_string()])
                .unwrap()
                .signed_by(key, &issuer)
                .unwrap()
                .pem()
        };
        JoinResponse {
            node_name: "ip-10-0-0-1.us-west-2.compute.internal".into(),
            api_server: "https://10.0.0.2:6443".into(),
            cluster_ca: ca.pem(),
            client_certificate: cert(client),
            serving_certificate: cert(serving),
            kubelet: KubeletSettings {
                config: serde_json::json!({"kind": "KubeletConfiguration", "rotateCertificates": true}),
                provider_id: "aws:///us-west-2a/i-0123456789abcdef0".into(),
                node_ip: "10.0.0.1".into(),
                register_with_taints: vec!["karpenter.sh/unregistered:NoExecute".into()],
                node_labels: [("karpenter.sh/nodepool".to_string(), "default".to_string())].into(),
            },
            ignition: serde_json::json!({"ignition": {"version": "3.4.0"}}),
        }
    }

    #[test]
    fn writes_kubelet_files_idempotently() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let (client, serving) = (KeyPair::generate().unwrap(), KeyPair::generate().unwrap());
        let answer = answer(&client, &serving);
        let keys = Keys {
            client: &client,
            serving: &serving,
        };
        assert!(write(&root, &answer, &keys, &identity(), OLD).unwrap() >= 7);
        assert_eq!(write(&root, &answer, &keys, &identity(), OLD).unwrap(), 0);

        let current = dir.path().join(CLIENT_CURRENT.trim_start_matches('/'));
        let pem = std::fs::read_to_string(&current).unwrap();
        assert!(pem.contains("BEGIN CERTIFICATE") && pem.contains("BEGIN PRIVATE KEY"));
        assert!(std::fs::read_link(&current)
            .unwrap()
            .to_string_lossy()
            .starts_with("kubelet-client-"));
        let env =
            std::fs::read_to_string(dir.path().join(ENV_FILE.trim_start_matches('/'))).unwrap();
        for flag in [
            "--provider-id=aws:///us-west-2a/i-0123456789abcdef0",
            "--node-ip=10.0.0.1",
            "--register-with-taints=karpenter.sh/unregistered:NoExecute",
            "--node-labels=karpenter.sh/nodepool=default",
            "--hostname-override=ip-10-0-0-1.us-west-2.compute.internal",
        ] {
            assert!(env.contains(flag), "{env} lacks {flag}");
        }
        let kubeconfig: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(KUBECONFIG.trim_start_matches('/'))).unwrap(),
        )
        .unwrap();
        assert_eq!(
            kubeconfig["clusters"][0]["cluster"]["server"],
            "https://10.0.0.2:6443"
        );
        assert!(env.contains("AUTONODE_KUBELET=/usr/bin/kubelet\n"), "{env}");
        assert!(verify_joined(&root, 0).is_ok());
    }

    /// The same answer for a 1.34 kubelet on a containerd node: taints and
    /// runtime in the configuration, no deprecated flag.
    #[test]
    fn a_new_kubelet_gets_its_settings_in_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        std::fs::write(dir.path().join("usr/bin/containerd"), "").unwrap();
        let (client, serving) = (KeyPair::generate().unwrap(), KeyPair::generate().unwrap());
        let answer = answer(&client, &serving);
        let keys = Keys {
            client: &client,
            serving: &serving,
        };
        write(&root, &answer, &keys, &identity(), NEW).unwrap();
        let read = |path: &str| {
            std::fs::read_to_string(dir.path().join(path.trim_start_matches('/'))).unwrap()
        };
        let env = read(ENV_FILE);
        assert!(!env.contains("--register-with-taints"), "{env}");
        assert!(env.contains("--provider-id="), "{env}");
        let config: serde_json::Value = serde_json::from_str(&read(CONFIG)).unwrap();
        assert_eq!(
            config["registerWithTaints"],
            serde_json::json!([{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}])
        );
        assert_eq!(
            config["containerRuntimeEndpoint"],
            "unix:///run/containerd/containerd.sock"
        );
        assert_eq!(config["rotateCertificates"], true);

        for path in ["kubelet", "/opt/my kubelet", "/usr/bin/$kubelet"] {
            let kubelet = Kubelet { path, ..NEW };
            let err = write(&root, &answer, &keys, &identity(), kubelet).unwrap_err();
            assert!(matches!(err, KubeletError::KubeletPath(_)), "{path}: {err}");
        }
    }

    #[test]
    fn answers_that_do_not_fit_this_node_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let (client, serving) = (KeyPair::generate().unwrap(), KeyPair::generate().unwrap());
        let keys = Keys {
            client: &client,
            serving: &serving,
        };
        let mut other = answer(&client, &serving);
        other.kubelet.provider_id = "aws:///us-west-2a/i-ffffffffffffffff0".into();
        assert!(matches!(
            write(&root, &other, &keys, &identity(), OLD),
            Err(KubeletError::Refused(_))
        ));
        let mut injected = answer(&client, &serving);
        injected.kubelet.register_with_taints = vec!["a=b:NoSchedule --anonymous-auth=true".into()];
        assert!(matches!(
            write(&root, &injected, &keys, &identity(), NEW),
            Err(KubeletError::Refused(_))
        ));
        let swapped = answer(&serving, &client);
        let err = write(&root, &swapped, &keys, &identity(), OLD).unwrap_err();
        assert!(
            err.to_string().contains("not for this node's client key"),
            "{err}"
        );
    }

    #[test]
    fn verify_names_the_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = verify_joined(&Root::new(dir.path()), 0).unwrap_err();
        assert!(err.contains("kubeconfig"), "{err}");
    }
}
