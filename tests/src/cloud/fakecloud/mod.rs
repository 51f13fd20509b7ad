//! The fake cloud: the one stand-in in autonode's tests.
//!
//! Everything Kubernetes in the tests is real; AWS is not available, so this
//! module plays it, as faithfully as the agent and the server can observe:
//!
//! - [`Imds`]: IMDSv2 for one instance (tokens, meta-data tree, user-data,
//!   the identity document and its `rsa2048` signature), answering the way
//!   AWS's does, including its refusals (400/401/403/404/405).
//! - [`Ec2`]: the slice of the EC2 Query API the server uses,
//!   `DescribeInstances`, SigV4-verified, answering AWS's XML and errors.
//! - [`TestCa`]: signs identity documents in AWS's exact PKCS#7 shape; the
//!   server is configured to trust [`TestCa::ca_pem`] in place of AWS's
//!   regional certificates.
//! - [`nitro::TestNitroPki`]: a Nitro attestation PKI of AWS's shape, whose
//!   root a server pins in place of AWS's, and the NitroTPM of a simulated
//!   instance (read by the `nitro-tpm-attest-standin` binary).
//! - [`FakeCloud`]: the instances EC2 knows, mutable from the test (launch,
//!   modify, terminate), and the CA.
//! - [`Faults`]: each server can start late (connections refused until
//!   then), fail the next N requests with a 5xx, or answer slowly.
//!
//! Servers bind 127.0.0.1:0 by default; to put IMDS where an instance finds
//! it (169.254.169.254:80), bind the socket inside a
//! [`crate::network::netns::NetNs`] and hand it to [`Imds::start_on`]. Addresses in
//! the instance model (10.x private IPs) are only data in documents; nothing
//! ever connects to them.

pub mod ec2;
mod http;
pub mod imds;
pub mod nitro;
pub mod signer;

pub use ec2::{Ec2, TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY};
pub use http::{BoundSocket, Faults};
pub use imds::{Imds, IMDS_ADDR};
pub use signer::{SignerError, TestCa};

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard};

use rand::Rng as _;
use time::{OffsetDateTime, UtcOffset};

/// The account instances are launched in unless a test says otherwise.
pub const DEFAULT_ACCOUNT_ID: &str = "123456789012";
/// The region instances are launched in unless a test says otherwise.
pub const DEFAULT_REGION: &str = "us-west-2";

/// An EC2 instance's lifecycle state, with EC2's codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceState {
    Pending,
    Running,
    ShuttingDown,
    Terminated,
    Stopping,
    Stopped,
}

impl InstanceState {
    /// EC2's numeric state code (`instanceState/code`).
    pub fn code(self) -> u16 {
        match self {
            Self::Pending => 0,
            Self::Running => 16,
            Self::ShuttingDown => 32,
            Self::Terminated => 48,
            Self::Stopping => 64,
            Self::Stopped => 80,
        }
    }

    /// EC2's state name (`instanceState/name`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::ShuttingDown => "shutting-down",
            Self::Terminated => "terminated",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
        }
    }
}

