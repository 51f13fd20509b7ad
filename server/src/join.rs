//! One join request, start to end: parse → verify → bind → approve → render.
//!
//! Two stages: [`admit`] parses and verifies (the signature, the account
//! and region policy, the pendingTime window) with no I/O, before the
//! caller takes a join permit; [`handle`] takes the [`Admitted`] request on
//! through the NodeClaim (waiting out the cache's grace only for documents
//! that passed), EC2, binding, approval and rendering.
//!
//! Every step either hands the next one stronger facts or stops the join
//! with a [`Refusal`] (final) or [`JoinError::Unavailable`] (retry). Names
//! and addresses come from EC2 and the NodeClaim, never from the request.

use crate::binding::{self, Binding, CsrRef, Keys, Record};
use crate::ec2::{Ec2Instance, InstanceLookup, LookupError};
use crate::events::Events;
use crate::issuer::{self, IssueRequest, Issuer};
use crate::karpenter::{aws_provider_id, NodeClaim};
use crate::marks;
use crate::metrics::{JoinLabels, KindLabels, Metrics, Steps};
use crate::nodeclaim::{self, NodeClaims};
use crate::nodeconfig::NodeConfig;
use crate::refusal::{JoinError, Refusal};
use crate::render::{ClusterSettings, NodeFacts};
use autonode_shared::csr::{self, ParsedCsr, Purpose};
use autonode_shared::identity::{self, IdentityDocument, Policy, TrustStore};
use autonode_shared::protocol::KubeletSettings;
use autonode_shared::protocol::{JoinRequest, JoinResponse};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use time::OffsetDateTime;

/// The guest cluster as a node sees it.
#[derive(Debug, Clone)]
pub struct ClusterInfo {
    /// The API server URL nodes use.
    pub api_server: String,
    /// PEM bundle nodes trust for the API server.
    pub ca_pem: String,
    pub settings: ClusterSettings,
}

/// Everything a join needs, shared by all requests.
pub struct JoinContext {
    pub trust: TrustStore,
    pub policy: Policy,
    pub claims: NodeClaims,
    pub ec2: Arc<dyn InstanceLookup>,
    pub issuer: Issuer,
    pub cluster: ClusterInfo,
    pub events: Events,
    pub metrics: Metrics,
    /// Per-node config: EC2NodeClasses and Ignition ConfigMaps and Secrets.
    pub nodeconfig: NodeConfig,
    /// Injected so tests can set the time.
    pub clock: fn() -> OffsetDateTime,
    /// Delete the NodeClaim of an instance refused for good (see
    /// [`Refusal::dooms_instance`]), so Karpenter replaces it now.
    pub delete_refused: bool,
}

/// A join request that passed admission: its CSRs parse, and its identity
/// document is AWS-signed and within the account/region policy and the
/// pendingTime window. Only such a request takes a join permit, waits for
/// the NodeClaim cache or reaches EC2.
pub struct Admitted {
    request: JoinRequest,
    client_csr: ParsedCsr,
    serving_csr: ParsedCsr,
    doc: IdentityDocument,
    provider_id: String,
    started: Instant,
}

/// What attestation established about the machine.
struct Attested {
    doc: IdentityDocument,
    claim: Arc<NodeClaim>,
    instance: Ec2Instance,
    provider_id: String,
}

