use super::fields::pinned;
use super::userdata::{UnknownFormat, FORMAT_ANNOTATION};
use super::*;
use crate::kube::karpenter::{Ec2NodeClass, Ec2NodeClassSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use serde_json::json;

fn desired(ami_terms: Option<Vec<Value>>) -> Desired {
    Desired {
        user_data: Rendered {
            toml: "server-url = \"https://a\"\n".into(),
            ignition: "{\"ignition\":{\"version\":\"3.0.0\"}}\n".into(),
        },
        ami_terms,
        metadata_options: MetadataOptionsPolicy::Enforce,
    }
}

fn leave_alone() -> Desired {
    Desired {
        metadata_options: MetadataOptionsPolicy::LeaveAlone,
        ..desired(None)
    }
}

/// A class as the API server returns it: Karpenter's defaulted
/// metadataOptions, which are the kept values.
fn kept_spec(terms: &[Value]) -> Ec2NodeClassSpec {
    serde_json::from_value(json!({
        "amiFamily": "Custom", "userData": desired(None).user_data.toml,
        "amiSelectorTerms": terms, "role": "KarpenterNodeRole",
        "metadataOptions": {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled",
                            "httpPutResponseHopLimit": 1, "httpTokens": "required"},
    }))
    .unwrap()
}

fn options(spec: &mut Ec2NodeClassSpec) -> &mut crate::kube::karpenter::MetadataOptions {
    spec.metadata_options.as_mut().unwrap()
}

#[test]
fn only_differing_fields_are_drift() {
    let terms = vec![json!({"id": "ami-0123"})];
    let kept = kept_spec(&terms);
    assert!(drift(&kept, &desired(Some(terms.clone())), Format::Toml).is_empty());
    assert!(
        drift(&kept, &desired(None), Format::Toml).is_empty(),
        "terms left alone"
    );
    let mut edited = kept.clone();
    edited.ami_family = Some("AL2023".into());
    edited.ami_selector_terms = vec![json!({"alias": "al2023@latest"})];
    assert_eq!(
        drift(&edited, &desired(Some(terms)), Format::Toml),
        ["spec.amiFamily", "spec.amiSelectorTerms"]
    );
    edited.user_data = None;
    assert_eq!(
        drift(&edited, &desired(None), Format::Toml),
        ["spec.userData", "spec.amiFamily"]
    );
}

fn annotated(value: Option<&str>) -> Ec2NodeClass {
    let annotations = value.map(|v| json!({ FORMAT_ANNOTATION: v, "other": "x" }));
    serde_json::from_value(json!({
        "metadata": {"name": "default", "annotations": annotations},
        "spec": {"userData": "mine"},
    }))
    .unwrap()
}

#[test]
fn a_classes_annotation_chooses_its_userdata_format() {
    assert_eq!(format_of(&annotated(None)), Ok(Format::Toml));
    assert_eq!(format_of(&annotated(Some("toml"))), Ok(Format::Toml));
    assert_eq!(
        format_of(&annotated(Some("ignition"))),
        Ok(Format::Ignition)
    );
    assert_eq!(
        format_of(&annotated(Some("Ignition"))),
        Err(UnknownFormat("Ignition".into()))
    );
    assert_eq!(
        format_of(&annotated(Some(""))),
        Err(UnknownFormat(String::new()))
    );
}

#[test]
fn the_chosen_format_is_what_is_compared_and_applied() {
    let want = desired(None);
    let kept = kept_spec(&[]);
    assert!(drift(&kept, &want, Format::Toml).is_empty());
    assert_eq!(drift(&kept, &want, Format::Ignition), ["spec.userData"]);
    let mut ignition = kept;
    ignition.user_data = Some(want.user_data.ignition.clone());
    assert!(drift(&ignition, &want, Format::Ignition).is_empty());
    assert_eq!(drift(&ignition, &want, Format::Toml), ["spec.userData"]);
    let body = applied("default", &want, Format::Ignition);
    assert_eq!(body["spec"]["userData"], want.user_data.ignition.as_str());
    let body = applied("default", &want, Format::Toml);
    assert_eq!(body["spec"]["userData"], want.user_data.toml.as_str());
}

#[test]
fn the_rollout_guards_values_are_what_is_applied_in_every_format() {
    let want = desired(Some(vec![json!({"id": "ami-new"})]));
    let good = Values {
        user_data: "old\n".into(),
        ami_selector_terms: Some(vec![json!({"id": "ami-old"})]),
    };
    let kept = pinned(&want, &good);
    for format in [Format::Toml, Format::Ignition] {
        let body = applied("default", &kept, format);
        assert_eq!(body["spec"]["userData"], "old\n");
        assert_eq!(body["spec"]["amiSelectorTerms"], json!([{"id": "ami-old"}]));
    }
    assert_eq!(kept.metadata_options, want.metadata_options);
    let rendered = want.values(Format::Ignition);
    assert_eq!(rendered.user_data, want.user_data.ignition);
    assert_eq!(rendered.ami_selector_terms, want.ami_terms);
}

/// A change to a class's spec.
type Edit = fn(&mut Ec2NodeClassSpec);

#[test]
fn each_weakened_metadata_option_is_drift() {
    let kept = kept_spec(&[]);
    let cases: [(&str, Edit); 4] = [
        ("spec.metadataOptions.httpTokens", |s| {
            options(s).http_tokens = Some("optional".into())
        }),
        ("spec.metadataOptions.httpPutResponseHopLimit", |s| {
            options(s).http_put_response_hop_limit = Some(2)
        }),
        ("spec.metadataOptions.httpEndpoint", |s| {
            options(s).http_endpoint = Some("disabled".into())
        }),
        ("spec.metadataOptions.httpTokens", |s| {
            options(s).http_tokens = None
        }),
    ];
    for (field, edit) in cases {
        let mut edited = kept.clone();
        edit(&mut edited);
        assert_eq!(drift(&edited, &desired(None), Format::Toml), [field]);
        assert!(
            drift(&edited, &leave_alone(), Format::Toml).is_empty(),
            "{field}"
        );
    }
    // Only the kept keys count: IPv6 is the user's.
    let mut ipv6 = kept.clone();
    options(&mut ipv6).http_protocol_ipv6 = Some("enabled".into());
    assert!(drift(&ipv6, &desired(None), Format::Toml).is_empty());
    // No metadataOptions at all (a schema without defaults): all three.
    let mut bare = kept;
    bare.metadata_options = None;
    assert_eq!(
        drift(&bare, &desired(None), Format::Toml),
        [
            "spec.metadataOptions.httpTokens",
            "spec.metadataOptions.httpPutResponseHopLimit",
            "spec.metadataOptions.httpEndpoint"
        ]
    );
}

#[test]
fn the_apply_names_every_kept_field_and_nothing_else() {
    let with_terms = applied(
        "default",
        &desired(Some(vec![json!({"id": "ami-1"})])),
        Format::Toml,
    );
    let spec = with_terms["spec"].as_object().unwrap();
    let mut keys: Vec<&str> = spec.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "amiFamily",
            "amiSelectorTerms",
            "metadataOptions",
            "userData"
        ]
    );
    // The three kept keys only, so httpProtocolIPv6 stays the user's.
    assert_eq!(
        spec["metadataOptions"],
        json!({"httpEndpoint": "enabled", "httpPutResponseHopLimit": 1, "httpTokens": "required"})
    );
    assert_eq!(with_terms["metadata"], json!({"name": "default"}));
    let without = applied("default", &desired(None), Format::Toml);
    assert!(without["spec"].get("amiSelectorTerms").is_none());
    let alone = applied("default", &leave_alone(), Format::Toml);
    assert!(alone["spec"].get("metadataOptions").is_none());
}

