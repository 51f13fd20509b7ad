//! The server's EC2 client against the fake EC2: real SigV4, AWS's XML and
//! error codes, injected faults.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use autonode_server::ec2::{
    Batched, Credentials, Ec2Client, Ec2Settings, InstanceLookup, InstanceState, LookupError,
    LookupRetries, DEFAULT_CALLS_PER_SECOND, MAX_IDS,
};
use autonode_tests::cloud::fakecloud::{
    self, BoundSocket, Ec2, FakeCloud, Instance, TestCa, TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY,
};
use hyper::StatusCode;

const REGION: &str = "us-west-2";

/// EC2 lookups never touch the CA, but a cloud needs one; make it once.
fn cloud() -> FakeCloud {
    static CA: OnceLock<Arc<TestCa>> = OnceLock::new();
    FakeCloud::with_ca(Arc::clone(
        CA.get_or_init(|| Arc::new(TestCa::generate().expect("test CA"))),
    ))
}

fn test_credentials() -> Credentials {
    Credentials::new(
        TEST_ACCESS_KEY_ID,
        TEST_SECRET_ACCESS_KEY,
        None,
        None,
        "autonode-tests",
    )
}

/// Quick retries, so fault tests stay fast.
fn settings(ec2: &Ec2, attempts: u32) -> Ec2Settings {
    Ec2Settings {
        endpoint: Some(ec2.url()),
        timeout: Duration::from_secs(5),
        retry: LookupRetries {
            attempts,
            base: Duration::from_millis(20),
            cap: Duration::from_millis(100),
        },
    }
}

fn client(ec2: &Ec2, attempts: u32) -> Ec2Client {
    Ec2Client::with_credentials(settings(ec2, attempts), test_credentials()).expect("client")
}

#[tokio::test]
async fn running_instance_with_its_names_and_addresses() {
    let cloud = cloud();
    let launched = cloud.launch(
        Instance::builder()
            .private_ip(Ipv4Addr::new(10, 0, 1, 23))
            .architecture("arm64")
            .tag("karpenter.sh/nodeclaim", "default-x7k2p")
            .build(),
    );
    let ec2 = cloud.start_ec2(REGION).expect("start EC2");
    // Through the trait object, as the join path holds it.
    let lookup: Arc<dyn InstanceLookup> = Arc::new(client(&ec2, 1));
    let found = lookup
        .describe_instance(REGION, &launched.instance_id)
        .await
        .expect("found");
    assert_eq!(found.instance_id, launched.instance_id);
    assert_eq!(found.state, InstanceState::Running);
    assert!(found.state.is_live());
    assert_eq!(found.image_id, launched.image_id);
    assert_eq!(found.instance_type, "m5.large");
    assert_eq!(found.availability_zone, "us-west-2a");
    assert_eq!(found.architecture, "arm64");
    assert_eq!(
        found.private_dns_name,
        "ip-10-0-1-23.us-west-2.compute.internal"
    );
    assert_eq!(found.private_ips, [IpAddr::from([10, 0, 1, 23])]);
    assert_eq!(found.tags["karpenter.sh/nodeclaim"], "default-x7k2p");
}

#[tokio::test]
async fn pending_instance_is_live() {
    let cloud = cloud();
    let launched = cloud.launch(
        Instance::builder()
            .state(fakecloud::InstanceState::Pending)
            .build(),
    );
    let ec2 = cloud.start_ec2(REGION).expect("start EC2");
    let found = client(&ec2, 1)
        .describe(REGION, &launched.instance_id)
        .await
        .expect("found");
    assert_eq!(found.state, InstanceState::Pending);
    assert!(found.state.is_live());
    assert_eq!(found.private_dns_name, launched.private_dns_name);
}

#[tokio::test]
async fn terminated_instance_is_not_live() {
    let cloud = cloud();
    let launched = cloud.launch(Instance::builder().build());
    let ec2 = cloud.start_ec2(REGION).expect("start EC2");
    cloud.terminate(&launched.instance_id);
    let found = client(&ec2, 1)
        .describe(REGION, &launched.instance_id)
        .await
        .expect("found");
    assert_eq!(found.state, InstanceState::Terminated);
    assert!(!found.state.is_live());
    assert!(found.private_dns_name.is_empty() && found.private_ips.is_empty());
}

