//! `autonode-server ignition check` as a process: verdict lines on stdout,
//! exit 0 when every file passes, 1 when any is refused, 2 when a file
//! cannot be read or the command line is wrong.

use autonode_tests::server::server_binary;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn check(files: &[&Path]) -> Output {
    let binary = server_binary().expect("autonode-server is built");
    Command::new(binary)
        .args(["ignition", "check"])
        .args(files)
        .output()
        .expect("autonode-server runs")
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a config");
    path
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A config as Butane and Go write them: users, files with verified
/// data, units, and empty sections that ask for nothing.
const GOOD: &str = r#"{
  "ignition": {"version": "3.6.0", "config": {"replace": {"verification": {}}}, "proxy": {}},
  "kernelArguments": {},
  "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAA"], "shouldExist": true}]},
  "storage": {"disks": [], "files": [{"path": "/etc/motd", "mode": 420, "user": {"name": "core"},
    "contents": {"source": "data:,hi", "verification":
      {"hash": "sha256-8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4"}}}]},
  "systemd": {"units": [{"name": "hello.service", "enabled": true,
    "contents": "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"}]}
}"#;

#[test]
fn good_files_pass_and_bad_ones_are_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.ign", GOOD);
    let also_good = write(
        dir.path(),
        "min.ign",
        r#"{"ignition": {"version": "3.0.0"}}"#,
    );
    let output = check(&[&good, &also_good]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(
        stdout(&output),
        format!("{}: ok\n{}: ok\n", good.display(), also_good.display())
    );

    let base64 = write(
        dir.path(),
        "base64.ign",
        r#"{"ignition": {"version": "3.3.0"}, "storage": {"files": [{"path": "/a",
            "contents": {"source": "data:;base64,aGk%0A="}}]}}"#,
    );
    let disks = write(
        dir.path(),
        "disks.ign",
        r#"{"ignition": {"version": "3.3.0"}, "storage": {"disks": [{"device": "/dev/sdb"}]}}"#,
    );
    let output = check(&[&good, &base64, &disks]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let lines: Vec<String> = stdout(&output).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 3, "one verdict per file: {lines:?}");
    assert_eq!(lines[0], format!("{}: ok", good.display()));
    assert!(
        lines[1].starts_with(&format!(
            "{}: refused: storage.files[0].contents.source: bad base64",
            base64.display()
        )),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].starts_with(&format!("{}: refused: storage.disks: ", disks.display())),
        "{}",
        lines[2]
    );
}

#[test]
fn unreadable_files_and_usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.ign", GOOD);
    let missing = dir.path().join("missing.ign");
    let output = check(&[&good, &missing]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert_eq!(stdout(&output), format!("{}: ok\n", good.display()));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("{}: cannot be read", missing.display())),
        "{stderr}"
    );

    let output = check(&[]);
    assert_eq!(output.status.code(), Some(2), "no FILE is a usage error");

    let help = Command::new(server_binary().unwrap())
        .args(["ignition", "check", "--help"])
        .output()
        .unwrap();
    assert_eq!(help.status.code(), Some(0));
    assert!(stdout(&help).contains("Exit status:"), "{}", stdout(&help));
}
