//! Reading EC2's XML: `DescribeInstancesResponse` and the error envelope.
//!
//! Elements are matched by local name and by position in the tree (never
//! "anywhere below"): tags, interfaces and addresses all nest `<item>`s, and
//! a value from the wrong level would be a wrong name or address for a node.
//! roxmltree refuses DTDs, so entity expansion attacks cannot happen here.

use std::collections::BTreeMap;
use std::net::IpAddr;

use roxmltree::{Document, Node};

use super::{Ec2Instance, InstanceState, LookupError};

/// An EC2 error: `<Response><Errors><Error><Code>..` and the request ID
/// AWS support asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ApiError {
    pub code: String,
    pub message: String,
    pub request_id: Option<String>,
}

/// The instance with `instance_id` in a `DescribeInstancesResponse`;
/// `Ok(None)` if the response does not hold it.
#[cfg(test)]
pub(super) fn parse_describe(
    body: &[u8],
    instance_id: &str,
) -> Result<Option<Ec2Instance>, LookupError> {
    Ok(parse_instances(body)?
        .into_iter()
        .find(|found| found.instance_id == instance_id))
}

/// Every instance in a `DescribeInstancesResponse`, each with the ID EC2
/// gave it: a batched lookup hands each caller only the instance whose
/// `instanceId` is the one it asked for. One instance that cannot be read
/// makes the whole answer malformed (the batch is then asked again one
/// instance at a time, so it costs only that instance its answer).
pub(super) fn parse_instances(body: &[u8]) -> Result<Vec<Ec2Instance>, LookupError> {
    let body = std::str::from_utf8(body).map_err(|e| malformed(format!("not UTF-8: {e}")))?;
    let doc = Document::parse(body).map_err(|e| malformed(format!("not XML: {e}")))?;
    let root = doc.root_element();
    if root.tag_name().name() != "DescribeInstancesResponse" {
        return Err(malformed(format!(
            "unexpected <{}>",
            root.tag_name().name()
        )));
    }
    let reservations =
        child(root, "reservationSet").ok_or_else(|| malformed("no reservationSet".into()))?;
    children(reservations, "item")
        .filter_map(|reservation| child(reservation, "instancesSet"))
        .flat_map(|set| children(set, "item"))
        .map(instance)
        .collect()
}

/// The error in an EC2 error response, if the body is one.
pub(super) fn parse_error(body: &[u8]) -> Option<ApiError> {
    let doc = Document::parse(std::str::from_utf8(body).ok()?).ok()?;
    let root = doc.root_element();
    // EC2 says <Response><Errors><Error>; other AWS query services say
    // <ErrorResponse><Error>, which a proxy or a regional quirk could send.
    let error = match root.tag_name().name() {
        "Response" => child(child(root, "Errors")?, "Error")?,
        "ErrorResponse" => child(root, "Error")?,
        _ => return None,
    };
    Some(ApiError {
        code: text(error, &["Code"])?.to_string(),
        message: text(error, &["Message"]).unwrap_or_default().to_string(),
        request_id: text(root, &["RequestID"])
            .or_else(|| text(root, &["RequestId"]))
            .map(str::to_string),
    })
}

/// One `instancesSet/item`.
fn instance(item: Node) -> Result<Ec2Instance, LookupError> {
    let required = |path: &[&str]| {
        text(item, path).ok_or_else(|| malformed(format!("instance without {}", path.join("/"))))
    };
    let optional = |path: &[&str]| text(item, path).unwrap_or_default().to_string();
    Ok(Ec2Instance {
        instance_id: required(&["instanceId"])?.to_string(),
        state: InstanceState::from_name(required(&["instanceState", "name"])?),
        image_id: required(&["imageId"])?.to_string(),
        instance_type: optional(&["instanceType"]),
        availability_zone: optional(&["placement", "availabilityZone"]),
        architecture: optional(&["architecture"]),
        private_dns_name: optional(&["privateDnsName"]),
        private_ips: addresses(item)?,
        interface_ips: interface_addresses(item),
        tags: tags(item),
    })
}

