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
        let service = Arc::new(Ec2Service {
            region: region.to_string(),
            instances: cloud.shared_instances(),
        });
        let server = Server::start(socket, listen_after, faults.clone(), service)?;
        Ok(Self {
            server,
            faults,
            region: region.to_string(),
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
}

impl Service for Ec2Service {
    fn handle(&self, request: Request<Bytes>) -> Response<Full<Bytes>> {
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

/// Escapes text for XML content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
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
    xml.leaf("requestId", &request_id()).open("reservationSet");
    for instance in instances {
        reservation(&mut xml, instance);
    }
    xml.close("reservationSet");
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