/// One EC2 instance, as IMDS and EC2 describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// `i-` and 17 hex digits.
    pub instance_id: String,
    pub account_id: String,
    pub region: String,
    pub availability_zone: String,
    pub image_id: String,
    pub instance_type: String,
    /// `x86_64` or `arm64`, as EC2 spells them.
    pub architecture: String,
    pub private_ip: Ipv4Addr,
    /// The primary interface's private IPv4s besides the primary one (as
    /// the VPC CNI gives pods). IMDS lists them after it in `local-ipv4s`.
    /// None by default.
    pub secondary_ips: Vec<Ipv4Addr>,
    /// A second interface's addresses (device index 1), its primary first,
    /// as the VPC CNI attaches for pods. None by default.
    pub second_interface_ips: Vec<Ipv4Addr>,
    /// The primary interface's IPv6 addresses, the instance's primary one
    /// first (EC2's `ipv6Address`, IMDS's `ipv6`); IMDS lists all of them
    /// in the interface's `ipv6s`. None by default.
    pub ipv6s: Vec<Ipv6Addr>,
    /// `ip-10-0-1-23.us-west-2.compute.internal` (`ec2.internal` in
    /// us-east-1), the name kubelet registers the node under.
    pub private_dns_name: String,
    pub local_hostname: String,
    /// The primary interface's MAC, lower-case, `02:` first like AWS's.
    pub mac: String,
    /// When the instance last entered `pending`: the identity document's
    /// `pendingTime` and EC2's `launchTime`.
    pub pending_time: OffsetDateTime,
    pub state: InstanceState,
    /// Served at `/latest/user-data`; empty means none (IMDS answers 404).
    pub user_data: Vec<u8>,
    pub reservation_id: String,
    pub network_interface_id: String,
    pub subnet_id: String,
    pub vpc_id: String,
    /// EC2 tags (Karpenter's `karpenter.sh/nodeclaim` and the like).
    pub tags: Vec<(String, String)>,
}

impl Instance {
    /// A builder for a fresh, plausible instance with random identifiers.
    pub fn builder() -> InstanceBuilder {
        InstanceBuilder::default()
    }

    /// The Kubernetes provider ID kubelet and Karpenter use for it.
    pub fn provider_id(&self) -> String {
        format!("aws:///{}/{}", self.availability_zone, self.instance_id)
    }

    /// The instance identity document exactly as AWS writes it: AWS's key
    /// order, two-space indent, `" : "` separators, no final newline.
    pub fn identity_document(&self) -> String {
        let text = |v: &str| serde_json::Value::from(v).to_string();
        let fields: [(&str, String); 15] = [
            ("accountId", text(&self.account_id)),
            ("architecture", text(&self.architecture)),
            ("availabilityZone", text(&self.availability_zone)),
            ("billingProducts", "null".into()),
            ("devpayProductCodes", "null".into()),
            ("marketplaceProductCodes", "null".into()),
            ("imageId", text(&self.image_id)),
            ("instanceId", text(&self.instance_id)),
            ("instanceType", text(&self.instance_type)),
            ("kernelId", "null".into()),
            ("pendingTime", text(&iso_seconds(self.pending_time))),
            ("privateIp", text(&self.private_ip.to_string())),
            ("ramdiskId", "null".into()),
            ("region", text(&self.region)),
            ("version", text("2017-09-30")),
        ];
        let lines: Vec<String> = fields
            .iter()
            .map(|(key, value)| format!("  \"{key}\" : {value}"))
            .collect();
        format!("{{\n{}\n}}", lines.join(",\n"))
    }
}

