//! The join API under load and abuse: a concurrency cap answered with 503
//! and Retry-After, oversized and malformed bodies refused, other joins
//! unaffected.

use anyhow::Result;
use autonode_shared::protocol::JOIN_PATH;
use autonode_tests::callers::joiner::{self, Answer, NodeKeys};
use autonode_tests::server::world::World;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_cap_joins_are_told_to_retry_and_then_succeed() -> Result<()> {
    // One source's cap off: this is about the global one (429s from the
    // per-source cap are `hostile`'s).
    let world = World::start_with(&[
        "--max-concurrent-joins=1".into(),
        "--max-joins-per-source=0".into(),
    ])
    .await?;
    let mut requests = Vec::new();
    for _ in 0..12 {
        let (_, instance) = world.launch(|i| i).await?;
        requests.push(joiner::honest_request(
            &instance,
            world.cloud.ca(),
            &NodeKeys::generate()?,
        )?);
    }
    let joins = requests.into_iter().map(|request| {
        let joiner = world.joiner.clone();
        tokio::spawn(async move {
            let mut busy = 0;
            loop {
                match joiner.join(&request).await? {
                    Answer::Refused(503, _) if busy < 200 => {
                        busy += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    answer => return anyhow::Ok((answer, busy)),
                }
            }
        })
    });
    let mut told_to_retry = 0;
    for join in futures::future::join_all(joins).await {
        let (answer, busy) = join??;
        assert_eq!(answer.status(), 200, "{answer:?}");
        told_to_retry += busy;
    }
    assert!(
        told_to_retry > 0,
        "twelve joins at once never met the cap of one"
    );
    Ok(())
}

#[tokio::test]
async fn oversized_and_malformed_bodies_are_refused() -> Result<()> {
    let world = World::start().await?;
    // The server answers 413 and closes while the client is still sending;
    // the peer's reset may then reach the client before the 413 does. Both
    // are a refusal; what matters is that nothing past the limit is read.
    match world.joiner.post(JOIN_PATH, vec![b'{'; 256 * 1024]).await {
        Ok((status, _)) => assert_eq!(status, 413),
        // Had the server read it all, it would answer 400 (not JSON).
        Err(e) => eprintln!("connection cut while sending: {e:#}"),
    }
    let (status, body) = world
        .joiner
        .post(JOIN_PATH, b"{\"identity\":{}}".to_vec())
        .await?;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    let (status, _) = world.joiner.post("/v1/nothing", b"{}".to_vec()).await?;
    assert_eq!(status, 404);

    // The server still serves an honest join.
    let (_, instance) = world.launch(|i| i).await?;
    let request = joiner::honest_request(&instance, world.cloud.ca(), &NodeKeys::generate()?)?;
    world.joiner.join(&request).await?.granted();
    Ok(())
}
