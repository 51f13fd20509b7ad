use super::cap::counts_toward_cap;
use super::judge::bound_claim;
use super::store::{approved, decided};
use super::*;
use crate::kube::binding;
use crate::kube::karpenter::NodeClaim;
use crate::kube::marks;
use serde_json::json;
use std::sync::Arc;

const NODE: &str = "ip-10-0-1-23.us-west-2.compute.internal";
const PID: &str = "aws:///us-west-2-lax-1a/i-0123456789abcdef0";
const ID: &str = "i-0123456789abcdef0";

fn csr(
    name: &str,
    user: &str,
    status: serde_json::Value,
    age_secs: i64,
) -> CertificateSigningRequest {
    let created = k8s_openapi::jiff::Timestamp::from_second(NOW - age_secs).unwrap();
    serde_json::from_value(json!({
        "metadata": {"name": name, "creationTimestamp": created.to_string()},
        "spec": {"request": "", "signerName": csr::SERVING_SIGNER, "username": user},
        "status": status,
    }))
    .unwrap()
}

const NOW: i64 = 1_800_000_000;
const ME: &str = "system:node:me";

fn approved_status() -> serde_json::Value {
    json!({"conditions": [{"type": "Approved", "status": "True"}]})
}

#[test]
fn pending_and_recently_approved_csrs_count_toward_the_cap() {
    let this = csr("this", ME, json!({}), 0);
    let counted = |other: &CertificateSigningRequest| counts_toward_cap(other, &this, NOW);
    assert!(counted(&csr("pending-old", ME, json!({}), 20 * 3600)));
    assert!(counted(&csr("approved-now", ME, approved_status(), 60)));
    assert!(counted(&csr(
        "issued",
        ME,
        json!({"certificate": "Zm9v"}),
        14 * 60
    )));
    assert!(!counted(&csr(
        "approved-old",
        ME,
        approved_status(),
        15 * 60
    )));
    let denied = json!({"conditions": [{"type": "Denied", "status": "True"}]});
    assert!(!counted(&csr("denied", ME, denied, 60)));
    assert!(!counted(&csr(
        "someone-else",
        "system:node:other",
        json!({}),
        0
    )));
    assert!(!counted(&this), "a CSR does not count against itself");
}

#[test]
fn a_kubelet_rotation_stays_well_under_the_default_cap() {
    // A rotation: one client renewal and one serving CSR approved, and
    // a retried serving CSR pending; the next CSR sees three.
    let this = csr("next", ME, json!({}), 0);
    let others = [
        csr("client", ME, approved_status(), 120),
        csr("serving", ME, approved_status(), 110),
        csr("serving-retry", ME, json!({}), 10),
    ];
    let count = others
        .iter()
        .filter(|o| counts_toward_cap(o, &this, NOW))
        .count();
    assert!(count < DEFAULT_PENDING_CAP, "{count}");
}

fn kubelet_csr(request: &str, usages: usize) -> CertificateSigningRequest {
    serde_json::from_value(json!({
        "metadata": {
            "name": "c1", "uid": "u1", "creationTimestamp": "2026-01-01T10:00:00Z",
            "labels": {crate::kube::marks::CSR_MANAGED_LABEL: "true"},
            "annotations": {"big": "x".repeat(200_000)},
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {
            "request": request, "signerName": csr::SERVING_SIGNER,
            "usages": vec!["server auth"; usages], "username": ME,
            "groups": [csr::NODES_GROUP], "extra": {"k": ["x".repeat(100_000)]},
        },
        "status": {
            "conditions": [{"type": "Approved", "status": "True", "message": "x".repeat(100_000)}],
            "certificate": "Y2VydA==",
        },
    }))
    .unwrap()
}

#[test]
fn what_judging_reads_is_kept_and_nothing_else() {
    let mut kept = kubelet_csr("eHh4", 3);
    keep_for_judging(&mut kept);
    assert_eq!(
        serde_json::to_value(&kept).unwrap(),
        json!({
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": "c1", "uid": "u1", "creationTimestamp": "2026-01-01T10:00:00Z"},
            "spec": {
                "request": "eHh4", "signerName": csr::SERVING_SIGNER,
                "usages": ["server auth", "server auth", "server auth"],
                "username": ME, "groups": [csr::NODES_GROUP],
            },
            "status": {
                "conditions": [{"type": "Approved", "status": "True"}],
                "certificate": "",
            },
        })
    );
    // Still decided and approved, as it was.
    assert!(decided(&kept) && approved(&kept));
}

#[test]
fn an_oversized_request_or_usage_list_is_not_kept() {
    use k8s_openapi::ByteString;
    let mut big = kubelet_csr("", 3);
    big.spec.request = ByteString(vec![b'A'; csr::MAX_CSR_PEM_BYTES + 1]);
    let mut at_limit = big.clone();
    at_limit.spec.request.0.truncate(csr::MAX_CSR_PEM_BYTES);
    let mut many = kubelet_csr("eHh4", MAX_USAGES + 1);
    for csr in [&mut big, &mut at_limit, &mut many] {
        keep_for_judging(csr);
    }
    assert!(big.spec.request.0.is_empty());
    assert_eq!(at_limit.spec.request.0.len(), csr::MAX_CSR_PEM_BYTES);
    assert!(many.spec.request.0.is_empty() && many.spec.usages.is_none());
    assert_eq!(Decline::Oversized.reason(), "csr_too_large");
    assert_eq!(Decline::Oversized.retry_in(), None);
}

fn claim(node_name: Option<&str>, binding: Option<serde_json::Value>) -> Arc<NodeClaim> {
    let mut annotations = serde_json::Map::new();
    if let Some(b) = binding {
        annotations.insert(marks::BINDING.into(), json!(b.to_string()));
    }
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": "c1", "annotations": annotations},
            "spec": {},
            "status": {"providerID": PID, "nodeName": node_name},
        }))
        .unwrap(),
    )
}

fn record(instance_id: &str, node_name: &str) -> serde_json::Value {
    json!({
        "instanceId": instance_id, "region": "us-west-2", "nodeName": node_name,
        "clientKey": "aa", "servingKey": "bb", "csrs": [],
    })
}

fn bound(claims: Vec<Arc<NodeClaim>>) -> Result<binding::Record, Decline> {
    bound_claim(claims, PID).map(|(_, record)| record)
}

#[test]
fn the_region_comes_from_the_binding_not_the_zone() {
    let bound_claim = claim(None, Some(record(ID, NODE)));
    assert_eq!(bound(vec![bound_claim]).unwrap().region, "us-west-2");
}

#[test]
fn the_nodeclaim_must_be_one_and_bound() {
    let reason = |claims| bound(claims).unwrap_err().reason();
    let good = claim(None, Some(record(ID, NODE)));
    assert_eq!(reason(vec![]), "no_nodeclaim");
    assert_eq!(reason(vec![good.clone(), good]), "many_nodeclaims");
    assert_eq!(reason(vec![claim(None, None)]), "not_bound");
    assert_eq!(
        reason(vec![claim(None, Some(json!("not a record")))]),
        "unreadable_binding"
    );
}
