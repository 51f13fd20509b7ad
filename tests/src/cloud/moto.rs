//! moto, a third-party implementation of the EC2 API (PyPI, server mode),
//! as the cloud the real Karpenter launches into.
//!
//! The project's own fake cloud ([`crate::cloud::fakecloud`]) answers what
//! autonode asks; Karpenter asks much more (launch templates, fleets,
//! instance types and their offerings, subnets, security groups, images),
//! and an EC2 written by the same hands that wrote autonode would only
//! confirm autonode's reading of AWS. moto is someone else's reading.
//!
//! [`Moto::start`] runs `moto_server` from the venv `tests/setup/install-moto`
//! makes, on a free loopback port, as a child that dies with the test.
//! [`Moto::seed`] creates what an `EC2NodeClass` selects by tag: a VPC, a
//! subnet, a security group; the AMIs are preloaded (see [`AMD64_AMI`]).

use crate::harness::process::Daemon;
use crate::kube::controlplane::free_port;
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tempfile::TempDir;

/// The moto release `tests/setup/moto-requirements.txt` pins.
pub const MOTO_VERSION: &str = "5.2.5";

/// The region every call names. us-east-1: Karpenter's static price table
/// (`ISOLATED_VPC`, no Pricing API) has it, and an offering without a
/// price is never launched.
pub const REGION: &str = "us-east-1";

/// The zone the seeded subnet is in.
pub const ZONE: &str = "us-east-1a";

/// The one instance type the scenarios pin: moto's CreateFleet launches
/// only the first override of a request.
pub const INSTANCE_TYPE: &str = "m5.large";

/// The tag an `EC2NodeClass` selects subnets, security groups and AMIs by.
pub const DISCOVERY_TAG: (&str, &str) = ("karpenter.sh/discovery", "autonode-test");

/// The preloaded x86_64 AMI. moto's RegisterImage keeps only a name and a
/// description (no architecture, no tags), and Karpenter drops an image
/// whose architecture it cannot map; moto's documented way to have images
/// of a given shape is `MOTO_AMIS_PATH`, a JSON list read at start.
pub const AMD64_AMI: &str = "ami-0a1b2c3d4e5f60001";

/// The preloaded arm64 AMI (see [`AMD64_AMI`]).
pub const ARM64_AMI: &str = "ami-0a1b2c3d4e5f60002";

const START_TIMEOUT: Duration = Duration::from_secs(90);

/// How moto's server is started: its `main`, after one fix.
///
/// EC2 gives a fleet's instances their launch template's security groups.
/// moto's CreateFleet reads the template's `GroupSet` only, and Karpenter's
/// templates carry `SecurityGroupIds`: the instances got no group, and
/// Karpenter found every NodeClaim `Drifted` (SecurityGroupDrift) within a
/// second of its launch, its instance cache keeping it so for minutes.
/// The fix gives each template version a `GroupSet` of its
/// `SecurityGroupIds` (or of its primary network interface's `Groups`)
/// when it has none (moto resolves either by name or id), so fleet
/// instances carry the template's groups as on EC2.
const SERVER_MAIN: &str = r#"
import sys
import moto.ec2.models.launch_templates as templates

_version_init = templates.LaunchTemplateVersion.__init__

def _with_group_set(self, template, number, data, description):
    groups = list(data.get("SecurityGroupIds") or [])
    for interface in data.get("NetworkInterfaces") or []:
        if str(interface.get("DeviceIndex", "0")) == "0":
            groups += list(interface.get("Groups") or [])
    if groups and not data.get("GroupSet"):
        data = dict(data, GroupSet=groups)
    _version_init(self, template, number, data, description)

templates.LaunchTemplateVersion.__init__ = _with_group_set

from moto.server import main
sys.argv[0] = "moto_server"
sys.exit(main())
"#;

/// The EC2 Query API version moto answers for.
const API_VERSION: &str = "2016-11-15";

/// A running moto server. Dropping it kills the process and removes its
/// files.
pub struct Moto {
    // Field order is drop order: the process dies before its directory.
    daemon: Daemon,
    url: String,
    http: Client<HttpConnector, Full<Bytes>>,
    dir: TempDir,
}

