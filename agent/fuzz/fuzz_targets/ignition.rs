//! Any JSON the server might send: refused, or applied under a temp root
//! without panicking, and never outside it: the root's parent holds only
//! the root and a canary file, unchanged, afterwards.
#![no_main]

use autonode_agent::fsutil::Root;
use libfuzzer_sys::fuzz_target;

const CANARY: &[u8] = b"outside the root\n";

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
    let _ = autonode_agent::ignition::apply(&Root::new(&root), &value);
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
});
