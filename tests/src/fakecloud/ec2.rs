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

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac as _};
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;

use super::http::{respond, BoundSocket, Faults, Server, Service};
use super::{iso_seconds, FakeCloud, Instance, InstanceState, Instances};

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

fn check_action(params: &BTreeMap<String, String>) -> Result<(), Ec2Error> {
    match params.get("Action").map(String::as_str) {
        Some("DescribeInstances") => {}
        Some(other) => {
            return Err(Ec2Error::bad_request(
                "InvalidAction",
                format!("The action {other} is not valid for this web service."),
            ))
        }
        None => {
            return Err(Ec2Error::bad_request(
                "MissingAction",
                "The request must contain the parameter Action",
            ))
        }
    }
    if params.get("Version").is_none_or(String::is_empty) {
        return Err(Ec2Error::bad_request(
            "MissingParameter",
            "The request must contain the parameter Version",
        ));
    }
    Ok(())
}

/// What a DescribeInstances request asks for.
#[derive(Debug, Default)]
struct Query {
    /// `InstanceId.N`: each must exist, or the whole call fails.
    instance_ids: Vec<String>,
    /// `Filter.N`: name and accepted values; no match is just no result.
    filters: Vec<(String, Vec<String>)>,
}

impl Query {
    fn from_params(params: &BTreeMap<String, String>) -> Result<Self, Ec2Error> {
        let mut query = Query::default();
        let mut filters: BTreeMap<u32, (Option<String>, Vec<String>)> = BTreeMap::new();
        for (key, value) in params {
            let parts: Vec<&str> = key.split('.').collect();
            match parts.as_slice() {
                ["InstanceId", _] => query.instance_ids.push(value.clone()),
                ["Filter", n, "Name"] => {
                    filters.entry(index(n)?).or_default().0 = Some(value.clone())
                }
                ["Filter", n, "Value", _] => {
                    filters.entry(index(n)?).or_default().1.push(value.clone())
                }
                _ => {}
            }
        }
        for (name, values) in filters.into_values() {
            let name = name.ok_or_else(|| {
                Ec2Error::bad_request("InvalidParameterValue", "The filter 'null' is invalid")
            })?;
            if !matches!(name.as_str(), "instance-id" | "instance-state-name") {
                return Err(Ec2Error::bad_request(
                    "InvalidParameterValue",
                    format!("The filter '{name}' is invalid"),
                ));
            }
            query.filters.push((name, values));
        }
        for id in &query.instance_ids {
            check_instance_id(id)?;
        }
        Ok(query)
    }

    fn select<'a>(&self, instances: &[&'a Instance]) -> Result<Vec<&'a Instance>, Ec2Error> {
        let missing: Vec<&str> = self
            .instance_ids
            .iter()
            .filter(|id| !instances.iter().any(|i| &i.instance_id == *id))
            .map(String::as_str)
            .collect();
        match missing.as_slice() {
            [] => {}
            [one] => {
                return Err(Ec2Error::bad_request(
                    "InvalidInstanceID.NotFound",
                    format!("The instance ID '{one}' does not exist"),
                ))
            }
            many => {
                return Err(Ec2Error::bad_request(
                    "InvalidInstanceID.NotFound",
                    format!("The instance IDs '{}' do not exist", many.join(", ")),
                ))
            }
        }
        Ok(instances
            .iter()
            .copied()
            .filter(|i| self.instance_ids.is_empty() || self.instance_ids.contains(&i.instance_id))
            .filter(|i| {
                self.filters
                    .iter()
                    .all(|(name, values)| filter_matches(i, name, values))
            })
            .collect())
    }
}

fn index(n: &str) -> Result<u32, Ec2Error> {
    n.parse()
        .map_err(|_| Ec2Error::bad_request("InvalidParameterValue", format!("Invalid index: {n}")))
}