/// `2021-09-03T21:25:44Z`: UTC, whole seconds, as the document has it.
pub(crate) fn iso_seconds(t: OffsetDateTime) -> String {
    let t = t.to_offset(UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Builds an [`Instance`]; anything not set gets a plausible value.
#[derive(Clone, Debug, Default)]
pub struct InstanceBuilder {
    account_id: Option<String>,
    region: Option<String>,
    availability_zone: Option<String>,
    image_id: Option<String>,
    instance_type: Option<String>,
    architecture: Option<String>,
    private_ip: Option<Ipv4Addr>,
    pending_time: Option<OffsetDateTime>,
    state: Option<InstanceState>,
    user_data: Vec<u8>,
    tags: Vec<(String, String)>,
}

impl InstanceBuilder {
    pub fn account_id(mut self, v: impl Into<String>) -> Self {
        self.account_id = Some(v.into());
        self
    }
    /// Also sets the availability zone to `<region>a` unless it is set.
    pub fn region(mut self, v: impl Into<String>) -> Self {
        self.region = Some(v.into());
        self
    }
    pub fn availability_zone(mut self, v: impl Into<String>) -> Self {
        self.availability_zone = Some(v.into());
        self
    }
    pub fn image_id(mut self, v: impl Into<String>) -> Self {
        self.image_id = Some(v.into());
        self
    }
    pub fn instance_type(mut self, v: impl Into<String>) -> Self {
        self.instance_type = Some(v.into());
        self
    }
    pub fn architecture(mut self, v: impl Into<String>) -> Self {
        self.architecture = Some(v.into());
        self
    }
    /// Also determines the private DNS name and local hostname.
    pub fn private_ip(mut self, v: Ipv4Addr) -> Self {
        self.private_ip = Some(v);
        self
    }
    pub fn pending_time(mut self, v: OffsetDateTime) -> Self {
        self.pending_time = Some(v);
        self
    }
    pub fn state(mut self, v: InstanceState) -> Self {
        self.state = Some(v);
        self
    }
    pub fn user_data(mut self, v: impl Into<Vec<u8>>) -> Self {
        self.user_data = v.into();
        self
    }
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.push((key.into(), value.into()));
        self
    }

    pub fn build(self) -> Instance {
        let region = self.region.unwrap_or_else(|| DEFAULT_REGION.into());
        let private_ip = self.private_ip.unwrap_or_else(next_private_ip);
        let private_dns_name = private_dns_name(private_ip, &region);
        let now = OffsetDateTime::now_utc();
        Instance {
            instance_id: aws_id("i"),
            account_id: self.account_id.unwrap_or_else(|| DEFAULT_ACCOUNT_ID.into()),
            availability_zone: self
                .availability_zone
                .unwrap_or_else(|| format!("{region}a")),
            image_id: self.image_id.unwrap_or_else(|| aws_id("ami")),
            instance_type: self.instance_type.unwrap_or_else(|| "m5.large".into()),
            architecture: self.architecture.unwrap_or_else(|| "x86_64".into()),
            private_ip,
            secondary_ips: Vec::new(),
            second_interface_ips: Vec::new(),
            ipv6s: Vec::new(),
            local_hostname: private_dns_name.clone(),
            private_dns_name,
            mac: random_mac(),
            // The document has whole seconds; keep the model equal to it.
            pending_time: self
                .pending_time
                .unwrap_or(now)
                .replace_nanosecond(0)
                .expect("0 is a valid nanosecond"),
            state: self.state.unwrap_or(InstanceState::Running),
            user_data: self.user_data,
            reservation_id: aws_id("r"),
            network_interface_id: aws_id("eni"),
            subnet_id: aws_id("subnet"),
            vpc_id: aws_id("vpc"),
            tags: self.tags,
            region,
        }
    }
}

/// EC2's private DNS name for an address: us-east-1 is the odd one out.
pub fn private_dns_name(ip: Ipv4Addr, region: &str) -> String {
    let dashed = ip.to_string().replace('.', "-");
    if region == "us-east-1" {
        format!("ip-{dashed}.ec2.internal")
    } else {
        format!("ip-{dashed}.{region}.compute.internal")
    }
}

/// `<prefix>-` and 17 random lower-case hex digits, like EC2's long IDs.
pub fn aws_id(prefix: &str) -> String {
    let mut rng = rand::thread_rng();
    let digits: String = (0..17)
        .map(|_| char::from_digit(rng.gen_range(0..16), 16).expect("digit < 16"))
        .collect();
    format!("{prefix}-{digits}")
}

fn random_mac() -> String {
    let bytes: [u8; 5] = rand::random();
    let rest: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("02:{}", rest.join(":"))
}

/// A private address no other instance built in this process has: EC2
/// never gives two live instances of a VPC the same one. Starts at a random
/// point so separate test processes look different.
fn next_private_ip() -> Ipv4Addr {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;
    static START: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = *START.get_or_init(|| rand::thread_rng().gen_range(0..60_000));
    let n = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % 64_000;
    // AWS reserves the first four and the last address of a subnet: use
    // .4 to .253 of each /24.
    Ipv4Addr::new(10, 0, (n / 250) as u8, (n % 250 + 4) as u8)
}

/// What EC2 knows: instances by ID, shared by every [`Ec2`] endpoint.
pub(crate) type Instances = Arc<Mutex<BTreeMap<String, Instance>>>;

/// The fake cloud: a CA playing AWS's signing role and the instances EC2
/// knows, which tests change as the scenario goes (launch, terminate...).
/// Cloning shares the same cloud.
#[derive(Clone, Debug)]
pub struct FakeCloud {
    ca: Arc<TestCa>,
    instances: Instances,
}

impl FakeCloud {
    /// A cloud with a freshly generated CA and no instances.
    pub fn new() -> Result<Self, SignerError> {
        Ok(Self::with_ca(Arc::new(TestCa::generate()?)))
    }

    /// A cloud signing with an existing CA (generating one takes a while).
    pub fn with_ca(ca: Arc<TestCa>) -> Self {
        Self {
            ca,
            instances: Instances::default(),
        }
    }

    pub fn ca(&self) -> &Arc<TestCa> {
        &self.ca
    }

    /// Adds an instance EC2 will describe; returns it for convenience.
    pub fn launch(&self, instance: Instance) -> Instance {
        self.lock()
            .insert(instance.instance_id.clone(), instance.clone());
        instance
    }

    pub fn instance(&self, instance_id: &str) -> Option<Instance> {
        self.lock().get(instance_id).cloned()
    }

    pub fn instances(&self) -> Vec<Instance> {
        self.lock().values().cloned().collect()
    }

    /// Changes an instance in place; `None` if EC2 does not know it.
    pub fn modify(&self, instance_id: &str, f: impl FnOnce(&mut Instance)) -> Option<Instance> {
        let mut instances = self.lock();
        let instance = instances.get_mut(instance_id)?;
        f(instance);
        Some(instance.clone())
    }

    /// Terminates an instance: EC2 still describes it (as AWS does for
    /// about an hour), as `terminated` and without addresses.
    pub fn terminate(&self, instance_id: &str) -> Option<Instance> {
        self.modify(instance_id, |i| i.state = InstanceState::Terminated)
    }

    /// Forgets an instance entirely (EC2 then answers NotFound).
    pub fn remove(&self, instance_id: &str) -> Option<Instance> {
        self.lock().remove(instance_id)
    }

    /// Serves EC2 for `region` on 127.0.0.1 (an ephemeral port).
    pub fn start_ec2(&self, region: &str) -> std::io::Result<Ec2> {
        Ec2::start(self, region)
    }

    /// Serves IMDS for one instance on 127.0.0.1 (an ephemeral port).
    pub fn start_imds(&self, instance: &Instance) -> Result<Imds, imds::ImdsError> {
        Imds::start(instance, &self.ca)
    }

    pub(crate) fn shared_instances(&self) -> Instances {
        Arc::clone(&self.instances)
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Instance>> {
        // A test that panicked while holding the lock has failed already;
        // the data is still usable for the others.
        self.instances
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "{\n  \"accountId\" : \"278576220453\",\n  \"architecture\" : \"x86_64\",\n  \"availabilityZone\" : \"us-west-2a\",\n  \"billingProducts\" : null,\n  \"devpayProductCodes\" : null,\n  \"marketplaceProductCodes\" : null,\n  \"imageId\" : \"ami-0fa9e1f64142cde17\",\n  \"instanceId\" : \"i-078517ca8a70a1dde\",\n  \"instanceType\" : \"t2.medium\",\n  \"kernelId\" : null,\n  \"pendingTime\" : \"2021-09-03T21:25:44Z\",\n  \"privateIp\" : \"10.0.0.209\",\n  \"ramdiskId\" : null,\n  \"region\" : \"us-west-2\",\n  \"version\" : \"2017-09-30\"\n}";

    #[test]
    fn identity_document_matches_aws_byte_for_byte() {
        let mut instance = Instance::builder()
            .account_id("278576220453")
            .image_id("ami-0fa9e1f64142cde17")
            .instance_type("t2.medium")
            .private_ip(Ipv4Addr::new(10, 0, 0, 209))
            .pending_time(time::macros::datetime!(2021-09-03 21:25:44 UTC))
            .build();
        instance.instance_id = "i-078517ca8a70a1dde".into();
        assert_eq!(instance.identity_document(), SAMPLE);
    }

    #[test]
    fn builder_makes_plausible_instances() {
        let i = Instance::builder()
            .region("us-east-1")
            .private_ip(Ipv4Addr::new(10, 0, 1, 23))
            .build();
        assert_eq!(i.instance_id.len(), 19);
        assert!(i.instance_id.starts_with("i-"));
        assert!(i.instance_id[2..]
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(i.private_dns_name, "ip-10-0-1-23.ec2.internal");
        assert_eq!(i.availability_zone, "us-east-1a");
        assert_eq!(
            i.provider_id(),
            format!("aws:///us-east-1a/{}", i.instance_id)
        );
        let west = Instance::builder()
            .private_ip(Ipv4Addr::new(10, 0, 1, 23))
            .build();
        assert_eq!(
            west.private_dns_name,
            "ip-10-0-1-23.us-west-2.compute.internal"
        );
        assert_eq!(west.mac.len(), 17);
        assert_ne!(west.instance_id, i.instance_id);
    }

    #[test]
    fn cloud_state_is_mutable() {
        let cloud = FakeCloud::with_ca(signer::tests::shared_ca());
        let i = cloud.launch(Instance::builder().build());
        assert_eq!(
            cloud.instance(&i.instance_id).map(|i| i.state),
            Some(InstanceState::Running)
        );
        cloud.terminate(&i.instance_id);
        assert_eq!(
            cloud.instance(&i.instance_id).map(|i| i.state),
            Some(InstanceState::Terminated)
        );
        assert!(cloud.remove(&i.instance_id).is_some());
        assert!(cloud.instance(&i.instance_id).is_none());
        assert!(cloud.terminate(&i.instance_id).is_none());
    }

    /// The project's own verifier accepts what the fake IMDS serves once
    /// the test CA is pinned, and only then.
    #[test]
    fn the_shared_verifier_accepts_our_signatures_with_our_ca_pinned() {
        use autonode_shared::identity::{verify, Scope, TrustStore};
        let ca = signer::tests::shared_ca();
        let instance = Instance::builder()
            .region("eu-central-1")
            .private_ip(Ipv4Addr::new(10, 0, 7, 9))
            .build();
        let document = instance.identity_document();
        let rsa2048 = ca
            .rsa2048(document.as_bytes(), OffsetDateTime::now_utc())
            .expect("sign");

        let mut trust = TrustStore::empty();
        trust
            .add_pem(Scope::AnyRegion, &ca.ca_pem())
            .expect("pin the test CA");
        let verified = verify(rsa2048.as_bytes(), &trust).expect("verifier accepts the fake cloud");
        assert_eq!(verified.content_bytes(), document.as_bytes());
        let doc = verified.document();
        assert_eq!(doc.instance_id, instance.instance_id);
        assert_eq!(doc.region, "eu-central-1");
        assert_eq!(doc.availability_zone, instance.availability_zone);
        assert_eq!(doc.pending_time, instance.pending_time);
        assert_eq!(
            doc.private_ip,
            Some(std::net::IpAddr::V4(instance.private_ip))
        );

        let mut regional = TrustStore::empty();
        regional
            .add_pem(Scope::Region("eu-central-1".into()), &ca.ca_pem())
            .expect("pin");
        assert!(verify(rsa2048.as_bytes(), &regional).is_ok());
        let mut wrong_region = TrustStore::empty();
        wrong_region
            .add_pem(Scope::Region("us-west-2".into()), &ca.ca_pem())
            .expect("pin");
        assert!(verify(rsa2048.as_bytes(), &wrong_region).is_err());
        assert!(
            verify(rsa2048.as_bytes(), &TrustStore::aws()).is_err(),
            "AWS's certs must not vouch for the test CA"
        );
        let other_ca = TestCa::generate().expect("another CA");
        let mut other = TrustStore::empty();
        other
            .add_pem(Scope::AnyRegion, &other_ca.ca_pem())
            .expect("pin");
        assert!(verify(rsa2048.as_bytes(), &other).is_err());
    }
}
