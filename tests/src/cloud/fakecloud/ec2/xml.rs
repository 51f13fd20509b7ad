//! EC2's answers as AWS writes them: `DescribeInstancesResponse` and the
//! `<Response><Errors>` envelope.

use super::sigv4::hex;
use super::XMLNS;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};

use crate::cloud::fakecloud::http::respond;
use crate::cloud::fakecloud::{iso_seconds, Instance, InstanceState};

pub(crate) const XML_CONTENT_TYPE: (&str, &str) = ("content-type", "text/xml;charset=UTF-8");

pub(crate) fn error_response(
    status: StatusCode,
    code: &str,
    message: &str,
) -> Response<Full<Bytes>> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code><Message>{}</Message></Error></Errors><RequestID>{}</RequestID></Response>",
        escape(code),
        escape(message),
        request_id()
    );
    respond(status, &[XML_CONTENT_TYPE], body)
}

/// A random UUID v4, like EC2's request IDs.
pub(crate) fn request_id() -> String {
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
pub(crate) fn escape(text: &str) -> String {
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
pub(crate) struct Xml {
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

pub(crate) fn describe_instances_xml(instances: &[&Instance]) -> String {
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

pub(crate) fn reservation(xml: &mut Xml, i: &Instance) {
    xml.open("item")
        .leaf("reservationId", &i.reservation_id)
        .leaf("ownerId", &i.account_id)
        .leaf("groupSet", "")
        .open("instancesSet");
    instance_item(xml, i);
    xml.close("instancesSet").close("item");
}

pub(crate) fn instance_item(xml: &mut Xml, i: &Instance) {
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
        .open("privateDnsNameOptions")
        .leaf("hostnameType", hostname_type(&i.private_dns_name))
        .leaf("enableResourceNameDnsARecord", "false")
        .leaf("enableResourceNameDnsAAAARecord", "false")
        .close("privateDnsNameOptions")
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
        if let Some(primary) = i.ipv6s.first() {
            xml.leaf("ipv6Address", &primary.to_string());
        }
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

/// `resource-name` for a name made of the instance ID, `ip-name` else.
fn hostname_type(private_dns_name: &str) -> &'static str {
    if private_dns_name.starts_with("i-") {
        "resource-name"
    } else {
        "ip-name"
    }
}

pub(crate) fn tag_set(xml: &mut Xml, tags: &[(String, String)]) {
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

pub(crate) fn network_interfaces(xml: &mut Xml, i: &Instance, gone: bool) {
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
        .leaf(
            "attachmentId",
            &crate::cloud::fakecloud::aws_id("eni-attach"),
        )
        .leaf("deviceIndex", "0")
        .leaf("status", "attached")
        .leaf("deleteOnTermination", "true")
        .close("attachment")
        .open("privateIpAddressesSet")
        .open("item")
        .leaf("privateIpAddress", &ip)
        .leaf("privateDnsName", &i.private_dns_name)
        .leaf("primary", "true")
        .close("item");
    secondary_items(xml, &i.secondary_ips);
    xml.close("privateIpAddressesSet");
    ipv6_items(xml, &i.ipv6s);
    xml.leaf("interfaceType", "interface").close("item");
    if let Some((first, rest)) = i.second_interface_ips.split_first() {
        second_interface(xml, i, *first, rest);
    }
    xml.close("networkInterfaceSet");
}

/// `privateIpAddressesSet` items for addresses that are not the primary.
fn secondary_items(xml: &mut Xml, ips: &[std::net::Ipv4Addr]) {
    for ip in ips {
        xml.open("item")
            .leaf("privateIpAddress", &ip.to_string())
            .leaf("primary", "false")
            .close("item");
    }
}

/// `ipv6AddressesSet`, the first address marked the primary one.
fn ipv6_items(xml: &mut Xml, ips: &[std::net::Ipv6Addr]) {
    if ips.is_empty() {
        xml.leaf("ipv6AddressesSet", "");
        return;
    }
    xml.open("ipv6AddressesSet");
    for (n, ip) in ips.iter().enumerate() {
        xml.open("item")
            .leaf("ipv6Address", &ip.to_string())
            .leaf("isPrimaryIpv6", if n == 0 { "true" } else { "false" })
            .close("item");
    }
    xml.close("ipv6AddressesSet");
}

/// A second interface (device index 1), as the VPC CNI attaches for pods.
fn second_interface(
    xml: &mut Xml,
    i: &Instance,
    primary: std::net::Ipv4Addr,
    more: &[std::net::Ipv4Addr],
) {
    xml.open("item")
        .leaf(
            "networkInterfaceId",
            &crate::cloud::fakecloud::aws_id("eni"),
        )
        .leaf("subnetId", &i.subnet_id)
        .leaf("status", "in-use")
        .leaf("privateIpAddress", &primary.to_string())
        .open("attachment")
        .leaf("deviceIndex", "1")
        .leaf("status", "attached")
        .close("attachment")
        .open("privateIpAddressesSet")
        .open("item")
        .leaf("privateIpAddress", &primary.to_string())
        .leaf("primary", "true")
        .close("item");
    secondary_items(xml, more);
    xml.close("privateIpAddressesSet")
        .leaf("ipv6AddressesSet", "")
        .close("item");
}
