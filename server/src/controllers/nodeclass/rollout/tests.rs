//! The rollout guard's decisions, pure: state and NodeClaim outcomes in,
//! what to keep and write out.

use super::*;
use serde_json::json;

const NOW: i64 = 1_700_000_000;

fn values(ami: &str) -> Values {
    Values {
        user_data: "server-url = \"https://a\"\n".into(),
        ami_selector_terms: Some(vec![json!({ "id": ami })]),
    }
}

/// A class whose `good` values are on it, and `desired` wanted.
fn input(state: Option<State>, current: Values, desired: Values) -> Input {
    Input {
        state,
        current,
        desired,
        hold: false,
        retry: None,
        observed: Some(Vec::new()),
        applied_at: Some(NOW),
        failures: 3,
        now: NOW,
    }
}

fn settled(good: &Values) -> State {
    State {
        applied: good.clone(),
        good: Some(good.clone()),
        trial: None,
        refused: None,
        retried: None,
    }
}

/// A launched NodeClaim of AMI `ami-2` (the new values' in most tests).
fn claim(name: &str, outcome: Outcome) -> Observed {
    claim_on(name, "ami-2", outcome)
}

fn claim_on(name: &str, image: &str, outcome: Outcome) -> Observed {
    Observed {
        name: name.into(),
        uid: format!("uid-{name}"),
        outcome,
        image: Some(image.into()),
        launched: true,
    }
}

fn failed(name: &str) -> Observed {
    claim(name, Outcome::Failed(format!("{name} broke")))
}

/// The state after new values `to` were applied over good `from`.
fn trying(from: &Values, to: &Values) -> State {
    let plan = plan(input(Some(settled(from)), from.clone(), to.clone()));
    assert_eq!(plan.notes, [Note::Started]);
    assert_eq!(&plan.target, to);
    plan.state
}

/// `state` with its trial's start read back from the apply.
fn begun(mut state: State) -> State {
    if let Some(trial) = state.trial.as_mut() {
        trial.since = Some(NOW);
    }
    state
}

#[test]
fn new_values_start_a_trial_over_the_good_ones() {
    let (old, new) = (values("ami-1"), values("ami-2"));
    let state = trying(&old, &new);
    assert_eq!(state.applied, new);
    assert_eq!(state.good, Some(old));
    assert_eq!(state.trial, Some(Trial::new()));
}

#[test]
fn unchanged_values_change_nothing() {
    let good = values("ami-1");
    let plan = plan(input(Some(settled(&good)), good.clone(), good.clone()));
    assert_eq!(plan.state, settled(&good));
    assert!(plan.notes.is_empty());
}

#[test]
fn failures_short_of_the_threshold_wait() {
    let (old, new) = (values("ami-1"), values("ami-2"));
    let mut next = input(Some(trying(&old, &new)), new.clone(), new.clone());
    next.observed = Some(vec![failed("a"), failed("b"), claim("c", Outcome::Pending)]);
    let plan = plan(next);
    assert!(plan.notes.is_empty(), "{:?}", plan.notes);
    assert_eq!(plan.target, new);
    let trial = plan.state.trial.expect("still on trial");
    assert_eq!(trial.failures().len(), 2);
    assert_eq!(trial.claims.len(), 3, "the pending one is remembered too");
}

#[test]
fn the_threshold_of_failures_with_none_ready_reverts_and_refuses() {
    let (old, new) = (values("ami-1"), values("ami-2"));
    let mut next = input(Some(trying(&old, &new)), new.clone(), new.clone());
    next.observed = Some(vec![failed("a"), failed("b"), failed("c")]);
    let reverted = plan(next);
    assert_eq!(reverted.target, old);
    // Reverted now, and refusing the new values from now on.
    let [Note::Reverted(failures), Note::Refusing(_)] = reverted.notes.as_slice() else {
        panic!("{:?}", reverted.notes);
    };
    assert_eq!(failures.len(), 3);
    assert_eq!(failures[0].reason, "a broke");
    assert_eq!(reverted.state.applied, old);
    assert_eq!(reverted.state.trial, None);
    assert_eq!(
        reverted.state.refused.as_ref().map(|r| &r.values),
        Some(&new)
    );

    // The flags still render the new values: refused, the good ones kept.
    let again = plan(input(
        Some(reverted.state.clone()),
        old.clone(),
        new.clone(),
    ));
    assert_eq!(again.target, old);
    assert!(matches!(again.notes.as_slice(), [Note::Refusing(f)] if f.len() == 3));
    assert_eq!(again.state, reverted.state, "nothing to write");
}

