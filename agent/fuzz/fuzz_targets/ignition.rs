//! Any JSON the server might send: refused, or applied under a temp root
//! without panicking, and never outside it: the root's parent holds only
//! the root and a canary file, unchanged, afterwards.
//!
//! With `AUTONODE_FUZZ_IGNITION_VALIDATE=1`, also differential against the
//! real Ignition: a config of spec 3.0–3.3 (what Debian's `ignition-validate`
//! 2.14 reads) that autonode applies must pass `ignition-validate` too, so
//! autonode never accepts what Ignition would refuse. Each such input costs
//! a process (about 3.6 ms, ~275/s), hence opt-in; see docs/fuzzing.md.
#![no_main]

use autonode_agent::fsutil::Root;
use libfuzzer_sys::fuzz_target;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

const CANARY: &[u8] = b"outside the root\n";
/// Opt-in switch for the differential check.
const DIFFERENTIAL_ENV: &str = "AUTONODE_FUZZ_IGNITION_VALIDATE";
/// The versions Debian's Ignition 2.14 reads.
const IGNITION_VERSIONS: &[&str] = &["3.0.0", "3.1.0", "3.2.0", "3.3.0"];

fn differential() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(DIFFERENTIAL_ENV).is_some_and(|v| v == "1"))
}

/// `ignition-validate -` on `data`: (accepted, what it said).
fn ignition_validate(data: &[u8]) -> (bool, String) {
    let mut child = Command::new("ignition-validate")
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running ignition-validate (apt-get install ignition)");
    if let Some(mut stdin) = child.stdin.take() {
        // A config it stops reading early is still judged by its exit code.
        let _ = stdin.write_all(data);
    }
    let output = child.wait_with_output().expect("waiting for ignition-validate");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(outer) = tempfile::tempdir() else {
        return;
    };
    let root = outer.path().join("root");
    let canary = outer.path().join("canary");
    if std::fs::create_dir(&root).is_err() || std::fs::write(&canary, CANARY).is_err() {
        return;
    }
    let applied = autonode_agent::ignition::apply(&Root::new(&root), &value);
    let mut names: Vec<_> = std::fs::read_dir(outer.path())
        .expect("listing the root's parent")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["canary", "root"],
        "something was written beside the root"
    );
    assert_eq!(
        std::fs::read(&canary).expect("reading the canary"),
        CANARY,
        "a file outside the root was changed"
    );
    let version = value.pointer("/ignition/version").and_then(|v| v.as_str());
    if differential() && applied.is_ok() && version.is_some_and(|v| IGNITION_VERSIONS.contains(&v)) {
        let (accepted, said) = ignition_validate(data);
        assert!(
            accepted,
            "autonode applied a config the real Ignition refuses: {said}"
        );
    }
});