/// Stage 1, admission: parse, then verify (the signature, then the policy).
/// No I/O and no waiting, so a request that can never pass costs a little
/// CPU and no join permit; it runs before the caller is given one. A
/// refusal is recorded here like any other.
pub fn admit(
    ctx: &JoinContext,
    request_id: &str,
    request: JoinRequest,
) -> Result<Admitted, JoinError> {
    let started = Instant::now();
    let mut steps = ctx.metrics.steps();
    let parsed = parse(&request).and_then(|csrs| Ok((csrs, verify(ctx, &request)?)));
    let ((client_csr, serving_csr), doc) = match parsed {
        Ok(parsed) => parsed,
        Err(refusal) => return Err(refused(ctx, request_id, None, started, refusal)),
    };
    let provider_id = aws_provider_id(&doc.availability_zone, &doc.instance_id);
    if let Err(e) = ctx.policy.check(&doc, (ctx.clock)()) {
        // Reported on the NodeClaim if the cache has it now; the grace for
        // a NodeClaim the cache lacks is only for documents that pass.
        let claim = match ctx.claims.by_provider_id(&provider_id).as_slice() {
            [only] => Some(only.clone()),
            _ => None,
        };
        return Err(refused(ctx, request_id, claim, started, e.into()));
    }
    steps.done("admit");
    Ok(Admitted {
        request,
        client_csr,
        serving_csr,
        doc,
        provider_id,
        started,
    })
}

/// Records a refusal at admission and hands it back.
fn refused(
    ctx: &JoinContext,
    request_id: &str,
    claim: Option<Arc<NodeClaim>>,
    started: Instant,
    refusal: Refusal,
) -> JoinError {
    let error = JoinError::Refused(refusal);
    conclude(ctx, request_id, claim.as_deref(), started, Err(&error));
    error
}

/// Stages 2 on, for an admitted request holding a join permit: bind →
/// approve → render. Records the outcome in logs, Events and metrics.
pub async fn handle(
    ctx: &JoinContext,
    request_id: &str,
    admitted: Admitted,
) -> Result<JoinResponse, JoinError> {
    let started = admitted.started;
    ctx.metrics.joins_in_flight.inc();
    let mut claim_seen = None;
    let outcome = join(ctx, admitted, &mut claim_seen).await;
    ctx.metrics.joins_in_flight.dec();
    conclude(
        ctx,
        request_id,
        claim_seen.as_deref(),
        started,
        outcome.as_ref(),
    );
    outcome.map(|(response, _)| response)
}

/// Times and records a join's outcome, wherever it ended.
fn conclude(
    ctx: &JoinContext,
    request_id: &str,
    claim: Option<&NodeClaim>,
    started: Instant,
    outcome: Result<&(JoinResponse, Binding), &JoinError>,
) {
    ctx.metrics
        .join_seconds
        .observe(started.elapsed().as_secs_f64());
    record(ctx, request_id, claim, outcome);
}

async fn join(
    ctx: &JoinContext,
    admitted: Admitted,
    claim_seen: &mut Option<Arc<NodeClaim>>,
) -> Result<(JoinResponse, Binding), JoinError> {
    let mut steps = ctx.metrics.steps();
    let Admitted {
        request,
        client_csr,
        serving_csr,
        doc,
        provider_id,
        ..
    } = admitted;
    let attested = attest(ctx, doc, provider_id, claim_seen, &mut steps).await?;
    let node_name = attested.instance.private_dns_name.clone();
    check_csrs(&client_csr, &serving_csr, &attested)?;
    let requests = [
        issue_request(&attested, &request.client_csr, &client_csr, Purpose::Client),
        issue_request(
            &attested,
            &request.serving_csr,
            &serving_csr,
            Purpose::Serving,
        ),
    ];
    let (client_key, serving_key) = (
        client_csr.public_key_fingerprint(),
        serving_csr.public_key_fingerprint(),
    );
    let keys = Keys {
        client: &client_key,
        serving: &serving_key,
    };
    let prepared = prepare(ctx, &attested, keys, &requests).await?;
    steps.done("prepare");
    if prepared.binding == Binding::New {
        observe(ctx, &attested.claim, "attested");
    }
    let issued = requests
        .iter()
        .zip(prepared.csrs)
        .map(|(r, csr)| finish(ctx, r, csr.object));
    let certificates = futures::future::try_join_all(issued).await?;
    let [client_cert, serving_cert] = <[String; 2]>::try_from(certificates)
        .map_err(|_| JoinError::Unavailable("expected two certificates".into()))?;
    steps.done("certificates");
    let (kubelet, ignition) = prepared.rendered;
    let binding = prepared.binding;
    let response = JoinResponse {
        node_name,
        api_server: ctx.cluster.api_server.clone(),
        cluster_ca: ctx.cluster.ca_pem.clone(),
        client_certificate: client_cert,
        serving_certificate: serving_cert,
        kubelet,
        ignition,
    };
    if binding == Binding::New {
        observe(ctx, &attested.claim, "certificates");
    }
    Ok((response, binding))
}

