//! Staying up under hostile load: a flood of refused joins costs a bounded
//! number of Event writes, and what requests carry cannot forge log lines
//! or Event lines.

use crate::feedback::{join, metrics, post_report};
use anyhow::{bail, ensure, Context, Result};
use autonode_shared::protocol::{Outcome, Phase};
use autonode_tests::callers::joiner::{self, Answer, NodeKeys};
use autonode_tests::harness::poll::{self, Seen};
use autonode_tests::server::refusal_line_budget;
use autonode_tests::server::world::World;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use std::time::Duration;

/// Replayed joins in the flood.
const FLOOD: usize = 200;
/// The server's Event bucket per object (`events::BURST`).
const BURST: i32 = 25;
/// Distinct messages of one kind before they are combined
/// (`events::MAX_SIMILAR`).
const MAX_SIMILAR: i32 = 10;

/// Someone holding a bound instance's identity document sends joins with
/// keys of their own, as fast as they are answered. Each is refused and
/// counted, but the NodeClaim gets 9 PossibleReplay Events apart (each
/// note carries its request id) and then one combined Event, and the
/// writes stop at the object's burst: the combined Event's count is what
/// the burst admitted, the rest is counted as rate limited. Nor is the
/// flood a log flood: warn lines stay within the reason's budget.
#[tokio::test]
async fn a_refused_join_flood_writes_a_bounded_number_of_events() -> Result<()> {
    let world = World::start().await?;
    let started = std::time::Instant::now();
    let (claim, instance) = world.launch(|i| i).await?;
    join(&world, &instance).await?; // Attested: the bucket's first write
    for i in 0..FLOOD {
        let keys = NodeKeys::generate()?;
        let request = joiner::honest_request(&instance, world.cloud.ca(), &keys)?;
        let answer = world.joiner.join(&request).await?;
        ensure!(
            matches!(answer, Answer::Refused(403, _)),
            "replay {i} was answered {answer:?}"
        );
    }

    // The burst after Attested: 9 Events apart, then the combined one
    // created and updated until the burst is spent.
    let apart = MAX_SIMILAR - 1;
    let combined_count = BURST - 1 - apart;
    let events = settled_replay_events(&world, &claim, combined_count).await?;
    ensure!(
        events.len() == MAX_SIMILAR as usize,
        "{} PossibleReplay Events: {events:#?}",
        events.len()
    );
    let (combined, singles): (Vec<&Event>, Vec<&Event>) = events
        .iter()
        .partition(|e| note(e).starts_with("(combined from similar events): "));
    ensure!(combined.len() == 1, "one combined Event: {events:#?}");
    ensure!(
        singles.iter().all(|e| e.count == Some(1)),
        "the first ones each once: {singles:#?}"
    );
    ensure!(
        note(combined[0]).contains("possible replay"),
        "{:?}",
        combined[0]
    );

    let metrics = metrics(&world).await?;
    let refused =
        format!(r#"autonode_joins_total{{result="refused",reason="possible_replay"}} {FLOOD}"#);
    ensure!(
        metrics.contains(&refused),
        "every refusal counted: {metrics}"
    );
    let dropped = FLOOD as i32 - (BURST - 1);
    let dropped = format!(r#"autonode_events_dropped_total{{reason="rate_limited"}} {dropped}"#);
    ensure!(metrics.contains(&dropped), "{dropped} in: {metrics}");

    // Nor a log flood: warn lines within the reason's budget, the rest at
    // debug.
    let warned = world.server.warn_lines("join refused");
    let budget = refusal_line_budget(started, 1);
    ensure!(
        (1..=budget).contains(&warned),
        "{warned} warn lines for {FLOOD} refused joins (budget {budget})"
    );
    Ok(())
}

/// An agent (or anyone with the identity document, before the binding)
/// reports a message that carries a forged log line, terminal controls and
/// a line separator: the server's log has it on the report's own line,
/// escaped, and the Event shows it escaped too.
#[tokio::test]
async fn a_report_cannot_forge_log_lines() -> Result<()> {
    let world = World::start().await?;
    let (claim, instance) = world.launch(|i| i).await?;
    let forged = "2026-05-01T00:00:00.000000Z  INFO autonode_server::join: \
                  request_id=\"forged-7c1e\" nodeclaim=\"x\" result=\"joined\" join granted";
    let message = format!("kubelet failed\n{forged}\r\n\u{1b}[2K\u{2028}\u{85}the end");
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let rsa2048 = joiner::identity(&instance, world.cloud.ca())?.rsa2048;
    let report = autonode_agent::report::build(
        &rsa2048,
        Phase::Apply,
        Outcome::Retrying,
        &message,
        now,
        None,
    );
    let (status, body) = post_report(&world, &report).await?;
    ensure!(status == 202, "the report was answered {status}: {body}");

    let log = world.server.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("forged-7c1e")).collect();
    let [line] = lines.as_slice() else {
        bail!("expected the payload on one log line, found {lines:#?}");
    };
    ensure!(line.contains("agent report"), "{line}");
    ensure!(
        !log.contains("join granted\r") && !log.lines().any(|l| l.ends_with("join granted")),
        "a forged line: {log}"
    );
    let escaped = r"kubelet failed\n2026-05-01T00:00:00.000000Z  INFO";
    ensure!(line.contains(escaped), "{line}");
    ensure!(line.contains(r"\r\n\x1b[2K\u{2028}\u{85}the end"), "{line}");
    ensure!(
        !log.contains('\u{2028}') && !log.contains("\u{1b}[2K"),
        "raw controls in the log"
    );

    world.event_reasons(&claim, "AgentRetrying").await?;
    let api: Api<Event> = Api::namespaced(world.cp.admin().await?, "default");
    let selector = format!("involvedObject.name={claim},reason=AgentRetrying");
    let events = api.list(&ListParams::default().fields(&selector)).await?;
    let shown: Vec<&str> = events.items.iter().map(note).collect();
    ensure!(
        shown
            .iter()
            .all(|m| !m.contains(['\n', '\r', '\u{1b}', '\u{2028}']) && m.contains(escaped)),
        "{shown:?}"
    );
    Ok(())
}

fn note(event: &Event) -> &str {
    event.message.as_deref().unwrap_or_default()
}

/// The PossibleReplay Events on `claim`, once the combined one's count
/// has reached `count` (writes are in the background) and stayed there.
async fn settled_replay_events(world: &World, claim: &str, count: i32) -> Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(world.cp.admin().await?, "default");
    let selector = format!("involvedObject.name={claim},reason=PossibleReplay");
    // The Events and the combined one's count.
    let listed = || async {
        let events = api
            .list(&ListParams::default().fields(&selector))
            .await
            .context("listing Events")?
            .items;
        anyhow::Ok((events.iter().filter_map(|e| e.count).max(), events))
    };
    poll::until(
        &format!("PossibleReplay Event counting {count}"),
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let (top, events) = listed().await?;
            Ok(Seen(
                (top.unwrap_or(0) >= count).then_some(()),
                format!("{events:#?}"),
            ))
        },
    )
    .await?;
    // Anything still queued would show now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (top, events) = listed().await?;
    ensure!(
        top == Some(count),
        "the combined Event's count is {top:?}, not {count}: {events:#?}"
    );
    Ok(events)
}
