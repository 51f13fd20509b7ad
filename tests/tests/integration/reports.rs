//! Agent reports as an attack surface: whoever reads an instance's identity
//! document (any process on it, forever) must not get its machine replaced
//! or marked failed, and a captured signed report must not work twice.

use crate::feedback::{join, metrics, post_report, report, send_report, wait_deleted};
use anyhow::{bail, ensure, Context, Result};
use autonode_shared::protocol::{Outcome, ReportRequest};
use autonode_tests::callers::joiner::NodeKeys;
use autonode_tests::cloud::fakecloud::Instance;
use autonode_tests::karpenter::standin;
use autonode_tests::server::refusal_line_budget;
use autonode_tests::server::world::{in_region, World};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use rcgen::KeyPair;

/// The server's `autonode.dev/bootstrap-failed` mark.
const FAILED_MARK: &str = "autonode.dev/bootstrap-failed";

/// Before the first join there is no bound key: a fatal report, unsigned or
/// signed by any key, is shown as an unverified Warning and changes nothing,
/// whether the server deletes failed NodeClaims or marks them. The machine
/// can still join afterwards.
#[tokio::test]
async fn a_fatal_report_before_the_binding_leaves_the_nodeclaim_alone() -> Result<()> {
    let world = World::start().await?;
    let (_marking, marking_joiner) = world
        .second_server(&["--delete-failed-nodeclaims=false".into()])
        .await?;
    let (claim, instance) = world.launch(|i| i).await?;
    let stranger = KeyPair::generate()?;

    send_report(&world, &instance, Outcome::Fatal, None).await?;
    send_report(&world, &instance, Outcome::Fatal, Some(&stranger)).await?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let unsigned = report(&world, &instance, Outcome::Fatal, now, None)?;
    let body = serde_json::to_vec(&unsigned)?;
    let (status, _) = marking_joiner
        .post(autonode_shared::protocol::REPORT_PATH, body)
        .await?;
    ensure!(status == 202, "the marking server answered {status}");

    // Each answer came after the handling: nothing was deleted or marked.
    let claims = standin::nodeclaims(&world.cp.admin().await?);
    let object = claims.get_opt(&claim).await?;
    let Some(object) = object.filter(|o| o.metadata.deletion_timestamp.is_none()) else {
        bail!("an unverified fatal report deleted NodeClaim {claim}");
    };
    let marked = object
        .metadata
        .annotations
        .is_some_and(|a| a.contains_key(FAILED_MARK));
    ensure!(!marked, "an unverified fatal report marked {claim} failed");

    let warnings = warning_messages(&world, &claim, "BootstrapFailed").await?;
    ensure!(
        warnings.iter().any(|m| m.contains("unverified")),
        "the Warning says the report is unverified: {warnings:?}"
    );
    let metrics = metrics(&world).await?;
    ensure!(
        metrics.contains("autonode_agent_reports_unverified_fatal_total 2"),
        "{metrics}"
    );
    // The machine is not harmed: its agent joins.
    join(&world, &instance).await?;
    Ok(())
}