/// What [`Moto::seed`] created.
#[derive(Clone, Debug)]
pub struct Seeded {
    pub vpc: String,
    pub subnet: String,
    pub security_group: String,
}

/// An instance as moto's DescribeInstances reports it.
#[derive(Clone, Debug)]
pub struct MotoInstance {
    pub id: String,
    pub state: String,
    pub instance_type: String,
    pub image_id: String,
    pub zone: String,
    pub subnet: String,
    pub private_ip: String,
    pub private_dns_name: String,
    pub security_groups: Vec<String>,
    pub tags: BTreeMap<String, String>,
    /// `x86_64` or `arm64`.
    pub architecture: String,
    /// When it was launched (`launchTime`, RFC 3339): the identity
    /// document's `pendingTime`.
    pub launch_time: String,
    /// The account it runs in (its reservation's `ownerId`).
    pub owner_id: String,
    pub reservation_id: String,
    pub vpc: String,
    /// The primary network interface's MAC and id.
    pub mac: String,
    pub network_interface_id: String,
}

/// What a version of a launch template gives an instance that the harness
/// needs.
#[derive(Clone, Debug)]
pub struct TemplateData {
    pub image_id: String,
    /// Decoded; empty when the template has none.
    pub user_data: Vec<u8>,
    pub security_groups: Vec<String>,
}

/// The venv `tests/setup/install-moto` fills.
pub fn venv_dir() -> Result<PathBuf> {
    let venv = crate::harness::cache::root()?.join(format!("moto-{MOTO_VERSION}/venv"));
    if !venv.join("bin/moto_server").exists() {
        bail!(
            "no moto in {}: run tests/setup/install-moto (or tests/setup/install-deps)",
            venv.display()
        );
    }
    Ok(venv)
}

