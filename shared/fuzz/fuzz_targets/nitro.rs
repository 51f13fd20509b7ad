//! The Nitro attestation verifier on arbitrary bytes: the strict CBOR
//! reader alone, then the whole of `nitro::verify` (COSE envelope, payload
//! rules, chain to AWS's root, signature) at the document's own time.
//! Nothing may panic, and nothing but AWS's own documents may verify.
#![no_main]

use autonode_shared::nitro::{cbor, verify, At, Root, MAX_DOCUMENT_BYTES};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fuzz_target!(|data: &[u8]| {
    static ROOT: OnceLock<Root> = OnceLock::new();
    let root = ROOT.get_or_init(Root::aws);
    let _ = cbor::decode(data);
    if let Ok(doc) = verify(data, root, At::DocumentTime) {
        // Only AWS could have signed it: a real document, of its shape.
        assert!(data.len() <= MAX_DOCUMENT_BYTES);
        assert!(!doc.module_id.is_empty() && !doc.pcrs.is_empty());
    }
});
