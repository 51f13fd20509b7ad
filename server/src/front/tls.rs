//! The join API's serving certificate, reloaded when its files change.
//!
//! cert-manager and friends rotate the Secret behind these files in place;
//! the server picks the new pair up within [`RELOAD_INTERVAL`] without a
//! restart. A pair that fails to load is logged and the old one kept, so a
//! half-written rotation never takes the API down.
//!
//! A ClientHello is answered ([`answer`]) on a blocking thread: with an
//! RSA key (cert-manager's default) the answer's signature is the costliest
//! thing the join API does for a caller, and one a caller gets for a
//! replayed ClientHello that costs it nothing.

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::HandshakeKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::{Accept, StartHandshake};

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

/// Why a ClientHello went unanswered.
#[derive(Debug, Error)]
pub enum Unanswered {
    /// It needed a HelloRetryRequest (its key shares are none the server
    /// takes). The second ClientHello would be answered while the
    /// handshake is awaited, outside the handshake caps, so such a
    /// handshake goes no further; every agent, and TLS clients generally,
    /// send an X25519 share, which needs no retry.
    #[error("the ClientHello needs a HelloRetryRequest")]
    HelloRetry,
    /// The blocking thread answering it did not finish (a panic).
    #[error("answering the ClientHello: {0}")]
    Lost(#[from] tokio::task::JoinError),
}

/// Answers a ClientHello read by a `LazyConfigAcceptor` (the server's
/// first flight, signed with the serving key) on a blocking thread, and
/// drops `place` when that is done, so that a place under the handshake
/// caps is given back when the signature is made, not before, even if the
/// caller stops waiting. What is left of the handshake (sending that
/// flight, reading the client's Finished) costs little and is awaited on
/// the returned future.
pub async fn answer<IO, P>(
    start: StartHandshake<IO>,
    config: Arc<rustls::ServerConfig>,
    place: P,
) -> Result<Accept<IO>, Unanswered>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    P: Send + 'static,
{
    let (accept, retry) = tokio::task::spawn_blocking(move || {
        let mut retry = false;
        let accept = start.into_stream_with(config, |conn| {
            retry = conn.handshake_kind() == Some(HandshakeKind::FullWithHelloRetryRequest);
        });
        drop(place);
        (accept, retry)
    })
    .await?;
    if retry {
        return Err(Unanswered::HelloRetry);
    }
    Ok(accept)
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

    /// A ClientHello as a client sends it, read by the server's acceptor,
    /// and the client's end of the pipe (the server's answer goes there).
    async fn hello() -> (
        StartHandshake<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
    ) {
        use tokio::io::AsyncWriteExt as _;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let name = "one.example".try_into().unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut bytes = Vec::new();
        client.write_tls(&mut bytes).unwrap();
        let (mut ours, theirs) = tokio::io::duplex(64 * 1024);
        ours.write_all(&bytes).await.unwrap();
        let acceptor = rustls::server::Acceptor::default();
        let start = tokio_rustls::LazyConfigAcceptor::new(acceptor, theirs)
            .await
            .unwrap();
        (start, ours)
    }

    fn loaded(dir: &Path) -> Arc<ReloadingCert> {
        write_pair(dir, "one.example");
        ReloadingCert::load(&dir.join("tls.crt"), &dir.join("tls.key")).unwrap()
    }

    #[tokio::test]
    async fn a_clienthello_is_answered_and_its_place_given_back_once_signed() {
        let dir = tempfile::tempdir().unwrap();
        let config = Arc::new(loaded(dir.path()).server_config());
        let place = Arc::new(());
        let (start, _client) = hello().await;
        let answered = answer(start, config, place.clone()).await;
        assert!(answered.is_ok(), "{:?}", answered.err());
        assert_eq!(Arc::strong_count(&place), 1, "the place was given back");
    }

    /// A server that takes none of the client's key shares would answer
    /// with a HelloRetryRequest, and the second ClientHello outside the
    /// caps: refused instead.
    #[tokio::test]
    async fn a_clienthello_needing_a_retry_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut provider = rustls::crypto::ring::default_provider();
        provider.kx_groups = vec![rustls::crypto::ring::kx_group::SECP384R1];
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(loaded(dir.path()));
        let place = Arc::new(());
        let (start, _client) = hello().await;
        let answered = answer(start, Arc::new(config), place.clone()).await;
        assert!(matches!(answered, Err(Unanswered::HelloRetry)));
        assert_eq!(Arc::strong_count(&place), 1);
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