fn filter_matches(instance: &Instance, name: &str, values: &[String]) -> bool {
    let actual = match name {
        "instance-id" => instance.instance_id.as_str(),
        _ => instance.state.name(),
    };
    values.iter().any(|v| v == actual)
}

/// EC2 instance IDs: `i-` and 8 or 17 lower-case hex digits.
fn check_instance_id(id: &str) -> Result<(), Ec2Error> {
    let well_formed = id.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17)
            && hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    });
    if well_formed {
        Ok(())
    } else {
        Err(Ec2Error::bad_request(
            "InvalidInstanceID.Malformed",
            format!("Invalid id: \"{id}\" (expecting \"i-...\")"),
        ))
    }
}

/// The parts of `Authorization: AWS4-HMAC-SHA256 Credential=..., ...`.
#[derive(Debug)]
struct Authorization {
    access_key: String,
    date: String,
    region: String,
    service: String,
    signed_headers: Vec<String>,
    signature: String,
}

impl Authorization {
    fn scope(&self) -> String {
        format!(
            "{}/{}/{}/aws4_request",
            self.date, self.region, self.service
        )
    }
}

fn parse_authorization(value: &str) -> Result<Authorization, Ec2Error> {
    let incomplete = |what: &str| {
        Ec2Error::bad_request(
            "IncompleteSignature",
            format!("Authorization header requires '{what}' parameter. Authorization={value}"),
        )
    };
    let rest = value
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or_else(|| incomplete("AWS4-HMAC-SHA256"))?;
    let fields: BTreeMap<&str, &str> = rest
        .split(',')
        .filter_map(|part| part.trim().split_once('='))
        .collect();
    let credential = fields
        .get("Credential")
        .ok_or_else(|| incomplete("Credential"))?;
    let signed_headers = fields
        .get("SignedHeaders")
        .ok_or_else(|| incomplete("SignedHeaders"))?;
    let signature = fields
        .get("Signature")
        .ok_or_else(|| incomplete("Signature"))?;
    let scope: Vec<&str> = credential.split('/').collect();
    let [access_key, date, region, service, "aws4_request"] = scope.as_slice() else {
        return Err(incomplete("Credential"));
    };
    Ok(Authorization {
        access_key: access_key.to_string(),
        date: date.to_string(),
        region: region.to_string(),
        service: service.to_string(),
        signed_headers: signed_headers.split(';').map(str::to_string).collect(),
        signature: signature.to_string(),
    })
}

fn check_scope(auth: &Authorization, region: &str) -> Result<(), Ec2Error> {
    if auth.access_key != TEST_ACCESS_KEY_ID {
        return Err(Ec2Error(
            StatusCode::UNAUTHORIZED,
            "AuthFailure",
            "AWS was not able to validate the provided access credentials".into(),
        ));
    }
    let mismatch = |what: &str, expected: &str| {
        Ec2Error(
            StatusCode::FORBIDDEN,
            "SignatureDoesNotMatch",
            format!("Credential should be scoped to a valid {what}, expected '{expected}'."),
        )
    };
    if auth.service != "ec2" {
        return Err(mismatch("service", "ec2"));
    }
    if auth.region != region {
        return Err(mismatch("region", region));
    }
    Ok(())
}

fn check_clock(amz_date: &str) -> Result<(), Ec2Error> {
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let parsed = time::PrimitiveDateTime::parse(amz_date, format)
        .map(|t| t.assume_utc())
        .map_err(|_| {
            Ec2Error::bad_request(
                "IncompleteSignature",
                format!("Invalid X-Amz-Date: {amz_date}"),
            )
        })?;
    if (parsed - OffsetDateTime::now_utc()).abs() > MAX_CLOCK_SKEW {
        return Err(Ec2Error::bad_request(
            "RequestExpired",
            format!("Request has expired. Timestamp date is {amz_date}"),
        ));
    }
    Ok(())
}