#[test]
fn one_ready_node_promotes_whatever_failed() {
    let (old, new) = (values("ami-1"), values("ami-2"));
    let mut next = input(Some(trying(&old, &new)), new.clone(), new.clone());
    next.observed = Some(vec![
        failed("a"),
        failed("b"),
        failed("c"),
        claim("d", Outcome::Ready),
    ]);
    let plan = plan(next);
    assert_eq!(plan.notes, [Note::Promoted]);
    assert_eq!(plan.target, new);
    assert_eq!(plan.state, settled(&new));
}

#[test]
fn failures_are_remembered_across_reconciles_and_gone_claims_fail() {
    let (old, new) = (values("ami-1"), values("ami-2"));
    let mut first = input(Some(trying(&old, &new)), new.clone(), new.clone());
    first.observed = Some(vec![failed("a"), claim("b", Outcome::Pending)]);
    let state = plan(first).state;
    // Later: `a` and `b` are gone from the cache (deleted, the deletion
    // not seen), `c` fails: three failures.
    let mut second = input(Some(state), new.clone(), new.clone());
    second.observed = Some(vec![failed("c")]);
    let plan = plan(second);
    let [Note::Reverted(failures), Note::Refusing(_)] = plan.notes.as_slice() else {
        panic!("{:?}", plan.notes);
    };
    let reasons: Vec<&str> = failures.iter().map(|f| f.reason.as_str()).collect();
    assert_eq!(reasons, ["a broke", GONE, "c broke"]);
}

#[test]
fn an_unreadable_cache_judges_nothing() {
    let (old, new) = (values("ami-1"), values("ami-2"));
    let state = begun(trying(&old, &new));
    let mut next = input(Some(state.clone()), new.clone(), new.clone());
    next.observed = None;
    let plan = plan(next);
    assert_eq!(
        plan.state, state,
        "a missing NodeClaim may just not have arrived"
    );
}

#[test]
fn without_good_values_failures_revert_nothing() {
    let new = values("ami-2");
    let mut user = values("ami-0");
    user.user_data = "#!/bin/bash\n".into();
    let started = plan(input(None, user.clone(), new.clone()));
    assert_eq!(started.notes, [Note::Started]);
    assert_eq!(started.state.good, None, "the user's values are not good");
    let mut next = input(Some(started.state), new.clone(), new.clone());
    next.observed = Some(vec![failed("a"), failed("b"), failed("c")]);
    let waiting = plan(next);
    assert!(waiting.notes.is_empty());
    assert_eq!(waiting.target, new);
}

#[test]
fn a_class_without_a_state_has_as_good_only_what_the_flags_render() {
    // Whatever managedFields say of the class's values: anyone may apply
    // under autonode's manager name.
    let (old, new) = (values("ami-1"), values("ami-2"));
    let plan = plan(input(None, old.clone(), new.clone()));
    assert_eq!(plan.notes, [Note::Started]);
    assert_eq!(plan.state.good, None);
    assert_eq!(plan.target, new);
    let same = super::plan(input(None, new.clone(), new.clone()));
    assert_eq!(same.state, settled(&new));
}

#[test]
fn a_held_class_keeps_what_autonode_applied() {
    let (old, new) = (values("ami-1"), values("ami-2"));
    let mut held = input(Some(settled(&old)), old.clone(), new.clone());
    held.hold = true;
    let plan = plan(held.clone());
    assert_eq!(plan.notes, [Note::Held]);
    assert_eq!(plan.target, old);
    assert_eq!(plan.state, settled(&old));
    // Someone else's values on the class are not held.
    let mut edited = old.clone();
    edited.user_data = "#!/bin/bash\n".into();
    held.current = edited.clone();
    assert_eq!(super::plan(held.clone()).target, old);
    held.state = None;
    let ignored = super::plan(held);
    assert_eq!(ignored.notes, [Note::HoldIgnored, Note::Started]);
    assert_eq!(ignored.target, new);
}

#[test]
fn a_held_trial_is_not_judged() {
    let (old, new) = (values("ami-1"), values("ami-2"));
    let state = begun(trying(&old, &new));
    let mut held = input(Some(state.clone()), new.clone(), new.clone());
    held.hold = true;
    held.observed = Some(vec![failed("a"), failed("b"), failed("c")]);
    let plan = plan(held);
    assert_eq!(plan.target, new);
    assert_eq!(plan.state, state);
}

