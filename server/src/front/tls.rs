//! The join API's serving certificate, reloaded when its files change.
//!
//! cert-manager and friends rotate the Secret behind these files in place;
//! the server picks the new pair up within [`RELOAD_INTERVAL`] without a
//! restart. A pair that fails to load is logged and the old one kept, so a
//! half-written rotation never takes the API down.

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use thiserror::Error;

/// How often the files are checked for changes.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} holds no PEM certificate")]
    NoCertificate(PathBuf),
    #[error("{0} holds no PEM private key")]
    NoKey(PathBuf),
    #[error("unusable private key in {path}: {source}")]
    BadKey {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Serves the current certificate and reloads it when the files change.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<(Arc<CertifiedKey>, Option<SystemTime>)>,
}

impl ReloadingCert {
    /// Loads the pair once; fails if it cannot.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<Self>, TlsError> {
        let key = load_pair(cert_path, key_path)?;
        Ok(Arc::new(Self {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            current: RwLock::new((key, modified(cert_path, key_path))),
        }))
    }

    /// Reloads if either file changed since the last load.
    pub fn refresh(&self) {
        let stamp = modified(&self.cert_path, &self.key_path);
        let known = self.current.read().map(|c| c.1).unwrap_or(None);
        if stamp == known {
            return;
        }
        match load_pair(&self.cert_path, &self.key_path) {
            Ok(key) => {
                if let Ok(mut current) = self.current.write() {
                    *current = (key, stamp);
                }
                tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
            }
            Err(e) => {
                tracing::warn!(error = %e, "serving certificate changed but did not load; keeping the old one")
            }
        }
    }

    /// Checks for changes every [`RELOAD_INTERVAL`], forever.
    pub fn spawn_reloader(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RELOAD_INTERVAL);
            loop {
                tick.tick().await;
                this.refresh();
            }
        });
    }

    /// A rustls server config serving this certificate (TLS 1.2 and 1.3,
    /// HTTP/1.1).
    pub fn server_config(self: &Arc<Self>) -> rustls::ServerConfig {
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.0.clone())
    }
}

fn load_pair(cert_path: &Path, key_path: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let cert_pem = read(cert_path)?;
    let key_pem = read(key_path)?;
    let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert_path.to_path_buf()));
    }
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .ok()
        .flatten()
        .ok_or_else(|| TlsError::NoKey(key_path.to_path_buf()))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|source| {
        TlsError::BadKey {
            path: key_path.to_path_buf(),
            source,
        }
    })?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

fn modified(cert_path: &Path, key_path: &Path) -> Option<SystemTime> {
    let cert = std::fs::metadata(cert_path)
        .and_then(|m| m.modified())
        .ok()?;
    let key = std::fs::metadata(key_path)
        .and_then(|m| m.modified())
        .ok()?;
    Some(cert.max(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
        cert.der().to_vec()
    }

    fn served(cert: &ReloadingCert) -> Vec<u8> {
        cert.current.read().unwrap().0.cert[0].to_vec()
    }

    #[test]
    fn a_rotated_pair_is_served_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let first = write_pair(dir.path(), "one.example");
        let cert =
            ReloadingCert::load(&dir.path().join("tls.crt"), &dir.path().join("tls.key")).unwrap();
        assert_eq!(served(&cert), first);

        std::thread::sleep(std::time::Duration::from_millis(20));
        let second = write_pair(dir.path(), "two.example");
        cert.refresh();
        assert_eq!(served(&cert), second);

        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(dir.path().join("tls.key"), "half-written").unwrap();
        cert.refresh();
        assert_eq!(
            served(&cert),
            second,
            "a broken pair must not replace a good one"
        );
    }

    #[test]
    fn missing_or_empty_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let err = ReloadingCert::load(&dir.path().join("nope.crt"), &dir.path().join("nope.key"))
            .unwrap_err();
        assert!(err.to_string().contains("nope.crt"), "{err}");
        std::fs::write(dir.path().join("tls.crt"), "").unwrap();
        std::fs::write(dir.path().join("tls.key"), "").unwrap();
        let err = ReloadingCert::load(&dir.path().join("tls.crt"), &dir.path().join("tls.key"))
            .unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate(_)), "{err}");
    }
}
