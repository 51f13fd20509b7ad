//! Looking an instance up in EC2: the cloud-side half of attestation.
//!
//! The identity document proves which instance is asking; only EC2 itself
//! says whether that instance is still alive, which image it runs and which
//! names and addresses are its own. [`InstanceLookup`] is the question the
//! join path asks; [`Ec2Client`] answers it with `DescribeInstances`, and
//! [`Batched`] makes the lookups that wait together one call.
//!
//! One trait per cloud: another cloud is another file beside this one, with
//! its own lookup trait and client, and the join path picks one.
//!
//! Why not `aws-sdk-ec2`: it is one of the largest crates of the SDK (68 MB
//! of generated source for hundreds of operations); we need one call. The
//! Query API is stable (version pinned below), so the client signs a
//! form-encoded `POST /` with `aws-sigv4` and reads the XML answer itself.
//! Credentials still come from aws-config's default provider chain (env,
//! web identity/IRSA, profile, container, IMDS), which is the part that is
//! worth reusing.

mod batch;
mod cache;
mod client;
mod credentials;
mod retry;
mod transport;
mod xml;

pub use aws_credential_types::Credentials;
pub use batch::{
    Batched, DescribeMany, ManyFuture, CALLS_IN_FLIGHT, DEFAULT_CALLS_PER_SECOND, MAX_IDS,
};
pub use cache::LookupCache;
pub use client::{Ec2Client, Ec2Settings, SetupError};
pub use retry::LookupRetries;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

/// The EC2 Query API version the client speaks; responses are parsed for
/// this version's schema.
pub const API_VERSION: &str = "2016-11-15";

/// What EC2 says about one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ec2Instance {
    pub instance_id: String,
    pub state: InstanceState,
    pub image_id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub architecture: String,
    /// e.g. `ip-10-0-1-23.us-west-2.compute.internal`; empty once the
    /// instance is terminated.
    pub private_dns_name: String,
    /// The addresses a serving certificate may name: the primary private
    /// IPv4 and the primary IPv6, if any. Not the interfaces' other
    /// addresses: under the VPC CNI those are pods' (see `xml::addresses`).
    pub private_ips: Vec<IpAddr>,
    /// Every address of the primary interface (its private IPv4s and its
    /// IPv6s), the primary ones included. A serving certificate may never
    /// name the others; they are kept only to recognise an agent of before
    /// 0.2.0, which asked for all of them (see
    /// [`Refusal::AgentTooOld`](crate::join::refusal::Refusal::AgentTooOld)).
    pub interface_ips: Vec<IpAddr>,
    pub tags: BTreeMap<String, String>,
}

/// An instance's lifecycle state (`instanceState/name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InstanceState {
    Pending,
    Running,
    ShuttingDown,
    Terminated,
    Stopping,
    Stopped,
    /// A state this client does not know; never live.
    Other(String),
}

impl InstanceState {
    /// Parses EC2's state name.
    pub fn from_name(name: &str) -> Self {
        match name {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "shutting-down" => Self::ShuttingDown,
            "terminated" => Self::Terminated,
            "stopping" => Self::Stopping,
            "stopped" => Self::Stopped,
            other => Self::Other(other.to_string()),
        }
    }

    /// Whether the instance may join: booting or up. The agent runs before
    /// kubelet, so EC2 may still report `pending`.
    pub fn is_live(&self) -> bool {
        matches!(self, Self::Pending | Self::Running)
    }
}

/// Why a lookup gave no instance.
#[derive(Clone, Debug, thiserror::Error)]
pub enum LookupError {
    /// EC2 does not know the instance (or the ID is not an instance ID).
    #[error("instance {instance_id} not found")]
    NotFound { instance_id: String },
    /// EC2 throttled us, still after retries.
    #[error("EC2 throttled the request")]
    Throttled,
    /// EC2 could not be reached or failed (5xx, timeout, connection).
    #[error("EC2 unavailable: {0}")]
    Unavailable(String),
    /// EC2 refused our credentials or their permissions.
    #[error("EC2 denied the request: {0}")]
    Denied(String),
    /// EC2 answered something this client cannot read.
    #[error("malformed EC2 response: {0}")]
    Malformed(String),
    /// No credentials could be had from the provider chain.
    #[error("no AWS credentials: {0}")]
    Credentials(String),
    /// The request was refused as invalid, here (e.g. a region that is not
    /// one) or by EC2 with an error code this client does not expect.
    #[error("EC2 request rejected: {code}: {message}")]
    Rejected { code: String, message: String },
}