#[test]
fn a_new_retry_value_applies_the_refused_values_once_more() {
    let (old, new) = (values("ami-1"), values("ami-2"));
    let mut next = input(Some(trying(&old, &new)), new.clone(), new.clone());
    next.observed = Some(vec![failed("a"), failed("b"), failed("c")]);
    let refused = plan(next).state;
    let mut retry = input(Some(refused), old.clone(), new.clone());
    retry.retry = Some("1".into());
    let retried = plan(retry.clone());
    assert_eq!(retried.notes, [Note::Retried("1".into()), Note::Started]);
    assert_eq!(retried.target, new);
    assert_eq!(retried.state.retried.as_deref(), Some("1"));
    // The same value again is no new retry.
    retry.state = Some(retried.state.clone());
    retry.current = new.clone();
    assert!(plan(retry).notes.is_empty());
}

#[test]
fn a_long_retry_value_an_older_server_recorded_whole_is_no_new_retry() {
    let (old, new) = (values("ami-1"), values("ami-2"));
    let mut next = input(Some(trying(&old, &new)), new.clone(), new.clone());
    next.observed = Some(vec![failed("a"), failed("b"), failed("c")]);
    let mut refused = plan(next).state;
    let long = "r".repeat(100_000);
    refused.retried = Some(long.clone());
    let mut again = input(Some(refused), old.clone(), new.clone());
    // The class's value as its type reads it: the digest.
    again.retry = Some(crate::kube::class_meta::retry_token(&long));
    let plan = plan(again.clone());
    assert!(
        matches!(plan.notes.as_slice(), [Note::Refusing(_)]),
        "{:?}",
        plan.notes
    );
    assert_eq!(plan.target, old);
    // Recorded again, the state holds the digest, not the value.
    assert_eq!(plan.state.retried, again.retry);
}

#[test]
fn other_new_values_are_tried_even_after_a_refusal() {
    let (old, new, newer) = (values("ami-1"), values("ami-2"), values("ami-3"));
    let mut next = input(Some(trying(&old, &new)), new.clone(), new.clone());
    next.observed = Some(vec![failed("a"), failed("b"), failed("c")]);
    let refused = plan(next).state;
    let plan = plan(input(Some(refused), old.clone(), newer.clone()));
    assert_eq!(plan.notes, [Note::Started]);
    assert_eq!(plan.target, newer);
    assert_eq!(plan.state.refused, None);
}

#[test]
fn the_verdict_needs_good_values_to_revert_and_one_ready_to_promote() {
    let mut trial = Trial::new();
    for name in ["a", "b"] {
        trial.claims.insert(
            name.into(),
            Seen {
                uid: name.into(),
                failed: Some("x".into()),
                launched: true,
            },
        );
    }
    let none: &[Option<String>] = &[];
    let ready = [Some("ami-2".to_string())];
    assert_eq!(verdict(&trial, none, &["ami-2"], 3, true), Verdict::Wait);
    assert!(
        matches!(verdict(&trial, none, &["ami-2"], 2, true), Verdict::Revert(f) if f.len() == 2)
    );
    assert_eq!(verdict(&trial, none, &["ami-2"], 2, false), Verdict::Wait);
    assert_eq!(
        verdict(&trial, &ready, &["ami-2"], 2, true),
        Verdict::Promote
    );
    assert_eq!(verdict(&trial, &ready, &[], 2, true), Verdict::Promote);
    // Each AMI on trial needs a Ready node of its own; a Ready node holds
    // off a revert meanwhile.
    assert_eq!(
        verdict(&trial, &ready, &["ami-2", "ami-4"], 2, true),
        Verdict::Wait
    );
}

/// amd64 and arm64 AMIs, the way `--ami-ids` renders them.
fn two_arch(amd64: &str, arm64: &str) -> Values {
    let mut v = values(amd64);
    v.ami_selector_terms = Some(vec![json!({ "id": amd64 }), json!({ "id": arm64 })]);
    v
}

