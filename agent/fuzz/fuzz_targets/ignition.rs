//! Any JSON the server might send: refused, or applied under a temp root
//! (never outside it) without panicking.
#![no_main]

use autonode_agent::fsutil::Root;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(dir) = tempfile::tempdir() else { return };
    let _ = autonode_agent::ignition::apply(&Root::new(dir.path()), &value);
});
