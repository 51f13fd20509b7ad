//! The BER/CMS decoder and shape checks on arbitrary bytes (skipping the
//! base64 layer, so the fuzzer mutates structure directly), then the
//! verifier on whatever parses.
#![no_main]

use autonode_shared::identity::{verify_parsed, ParsedSignature, TrustStore};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fuzz_target!(|data: &[u8]| {
    static TRUST: OnceLock<TrustStore> = OnceLock::new();
    let trust = TRUST.get_or_init(TrustStore::aws);
    if let Ok(parsed) = ParsedSignature::from_ber(data) {
        let _ = verify_parsed(parsed, trust);
    }
});
