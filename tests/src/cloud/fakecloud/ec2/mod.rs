//! A fake regional EC2 endpoint: the Query API's `DescribeInstances`.
//!
//! - `POST /`, form-encoded `Action=DescribeInstances&Version=...` with
//!   `InstanceId.N` and/or `Filter.N.Name`/`Filter.N.Value.M`
//!   (`instance-id`, `instance-state-name`).
//! - SigV4 verified for real against [`TEST_ACCESS_KEY_ID`] /
//!   [`TEST_SECRET_ACCESS_KEY`], scoped to this endpoint's region and `ec2`.
//! - Answers AWS's `DescribeInstancesResponse` XML; errors in AWS's
//!   `<Response><Errors><Error>` shape with AWS's codes and HTTP statuses:
//!   unknown IDs `InvalidInstanceID.NotFound` and malformed ones
//!   `InvalidInstanceID.Malformed` (400).
//! - Only instances of this endpoint's region exist here; terminated ones
//!   are still described (as AWS does for a while), without addresses.

mod query;
mod sigv4;
mod xml;

#[cfg(test)]
mod tests;

use query::{check_action, Query};
use sigv4::{check_clock, check_scope, parse_authorization, signature};
use xml::{describe_instances_xml, error_response, XML_CONTENT_TYPE};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};

use crate::cloud::fakecloud::http::{respond, BoundSocket, Faults, Server, Service};
use crate::cloud::fakecloud::{FakeCloud, Instance, Instances};

/// The only access key the fake EC2 knows.
pub const TEST_ACCESS_KEY_ID: &str = "AKIAAUTONODEFAKE0001";
/// Its secret; give both to the server under test as static credentials.
pub const TEST_SECRET_ACCESS_KEY: &str = "autonodeFakeCloudTestSecretKey0000000001";

const XMLNS: &str = "http://ec2.amazonaws.com/doc/2016-11-15/";
/// How far a request's X-Amz-Date may be from now, as AWS allows.
const MAX_CLOCK_SKEW: time::Duration = time::Duration::minutes(15);

/// A running fake EC2 endpoint for one region; stops on drop.
#[derive(Debug)]
pub struct Ec2 {
    server: Server,
    faults: Faults,
    region: String,
    calls: Arc<AtomicU64>,
}

impl Ec2 {
    /// Serves `cloud`'s instances in `region` on 127.0.0.1, at once.
    pub fn start(cloud: &FakeCloud, region: &str) -> std::io::Result<Self> {
        Self::start_on(BoundSocket::loopback()?, cloud, region, None)
    }

    /// Serves on `socket`; with `listen_after`, refuses connections until then.
    pub fn start_on(
        socket: BoundSocket,
        cloud: &FakeCloud,
        region: &str,
        listen_after: Option<Duration>,
    ) -> std::io::Result<Self> {
        let faults = Faults::default();
        let calls = Arc::new(AtomicU64::new(0));
        let service = Arc::new(Ec2Service {
            region: region.to_string(),
            instances: cloud.shared_instances(),
            calls: calls.clone(),
        });
        let server = Server::start(socket, listen_after, faults.clone(), service)?;
        Ok(Self {
            server,
            faults,
            region: region.to_string(),
            calls,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://<addr>/`, the endpoint URL to give the EC2 client.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr())
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Requests answered so far (each one a `DescribeInstances` or an
    /// attempt at one; injected faults not included): what a client spent
    /// of the account's EC2 API budget.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

/// An EC2 error: HTTP status, AWS error code and message.
#[derive(Debug)]
struct Ec2Error(StatusCode, &'static str, String);

impl Ec2Error {
    fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self(StatusCode::BAD_REQUEST, code, message.into())
    }
}

struct Ec2Service {
    region: String,
    instances: Instances,
    calls: Arc<AtomicU64>,
}

impl Service for Ec2Service {
    fn handle(&self, request: Request<Bytes>) -> Response<Full<Bytes>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let result = self
            .authenticate(&request)
            .and_then(|()| self.describe(&request));
        match result {
            Ok(xml) => respond(StatusCode::OK, &[XML_CONTENT_TYPE], xml),
            Err(Ec2Error(status, code, message)) => error_response(status, code, &message),
        }
    }

    fn fault(&self, status: StatusCode) -> Response<Full<Bytes>> {
        let (code, message) = if status == StatusCode::SERVICE_UNAVAILABLE {
            (
                "Unavailable",
                "The server is overloaded or the request cannot be handled.",
            )
        } else {
            ("InternalError", "An internal error has occurred.")
        };
        error_response(status, code, message)
    }
}

impl Ec2Service {
    fn authenticate(&self, request: &Request<Bytes>) -> Result<(), Ec2Error> {
        let Some(authorization) = header(request, "authorization") else {
            return Err(Ec2Error(
                StatusCode::UNAUTHORIZED,
                "MissingAuthenticationToken",
                "Request is missing Authentication Token".into(),
            ));
        };
        let auth = parse_authorization(authorization)?;
        check_scope(&auth, &self.region)?;
        let amz_date = header(request, "x-amz-date").ok_or_else(|| {
            Ec2Error::bad_request(
                "IncompleteSignature",
                "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.",
            )
        })?;
        check_clock(amz_date)?;
        let expected = signature(request, &auth.signed_headers, amz_date, &auth.scope());
        if expected != auth.signature {
            return Err(Ec2Error(
                StatusCode::FORBIDDEN,
                "SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you provided. \
                 Check your AWS Secret Access Key and signing method."
                    .into(),
            ));
        }
        Ok(())
    }

    fn describe(&self, request: &Request<Bytes>) -> Result<String, Ec2Error> {
        if request.method() != Method::POST {
            return Err(Ec2Error::bad_request(
                "InvalidRequest",
                "The fake EC2 endpoint accepts only POST requests.",
            ));
        }
        let params: BTreeMap<String, String> = form_urlencoded::parse(request.body())
            .into_owned()
            .collect();
        check_action(&params)?;
        let query = Query::from_params(&params)?;
        let instances = self
            .instances
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let in_region: Vec<&Instance> = instances
            .values()
            .filter(|i| i.region == self.region)
            .collect();
        let found = query.select(&in_region)?;
        Ok(describe_instances_xml(&found))
    }
}

fn header<'a>(request: &'a Request<Bytes>, name: &str) -> Option<&'a str> {
    request.headers().get(name).and_then(|v| v.to_str().ok())
}
