//! The approver's kubelet CSRs by requester, so that judging one CSR reads
//! its node's other CSRs and not every CSR of both signers.
//!
//! The cap counts a node's CSRs pending or recently approved. Counting by a
//! scan of both stores cost every judgement the whole cluster's CSRs (and
//! each pending CSR is judged again every 30 s): one node with thousands of
//! pending CSRs cost the leader, which also serves joins, CPU for each. The
//! index is kept from the watches' changes (the objects the stores apply or
//! delete) and answers from the stores, so it is never more than a hint:
//! an entry the store no longer holds, or holds for another requester, is
//! dropped when read.

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

/// A CSR in the index: which signer's store, and its name there.
type Entry = (usize, String);

/// Requester (`spec.username`) → its CSRs in the approver's stores.
#[derive(Default)]
pub(super) struct ByNode {
    entries: Mutex<HashMap<String, HashSet<Entry>>>,
}

impl ByNode {
    /// Records what the watch brought about `csr`, from the store of signer
    /// `signer` (`store`): indexed while the store holds it, dropped once
    /// it does not.
    pub(super) fn observe(
        &self,
        signer: usize,
        csr: &CertificateSigningRequest,
        store: &Store<CertificateSigningRequest>,
    ) {
        let Some(user) = csr.spec.username.as_deref() else {
            return;
        };
        let name = csr.name_any();
        let held = store
            .get(&ObjectRef::new(&name))
            .is_some_and(|now| now.metadata.uid == csr.metadata.uid);
        let mut entries = self.lock();
        if held {
            entries
                .entry(user.to_string())
                .or_default()
                .insert((signer, name));
        } else if let Some(set) = entries.get_mut(user) {
            set.remove(&(signer, name));
            if set.is_empty() {
                entries.remove(user);
            }
        }
    }

    /// `user`'s CSRs as `stores` (indexed by signer) hold them now.
    pub(super) fn of(
        &self,
        user: &str,
        stores: &[Store<CertificateSigningRequest>; 2],
    ) -> Vec<Arc<CertificateSigningRequest>> {
        let mut entries = self.lock();
        let Some(set) = entries.get_mut(user) else {
            return Vec::new();
        };
        let mut found = Vec::with_capacity(set.len());
        set.retain(|(signer, name)| {
            let csr = stores
                .get(*signer)
                .and_then(|store| store.get(&ObjectRef::new(name)))
                .filter(|csr| csr.spec.username.as_deref() == Some(user));
            let kept = csr.is_some();
            found.extend(csr);
            kept
        });
        if set.is_empty() {
            entries.remove(user);
        }
        found
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashSet<Entry>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn csr(name: &str, uid: &str, user: &str) -> CertificateSigningRequest {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": uid},
            "spec": {"request": "", "signerName": "s", "username": user},
        }))
        .unwrap()
    }

    #[test]
    fn a_nodes_csrs_are_found_and_gone_ones_dropped() {
        let (client, mut client_writer) = store::<CertificateSigningRequest>();
        let (serving, mut serving_writer) = store::<CertificateSigningRequest>();
        let stores = [client, serving];
        let index = ByNode::default();
        let mine = [csr("a", "1", "me"), csr("b", "2", "me")];
        let theirs = csr("c", "3", "them");
        client_writer.apply_watcher_event(&Event::Apply(mine[0].clone()));
        serving_writer.apply_watcher_event(&Event::Apply(mine[1].clone()));
        client_writer.apply_watcher_event(&Event::Apply(theirs.clone()));
        index.observe(0, &mine[0], &stores[0]);
        index.observe(1, &mine[1], &stores[1]);
        index.observe(0, &theirs, &stores[0]);
        let names = |user| {
            let mut n: Vec<String> = index
                .of(user, &stores)
                .iter()
                .map(|c| c.name_any())
                .collect();
            n.sort();
            n
        };
        assert_eq!(names("me"), ["a", "b"]);
        assert_eq!(names("them"), ["c"]);

        client_writer.apply_watcher_event(&Event::Delete(mine[0].clone()));
        index.observe(0, &mine[0], &stores[0]);
        assert_eq!(names("me"), ["b"]);
        // Replaced under its name by another requester's, unobserved: not
        // counted for the old one.
        serving_writer.apply_watcher_event(&Event::Apply(csr("b", "4", "them")));
        assert_eq!(names("me"), Vec::<String>::new());
    }
}
