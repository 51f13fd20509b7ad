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
//! 403 is what IMDS answers when it is turned off for the instance
//! (`http-endpoint disabled`): nothing will change before the deadline, so
//! it ends the run at once as a configuration error ([`ImdsError::TurnedOff`]).
//!
//! The endpoint is chosen as the AWS SDKs choose it ([`select_endpoint`]):
//! an explicit endpoint wins over any endpoint mode; the mode (`IPv4`, the
//! default, or `IPv6`, case-insensitive) picks `http://169.254.169.254` or
//! `http://[fd00:ec2::254]`.

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
/// IMDS's IPv6 address, on Nitro instances whose metadata options enable
/// it (`httpProtocolIPv6: enabled`).
pub const IPV6_ENDPOINT: &str = "http://[fd00:ec2::254]";
/// The AWS SDKs' variable for another endpoint (tests on loopback).
pub const ENDPOINT_ENV: &str = "AWS_EC2_METADATA_SERVICE_ENDPOINT";
/// The AWS SDKs' variable for the endpoint mode.
pub const ENDPOINT_MODE_ENV: &str = "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE";
/// The config key for the endpoint mode.
pub const MODE_KEY: &str = "[options] imds-endpoint-mode";
/// The flags, named in logs.
pub const ENDPOINT_FLAG: &str = "--imds-endpoint";
pub const MODE_FLAG: &str = "--imds-endpoint-mode";
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
    #[error("{origin}: {value:?} is not an IMDS endpoint mode (IPv4 or IPv6)")]
    BadMode { origin: String, value: String },
    #[error("IMDS at {endpoint} did not answer {path} by the deadline: {reason}{hint}")]
    GaveUp {
        endpoint: String,
        path: String,
        reason: RetryError<String>,
        /// What to check, when the endpoint suggests something.
        hint: &'static str,
    },
    #[error(
        "IMDS at {endpoint} answered {path} with 403 Forbidden: IMDS is turned off for this \
         instance (metadata options http-endpoint disabled); enable it in the EC2NodeClass \
         (spec.metadataOptions.httpEndpoint: enabled)"
    )]
    TurnedOff { endpoint: String, path: String },
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

