//! `autonode-server serve` as an operator starts it: settings that are
//! wrong on their own are refused before the guest cluster is touched.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_autonode-server");

/// A base config in a Secret with Secrets turned off is refused first:
/// the kubeconfig (here one that does not exist) is never read, so no CRDs
/// are installed and no watch or election starts on a cluster.
#[test]
fn a_base_ignition_secret_with_secrets_off_is_refused_before_the_cluster() {
    let dir = std::env::temp_dir().join(format!("autonode-serve-cli-{}", std::process::id()));
    let missing = |name: &str| dir.join(name).into_os_string();
    let out = Command::new(BIN)
        .env_clear()
        .arg("serve")
        .arg("--kubeconfig")
        .arg(missing("kubeconfig"))
        .arg("--tls-cert")
        .arg(missing("tls.crt"))
        .arg("--tls-key")
        .arg(missing("tls.key"))
        .args(["--allowed-accounts", "111111111111"])
        .args(["--allowed-regions", "us-west-2"])
        .args(["--base-ignition", "secret/base"])
        .arg("--ignition-secrets=false")
        .output()
        .expect("run autonode-server");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--base-ignition names Secret base, but --ignition-secrets=false"),
        "{stderr}"
    );
    assert!(!stderr.contains("kubeconfig"), "{stderr}");
}
