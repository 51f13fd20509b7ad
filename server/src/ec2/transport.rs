//! The wire: EC2's regional endpoints, SigV4-signed Query API requests,
//! and an HTTPS client (hyper + rustls with ring, the system's roots).

use std::sync::Arc;
use std::time::Duration;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use bytes::Bytes;
use http::{header, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full, LengthLimitError, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::credentials::error_chain;
use super::{LookupError, SetupError, API_VERSION};
use crate::primitives::clock::Clock;

/// The signing name of EC2.
const SERVICE: &str = "ec2";
const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";
/// An instance's answer is a few KiB (tens with many interfaces and
/// addresses), and a request names at most `batch::MAX_IDS` (50):
/// anything near this is not an answer to it.
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;
/// Idle pooled connections are closed before EC2's load balancers would.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(20);
/// Idle connections kept for reuse. hyper keeps every one by default: after
/// a renewal wave the leader held a connection (and its buffers) for each
/// lookup that had run at once, until the idle timeout.
const POOL_MAX_IDLE: usize = 8;

/// Where requests for a region go: the override, or EC2's regional endpoint.
#[derive(Clone, Debug)]
pub(super) struct Endpoint {
    override_uri: Option<Uri>,
}

impl Endpoint {
    /// `url` overrides every region's endpoint (tests, VPC endpoints); it
    /// must be an absolute http(s) URL; requests go to its path, `/` if none.
    pub(super) fn new(url: Option<&str>) -> Result<Self, SetupError> {
        let override_uri = url.map(parse_override).transpose()?;
        Ok(Self { override_uri })
    }

    pub(super) fn is_plain_http(&self) -> bool {
        self.override_uri
            .as_ref()
            .is_some_and(|u| u.scheme() == Some(&http::uri::Scheme::HTTP))
    }

    /// The URI to `POST` to for `region`.
    pub(super) fn uri(&self, region: &str) -> Result<Uri, LookupError> {
        if !is_region(region) {
            return Err(LookupError::Rejected {
                code: "InvalidRegion".into(),
                message: format!("{region:?} is not a region name"),
            });
        }
        if let Some(uri) = &self.override_uri {
            return Ok(uri.clone());
        }
        let url = format!("https://ec2.{region}.{}/", dns_suffix(region));
        url.parse().map_err(|e| LookupError::Rejected {
            code: "InvalidRegion".into(),
            message: format!("{url}: {e}"),
        })
    }
}

fn parse_override(url: &str) -> Result<Uri, SetupError> {
    let uri: Uri = url
        .parse()
        .map_err(|e| SetupError::Endpoint(format!("{url}: {e}")))?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    if !scheme_ok || uri.authority().is_none() || uri.query().is_some() {
        return Err(SetupError::Endpoint(format!(
            "{url}: not an http(s) URL without query"
        )));
    }
    Ok(uri)
}

/// Region names are lower-case words and digits joined by dashes; the
/// name becomes part of a host name, so nothing else gets through.
fn is_region(region: &str) -> bool {
    (1..=32).contains(&region.len())
        && !region.starts_with('-')
        && !region.ends_with('-')
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The partition's DNS suffix: China and the European Sovereign Cloud
/// have their own; everything else (GovCloud included) is amazonaws.com.
fn dns_suffix(region: &str) -> &'static str {
    if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else if region.starts_with("eusc-") {
        "amazonaws.eu"
    } else {
        "amazonaws.com"
    }
}

/// `Action=DescribeInstances&Version=2016-11-15&InstanceId.1=<id>&...`:
/// the instances by ID, as EC2 answers for each by itself (an ID it does
/// not know fails the whole request; see `batch`).
pub(super) fn describe_body(instance_ids: &[&str]) -> String {
    let mut form = form_urlencoded::Serializer::new(String::new());
    form.append_pair("Action", "DescribeInstances")
        .append_pair("Version", API_VERSION);
    for (n, id) in instance_ids.iter().enumerate() {
        form.append_pair(&format!("InstanceId.{}", n + 1), id);
    }
    form.finish()
}

/// A `POST` of `body` to `uri`, signed with SigV4 for EC2 in `region`.
pub(super) fn signed_request(
    uri: &Uri,
    region: &str,
    body: &str,
    credentials: &Credentials,
) -> Result<Request<Full<Bytes>>, LookupError> {
    let host = uri
        .authority()
        .map(|a| a.as_str())
        .unwrap_or_default()
        .to_string();
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(uri.clone())
        // Signed, so it must be on the request exactly as signed.
        .header(header::HOST, &host)
        .header(header::CONTENT_TYPE, CONTENT_TYPE)
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| LookupError::Rejected {
            code: "InvalidRequest".into(),
            message: e.to_string(),
        })?;
    let signing_failed = |e: &dyn std::error::Error| {
        LookupError::Credentials(format!("signing failed: {}", error_chain(e)))
    };
    let identity = credentials.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(SERVICE)
        .time(Clock::SYSTEM.now().into())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| signing_failed(&e))?
        .into();
    let uri_text = uri.to_string();
    let headers = [("host", host.as_str()), ("content-type", CONTENT_TYPE)];
    let signable = SignableRequest::new(
        "POST",
        &uri_text,
        headers.into_iter(),
        SignableBody::Bytes(body.as_bytes()),
    )
    .map_err(|e| signing_failed(&e))?;
    let (instructions, _signature) = sign(signable, &params)
        .map_err(|e| signing_failed(&e))?
        .into_parts();
    instructions.apply_to_request_http1x(&mut request);
    Ok(request)
}

