//! What a join request leaves behind, wherever it ended: its log line, the
//! Event on its NodeClaim, its metrics, and (for an instance refused for
//! good) the deletion of its NodeClaim. [`record`] is the one place that
//! happens; each of those is a small function of its own, and whether to
//! delete is a pure decision ([`dooms_nodeclaim`]).

use super::{Granted, JoinContext};
use crate::join::refusal::{JoinError, Refusal};
use crate::kube::binding::{self, Binding, BindingRefusal};
use crate::kube::budget::Failure;
use crate::kube::karpenter::NodeClaim;
use crate::kube::marks;
use crate::kube::metrics::JoinLabels;
use crate::kube::nodeclaim::{self, pending, Failed, Milestone};
use crate::kube::reason::Reason;
use std::sync::Arc;
use std::time::Instant;

/// How a join ended, with the NodeClaim it found, if exactly one matched
/// (whether or not it passed the rules): what the outcome is reported on.
pub(super) struct Outcome {
    pub(super) claim: Option<Arc<NodeClaim>>,
    pub(super) result: Result<Granted, JoinError>,
}

impl Outcome {
    /// A join that ended before it found a NodeClaim.
    pub(super) fn without_claim(error: JoinError) -> Self {
        Self {
            claim: None,
            result: Err(error),
        }
    }
}

/// Times, logs, counts and reports the outcome on the NodeClaim.
pub(super) fn record(
    ctx: &JoinContext,
    request_id: &str,
    started: Instant,
    claim: Option<&NodeClaim>,
    agent: &str,
    result: Result<&Granted, &JoinError>,
) {
    // The agent's word for its version, cut: request data, for the log only.
    let agent: String = agent.chars().take(64).collect();
    let agent = agent.as_str();
    ctx.metrics
        .join_seconds
        .observe(started.elapsed().as_secs_f64());
    let labels = match result {
        Ok(granted) => self::granted(ctx, request_id, claim, agent, granted),
        Err(JoinError::Unavailable(why)) => {
            let claim_name = name(claim);
            tracing::warn!(request_id, nodeclaim = claim_name, agent, reason = %why, "join could not complete now");
            JoinLabels {
                result: "unavailable",
                reason: "unavailable",
            }
        }
        Err(JoinError::Refused(refusal)) => refused(ctx, request_id, claim, agent, refusal),
    };
    ctx.metrics.joins.get_or_create(&labels).inc();
}

/// Records a bootstrap milestone's latency from the NodeClaim's creation
/// (`seconds`, taken when it happened; `None` when the creation is not
/// known).
pub(super) fn milestone(ctx: &JoinContext, milestone: Milestone, seconds: Option<f64>) {
    if let Some(seconds) = seconds {
        ctx.metrics.observe_phase(milestone.name(), seconds);
    }
}

/// The certificates milestone, with the attested one if it is still
/// unreported: once per NodeClaim, whichever join gets here first, so a
/// join resumed after one that failed at approval records them now.
/// `claim` is the NodeClaim as this join's binding write left it, else as
/// attested; `attested_at` the attested milestone's time.
pub(super) async fn certified(ctx: &JoinContext, claim: &NodeClaim, attested_at: Option<f64>) {
    let certified_at = nodeclaim::age_seconds(claim, ctx.clock);
    let timed = [
        (Milestone::Attested, attested_at),
        (Milestone::Certificates, certified_at),
    ];
    milestones(ctx, claim, &timed).await;
}