#[test]
fn only_the_changed_architectures_ami_is_on_trial() {
    let (old, new) = (two_arch("ami-1", "ami-3"), two_arch("ami-1", "ami-4"));
    assert_eq!(new.changed_ami_ids(Some(&old)), ["ami-4"]);
    assert_eq!(new.watched_ami_ids(Some(&old)), ["ami-4"]);
    let mut new_user_data = new.clone();
    new_user_data.user_data = "other".into();
    assert_eq!(
        new_user_data.watched_ami_ids(Some(&old)),
        ["ami-1", "ami-4"]
    );
    // A Ready node of the unchanged AMI does not promote the new arm64 one.
    let mut next = input(Some(trying(&old, &new)), new.clone(), new.clone());
    next.observed = Some(vec![claim_on("amd", "ami-1", Outcome::Ready)]);
    let waiting = plan(next);
    assert!(waiting.notes.is_empty(), "{:?}", waiting.notes);
    assert!(waiting.state.trial.is_some());
    let mut next = input(Some(waiting.state), new.clone(), new.clone());
    next.observed = Some(vec![claim_on("arm", "ami-4", Outcome::Ready)]);
    assert_eq!(plan(next).notes, [Note::Promoted]);
}

#[test]
fn a_claim_that_never_launched_is_forgotten_when_gone() {
    let mut trial = Trial::new();
    let mut unlaunched = claim("a", Outcome::Pending);
    unlaunched.launched = false;
    unlaunched.image = None;
    observe(&mut trial, &[unlaunched, claim("b", Outcome::Pending)]);
    assert_eq!(trial.claims.len(), 2);
    // Both gone: `a` never had an instance, `b` did.
    observe(&mut trial, &[]);
    let failed: Vec<String> = trial.failures().into_iter().map(|f| f.nodeclaim).collect();
    assert_eq!(failed, ["b"]);
    assert_eq!(trial.claims.len(), 1);
}

#[test]
fn a_claim_found_launched_under_other_values_is_forgotten_not_failed() {
    let mut trial = Trial::new();
    observe(&mut trial, &[claim("a", Outcome::Pending)]);
    assert_eq!(trial.claims.len(), 1);
    // Karpenter recorded the old AMI on it after the trial saw it.
    observe(&mut trial, &[claim("a", Outcome::Elsewhere)]);
    assert!(trial.claims.is_empty());
    assert!(trial.failures().is_empty());
}

#[test]
fn a_trial_remembers_a_bounded_number_of_claims() {
    let mut trial = Trial::new();
    let many: Vec<Observed> = (0..MAX_TRACKED + 10)
        .map(|i| claim(&format!("c{i}"), Outcome::Pending))
        .collect();
    observe(&mut trial, &many);
    assert_eq!(trial.claims.len(), MAX_TRACKED);
}

/// A launched NodeClaim of class `default` (`extra` replaces top-level
/// fields).
fn nodeclaim(extra: serde_json::Value) -> NodeClaim {
    let mut base = json!({
        "metadata": {"name": "c1", "uid": "u1", "creationTimestamp": "2023-11-14T22:13:20Z"},
        "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}},
        "status": {"providerID": "aws:///us-west-2a/i-1"},
    });
    if let (Some(b), serde_json::Value::Object(e)) = (base.as_object_mut(), extra) {
        for (k, v) in e {
            b.insert(k, v);
        }
    }
    serde_json::from_value(base).unwrap()
}

#[test]
fn claims_of_the_class_since_the_trial_with_its_ami_are_under_it() {
    let plain = nodeclaim(json!({}));
    assert!(under_trial(&plain, "default", NOW, &["ami-2"]));
    assert!(!under_trial(&plain, "other", NOW, &["ami-2"]));
    assert!(
        !under_trial(&plain, "default", NOW + 1, &["ami-2"]),
        "older"
    );
    let imaged = |id: &str| nodeclaim(json!({"status": {"imageID": id}}));
    assert!(under_trial(&imaged("ami-2"), "default", NOW, &["ami-2"]));
    assert!(!under_trial(&imaged("ami-1"), "default", NOW, &["ami-2"]));
    assert!(
        under_trial(&imaged("ami-1"), "default", NOW, &[]),
        "AMI not kept"
    );
}