/// The SigV4 signature the request should carry, with the test secret.
fn signature(
    request: &Request<Bytes>,
    signed_headers: &[String],
    amz_date: &str,
    scope: &str,
) -> String {
    let canonical = canonical_request(request, signed_headers);
    sign_v4(TEST_SECRET_ACCESS_KEY, amz_date, scope, &canonical)
}

/// SigV4: the string to sign over a canonical request, and its HMAC chain.
pub(crate) fn sign_v4(
    secret: &str,
    amz_date: &str,
    scope: &str,
    canonical_request: &str,
) -> String {
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical_request.as_bytes()))
    );
    let mut key = format!("AWS4{secret}").into_bytes();
    for part in scope.split('/') {
        key = hmac(&key, part.as_bytes());
    }
    hex(&hmac(&key, string_to_sign.as_bytes()))
}

fn canonical_request(request: &Request<Bytes>, signed_headers: &[String]) -> String {
    let headers: String = signed_headers
        .iter()
        .map(|name| format!("{name}:{}\n", canonical_header_value(request, name)))
        .collect();
    format!(
        "{}\n{}\n{}\n{headers}\n{}\n{}",
        request.method(),
        request.uri().path(),
        canonical_query(request.uri().query().unwrap_or("")),
        signed_headers.join(";"),
        hex(&Sha256::digest(request.body()))
    )
}