const DOCUMENT_PATH: &str = "/latest/dynamic/instance-identity/document";

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
            RetryError::Fatal(Stop::TurnedOff) => ImdsError::TurnedOff {
                endpoint: self.endpoint.to_string(),
                path: path.into(),
            },
            RetryError::Fatal(Stop::Other(reason)) => ImdsError::Refused {
                path: path.into(),
                reason,
            },
            RetryError::GaveUp { attempts, last } => ImdsError::GaveUp {
                endpoint: self.endpoint.to_string(),
                path: path.into(),
                reason: RetryError::GaveUp {
                    attempts,
                    last: last.to_string(),
                },
                hint: self.hint(),
            },
        })
    }

    /// The usual reason an endpoint never answers, when there is one.
    fn hint(&self) -> &'static str {
        let host = self.endpoint.host().unwrap_or_default();
        let ip = host.trim_start_matches('[').trim_end_matches(']').parse();
        if ip == Ok(std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)) {
            " (the IPv6 endpoint answers only on Nitro instances whose EC2NodeClass sets \
             metadataOptions.httpProtocolIPv6: enabled)"
        } else {
            ""
        }
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

    async fn attempt(&self, path: &str) -> Attempt<Option<Bytes>, Stop> {
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
            Err(e) => return Attempt::Fatal(Stop::Other(e.to_string())),
        };
        match response {
            Ok(r) if r.status == StatusCode::OK => Attempt::Done(Some(r.body)),
            Ok(r) if r.status == StatusCode::NOT_FOUND => Attempt::Done(None),
            Ok(r) if r.status == StatusCode::UNAUTHORIZED => {
                // The token expired (or IMDS restarted): get a new one.
                self.forget_token();
                Attempt::Retry {
                    error: Stop::Other("401: token rejected; fetching a new one".into()),
                    after: None,
                }
            }
            Ok(r) => classify(r.status),
            Err(e) => Attempt::Retry {
                error: Stop::Other(e.to_string()),
                after: None,
            },
        }
    }

    /// The current token, fetching one if there is none or it is about to
    /// expire. `Err` carries what the attempt came to.
    async fn token(&self) -> Result<String, Attempt<Option<Bytes>, Stop>> {
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
        let request = request.map_err(|e| Attempt::Fatal(Stop::Other(e.to_string())))?;
        let response = self.exchange(request).await.map_err(|e| Attempt::Retry {
            error: Stop::Other(format!("token: {e}")),
            after: None,
        })?;
        if response.status != StatusCode::OK {
            return Err(match classify(response.status) {
                Attempt::Fatal(Stop::Other(e)) => {
                    Attempt::Fatal(Stop::Other(format!("token: {e} (is IMDSv2 enabled?)")))
                }
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
        // The first request fetches the session token; the rest share it
        // and go out together (each is a round trip to the hypervisor).
        let instance_id = self.instance_id().await?;
        let (document, rsa2048, availability_zone, local_hostname, ips) = tokio::try_join!(
            self.document_facts(),
            self.identity_signature(),
            self.availability_zone(),
            self.local_hostname(),
            self.ips(),
        )?;
        if instance_id != document.instance_id || availability_zone != document.availability_zone {
            return Err(ImdsError::Invalid {
                path: DOCUMENT_PATH.into(),
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

    /// The raw userData; `None` when the instance has none.
    pub async fn user_data(&self) -> Result<Option<Bytes>, ImdsError> {
        self.get("/latest/user-data").await
    }

    pub async fn instance_id(&self) -> Result<String, ImdsError> {
        self.require_text("/latest/meta-data/instance-id").await
    }

    pub async fn availability_zone(&self) -> Result<String, ImdsError> {
        self.require_text("/latest/meta-data/placement/availability-zone")
            .await
    }

    /// The private DNS name: the node name kubelet registers.
    pub async fn local_hostname(&self) -> Result<String, ImdsError> {
        self.require_text("/latest/meta-data/local-hostname").await
    }

    /// The identity document's fields the agent reads (unverified).
    pub async fn document_facts(&self) -> Result<DocumentFacts, ImdsError> {
        let raw = self.require_text(DOCUMENT_PATH).await?;
        serde_json::from_str(&raw).map_err(|e| ImdsError::Invalid {
            path: DOCUMENT_PATH.into(),
            reason: e.to_string(),
        })
    }

    /// The base64 PKCS#7 signature over the identity document.
    pub async fn identity_signature(&self) -> Result<String, ImdsError> {
        self.require_text("/latest/dynamic/instance-identity/rsa2048")
            .await
    }

    /// The addresses the serving certificate names: the primary private
    /// IPv4 (none on an IPv6-only instance). Not the interfaces' other
    /// addresses: under the VPC CNI they are pods' (its ipamd attaches them
    /// after kubelet starts, so a rebooted agent resuming its join would see
    /// them), and the server allows only the instance's primary IPv4 and
    /// IPv6. kubelet, started with `--node-ip`, names this one address too.
    pub async fn ips(&self) -> Result<Vec<IpAddr>, ImdsError> {
        let Some(primary) = self.get_text("/latest/meta-data/local-ipv4").await? else {
            return Ok(Vec::new());
        };
        let ip = primary.trim().parse().map_err(|_| ImdsError::Invalid {
            path: "/latest/meta-data/local-ipv4".into(),
            reason: format!("{primary:?} is not an IP address"),
        })?;
        Ok(vec![ip])
    }
}

/// Why an attempt failed: IMDS turned off is told apart, because it is
/// the operator's to fix and deserves its own message and exit code.
#[derive(Debug)]
enum Stop {
    TurnedOff,
    Other(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::TurnedOff => write!(f, "403: IMDS is turned off"),
            Stop::Other(reason) => write!(f, "{reason}"),
        }
    }
}

/// 429 and 5xx are transient; 403 is IMDS turned off (the agent never
/// sends what else IMDS refuses with 403: a proxied token request); any
/// other status is final.
fn classify<T>(status: StatusCode) -> Attempt<T, Stop> {
    let error = format!("HTTP {status}");
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        Attempt::Retry {
            error: Stop::Other(error),
            after: None,
        }
    } else if status == StatusCode::FORBIDDEN {
        Attempt::Fatal(Stop::TurnedOff)
    } else {
        Attempt::Fatal(Stop::Other(error))
    }
}

/// An endpoint mode, as the AWS SDKs name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointMode {
    Ipv4,
    Ipv6,
}

impl EndpointMode {
    /// `IPv4` or `IPv6`, in any case (as the SDKs accept them); `origin`
    /// names the setting in the error.
    pub fn parse(value: &str, origin: &str) -> Result<Self, ImdsError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "ipv4" => Ok(EndpointMode::Ipv4),
            "ipv6" => Ok(EndpointMode::Ipv6),
            _ => Err(ImdsError::BadMode {
                origin: origin.into(),
                value: value.into(),
            }),
        }
    }

    pub fn endpoint(self) -> &'static str {
        match self {
            EndpointMode::Ipv4 => DEFAULT_ENDPOINT,
            EndpointMode::Ipv6 => IPV6_ENDPOINT,
        }
    }
}