#[test]
fn a_claims_outcome_follows_its_conditions_marks_and_age() {
    let deadline = Duration::from_secs(60);
    let conditions = |kind: &str, status: &str| {
        nodeclaim(json!({"status": {"providerID": "aws:///us-west-2a/i-1",
            "conditions": [{"type": kind, "status": status, "message": "why"}]}}))
    };
    assert_eq!(
        outcome(&nodeclaim(json!({})), NOW, deadline),
        Outcome::Pending
    );
    for kind in ["Ready", "Initialized", CONDITION] {
        assert_eq!(
            outcome(&conditions(kind, "True"), NOW, deadline),
            Outcome::Ready
        );
    }
    assert_eq!(
        outcome(&conditions(CONDITION, "False"), NOW, deadline),
        Outcome::Failed("why".into())
    );
    assert_eq!(
        outcome(&conditions("Ready", "False"), NOW, deadline),
        Outcome::Pending
    );
    let marked = nodeclaim(json!({"metadata": {"name": "c1", "uid": "u1",
        "creationTimestamp": "2023-11-14T22:13:20Z",
        "annotations": {marks::BOOTSTRAP_FAILED: "agent phase apply fatal"}}}));
    assert_eq!(
        outcome(&marked, NOW, deadline),
        Outcome::Failed("agent phase apply fatal".into())
    );
    // Refused for the server's own settings, or failed because an
    // impostor Node took it: nothing of the values was tried, whether kept
    // or gone.
    for (note, reason) in [
        (
            "join refused for good: account 1 is not allowed",
            "server:account_not_allowed",
        ),
        ("Registered to Node x", "impostor:node_spoofed"),
    ] {
        let elsewhere = nodeclaim(json!({"metadata": {"name": "c1", "uid": "u1",
            "creationTimestamp": "2023-11-14T22:13:20Z",
            "annotations": {marks::BOOTSTRAP_FAILED: note, marks::FAILURE_REASON: reason}}}));
        assert_eq!(outcome(&elsewhere, NOW, deadline), Outcome::Elsewhere);
        assert_eq!(
            outcome_when_deleted(&elsewhere, NOW, deadline),
            Outcome::Elsewhere
        );
    }
    let late = outcome(&nodeclaim(json!({})), NOW + 61, deadline);
    assert!(matches!(late, Outcome::Failed(r) if r.contains("not Ready 60s")));
    let pending = nodeclaim(json!({}));
    assert_eq!(
        outcome_when_deleted(&pending, NOW, deadline),
        Outcome::Failed(GONE.into())
    );
    assert_eq!(
        outcome_when_deleted(&conditions("Ready", "True"), NOW, deadline),
        Outcome::Ready
    );
    // Never launched (no providerID, no Launched=True): Karpenter gave up
    // on it; that says nothing of the values.
    let unlaunched = nodeclaim(json!({"status": {}}));
    assert_eq!(outcome(&unlaunched, NOW + 61, deadline), Outcome::Pending);
    assert_eq!(
        outcome_when_deleted(&unlaunched, NOW, deadline),
        Outcome::Elsewhere
    );
    let launched =
        nodeclaim(json!({"status": {"conditions": [{"type": "Launched", "status": "True"}]}}));
    assert!(super::launched(&launched));
    assert!(!super::launched(&unlaunched));
}

const KEY: [u8; 32] = [7; 32];

fn key() -> StateKey {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("key");
    std::fs::write(&path, KEY).unwrap();
    StateKey::from_key_file(&path).unwrap()
}

