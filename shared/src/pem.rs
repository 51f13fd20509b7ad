//! Writing certificates as PEM (RFC 7468), one spelling per certificate:
//! the server puts CA bundles in userData (whose bytes Karpenter hashes)
//! and in kubeconfigs, so the same DER must always give the same text.
//! Reading PEM is [`crate::identity`]'s and the `rustls-pki-types` parser's.

use base64::Engine as _;

/// `der` as a `CERTIFICATE` block: standard base64 in 64-column lines, and
/// a line break after the END line, so blocks concatenate into a bundle.
pub fn certificate(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 64);
    out.push_str("-----BEGIN CERTIFICATE-----\n");
    // Base64 is ASCII, so 64-byte chunks are whole characters.
    let mut rest = b64.as_str();
    while !rest.is_empty() {
        let (line, tail) = rest.split_at(rest.len().min(64));
        out.push_str(line);
        out.push('\n');
        rest = tail;
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// Every certificate of `ders` as [`certificate`] writes it, in order.
pub fn bundle<D: AsRef<[u8]>>(ders: &[D]) -> String {
    ders.iter().map(|der| certificate(der.as_ref())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::CertificateDer;

    #[test]
    fn lines_are_64_columns_and_the_der_reads_back() {
        for len in [0, 1, 47, 48, 49, 96, 1000] {
            let der: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
            let pem = certificate(&der);
            assert!(pem.starts_with("-----BEGIN CERTIFICATE-----\n"), "{pem}");
            assert!(pem.ends_with("\n-----END CERTIFICATE-----\n"), "{pem}");
            let body: Vec<&str> = pem
                .lines()
                .skip(1)
                .take_while(|l| !l.starts_with("-----"))
                .collect();
            assert!(body.iter().all(|l| !l.is_empty() && l.len() <= 64), "{pem}");
            assert!(body.iter().rev().skip(1).all(|l| l.len() == 64), "{pem}");
            if len > 0 {
                let read = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
                assert_eq!(read.as_ref(), der.as_slice());
            }
        }
        assert_eq!(
            certificate(&[0, 1, 2]),
            "-----BEGIN CERTIFICATE-----\nAAEC\n-----END CERTIFICATE-----\n"
        );
    }

    #[test]
    fn a_bundle_is_the_blocks_in_order() {
        let ders = [vec![1u8, 2, 3], vec![4u8, 5, 6]];
        assert_eq!(
            bundle(&ders),
            format!("{}{}", certificate(&ders[0]), certificate(&ders[1]))
        );
        assert_eq!(bundle::<Vec<u8>>(&[]), "");
    }
}
