//! The instance identity document: what AWS signs.

use super::error::IdentityError;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use time::OffsetDateTime;

/// An EC2 instance identity document, with the fields AWS puts there
/// (version 2017-09-30). Unknown fields are ignored, since AWS may add some;
/// the fields that can be `null` or absent are `Option`s.
///
/// Only ever built from verified content ([`super::VerifiedDocument`]) or by
/// code that signs documents (tests, a fake cloud): no API here accepts a
/// document beside its signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityDocument {
    /// The 12-digit AWS account that owns the instance.
    pub account_id: String,
    /// `x86_64` or `arm64`.
    pub architecture: String,
    /// e.g. `us-west-2a`.
    pub availability_zone: String,
    /// The AMI the instance was launched from.
    pub image_id: String,
    /// e.g. `i-078517ca8a70a1dde`.
    pub instance_id: String,
    /// e.g. `t3.medium`.
    pub instance_type: String,
    /// When the instance last entered `pending` (launch, or start after a
    /// stop), in UTC.
    #[serde(with = "time::serde::rfc3339")]
    pub pending_time: OffsetDateTime,
    /// The primary private IPv4 address (absent on IPv6-only instances).
    #[serde(default)]
    pub private_ip: Option<IpAddr>,
    /// e.g. `us-west-2`; selects the pinned certificate.
    pub region: String,
    /// The document format's version, e.g. `2017-09-30`.
    pub version: String,
    /// Kernel image, if any (usually null).
    #[serde(default)]
    pub kernel_id: Option<String>,
    /// RAM disk image, if any (usually null).
    #[serde(default)]
    pub ramdisk_id: Option<String>,
    /// Billing product codes, if any.
    #[serde(default)]
    pub billing_products: Option<Vec<String>>,
    /// Legacy DevPay product codes, if any.
    #[serde(default)]
    pub devpay_product_codes: Option<Vec<String>>,
    /// AWS Marketplace product codes, if any.
    #[serde(default)]
    pub marketplace_product_codes: Option<Vec<String>>,
}

impl IdentityDocument {
    /// Parse verified content. Crate-private so that no caller can build a
    /// trusted document from bytes that were not verified.
    pub(crate) fn from_verified(content: &[u8]) -> Result<Self, IdentityError> {
        serde_json::from_slice(content).map_err(|e| IdentityError::BadDocument(e.to_string()))
    }
}

/// The `region` the (not yet verified) content claims, which selects the
/// certificate to verify with. Reading only this one field before
/// verification is inherent in AWS's one-key-per-region scheme; the whole
/// document is parsed again, from the same bytes, once verified.
pub(crate) fn claimed_region(content: &[u8]) -> Result<String, IdentityError> {
    #[derive(Deserialize)]
    struct RegionOnly {
        region: String,
    }
    serde_json::from_slice::<RegionOnly>(content)
        .map(|r| r.region)
        .map_err(|e| IdentityError::NoRegion(e.to_string()))
}
