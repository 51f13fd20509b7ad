//! Responses shaped after EC2's documented `DescribeInstances` schema
//! (API version 2016-11-15), trimmed of the elements the client ignores.

use super::*;

const ID: &str = "i-0598c7d356eba48d7";

/// Two interfaces, secondary private IPs, IPv6, tags with escapes.
const RUNNING: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
    <requestId>8f7724cf-496f-496e-8fe3-example</requestId>
    <reservationSet>
        <item>
            <reservationId>r-1234567890abcdef0</reservationId>
            <ownerId>123456789012</ownerId>
            <groupSet/>
            <instancesSet>
                <item>
                    <instanceId>i-0598c7d356eba48d7</instanceId>
                    <imageId>ami-0abcdef1234567890</imageId>
                    <instanceState>
                        <code>16</code>
                        <name>running</name>
                    </instanceState>
                    <privateDnsName>ip-10-0-1-23.us-west-2.compute.internal</privateDnsName>
                    <dnsName/>
                    <instanceType>m5.large</instanceType>
                    <launchTime>2024-05-01T10:00:00.000Z</launchTime>
                    <placement>
                        <availabilityZone>us-west-2b</availabilityZone>
                        <groupName/>
                        <tenancy>default</tenancy>
                    </placement>
                    <subnetId>subnet-0123456789abcdef0</subnetId>
                    <vpcId>vpc-0123456789abcdef0</vpcId>
                    <privateIpAddress>10.0.1.23</privateIpAddress>
                    <ipAddress>54.0.0.1</ipAddress>
                    <architecture>arm64</architecture>
                    <tagSet>
                        <item>
                            <key>karpenter.sh/nodeclaim</key>
                            <value>default-x7k2p</value>
                        </item>
                        <item>
                            <key>note</key>
                            <value>a&lt;b &amp; c</value>
                        </item>
                        <item>
                            <key>empty</key>
                            <value/>
                        </item>
                    </tagSet>
                    <networkInterfaceSet>
                        <item>
                            <networkInterfaceId>eni-0000000000000000a</networkInterfaceId>
                            <privateIpAddress>10.0.1.23</privateIpAddress>
                            <privateDnsName>ip-10-0-1-23.us-west-2.compute.internal</privateDnsName>
                            <attachment><deviceIndex>0</deviceIndex></attachment>
                            <association><publicIp>54.0.0.1</publicIp></association>
                            <privateIpAddressesSet>
                                <item>
                                    <privateIpAddress>10.0.1.23</privateIpAddress>
                                    <primary>true</primary>
                                    <association><publicIp>54.0.0.1</publicIp></association>
                                </item>
                                <item>
                                    <privateIpAddress>10.0.1.24</privateIpAddress>
                                    <primary>false</primary>
                                </item>
                            </privateIpAddressesSet>
                            <ipv6AddressesSet>
                                <item><ipv6Address>2600:1f14:abc:de00::17</ipv6Address></item>
                            </ipv6AddressesSet>
                        </item>
                        <item>
                            <networkInterfaceId>eni-0000000000000000b</networkInterfaceId>
                            <privateIpAddress>10.0.2.99</privateIpAddress>
                            <attachment><deviceIndex>1</deviceIndex></attachment>
                            <privateIpAddressesSet>
                                <item>
                                    <privateIpAddress>10.0.2.99</privateIpAddress>
                                    <primary>true</primary>
                                </item>
                            </privateIpAddressesSet>
                            <ipv6AddressesSet/>
                        </item>
                    </networkInterfaceSet>
                </item>
            </instancesSet>
        </item>
    </reservationSet>
</DescribeInstancesResponse>"#;

const TERMINATED: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
    <requestId>59dbff89-35bd-4eac-99ed-be587example</requestId>
    <reservationSet>
        <item>
            <reservationId>r-1234567890abcdef0</reservationId>
            <instancesSet>
                <item>
                    <instanceId>i-0598c7d356eba48d7</instanceId>
                    <imageId>ami-0abcdef1234567890</imageId>
                    <instanceState><code>48</code><name>terminated</name></instanceState>
                    <privateDnsName/>
                    <instanceType>t3.micro</instanceType>
                    <placement><availabilityZone>us-west-2a</availabilityZone></placement>
                    <architecture>x86_64</architecture>
                    <networkInterfaceSet/>
                </item>
            </instancesSet>
        </item>
    </reservationSet>
