//! IMDSv2: the instance's userData and identity.
//!
//! A small client on [`crate::http`] rather than `aws_config::imds`: the
//! SDK's client returns every body as a UTF-8 `String` and fails on
//! anything else, but userData may be gzip-compressed (binary), one of the
//! forms the agent must accept; it would also pull the SDK's runtime into a
//! binary with a 4 MiB budget.
//!
//! Behaviour: a session token (PUT, with a TTL) is fetched first and
//! renewed before it expires and whenever IMDS answers 401; 404 means "not
//! there" (`Ok(None)`); connection failures, timeouts, 429 and 5xx are
//! retried with backoff until the agent's deadline. No proxy is ever used.

use crate::http::{self, HttpError};
use crate::retry::{retry, Attempt, Deadline, RetryError, RetryPolicy};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, StatusCode, Uri};
use serde::Deserialize;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Where IMDS is on every EC2 instance.
pub const DEFAULT_ENDPOINT: &str = "http://169.254.169.254";
/// The AWS SDKs' variable for another endpoint (tests on loopback).
pub const ENDPOINT_ENV: &str = "AWS_EC2_METADATA_SERVICE_ENDPOINT";
/// Token lifetime asked for; the agent renews a minute before it ends.
pub const TOKEN_TTL: Duration = Duration::from_secs(21_600);
const TOKEN_MARGIN: Duration = Duration::from_secs(60);
/// One request's limit: IMDS answers in milliseconds when it answers.
const PER_TRY_TIMEOUT: Duration = Duration::from_secs(3);
/// userData is at most 16 KiB; metadata is smaller.
const MAX_BODY: usize = 256 * 1024;

/// Why IMDS gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ImdsError {
    #[error("IMDS endpoint {0:?} must be an http:// URL")]
    BadEndpoint(String),
    #[error("IMDS at {endpoint} did not answer {path} by the deadline: {reason}")]
    GaveUp {
        endpoint: String,
        path: String,
        reason: RetryError<String>,
    },
    #[error("IMDS {path}: {reason}")]
    Refused { path: String, reason: String },
    #[error("IMDS has no {0}")]
    Missing(String),
    #[error("IMDS {path}: {reason}")]
    Invalid { path: String, reason: String },
}

#[derive(Debug, Clone)]
struct Token {
    value: String,
    renew_at: Instant,
}

/// An IMDSv2 client bound to the agent's deadline.
#[derive(Debug)]
pub struct Imds {
    endpoint: Uri,
    deadline: Deadline,
    policy: RetryPolicy,
    token: Mutex<Option<Token>>,
}

