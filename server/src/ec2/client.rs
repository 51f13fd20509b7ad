//! [`Ec2Client`]: `DescribeInstances` for one instance or a batch, with a
//! timeout per attempt and retries of what may pass (throttling, 5xx,
//! network).

use std::time::Duration;

use aws_credential_types::provider::ProvideCredentials;
use bytes::Bytes;
use http::StatusCode;

use super::credentials::CachedCredentials;
use super::transport::{describe_body, signed_request, Endpoint, HttpClient};
use super::xml::{self, ApiError};
use super::{
    is_instance_id, the_one, Ec2Instance, InstanceLookup, LookupError, LookupFuture, LookupRetries,
};

/// How to reach EC2.
#[derive(Clone, Debug)]
pub struct Ec2Settings {
    /// Replaces `https://ec2.<region>.amazonaws.com` (`.com.cn` in China)
    /// for every region: tests (`http://127.0.0.1:PORT`), VPC endpoints.
    pub endpoint: Option<String>,
    /// One attempt, connect to last byte.
    pub timeout: Duration,
    pub retry: LookupRetries,
}

impl Default for Ec2Settings {
    fn default() -> Self {
        Self {
            endpoint: None,
            timeout: Duration::from_secs(5),
            retry: LookupRetries::default(),
        }
    }
}

/// Why an [`Ec2Client`] could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("invalid EC2 endpoint: {0}")]
    Endpoint(String),
    #[error("TLS setup: {0}")]
    Tls(String),
}

/// Looks instances up with the EC2 Query API.
#[derive(Debug)]
pub struct Ec2Client {
    http: HttpClient,
    endpoint: Endpoint,
    credentials: CachedCredentials,
    settings: Ec2Settings,
}

impl Ec2Client {
    /// A client signing with aws-config's default credentials chain.
    pub async fn new(settings: Ec2Settings) -> Result<Self, SetupError> {
        let credentials = CachedCredentials::default_chain().await;
        Self::build(settings, credentials)
    }

    /// A client signing with `credentials` (e.g. a fixed
    /// [`Credentials`](super::Credentials) in tests).
    pub fn with_credentials(
        settings: Ec2Settings,
        credentials: impl ProvideCredentials + 'static,
    ) -> Result<Self, SetupError> {
        Self::build(settings, CachedCredentials::new(credentials))
    }

    fn build(settings: Ec2Settings, credentials: CachedCredentials) -> Result<Self, SetupError> {
        let endpoint = Endpoint::new(settings.endpoint.as_deref())?;
        let http = HttpClient::new(settings.timeout, endpoint.is_plain_http())?;
        Ok(Self {
            http,
            endpoint,
            credentials,
            settings,
        })
    }

    /// The instance `instance_id` in `region`, as EC2 describes it now.
    pub async fn describe(
        &self,
        region: &str,
        instance_id: &str,
    ) -> Result<Ec2Instance, LookupError> {
        // Asked by ID, EC2 answers with the instance or with an error; an
        // empty success is treated as "not there" all the same.
        the_one(
            self.describe_many(region, &[instance_id]).await?,
            instance_id,
        )
    }

    /// The instances `instance_ids` in `region`, in one `DescribeInstances`
    /// (retried as a whole), as EC2 describes them now, each under the ID
    /// EC2 gives it. Fails as a whole as EC2 does: an ID it does not know
    /// (or one not an instance ID, refused here before any request) makes
    /// the answer [`LookupError::NotFound`] naming every ID asked.
    pub async fn describe_many(
        &self,
        region: &str,
        instance_ids: &[&str],
    ) -> Result<Vec<Ec2Instance>, LookupError> {
        if let Some(bad) = instance_ids.iter().find(|id| !is_instance_id(id)) {
            return Err(LookupError::not_found(bad));
        }
        let policy = self.settings.retry;
        let mut attempt = 0;
        loop {
            let result = self.attempt(region, instance_ids).await;
            match &result {
                Err(e) if retryable(e) && attempt + 1 < policy.attempts => {
                    let delay = policy.delay(attempt);
                    tracing::debug!(?instance_ids, region, attempt, ?delay, error = %e, "EC2 lookup failed, retrying");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(LookupError::Denied(_)) => {
                    // Rotated or revoked: fetch them again next time.
                    self.credentials.invalidate().await;
                    return result;
                }
                _ => return result,
            }
        }
    }

    async fn attempt(
        &self,
        region: &str,
        instance_ids: &[&str],
    ) -> Result<Vec<Ec2Instance>, LookupError> {
        let uri = self.endpoint.uri(region)?;
        let credentials = self.credentials.get().await?;
        let request = signed_request(&uri, region, &describe_body(instance_ids), &credentials)?;
        let timeout = self.settings.timeout;
        let (status, body) = tokio::time::timeout(timeout, self.http.send(request))
            .await
            .map_err(|_| LookupError::Unavailable(format!("no answer within {timeout:?}")))??;
        interpret(status, &body, instance_ids)
    }
}

impl InstanceLookup for Ec2Client {
    fn describe_instance<'a>(&'a self, region: &'a str, instance_id: &'a str) -> LookupFuture<'a> {
        Box::pin(self.describe(region, instance_id))
    }
}