/// A pooled HTTP/1.1 client: https with the system's root certificates,
/// plain http only for an explicit `http://` endpoint override.
#[derive(Clone, Debug)]
pub(super) struct HttpClient(Client<HttpsConnector<HttpConnector>, Full<Bytes>>);

impl HttpClient {
    /// `connect_timeout` bounds TCP connects; `allow_no_roots` lets a
    /// plain-http setup start on a machine without a CA bundle.
    pub(super) fn new(connect_timeout: Duration, allow_no_roots: bool) -> Result<Self, SetupError> {
        let roots = system_roots(allow_no_roots)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        // Explicit provider: the tree has both ring and aws-lc-rs users, so
        // rustls could not pick a process default by itself.
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| SetupError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_connect_timeout(Some(connect_timeout));
        tcp.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_MAX_IDLE)
            .build(https);
        Ok(Self(client))
    }

    /// Sends `request`; the status and the (bounded) body.
    pub(super) async fn send(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, Bytes), LookupError> {
        let response = self
            .0
            .request(request)
            .await
            .map_err(|e| LookupError::Unavailable(error_chain(&e)))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| match e.downcast_ref::<LengthLimitError>() {
                Some(_) => {
                    LookupError::Malformed(format!("response over {MAX_RESPONSE_BYTES} bytes"))
                }
                None => {
                    LookupError::Unavailable(format!("reading the response: {}", error_chain(&*e)))
                }
            })?
            .to_bytes();
        Ok((status, body))
    }
}

/// The system's CA bundle (the same one aws-config's STS and container
/// credential providers trust).
fn system_roots(allow_empty: bool) -> Result<rustls::RootCertStore, SetupError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 && !allow_empty {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(SetupError::Tls(format!(
            "no root certificates found: {}",
            errors.join("; ")
        )));
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regional_endpoints() {
        let endpoint = Endpoint::new(None).expect("no override");
        let uri = |r: &str| endpoint.uri(r).map(|u| u.to_string());
        assert_eq!(
            uri("us-west-2").expect("valid"),
            "https://ec2.us-west-2.amazonaws.com/"
        );
        assert_eq!(
            uri("cn-north-1").expect("valid"),
            "https://ec2.cn-north-1.amazonaws.com.cn/"
        );
        assert_eq!(
            uri("us-gov-west-1").expect("valid"),
            "https://ec2.us-gov-west-1.amazonaws.com/"
        );
        for bad in [
            "",
            "US-WEST-2",
            "us-west-2.evil.com",
            "us-west-2/",
            "-x",
            "a b",
        ] {
            assert!(
                matches!(endpoint.uri(bad), Err(LookupError::Rejected { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn overrides() {
        let endpoint = Endpoint::new(Some("http://127.0.0.1:8080")).expect("valid");
        assert!(endpoint.is_plain_http());
        assert_eq!(
            endpoint.uri("eu-west-1").expect("valid").to_string(),
            "http://127.0.0.1:8080/"
        );
        for bad in ["127.0.0.1:8080", "ftp://x/", "/path", "http://x/?a=b"] {
            assert!(Endpoint::new(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn body_is_pinned_to_the_api_version() {
        assert_eq!(
            describe_body(&["i-1234abcd"]),
            "Action=DescribeInstances&Version=2016-11-15&InstanceId.1=i-1234abcd"
        );
        assert_eq!(
            describe_body(&["i-1234abcd", "i-5678abcd"]),
            "Action=DescribeInstances&Version=2016-11-15&InstanceId.1=i-1234abcd&InstanceId.2=i-5678abcd"
        );
    }

    #[test]
    fn requests_carry_a_sigv4_authorization() {
        let credentials = Credentials::new(
            "AKIDEXAMPLE",
            "secret",
            Some("session".into()),
            None,
            "test",
        );
        let uri: Uri = "https://ec2.us-west-2.amazonaws.com/".parse().expect("uri");
        let request = signed_request(&uri, "us-west-2", "Action=DescribeInstances", &credentials)
            .expect("signed");
        let get = |name: &str| request.headers()[name].to_str().expect("ascii").to_string();
        let authorization = get("authorization");
        assert!(
            authorization.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"),
            "{authorization}"
        );
        assert!(
            authorization.contains("/us-west-2/ec2/aws4_request"),
            "{authorization}"
        );
        assert!(
            authorization
                .contains("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token"),
            "{authorization}"
        );
        assert_eq!(get("host"), "ec2.us-west-2.amazonaws.com");
        assert_eq!(get("x-amz-security-token"), "session");
    }
}
