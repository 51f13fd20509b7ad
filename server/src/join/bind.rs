//! The bind step of a join: the binding ([`crate::kube::binding`]),
//! the CSR objects ([`crate::kube::issuer`]) and the node's config
//! ([`crate::join::render::inputs`]), all in place before anything is approved.

use super::attest::Attested;
use super::JoinContext;
use crate::join::refusal::JoinError;
use crate::join::render::NodeFacts;
use crate::kube::binding::{self, Binding, BindingError, BindingRefusal, CsrRef, Keys, Record};
use crate::kube::issuer::{self, IssueError, IssueRequest};
use crate::kube::karpenter::NodeClaim;
use crate::kube::marks;
use crate::kube::nodeclaim::{Milestone, NodeClaims};
use autonode_shared::csr::ParsedCsr;
use autonode_shared::csr::Purpose;
use autonode_shared::protocol::KubeletSettings;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use std::collections::BTreeMap;
use std::time::Duration;

/// What a join has ready before anything is approved.
pub(super) struct Prepared<'a> {
    /// What is asked of kube-controller-manager: the client, then the
    /// serving certificate.
    pub(super) requests: [IssueRequest<'a>; 2],
    pub(super) binding: Binding,
    /// The NodeClaim as this join's binding write left it (none when a
    /// resumed join wrote nothing).
    pub(super) claim: Option<NodeClaim>,
    pub(super) rendered: (KubeletSettings, serde_json::Value),
    /// The CSR objects, in the order of the requests.
    pub(super) csrs: Vec<CsrObject>,
}

/// A CSR object a join will approve, and whether this join created it.
pub(super) struct CsrObject {
    pub(super) object: CertificateSigningRequest,
    created: bool,
}

/// The bind step: judges the binding, finds or creates the CSR
/// objects and renders the config, then records the binding naming those
/// objects. Rendering and the objects need only what attestation
/// established, so they run together; nothing is approved until all of it
/// stands, and a join that fails on the way deletes the objects it created.
pub(super) async fn bind<'a>(
    ctx: &JoinContext,
    attested: &'a Attested,
) -> Result<Prepared<'a>, JoinError> {
    let requests = requests(ctx, attested);
    let [client_key, serving_key] = attested.csrs.fingerprints();
    let keys = Keys {
        client: &client_key,
        serving: &serving_key,
    };
    // Judged by attest on the cached NodeClaim, so a replay creates nothing
    // (and asks EC2 nothing); the write below judges again on the version
    // it writes over.
    let existing = attested.existing.clone();
    let facts = NodeFacts {
        claim: &attested.claim,
        provider_id: &attested.provider_id,
        node_ip: node_ip(attested),
    };
    let (rendered, csrs) = tokio::join!(
        ctx.nodeconfig.render(&ctx.cluster.settings, &facts),
        csr_objects(ctx, &requests, existing.as_ref()),
    );
    let csrs = csrs?;
    let bound = match rendered {
        Ok(rendered) => record_binding(ctx, attested, keys, &csrs, existing)
            .await
            .map(|binding| (binding, rendered))
            .map_err(JoinError::from),
        Err(e) => Err(e.into()),
    };
    match bound {
        Ok(((binding, claim), rendered)) => Ok(Prepared {
            requests,
            binding,
            claim,
            rendered,
            csrs,
        }),
        Err(e) => {
            abandon_created(ctx, &csrs).await;
            Err(e)
        }
    }
}

/// The CSR objects for `requests`: the binding's own when a resumed join
/// can use them, new ones otherwise. On any failure the new ones are
/// deleted again.
async fn csr_objects(
    ctx: &JoinContext,
    requests: &[IssueRequest<'_>],
    existing: Option<&Record>,
) -> Result<Vec<CsrObject>, IssueError> {
    let each = requests.iter().map(|request| async move {
        let recorded = existing.and_then(|r| r.csrs.iter().find(|c| c.purpose == request.purpose));
        if let Some(recorded) = recorded {
            if let Some(object) = ctx.issuer.find(request, recorded).await? {
                return Ok(CsrObject {
                    object,
                    created: false,
                });
            }
        }
        ctx.issuer.create(request).await.map(|object| CsrObject {
            object,
            created: true,
        })
    });
    let results: Vec<Result<CsrObject, IssueError>> = futures::future::join_all(each).await;
    let (ok, failed): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
    let objects: Vec<CsrObject> = ok.into_iter().flatten().collect();
    match failed.into_iter().find_map(Result::err) {
        None => Ok(objects),
        Some(e) => {
            abandon_created(ctx, &objects).await;
            Err(e)
        }
    }
}

async fn abandon_created(ctx: &JoinContext, csrs: &[CsrObject]) {
    for csr in csrs.iter().filter(|c| c.created) {
        ctx.issuer.abandon(&csr.object).await;
    }
}

/// The client and serving requests. Within a reused name's window the
/// approver leaves this name's renewals pending: certificates of the
/// signer's full lifetime outlast the window, so the machine's kubelet
/// works on until they are approved.
fn requests<'a>(ctx: &JoinContext, attested: &'a Attested) -> [IssueRequest<'a>; 2] {
    let lifetime = match attested.held {
        Some(_) => ctx.lifetimes.signing,
        None => ctx.lifetimes.join,
    };
    let csrs = &attested.csrs;
    [
        issue_request(
            attested,
            (&csrs.client_pem, &csrs.client),
            (Purpose::Client, lifetime),
        ),
        issue_request(
            attested,
            (&csrs.serving_pem, &csrs.serving),
            (Purpose::Serving, lifetime),
        ),
    ]
}