/// What a join has ready before anything is approved.
struct Prepared {
    binding: Binding,
    rendered: (KubeletSettings, serde_json::Value),
    /// The CSR objects, in the order of the requests.
    csrs: Vec<CsrObject>,
}

/// A CSR object a join will approve, and whether this join created it.
struct CsrObject {
    object: CertificateSigningRequest,
    created: bool,
}

/// Judges the binding, finds or creates the CSR objects and renders the
/// config, then records the binding naming those objects. Rendering and
/// the objects need only what attestation established, so they run
/// together; nothing is approved until all of it stands, and a join that
/// fails on the way deletes the objects it created.
async fn prepare(
    ctx: &JoinContext,
    attested: &Attested,
    keys: Keys<'_>,
    requests: &[IssueRequest<'_>],
) -> Result<Prepared, JoinError> {
    // Judged on the cached NodeClaim first, so a replay creates nothing;
    // the write below judges again on the version it writes over.
    let existing = binding::judge(&attested.claim, &attested.doc.instance_id, keys)?;
    let facts = NodeFacts {
        claim: &attested.claim,
        provider_id: &attested.provider_id,
        node_ip: node_ip(attested),
    };
    let (rendered, csrs) = tokio::join!(
        ctx.nodeconfig.render(&ctx.cluster.settings, &facts),
        csr_objects(ctx, requests, existing.as_ref()),
    );
    let csrs = csrs?;
    let bound = match rendered {
        Ok(rendered) => record_binding(ctx, attested, keys, &csrs, existing)
            .await
            .map(|binding| (binding, rendered)),
        Err(e) => Err(e),
    };
    match bound {
        Ok((binding, rendered)) => Ok(Prepared {
            binding,
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
) -> Result<Vec<CsrObject>, JoinError> {
    let each = requests.iter().map(|request| async move {
        let recorded = existing.and_then(|r| r.csrs.iter().find(|c| c.purpose == request.kind()));
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
    let results: Vec<Result<CsrObject, JoinError>> = futures::future::join_all(each).await;
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

/// Writes the binding: a new record, or the resumed one naming the objects
/// this join uses if they are not the recorded ones.
async fn record_binding(
    ctx: &JoinContext,
    attested: &Attested,
    keys: Keys<'_>,
    csrs: &[CsrObject],
    existing: Option<Record>,
) -> Result<Binding, JoinError> {
    let refs: Vec<CsrRef> = csrs
        .iter()
        .zip([Purpose::Client, Purpose::Serving])
        .map(|(csr, purpose)| issuer::reference(kind(purpose), &csr.object))
        .collect();
    let claim = &attested.claim;
    match existing {
        Some(record) if record.csrs == refs => Ok(Binding::Resumed),
        Some(mut record) => {
            record.csrs = refs;
            binding::write(&ctx.claims, claim, &record, true).await?;
            Ok(Binding::Resumed)
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
            binding::write(&ctx.claims, claim, &record, false).await?;
            Ok(Binding::New)
        }
    }
}

/// Records a bootstrap milestone's latency from the NodeClaim's creation.
fn observe(ctx: &JoinContext, claim: &NodeClaim, milestone: &'static str) {
    if let Some(age) = crate::feedback::age_seconds(claim) {
        ctx.metrics.observe_phase(milestone, age);
    }
}

/// Step 1: the request's own structure. Nothing is trusted yet.
fn parse(request: &JoinRequest) -> Result<(ParsedCsr, ParsedCsr), Refusal> {
    let client = csr::parse_csr(request.client_csr.as_bytes()).map_err(Refusal::ClientCsr)?;
    let serving = csr::parse_csr(request.serving_csr.as_bytes()).map_err(Refusal::ServingCsr)?;
    Ok((client, serving))
}

/// Step 2a: the document's signature against the pinned certificates.
fn verify(ctx: &JoinContext, request: &JoinRequest) -> Result<IdentityDocument, Refusal> {
    let verified = identity::verify(request.identity.rsa2048.as_bytes(), &ctx.trust)?;
    Ok(verified.into_document())
}

/// Step 2b, after admission: the NodeClaim, then EC2.
async fn attest(
    ctx: &JoinContext,
    doc: IdentityDocument,
    provider_id: String,
    claim_seen: &mut Option<Arc<NodeClaim>>,
    steps: &mut Steps<'_>,
) -> Result<Attested, JoinError> {
    ctx.claims.ready().await?;
    let matches = ctx.claims.find(&provider_id).await;
    if let [only] = matches.as_slice() {
        *claim_seen = Some(only.clone());
    }
    if matches.is_empty() && !ctx.claims.is_fresh() {
        // The watch is reconnecting: the NodeClaim may be one it missed.
        return Err(JoinError::Unavailable(
            "NodeClaim cache out of date (watch reconnecting)".into(),
        ));
    }
    let claim = nodeclaim::select(&provider_id, matches, doc.pending_time)?;
    steps.done("attest");
    let instance = lookup(ctx, &doc).await?;
    steps.done("ec2");
    Ok(Attested {
        doc,
        claim,
        instance,
        provider_id,
    })
}

/// The instance as EC2 sees it: live, same image, with a DNS name.
async fn lookup(ctx: &JoinContext, doc: &IdentityDocument) -> Result<Ec2Instance, JoinError> {
    let instance = match ctx
        .ec2
        .describe_instance(&doc.region, &doc.instance_id)
        .await
    {
        Ok(instance) => instance,
        Err(e) if e.is_transient() => return Err(JoinError::Unavailable(format!("EC2: {e}"))),
        // The document is AWS-signed, so the instance exists; EC2's API is
        // eventually consistent and may not list a just-launched instance.
        Err(e @ LookupError::NotFound { .. }) => {
            return Err(JoinError::Unavailable(format!("EC2: {e}")))
        }
        Err(e) => return Err(Refusal::Lookup(e).into()),
    };
    if !instance.state.is_live() {
        return Err(Refusal::InstanceNotLive {
            instance_id: doc.instance_id.clone(),
            state: format!("{:?}", instance.state).to_lowercase(),
        }
        .into());
    }
    if instance.image_id != doc.image_id {
        return Err(Refusal::ImageMismatch {
            instance_id: doc.instance_id.clone(),
            signed: doc.image_id.clone(),
            actual: instance.image_id,
        }
        .into());
    }
    if instance.private_dns_name.is_empty() {
        return Err(Refusal::NoPrivateDnsName(doc.instance_id.clone()).into());
    }
    Ok(instance)
}

/// Step 3: the CSRs against what EC2 says this machine is.
fn check_csrs(client: &ParsedCsr, serving: &ParsedCsr, attested: &Attested) -> Result<(), Refusal> {
    let node = &attested.instance.private_dns_name;
    csr::check_client_csr(client, node).map_err(Refusal::ClientCsr)?;
    let dns = [node.clone()];
    csr::check_serving_csr(serving, node, &dns, &attested.instance.private_ips)
        .map_err(Refusal::ServingCsr)
}

/// Step 4: what to ask kube-controller-manager for.
fn issue_request<'a>(
    attested: &Attested,
    pem: &'a str,
    judged: &'a ParsedCsr,
    purpose: Purpose,
) -> IssueRequest<'a> {
    let instance_id = &attested.doc.instance_id;
    let claim = attested.claim.metadata.name.clone().unwrap_or_default();
    IssueRequest {
        name_prefix: format!("autonode-{instance_id}-{}-", kind(purpose)),
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
    }
}

fn kind(purpose: Purpose) -> &'static str {
    match purpose {
        Purpose::Client => "client",
        Purpose::Serving => "serving",
    }
}

/// Step 5: the CSR object approved, signed by kube-controller-manager.
async fn finish(
    ctx: &JoinContext,
    request: &IssueRequest<'_>,
    csr: CertificateSigningRequest,
) -> Result<String, JoinError> {
    let cert = ctx.issuer.finish(request, csr).await?;
    ctx.metrics
        .approvals
        .get_or_create(&KindLabels {
            kind: kind(request.purpose),
        })
        .inc();
    Ok(cert)
}

fn node_ip(attested: &Attested) -> String {
    attested
        .doc
        .private_ip
        .or_else(|| attested.instance.private_ips.first().copied())
        .map(|ip| ip.to_string())
        .unwrap_or_default()
}

/// Deletes a NodeClaim whose instance can never join, in the background.
fn delete_doomed(ctx: &JoinContext, claim: NodeClaim, request_id: String) {
    let (claims, metrics) = (ctx.claims.clone(), ctx.metrics.clone());
    tokio::spawn(async move {
        let name = claim.metadata.name.clone().unwrap_or_default();
        match claims.delete_failed(&claim).await {
            Ok(true) => {
                metrics.nodeclaims_deleted.inc();
                tracing::warn!(request_id, nodeclaim = %name, "instance refused for good; NodeClaim deleted so Karpenter replaces it now");
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(request_id, nodeclaim = %name, error = %e, "could not delete the NodeClaim of a refused instance")
            }
        }
    });
}

/// Logs, counts and reports the outcome on the NodeClaim.
fn record(
    ctx: &JoinContext,
    request_id: &str,
    claim: Option<&NodeClaim>,
    outcome: Result<&(JoinResponse, Binding), &JoinError>,
) {
    let claim_name = claim
        .and_then(|c| c.metadata.name.as_deref())
        .unwrap_or("-");
    let labels = match outcome {
        Ok((response, binding)) => {
            let result = if *binding == Binding::Resumed {
                "resumed"
            } else {
                "joined"
            };
            tracing::info!(request_id, nodeclaim = claim_name, node = %response.node_name, result, "join granted");
            if let Some(claim) = claim {
                ctx.events.normal(
                    claim,
                    "Attested",
                    format!(
                        "instance attested; certificates issued for node {} ({result})",
                        response.node_name
                    ),
                );
            }
            JoinLabels {
                result,
                reason: "none",
            }
        }
        Err(JoinError::Unavailable(why)) => {
            tracing::warn!(request_id, nodeclaim = claim_name, reason = %why, "join could not complete now");
            JoinLabels {
                result: "unavailable",
                reason: "unavailable",
            }
        }
        Err(JoinError::Refused(refusal)) => {
            tracing::warn!(request_id, nodeclaim = claim_name, reason = refusal.reason(), detail = %refusal, "join refused");
            if matches!(refusal, Refusal::PossibleReplay { .. }) {
                ctx.metrics.possible_replays.inc();
            }
            if let Some(claim) = claim {
                if ctx.delete_refused
                    && refusal.dooms_instance()
                    && !matches!(binding::recorded(claim), Ok(Some(_)))
                    && !claim.is_registered()
                {
                    delete_doomed(ctx, claim.clone(), request_id.to_string());
                }
                let reason = match refusal {
                    Refusal::PossibleReplay { .. } => "PossibleReplay",
                    _ => "JoinRefused",
                };
                ctx.events
                    .warning(claim, reason, format!("{refusal} (request {request_id})"));
            }
            JoinLabels {
                result: "refused",
                reason: refusal.reason(),
            }
        }
    };
    ctx.metrics.joins.get_or_create(&labels).inc();
}
