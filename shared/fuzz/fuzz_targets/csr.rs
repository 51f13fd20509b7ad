//! The CSR parser on arbitrary bytes (PEM armour, DER, key and name
//! extraction, signature check), then every rule on whatever parses, with
//! fixed node names; and the usages rule on the same bytes read as lines.
//! Nothing may panic.
#![no_main]

use autonode_shared::csr::{
    check_client_csr, check_serving_csr, check_usages, parse_csr, usages_for, KeyKind, Purpose,
};
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr};

const NODE: &str = "ip-10-0-1-23.eu-west-1.compute.internal";

fuzz_target!(|data: &[u8]| {
    usages(data);
    csr(data);
});

/// Whatever the usages rule accepts is a subset of what the server itself
/// would put on a CSR, and always includes digital signature.
fn usages(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let usages: Vec<String> = text.lines().map(str::to_string).collect();
    let keys = [KeyKind::EcdsaP256, KeyKind::Rsa { bits: 2048 }];
    for purpose in [Purpose::Client, Purpose::Serving] {
        for key in &keys {
            if check_usages(&usages, purpose, key).is_ok() {
                let allowed = usages_for(purpose);
                assert!(usages.iter().all(|u| allowed.contains(&u.as_str())));
                assert!(usages.iter().any(|u| u == "digital signature"));
            }
        }
    }
}

fn csr(data: &[u8]) {
    let Ok(csr) = parse_csr(data) else {
        return;
    };
    assert_eq!(csr.public_key_fingerprint().len(), 64);
    let allowed_dns = [NODE.to_string()];
    let allowed_ips = [IpAddr::V4(Ipv4Addr::new(10, 0, 1, 23))];
    let client = check_client_csr(&csr, NODE);
    let serving = check_serving_csr(&csr, NODE, &allowed_dns, &allowed_ips);
    // No CSR is both a valid client request (no SANs) and a valid serving
    // request (at least one SAN).
    assert!(client.is_err() || serving.is_err());
    for err in [client.err(), serving.err()].into_iter().flatten() {
        assert!(err.reason().starts_with("csr_"));
        let _ = err.to_string();
    }
}