/// Credentials errors are not retried here: the providers retry
/// themselves, and a missing configuration does not heal in seconds.
fn retryable(error: &LookupError) -> bool {
    matches!(error, LookupError::Throttled | LookupError::Unavailable(_))
}

/// What an HTTP answer means for the lookup of `instance_ids`.
fn interpret(
    status: StatusCode,
    body: &Bytes,
    instance_ids: &[&str],
) -> Result<Vec<Ec2Instance>, LookupError> {
    if status.is_success() {
        return xml::parse_instances(body);
    }
    match xml::parse_error(body) {
        Some(error) => Err(classify(status, &error, &instance_ids.join(","))),
        None if status.is_server_error() => Err(LookupError::Unavailable(format!("HTTP {status}"))),
        None => Err(LookupError::Malformed(format!(
            "HTTP {status} without an EC2 error"
        ))),
    }
}

/// EC2's error codes, sorted by what the caller can do about them.
fn classify(status: StatusCode, error: &ApiError, instance_id: &str) -> LookupError {
    let detail = || {
        let request_id = error.request_id.as_deref().unwrap_or("none");
        format!(
            "{}: {} (HTTP {status}, request {request_id})",
            error.code, error.message
        )
    };
    match error.code.as_str() {
        // EC2 checks the form again; ours passed, but its rules are its own.
        "InvalidInstanceID.NotFound" | "InvalidInstanceID.Malformed" => {
            LookupError::not_found(instance_id)
        }
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" => LookupError::Throttled,
        "AuthFailure"
        | "UnauthorizedOperation"
        | "SignatureDoesNotMatch"
        | "InvalidClientTokenId"
        | "ExpiredToken"
        | "RequestExpired"
        | "MissingAuthenticationToken"
        | "IncompleteSignature"
        | "OptInRequired"
        | "Blocked"
        | "PendingVerification" => LookupError::Denied(detail()),
        _ if status.is_server_error() => LookupError::Unavailable(detail()),
        _ => LookupError::Rejected {
            code: error.code.clone(),
            message: detail(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "i-0123456789abcdef0";

    fn answer(status: u16, code: &str) -> LookupError {
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>m</Message></Error></Errors><RequestID>req-1</RequestID></Response>"
        );
        let status = StatusCode::from_u16(status).expect("status");
        interpret(status, &Bytes::from(body), &[ID]).expect_err("an error")
    }

    #[test]
    fn error_codes_map_to_what_callers_can_do() {
        assert!(
            matches!(answer(400, "InvalidInstanceID.NotFound"), LookupError::NotFound { instance_id } if instance_id == ID)
        );
        assert!(matches!(
            answer(400, "InvalidInstanceID.Malformed"),
            LookupError::NotFound { .. }
        ));
        assert!(matches!(
            answer(503, "RequestLimitExceeded"),
            LookupError::Throttled
        ));
        assert!(matches!(answer(400, "Throttling"), LookupError::Throttled));
        for denied in [
            "AuthFailure",
            "UnauthorizedOperation",
            "SignatureDoesNotMatch",
            "RequestExpired",
        ] {
            let error = answer(403, denied);
            assert!(
                matches!(&error, LookupError::Denied(d) if d.contains(denied) && d.contains("req-1")),
                "{error}"
            );
        }
        assert!(matches!(
            answer(500, "InternalError"),
            LookupError::Unavailable(_)
        ));
        assert!(matches!(
            answer(503, "Unavailable"),
            LookupError::Unavailable(_)
        ));
        assert!(
            matches!(answer(400, "InvalidParameterValue"), LookupError::Rejected { code, .. } if code == "InvalidParameterValue")
        );
    }

    #[test]
    fn answers_without_an_ec2_error() {
        let html = Bytes::from_static(b"<html>Bad Gateway</html>");
        assert!(matches!(
            interpret(StatusCode::BAD_GATEWAY, &html, &[ID]),
            Err(LookupError::Unavailable(_))
        ));
        assert!(matches!(
            interpret(StatusCode::NOT_FOUND, &html, &[ID]),
            Err(LookupError::Malformed(_))
        ));
        let empty = Bytes::from_static(
            b"<DescribeInstancesResponse><reservationSet/></DescribeInstancesResponse>",
        );
        assert!(matches!(
            interpret(StatusCode::OK, &empty, &[ID]).as_deref(),
            Ok([])
        ));
    }

    #[test]
    fn only_passing_trouble_is_retried() {
        assert!(retryable(&LookupError::Throttled));
        assert!(retryable(&LookupError::Unavailable("timeout".into())));
        assert!(!retryable(&LookupError::not_found(ID)));
        assert!(!retryable(&LookupError::Denied("AuthFailure".into())));
        assert!(!retryable(&LookupError::Credentials("none".into())));
    }
}