#[test]
fn weakened_options_are_exposures_and_defaults_are_not() {
    let mut spec = kept_spec(&[]);
    assert!(exposures(&spec).is_empty());
    options(&mut spec).http_endpoint = Some("disabled".into());
    options(&mut spec).http_protocol_ipv6 = Some("enabled".into());
    assert!(exposures(&spec).is_empty(), "not a way in for pods");
    options(&mut spec).http_tokens = Some("optional".into());
    assert_eq!(exposures(&spec).len(), 1);
    options(&mut spec).http_put_response_hop_limit = Some(2);
    let found = exposures(&spec);
    assert_eq!(found.len(), 2);
    assert!(
        found[1].contains("httpPutResponseHopLimit is 2"),
        "{found:?}"
    );
    spec.metadata_options = None;
    assert!(exposures(&spec).is_empty(), "Karpenter's defaults");
}

fn entry(manager: &str, operation: &str, fields: Value) -> ManagedFieldsEntry {
    ManagedFieldsEntry {
        manager: Some(manager.into()),
        operation: Some(operation.into()),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(fields)),
        ..Default::default()
    }
}

#[test]
fn only_autonodes_applied_metadata_options_are_its_own() {
    let ours = json!({"f:spec": {"f:userData": {}, "f:metadataOptions": {
        ".": {}, "f:httpTokens": {}, "f:httpPutResponseHopLimit": {}, "f:httpEndpoint": {}}}});
    let users = json!({"f:spec": {"f:metadataOptions": {"f:httpProtocolIPv6": {}}}});
    let meta = ObjectMeta {
        managed_fields: Some(vec![
            entry("kubectl-edit", "Update", users.clone()),
            entry(FIELD_MANAGER, "Update", users),
            entry(FIELD_MANAGER, "Apply", ours),
        ]),
        ..Default::default()
    };
    assert_eq!(
        owned_metadata_options(&meta),
        ["httpEndpoint", "httpPutResponseHopLimit", "httpTokens"]
    );
    let released = ObjectMeta {
        managed_fields: Some(vec![entry(
            FIELD_MANAGER,
            "Apply",
            json!({"f:spec": {"f:userData": {}}}),
        )]),
        ..Default::default()
    };
    assert!(owned_metadata_options(&released).is_empty());
    assert!(owned_metadata_options(&ObjectMeta::default()).is_empty());
}