/// The IMDS endpoint chosen, and the setting that chose it (for the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    pub endpoint: String,
    pub reason: String,
}

/// Chooses the endpoint, first match wins:
/// 1. `--imds-endpoint`, then `$AWS_EC2_METADATA_SERVICE_ENDPOINT`: an
///    explicit endpoint wins over any mode, as in the SDKs;
/// 2. the mode from `--imds-endpoint-mode`, then `[options]
///    imds-endpoint-mode`, then `$AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE`:
///    the config wins over the environment, unlike the SDKs' shared config
///    file, because it is the agent's own file, baked into the AMI for it,
///    while the environment may be meant for other programs; as for the
///    agent's proxy settings;
/// 3. IPv4.
///
/// Empty environment variables count as unset. `env` looks a variable up.
pub fn select_endpoint(
    flag_endpoint: Option<&str>,
    flag_mode: Option<&str>,
    config_mode: Option<EndpointMode>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Selected, ImdsError> {
    let env = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    let chosen = |endpoint: &str, reason: &str| Selected {
        endpoint: endpoint.trim().to_string(),
        reason: reason.to_string(),
    };
    if let Some(endpoint) = flag_endpoint {
        return Ok(chosen(endpoint, ENDPOINT_FLAG));
    }
    if let Some(endpoint) = env(ENDPOINT_ENV) {
        return Ok(chosen(&endpoint, ENDPOINT_ENV));
    }
    let (mode, reason) = match (flag_mode, config_mode, env(ENDPOINT_MODE_ENV)) {
        (Some(flag), _, _) => (EndpointMode::parse(flag, MODE_FLAG)?, MODE_FLAG),
        (None, Some(mode), _) => (mode, MODE_KEY),
        (None, None, Some(var)) => (
            EndpointMode::parse(&var, ENDPOINT_MODE_ENV)?,
            ENDPOINT_MODE_ENV,
        ),
        (None, None, None) => (EndpointMode::Ipv4, "the default"),
    };
    Ok(chosen(mode.endpoint(), reason))
}

/// What chooses the IMDS endpoint ([`select_endpoint`]'s inputs): the
/// flags and the local config's mode; the environment is read when a
/// client is made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointChoice {
    /// `--imds-endpoint`.
    pub flag_endpoint: Option<String>,
    /// `--imds-endpoint-mode`.
    pub flag_mode: Option<String>,
    /// `[options] imds-endpoint-mode` from the local file.
    pub config_mode: Option<EndpointMode>,
}

/// Why no IMDS client could be made: the operator's to fix.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(transparent)]
    Select(ImdsError),
    #[error("the IMDS endpoint from {reason}")]
    Client {
        reason: String,
        #[source]
        source: ImdsError,
    },
}

impl EndpointChoice {
    /// The IMDS client at the endpoint [`select_endpoint`] picks; the
    /// choice is logged once per process.
    pub fn client(&self, deadline: Deadline) -> Result<Imds, EndpointError> {
        let selected = select_endpoint(
            self.flag_endpoint.as_deref(),
            self.flag_mode.as_deref(),
            self.config_mode,
            |name| std::env::var(name).ok(),
        )
        .map_err(EndpointError::Select)?;
        static LOGGED: std::sync::Once = std::sync::Once::new();
        LOGGED.call_once(|| {
            let (endpoint, reason) = (&selected.endpoint, &selected.reason);
            log::info!("IMDS endpoint {endpoint} (from {reason}); never through a proxy");
        });
        Imds::new(&selected.endpoint, deadline).map_err(|source| EndpointError::Client {
            reason: selected.reason,
            source,
        })
    }
}

/// The fields of the identity document the agent uses, as IMDS serves them
/// (unverified: the server verifies the signed copy into
/// `autonode_shared::identity::IdentityDocument`; these are for naming and
/// cross-checks).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DocumentFacts {
    pub instance_id: String,
    pub availability_zone: String,
    pub region: String,
    pub account_id: String,
}

