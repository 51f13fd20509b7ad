//! Talking to autonode-server over HTTPS with its CA pinned: the one
//! client the join ([`ServerClient::join`]) and the progress reports
//! ([`crate::report`]) share.
//!
//! The status code carries the retry policy (see the protocol): 2xx is an
//! answer, 429 and 5xx are transient (honouring `Retry-After`), any other
//! status is a refusal and final. Connection and TLS failures are transient
//! too: the server may be scaling up, and a wrong pin shows up as the last
//! error when the deadline ends the retries.

use crate::config::Config;
use crate::http::{self, HttpError};
use crate::nitrotpm::NitroTpm;
use crate::proxy::{Proxy, Route};
use crate::retry::{retry_observed, Attempt, Deadline, RetryError, RetryPolicy, Retrying};
use crate::trust::{self, TrustError};
use autonode_shared::clock::Clock;
use autonode_shared::protocol::{
    ChallengeRequest, ChallengeResponse, ErrorResponse, JoinRequest, JoinRequestV2, JoinResponse,
    CHALLENGE_PATH, JOIN_PATH, JOIN_V2_PATH, PATIENCE_HEADER, REQUEST_ID_HEADER,
};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, StatusCode, Uri};
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::TlsConnector;

/// A join can wait on the kube-controller-manager signing two CSRs.
pub const JOIN_TRY_TIMEOUT: Duration = Duration::from_secs(60);
/// A JoinResponse carries certificates and an Ignition config.
const MAX_RESPONSE: usize = 4 * 1024 * 1024;

/// What a join attests with: the instance's NitroTPM, and the digest of
/// the request's two keys its document vouches for
/// ([`autonode_shared::protocol::attested_keys_digest`]).
pub struct Attester<'a> {
    pub tpm: &'a NitroTpm,
    pub keys_digest: [u8; 32],
}

/// Why the server gave no answer the agent can use.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("the server refused: HTTP {status}: {message} (request id {request_id})")]
    Refused {
        status: u16,
        message: String,
        request_id: String,
    },
    #[error("{0}")]
    Transient(String),
    #[error("no answer from the server by the deadline: {attempts} attempts; last error: {last}")]
    GaveUp { attempts: u32, last: String },
    #[error("the server's answer is unusable: {0}")]
    BadResponse(String),
    #[error(transparent)]
    Trust(#[from] TrustError),
}

/// An HTTPS client for the join server.
#[derive(Clone)]
pub struct ServerClient {
    base: Uri,
    tls: Arc<ClientConfig>,
    /// The HTTP proxy to tunnel through, unless none is set or NO_PROXY
    /// excepts the server (see [`crate::proxy`]).
    proxy: Option<Proxy>,
}

impl ServerClient {
    /// A client for `config`'s server, judging its certificates at
    /// `clock`'s time.
    pub fn new(config: &Config, clock: Clock) -> Result<Self, JoinError> {
        let host = config.server_url.host().unwrap_or_default();
        let proxy = match config.proxy.route(host) {
            Route::Proxy(proxy) => Some(proxy.clone()),
            Route::Direct | Route::Excepted(_) => None,
        };
        Ok(ServerClient {
            base: config.server_url.clone(),
            tls: trust::client_config(&config.server_trust, clock)?,
            proxy,
        })
    }