/// A class with uid `uid` whose rollout annotation is `text`, written by
/// `manager`.
fn class_with(uid: &str, text: &str, manager: &str) -> Ec2NodeClass {
    serde_json::from_value(json!({
        "metadata": {"name": "default", "uid": uid, "annotations": {ROLLOUT_ANNOTATION: text},
            "managedFields": [{"manager": manager, "operation": "Apply",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:annotations": {format!("f:{ROLLOUT_ANNOTATION}"): {}}}}}]},
        "spec": {},
    }))
    .unwrap()
}

#[test]
fn the_state_reads_back_only_when_sealed_for_the_class_and_autonode_alone_wrote_it() {
    let (key, state) = (key(), settled(&values("ami-1")));
    let sealed = key.seal("uid-1", &state).unwrap();
    let ours = marks::FIELD_MANAGER;
    assert_eq!(
        read_state(&class_with("uid-1", &sealed, ours), &key).unwrap(),
        Some(state.clone())
    );
    assert!(matches!(
        read_state(&class_with("uid-1", &sealed, "kubectl-edit"), &key),
        Err(StateError::Foreign)
    ));
    let sealed_as = |class: &Ec2NodeClass| read_state(class, &key).map_err(|e| e.to_string());
    // Sealed for another class (or a deleted class of the same name).
    assert!(sealed_as(&class_with("uid-2", &sealed, ours)).is_err());
    // Unsealed, as an older autonode wrote it, or as anyone can.
    let plain = serde_json::to_string(&state).unwrap();
    assert!(sealed_as(&class_with("uid-1", &plain, ours)).is_err());
    assert!(read_state(&Ec2NodeClass::default(), &key)
        .unwrap()
        .is_none());
}

#[test]
fn a_forged_or_tampered_seal_does_not_open() {
    let (key, state) = (key(), settled(&values("ami-1")));
    let sealed = key.seal("uid-1", &state).unwrap();
    let mut wrapper: serde_json::Value = serde_json::from_str(&sealed).unwrap();
    let evil = settled(&values("ami-0eeeeeeeeeeeeeee6"));
    wrapper["state"] = json!(serde_json::to_string(&evil).unwrap());
    let tampered = wrapper.to_string();
    assert_eq!(
        key.open(Some("uid-1"), &tampered),
        Err(seal::OpenError::Forged)
    );
    // Under another key: a forger's own MAC.
    let other = StateKey::from_tls_key(&write_temp(b"-----BEGIN PRIVATE KEY-----")).unwrap();
    let forged = other.seal("uid-1", &evil).unwrap();
    assert_eq!(
        key.open(Some("uid-1"), &forged),
        Err(seal::OpenError::Forged)
    );
    assert_eq!(key.open(None, &sealed), Err(seal::OpenError::NoUid));
    assert_eq!(
        key.open(Some("uid-1"), "{}"),
        Err(seal::OpenError::Unsealed)
    );
}

#[test]
fn a_sealed_state_with_other_ami_terms_is_refused() {
    let key = key();
    let mut odd = values("ami-1");
    odd.ami_selector_terms = Some(vec![json!({"tags": {"team": "x"}})]);
    for terms in [
        json!([{"tags": {"team": "x"}}]),
        json!([{"id": "ami-1", "name": "x"}]),
        json!([{"id": "ami-"}]),
        json!([{"id": "ami-xyz"}]),
        json!([{"id": 5}]),
    ] {
        odd.ami_selector_terms = serde_json::from_value(terms).unwrap();
        let sealed = key.seal("u", &settled(&odd)).unwrap();
        assert!(
            matches!(
                key.open(Some("u"), &sealed),
                Err(seal::OpenError::AmiTerms(_))
            ),
            "{odd:?}"
        );
    }
}

fn write_temp(bytes: &[u8]) -> std::path::PathBuf {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), bytes).unwrap();
    file.into_temp_path().keep().unwrap()
}

#[test]
fn a_key_file_shorter_than_32_bytes_is_refused_and_labels_part_the_keys() {
    let short = write_temp(&[1; 31]);
    let error = StateKey::from_key_file(&short).unwrap_err().to_string();
    assert!(
        error.contains("31 bytes") && error.contains("32"),
        "{error}"
    );
    let same = write_temp(&[1; 32]);
    // One secret, two uses: the keys differ.
    assert_ne!(
        StateKey::from_key_file(&same).unwrap(),
        StateKey::from_tls_key(&same).unwrap()
    );
    assert!(StateKey::from_key_file(std::path::Path::new("/nonexistent/key")).is_err());
}

#[test]
fn only_true_holds() {
    let class = |value: &str| -> Ec2NodeClass {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "annotations": {HOLD_ANNOTATION: value}}, "spec": {},
        }))
        .unwrap()
    };
    assert!(held(&class("true")));
    for value in ["false", "no", "yes", "True", ""] {
        assert!(!held(&class(value)), "{value}");
    }
}

#[test]
fn a_trial_starts_at_the_api_servers_time_of_the_apply_that_began_it() {
    let (old, new) = (values("ami-1"), values("ami-2"));
    let state = trying(&old, &new);
    assert_eq!(state.trial.as_ref().unwrap().since, None, "not applied yet");
    // Read back: the apply's managedFields time, whatever the leader's
    // clock says.
    let mut next = input(Some(state), new.clone(), new.clone());
    next.applied_at = Some(NOW - 30);
    next.now = NOW + 3600;
    next.observed = Some(vec![failed("a"), failed("b"), failed("c")]);
    let plan = plan(next);
    assert!(matches!(plan.notes.as_slice(), [Note::Reverted(_), ..]));
    // Until it is read back, nothing is judged.
    let pending = trying(&old, &new);
    let mut unread = input(Some(pending.clone()), new.clone(), new.clone());
    unread.applied_at = None;
    unread.observed = Some(vec![failed("a"), failed("b"), failed("c")]);
    assert_eq!(super::plan(unread).state, pending);
}