</DescribeInstancesResponse>"#;

fn parse(xml: &str) -> Result<Option<Ec2Instance>, LookupError> {
    parse_describe(xml.as_bytes(), ID)
}

#[test]
fn running_instance_with_every_address() {
    let instance = parse(RUNNING).expect("parses").expect("holds the instance");
    assert_eq!(instance.instance_id, ID);
    assert_eq!(instance.state, InstanceState::Running);
    assert_eq!(instance.image_id, "ami-0abcdef1234567890");
    assert_eq!(instance.instance_type, "m5.large");
    assert_eq!(instance.availability_zone, "us-west-2b");
    assert_eq!(instance.architecture, "arm64");
    assert_eq!(
        instance.private_dns_name,
        "ip-10-0-1-23.us-west-2.compute.internal"
    );
    let ips: Vec<String> = instance
        .private_ips
        .iter()
        .map(ToString::to_string)
        .collect();
    // Public addresses (ipAddress, association/publicIp) are not the node's,
    // nor the secondary addresses of its interfaces (pods' under the VPC
    // CNI): the primary IPv4 and the primary interface's IPv6 only.
    assert_eq!(ips, ["10.0.1.23", "2600:1f14:abc:de00::17"]);
    // What an agent of before 0.2.0 read from IMDS: every address of the
    // primary interface, never the second interface's.
    let interface: Vec<String> = instance
        .interface_ips
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        interface,
        ["10.0.1.23", "10.0.1.24", "2600:1f14:abc:de00::17"]
    );
    let tags: Vec<(&str, &str)> = instance
        .tags
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        tags,
        [
            ("empty", ""),
            ("karpenter.sh/nodeclaim", "default-x7k2p"),
            ("note", "a<b & c")
        ]
    );
}