#[tokio::test]
async fn unknown_instances_are_not_found() {
    let cloud = cloud();
    let elsewhere = cloud.launch(Instance::builder().region("eu-west-1").build());
    let ec2 = cloud.start_ec2(REGION).expect("start EC2");
    let client = client(&ec2, 3);
    for id in [fakecloud::aws_id("i"), elsewhere.instance_id] {
        match client.describe(REGION, &id).await {
            Err(LookupError::NotFound { instance_id }) => assert_eq!(instance_id, id),
            other => panic!("{id}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn malformed_ids_are_refused_before_any_request() {
    let cloud = cloud();
    let launched = cloud.launch(Instance::builder().build());
    let ec2 = cloud.start_ec2(REGION).expect("start EC2");
    let client = client(&ec2, 1);
    // One failure is armed: whichever request comes first gets it.
    ec2.faults().fail_next(1, StatusCode::INTERNAL_SERVER_ERROR);
    for bad in [
        "i-XYZ",
        "i-0123456789ABCDEF0",
        "",
        "i-1234abcd&Action=RunInstances",
    ] {
        let error = client.describe(REGION, bad).await.expect_err(bad);
        assert!(
            matches!(error, LookupError::NotFound { .. }),
            "{bad}: {error}"
        );
    }
    // So the first real request is the first to reach EC2.
    let first = client.describe(REGION, &launched.instance_id).await;
    assert!(
        matches!(first, Err(LookupError::Unavailable(_))),
        "{first:?}"
    );
    client
        .describe(REGION, &launched.instance_id)
        .await
        .expect("found");
}

#[tokio::test]
async fn server_errors_are_retried() {
    let cloud = cloud();
    let launched = cloud.launch(Instance::builder().build());
    let ec2 = cloud.start_ec2(REGION).expect("start EC2");
    let client = client(&ec2, 3);
    ec2.faults().fail_next(1, StatusCode::INTERNAL_SERVER_ERROR);
    client
        .describe(REGION, &launched.instance_id)
        .await
        .expect("found on the second try");
    ec2.faults().fail_next(2, StatusCode::SERVICE_UNAVAILABLE);
    client
        .describe(REGION, &launched.instance_id)
        .await
        .expect("found on the third try");
}

#[tokio::test]
async fn retries_stop_after_the_policy_s_attempts() {
    let cloud = cloud();
    let launched = cloud.launch(Instance::builder().build());
    let ec2 = cloud.start_ec2(REGION).expect("start EC2");
    let client = client(&ec2, 3);
    ec2.faults().fail_next(3, StatusCode::SERVICE_UNAVAILABLE);
    let error = client
        .describe(REGION, &launched.instance_id)
        .await
        .expect_err("3 failures");
    assert!(
        matches!(error, LookupError::Unavailable(ref m) if m.contains("Unavailable")),
        "{error}"
    );
    assert!(error.is_transient());
    // Exactly three were used: the next lookup gets through at once.
    client
        .describe(REGION, &launched.instance_id)
        .await
        .expect("found");
}

#[tokio::test]
async fn a_late_endpoint_is_waited_for() {
    let cloud = cloud();
    let launched = cloud.launch(Instance::builder().build());
    let late = Duration::from_millis(150);
    let ec2 = Ec2::start_on(
        BoundSocket::loopback().expect("bind"),
        &cloud,
        REGION,
        Some(late),
    )
    .expect("start EC2");
    // Connections are refused until it listens; backoff outlasts that.
    let client = client(&ec2, 6);
    client
        .describe(REGION, &launched.instance_id)
        .await
        .expect("found once listening");
}

#[tokio::test]
async fn slow_answers_time_out() {
    let cloud = cloud();
    let launched = cloud.launch(Instance::builder().build());
    let ec2 = cloud.start_ec2(REGION).expect("start EC2");
    ec2.faults().set_delay(Duration::from_secs(2));
    let settings = Ec2Settings {
        timeout: Duration::from_millis(200),
        ..settings(&ec2, 2)
    };
    let client = Ec2Client::with_credentials(settings, test_credentials()).expect("client");
    let started = Instant::now();
    let error = client
        .describe(REGION, &launched.instance_id)
        .await
        .expect_err("too slow");
    assert!(matches!(error, LookupError::Unavailable(_)), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn refused_credentials_are_denied_without_retry() {
    let cloud = cloud();
    let launched = cloud.launch(Instance::builder().build());
    let ec2 = cloud.start_ec2(REGION).expect("start EC2");
    let cases = [
        Credentials::new("AKIAUNKNOWN", TEST_SECRET_ACCESS_KEY, None, None, "test"),
        Credentials::new(TEST_ACCESS_KEY_ID, "not-the-secret", None, None, "test"),
    ];
    for credentials in cases {
        let client = Ec2Client::with_credentials(settings(&ec2, 3), credentials).expect("client");
        let error = client
            .describe(REGION, &launched.instance_id)
            .await
            .expect_err("denied");
        assert!(matches!(error, LookupError::Denied(_)), "{error}");
        assert!(!error.is_transient());
        assert_eq!(error.reason(), "denied");
    }
    // Signed for another region than the endpoint's: EC2 refuses it too.
    let client = client(&ec2, 1);
    let error = client
        .describe("eu-west-1", &launched.instance_id)
        .await
        .expect_err("wrong scope");
    assert!(
        matches!(error, LookupError::Denied(ref m) if m.contains("SignatureDoesNotMatch")),
        "{error}"
    );
}

/// The default chain's first link: credentials from the environment.
/// nextest runs each test in a process of its own, so setting the
/// environment here is seen by this test alone.
#[tokio::test]
async fn default_chain_takes_credentials_from_the_environment() {
    let cloud = cloud();
    let launched = cloud.launch(Instance::builder().build());
    let ec2 = cloud.start_ec2(REGION).expect("start EC2");
    for (name, value) in [
        ("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY_ID),
        ("AWS_SECRET_ACCESS_KEY", TEST_SECRET_ACCESS_KEY),
        ("AWS_REGION", REGION),
        // Never reach for a real instance metadata service from a test.
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ] {
        std::env::set_var(name, value);
    }
    let client = Ec2Client::new(settings(&ec2, 1)).await.expect("client");
    client
        .describe(REGION, &launched.instance_id)
        .await
        .expect("found");
}

/// Lookups made at once are asked in few calls (`ec2::Batched`, as the
/// server holds its client), each answered with its own instance; an ID
/// EC2 does not know, which fails a whole call, costs only its own lookup
/// (its batch is asked again one instance at a time).
#[tokio::test]
async fn lookups_at_once_share_calls_and_get_their_own_answers() {
    let cloud = cloud();
    let launched: Vec<Instance> = (0..120)
        .map(|_| cloud.launch(Instance::builder().build()))
        .collect();
    let ec2 = cloud.start_ec2(REGION).expect("start EC2");
    let lookup: Arc<dyn InstanceLookup> = Arc::new(Batched::new(
        Arc::new(client(&ec2, 1)),
        DEFAULT_CALLS_PER_SECOND,
    ));
    let unknown = fakecloud::aws_id("i");
    let asked: Vec<String> = launched
        .iter()
        .map(|i| i.instance_id.clone())
        .chain([unknown.clone()])
        .collect();
    let answers = futures::future::join_all(asked.iter().map(|id| {
        let lookup = lookup.clone();
        async move { (id, lookup.describe_instance(REGION, id).await) }
    }))
    .await;
    for (id, answer) in answers {
        match answer {
            Ok(found) => assert_eq!(&found.instance_id, id),
            Err(LookupError::NotFound { instance_id }) => {
                assert_eq!((id, &instance_id), (&unknown, &unknown))
            }
            Err(other) => panic!("{id}: {other}"),
        }
    }
    // 121 lookups: at most a few calls of up to MAX_IDS, plus, for the
    // batch that held the unknown ID, its instances alone.
    let calls = ec2.calls() as usize;
    assert!(
        calls <= 121 / MAX_IDS + 1 + 1 + MAX_IDS,
        "{calls} calls for 121 lookups"
    );
    assert!(calls < 121 / 2, "{calls} calls for 121 lookups");
}