impl Moto {
    /// Starts moto's server with the two AMIs preloaded and waits until it
    /// answers EC2 calls.
    pub async fn start() -> Result<Self> {
        let venv = venv_dir()?;
        let mut dir = tempfile::Builder::new()
            .prefix("autonode-moto-")
            .tempdir()
            .context("creating moto's directory")?;
        let amis = dir.path().join("amis.json");
        std::fs::write(&amis, serde_json::to_vec_pretty(&preloaded_amis())?)
            .context("writing amis.json")?;
        let amis = amis.display().to_string();
        let env = [
            ("MOTO_AMIS_PATH", amis.as_str()),
            // Instances launched with an unknown type or image fail, as on
            // AWS, instead of starting something no one asked for.
            ("MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION", "true"),
            ("MOTO_ENABLE_AMI_VALIDATION", "true"),
            // No stdout buffering: the log is read while moto runs.
            ("PYTHONUNBUFFERED", "1"),
        ];
        let http = Client::builder(TokioExecutor::new()).build_http();
        // Like the API server's port, a free port can be taken before moto
        // binds it (tests are separate processes): then it exits at once
        // and another port is tried.
        for attempt in 1.. {
            let port = free_port()?;
            let args = vec![
                "-c".into(),
                SERVER_MAIN.into(),
                "-H".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
            ];
            let daemon =
                Daemon::spawn_with_env("moto", &venv.join("bin/python"), &args, dir.path(), &env)?;
            let moto = Self {
                daemon,
                url: format!("http://127.0.0.1:{port}"),
                http: http.clone(),
                dir,
            };
            match moto.wait_ready().await {
                Ok(()) => return Ok(moto),
                Err(_) if attempt < 3 && moto.log_tail(10).contains("Address already in use") => {
                    eprintln!("moto: port {port} was taken meanwhile; another");
                    dir = moto.into_dir();
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns")
    }

    fn into_dir(self) -> TempDir {
        self.daemon.kill();
        self.dir
    }

    async fn wait_ready(&self) -> Result<()> {
        let ready = || async {
            Ok(self
                .call("DescribeRegions", &[])
                .await
                .is_ok()
                .then_some(()))
        };
        self.daemon
            .wait_for(
                "answer from moto",
                START_TIMEOUT,
                Duration::from_millis(250),
                ready,
            )
            .await
    }

    /// The endpoint (`http://127.0.0.1:<port>`), for `AWS_ENDPOINT_URL`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }

    /// The last lines of moto's log (one line per request).
    pub fn log_tail(&self, lines: usize) -> String {
        self.daemon.log_tail(lines)
    }

    /// Calls EC2 `action` with Query API `params`; the XML answer, or an
    /// error with moto's.
    ///
    /// Unsigned but for a credential scope: moto routes a request to a
    /// service and a region by the scope in its `Authorization` header
    /// (without one, a POST to `/` is taken for S3), and checks no
    /// signature unless told to.
    pub async fn call(&self, action: &str, params: &[(&str, &str)]) -> Result<String> {
        // Built before any await: the serializer is not Send.
        let form = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("Action", action);
            form.append_pair("Version", API_VERSION);
            for (k, v) in params {
                form.append_pair(k, v);
            }
            form.finish()
        };
        let scope = format!(
            "AWS4-HMAC-SHA256 Credential=autonode-test/20260101/{REGION}/ec2/aws4_request, \
             SignedHeaders=host, Signature=0"
        );
        let request = hyper::Request::post(format!("{}/", self.url))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("authorization", scope)
            .body(Full::new(Bytes::from(form)))?;
        let response = self
            .http
            .request(request)
            .await
            .with_context(|| format!("moto {action}"))?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        let body = String::from_utf8_lossy(&body).into_owned();
        if !status.is_success() {
            bail!("moto {action}: {status}: {body}");
        }
        Ok(body)
    }

    /// Creates a VPC, a subnet in [`ZONE`] and a security group, each
    /// tagged [`DISCOVERY_TAG`]. The addresses are a default VPC's, inside
    /// the VM tests' network (`vm.rs`), so a VM can take the address moto
    /// gives its instance.
    pub async fn seed(&self) -> Result<Seeded> {
        let vpc = self
            .create(
                "CreateVpc",
                "vpc",
                &[("CidrBlock", "172.31.0.0/16")],
                "vpcId",
            )
            .await?;
        let subnet = self
            .create(
                "CreateSubnet",
                "subnet",
                &[
                    ("VpcId", &vpc),
                    ("CidrBlock", "172.31.32.0/20"),
                    ("AvailabilityZone", ZONE),
                ],
                "subnetId",
            )
            .await?;
        let security_group = self
            .create(
                "CreateSecurityGroup",
                "security-group",
                &[
                    ("VpcId", &vpc),
                    ("GroupName", "autonode-test-nodes"),
                    ("GroupDescription", "nodes of the autonode test cluster"),
                ],
                "groupId",
            )
            .await?;
        Ok(Seeded {
            vpc,
            subnet,
            security_group,
        })
    }

    /// Calls a Create action with the discovery tag on the new resource of
    /// `resource_type`; the text of the answer's `id_element`.
    async fn create(
        &self,
        action: &str,
        resource_type: &str,
        params: &[(&str, &str)],
        id_element: &str,
    ) -> Result<String> {
        let mut all = params.to_vec();
        all.extend([
            ("TagSpecification.1.ResourceType", resource_type),
            ("TagSpecification.1.Tag.1.Key", DISCOVERY_TAG.0),
            ("TagSpecification.1.Tag.1.Value", DISCOVERY_TAG.1),
        ]);
        let xml = self.call(action, &all).await?;
        let doc = roxmltree::Document::parse(&xml).with_context(|| format!("{action}: {xml}"))?;
        let id = doc
            .descendants()
            .find(|n| n.has_tag_name(id_element))
            .and_then(|n| n.text())
            .with_context(|| format!("{action}: no {id_element} in {xml}"))?;
        Ok(id.to_string())
    }

    /// Launches one [`INSTANCE_TYPE`] instance of `image` in the seeded
    /// subnet and security group, tagged `tag`, without Karpenter; its id.
    pub async fn run_instance(
        &self,
        seeded: &Seeded,
        image: &str,
        tag: (&str, &str),
    ) -> Result<String> {
        let xml = self
            .call(
                "RunInstances",
                &[
                    ("ImageId", image),
                    ("InstanceType", INSTANCE_TYPE),
                    ("MinCount", "1"),
                    ("MaxCount", "1"),
                    ("SubnetId", &seeded.subnet),
                    ("SecurityGroupId.1", &seeded.security_group),
                    ("TagSpecification.1.ResourceType", "instance"),
                    ("TagSpecification.1.Tag.1.Key", tag.0),
                    ("TagSpecification.1.Tag.1.Value", tag.1),
                ],
            )
            .await?;
        let doc = roxmltree::Document::parse(&xml).context("RunInstances")?;
        let id = doc
            .descendants()
            .find(|n| n.has_tag_name("instanceId"))
            .and_then(|n| n.text())
            .with_context(|| format!("RunInstances: no instanceId in {xml}"))?;
        Ok(id.to_string())
    }

    /// Terminates `instance_id` (moto does it at once).
    pub async fn terminate(&self, instance_id: &str) -> Result<()> {
        self.call("TerminateInstances", &[("InstanceId.1", instance_id)])
            .await
            .map(drop)
    }

    /// Every instance moto knows, in any state.
    pub async fn instances(&self) -> Result<Vec<MotoInstance>> {
        let xml = self.call("DescribeInstances", &[]).await?;
        let doc = roxmltree::Document::parse(&xml).context("DescribeInstances")?;
        let reservations = doc.descendants().filter(|n| {
            n.has_tag_name("item") && n.parent().is_some_and(|p| p.has_tag_name("reservationSet"))
        });
        let mut instances = Vec::new();
        for reservation in reservations {
            let items = reservation
                .children()
                .filter(|c| c.has_tag_name("instancesSet"))
                .flat_map(|set| set.children().filter(|c| c.has_tag_name("item")));
            instances.extend(items.map(|item| instance_of(reservation, item)));
        }
        Ok(instances)
    }

    /// The launch template (id, version) a fleet launched `instance_id`
    /// from, as DescribeFleets reports it; `None` for an instance no fleet
    /// launched.
    pub async fn template_of(&self, instance_id: &str) -> Result<Option<(String, String)>> {
        let xml = self.call("DescribeFleets", &[]).await?;
        let doc = roxmltree::Document::parse(&xml).context("DescribeFleets")?;
        let launched = doc.descendants().filter(|n| {
            n.has_tag_name("item")
                && n.parent()
                    .is_some_and(|p| p.has_tag_name("fleetInstanceSet"))
        });
        for item in launched {
            let ids = item.descendants().filter(|n| {
                n.has_tag_name("item") && n.parent().is_some_and(|p| p.has_tag_name("instanceIds"))
            });
            if !ids.into_iter().any(|id| id.text() == Some(instance_id)) {
                continue;
            }
            let spec = item
                .descendants()
                .find(|n| n.has_tag_name("launchTemplateSpecification"))
                .with_context(|| format!("DescribeFleets: no template for {instance_id}"))?;
            let id = child_text(spec, "launchTemplateId");
            let version = child_text(spec, "version");
            return Ok(Some((id, version)));
        }
        Ok(None)
    }

    /// One version of a launch template (DescribeLaunchTemplateVersions).
    pub async fn template_data(&self, template_id: &str, version: &str) -> Result<TemplateData> {
        let xml = self
            .call(
                "DescribeLaunchTemplateVersions",
                &[
                    ("LaunchTemplateId", template_id),
                    ("LaunchTemplateVersion.1", version),
                ],
            )
            .await?;
        let doc = roxmltree::Document::parse(&xml).context("DescribeLaunchTemplateVersions")?;
        let data = doc
            .descendants()
            .find(|n| n.has_tag_name("launchTemplateData"))
            .with_context(|| format!("no data for {template_id} version {version}: {xml}"))?;
        let user_data = decode_base64(&child_text(data, "userData"))?;
        let security_groups = data
            .children()
            .filter(|c| c.has_tag_name("securityGroupIdSet"))
            .flat_map(|set| set.children().filter(|c| c.has_tag_name("item")))
            .filter_map(|item| item.text().map(str::to_string))
            .collect();
        Ok(TemplateData {
            image_id: child_text(data, "imageId"),
            user_data,
            security_groups,
        })
    }

    /// The instance's userData as EC2 hands it to the machine (decoded),
    /// or `None` when it has none.
    pub async fn user_data(&self, instance_id: &str) -> Result<Option<Vec<u8>>> {
        let xml = self
            .call(
                "DescribeInstanceAttribute",
                &[("InstanceId", instance_id), ("Attribute", "userData")],
            )
            .await?;
        let doc = roxmltree::Document::parse(&xml).context("DescribeInstanceAttribute")?;
        let value = doc
            .descendants()
            .find(|n| n.has_tag_name("userData"))
            .and_then(|n| n.children().find(|c| c.has_tag_name("value")))
            .and_then(|n| n.text());
        value.map(decode_base64).transpose()
    }

    /// How many fleets were requested (CreateFleet calls moto kept).
    pub async fn fleets(&self) -> Result<usize> {
        let xml = self.call("DescribeFleets", &[]).await?;
        let doc = roxmltree::Document::parse(&xml).context("DescribeFleets")?;
        Ok(doc
            .descendants()
            .filter(|n| n.has_tag_name("fleetId"))
            .count())
    }
}

/// The text of `node`'s child `name`, empty when absent.
fn child_text(node: roxmltree::Node, name: &str) -> String {
    node.children()
        .find(|c| c.has_tag_name(name))
        .and_then(|c| c.text())
        .unwrap_or_default()
        .to_string()
}

/// Base64 as EC2 carries userData (empty for empty).
fn decode_base64(b64: &str) -> Result<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .context("userData is not base64")
}

/// An `instancesSet/item` of DescribeInstances, in its reservation.
fn instance_of(reservation: roxmltree::Node, item: roxmltree::Node) -> MotoInstance {
    let nested = |outer: &str, inner: &str| {
        item.children()
            .find(|c| c.has_tag_name(outer))
            .map(|o| child_text(o, inner))
            .unwrap_or_default()
    };
    let set = |name: &str| {
        item.children()
            .find(|c| c.has_tag_name(name))
            .map(|s| s.children().filter(|c| c.has_tag_name("item")).collect())
            .unwrap_or_else(Vec::new)
    };
    MotoInstance {
        id: child_text(item, "instanceId"),
        state: nested("instanceState", "name"),
        instance_type: child_text(item, "instanceType"),
        image_id: child_text(item, "imageId"),
        zone: nested("placement", "availabilityZone"),
        subnet: child_text(item, "subnetId"),
        private_ip: child_text(item, "privateIpAddress"),
        private_dns_name: child_text(item, "privateDnsName"),
        security_groups: set("groupSet")
            .into_iter()
            .map(|g| child_text(g, "groupId"))
            .collect(),
        tags: set("tagSet")
            .into_iter()
            .map(|t| (child_text(t, "key"), child_text(t, "value")))
            .collect(),
        architecture: child_text(item, "architecture"),
        launch_time: child_text(item, "launchTime"),
        owner_id: child_text(reservation, "ownerId"),
        reservation_id: child_text(reservation, "reservationId"),
        vpc: child_text(item, "vpcId"),
        mac: primary_interface(item, "macAddress"),
        network_interface_id: primary_interface(item, "networkInterfaceId"),
    }
}

/// A field of the instance's first network interface, empty when none.
fn primary_interface(item: roxmltree::Node, name: &str) -> String {
    item.children()
        .find(|c| c.has_tag_name("networkInterfaceSet"))
        .and_then(|set| set.children().find(|c| c.has_tag_name("item")))
        .map(|eni| child_text(eni, name))
        .unwrap_or_default()
}

/// moto's `MOTO_AMIS_PATH` entries (keyword arguments of its image model):
/// one image per architecture, tagged for discovery.
fn preloaded_amis() -> serde_json::Value {
    let ami = |id: &str, arch: &str| {
        serde_json::json!({
            "ami_id": id,
            "name": format!("autonode-test-{arch}"),
            "description": "an image the test cluster's machines boot",
            "architecture": arch,
            "virtualization_type": "hvm",
            "root_device_type": "ebs",
            "root_device_name": "/dev/xvda",
            "state": "available",
            "public": false,
            "creation_date": "2026-01-01T00:00:00.000Z",
            "tags": {DISCOVERY_TAG.0: DISCOVERY_TAG.1},
        })
    };
    serde_json::json!([ami(AMD64_AMI, "x86_64"), ami(ARM64_AMI, "arm64")])
}
