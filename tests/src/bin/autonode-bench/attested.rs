//! Attested joins beside plain ones, interleaved on one server: what a
//! NitroTPM proof adds to a join (the challenge's round trip, the
//! document's verification) in latency and in the server's CPU. The
//! document itself is made by the bench with the test Nitro PKI, untimed:
//! on EC2 the NitroTPM makes it, off the server.

use crate::measure::{cpu_seconds, ms, percentile, round};
use crate::options::WARMUP;
use anyhow::Result;
use autonode_tests::callers::joiner::{honest_request, NodeKeys};
use autonode_tests::cloud::fakecloud::nitro::TestNitroPki;
use autonode_tests::server::attestation::{evidence, good_pcrs, server_flags, v2, CLASS};
use autonode_tests::server::world::World;
use serde_json::{Map, Value};
use std::time::{Duration, Instant};

/// One kind of join's figures: latencies and the server's CPU spent.
#[derive(Default)]
struct Kind {
    latencies: Vec<Duration>,
    cpu_seconds: f64,
}

/// `n` plain joins (`/v1`, a class that need not attest) and `n` attested
/// ones (challenge, then `/v2` with a document), one of each in turn.
pub(crate) async fn attested(n: usize, results: &mut Map<String, Value>) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = TestNitroPki::generate()?;
    let world = World::start_with(&server_flags(dir.path(), &pki)?).await?;
    let server = world.server.pid();
    let (mut plain, mut attested) = (Kind::default(), Kind::default());
    for round_no in 0..WARMUP + n {
        let timed = round_no >= WARMUP;
        let (_, instance) = world.launch_in("default", Value::Null, |i| i).await?;
        let request = honest_request(&instance, world.cloud.ca(), &NodeKeys::generate()?)?;
        let (cpu, started) = (cpu_seconds(server)?, Instant::now());
        world.joiner.join(&request).await?.granted();
        record(
            &mut plain,
            timed,
            started.elapsed(),
            cpu_seconds(server)? - cpu,
        );

        let (_, instance) = world.launch_in(CLASS, Value::Null, |i| i).await?;
        let keys = NodeKeys::generate()?;
        let request = honest_request(&instance, world.cloud.ca(), &keys)?;
        let (cpu, started) = (cpu_seconds(server)?, Instant::now());
        let nonce = world.joiner.challenge().await?;
        let challenged = started.elapsed();
        // The NitroTPM's part: not the server's, not timed.
        let proof = evidence(&pki, &instance.instance_id, &good_pcrs(), &nonce, &keys)?;
        let (cpu_mid, resumed) = (cpu_seconds(server)?, Instant::now());
        world.joiner.join_v2(&v2(request, proof)).await?.granted();
        let spent = (cpu_mid - cpu) + (cpu_seconds(server)? - cpu_mid);
        record(&mut attested, timed, challenged + resumed.elapsed(), spent);
    }
    let summary = |kind: &Kind| {
        let p = |q| round(ms(percentile(&kind.latencies, q)), 2);
        let cpu_ms = round(
            kind.cpu_seconds * 1000.0 / kind.latencies.len().max(1) as f64,
            2,
        );
        (p(0.5), p(0.9), cpu_ms)
    };
    let (plain_p50, plain_p90, plain_cpu) = summary(&plain);
    let (att_p50, att_p90, att_cpu) = summary(&attested);
    eprintln!(
        "attested joins: p50 {att_p50} ms (p90 {att_p90}), server CPU {att_cpu} ms a join; \
         plain: p50 {plain_p50} ms (p90 {plain_p90}), {plain_cpu} ms; {n} of each, interleaved"
    );
    let figures = [
        ("attested_join_p50_ms", att_p50),
        ("attested_join_p90_ms", att_p90),
        ("attested_server_cpu_ms", att_cpu),
        ("plain_join_p50_ms", plain_p50),
        ("plain_join_p90_ms", plain_p90),
        ("plain_server_cpu_ms", plain_cpu),
        (
            "attested_over_plain_p50",
            round(att_p50 / plain_p50.max(f64::MIN_POSITIVE), 3),
        ),
    ];
    for (key, value) in figures {
        results.insert(key.into(), value.into());
    }
    results.insert("attested_joins".into(), n.into());
    Ok(())
}

fn record(kind: &mut Kind, timed: bool, latency: Duration, cpu_seconds: f64) {
    if timed {
        kind.latencies.push(latency);
        kind.cpu_seconds += cpu_seconds;
    }
}
