//! userData in any form must parse or fail cleanly, never panic.
#![no_main]

use autonode_agent::config::document_from_user_data;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = document_from_user_data(data);
});