/// What to ask kube-controller-manager for (the CSR objects this step
/// creates).
fn issue_request<'a>(
    attested: &Attested,
    (pem, judged): (&'a str, &'a ParsedCsr),
    (purpose, lifetime): (Purpose, Duration),
) -> IssueRequest<'a> {
    let instance_id = &attested.doc.instance_id;
    let claim = attested.claim.metadata.name.clone().unwrap_or_default();
    IssueRequest {
        name_prefix: format!("autonode-{instance_id}-{}-", purpose.as_str()),
        purpose,
        request_pem: pem,
        judged,
        labels: BTreeMap::from([
            (marks::CSR_INSTANCE_LABEL.to_string(), instance_id.clone()),
            (marks::CSR_NODECLAIM_LABEL.to_string(), claim.clone()),
        ]),
        approval_message: format!(
            "autonode-server: instance {instance_id} attested by its AWS identity document for NodeClaim {claim}"
        ),
        lifetime,
    }
}

/// Writes the binding: a new record, or the resumed one naming the objects
/// this join uses if they are not the recorded ones. A new one is the
/// attested milestone, marked reported in the same write (the join
/// observes it), and carries `held` (when another instance last held the
/// node name) as [`marks::NAME_LAST_HELD`]. Returns the NodeClaim as
/// written, if it was.
async fn record_binding(
    ctx: &JoinContext,
    attested: &Attested,
    keys: Keys<'_>,
    csrs: &[CsrObject],
    existing: Option<Record>,
) -> Result<(Binding, Option<NodeClaim>), BindingError> {
    let refs: Vec<CsrRef> = csrs
        .iter()
        .zip(Purpose::ALL)
        .map(|(csr, purpose)| issuer::reference(purpose, &csr.object))
        .collect();
    let claim = &attested.claim;
    match existing {
        Some(record) if record.csrs == refs => Ok((Binding::Resumed, None)),
        Some(mut record) => {
            record.csrs = refs;
            let written = write(&ctx.claims, claim, &record, true, (&[], None)).await?;
            Ok((Binding::Resumed, Some(written)))
        }
        None => {
            let record = Record {
                instance_id: attested.doc.instance_id.clone(),
                region: attested.doc.region.clone(),
                node_name: attested.instance.private_dns_name.clone(),
                client_key: keys.client.to_string(),
                serving_key: keys.serving.to_string(),
                csrs: refs,
            };
            let held = attested.held.map(|t| t.to_string());
            let reported = [Milestone::Attested.name()];
            let marks = (&reported[..], held.as_deref());
            let written = write(&ctx.claims, claim, &record, false, marks).await?;
            Ok((Binding::New, Some(written)))
        }
    }
}

/// Writes `record` on `claim` (the binding's one writer: the join's bind
/// step), on the version the decision was made on
/// (`resuming`: `claim` already carries a record for the same keys, and
/// this one names new CSR objects). On a conflict the NodeClaim is read
/// again and judged again; the write is tried once more on the new version
/// only when the judgement is unchanged. A binding that appeared meanwhile
/// for the same keys is the same agent's concurrent attempt: this one is
/// left to its retry, which resumes it.
///
/// `reported` are added to the [`marks::REPORTED`] mark in the same write
/// (a new binding is the attested milestone), and `held` written as the
/// [`marks::NAME_LAST_HELD`] mark (see [`crate::kube::reuse`]). Returns the
/// NodeClaim as written.
async fn write(
    claims: &NodeClaims,
    claim: &NodeClaim,
    record: &Record,
    resuming: bool,
    (reported, held): (&[&str], Option<&str>),
) -> Result<NodeClaim, BindingError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let value = serde_json::to_string(record).map_err(kube::Error::SerdeError)?;
    let mark = |over: &NodeClaim| {
        (!reported.is_empty())
            .then(|| marks::with_reported(marks::reported(&over.metadata), reported))
    };
    match claims
        .write_binding(claim, &value, (mark(claim).as_deref(), held))
        .await
    {
        Ok(written) => return Ok(written),
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let fresh = claims
        .get_fresh(&name)
        .await?
        .ok_or_else(|| BindingRefusal::Gone(name.clone()))?;
    let keys = Keys {
        client: &record.client_key,
        serving: &record.serving_key,
    };
    let now_bound = binding::judge(&fresh, &record.instance_id, keys)?.is_some();
    if now_bound != resuming {
        return Err(BindingError::Changed(name));
    }
    let written = claims
        .write_binding(&fresh, &value, (mark(&fresh).as_deref(), held))
        .await?;
    Ok(written)
}

fn node_ip(attested: &Attested) -> String {
    attested
        .doc
        .private_ip
        .or_else(|| attested.instance.private_ips.first().copied())
        .map(|ip| ip.to_string())
        .unwrap_or_default()
}