/// What IMDS says about this instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub document: DocumentFacts,
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
        autonode_shared::contract::aws_provider_id(
            &self.document.availability_zone,
            &self.document.instance_id,
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

    fn env(vars: &[(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        let vars = vars.to_vec();
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn endpoint_selection_follows_the_sdks() {
        let select = |flag, flag_mode, config, vars: &[_]| {
            select_endpoint(flag, flag_mode, config, env(vars)).unwrap()
        };
        let v6 = Some(EndpointMode::Ipv6);
        let both = [
            (ENDPOINT_ENV, "http://127.0.0.1:9"),
            (ENDPOINT_MODE_ENV, "ipv6"),
        ];
        // Nothing set: IPv4.
        assert_eq!(select(None, None, None, &[]).endpoint, DEFAULT_ENDPOINT);
        // An explicit endpoint beats every mode, the flag before the variable.
        let chosen = select(Some("http://10.9.9.9"), Some("IPv6"), v6, &both);
        assert_eq!(
            (chosen.endpoint.as_str(), chosen.reason.as_str()),
            ("http://10.9.9.9", ENDPOINT_FLAG)
        );
        let chosen = select(None, Some("IPv6"), v6, &both);
        assert_eq!(
            (chosen.endpoint.as_str(), chosen.reason.as_str()),
            ("http://127.0.0.1:9", ENDPOINT_ENV)
        );
        // Modes: flag, then config, then environment (the config first,
        // unlike the SDKs: see select_endpoint); any case.
        let modes = [(ENDPOINT_MODE_ENV, "IPV6")];
        assert_eq!(
            select(None, Some("ipv4"), v6, &modes).endpoint,
            DEFAULT_ENDPOINT
        );
        let chosen = select(None, None, Some(EndpointMode::Ipv4), &modes);
        assert_eq!(
            (chosen.endpoint.as_str(), chosen.reason.as_str()),
            (DEFAULT_ENDPOINT, MODE_KEY)
        );
        let chosen = select(None, None, None, &modes);
        assert_eq!(
            (chosen.endpoint.as_str(), chosen.reason.as_str()),
            (IPV6_ENDPOINT, ENDPOINT_MODE_ENV)
        );
        // Empty variables are unset.
        let empty = [(ENDPOINT_ENV, ""), (ENDPOINT_MODE_ENV, " ")];
        assert_eq!(select(None, None, None, &empty).endpoint, DEFAULT_ENDPOINT);
    }

    #[test]
    fn bad_modes_name_their_setting() {
        let err = select_endpoint(None, Some("v6"), None, env(&[])).unwrap_err();
        assert!(err.to_string().contains(MODE_FLAG), "{err}");
        let err =
            select_endpoint(None, None, None, env(&[(ENDPOINT_MODE_ENV, "IPv5")])).unwrap_err();
        assert!(err.to_string().contains(ENDPOINT_MODE_ENV), "{err}");
        let err = EndpointMode::parse("dual", MODE_KEY).unwrap_err();
        assert!(err.to_string().contains("imds-endpoint-mode"), "{err}");
        // The IPv6 endpoint is a valid client endpoint.
        let deadline = Deadline::after(Duration::from_secs(1));
        let imds = Imds::new(IPV6_ENDPOINT, deadline).unwrap();
        assert!(imds.hint().contains("httpProtocolIPv6"));
        assert_eq!(Imds::new(DEFAULT_ENDPOINT, deadline).unwrap().hint(), "");
    }

    /// An IMDS that answers every request with 403, as one turned off does.
    async fn forbidding_imds() -> (String, tokio::task::JoinHandle<u32>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let mut answered = 0;
            while let Ok(Ok((mut stream, _))) =
                tokio::time::timeout(Duration::from_millis(500), listener.accept()).await
            {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let answer =
                    "HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                let _ = stream.write_all(answer.as_bytes()).await;
                answered += 1;
            }
            answered
        });
        (endpoint, task)
    }

    #[tokio::test]
    async fn turned_off_imds_ends_at_once() {
        let (endpoint, server) = forbidding_imds().await;
        let imds = Imds::new(&endpoint, Deadline::after(Duration::from_secs(30))).unwrap();
        let started = std::time::Instant::now();
        let err = imds.get("/latest/user-data").await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(matches!(err, ImdsError::TurnedOff { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("turned off") && text.contains("httpEndpoint: enabled"),
            "{text}"
        );
        assert_eq!(server.await.unwrap(), 1, "asked once, not retried");
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