fn path(keys: &[&str]) -> SpecPath {
    keys.iter().map(|k| k.to_string()).collect()
}

#[test]
fn the_handover_keeps_the_owned_keys_at_their_current_values() {
    let mut spec = kept_spec(&[]);
    options(&mut spec).http_put_response_hop_limit = Some(3);
    let keys = [
        path(&["metadataOptions", "httpPutResponseHopLimit"]),
        path(&["metadataOptions", "httpTokens"]),
    ];
    let body = handover("default", &spec, &keys, &[]).unwrap();
    assert_eq!(
        body["spec"],
        json!({"metadataOptions": {"httpPutResponseHopLimit": 3, "httpTokens": "required"}})
    );
    assert_eq!(body["metadata"], json!({"name": "default"}));
    assert_eq!(body["kind"], "EC2NodeClass");
    spec.metadata_options = None;
    assert!(handover("default", &spec, &keys, &[]).is_none());
    assert!(handover("default", &kept_spec(&[]), &[], &[]).is_none());
}

#[test]
fn the_handover_keeps_the_ami_terms_and_what_it_took_over_before() {
    let terms = vec![json!({"id": "ami-0123"}), json!({"id": "ami-0456"})];
    let spec = kept_spec(&terms);
    let before = [path(&["metadataOptions", "httpTokens"])];
    let ami = [path(&["amiSelectorTerms"])];
    let body = handover("default", &spec, &ami, &before).unwrap();
    // Left out, the handover's own earlier fields would be removed.
    assert_eq!(
        body["spec"],
        json!({"amiSelectorTerms": terms, "metadataOptions": {"httpTokens": "required"}})
    );
    // Nothing released: nothing to hand over, whatever was before.
    assert!(handover("default", &spec, &[], &before).is_none());
    // No terms to keep (the typed spec reads an absent list as empty).
    assert!(handover("default", &kept_spec(&[]), &ami, &[]).is_none());
}