/// The addresses that are the node's own: the instance's primary private
/// IPv4 and its primary IPv6, if it has one (the instance's `ipv6Address`,
/// else the primary interface's IPv6 marked `isPrimaryIpv6`, else its
/// first). Never the other addresses of its interfaces: under the VPC CNI
/// the secondary IPv4s of every interface are pods' addresses, and a node
/// can assign and unassign such addresses itself, so a serving certificate
/// naming them would let the node (or a pod's owner) stand in for
/// whatever later has that address. kubelet reports only these as node
/// addresses (`--node-ip`), so its serving CSRs ask for no more.
fn addresses(item: Node) -> Result<Vec<IpAddr>, LookupError> {
    let mut texts: Vec<&str> = Vec::new();
    texts.extend(text(item, &["privateIpAddress"]));
    let ipv6 = interface_ipv6(primary_interface(item));
    let marked = ipv6
        .iter()
        .find(|a| text(**a, &["isPrimaryIpv6"]) == Some("true"));
    let interface_primary = marked
        .or(ipv6.first())
        .and_then(|a| text(*a, &["ipv6Address"]));
    texts.extend(text(item, &["ipv6Address"]).or(interface_primary));
    parse_addresses(texts)
}

/// Every address of the primary interface, primary ones included: what an
/// agent of before 0.2.0 read from IMDS (`local-ipv4s`, `ipv6s`) and
/// asked a serving certificate for. Only ever used to recognise such an
/// agent, never to allow a name, so an address that does not parse is
/// skipped rather than failing the whole lookup.
fn interface_addresses(item: Node) -> Vec<IpAddr> {
    let interface = primary_interface(item);
    let v4 = interface
        .and_then(|i| child(i, "privateIpAddressesSet"))
        .into_iter()
        .flat_map(|s| children(s, "item"))
        .filter_map(|a| text(a, &["privateIpAddress"]));
    let v6 = interface_ipv6(interface)
        .into_iter()
        .filter_map(|a| text(a, &["ipv6Address"]));
    v4.chain(v6).filter_map(|t| t.parse().ok()).collect()
}

/// The interface at device index 0.
fn primary_interface<'a, 'i>(item: Node<'a, 'i>) -> Option<Node<'a, 'i>> {
    child(item, "networkInterfaceSet")
        .into_iter()
        .flat_map(|set| children(set, "item"))
        .find(|i| text(*i, &["attachment", "deviceIndex"]) == Some("0"))
}

/// An interface's `ipv6AddressesSet` items.
fn interface_ipv6<'a, 'i>(interface: Option<Node<'a, 'i>>) -> Vec<Node<'a, 'i>> {
    interface
        .and_then(|i| child(i, "ipv6AddressesSet"))
        .into_iter()
        .flat_map(|s| children(s, "item"))
        .collect()
}

fn parse_addresses(texts: Vec<&str>) -> Result<Vec<IpAddr>, LookupError> {
    texts
        .into_iter()
        .map(|t| {
            t.parse()
                .map_err(|_| malformed(format!("bad address {t:?}")))
        })
        .collect()
}

/// `tagSet/item/{key,value}`; AWS leaves `tagSet` out when there are none.
fn tags(item: Node) -> BTreeMap<String, String> {
    let items = child(item, "tagSet")
        .into_iter()
        .flat_map(|set| children(set, "item"));
    items
        .filter_map(|tag| {
            let key = text(tag, &["key"])?;
            Some((
                key.to_string(),
                text(tag, &["value"]).unwrap_or_default().to_string(),
            ))
        })
        .collect()
}

fn child<'a, 'i>(node: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    node.children()
        .find(|n| n.is_element() && n.tag_name().name() == name)
}

fn children<'a, 'i: 'a>(
    node: Node<'a, 'i>,
    name: &'a str,
) -> impl Iterator<Item = Node<'a, 'i>> + 'a {
    node.children()
        .filter(move |n| n.is_element() && n.tag_name().name() == name)
}

/// The text of the element at `path` below `node`; `None` if it is missing
/// or empty (`<privateDnsName/>`).
fn text<'a>(node: Node<'a, '_>, path: &[&str]) -> Option<&'a str> {
    let mut at = node;
    for name in path {
        at = child(at, name)?;
    }
    at.text().map(str::trim).filter(|t| !t.is_empty())
}

fn malformed(what: String) -> LookupError {
    LookupError::Malformed(what)
}

#[cfg(test)]
mod tests;