#[test]
fn the_primary_ipv6_is_the_instances_or_the_one_marked_primary() {
    let ips = |xml: &str| -> Vec<String> {
        let instance = parse(xml).expect("parses").expect("holds the instance");
        instance
            .private_ips
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    let two = RUNNING.replace(
        "<item><ipv6Address>2600:1f14:abc:de00::17</ipv6Address></item>",
        "<item><ipv6Address>2600:1f14:abc:de00::17</ipv6Address></item>\
         <item><ipv6Address>2600:1f14:abc:de00::18</ipv6Address><isPrimaryIpv6>true</isPrimaryIpv6></item>",
    );
    assert_eq!(ips(&two), ["10.0.1.23", "2600:1f14:abc:de00::18"]);
    let instance_level = RUNNING.replace(
        "<ipAddress>54.0.0.1</ipAddress>",
        "<ipAddress>54.0.0.1</ipAddress><ipv6Address>2600:1f14:abc:de00::99</ipv6Address>",
    );
    assert_ne!(instance_level, RUNNING, "the fixture changed");
    assert_eq!(
        ips(&instance_level),
        ["10.0.1.23", "2600:1f14:abc:de00::99"]
    );
    // A second interface's addresses never count, IPv6 included.
    let only_second = RUNNING.replace(
        "<item><ipv6Address>2600:1f14:abc:de00::17</ipv6Address></item>",
        "",
    );
    let only_second = only_second.replacen(
        "<ipv6AddressesSet/>",
        "<ipv6AddressesSet><item><ipv6Address>2600:1f14:abc:de00::20</ipv6Address></item></ipv6AddressesSet>",
        1,
    );
    assert_eq!(ips(&only_second), ["10.0.1.23"]);
}

#[test]
fn terminated_instance_has_no_addresses() {
    let instance = parse(TERMINATED)
        .expect("parses")
        .expect("holds the instance");
    assert_eq!(instance.state, InstanceState::Terminated);
    assert!(!instance.state.is_live());
    assert_eq!(instance.private_dns_name, "");
    assert!(instance.private_ips.is_empty() && instance.tags.is_empty());
}

#[test]
fn other_instances_do_not_count() {
    let other = RUNNING.replace(ID, "i-0123456789abcdef0");
    assert_eq!(parse(&other).expect("parses"), None);
    let empty = r#"<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>x</requestId><reservationSet/></DescribeInstancesResponse>"#;
    assert_eq!(parse(empty).expect("parses"), None);
}

#[test]
fn unreadable_responses_are_malformed() {
    let cases = [
        "",
        "not xml",
        "<DescribeInstancesResponse>",
        "<Other/>",
        "<DescribeInstancesResponse><requestId>x</requestId></DescribeInstancesResponse>",
        // A DTD could expand entities without bound: refused.
        "<!DOCTYPE d [<!ENTITY a \"aaaa\">]><DescribeInstancesResponse><reservationSet/></DescribeInstancesResponse>",
    ];
    for xml in cases {
        assert!(
            matches!(parse(xml), Err(LookupError::Malformed(_))),
            "{xml:?}"
        );
    }
    let bad_ip = RUNNING.replace("2600:1f14:abc:de00::17", "2600:1f14:abc:de00::zz");
    assert!(matches!(parse(&bad_ip), Err(LookupError::Malformed(_))));
    let no_state = TERMINATED.replace("<name>terminated</name>", "");
    assert!(matches!(parse(&no_state), Err(LookupError::Malformed(_))));
    assert!(matches!(
        parse_describe(b"\xff\xfe", ID),
        Err(LookupError::Malformed(_))
    ));
}

#[test]
fn ec2_error_envelope() {
    let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>InvalidInstanceID.NotFound</Code><Message>The instance ID 'i-0598c7d356eba48d7' does not exist</Message></Error></Errors><RequestID>ea966190-f9aa-478e-9ede-example</RequestID></Response>"#;
    assert_eq!(
        parse_error(body.as_bytes()),
        Some(ApiError {
            code: "InvalidInstanceID.NotFound".into(),
            message: "The instance ID 'i-0598c7d356eba48d7' does not exist".into(),
            request_id: Some("ea966190-f9aa-478e-9ede-example".into()),
        })
    );
}

#[test]
fn query_protocol_error_envelope() {
    let body = r#"<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>c6104cbe-example</RequestId></ErrorResponse>"#;
    let error = parse_error(body.as_bytes()).expect("an error");
    assert_eq!(
        (error.code.as_str(), error.request_id.as_deref()),
        ("Throttling", Some("c6104cbe-example"))
    );
}

#[test]
fn non_errors_are_not_errors() {
    for body in [
        "",
        "<html>502 Bad Gateway</html>",
        "<Response><Errors/></Response>",
        RUNNING,
    ] {
        assert_eq!(parse_error(body.as_bytes()), None, "{body}");
    }
}

/// The interface's other addresses only recognise an agent of before
/// 0.2.0: one that does not parse is skipped, and the lookup (and the
/// instance's own addresses) stand.
#[test]
fn an_unparsable_interface_address_is_skipped_not_a_failed_lookup() {
    let xml = RUNNING.replace(
        "<privateIpAddress>10.0.1.24</privateIpAddress>",
        "<privateIpAddress>10.0.1.x</privateIpAddress>",
    );
    let instance = parse(&xml).expect("parses").expect("holds the instance");
    let interface: Vec<String> = instance
        .interface_ips
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(interface, ["10.0.1.23", "2600:1f14:abc:de00::17"]);
    assert_eq!(instance.private_ips.len(), 2);
}

#[test]
fn a_batchs_answer_gives_each_instance_under_its_own_id() {
    // Two reservations, the second a terminated instance of another ID.
    let inner = |xml: &str| {
        let start = xml.find("<reservationSet>").expect("set") + "<reservationSet>".len();
        let end = xml.find("</reservationSet>").expect("set end");
        xml[start..end].to_string()
    };
    let other = "i-0123456789abcdef0";
    let both = RUNNING.replace(
        "</reservationSet>",
        &format!("{}</reservationSet>", inner(&TERMINATED.replace(ID, other))),
    );
    let found = parse_instances(both.as_bytes()).expect("parses");
    let ids: Vec<&str> = found.iter().map(|i| i.instance_id.as_str()).collect();
    assert_eq!(ids, [ID, other]);
    assert_eq!(found[0].state, InstanceState::Running);
    assert_eq!(found[1].state, InstanceState::Terminated);
    assert_eq!(
        parse_describe(both.as_bytes(), other).expect("parses"),
        Some(found[1].clone())
    );
    // One instance that cannot be read fails the answer: the batch is then
    // asked again one instance at a time (`ec2::batch`).
    let broken = both.replace("<name>terminated</name>", "");
    assert!(matches!(
        parse_instances(broken.as_bytes()),
        Err(LookupError::Malformed(_))
    ));
}
