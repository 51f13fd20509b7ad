use super::sigv4::{canonical_request, sign_v4};
use super::*;
use crate::cloud::fakecloud::http::testing::{send, Answer};
use crate::cloud::fakecloud::iso_seconds;
use crate::cloud::fakecloud::signer::tests::shared_ca;
use time::OffsetDateTime;

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
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
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