/// All values of a header, trimmed, inner runs of spaces collapsed, joined
/// by commas. hyper keeps `Host` as a header, so it is found like the rest.
fn canonical_header_value(request: &Request<Bytes>, name: &str) -> String {
    request
        .headers()
        .get_all(name)
        .iter()
        .map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Query parameters decoded, re-encoded the SigV4 way and sorted.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (uri_encode(&k), uri_encode(&v)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// RFC 3986 encoding, leaving only the unreserved characters as they are.
fn uri_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const XML_CONTENT_TYPE: (&str, &str) = ("content-type", "text/xml;charset=UTF-8");

fn error_response(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code><Message>{}</Message></Error></Errors><RequestID>{}</RequestID></Response>",
        escape(code),
        escape(message),
        request_id()
    );
    respond(status, &[XML_CONTENT_TYPE], body)
}

/// A random UUID v4, like EC2's request IDs.
fn request_id() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Escapes text for XML element content (quotes stay as they are, as in
/// AWS's messages: `The instance ID 'i-...' does not exist`).
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// A tiny indenting XML writer: enough for EC2's responses.
struct Xml {
    out: String,
    depth: usize,
}

impl Xml {
    fn new() -> Self {
        Self {
            out: "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n".into(),
            depth: 0,
        }
    }

    fn indent(&mut self) {
        for _ in 0..self.depth {
            self.out.push_str("    ");
        }
    }

    fn open(&mut self, tag: &str) -> &mut Self {
        self.indent();
        self.out.push_str(&format!("<{tag}>\n"));
        self.depth += 1;
        self
    }

    fn close(&mut self, tag: &str) -> &mut Self {
        self.depth -= 1;
        self.indent();
        self.out.push_str(&format!("</{tag}>\n"));
        self
    }

    /// `<tag>text</tag>`, or `<tag/>` for empty text, as EC2 writes them.
    fn leaf(&mut self, tag: &str, text: &str) -> &mut Self {
        self.indent();
        if text.is_empty() {
            self.out.push_str(&format!("<{tag}/>\n"));
        } else {
            self.out
                .push_str(&format!("<{tag}>{}</{tag}>\n", escape(text)));
        }
        self
    }
}

fn describe_instances_xml(instances: &[&Instance]) -> String {
    let mut xml = Xml::new();
    xml.out
        .push_str(&format!("<DescribeInstancesResponse xmlns=\"{XMLNS}\">\n"));
    xml.depth = 1;
    xml.leaf("requestId", &request_id());
    if instances.is_empty() {
        xml.leaf("reservationSet", "");
    } else {
        xml.open("reservationSet");
        for instance in instances {
            reservation(&mut xml, instance);
        }
        xml.close("reservationSet");
    }
    xml.out.push_str("</DescribeInstancesResponse>");
    xml.out
}

fn reservation(xml: &mut Xml, i: &Instance) {
    xml.open("item")
        .leaf("reservationId", &i.reservation_id)
        .leaf("ownerId", &i.account_id)
        .leaf("groupSet", "")
        .open("instancesSet");
    instance_item(xml, i);
    xml.close("instancesSet").close("item");
}

fn instance_item(xml: &mut Xml, i: &Instance) {
    // Terminated instances keep neither addresses nor interfaces.
    let gone = i.state == InstanceState::Terminated;
    let (dns, ip) = if gone {
        (String::new(), String::new())
    } else {
        (i.private_dns_name.clone(), i.private_ip.to_string())
    };
    let launch_time = iso_seconds(i.pending_time).replace('Z', ".000Z");
    xml.open("item")
        .leaf("instanceId", &i.instance_id)
        .leaf("imageId", &i.image_id)
        .open("instanceState")
        .leaf("code", &i.state.code().to_string())
        .leaf("name", i.state.name())
        .close("instanceState")
        .leaf("privateDnsName", &dns)
        .leaf("dnsName", "")
        .leaf("reason", "")
        .leaf("amiLaunchIndex", "0")
        .leaf("productCodes", "")
        .leaf("instanceType", &i.instance_type)
        .leaf("launchTime", &launch_time)
        .open("placement")
        .leaf("availabilityZone", &i.availability_zone)
        .leaf("groupName", "")
        .leaf("tenancy", "default")
        .close("placement")
        .open("monitoring")
        .leaf("state", "disabled")
        .close("monitoring");
    if !gone {
        xml.leaf("subnetId", &i.subnet_id)
            .leaf("vpcId", &i.vpc_id)
            .leaf("privateIpAddress", &ip);
    }
    xml.leaf("architecture", &i.architecture)
        .leaf("rootDeviceType", "ebs")
        .leaf("rootDeviceName", "/dev/xvda")
        .leaf("virtualizationType", "hvm");
    tag_set(xml, &i.tags);
    xml.leaf("hypervisor", "xen");
    network_interfaces(xml, i, gone);
    xml.leaf("ebsOptimized", "false")
        .leaf("platformDetails", "Linux/UNIX")
        .leaf("usageOperation", "RunInstances")
        .close("item");
}

fn tag_set(xml: &mut Xml, tags: &[(String, String)]) {
    if tags.is_empty() {
        // AWS leaves tagSet out altogether for an untagged instance.
        return;
    }
    xml.open("tagSet");
    for (key, value) in tags {
        xml.open("item")
            .leaf("key", key)
            .leaf("value", value)
            .close("item");
    }
    xml.close("tagSet");
}

fn network_interfaces(xml: &mut Xml, i: &Instance, gone: bool) {
    if gone {
        xml.leaf("networkInterfaceSet", "");
        return;
    }
    let ip = i.private_ip.to_string();
    xml.open("networkInterfaceSet")
        .open("item")
        .leaf("networkInterfaceId", &i.network_interface_id)
        .leaf("subnetId", &i.subnet_id)
        .leaf("vpcId", &i.vpc_id)
        .leaf("description", "")
        .leaf("ownerId", &i.account_id)
        .leaf("status", "in-use")
        .leaf("macAddress", &i.mac)
        .leaf("privateIpAddress", &ip)
        .leaf("privateDnsName", &i.private_dns_name)
        .leaf("sourceDestCheck", "true")
        .open("attachment")
        .leaf("attachmentId", &super::aws_id("eni-attach"))
        .leaf("deviceIndex", "0")
        .leaf("status", "attached")
        .leaf("deleteOnTermination", "true")
        .close("attachment")
        .open("privateIpAddressesSet")
        .open("item")
        .leaf("privateIpAddress", &ip)
        .leaf("privateDnsName", &i.private_dns_name)
        .leaf("primary", "true")
        .close("item")
        .close("privateIpAddressesSet")
        .leaf("ipv6AddressesSet", "")
        .leaf("interfaceType", "interface")
        .close("item")
        .close("networkInterfaceSet");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakecloud::http::testing::{send, Answer};
    use crate::fakecloud::signer::tests::shared_ca;

    const EXAMPLE_SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    const EXAMPLE_SCOPE: &str = "20150830/us-east-1/service/aws4_request";

    fn example_request(uri: &str) -> Request<Bytes> {
        Request::builder()
            .method("GET")
            .uri(uri)
            .header("host", "example.amazonaws.com")
            .header("x-amz-date", "20150830T123600Z")
            .body(Bytes::new())
            .expect("request")
    }

    /// AWS's SigV4 test suite: get-vanilla and
    /// get-vanilla-query-order-key-case.
    #[test]
    fn sigv4_matches_aws_test_suite() {
        let signed = ["host".to_string(), "x-amz-date".to_string()];
        for (uri, expected) in [
            (
                "/",
                "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
            ),
            (
                "/?Param2=value2&Param1=value1",
                "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
            ),
        ] {
            let canonical = canonical_request(&example_request(uri), &signed);
            assert_eq!(
                sign_v4(
                    EXAMPLE_SECRET,
                    "20150830T123600Z",
                    EXAMPLE_SCOPE,
                    &canonical
                ),
                expected
            );
        }
    }

    struct Signing<'a> {
        access_key: &'a str,
        secret: &'a str,
        region: &'a str,
        service: &'a str,
        when: OffsetDateTime,
    }

    impl Default for Signing<'_> {
        fn default() -> Self {
            Self {
                access_key: TEST_ACCESS_KEY_ID,
                secret: TEST_SECRET_ACCESS_KEY,
                region: "us-west-2",
                service: "ec2",
                when: OffsetDateTime::now_utc(),
            }
        }
    }

    /// Signs a form body the way an AWS SDK does and posts it.
    async fn call(ec2: &Ec2, body: &str, signing: Signing<'_>) -> Answer {
        let host = ec2.addr().to_string();
        let format =
            time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
        let amz_date = signing.when.format(format).expect("format date");
        let scope = format!(
            "{}/{}/{}/aws4_request",
            &amz_date[..8],
            signing.region,
            signing.service
        );
        let content_type = "application/x-www-form-urlencoded; charset=utf-8";
        let request = Request::builder()
            .method("POST")
            .uri("/")
            .header("content-type", content_type)
            .header("host", &host)
            .header("x-amz-date", &amz_date)
            .body(Bytes::from(body.to_string()))
            .expect("request");
        let signed = ["content-type", "host", "x-amz-date"].map(String::from);
        let signature = sign_v4(
            signing.secret,
            &amz_date,
            &scope,
            &canonical_request(&request, &signed),
        );
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders=content-type;host;x-amz-date, Signature={signature}",
            signing.access_key
        );
        let headers = [
            ("content-type", content_type),
            ("host", host.as_str()),
            ("x-amz-date", amz_date.as_str()),
            ("authorization", authorization.as_str()),
        ];
        send("POST", &ec2.url(), &headers, body)
            .await
            .expect("POST")
    }

    async fn describe(ec2: &Ec2, ids: &[&str]) -> Answer {
        let mut body = "Action=DescribeInstances&Version=2016-11-15".to_string();
        for (n, id) in ids.iter().enumerate() {
            body.push_str(&format!("&InstanceId.{}={id}", n + 1));
        }
        call(ec2, &body, Signing::default()).await
    }

    fn error_code(answer: &Answer) -> String {
        let start = answer.body.find("<Code>").expect("an error code") + 6;
        let end = answer.body.find("</Code>").expect("an error code");
        answer.body[start..end].to_string()
    }

    fn cloud() -> FakeCloud {
        FakeCloud::with_ca(shared_ca())
    }

    #[tokio::test]
    async fn describes_instances_in_aws_shape() {
        let cloud = cloud();
        let instance = cloud.launch(
            Instance::builder()
                .private_ip(std::net::Ipv4Addr::new(10, 0, 1, 23))
                .tag("karpenter.sh/nodeclaim", "default-x7k2p")
                .tag("note", "a<b & c")
                .build(),
        );
        let ec2 = cloud.start_ec2("us-west-2").expect("start");
        let answer = describe(&ec2, &[&instance.instance_id]).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        let xml = &answer.body;
        assert!(xml.starts_with(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\n    <requestId>"
        ));
        let launch = iso_seconds(instance.pending_time).replace('Z', ".000Z");
        for expected in [
            format!("<reservationId>{}</reservationId>", instance.reservation_id),
            format!("<ownerId>{}</ownerId>", instance.account_id),
            format!("<instanceId>{}</instanceId>", instance.instance_id),
            format!("<imageId>{}</imageId>", instance.image_id),
            "<instanceState>\n                        <code>16</code>\n                        <name>running</name>".into(),
            "<privateDnsName>ip-10-0-1-23.us-west-2.compute.internal</privateDnsName>".into(),
            "<privateIpAddress>10.0.1.23</privateIpAddress>".into(),
            "<availabilityZone>us-west-2a</availabilityZone>".into(),
            "<instanceType>m5.large</instanceType>".into(),
            "<architecture>x86_64</architecture>".into(),
            format!("<launchTime>{launch}</launchTime>"),
            format!("<macAddress>{}</macAddress>", instance.mac),
            "<key>karpenter.sh/nodeclaim</key>".into(),
            "<value>a&lt;b &amp; c</value>".into(),
            "<privateIpAddressesSet>".into(),
        ] {
            assert!(xml.contains(&expected), "{expected} missing from\n{xml}");
        }
        assert!(xml.ends_with("</DescribeInstancesResponse>"));
        assert_eq!(answer.headers["content-type"], "text/xml;charset=UTF-8");
    }

    #[tokio::test]
    async fn terminated_instances_lose_their_addresses() {
        let cloud = cloud();
        let instance = cloud.launch(Instance::builder().build());
        let ec2 = cloud.start_ec2("us-west-2").expect("start");
        cloud.terminate(&instance.instance_id);
        let xml = describe(&ec2, &[&instance.instance_id]).await.body;
        assert!(xml.contains("<code>48</code>") && xml.contains("<name>terminated</name>"));
        assert!(xml.contains("<privateDnsName/>") && xml.contains("<networkInterfaceSet/>"));
        assert!(!xml.contains("<privateIpAddress>"));
        cloud.remove(&instance.instance_id);
        let gone = describe(&ec2, &[&instance.instance_id]).await;
        assert_eq!(error_code(&gone), "InvalidInstanceID.NotFound");
    }

    #[tokio::test]
    async fn errors_in_aws_shape() {
        let cloud = cloud();
        let here = cloud.launch(Instance::builder().build());
        let elsewhere = cloud.launch(Instance::builder().region("eu-west-1").build());
        let ec2 = cloud.start_ec2("us-west-2").expect("start");

        let missing = describe(&ec2, &["i-0123456789abcdef0"]).await;
        assert_eq!(missing.status, StatusCode::BAD_REQUEST);
        assert!(missing.body.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>InvalidInstanceID.NotFound</Code><Message>The instance ID 'i-0123456789abcdef0' does not exist</Message></Error></Errors><RequestID>"));
        let two = describe(
            &ec2,
            &[&here.instance_id, "i-0123456789abcdef0", "i-12345678"],
        )
        .await;
        assert!(two
            .body
            .contains("The instance IDs 'i-0123456789abcdef0, i-12345678' do not exist"));
        let other_region = describe(&ec2, &[&elsewhere.instance_id]).await;
        assert_eq!(error_code(&other_region), "InvalidInstanceID.NotFound");
        for bad in [
            "i-xyz",
            "i-0123456789ABCDEF0",
            "instance",
            "i-0123456789abcdef",
        ] {
            let malformed = describe(&ec2, &[bad]).await;
            assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
            assert_eq!(
                error_code(&malformed),
                "InvalidInstanceID.Malformed",
                "{bad}"
            );
        }
        let action = call(
            &ec2,
            "Action=RunInstances&Version=2016-11-15",
            Signing::default(),
        )
        .await;
        assert_eq!(error_code(&action), "InvalidAction");
        let no_version = call(&ec2, "Action=DescribeInstances", Signing::default()).await;
        assert_eq!(error_code(&no_version), "MissingParameter");
    }

    #[tokio::test]
    async fn filters_select_without_errors() {
        let cloud = cloud();
        let a = cloud.launch(Instance::builder().build());
        let b = cloud.launch(Instance::builder().build());
        cloud.terminate(&b.instance_id);
        let ec2 = cloud.start_ec2("us-west-2").expect("start");
        let body = format!(
            "Action=DescribeInstances&Version=2016-11-15&Filter.1.Name=instance-id&Filter.1.Value.1={}&Filter.1.Value.2=i-0123456789abcdef0",
            a.instance_id
        );
        let xml = call(&ec2, &body, Signing::default()).await.body;
        assert!(xml.contains(&a.instance_id) && !xml.contains(&b.instance_id));
        let running = "Action=DescribeInstances&Version=2016-11-15&Filter.1.Name=instance-state-name&Filter.1.Value.1=running";
        let xml = call(&ec2, running, Signing::default()).await.body;
        assert!(xml.contains(&a.instance_id) && !xml.contains(&b.instance_id));
        let none = "Action=DescribeInstances&Version=2016-11-15&Filter.1.Name=instance-id&Filter.1.Value.1=i-0123456789abcdef0";
        assert!(call(&ec2, none, Signing::default())
            .await
            .body
            .contains("<reservationSet/>"));
        let all = call(
            &ec2,
            "Action=DescribeInstances&Version=2016-11-15",
            Signing::default(),
        )
        .await
        .body;
        assert!(all.contains(&a.instance_id) && all.contains(&b.instance_id));
        let bogus =
            "Action=DescribeInstances&Version=2016-11-15&Filter.1.Name=colour&Filter.1.Value.1=red";
        assert_eq!(
            error_code(&call(&ec2, bogus, Signing::default()).await),
            "InvalidParameterValue"
        );
    }

    #[tokio::test]
    async fn requests_must_be_signed_for_real() {
        let cloud = cloud();
        let ec2 = cloud.start_ec2("us-west-2").expect("start");
        let body = "Action=DescribeInstances&Version=2016-11-15";
        let unsigned = send("POST", &ec2.url(), &[], body).await.expect("POST");
        assert_eq!(
            (unsigned.status, error_code(&unsigned)),
            (
                StatusCode::UNAUTHORIZED,
                "MissingAuthenticationToken".into()
            )
        );
        let cases = [
            (
                Signing {
                    secret: "wrong",
                    ..Signing::default()
                },
                StatusCode::FORBIDDEN,
                "SignatureDoesNotMatch",
            ),
            (
                Signing {
                    access_key: "AKIAUNKNOWN",
                    ..Signing::default()
                },
                StatusCode::UNAUTHORIZED,
                "AuthFailure",
            ),
            (
                Signing {
                    region: "us-east-1",
                    ..Signing::default()
                },
                StatusCode::FORBIDDEN,
                "SignatureDoesNotMatch",
            ),
            (
                Signing {
                    service: "s3",
                    ..Signing::default()
                },
                StatusCode::FORBIDDEN,
                "SignatureDoesNotMatch",
            ),
            (
                Signing {
                    when: OffsetDateTime::now_utc() - time::Duration::hours(1),
                    ..Signing::default()
                },
                StatusCode::BAD_REQUEST,
                "RequestExpired",
            ),
        ];
        for (signing, status, code) in cases {
            let answer = call(&ec2, body, signing).await;
            assert_eq!(
                (answer.status, error_code(&answer)),
                (status, code.to_string())
            );
        }
        let garbled = [
            ("authorization", "AWS4-HMAC-SHA256 Credential=x"),
            ("x-amz-date", "20250101T000000Z"),
        ];
        let answer = send("POST", &ec2.url(), &garbled, body)
            .await
            .expect("POST");
        assert_eq!(
            (answer.status, error_code(&answer)),
            (StatusCode::BAD_REQUEST, "IncompleteSignature".into())
        );
        assert_eq!(
            call(&ec2, body, Signing::default()).await.status,
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn faults_answer_like_ec2() {
        let cloud = cloud();
        let ec2 = cloud.start_ec2("us-west-2").expect("start");
        ec2.faults().fail_next(1, StatusCode::INTERNAL_SERVER_ERROR);
        let failed = describe(&ec2, &[]).await;
        assert_eq!(
            (failed.status, error_code(&failed)),
            (StatusCode::INTERNAL_SERVER_ERROR, "InternalError".into())
        );
        ec2.faults().fail_next(1, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(error_code(&describe(&ec2, &[]).await), "Unavailable");
        assert_eq!(describe(&ec2, &[]).await.status, StatusCode::OK);
    }

    /// What AWS's own SigV4 signer produces (static keys, with and without
    /// a session token) is accepted, and a tampered body is not.
    #[tokio::test]
    async fn accepts_requests_signed_by_the_aws_sigv4_crate() {
        use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
        let cloud = cloud();
        let instance = cloud.launch(Instance::builder().build());
        let ec2 = cloud.start_ec2("us-west-2").expect("start");
        let body = format!(
            "Action=DescribeInstances&Version=2016-11-15&InstanceId.1={}",
            instance.instance_id
        );
        for session_token in [None, Some("a-session-token".to_string())] {
            let credentials = aws_credential_types::Credentials::new(
                TEST_ACCESS_KEY_ID,
                TEST_SECRET_ACCESS_KEY,
                session_token,
                None,
                "test",
            );
            let identity = credentials.into();
            let params = aws_sigv4::sign::v4::SigningParams::builder()
                .identity(&identity)
                .region("us-west-2")
                .name("ec2")
                .time(std::time::SystemTime::now())
                .settings(SigningSettings::default())
                .build()
                .expect("signing params")
                .into();
            let host = ec2.addr().to_string();
            let content_type = "application/x-www-form-urlencoded; charset=utf-8";
            let headers = [("host", host.as_str()), ("content-type", content_type)];
            let signable = SignableRequest::new(
                "POST",
                ec2.url(),
                headers.into_iter(),
                SignableBody::Bytes(body.as_bytes()),
            )
            .expect("signable");
            let (instructions, _) = sign(signable, &params).expect("sign").into_parts();
            let (signed_headers, _) = instructions.into_parts();
            let mut all: Vec<(&str, &str)> = headers.to_vec();
            all.extend(signed_headers.iter().map(|h| (h.name(), h.value())));
            let answer = send("POST", &ec2.url(), &all, &body).await.expect("POST");
            assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
            assert!(answer.body.contains(&instance.instance_id));
            let tampered = body.replace("InstanceId.1", "InstanceId.2");
            let refused = send("POST", &ec2.url(), &all, &tampered)
                .await
                .expect("POST");
            assert_eq!(error_code(&refused), "SignatureDoesNotMatch");
        }
    }
}
