//! The alerting rules and the Grafana dashboard: promtool checks the rules
//! and runs their unit tests, every alert has a runbook section, the
//! dashboard shows every metric the rules use, and every metric and label
//! name the rules, their tests' input series and the dashboard's queries
//! use (and every label value the rules and the dashboard match on) is in a
//! scrape of the real server after a join, a refusal, an unavailable join,
//! a CSR left pending, Events dropped and agent reports.

use crate::feedback::{metrics, post_report, report, send_report};
use anyhow::{bail, ensure, Context, Result};
use autonode_shared::protocol::{Outcome, JOIN_PATH};
use autonode_tests::callers::joiner::{honest_request, Answer, CsrShape, NodeKeys};
use autonode_tests::harness::poll;
use autonode_tests::oracles::promql::{self, names, Names, Scrape};
use autonode_tests::server::world::{cloud_settings, World};
use autonode_tests::server::{http_get, Setup, TestServer};
use hyper::StatusCode;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::ResourceExt as _;
use serde_json::Value as Json;
use serde_yaml::Value as Yaml;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const RULES: &str = promql::RULES_FILE;
const DASHBOARD: &str = promql::DASHBOARD_FILE;
const RUNBOOK: &str = "docs/operations.md";
const RUNBOOK_URL: &str = "https://github.com/autonode/autonode/blob/main/docs/operations.md#";
/// Labels Prometheus attaches when it scrapes: the unit tests' input
/// series carry `instance`, as scraped series do.
const TARGET_LABELS: &[&str] = &["instance", "job"];

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(repo(path)).with_context(|| format!("reading {path}"))
}

/// The promtool unit-test files, `tests/prometheus/*.test.yaml`.
fn rule_tests() -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo("tests/prometheus"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.to_string_lossy().ends_with(".test.yaml"));
    files.sort();
    ensure!(!files.is_empty(), "no tests/prometheus/*.test.yaml");
    Ok(files)
}

/// Runs promtool (Debian's `prometheus` package, from install-deps).
fn promtool(args: &[&std::ffi::OsStr]) -> Result<()> {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .context("running promtool (tests/setup/install-deps installs it)")?;
    ensure!(
        out.status.success(),
        "promtool {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() -> Result<()> {
    let rules = repo(RULES);
    promtool(&["check".as_ref(), "rules".as_ref(), rules.as_os_str()])?;
    let tests = rule_tests()?;
    let mut args: Vec<&std::ffi::OsStr> = vec!["test".as_ref(), "rules".as_ref()];
    args.extend(tests.iter().map(|p| p.as_os_str()));
    promtool(&args)
}

/// Each rule of the rule file, as YAML.
fn rules() -> Result<Vec<Yaml>> {
    let file: Yaml = serde_yaml::from_str(&read(RULES)?)?;
    let groups = file["groups"].as_sequence().context("no groups")?;
    Ok(groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .collect())
}

fn text<'a>(value: &'a Yaml, what: &str) -> Result<&'a str> {
    value.as_str().with_context(|| format!("no {what}"))
}

/// Every alert has a severity, a summary, a description and a runbook
/// link to a section of docs/operations.md that exists.
#[test]
fn every_alert_is_labelled_annotated_and_has_a_runbook_section() -> Result<()> {
    let runbook = read(RUNBOOK)?;
    let sections: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    let alerts = rules()?;
    ensure!(alerts.len() >= 9, "only {} alerts", alerts.len());
    for rule in &alerts {
        let name = text(&rule["alert"], "alert name")?;
        let severity = text(&rule["labels"]["severity"], "severity")?;
        ensure!(
            ["critical", "warning", "info"].contains(&severity),
            "{name}: severity {severity}"
        );
        for key in ["summary", "description"] {
            ensure!(
                !text(&rule["annotations"][key], key)?.is_empty(),
                "{name}: empty {key}"
            );
        }
        let url = text(&rule["annotations"]["runbook_url"], "runbook_url")?;
        let anchor = url
            .strip_prefix(RUNBOOK_URL)
            .with_context(|| format!("{name}: runbook_url {url} is not into {RUNBOOK}"))?;
        ensure!(
            anchor == name.to_ascii_lowercase() && sections.contains(anchor),
            "{name}: no section `### {name}` in {RUNBOOK} for {url}"
        );
    }
    Ok(())
}

