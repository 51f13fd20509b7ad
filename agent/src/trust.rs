//! Trusting the join server: its CA from the config, and nothing else.
//!
//! Two forms ([`ServerTrust`]):
//!
//! - `server-ca` (inline PEM): those certificates are the only roots; the
//!   standard WebPKI verification (chain, validity, server name) applies.
//! - `server-ca-sha256` (a pin): the sha256 of the CA certificate's DER.
//!   The server must include that CA certificate in the chain it presents.
//!   [`PinnedCa`] looks through the presented certificates for one whose
//!   DER hashes to the pin, then verifies the leaf against that certificate
//!   as the only root, exactly as in the first form. A chain without the
//!   pinned CA, or whose leaf the CA did not sign, is refused. The pin stays
//!   valid across server certificate rotations (only a CA change changes it)
//!   and fits in userData, which matters because any userData change makes
//!   Karpenter replace every node.
//!
//! The operating system's trust store is never consulted, nor its clock:
//! a certificate's validity is judged at the agent's one [`Clock`]'s time.

use autonode_shared::clock::Clock;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::time_provider::TimeProvider;
use rustls::{
    ClientConfig, DigitallySignedStruct, Error as TlsError, RootCertStore, SignatureScheme,
};
use sha2::{Digest as _, Sha256};
use std::sync::Arc;
use std::time::Duration;

/// How the agent decides to trust the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerTrust {
    /// Only these CA certificates (DER).
    Ca(Vec<Vec<u8>>),
    /// The CA whose DER has this sha256, found in the presented chain.
    Sha256Pin([u8; 32]),
}

/// Why no TLS configuration could be built.
#[derive(Debug, thiserror::Error)]
#[error("server CA: {0}")]
pub struct TrustError(String);

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The agent's clock as rustls's: the time certificates are judged at.
#[derive(Debug)]
struct ClockTime(Clock);

impl TimeProvider for ClockTime {
    fn current_time(&self) -> Option<UnixTime> {
        let seconds = u64::try_from(self.0.unix()).ok()?;
        Some(UnixTime::since_unix_epoch(Duration::from_secs(seconds)))
    }
}

/// The TLS client configuration for talking to the join server, judging
/// its certificates at `clock`'s time.
pub fn client_config(trust: &ServerTrust, clock: Clock) -> Result<Arc<ClientConfig>, TrustError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_details(provider.clone(), Arc::new(ClockTime(clock)))
        .with_safe_default_protocol_versions()
        .map_err(|e| TrustError(e.to_string()))?;
    let config = match trust {
        ServerTrust::Ca(ders) => {
            let roots = root_store(ders.iter().map(|der| CertificateDer::from(der.clone())))?;
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        ServerTrust::Sha256Pin(pin) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedCa {
                pin: *pin,
                provider,
            }))
            .with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

fn root_store<'a>(
    certs: impl Iterator<Item = CertificateDer<'a>>,
) -> Result<RootCertStore, TrustError> {
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| TrustError(format!("unusable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// Verifies a server chain against the CA certificate with a pinned sha256,
/// taken from the chain itself.
#[derive(Debug)]
pub struct PinnedCa {
    pin: [u8; 32],
    provider: Arc<CryptoProvider>,
}

impl PinnedCa {
    fn algorithms(&self) -> &WebPkiSupportedAlgorithms {
        &self.provider.signature_verification_algorithms
    }
}

impl ServerCertVerifier for PinnedCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        let ca = intermediates
            .iter()
            .find(|cert| Sha256::digest(cert.as_ref()).as_slice() == self.pin)
            .ok_or_else(|| {
                TlsError::General(
                    "no certificate in the server's chain matches server-ca-sha256".into(),
                )
            })?;
        let roots = root_store(std::iter::once(ca.clone()))
            .map_err(|e| TlsError::General(e.to_string()))?;
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                .build()
                .map_err(|e| TlsError::General(e.to_string()))?;
        verifier.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, self.algorithms())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, self.algorithms())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms().supported_schemes()
    }
}

/// The pin of a CA certificate, as `server-ca-sha256` wants it.
pub fn pin_of(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

    struct Chain {
        ca: Vec<u8>,
        leaf: Vec<u8>,
    }

    fn chain(name: &str) -> Chain {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        Chain {
            ca: ca.der().to_vec(),
            leaf: leaf.der().to_vec(),
        }
    }

    fn verify(
        pin: [u8; 32],
        presented: &Chain,
        ca_in_chain: &[u8],
        name: &str,
    ) -> Result<ServerCertVerified, TlsError> {
        let verifier = PinnedCa {
            pin,
            provider: provider(),
        };
        let server_name = ServerName::try_from(name.to_string()).unwrap();
        verifier.verify_server_cert(
            &CertificateDer::from(presented.leaf.clone()),
            &[CertificateDer::from(ca_in_chain.to_vec())],
            &server_name,
            &[],
            UnixTime::now(),
        )
    }

    fn pin(der: &[u8]) -> [u8; 32] {
        Sha256::digest(der).into()
    }

    #[test]
    fn pinned_ca_in_chain_verifies_leaf() {
        let good = chain("join.test");
        assert!(verify(pin(&good.ca), &good, &good.ca, "join.test").is_ok());
        // Wrong name: the leaf is still checked as usual.
        assert!(verify(pin(&good.ca), &good, &good.ca, "other.test").is_err());
    }

    #[test]
    fn chain_without_pinned_ca_or_leaf_from_another_ca_is_refused() {
        let good = chain("join.test");
        let evil = chain("join.test");
        // The pinned CA is absent from the chain.
        assert!(verify(pin(&good.ca), &evil, &evil.ca, "join.test").is_err());
        // The pinned CA is present, but it did not sign the leaf.
        assert!(verify(pin(&good.ca), &evil, &good.ca, "join.test").is_err());
    }

    #[test]
    fn pin_of_is_hex_sha256() {
        let text = pin_of(b"abc");
        assert_eq!(
            text,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(crate::config::parse_pin(&text).unwrap(), pin(b"abc"));
    }
}