/// Records those of the join's `timed` milestones that the NodeClaim's
/// [`marks::REPORTED`] mark does not have yet ([`pending`]
/// decides, as for the feedback controller's): first marked, only on the
/// version of `claim` the mark was read from (on a conflict, judged and
/// written once more on a fresh read), then observed, each at its own
/// time. So a join resumed after one that failed before its end records
/// what that one could not, and a join resumed after a granted one
/// records nothing again. A failed write records nothing (logged).
async fn milestones(ctx: &JoinContext, claim: &NodeClaim, timed: &[(Milestone, Option<f64>)]) {
    let candidates: Vec<Milestone> = timed.iter().map(|(m, _)| *m).collect();
    let mut fresh = None;
    for attempt in 0..2 {
        let current = fresh.as_ref().unwrap_or(claim);
        let reported = marks::reported(&current.metadata);
        let due = pending(reported, &candidates);
        if due.is_empty() {
            return;
        }
        let names: Vec<&str> = due.iter().map(|m| m.name()).collect();
        let mark = marks::with_reported(reported, &names);
        let error = match ctx.claims.mark_reported_over(current, &mark).await {
            Ok(_) => {
                for (m, seconds) in timed.iter().filter(|(m, _)| due.contains(m)) {
                    milestone(ctx, *m, *seconds);
                }
                return;
            }
            Err(kube::Error::Api(status)) if status.code == 409 && attempt == 0 => {
                match ctx.claims.get_fresh(name(Some(claim))).await {
                    Ok(Some(claim)) => {
                        fresh = Some(claim);
                        continue;
                    }
                    Ok(None) => return,
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        tracing::warn!(nodeclaim = name(Some(claim)), %error, milestones = ?names, "could not record the join's milestones");
        return;
    }
}

fn name(claim: Option<&NodeClaim>) -> &str {
    claim
        .and_then(|c| c.metadata.name.as_deref())
        .unwrap_or("-")
}

fn granted(
    ctx: &JoinContext,
    request_id: &str,
    claim: Option<&NodeClaim>,
    agent: &str,
    granted: &Granted,
) -> JoinLabels {
    let node = &granted.response.node_name;
    let result = if granted.binding == Binding::Resumed {
        "resumed"
    } else {
        "joined"
    };
    tracing::info!(request_id, nodeclaim = name(claim), node = %node, agent, result, "join granted");
    if let Some(claim) = claim {
        ctx.events.normal(
            claim,
            Reason::Attested,
            format!("instance attested; certificates issued for node {node} ({result})"),
        );
    }
    JoinLabels {
        result,
        reason: "none",
    }
}

fn refused(
    ctx: &JoinContext,
    request_id: &str,
    claim: Option<&NodeClaim>,
    agent: &str,
    refusal: &Refusal,
) -> JoinLabels {
    // Anyone on the network can be refused (a document of another account,
    // a bad signature): a line each would let a flood fill the logs.
    let reason = refusal.reason();
    let nodeclaim = name(claim);
    if ctx.refusal_lines.try_take(reason, Instant::now()).is_ok() {
        tracing::warn!(request_id, nodeclaim, agent, reason, detail = %refusal, "join refused (warn lines limited per reason; all counted in autonode_joins_total)");
    } else {
        tracing::debug!(request_id, nodeclaim, agent, reason, detail = %refusal, "join refused");
    }
    let replay = matches!(
        refusal,
        Refusal::Binding(BindingRefusal::PossibleReplay { .. })
    );
    let spoofed = matches!(refusal, Refusal::NodeSpoofed { .. });
    if replay {
        ctx.metrics.possible_replays.inc();
    }
    if spoofed {
        ctx.metrics.spoofed_nodes.inc();
    }
    if let Some(claim) = claim {
        if let Some(failure) = refusal
            .failure()
            .filter(|_| dooms_nodeclaim(refusal, claim))
        {
            let why = format!("join refused for good: {refusal}");
            let impostor = impostor_of(refusal);
            fail_doomed(
                ctx,
                claim.clone(),
                request_id.to_string(),
                (why, failure),
                impostor,
            );
        }
        let reason = match (replay, spoofed) {
            (true, _) => Reason::PossibleReplay,
            (_, true) => Reason::NodeSpoofed,
            _ => Reason::JoinRefused,
        };
        ctx.events
            .warning(claim, reason, format!("{refusal} (request {request_id})"));
    }
    JoinLabels {
        result: "refused",
        reason: refusal.reason(),
    }
}

/// Whether `refusal` is a reason to delete `claim` so Karpenter replaces
/// its machine now: only when deleting is on, the refusal dooms the
/// instance itself ([`Refusal::dooms_instance`]), and the NodeClaim is
/// neither bound (a join got through once: this may be someone else
/// holding its document) nor Registered (the node is up), unless the
/// refusal says the binding is this join's own or the Registered Node is
/// an impostor.
fn dooms_nodeclaim(refusal: &Refusal, claim: &NodeClaim) -> bool {
    let bound = matches!(binding::recorded(claim), Ok(Some(_)));
    refusal.dooms_instance()
        && (!bound || refusal.dooms_bound_instance())
        && (!claim.is_registered() || refusal.dooms_registered_instance())
}

/// The impostor Node a refusal names, when the NodeClaim is Registered to
/// a Node that is not its machine's ([`Refusal::dooms_registered_instance`]).
fn impostor_of(refusal: &Refusal) -> Option<String> {
    match refusal {
        Refusal::NodeSpoofed { registered, .. } => Some(registered.clone()),
        _ => None,
    }
}

/// Does with the NodeClaim of an instance that can never join what the
/// failure budget decides, in the background.
/// `impostor`: the Node the NodeClaim is Registered to, which is not its
/// machine's; failed only within that impostor's allowance of victims
/// ([`crate::kube::impostor`]).
fn fail_doomed(
    ctx: &JoinContext,
    claim: NodeClaim,
    request_id: String,
    (why, failure): (String, Failure),
    impostor: Option<String>,
) {
    let (claims, metrics, events) = (ctx.claims.clone(), ctx.metrics.clone(), ctx.events.clone());
    tokio::spawn(async move {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let failed = match impostor {
            Some(node) => {
                let told = (&metrics, &events);
                if claims.impostors().may_fail_victim(told, &claim, &node) {
                    claims.failed_impostor(&claim, &why, failure).await
                } else {
                    Ok(Failed::Left)
                }
            }
            None => claims.failed(&claim, &why, failure).await,
        };
        match failed {
            Ok(Failed::Deleted) => {
                tracing::warn!(request_id, nodeclaim = %name, "instance refused for good; NodeClaim deleted so Karpenter replaces it now");
            }
            Ok(Failed::Marked) => {
                tracing::warn!(request_id, nodeclaim = %name, reason = failure.reason, "instance refused for good; NodeClaim marked failed and kept (a cause on the server's side, the failure budget spent, or --delete-failed-nodeclaims=false)");
            }
            Ok(Failed::Left) => {}
            Err(e) => {
                tracing::warn!(request_id, nodeclaim = %name, error = %e, "could not mark or delete the NodeClaim of a refused instance")
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::marks;
    use serde_json::json;

    fn claim(extra: serde_json::Value) -> NodeClaim {
        let mut base = json!({"metadata": {"name": "c1"}, "spec": {}});
        if let (Some(b), serde_json::Value::Object(e)) = (base.as_object_mut(), extra) {
            b.extend(e);
        }
        serde_json::from_value(base).unwrap()
    }

    fn not_live() -> Refusal {
        Refusal::InstanceNotLive {
            instance_id: "i-1".into(),
            state: "terminated".into(),
        }
    }

    #[test]
    fn a_doomed_unbound_unregistered_claim_is_failed() {
        assert!(dooms_nodeclaim(&not_live(), &claim(json!({}))));
    }

    #[test]
    fn refusals_someone_else_could_cause_delete_nothing() {
        let replay = Refusal::Binding(BindingRefusal::PossibleReplay {
            instance_id: "i-1".into(),
            nodeclaim: "c1".into(),
            bound: "a".into(),
            offered: "b".into(),
        });
        assert!(!dooms_nodeclaim(&replay, &claim(json!({}))));
    }

    #[test]
    fn bound_or_registered_claims_are_kept() {
        let bound = claim(json!({"metadata": {
            "name": "c1",
            "annotations": {marks::BINDING: r#"{"instanceId":"i-1","region":"r","nodeName":"n","clientKey":"c","servingKey":"s","csrs":[]}"#},
        }}));
        assert!(!dooms_nodeclaim(&not_live(), &bound));
        let registered = claim(json!({"status": {
            "conditions": [{"type": "Registered", "status": "True"}],
        }}));
        assert!(!dooms_nodeclaim(&not_live(), &registered));
    }

    #[test]
    fn a_claim_registered_to_an_impostor_node_is_failed_bound_or_not() {
        let spoofed = Refusal::NodeSpoofed {
            nodeclaim: "c1".into(),
            instance_id: "i-1".into(),
            registered: "evil".into(),
            expected: "ip-10-0-0-1.ec2.internal".into(),
        };
        let registered =
            json!({"conditions": [{"type": "Registered", "status": "True"}], "nodeName": "evil"});
        assert!(dooms_nodeclaim(
            &spoofed,
            &claim(json!({"status": registered}))
        ));
        let bound_and_registered = claim(json!({
            "metadata": {
                "name": "c1",
                "annotations": {marks::BINDING: r#"{"instanceId":"i-1","region":"r","nodeName":"n","clientKey":"c","servingKey":"s","csrs":[]}"#},
            },
            "status": registered,
        }));
        assert!(dooms_nodeclaim(&spoofed, &bound_and_registered));
    }
}