    /// Asks to join, retrying transient failures until `deadline`;
    /// `observe` hears of each failed attempt that will be retried. Each
    /// attempt asks for a fresh challenge and attests with `attester`
    /// (`/v2`). Where `/v2` is answered 404 (a server of before 0.3.0, or
    /// one of its replicas behind the same address during a rolling
    /// upgrade) that attempt joins through `/v1`, without evidence; the
    /// next asks for a challenge again, so a replica of this release is
    /// attested to whenever one answers.
    pub async fn join(
        &self,
        request: &JoinRequest,
        attester: &Attester<'_>,
        deadline: &Deadline,
        observe: impl FnMut(&Retrying<'_, JoinError>),
    ) -> Result<JoinResponse, JoinError> {
        let v1 = Bytes::from(
            serde_json::to_vec(request).map_err(|e| JoinError::BadResponse(e.to_string()))?,
        );
        let told = Cell::new(false);
        let attempt = |_| self.join_attempt(request, &v1, attester, &told, deadline);
        let answer = retry_observed(&RetryPolicy::JOIN, deadline, "join", attempt, observe)
            .await
            .map_err(settled)?;
        serde_json::from_slice(&answer).map_err(|e| JoinError::BadResponse(e.to_string()))
    }

    /// One join attempt: challenge, evidence, `/v2` join; or the `/v1`
    /// join where `/v2` is not served (`told`: whether that was logged).
    async fn join_attempt(
        &self,
        request: &JoinRequest,
        v1: &Bytes,
        attester: &Attester<'_>,
        told: &Cell<bool>,
        deadline: &Deadline,
    ) -> Attempt<Bytes, JoinError> {
        let asked = ChallengeRequest {
            agent_version: request.agent_version.clone(),
        };
        let body = Bytes::from(serde_json::to_vec(&asked).unwrap_or_default());
        let attested = match self
            .attempt(CHALLENGE_PATH, body, deadline, JOIN_TRY_TIMEOUT)
            .await
        {
            Attempt::Done(answer) => self.attested(request, &answer, attester, deadline).await,
            other => other,
        };
        match attested {
            Attempt::Fatal(JoinError::Refused { status: 404, .. }) => {
                if !told.replace(true) {
                    log::info!("the server has no /v2 (a server of before 0.3.0): joining through {JOIN_PATH}, without attestation");
                }
            }
            other => return other,
        }
        self.attempt(JOIN_PATH, v1.clone(), deadline, JOIN_TRY_TIMEOUT)
            .await
    }

    /// The `/v2` join for the challenge in `answer`.
    async fn attested(
        &self,
        request: &JoinRequest,
        answer: &[u8],
        attester: &Attester<'_>,
        deadline: &Deadline,
    ) -> Attempt<Bytes, JoinError> {
        let challenge: ChallengeResponse = match serde_json::from_slice(answer) {
            Ok(challenge) => challenge,
            Err(e) => return Attempt::Fatal(JoinError::BadResponse(format!("the challenge: {e}"))),
        };
        let attestation = attester
            .tpm
            .evidence(&challenge.nonce, &attester.keys_digest)
            .await;
        let request = JoinRequestV2 {
            identity: request.identity.clone(),
            client_csr: request.client_csr.clone(),
            serving_csr: request.serving_csr.clone(),
            agent_version: request.agent_version.clone(),
            attestation,
        };
        let body = match serde_json::to_vec(&request) {
            Ok(body) => Bytes::from(body),
            Err(e) => return Attempt::Fatal(JoinError::BadResponse(e.to_string())),
        };
        self.attempt(JOIN_V2_PATH, body, deadline, JOIN_TRY_TIMEOUT)
            .await
    }

    /// POSTs JSON to `path` with `policy`; the 2xx body. `observe` hears of
    /// each failed attempt that will be retried.
    pub async fn post(
        &self,
        path: &str,
        body: Bytes,
        policy: &RetryPolicy,
        deadline: &Deadline,
        per_try: Duration,
        observe: impl FnMut(&Retrying<'_, JoinError>),
    ) -> Result<Bytes, JoinError> {
        let what = format!("POST {path}");
        let attempt = |_| self.attempt(path, body.clone(), deadline, per_try);
        retry_observed(policy, deadline, &what, attempt, observe)
            .await
            .map_err(settled)
    }

    /// One request, within `per_try` and the deadline.
    async fn attempt(
        &self,
        path: &str,
        body: Bytes,
        deadline: &Deadline,
        per_try: Duration,
    ) -> Attempt<Bytes, JoinError> {
        let limit = deadline.clamp(per_try);
        let patience = deadline.remaining();
        let response = match tokio::time::timeout(limit, self.exchange(path, body, patience)).await
        {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                return Attempt::Retry {
                    error: JoinError::Transient(e.to_string()),
                    after: None,
                }
            }
            Err(_) => {
                let error =
                    JoinError::Transient(HttpError::Timeout(limit.as_secs_f64()).to_string());
                return Attempt::Retry { error, after: None };
            }
        };
        let status = response.status;
        if status.is_success() {
            return Attempt::Done(response.body);
        }
        let request_id = request_id(&response);
        let message = serde_json::from_slice::<ErrorResponse>(&response.body)
            .map(|e| e.error)
            .unwrap_or_else(|_| {
                String::from_utf8_lossy(&response.body)
                    .chars()
                    .take(200)
                    .collect()
            });
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            let error = JoinError::Transient(format!(
                "HTTP {status}: {message} (request id {request_id})"
            ));
            return Attempt::Retry {
                error,
                after: http::retry_after(&response.headers),
            };
        }
        Attempt::Fatal(JoinError::Refused {
            status: status.as_u16(),
            message,
            request_id,
        })
    }

    /// One request; it says how long this agent will keep trying
    /// (`patience`, [`PATIENCE_HEADER`]), so a busy server can tell it a
    /// turn that far off rather than have it come back every 30 s.
    async fn exchange(
        &self,
        path: &str,
        body: Bytes,
        patience: Duration,
    ) -> Result<http::Response, HttpError> {
        let (host, port) = http::host_port(&self.base)?;
        let full_path = format!("{}{}", self.base.path().trim_end_matches('/'), path);
        let request = http::request(Method::POST, &self.base, &full_path)?
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(
                hyper::header::USER_AGENT,
                concat!("autonode-agent/", env!("CARGO_PKG_VERSION")),
            )
            .header(PATIENCE_HEADER, patience.as_secs())
            .body(Full::new(body))
            .map_err(|e| HttpError::BadUrl(e.to_string()))?;
        let tcp = match &self.proxy {
            Some(proxy) => proxy.connect(&host, port).await?,
            None => http::connect(&host, port).await?,
        };
        let server_name =
            ServerName::try_from(host.clone()).map_err(|e| HttpError::BadUrl(e.to_string()))?;
        let tls = TlsConnector::from(self.tls.clone())
            .connect(server_name, tcp)
            .await
            .map_err(|e| HttpError::Tls {
                host,
                reason: e.to_string(),
            })?;
        http::send(tls, request, MAX_RESPONSE).await
    }
}

/// The error retries ended with.
fn settled(e: RetryError<JoinError>) -> JoinError {
    match e {
        RetryError::Fatal(e) => e,
        RetryError::GaveUp { attempts, last } => JoinError::GaveUp {
            attempts,
            last: last.to_string(),
        },
    }
}

fn request_id(response: &http::Response) -> String {
    response
        .headers
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| {
            serde_json::from_slice::<ErrorResponse>(&response.body)
                .ok()
                .map(|e| e.request_id)
        })
        .unwrap_or_else(|| "none".into())
}
