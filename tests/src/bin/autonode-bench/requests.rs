//! The API server's work autonode-server asks for, counted by the API
//! server itself: its audit log records every request of the server's
//! ServiceAccount (`kube::controlplane::AUDIT_POLICY`), and this reads them back
//! by verb and resource. Not the server's count of itself: a request it
//! forgot to count, or one a library made for it, is here all the same.

use anyhow::Result;
use autonode_tests::kube::controlplane::ControlPlane;
use autonode_tests::server::server_user;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// What a join cannot do without, by `verb resource`: the binding's one
/// NodeClaim write, the two CSR objects, their two approvals. The
/// signatures are awaited on the CSR watch every replica keeps open
/// anyway (one watch, not one per join).
pub(crate) const FLOOR: [(&str, f64); 3] = [
    ("patch nodeclaims", 1.0),
    ("create certificatesigningrequests", 2.0),
    ("patch certificatesigningrequests/approval", 2.0),
];

/// Requests the server makes whether or not anything joins (leader
/// election's Lease renewals), kept apart from the per-join counts.
const BACKGROUND: &[&str] = &["leases"];

/// When counting starts: requests the API server received from then on
/// (its `requestReceivedTimestamp`, RFC 3339 in UTC with microseconds, so
/// that the strings sort as the times do). A time, not a line count: the
/// API server rotates its audit log at 100 MB, which a large burst or a
/// renewal wave passes.
pub(crate) struct Mark(String);

pub(crate) fn mark(_cp: &ControlPlane) -> Result<Mark> {
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
    );
    Ok(Mark(time::OffsetDateTime::now_utc().format(&format)?))
}

/// The server's requests since `since`, by `verb resource[/subresource]`,
/// each counted once (its audit ID), and the background ones apart; from
/// the audit log and the files it was rotated to.
pub(crate) fn since(cp: &ControlPlane, since: &Mark) -> Result<Counted> {
    let user = server_user();
    let mut seen = std::collections::BTreeSet::new();
    let mut counted = Counted::default();
    for path in audit_files(cp)? {
        let text = std::fs::read_to_string(&path)?;
        // Only the server's lines are parsed (a cheap test first).
        for line in text.lines().filter(|l| l.contains(user.as_str())) {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let received = event["requestReceivedTimestamp"].as_str().unwrap_or("");
            if event["user"]["username"] != user.as_str() || received < since.0.as_str() {
                continue;
            }
            let Some(id) = event["auditID"].as_str() else {
                continue;
            };
            if !seen.insert(id.to_string()) {
                continue;
            }
            count(&event, &mut counted);
        }
    }
    Ok(counted)
}

/// The audit log and its rotated files (`audit-<time>.log`), beside each
/// other in the control plane's directory.
fn audit_files(cp: &ControlPlane) -> Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(cp.dir())? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("audit") && name.ends_with(".log") {
            files.push(path);
        }
    }
    Ok(files)
}

/// Counts one of the server's audited requests into `counted`.
fn count(event: &Value, counted: &mut Counted) {
    let object = &event["objectRef"];
    let resource = object["resource"].as_str().unwrap_or("?");
    let verb = event["verb"].as_str().unwrap_or("?");
    let key = match object["subresource"].as_str() {
        Some(sub) => format!("{verb} {resource}/{sub}"),
        None => format!("{verb} {resource}"),
    };
    let into = if BACKGROUND.contains(&resource) {
        &mut counted.background
    } else {
        &mut counted.joins
    };
    *into.entry(key).or_default() += 1;
}

/// The server's requests, as the API server audited them.
#[derive(Default)]
pub(crate) struct Counted {
    pub(crate) joins: BTreeMap<String, u64>,
    pub(crate) background: BTreeMap<String, u64>,
}

impl Counted {
    /// Per join, by `verb resource`, beside the floor: the JSON the
    /// results carry as `api_requests_per_join`.
    pub(crate) fn per_join(&self, joins: usize) -> Value {
        let joins = joins.max(1) as f64;
        let per = |n: u64| (n as f64 / joins * 100.0).round() / 100.0;
        let by_request: Map<String, Value> = self
            .joins
            .iter()
            .map(|(k, n)| (k.clone(), per(*n).into()))
            .collect();
        let total: u64 = self.joins.values().sum();
        let floor: f64 = FLOOR.iter().map(|(_, n)| n).sum();
        let background: Map<String, Value> = self
            .background
            .iter()
            .map(|(k, n)| (k.clone(), (*n).into()))
            .collect();
        json!({
            "by_request": by_request,
            "total": per(total),
            "floor": FLOOR.iter().map(|(k, n)| ((*k).to_string(), json!(n))).collect::<Map<_, _>>(),
            "floor_total": floor,
            "background_in_run": background,
        })
    }
}
