//! The binary's contract: exit codes, config errors, the deadline, and a
//! second run after success that verifies without touching the network.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_autonode-agent");
const PIN: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// A loopback URL where nothing listens.
fn dead_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

fn agent(root: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--root")
        .arg(root)
        .args([
            "--console",
            "/dev/null",
            "--imds-endpoint",
            &dead_endpoint(),
        ])
        .args(args)
        .env_remove("JOURNAL_STREAM")
        .output()
        .unwrap()
}

fn write_local_config(root: &Path, text: &str) {
    std::fs::create_dir_all(root.join("etc/autonode")).unwrap();
    std::fs::write(root.join("etc/autonode/agent.toml"), text).unwrap();
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn version_and_help_document_exit_codes() {
    let output = Command::new(BIN).arg("--version").output().unwrap();
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("autonode-agent "));
    let help = Command::new(BIN).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    for needle in [
        "Exit codes",
        "refused",
        "deadline",
        "bad local config",
        "--imds-endpoint",
        "--systemctl",
    ] {
        assert!(text.contains(needle), "--help lacks {needle}:\n{text}");
    }
}

#[test]
fn unknown_key_in_local_config_exits_4_naming_it() {
    let root = tempfile::tempdir().unwrap();
    write_local_config(
        root.path(),
        "server-url = \"https://10.0.0.1\"\nsecret-token = \"x\"\n",
    );
    let output = agent(root.path(), &["--no-user-data"]);
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("secret-token"),
        "{}",
        stderr(&output)
    );
    assert!(
        stderr(&output).contains("phase=config failed"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn missing_setting_exits_4() {
    let root = tempfile::tempdir().unwrap();
    let output = agent(
        root.path(),
        &["--no-user-data", "--server-url", "https://10.0.0.1"],
    );
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    assert!(stderr(&output).contains("server-ca"), "{}", stderr(&output));
}

#[test]
fn absent_imds_exits_3_by_the_deadline() {
    let root = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let output = agent(root.path(), &["--deadline", "2s"]);
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("did not answer /latest/user-data by the deadline"),
        "{}",
        stderr(&output)
    );

    // With the config local, the identity phase is the one that gives up.
    write_local_config(
        root.path(),
        &format!("server-url = \"https://10.0.0.1\"\nserver-ca-sha256 = \"{PIN}\"\ncluster-name = \"c\"\n[options]\ndeadline = \"2s\"\n"),
    );
    let output = agent(root.path(), &["--no-user-data"]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("phase=identity failed"),
        "{}",
        stderr(&output)
    );
}

/// Lays out what a successful run leaves behind.
fn joined_root(root: &Path) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["node".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let files = [
        "var/lib/kubelet/kubeconfig",
        "etc/kubernetes/pki/ca.crt",
        "etc/kubernetes/kubelet/config.json",
        "etc/autonode/kubelet.env",
        "etc/systemd/system/kubelet.service.d/10-autonode.conf",
        "var/lib/kubelet/pki/kubelet-server-current.pem",
    ];
    for file in files {
        std::fs::create_dir_all(root.join(file).parent().unwrap()).unwrap();
        std::fs::write(root.join(file), "x").unwrap();
    }
    std::fs::write(
        root.join("var/lib/kubelet/pki/kubelet-client-current.pem"),
        cert.pem(),
    )
    .unwrap();
    std::fs::create_dir_all(root.join("var/lib/autonode")).unwrap();
    std::fs::write(
        root.join("var/lib/autonode/state.json"),
        r#"{"completed":"start","nodeName":"node","agentVersion":"0"}"#,
    )
    .unwrap();
}

#[test]
fn second_run_after_success_verifies_and_exits_0_offline() {
    let root = tempfile::tempdir().unwrap();
    joined_root(root.path());
    write_local_config(
        root.path(),
        &format!("server-url = \"https://10.0.0.1\"\nserver-ca-sha256 = \"{PIN}\"\ncluster-name = \"c\"\n"),
    );
    // IMDS is dead: only a run that does not re-join can succeed.
    let output = agent(root.path(), &["--no-user-data"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("already joined as node"),
        "{}",
        stderr(&output)
    );

    // A missing kubelet file is noticed, and the agent sets up again.
    std::fs::remove_file(root.path().join("etc/kubernetes/pki/ca.crt")).unwrap();
    let output = agent(root.path(), &["--no-user-data", "--deadline", "1s"]);
    assert!(
        stderr(&output).contains("ca.crt is missing"),
        "{}",
        stderr(&output)
    );
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
}