impl LookupError {
    /// Whether the same lookup may succeed later without anything changing
    /// on our side. Credentials count: providers (IMDS, STS) have outages.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Throttled | Self::Unavailable(_) | Self::Credentials(_)
        )
    }

    /// A short, fixed label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "not_found",
            Self::Throttled => "throttled",
            Self::Unavailable(_) => "unavailable",
            Self::Denied(_) => "denied",
            Self::Malformed(_) => "malformed",
            Self::Credentials(_) => "credentials",
            Self::Rejected { .. } => "rejected",
        }
    }
}

impl LookupError {
    /// EC2 does not know `instance_id`.
    pub fn not_found(instance_id: &str) -> Self {
        Self::NotFound {
            instance_id: instance_id.to_string(),
        }
    }
}

/// The instance EC2 described under `instance_id` among `found`: each
/// lookup gets the instance EC2 put its own ID on, never another's; none
/// is "not found".
fn the_one(found: Vec<Ec2Instance>, instance_id: &str) -> Result<Ec2Instance, LookupError> {
    found
        .into_iter()
        .find(|instance| instance.instance_id == instance_id)
        .ok_or_else(|| LookupError::not_found(instance_id))
}

/// The boxed future [`InstanceLookup`] returns (object safe, `Send`).
pub type LookupFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Ec2Instance, LookupError>> + Send + 'a>>;

/// Looks instances up in EC2; the join path holds a `dyn InstanceLookup`
/// so tests and other clouds can stand in.
pub trait InstanceLookup: Send + Sync + 'static {
    /// `region` comes from the verified identity document.
    fn describe_instance<'a>(&'a self, region: &'a str, instance_id: &'a str) -> LookupFuture<'a>;
}

/// EC2 instance IDs are `i-` and 8 (old) or 17 lower-case hex digits.
/// Checked before any request: the ID is attacker-supplied until then.
pub fn is_instance_id(id: &str) -> bool {
    id.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17) && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A running instance as EC2 would describe `id`, for the lookups'
    /// stand-ins.
    pub(crate) fn running(id: &str) -> Ec2Instance {
        Ec2Instance {
            instance_id: id.to_string(),
            state: InstanceState::Running,
            image_id: "ami-1".into(),
            instance_type: "m5.large".into(),
            availability_zone: "us-west-2a".into(),
            architecture: "x86_64".into(),
            private_dns_name: format!("{id}.internal"),
            private_ips: vec![],
            interface_ips: vec![],
            tags: Default::default(),
        }
    }

    #[test]
    fn instance_ids() {
        for good in ["i-0123456789abcdef0", "i-1234abcd"] {
            assert!(is_instance_id(good), "{good}");
        }
        for bad in [
            "",
            "i-",
            "i-0123456789ABCDEF0",
            "i-0123456789abcdef",
            "i-0123456789abcdef01",
            "i-1234abcg",
            "ami-1234abcd",
            "i-1234abcd&Action=RunInstances",
        ] {
            assert!(!is_instance_id(bad), "{bad}");
        }
    }

    #[test]
    fn states() {
        assert!(InstanceState::from_name("pending").is_live());
        assert!(InstanceState::from_name("running").is_live());
        for dead in [
            "shutting-down",
            "terminated",
            "stopping",
            "stopped",
            "rebooting",
        ] {
            assert!(!InstanceState::from_name(dead).is_live(), "{dead}");
        }
        assert_eq!(
            InstanceState::from_name("rebooting"),
            InstanceState::Other("rebooting".into())
        );
    }

    #[test]
    fn transience_and_reasons() {
        let not_found = LookupError::NotFound {
            instance_id: "i-1234abcd".into(),
        };
        assert!(!not_found.is_transient());
        assert_eq!(not_found.reason(), "not_found");
        assert!(LookupError::Throttled.is_transient());
        assert!(LookupError::Unavailable("503".into()).is_transient());
        assert!(!LookupError::Denied("AuthFailure".into()).is_transient());
        assert!(!LookupError::Malformed("x".into()).is_transient());
    }
}