impl Imds {
    pub fn new(endpoint: &str, deadline: Deadline) -> Result<Self, ImdsError> {
        let uri: Uri = endpoint
            .trim_end_matches('/')
            .parse()
            .map_err(|_| ImdsError::BadEndpoint(endpoint.into()))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(ImdsError::BadEndpoint(endpoint.into()));
        }
        Ok(Imds {
            endpoint: uri,
            deadline,
            policy: RetryPolicy::IMDS,
            token: Mutex::new(None),
        })
    }

    /// GET `path`; `None` when IMDS says 404.
    pub async fn get(&self, path: &str) -> Result<Option<Bytes>, ImdsError> {
        let outcome = retry(
            &self.policy,
            &self.deadline,
            &format!("IMDS {path}"),
            |_| self.attempt(path),
        )
        .await;
        outcome.map_err(|source| match source {
            RetryError::Fatal(reason) => ImdsError::Refused {
                path: path.into(),
                reason,
            },
            gave_up => ImdsError::GaveUp {
                endpoint: self.endpoint.to_string(),
                path: path.into(),
                reason: gave_up,
            },
        })
    }

    /// GET `path` as trimmed text; `None` when IMDS says 404.
    pub async fn get_text(&self, path: &str) -> Result<Option<String>, ImdsError> {
        let Some(body) = self.get(path).await? else {
            return Ok(None);
        };
        let text = String::from_utf8(body.to_vec()).map_err(|_| ImdsError::Invalid {
            path: path.into(),
            reason: "not UTF-8".into(),
        })?;
        Ok(Some(text.trim().to_string()))
    }

    /// GET `path` as text that must be there.
    pub async fn require_text(&self, path: &str) -> Result<String, ImdsError> {
        self.get_text(path)
            .await?
            .ok_or_else(|| ImdsError::Missing(path.into()))
    }

    async fn attempt(&self, path: &str) -> Attempt<Option<Bytes>, String> {
        let token = match self.token().await {
            Ok(token) => token,
            Err(attempt) => return attempt,
        };
        let request = http::request(Method::GET, &self.endpoint, path).and_then(|b| {
            b.header("x-aws-ec2-metadata-token", token)
                .body(Full::new(Bytes::new()))
                .map_err(|e| HttpError::BadUrl(e.to_string()))
        });
        let response = match request {
            Ok(request) => self.exchange(request).await,
            Err(e) => return Attempt::Fatal(e.to_string()),
        };
        match response {
            Ok(r) if r.status == StatusCode::OK => Attempt::Done(Some(r.body)),
            Ok(r) if r.status == StatusCode::NOT_FOUND => Attempt::Done(None),
            Ok(r) if r.status == StatusCode::UNAUTHORIZED => {
                // The token expired (or IMDS restarted): get a new one.
                self.forget_token();
                Attempt::Retry {
                    error: "401: token rejected; fetching a new one".into(),
                    after: None,
                }
            }
            Ok(r) => classify(r.status),
            Err(e) => Attempt::Retry {
                error: e.to_string(),
                after: None,
            },
        }
    }

    /// The current token, fetching one if there is none or it is about to
    /// expire. `Err` carries what the attempt came to.
    async fn token(&self) -> Result<String, Attempt<Option<Bytes>, String>> {
        if let Some(token) = self.cached_token() {
            return Ok(token);
        }
        let request =
            http::request(Method::PUT, &self.endpoint, "/latest/api/token").and_then(|b| {
                b.header(
                    "x-aws-ec2-metadata-token-ttl-seconds",
                    TOKEN_TTL.as_secs().to_string(),
                )
                .body(Full::new(Bytes::new()))
                .map_err(|e| HttpError::BadUrl(e.to_string()))
            });
        let request = request.map_err(|e| Attempt::Fatal(e.to_string()))?;
        let response = self.exchange(request).await.map_err(|e| Attempt::Retry {
            error: format!("token: {e}"),
            after: None,
        })?;
        if response.status != StatusCode::OK {
            return Err(match classify(response.status) {
                Attempt::Fatal(e) => Attempt::Fatal(format!("token: {e} (is IMDSv2 enabled?)")),
                other => other,
            });
        }
        let value = String::from_utf8_lossy(&response.body).trim().to_string();
        let renew_at = Instant::now() + TOKEN_TTL.saturating_sub(TOKEN_MARGIN);
        self.store_token(Token {
            value: value.clone(),
            renew_at,
        });
        Ok(value)
    }

    fn cached_token(&self) -> Option<String> {
        let guard = self.token.lock().ok()?;
        guard
            .as_ref()
            .filter(|t| Instant::now() < t.renew_at)
            .map(|t| t.value.clone())
    }

    fn store_token(&self, token: Token) {
        if let Ok(mut guard) = self.token.lock() {
            *guard = Some(token);
        }
    }

    fn forget_token(&self) {
        if let Ok(mut guard) = self.token.lock() {
            *guard = None;
        }
    }

    async fn exchange(
        &self,
        request: hyper::Request<Full<Bytes>>,
    ) -> Result<http::Response, HttpError> {
        let limit = self.deadline.clamp(PER_TRY_TIMEOUT);
        let work = async {
            let (host, port) = http::host_port(&self.endpoint)?;
            let stream = http::connect(&host, port).await?;
            http::send(stream, request, MAX_BODY).await
        };
        tokio::time::timeout(limit, work)
            .await
            .unwrap_or(Err(HttpError::Timeout(limit.as_secs_f64())))
    }

    /// Reads everything the join needs about this instance.
    pub async fn identity(&self) -> Result<Identity, ImdsError> {
        let document_path = "/latest/dynamic/instance-identity/document";
        // The first request fetches the session token; the rest share it
        // and go out together (each is a round trip to the hypervisor).
        let instance_id = self.require_text("/latest/meta-data/instance-id").await?;
        let (document_raw, rsa2048, availability_zone, local_hostname, ips) = tokio::try_join!(
            self.require_text(document_path),
            self.require_text("/latest/dynamic/instance-identity/rsa2048"),
            self.require_text("/latest/meta-data/placement/availability-zone"),
            self.require_text("/latest/meta-data/local-hostname"),
            self.ips(),
        )?;
        let document: IdentityDocument =
            serde_json::from_str(&document_raw).map_err(|e| ImdsError::Invalid {
                path: document_path.into(),
                reason: e.to_string(),
            })?;
        if instance_id != document.instance_id || availability_zone != document.availability_zone {
            return Err(ImdsError::Invalid {
                path: document_path.into(),
                reason: "instance id or availability zone differs from the metadata".into(),
            });
        }
        Ok(Identity {
            document,
            rsa2048,
            local_hostname,
            ips,
        })
    }

    /// The primary interface's private IPv4s and IPv6s, primary IP first.
    async fn ips(&self) -> Result<Vec<IpAddr>, ImdsError> {
        let (primary, mac) = tokio::try_join!(
            self.get_text("/latest/meta-data/local-ipv4"),
            self.get_text("/latest/meta-data/mac"),
        )?;
        let mut lists = vec![primary];
        if let Some(mac) = mac {
            let base = format!("/latest/meta-data/network/interfaces/macs/{mac}");
            let (v4_path, v6_path) = (format!("{base}/local-ipv4s"), format!("{base}/ipv6s"));
            let (v4, v6) = tokio::try_join!(self.get_text(&v4_path), self.get_text(&v6_path))?;
            lists.extend([v4, v6]);
        }
        let mut ips: Vec<IpAddr> = Vec::new();
        for word in lists
            .iter()
            .flatten()
            .flat_map(|list| list.split_whitespace())
        {
            let ip = word.parse().map_err(|_| ImdsError::Invalid {
                path: "/latest/meta-data (IPs)".into(),
                reason: format!("{word:?} is not an IP address"),
            })?;
            if !ips.contains(&ip) {
                ips.push(ip);
            }
        }
        Ok(ips)
    }
}

