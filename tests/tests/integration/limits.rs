//! The join API under load and abuse: a concurrency cap whose joins wait
//! their turn, up to the queue's wait, then are answered 503 and
//! Retry-After; oversized and malformed bodies refused, other joins
//! unaffected.

use anyhow::Result;
use autonode_shared::protocol::JOIN_PATH;
use autonode_tests::callers::joiner::{self, Answer, NodeKeys};
use autonode_tests::server::world::World;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_cap_joins_are_told_to_retry_and_then_succeed() -> Result<()> {
    // No queue: the cap answers 503.
    let told_to_retry = twelve_at_once_under_a_cap_of_one("--join-queue-wait=0").await?;
    assert!(
        told_to_retry > 0,
        "twelve joins at once never met the cap of one"
    );
    Ok(())
}

/// With the queue (its default wait), twelve joins at once under a cap of
/// one wait their turn: all granted, none told 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_cap_joins_wait_their_turn() -> Result<()> {
    let told_to_retry = twelve_at_once_under_a_cap_of_one("--join-queue-wait=10").await?;
    assert_eq!(told_to_retry, 0, "a join was told 503 while it could wait");
    Ok(())
}

/// A join waits for a place no longer than `--join-queue-wait`: behind a
/// join that holds the only place (its instance has no NodeClaim yet, so
/// it waits out the 3 s NodeClaim grace), an honest join is answered 503
/// (and retries), not held until the place frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_waits_for_a_place_no_longer_than_the_queue_wait() -> Result<()> {
    let world = World::start_with(&[
        "--max-concurrent-joins=1".into(),
        "--max-joins-per-source=0".into(),
        "--join-queue-wait=1".into(),
    ])
    .await?;
    let unclaimed = world.cloud.launch(
        autonode_tests::cloud::fakecloud::Instance::builder()
            .account_id(autonode_tests::server::world::ACCOUNT)
            .region(autonode_tests::server::world::REGION)
            .build(),
    );
    let holder = joiner::honest_request(&unclaimed, world.cloud.ca(), &NodeKeys::generate()?)?;
    let (_, instance) = world.launch(|i| i).await?;
    let honest = joiner::honest_request(&instance, world.cloud.ca(), &NodeKeys::generate()?)?;
    let holding = tokio::spawn({
        let joiner = world.joiner.clone();
        async move { joiner.join(&holder).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    match world.joiner.join(&honest).await? {
        Answer::Refused(503, _) => {}
        other => panic!("behind a held place past the queue's wait: {other:?}"),
    }
    let held = holding.await??;
    assert_eq!(held.status(), 403, "no NodeClaim after the grace: {held:?}");
    // Its turn comes once the place is free.
    assert_eq!(world.joiner.join(&honest).await?.status(), 200);
    Ok(())
}

/// Twelve honest joins at once under `--max-concurrent-joins=1` and
/// `queue_wait` (one source's cap off: this is about the global one; 429s
/// from the per-source cap are `hostile`'s), each retrying 503 after 50
/// ms: all granted, and the 503s they met.
async fn twelve_at_once_under_a_cap_of_one(queue_wait: &str) -> Result<u32> {
    let world = World::start_with(&[
        "--max-concurrent-joins=1".into(),
        "--max-joins-per-source=0".into(),
        queue_wait.into(),
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
    Ok(told_to_retry)
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