#[test]
fn the_status_condition_follows_the_state() {
    let (old, new) = (values("ami-1"), values("ami-2"));
    let settled_plan = plan(input(Some(settled(&old)), old.clone(), old.clone()));
    assert_eq!(status_condition(&settled_plan).0, "True");
    let mut next = input(Some(begun(trying(&old, &new))), new.clone(), new.clone());
    let on_trial = plan(next.clone());
    assert_eq!(status_condition(&on_trial).1, Reason::OnTrial);
    next.observed = Some(vec![failed("a"), failed("b"), failed("c")]);
    let (status, reason, message) = status_condition(&plan(next));
    assert_eq!((status, reason), ("False", Reason::Reverted));
    assert!(message.contains("a, b, c"), "{message}");
    let mut held = input(Some(settled(&old)), old.clone(), new.clone());
    held.hold = true;
    assert_eq!(status_condition(&plan(held)).1, Reason::Held);
}

#[test]
fn a_filled_in_trial_start_alone_is_no_change() {
    let (old, new) = (values("ami-1"), values("ami-2"));
    let read = trying(&old, &new);
    let planned = plan(input(Some(read.clone()), new.clone(), new.clone())).state;
    assert_eq!(planned.trial.as_ref().unwrap().since, Some(NOW));
    assert!(unchanged_but_start(&read, &planned));
    let mut more = planned.clone();
    more.trial.as_mut().unwrap().claims.insert(
        "a".into(),
        Seen {
            uid: "u".into(),
            failed: None,
            launched: true,
        },
    );
    assert!(!unchanged_but_start(&read, &more));
}

/// The state a revert of `to` back to good `from` leaves.
fn reverted(from: &Values, to: &Values) -> State {
    State {
        refused: Some(Refused {
            values: to.clone(),
            failed: vec![Failure {
                nodeclaim: "n1".into(),
                reason: "broke".into(),
            }],
        }),
        ..settled(from)
    }
}

#[test]
fn a_copy_a_downgrades_leader_sealed_since_is_taken_over() {
    let (one, two) = (values("ami-1"), values("ami-2"));
    // The store settled on ami-1; the previous release's leader then
    // tried ami-2 and reverted it: taken, so ami-2 stays refused.
    assert!(newer_copy(&settled(&one), &reverted(&one, &two), None));
    // Or promoted it: taken, ami-2 is the last good.
    assert!(newer_copy(&settled(&one), &settled(&two), None));
    assert!(newer_copy(&settled(&one), &begun(trying(&one, &two)), None));
    // A retry the class asks for, acted on by that leader.
    let mut retried = settled(&two);
    retried.retried = Some("2026-12-06".into());
    assert!(newer_copy(
        &reverted(&one, &two),
        &retried,
        Some("2026-12-06")
    ));
}

#[test]
fn a_copy_that_would_forget_what_the_store_holds_is_not_taken() {
    let (one, two) = (values("ami-1"), values("ami-2"));
    // The same state, but for a trial's start: nothing to take.
    let trial = trying(&one, &two);
    assert!(!newer_copy(&begun(trial.clone()), &trial, None));
    // An older copy put back: it forgets the store's refusal of ami-2.
    assert!(!newer_copy(&reverted(&one, &two), &trial, None));
    assert!(!newer_copy(&reverted(&one, &two), &settled(&one), None));
    // A retry value alone does not clear it: only the one the class asks
    // for now, and not the one the store acted on already.
    let mut cleared = settled(&two);
    cleared.retried = Some("1".into());
    assert!(!newer_copy(&reverted(&one, &two), &cleared, None));
    assert!(!newer_copy(&reverted(&one, &two), &cleared, Some("2")));
    let mut stored = reverted(&one, &two);
    stored.retried = Some("1".into());
    assert!(!newer_copy(&stored, &cleared, Some("1")));
    // A copy sealed before a retry the store saw is older.
    let mut after_retry = settled(&two);
    after_retry.retried = Some("1".into());
    assert!(!newer_copy(&after_retry, &reverted(&one, &two), None));
}
