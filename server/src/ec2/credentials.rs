//! AWS credentials for signing: aws-config's default provider chain, cached.
//!
//! The chain (env, web identity/IRSA, profile, container, IMDS) is not
//! cached by itself: without this cache every lookup would go back to STS
//! or IMDS. Credentials are kept until shortly before they expire, or until
//! EC2 refuses them.

use std::time::{Duration, SystemTime};

use aws_config::default_provider::credentials::DefaultCredentialsChain;
use aws_config::provider_config::ProviderConfig;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use tokio::sync::Mutex;

use super::LookupError;
use crate::primitives::clock::Clock;

/// Refresh this long before expiry, so a request signed with them does not
/// arrive after they lapsed (STS credentials last an hour or more).
const REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);

#[derive(Debug)]
pub(super) struct CachedCredentials {
    provider: SharedCredentialsProvider,
    /// Behind an async mutex so that concurrent joins wait for one refresh
    /// instead of each asking the provider.
    cached: Mutex<Option<Credentials>>,
}

impl CachedCredentials {
    pub(super) fn new(provider: impl ProvideCredentials + 'static) -> Self {
        Self {
            provider: SharedCredentialsProvider::new(provider),
            cached: Mutex::new(None),
        }
    }

    /// aws-config's default chain, with the region from the environment or
    /// profile (for STS), over hyper + rustls with ring.
    pub(super) async fn default_chain() -> Self {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
            .build_https();
        // The client first: finding the region may already ask IMDS, and
        // aws-config panics on a request without a client.
        let config = ProviderConfig::default()
            .with_http_client(http)
            .load_default_region()
            .await;
        let chain = DefaultCredentialsChain::builder()
            .configure(config)
            .build()
            .await;
        Self::new(chain)
    }

    /// Current credentials, from the cache while they are fresh.
    pub(super) async fn get(&self) -> Result<Credentials, LookupError> {
        let mut cached = self.cached.lock().await;
        if let Some(credentials) = cached
            .as_ref()
            .filter(|c| is_fresh(c, Clock::SYSTEM.now().into()))
        {
            return Ok(credentials.clone());
        }
        let credentials = self
            .provider
            .provide_credentials()
            .await
            .map_err(|e| LookupError::Credentials(error_chain(&e)))?;
        *cached = Some(credentials.clone());
        Ok(credentials)
    }

    /// Forgets the cached credentials (EC2 refused them: rotated, revoked).
    pub(super) async fn invalidate(&self) {
        *self.cached.lock().await = None;
    }
}

fn is_fresh(credentials: &Credentials, now: SystemTime) -> bool {
    credentials
        .expiry()
        .is_none_or(|expiry| now + REFRESH_MARGIN < expiry)
}

/// An error and its sources on one line: the chain's errors say little at
/// the top ("failed to load credentials") and the cause underneath.
pub(super) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expiring_in(secs: u64, now: SystemTime) -> Credentials {
        Credentials::new(
            "AKID",
            "secret",
            Some("token".into()),
            Some(now + Duration::from_secs(secs)),
            "test",
        )
    }

    #[test]
    fn freshness_keeps_a_margin() {
        let now: SystemTime = Clock::SYSTEM.now().into();
        assert!(is_fresh(
            &Credentials::new("AKID", "secret", None, None, "test"),
            now
        ));
        assert!(is_fresh(&expiring_in(3600, now), now));
        assert!(!is_fresh(&expiring_in(60, now), now));
    }

    #[tokio::test]
    async fn caches_until_invalidated() {
        let cache = CachedCredentials::new(Credentials::new("AKID", "secret", None, None, "test"));
        assert_eq!(
            cache
                .get()
                .await
                .expect("static credentials")
                .access_key_id(),
            "AKID"
        );
        assert!(cache.cached.lock().await.is_some());
        cache.invalidate().await;
        assert!(cache.cached.lock().await.is_none());
    }
}