/// A genuine, AWS-signed document of an instance outside the allowed
/// accounts or regions speaks for nothing here, even where a NodeClaim has
/// its providerID: its reports are refused by the join's own origin check
/// (`Policy::check_origin`) before any Event is written, while an allowed
/// instance's report beside them is accepted.
#[tokio::test]
async fn reports_from_an_account_or_region_not_allowed_are_refused() -> Result<()> {
    let world = World::start().await?;
    let (_, other_account) = world
        .launch(|i| Instance {
            account_id: "999999999999".into(),
            ..i
        })
        .await?;
    let (_, elsewhere) = world.launch(in_region("eu-west-1")).await?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    for outsider in [&other_account, &elsewhere] {
        let fatal = report(&world, outsider, Outcome::Fatal, now, None)?;
        let (status, body) = post_report(&world, &fatal).await?;
        ensure!(
            status == 403,
            "{}'s report was answered {status}: {body}",
            outsider.instance_id
        );
    }
    let (_, allowed) = world.launch(|i| i).await?;
    send_report(&world, &allowed, Outcome::Retrying, None).await?;

    let metrics = metrics(&world).await?;
    ensure!(
        metrics.contains(r#"autonode_agent_reports_refused_total{reason="not_allowed"} 2"#),
        "{metrics}"
    );
    Ok(())
}

/// A signed report is accepted once; the same bytes again are refused,
/// while a new report from the same key still gets through.
#[tokio::test]
async fn a_replayed_signed_report_is_refused() -> Result<()> {
    let world = World::start().await?;
    let machine = Joined::launch(&world).await?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let captured = machine.report(&world, Outcome::Retrying, now)?;

    let (first, body) = post_report(&world, &captured).await?;
    ensure!(first == 202, "the original was answered {first}: {body}");
    let (replayed, body) = post_report(&world, &captured).await?;
    ensure!(
        replayed == 403,
        "the replay was answered {replayed}: {body}"
    );
    let next = machine.report(&world, Outcome::Retrying, now + 1)?;
    let (status, body) = post_report(&world, &next).await?;
    ensure!(status == 202, "a new report was answered {status}: {body}");

    let metrics = metrics(&world).await?;
    ensure!(
        metrics.contains(r#"autonode_agent_reports_refused_total{reason="replayed"} 1"#),
        "{metrics}"
    );
    Ok(())
}

/// A signed fatal report written too long ago (or too far ahead) is
/// refused and deletes nothing; the same report written now does.
#[tokio::test]
async fn a_signed_report_outside_the_window_is_refused() -> Result<()> {
    let world = World::start().await?;
    let machine = Joined::launch(&world).await?;
    let (claim, now) = (
        &machine.claim,
        time::OffsetDateTime::now_utc().unix_timestamp(),
    );
    let claims = standin::nodeclaims(&world.cp.admin().await?);

    for (when, timestamp) in [("stale", now - 400), ("future", now + 400)] {
        let report = machine.report(&world, Outcome::Fatal, timestamp)?;
        let (status, body) = post_report(&world, &report).await?;
        ensure!(
            status == 403,
            "a {when} report was answered {status}: {body}"
        );
        ensure!(
            claims.get_opt(claim).await?.is_some(),
            "a {when} report deleted {claim}"
        );
    }
    let timely = machine.report(&world, Outcome::Fatal, now)?;
    let (status, body) = post_report(&world, &timely).await?;
    ensure!(
        status == 202,
        "a timely report was answered {status}: {body}"
    );
    wait_deleted(&claims, claim)
        .await
        .context("a timely signed fatal report")?;
    let metrics = metrics(&world).await?;
    ensure!(
        metrics.contains(r#"autonode_agent_reports_refused_total{reason="outside_window"} 2"#),
        "{metrics}"
    );
    Ok(())
}

/// One registered node floods signed reports, each new (its own timestamp)
/// and signed with its bound key. Against autonode before the per-instance
/// quota, each was accepted and remembered for its timestamp plus 300 s
/// (and the timestamp could be 300 s ahead): 100,000 of them filled the
/// replica's replay memory, and every other node's signed fatal report got
/// 503 and its NodeClaim stayed. Now the flooder is told 429 past its quota,
/// holds only its own slots, and another node's fatal report still
/// deletes its NodeClaim. A report dated two minutes ahead is refused: the
/// future skew is a minute, not the whole window.
#[tokio::test]
async fn one_nodes_flood_of_signed_reports_leaves_other_nodes_reports_working() -> Result<()> {
    let world = World::start().await?;
    let flooder = Joined::launch(&world).await?;
    let victim = Joined::launch(&world).await?;
    let claims = standin::nodeclaims(&world.cp.admin().await?);
    let now = time::OffsetDateTime::now_utc().unix_timestamp();

    let (mut accepted, mut turned_away) = (0, None);
    for age in 0..60 {
        let report = flooder.report(&world, Outcome::Retrying, now - age)?;
        match post_report(&world, &report).await? {
            (202, _) => accepted += 1,
            (429, body) => turned_away = Some(body),
            (status, body) => bail!("flood report {age} answered {status}: {body}"),
        }
    }
    let body = turned_away.context(format!(
        "all {accepted} of the flooder's 60 signed reports were accepted: no quota"
    ))?;
    ensure!(
        body.contains("too many signed reports") && body.contains(&flooder.instance.instance_id),
        "429 without a clear reason: {body}"
    );
    ensure!(accepted <= 10, "{accepted} flood reports accepted");

    let fatal = victim.report(&world, Outcome::Fatal, now)?;
    let (status, body) = post_report(&world, &fatal).await?;
    ensure!(
        status == 202,
        "another node's fatal report was answered {status}: {body}"
    );
    wait_deleted(&claims, &victim.claim)
        .await
        .context("another node's signed fatal report, after the flood")?;
    let metrics = metrics(&world).await?;
    ensure!(
        metrics.contains(r#"autonode_agent_reports_refused_total{reason="over_quota"}"#),
        "{metrics}"
    );

    // Refused on its timestamp before the quota is asked.
    let ahead = flooder.report(&world, Outcome::Retrying, now + 120)?;
    let (status, body) = post_report(&world, &ahead).await?;
    ensure!(
        status == 403,
        "a report two minutes ahead was answered {status}: {body}"
    );
    Ok(())
}

/// Anyone holding a machine's identity document may attach a proof, signed
/// by any key, to its reports before the machine is bound. The old server
/// read the NodeClaim from the API server for each such report (to settle
/// a race with the join's binding), outside the join's caps: a flood of
/// reports was a flood of GETs. Now one instance's reports cause at most
/// `UNBOUND_READ_BURST` reads before its budget refills.
#[tokio::test]
async fn a_flood_of_reports_for_an_unbound_machine_makes_few_api_reads() -> Result<()> {
    const REPORTS: u64 = 40;
    let world = World::start().await?;
    let (_claim, instance) = world.launch(|i| i).await?;
    let stranger = KeyPair::generate()?;
    let before = nodeclaim_gets(&world).await?;
    for _ in 0..REPORTS {
        send_report(&world, &instance, Outcome::Retrying, Some(&stranger)).await?;
    }
    let reads = nodeclaim_gets(&world).await? - before;
    let burst = u64::from(autonode_server::report::UNBOUND_READ_BURST);
    ensure!(
        reads <= burst,
        "{reads} GETs of NodeClaims for {REPORTS} reports"
    );
    Ok(())
}

/// GETs of single NodeClaims the API server has served so far (its
/// `apiserver_request_total`).
async fn nodeclaim_gets(world: &World) -> Result<u64> {
    let admin = world.cp.admin().await?;
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = admin.request_text(request).await?;
    let mut total = 0;
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let ours = line.contains("resource=\"nodeclaims\"")
            && line.contains("verb=\"GET\"")
            && line.contains("scope=\"resource\"");
        if ours {
            let value = line.rsplit(' ').next().unwrap_or_default();
            total += value.parse::<f64>().context("a counter's value")? as u64;
        }
    }
    Ok(total)
}

/// A machine whose agent has joined: its instance is bound to `keys.client`.
struct Joined {
    claim: String,
    instance: Instance,
    keys: NodeKeys,
}

impl Joined {
    async fn launch(world: &World) -> Result<Self> {
        let (claim, instance) = world.launch(|i| i).await?;
        let keys = join(world, &instance).await?;
        Ok(Joined {
            claim,
            instance,
            keys,
        })
    }

    /// A report signed with the bound key, written at `timestamp`.
    fn report(&self, world: &World, outcome: Outcome, timestamp: i64) -> Result<ReportRequest> {
        report(
            world,
            &self.instance,
            outcome,
            timestamp,
            Some(&self.keys.client),
        )
    }
}

/// The messages of `claim`'s Warning Events with `reason`, once there is
/// one (Events are written in the background).
async fn warning_messages(world: &World, claim: &str, reason: &str) -> Result<Vec<String>> {
    world.event_reasons(claim, reason).await?;
    let api: Api<Event> = Api::namespaced(world.cp.admin().await?, "default");
    let selector = format!("involvedObject.name={claim},reason={reason},type=Warning");
    Ok(api
        .list(&ListParams::default().fields(&selector))
        .await?
        .items
        .into_iter()
        .filter_map(|e| e.message)
        .collect())
}

/// Anyone on the network can send a report that is refused, and each
/// refusal was a warn line of up to ~1 KiB: a flood of them was a log
/// flood. Now each refusal reason has its own budget of warn lines (the
/// rest are counted and logged at debug), so 200 refused reports of two
/// reasons make at most two budgets of lines, and all 200 are counted.
#[tokio::test]
async fn a_flood_of_refused_reports_is_counted_but_not_a_log_flood() -> Result<()> {
    const FLOOD: usize = 100;
    let world = World::start().await?;
    let started = std::time::Instant::now();
    let (_, outsider) = world
        .launch(|i| Instance {
            account_id: "999999999999".into(),
            ..i
        })
        .await?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let not_allowed = report(&world, &outsider, Outcome::Fatal, now, None)?;
    let mut unsigned_garbage = not_allowed.clone();
    unsigned_garbage.identity.rsa2048 = "x".repeat(900);
    for refused in [&not_allowed, &unsigned_garbage] {
        for _ in 0..FLOOD {
            let (status, body) = post_report(&world, refused).await?;
            ensure!(status == 403, "answered {status}: {body}");
        }
    }
    let metrics = metrics(&world).await?;
    for reason in ["not_allowed", "identity"] {
        let line = format!(r#"autonode_agent_reports_refused_total{{reason="{reason}"}} {FLOOD}"#);
        ensure!(metrics.contains(&line), "{line} missing:\n{metrics}");
    }
    let warned = world.server.warn_lines("agent report refused");
    eprintln!("warn lines for {FLOOD} refused reports of each of two reasons: {warned}");
    let budget = refusal_line_budget(started, 2);
    ensure!(
        (2..=budget).contains(&warned),
        "{warned} warn lines for {} refused reports (budget {budget})",
        2 * FLOOD
    );
    Ok(())
}