/// 429 and 5xx are transient; any other status is final.
fn classify<T>(status: StatusCode) -> Attempt<T, String> {
    let error = format!("HTTP {status}");
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        Attempt::Retry { error, after: None }
    } else {
        Attempt::Fatal(error)
    }
}

/// The fields of the identity document the agent uses (the server reads
/// the signed copy; these are for naming and cross-checks).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityDocument {
    pub instance_id: String,
    pub availability_zone: String,
    pub region: String,
    pub account_id: String,
}

/// What IMDS says about this instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub document: IdentityDocument,
    /// The base64 PKCS#7 signature over the document, sent to the server.
    pub rsa2048: String,
    /// The instance's private DNS name: the node name kubelet registers.
    pub local_hostname: String,
    /// Primary IP first.
    pub ips: Vec<IpAddr>,
}

impl Identity {
    /// `aws:///<availability-zone>/<instance-id>`, as Karpenter records it.
    pub fn provider_id(&self) -> String {
        format!(
            "aws:///{}/{}",
            self.document.availability_zone, self.document.instance_id
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_must_be_http() {
        let deadline = Deadline::after(Duration::from_secs(1));
        assert!(Imds::new("http://127.0.0.1:1234/", deadline).is_ok());
        assert!(Imds::new("https://169.254.169.254", deadline).is_err());
        assert!(Imds::new("169.254.169.254", deadline).is_err());
    }

    #[test]
    fn status_classes() {
        assert!(matches!(
            classify::<()>(StatusCode::SERVICE_UNAVAILABLE),
            Attempt::Retry { .. }
        ));
        assert!(matches!(
            classify::<()>(StatusCode::TOO_MANY_REQUESTS),
            Attempt::Retry { .. }
        ));
        assert!(matches!(
            classify::<()>(StatusCode::FORBIDDEN),
            Attempt::Fatal(_)
        ));
    }

    #[tokio::test]
    async fn absent_imds_gives_up_by_the_deadline() {
        // A port nothing listens on: connection refused, retried until the
        // deadline, then a message naming the endpoint.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let imds = Imds::new(&endpoint, Deadline::after(Duration::from_millis(1500))).unwrap();
        let started = std::time::Instant::now();
        let err = imds.get("/latest/user-data").await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3));
        let text = err.to_string();
        assert!(
            text.contains(&endpoint) && text.contains("gave up"),
            "{text}"
        );
    }
}
