//! The whole verifier on arbitrary text: base64/PEM decoding, BER, shape
//! checks, region lookup, digest and RSA checks, document parsing.
#![no_main]

use autonode_shared::identity::{verify, TrustStore};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fuzz_target!(|data: &[u8]| {
    static TRUST: OnceLock<TrustStore> = OnceLock::new();
    let trust = TRUST.get_or_init(TrustStore::aws);
    if let Ok(verified) = verify(data, trust) {
        // Only AWS could have signed it; at least the document must be the
        // content and name a region AWS's store covers.
        assert!(!verified.content_bytes().is_empty());
    }
});
