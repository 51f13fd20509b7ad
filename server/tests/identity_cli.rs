//! `autonode-server identity verify` as an operator runs it: the built
//! binary, on the real AWS sample and on garbage.

use std::path::PathBuf;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_autonode-server");

fn sample(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data/aws-iid/samples/real-us-west-2-2021")
        .join(name)
}

fn us_west_2_cert() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/aws-iid/rsa2048/us-west-2.pem")
}

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(BIN)
        .args(["identity", "verify"])
        .args(args)
        .output()
        .expect("run autonode-server")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn real_sample_verifies_and_prints_the_document() {
    for file in ["rsa2048.b64", "rsa2048.pem"] {
        let path = sample(file);
        let out = run(&["--signature".as_ref(), path.as_os_str()]);
        assert!(out.status.success(), "{file}: {}", stderr(&out));
        let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let expected: serde_json::Value =
            serde_json::from_slice(&std::fs::read(sample("document.json")).unwrap()).unwrap();
        assert_eq!(printed, expected);
    }
}

#[test]
fn garbage_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage");
    std::fs::write(&path, "this is not a signature").unwrap();
    let out = run(&["--signature".as_ref(), path.as_os_str()]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = stderr(&out);
    assert!(err.contains("refused (not_base64)"), "{err}");
}

#[test]
fn empty_file_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty");
    std::fs::write(&path, "\n").unwrap();
    let out = run(&["--signature".as_ref(), path.as_os_str()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("the signature is empty"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn certs_dir_is_loaded_and_bad_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("us-west-2.pem");
    std::fs::copy(us_west_2_cert(), &good).unwrap();
    let sig = sample("rsa2048.b64");
    let out = run(&[
        "--signature".as_ref(),
        sig.as_os_str(),
        "--certs".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));

    std::fs::copy(us_west_2_cert(), dir.path().join("ca.pem")).unwrap();
    let out = run(&[
        "--signature".as_ref(),
        sig.as_os_str(),
        "--certs".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("must be named <region>.pem"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn missing_signature_file_is_an_error() {
    let out = run(&["--signature".as_ref(), "/nonexistent/rsa2048".as_ref()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("reading /nonexistent/rsa2048"),
        "{}",
        stderr(&out)
    );
}
