//! The agent's IMDSv2 client against the fake cloud's IMDS: absent, late,
//! failing, token expiry, and userData in its binary (gzip) form; and the
//! agent binary finding IMDS over IPv6 and stopping when IMDS is turned off.

use autonode_agent::config::{document_from_user_data, Config};
use autonode_agent::imds::{Imds, ImdsError};
use autonode_agent::retry::Deadline;
use autonode_tests::cloud::fakecloud::{imds, BoundSocket, FakeCloud, Faults, Instance};
use autonode_tests::machines::barenode::{BareNode, ImdsAt};
use hyper::StatusCode;
use std::io::Write as _;
use std::time::{Duration, Instant};

const CONFIG: &str = "server-url = \"https://10.0.0.1:8443\"\n\
    server-ca-sha256 = \"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"\n\
    cluster-name = \"test\"\n";

fn instance(user_data: &[u8]) -> (FakeCloud, Instance) {
    let cloud = FakeCloud::new().expect("fake cloud");
    let instance = cloud.launch(Instance::builder().user_data(user_data.to_vec()).build());
    (cloud, instance)
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_identity_and_gzip_user_data() {
    let (cloud, instance) = instance(&gzip(CONFIG.as_bytes()));
    let fake = cloud.start_imds(&instance).unwrap();
    let client = Imds::new(&fake.url(), Deadline::after(Duration::from_secs(20))).unwrap();
    let identity = client.identity().await.unwrap();
    assert_eq!(identity.provider_id(), instance.provider_id());
    assert_eq!(identity.rsa2048, fake.rsa2048().trim());
    assert_eq!(identity.local_hostname, instance.local_hostname);
    assert_eq!(
        identity.ips,
        vec![std::net::IpAddr::V4(instance.private_ip)]
    );
    // The binary (gzip) body is why the agent has its own IMDS client.
    let raw = client.get("/latest/user-data").await.unwrap().unwrap();
    let config = Config::resolve(document_from_user_data(&raw).unwrap()).unwrap();
    assert_eq!(config.cluster_name, "test");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_user_data_is_none() {
    let (cloud, instance) = instance(b"");
    let fake = cloud.start_imds(&instance).unwrap();
    let client = Imds::new(&fake.url(), Deadline::after(Duration::from_secs(20))).unwrap();
    assert_eq!(client.get("/latest/user-data").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absent_imds_gives_up_by_the_deadline() {
    let (cloud, instance) = instance(CONFIG.as_bytes());
    // Bound but not listening for longer than the test: connection refused.
    let socket = BoundSocket::loopback().unwrap();
    let fake = imds::Imds::start_on(
        socket,
        &instance,
        cloud.ca(),
        Some(Duration::from_secs(600)),
    )
    .unwrap();
    let client = Imds::new(&fake.url(), Deadline::after(Duration::from_secs(2))).unwrap();
    let started = Instant::now();
    let err = client.identity().await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, ImdsError::GaveUp { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&fake.url()) && text.contains("by the deadline"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_imds_succeeds() {
    let (cloud, instance) = instance(CONFIG.as_bytes());
    let socket = BoundSocket::loopback().unwrap();
    let fake =
        imds::Imds::start_on(socket, &instance, cloud.ca(), Some(Duration::from_secs(2))).unwrap();
    let client = Imds::new(&fake.url(), Deadline::after(Duration::from_secs(30))).unwrap();
    let started = Instant::now();
    let identity = client.identity().await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(identity.document.instance_id, instance.instance_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried() {
    let (cloud, instance) = instance(CONFIG.as_bytes());
    let fake = cloud.start_imds(&instance).unwrap();
    let faults: &Faults = fake.faults();
    faults.fail_next(4, StatusCode::SERVICE_UNAVAILABLE);
    let client = Imds::new(&fake.url(), Deadline::after(Duration::from_secs(30))).unwrap();
    let raw = client.get("/latest/user-data").await.unwrap().unwrap();
    assert_eq!(raw, CONFIG.as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_imds_is_retried_until_it_answers() {
    let (cloud, instance) = instance(CONFIG.as_bytes());
    let fake = cloud.start_imds(&instance).unwrap();
    // Slower than one try's timeout: attempts time out until IMDS recovers.
    fake.faults().set_delay(Duration::from_secs(10));
    let client = Imds::new(&fake.url(), Deadline::after(Duration::from_secs(30))).unwrap();
    let recover = {
        let faults = fake.faults().clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            faults.clear();
        })
    };
    let raw = client.get("/latest/user-data").await.unwrap().unwrap();
    assert_eq!(raw, CONFIG.as_bytes());
    recover.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_expiry_mid_run_recovers() {
    let (cloud, instance) = instance(CONFIG.as_bytes());
    let fake = cloud.start_imds(&instance).unwrap();
    let client = Imds::new(&fake.url(), Deadline::after(Duration::from_secs(30))).unwrap();
    assert!(client.get("/latest/user-data").await.unwrap().is_some());
    // Every token issued so far is now invalid: the next GET gets 401, and
    // the client must fetch a new token rather than fail or loop.
    fake.invalidate_tokens();
    let identity = client.identity().await.unwrap();
    assert_eq!(identity.document.instance_id, instance.instance_id);
}

/// The agent binary's config, with an unreachable server: each run ends
/// in the join phase (exit code 3) once IMDS has told it everything.
const UNREACHABLE_SERVER: &str = "server-url = \"https://10.0.0.1:8443\"\n\
    server-ca-sha256 = \"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"\n\
    cluster-name = \"test\"\n";

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// IMDS only at [fd00:ec2::254]: the default (IPv4) finds nothing; the
/// SDKs' mode variable or the local config's `imds-endpoint-mode` finds it,
/// and the config wins over the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reads_imds_over_ipv6_when_told() -> anyhow::Result<()> {
    let node = BareNode::boot(UNREACHABLE_SERVER, ImdsAt::V6)?;
    node.write_local_config("[options]\ndeadline = \"3s\"\n")?;
    let run = node.run_agent(&[], &[]).await?;
    let text = stderr(&run);
    assert_eq!(run.status.code(), Some(3), "{text}");
    assert!(
        text.contains("IMDS at http://169.254.169.254/ did not answer"),
        "{text}"
    );
    assert_eq!(node.imds.tokens_issued(), 0);

    let mode = [("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "ipv6")];
    let run = node.run_agent(&mode, &[]).await?;
    let text = stderr(&run);
    assert_eq!(run.status.code(), Some(3), "{text}");
    assert!(
        text.contains(
            "IMDS endpoint http://[fd00:ec2::254] (from AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE)"
        ),
        "{text}"
    );
    assert!(text.contains("phase=identity succeeded"), "{text}");
    let after_env = node.imds.tokens_issued();
    assert!(after_env >= 1);

    node.write_local_config("[options]\ndeadline = \"3s\"\nimds-endpoint-mode = \"IPv6\"\n")?;
    let run = node
        .run_agent(&[("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "IPv4")], &[])
        .await?;
    let text = stderr(&run);
    assert_eq!(run.status.code(), Some(3), "{text}");
    assert!(
        text.contains("(from [options] imds-endpoint-mode)")
            && text.contains("phase=identity succeeded"),
        "{text}"
    );
    assert!(node.imds.tokens_issued() > after_env);
    Ok(())
}

/// IMDS turned off answers 403 to everything: a config error at once, with
/// what to change, instead of ten minutes of retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turned_off_imds_is_a_config_error_at_once() -> anyhow::Result<()> {
    let node = BareNode::boot(UNREACHABLE_SERVER, ImdsAt::V4)?;
    node.write_local_config("[options]\ndeadline = \"60s\"\n")?;
    node.imds
        .faults()
        .fail_next(u32::MAX, StatusCode::FORBIDDEN);
    let started = Instant::now();
    let run = node.run_agent(&[], &[]).await?;
    let text = stderr(&run);
    assert_eq!(run.status.code(), Some(4), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let console = node.console();
    for place in [&text, &console] {
        assert!(
            place.contains("IMDS is turned off for this instance")
                && place.contains("spec.metadataOptions.httpEndpoint: enabled"),
            "{place}"
        );
    }
    Ok(())
}