/// Every alert is shown firing by some unit test and quiet by another.
#[test]
fn every_alert_has_a_firing_and_a_quiet_unit_test() -> Result<()> {
    let (mut firing, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for file in rule_tests()? {
        let tests: Yaml = serde_yaml::from_str(&std::fs::read_to_string(&file)?)?;
        let cases = tests["tests"].as_sequence().context("no tests")?;
        for case in cases.iter().flat_map(|t| {
            t["alert_rule_test"]
                .as_sequence()
                .cloned()
                .unwrap_or_default()
        }) {
            let name = text(&case["alertname"], "alertname")?.to_string();
            let fires = case["exp_alerts"]
                .as_sequence()
                .is_some_and(|a| !a.is_empty());
            if fires { &mut firing } else { &mut quiet }.insert(name);
        }
    }
    for rule in rules()? {
        let name = text(&rule["alert"], "alert name")?;
        ensure!(firing.contains(name), "no unit test shows {name} firing");
        ensure!(quiet.contains(name), "no unit test shows {name} quiet");
    }
    Ok(())
}

/// The dashboard picks its data source from a variable: no panel or
/// query names a data source's UID of its own.
#[test]
fn the_dashboard_takes_its_data_source_from_a_variable() -> Result<()> {
    let dashboard: Json = serde_json::from_str(&read(DASHBOARD)?)?;
    let variables = dashboard["templating"]["list"]
        .as_array()
        .context("no variables")?;
    ensure!(
        variables
            .iter()
            .any(|v| v["type"] == "datasource" && v["name"] == "datasource"),
        "no `datasource` variable"
    );
    let mut uids = Vec::new();
    promql::collect_strings(&dashboard, "uid", &mut uids);
    let foreign: Vec<_> = uids
        .iter()
        .filter(|u| *u != "${datasource}" && *u != "autonode-server")
        .collect();
    ensure!(foreign.is_empty(), "hard-coded UIDs: {foreign:?}");
    let mut exprs = Vec::new();
    promql::collect_strings(&dashboard, "expr", &mut exprs);
    ensure!(exprs.len() >= 10, "only {} queries", exprs.len());
    Ok(())
}

/// What in `exprs` `scrape` does not have, each line naming its
/// expression: each is checked on its own, so a grouping label must be on
/// a metric of the same expression. With `values`, the values its matchers
/// compare with too (not for the unit tests' input series, which stand for
/// histories with other values).
fn missing_in(
    scrape: &Scrape,
    exprs: &[String],
    target_labels: &[&str],
    values: bool,
) -> Result<Vec<String>> {
    let (mut missing, mut all) = (Vec::new(), Names::default());
    for expr in exprs {
        if after_fleet_events(expr)? {
            continue;
        }
        let used = names(expr).with_context(|| format!("reading {expr:?}"))?;
        let mut lines = scrape.missing(&used, target_labels);
        if values {
            lines.extend(scrape.missing_values(&used, target_labels));
        }
        missing.extend(lines.into_iter().map(|l| format!("{l}\n    in {expr}")));
        all.merge(used);
    }
    ensure!(
        all.metrics.len() >= 4,
        "only {:?} in {exprs:?}",
        all.metrics
    );
    Ok(missing)
}

/// The rules' expressions.
fn rule_exprs() -> Result<Vec<String>> {
    promql::rule_exprs(&read(RULES)?)
}

/// Whether `expr` asks for a series only a fleet event makes (checked in
/// the tests that cause one, see [`promql::AFTER_FLEET_EVENTS`]).
fn after_fleet_events(expr: &str) -> Result<bool> {
    let used = names(expr)?;
    Ok(promql::AFTER_FLEET_EVENTS
        .iter()
        .any(|m| used.metrics.contains_key(*m)))
}

/// The unit tests' input series and PromQL tests.
fn rule_test_exprs() -> Result<Vec<String>> {
    let mut exprs = Vec::new();
    for file in rule_tests()? {
        let tests: Yaml = serde_yaml::from_str(&std::fs::read_to_string(&file)?)?;
        for case in tests["tests"].as_sequence().context("no tests")? {
            let series = case["input_series"].as_sequence().into_iter().flatten();
            exprs.extend(series.filter_map(|s| s["series"].as_str().map(String::from)));
            let queries = case["promql_expr_test"].as_sequence().into_iter().flatten();
            exprs.extend(queries.filter_map(|q| q["expr"].as_str().map(String::from)));
        }
    }
    Ok(exprs)
}

/// The dashboard's queries.
fn dashboard_exprs() -> Result<Vec<String>> {
    promql::dashboard_exprs(&read(DASHBOARD)?)
}

/// The metrics `exprs` use, together.
fn metrics_of(exprs: &[String]) -> Result<BTreeSet<String>> {
    let mut all = Names::default();
    for expr in exprs {
        all.merge(names(expr).with_context(|| format!("reading {expr:?}"))?);
    }
    Ok(all.metrics.into_keys().collect())
}

/// Whoever an alert wakes finds its metric on the dashboard: every metric
/// a rule uses is in some panel's query.
#[test]
fn the_dashboard_shows_every_metric_the_rules_use() -> Result<()> {
    let rules = metrics_of(&rule_exprs()?)?;
    let shown = metrics_of(&dashboard_exprs()?)?;
    ensure!(rules.len() >= 10, "only {rules:?} in the rules");
    let unshown: Vec<&String> = rules.difference(&shown).collect();
    ensure!(unshown.is_empty(), "no dashboard panel shows {unshown:?}");
    Ok(())
}

/// Drives the server so every labelled series the rules and the dashboard
/// ask for exists, scrapes it, and checks their names against the scrape.
#[tokio::test]
async fn alerts_and_dashboard_ask_only_for_series_the_server_exports() -> Result<()> {
    let world = World::start().await?;
    let node = world.join_new(|i| i).await?;
    // The same instance again with other keys: refused, a possible replay.
    let replay = honest_request(&node.instance, world.cloud.ca(), &NodeKeys::generate()?)?;
    let Answer::Refused(status, _) = world.joiner.join(&replay).await? else {
        bail!("a second join with other keys was granted");
    };
    ensure!(status == 403, "the replay was answered {status}");
    // More replays than the NodeClaim's Event bucket holds: the Events
    // past it are counted as dropped (rate_limited).
    for _ in 0..autonode_server::kube::events::BURST {
        world.joiner.join(&replay).await?;
    }
    join_while_ec2_fails(&world).await?;
    leave_csrs_pending(&node.client, &node.instance).await?;
    // A signed report sent twice (the second refused), then a fatal one,
    // which deletes the NodeClaim.
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let retrying = report(
        &world,
        &node.instance,
        Outcome::Retrying,
        now,
        Some(&node.keys.client),
    )?;
    for expected in [202, 403] {
        let (status, body) = post_report(&world, &retrying).await?;
        ensure!(status == expected, "report answered {status}: {body}");
    }
    send_report(
        &world,
        &node.instance,
        Outcome::Fatal,
        Some(&node.keys.client),
    )
    .await?;
    // A body past the limit is turned away before any join work; the
    // server may cut the connection before its 413 arrives.
    if let Ok((status, _)) = world.joiner.post(JOIN_PATH, vec![b'{'; 128 * 1024]).await {
        ensure!(status == 413, "an oversized body was answered {status}");
    }

    // A machine of an account the server does not allow: refused for a
    // cause on the server's side, its NodeClaim marked, never deleted.
    let (_, foreign) = world
        .launch(|i| autonode_tests::cloud::fakecloud::Instance {
            account_id: "999988887777".into(),
            ..i
        })
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let foreign = honest_request(&foreign, world.cloud.ca(), &NodeKeys::generate()?)?;
    world.joiner.join(&foreign).await?;
    scrape_with(&world, "autonode_nodeclaims_failed_server_side_total{").await?;
    scrape_with(&world, "autonode_csr_left_pending_total{").await?;
    scrape_with(&world, "autonode_events_dropped_total{").await?;
    // Both pending CSRs, counted from the approver's store (the oversized
    // one too, though judged only once).
    let pending = r#"autonode_csrs_pending{signer="kubernetes.io/kubelet-serving"}"#;
    let text = scrape_with(&world, &format!("{pending} 2\n")).await?;
    // The server is ready (World waited for /readyz): the gauge says so.
    ensure!(
        text.lines().any(|l| l == "autonode_caches_ready 1"),
        "{text}"
    );
    let scrape = Scrape::parse(&text)?;
    let mut problems = Vec::new();
    for (what, exprs, target_labels, values) in [
        ("the rules", rule_exprs()?, &[][..], true),
        (
            "the rules' unit tests",
            rule_test_exprs()?,
            TARGET_LABELS,
            false,
        ),
        ("the dashboard", dashboard_exprs()?, &[][..], true),
    ] {
        let missing = missing_in(&scrape, &exprs, target_labels, values)?;
        problems.extend(missing.into_iter().map(|m| format!("{what}: {m}")));
    }
    ensure!(
        problems.is_empty(),
        "asked for but not exported:\n{}",
        problems.join("\n")
    );
    // Decided or deleted, a CSR stops counting (the count is of the
    // store, not of judgements).
    let admin = world.cp.admin().await?;
    let csrs = Api::<CertificateSigningRequest>::all(admin);
    for csr in csrs.list(&Default::default()).await? {
        if csr.metadata.generate_name.as_deref() == Some(FOREIGN_CSR) {
            csrs.delete(&csr.name_any(), &Default::default()).await?;
        }
    }
    scrape_with(&world, &format!("{pending} 0\n")).await?;
    Ok(())
}

/// A join while EC2 answers 503 to everything: answered 503 (the agent
/// would retry), counted as `result="unavailable"`.
async fn join_while_ec2_fails(world: &World) -> Result<()> {
    let (_, instance) = world.launch(|i| i).await?;
    let request = honest_request(&instance, world.cloud.ca(), &NodeKeys::generate()?)?;
    world
        .ec2
        .faults()
        .fail_next(u32::MAX, StatusCode::SERVICE_UNAVAILABLE);
    let answer = world.joiner.join(&request).await;
    world.ec2.faults().clear();
    let status = answer?.status();
    ensure!(
        status == 503,
        "a join while EC2 fails was answered {status}"
    );
    Ok(())
}

/// The scrape's text, once it contains `awaited` (the approver judges CSRs in
/// the background).
async fn scrape_with(world: &World, awaited: &str) -> Result<String> {
    poll::until(
        &format!("{awaited:?} in /metrics"),
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async {
            let text = metrics(world).await?;
            Ok(text.contains(awaited).then_some(text))
        },
    )
    .await
}

/// As the node: two serving CSRs the approver must leave pending, one for
/// an address its instance does not have (looked at again every 30 s),
/// one over the size limit (judged once, never again).
async fn leave_csrs_pending(
    node: &kube::Client,
    instance: &autonode_tests::cloud::fakecloud::Instance,
) -> Result<()> {
    let mut shape = CsrShape::serving(instance);
    shape.ips.push(IpAddr::V4(Ipv4Addr::new(10, 250, 0, 9)));
    let key = rcgen::KeyPair::generate()?;
    let requests = [
        shape.csr(&key)?,
        crate::memory::oversized_request(&instance.private_dns_name)?,
    ];
    for request in requests {
        let csr = CertificateSigningRequest {
            metadata: ObjectMeta {
                generate_name: Some(FOREIGN_CSR.into()),
                ..Default::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request.into_bytes()),
                signer_name: "kubernetes.io/kubelet-serving".into(),
                usages: Some(
                    ["digital signature", "key encipherment", "server auth"]
                        .map(String::from)
                        .to_vec(),
                ),
                ..Default::default()
            },
            status: None,
        };
        Api::<CertificateSigningRequest>::all(node.clone())
            .create(&PostParams::default(), &csr)
            .await?;
    }
    Ok(())
}

/// The names of the CSRs [`leave_csrs_pending`] makes start so.
const FOREIGN_CSR: &str = "serving-foreign-";

/// `autonode_caches_ready` is what `/readyz` answers: 0 on a replica whose
/// RBAC does not cover its `--ignition-namespace` (a cache never synced),
/// the state AutonodeReplicaNotReady is for.
#[tokio::test]
async fn the_readiness_gauge_is_zero_while_readyz_refuses() -> Result<()> {
    let world = World::start().await?;
    let settings = cloud_settings(&world.cloud, &world.ec2);
    let args = ["--ignition-namespace=autonode-unreadable".to_string()];
    let setup = Setup {
        extra_args: &args,
        wait_ready: false,
        ..Setup::default()
    };
    let server = TestServer::launch(&world.cp, &settings, &setup).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, body) = http_get(&format!("{}/readyz", server.metrics_url())).await?;
    ensure!(
        status == 503,
        "ready without its Ignition ConfigMaps: {body}"
    );
    let (_, text) = http_get(&format!("{}/metrics", server.metrics_url())).await?;
    ensure!(
        text.lines().any(|l| l == "autonode_caches_ready 0"),
        "{text}"
    );
    Ok(())
}
