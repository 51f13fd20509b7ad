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
//! | `/etc/kubernetes/kubelet/config.json` | the server's KubeletConfiguration, verbatim |
//! | `/etc/autonode/kubelet.env` | `KUBELET_ARGS=...`: the per-node flags |
//! | `/etc/systemd/system/kubelet.service.d/10-autonode.conf` | drop-in: `EnvironmentFile=` + `ExecStart=<kubelet> $KUBELET_EXTRA_ARGS $KUBELET_ARGS` (the AMI's flags, then the node's) |
//!
//! The symlinked `-current.pem` files are exactly what kubelet's
//! certificate store writes, with `--cert-dir=/var/lib/kubelet/pki`: with
//! `rotateCertificates: true` and `serverTLSBootstrap: true` in the server's
//! KubeletConfiguration, kubelet renews both itself. Flags carry only what
//! is per node; everything else is the server's KubeletConfiguration.

use crate::fsutil::{self, Durability, FsError, Owner, Root};
use crate::imds::Identity;
use autonode_shared::protocol::JoinResponse;
use rcgen::KeyPair;
use rustls::pki_types::{pem::PemObject, CertificateDer};
use std::net::IpAddr;
use std::path::Path;
use std::process::Command;

pub const KUBECONFIG: &str = "/var/lib/kubelet/kubeconfig";
pub const PKI_DIR: &str = "/var/lib/kubelet/pki";
pub const CLIENT_CURRENT: &str = "/var/lib/kubelet/pki/kubelet-client-current.pem";
pub const SERVER_CURRENT: &str = "/var/lib/kubelet/pki/kubelet-server-current.pem";
pub const CLUSTER_CA: &str = "/etc/kubernetes/pki/ca.crt";
pub const CONFIG: &str = "/etc/kubernetes/kubelet/config.json";
pub const ENV_FILE: &str = "/etc/autonode/kubelet.env";
pub const DROPIN: &str = "/etc/systemd/system/kubelet.service.d/10-autonode.conf";
pub const UNIT: &str = "kubelet.service";
/// Every file [`write`] leaves in place (the dated certificate files sit
/// beside their `-current` links): what a joined node must still have, and
/// what is synced before the apply phase is recorded.
pub const FILES: [&str; 7] = [
    KUBECONFIG,
    CLIENT_CURRENT,
    SERVER_CURRENT,
    CLUSTER_CA,
    CONFIG,
    ENV_FILE,
    DROPIN,
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
}

fn refused(reason: impl Into<String>) -> KubeletError {
    KubeletError::Refused(reason.into())
}

/// The node's two keys.
pub struct Keys<'a> {
    pub client: &'a KeyPair,
    pub serving: &'a KeyPair,
}

/// Checks the answer against this node and writes every kubelet file.
/// Returns how many files changed. The writes are
/// [`Durability::Deferred`]: every one is redone by a resumed apply phase,
/// which the caller records only after syncing [`FILES`].
pub fn write(
    root: &Root,
    answer: &JoinResponse,
    keys: &Keys<'_>,
    identity: &Identity,
    kubelet_path: &str,
) -> Result<usize, KubeletError> {
    validate(answer, identity)?;
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
    let config =
        serde_json::to_vec_pretty(&answer.kubelet.config).map_err(|e| refused(e.to_string()))?;
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
        env_file(answer).as_bytes(),
        0o644,
        public,
    )?);
    changed += usize::from(write_file(
        &root.join(DROPIN)?,
        dropin(kubelet_path).as_bytes(),
        0o644,
        public,
    )?);
    Ok(changed)
}

/// Values that end up in flags must be plain tokens: no spaces, quotes or
/// `$`, which would change the command line systemd builds.
fn is_token(value: &str) -> bool {
    !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"\"'\\$`,;".contains(&b))
}

fn validate(answer: &JoinResponse, identity: &Identity) -> Result<(), KubeletError> {
    let settings = &answer.kubelet;
    if settings.provider_id != identity.provider_id() {
        return Err(refused(format!(
            "providerID {:?} is not this instance ({})",
            settings.provider_id,
            identity.provider_id()
        )));
    }
    let name_ok = answer.node_name.len() <= 253
        && is_token(&answer.node_name)
        && answer
            .node_name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b));
    if !name_ok {
        return Err(refused(format!(
            "node name {:?} is not a DNS name",
            answer.node_name
        )));
    }
    let ip: IpAddr = settings
        .node_ip
        .parse()
        .map_err(|_| refused(format!("node IP {:?}", settings.node_ip)))?;
    if !identity.ips.contains(&ip) {
        log::warn!(
            "node IP {ip} is not among this instance's IPs {:?}",
            identity.ips
        );
    }
    if let Some(bad) = settings.register_with_taints.iter().find(|t| !is_token(t)) {
        return Err(refused(format!("taint {bad:?}")));
    }
    if let Some((k, v)) = settings
        .node_labels
        .iter()
        .find(|(k, v)| !is_token(k) || !(v.is_empty() || is_token(v)))
    {
        return Err(refused(format!("label {k:?}={v:?}")));
    }
    if !answer.api_server.starts_with("https://") || !is_token(&answer.api_server) {
        return Err(refused(format!("API server URL {:?}", answer.api_server)));
    }
    Ok(())
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

