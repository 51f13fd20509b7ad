//! SigV4, verified for real: the `Authorization` header, its scope and
//! clock, and the signature recomputed over the canonical request.

use super::{Ec2Error, MAX_CLOCK_SKEW, TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY};
use std::collections::BTreeMap;

use bytes::Bytes;
use hmac::{Hmac, Mac as _};
use hyper::{Request, StatusCode};
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;

/// The parts of `Authorization: AWS4-HMAC-SHA256 Credential=..., ...`.
#[derive(Debug)]
pub(crate) struct Authorization {
    pub(crate) access_key: String,
    pub(crate) date: String,
    pub(crate) region: String,
    pub(crate) service: String,
    pub(crate) signed_headers: Vec<String>,
    pub(crate) signature: String,
}

impl Authorization {
    pub(crate) fn scope(&self) -> String {
        format!(
            "{}/{}/{}/aws4_request",
            self.date, self.region, self.service
        )
    }
}

pub(crate) fn parse_authorization(value: &str) -> Result<Authorization, Ec2Error> {
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

pub(crate) fn check_scope(auth: &Authorization, region: &str) -> Result<(), Ec2Error> {
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

pub(crate) fn check_clock(amz_date: &str) -> Result<(), Ec2Error> {
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
pub(crate) fn signature(
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

pub(crate) fn canonical_request(request: &Request<Bytes>, signed_headers: &[String]) -> String {
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
pub(crate) fn canonical_header_value(request: &Request<Bytes>, name: &str) -> String {
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
pub(crate) fn canonical_query(query: &str) -> String {
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
pub(crate) fn uri_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