#[test]
fn what_autonode_applied_and_no_longer_keeps_is_released() {
    let ours = json!({"f:spec": {"f:userData": {}, "f:amiFamily": {},
        "f:amiSelectorTerms": {}, "f:metadataOptions": {
        ".": {}, "f:httpTokens": {}, "f:httpPutResponseHopLimit": {}, "f:httpEndpoint": {}}}});
    let meta = ObjectMeta {
        managed_fields: Some(vec![
            entry("kubectl-edit", "Update", json!({"f:spec": {"f:role": {}}})),
            entry(FIELD_MANAGER, "Apply", ours),
        ]),
        ..Default::default()
    };
    assert_eq!(
        applied_paths(&meta, FIELD_MANAGER),
        [
            path(&["amiFamily"]),
            path(&["amiSelectorTerms"]),
            path(&["metadataOptions", "httpEndpoint"]),
            path(&["metadataOptions", "httpPutResponseHopLimit"]),
            path(&["metadataOptions", "httpTokens"]),
            path(&["userData"]),
        ]
    );
    let terms = Some(vec![json!({"id": "ami-0123"})]);
    assert!(released(&meta, &desired(terms.clone())).is_empty());
    // --ami-ids unset.
    assert_eq!(
        released(&meta, &desired(None)),
        [path(&["amiSelectorTerms"])]
    );
    // Enforcement off, with and without AMI ids.
    let options = [
        path(&["metadataOptions", "httpEndpoint"]),
        path(&["metadataOptions", "httpPutResponseHopLimit"]),
        path(&["metadataOptions", "httpTokens"]),
    ];
    let off = Desired {
        ami_terms: terms,
        ..leave_alone()
    };
    assert_eq!(released(&meta, &off), options);
    let mut both = vec![path(&["amiSelectorTerms"])];
    both.extend(options);
    assert_eq!(released(&meta, &leave_alone()), both);
    // Nothing applied, nothing to let go of.
    assert!(released(&ObjectMeta::default(), &leave_alone()).is_empty());
}

#[test]
fn ami_ids_become_sorted_id_terms() {
    let entries = ["arm64=ami-0456".to_string(), " amd64=ami-0123 ".to_string()];
    assert_eq!(
        ami_selector_terms(&entries).unwrap(),
        Some(vec![json!({"id": "ami-0123"}), json!({"id": "ami-0456"})])
    );
    assert_eq!(ami_selector_terms(&[]).unwrap(), None);
    assert_eq!(ami_selector_terms(&[String::new()]).unwrap(), None);
    for bad in [
        "ami-0123",
        "amd64=0123",
        "=ami-01",
        "amd64=ami-xyz",
        "amd64=ami-",
    ] {
        assert!(ami_selector_terms(&[bad.into()]).is_err(), "{bad}");
    }
    let twice = ["amd64=ami-01".to_string(), "amd64=ami-02".to_string()];
    assert_eq!(
        ami_selector_terms(&twice),
        Err(AmiIdsError::Duplicate("amd64".into()))
    );
}

/// A class as autonode's apply returned it: its apply entry at `at` (RFC
/// 3339), beside a later one of another manager's.
fn applied_class(at: &str) -> Ec2NodeClass {
    serde_json::from_value(json!({
        "metadata": {"name": "default", "managedFields": [
            {"manager": FIELD_MANAGER, "operation": "Apply", "time": at},
            {"manager": FIELD_MANAGER, "operation": "Update", "subresource": "status",
             "time": "2030-01-01T00:00:00Z"},
        ]},
        "spec": {},
    }))
    .unwrap()
}

#[test]
fn a_trials_start_is_the_time_of_autonodes_own_apply_that_changed_the_class() {
    let values = rollout::Values {
        user_data: "x".into(),
        ami_selector_terms: None,
    };
    let mut state = rollout::State {
        applied: values,
        good: None,
        trial: serde_json::from_value(json!({"claims": {}})).unwrap(),
        refused: None,
        retried: None,
    };
    let class = applied_class("2026-11-29T10:00:00Z");
    let since = |s: &rollout::State| s.trial.as_ref().and_then(|t| t.since);
    assert_eq!(
        since(&reconcile::started(&state, &class, true)),
        Some(1_795_946_400)
    );
    // A no-op apply's entry may be anyone's who applied as autonode-server.
    assert_eq!(since(&reconcile::started(&state, &class, false)), None);
    // A start already recorded stays.
    state.trial.as_mut().unwrap().since = Some(7);
    assert_eq!(since(&reconcile::started(&state, &class, true)), Some(7));
}