/// The per-node kubelet flags.
pub fn flags(answer: &JoinResponse) -> Vec<String> {
    let settings = &answer.kubelet;
    let mut flags = vec![
        format!("--kubeconfig={KUBECONFIG}"),
        format!("--config={CONFIG}"),
        format!("--cert-dir={PKI_DIR}"),
        format!("--hostname-override={}", answer.node_name),
        format!("--node-ip={}", settings.node_ip),
        format!("--provider-id={}", settings.provider_id),
    ];
    if !settings.register_with_taints.is_empty() {
        flags.push(format!(
            "--register-with-taints={}",
            settings.register_with_taints.join(",")
        ));
    }
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

fn env_file(answer: &JoinResponse) -> String {
    format!(
        "# Written by autonode-agent; read by kubelet.service through {DROPIN}.\nKUBELET_ARGS=\"{}\"\n",
        flags(answer).join(" ")
    )
}

/// `$KUBELET_EXTRA_ARGS` keeps the AMI's own flags, which this drop-in's
/// `ExecStart=` would otherwise drop: what its kubelet version needs
/// whatever the cluster (before 1.27 the container runtime endpoint is a
/// flag only). They come first, so the per-node flags win a conflict.
fn dropin(kubelet_path: &str) -> String {
    format!(
        "# Written by autonode-agent.\n[Unit]\nAfter=autonode-agent.service\n\n[Service]\n\
         EnvironmentFile={ENV_FILE}\nExecStart=\n\
         ExecStart={kubelet_path} $KUBELET_EXTRA_ARGS $KUBELET_ARGS\n"
    )
}

/// Reloads systemd and starts `units` plus kubelet without waiting: the
/// agent's own unit is ordered before kubelet, so a blocking start would
/// wait for the agent itself.
pub fn start(systemctl: &str, units: &[String]) -> Result<(), KubeletError> {
    run(systemctl, &["daemon-reload".to_string()])?;
    let mut args = vec!["start".to_string(), "--no-block".to_string()];
    args.extend(units.iter().filter(|u| u.as_str() != UNIT).cloned());
    args.push(UNIT.to_string());
    run(systemctl, &args)
}

fn run(program: &str, args: &[String]) -> Result<(), KubeletError> {
    let command = format!("{program} {}", args.join(" "));
    log::info!("running {command}");
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| KubeletError::Command {
            command: command.clone(),
            reason: e.to_string(),
        })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    Err(KubeletError::Command {
        command,
        reason: format!("{}: {stderr}", output.status),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::imds::IdentityDocument;
    use autonode_shared::protocol::KubeletSettings;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer};

    fn identity() -> Identity {
        Identity {
            document: IdentityDocument {
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

    fn answer(client: &KeyPair, serving: &KeyPair) -> JoinResponse {
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
        assert!(write(&root, &answer, &keys, &identity(), "/usr/bin/kubelet").unwrap() >= 8);
        assert_eq!(
            write(&root, &answer, &keys, &identity(), "/usr/bin/kubelet").unwrap(),
            0
        );

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
        assert!(crate::state::verify_joined(&root, 0).is_ok());
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
            write(&root, &other, &keys, &identity(), "k"),
            Err(KubeletError::Refused(_))
        ));
        let mut injected = answer(&client, &serving);
        injected.kubelet.register_with_taints = vec!["a=b:NoSchedule --anonymous-auth=true".into()];
        assert!(matches!(
            write(&root, &injected, &keys, &identity(), "k"),
            Err(KubeletError::Refused(_))
        ));
        let swapped = answer(&serving, &client);
        let err = write(&root, &swapped, &keys, &identity(), "k").unwrap_err();
        assert!(
            err.to_string().contains("not for this node's client key"),
            "{err}"
        );
    }

    #[test]
    fn start_reloads_then_starts_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("calls");
        let script = dir.path().join("systemctl");
        std::fs::write(
            &script,
            format!("#!/bin/sh\necho \"$@\" >> {}\n", log.display()),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        start(
            &script.to_string_lossy(),
            &["app.service".into(), UNIT.into()],
        )
        .unwrap();
        let calls = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            calls,
            "daemon-reload\nstart --no-block app.service kubelet.service\n"
        );
        assert!(start("/nonexistent/systemctl", &[]).is_err());
    }
}
