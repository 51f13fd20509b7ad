//! The quantity parser and the comparison, without a cluster.

use super::*;
use crate::primitives::quantity::{parse, QuantityError, MAX_LEN};

fn milli(text: &str) -> i128 {
    parse(text)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .milli()
}

/// Texts and their value in thousandths: the forms the API server and
/// kubelet write, fractions, signs and exponents, and amounts finer than a
/// thousandth (rounded up, as the API server's `MilliValue` does).
const READ: &[(&str, i128)] = &[
    ("3920m", 3920),
    ("4", 4000),
    ("110", 110_000),
    ("15Gi", 15 * (1 << 30) * 1000),
    ("14848Mi", 14848 * (1 << 20) * 1000),
    ("16069628Ki", 16_069_628 * 1024 * 1000),
    ("17179869184", 17_179_869_184_000),
    ("1k", 1_000_000),
    ("20G", 20_000_000_000_000),
    ("1Ei", (1i128 << 60) * 1000),
    ("1.5Gi", 3 * (1 << 29) * 1000),
    ("0.5", 500),
    (".5", 500),
    ("2.", 2000),
    ("+3", 3000),
    ("-3", -3000),
    ("1e3", 1_000_000),
    ("1E-3", 1),
    ("12e+2", 1_200_000),
    ("0", 0),
    ("100n", 1),
    ("1500u", 2),
    ("0.0001", 1),
    ("0n", 0),
    ("1e-90", 1),
];

#[test]
fn quantities_are_read_exactly_and_rounded_up_past_a_thousandth() {
    for (text, expected) in READ {
        assert_eq!(milli(text), *expected, "{text}");
    }
}

#[test]
fn what_is_not_a_quantity_is_refused_by_name() {
    assert_eq!(parse(""), Err(QuantityError::Empty));
    let long = "1".repeat(MAX_LEN + 1);
    assert_eq!(parse(&long), Err(QuantityError::TooLong(MAX_LEN + 1)));
    for text in ["Gi", "-", ".", "1.2.3", "x"] {
        assert!(
            matches!(parse(text), Err(QuantityError::NoNumber(ref t)) if t == text),
            "{text}: {:?}",
            parse(text)
        );
    }
    for text in ["1KB", "1gi", "1 Gi", "1e", "1e+", "1ee3", "5%", "1Mi "] {
        assert!(
            matches!(parse(text), Err(QuantityError::Suffix(ref t)) if t == text),
            "{text}: {:?}",
            parse(text)
        );
    }
    let past_i128 = format!("2{}", "0".repeat(35));
    for text in [
        "1e40",
        "999999999999999999999999999999999999999",
        "999999999999999999Ei",
        &past_i128,
    ] {
        assert!(
            matches!(parse(text), Err(QuantityError::TooLarge(_))),
            "{text}: {:?}",
            parse(text)
        );
    }
}

#[test]
fn display_is_in_thousandths_or_whole_units() {
    assert_eq!(Quantity::from_milli(3920).to_string(), "3920m");
    assert_eq!(Quantity::from_milli(4000).to_string(), "4");
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What Karpenter writes for an m5.xlarge with its EKS defaults.
fn expected() -> BTreeMap<String, String> {
    map(&[
        ("cpu", "3920m"),
        ("memory", "14162Mi"),
        ("pods", "58"),
        ("ephemeral-storage", "17Gi"),
        ("nvidia.com/gpu", "1"),
    ])
}

/// A node's allocatable: cpu, memory, pods, ephemeral-storage.
fn node([cpu, memory, pods, storage]: [&str; 4]) -> BTreeMap<String, String> {
    map(&[
        ("cpu", cpu),
        ("memory", memory),
        ("pods", pods),
        ("ephemeral-storage", storage),
    ])
}

#[test]
fn a_node_that_matches_or_is_larger_falls_short_of_nothing() {
    let tolerance = Tolerance::default();
    assert!(shortfalls(&expected(), &expected(), tolerance).is_empty());
    let larger = node(["4", "15Gi", "110", "18Gi"]);
    assert!(shortfalls(&expected(), &larger, tolerance).is_empty());
    // Written in other units, the same amounts.
    let same = node(["3.92", "14501888Ki", "58", "18253611008"]);
    assert!(shortfalls(&expected(), &same, tolerance).is_empty());
}

#[test]
fn a_shortfall_within_the_tolerance_is_not_reported() {
    // 14162Mi less 5% is 13453.9Mi.
    let node = map(&[("memory", "13454Mi")]);
    assert!(shortfalls(&expected(), &node, Tolerance::percent(5)).is_empty());
    let found = shortfalls(&expected(), &node, Tolerance::percent(4));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].resource, Resource::Memory);
    assert_eq!(found[0].percent, 4);
    // Exactly at the tolerance is within it; one thousandth more is not.
    let one_core = map(&[("cpu", "1")]);
    let at = map(&[("cpu", "950m")]);
    assert!(shortfalls(&one_core, &at, Tolerance::percent(5)).is_empty());
    let past = map(&[("cpu", "949m")]);
    assert_eq!(shortfalls(&one_core, &past, Tolerance::percent(5)).len(), 1);
    // No tolerance: any shortfall counts.
    let node = map(&[("pods", "57")]);
    assert_eq!(
        shortfalls(&expected(), &node, Tolerance::percent(0)).len(),
        1
    );
}

#[test]
fn each_short_resource_is_named_with_both_amounts_and_its_fields() {
    let small = node(["3", "12Gi", "29", "10Gi"]);
    let found = shortfalls(&expected(), &small, Tolerance::default());
    let names: Vec<&str> = found.iter().map(|s| s.resource.name()).collect();
    assert_eq!(names, ["cpu", "memory", "pods", "ephemeral-storage"]);
    let pods = found[2].to_string();
    assert_eq!(
        pods,
        "pods 29 on the node, 58 expected (29 less, 50%; set spec.kubelet.maxPods (or podsPerCore))"
    );
    assert!(found[0].to_string().contains("920m less"), "{}", found[0]);
    assert!(found[0]
        .to_string()
        .contains("kubeReserved/systemReserved cpu"));
    assert!(found[1].to_string().contains("1874Mi less"), "{}", found[1]);
    assert!(found[1]
        .to_string()
        .contains("evictionHard memory.available"));
    assert!(found[3].to_string().contains("7168Mi less"), "{}", found[3]);
    assert!(found[3]
        .to_string()
        .contains("evictionHard nodefs.available"));
    let note = note(&found, "ip-10-0-0-1.ec2.internal", "default");
    assert!(note.starts_with("Node ip-10-0-0-1.ec2.internal has less allocatable"));
    assert!(note.contains("EC2NodeClass default"), "{note}");
    assert!(note.contains(&pods), "{note}");
}

#[test]
fn what_either_side_does_not_state_or_garbles_is_not_compared() {
    let node = map(&[("cpu", "lots"), ("pods", "1")]);
    let expected = map(&[("cpu", "4"), ("memory", "1Gi")]);
    assert!(shortfalls(&expected, &node, Tolerance::default()).is_empty());
    let garbled = map(&[("pods", "many")]);
    assert!(shortfalls(&garbled, &node, Tolerance::default()).is_empty());
    assert!(shortfalls(&BTreeMap::new(), &node, Tolerance::default()).is_empty());
}

#[test]
fn only_the_compared_resources_of_a_node_are_read() {
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n1"},
        "status": {"allocatable": {
            "cpu": "3920m", "memory": "15Gi", "pods": "110",
            "ephemeral-storage": "17Gi", "hugepages-2Mi": "0",
        }},
    }))
    .unwrap();
    let read = node_allocatable(&node);
    let keys: Vec<&str> = read.keys().map(String::as_str).collect();
    assert_eq!(keys, ["cpu", "ephemeral-storage", "memory", "pods"]);
    assert!(node_allocatable(&Node::default()).is_empty());
}

#[test]
fn the_checked_entry_is_found_among_the_milestones() {
    assert!(checked("registered,ready,capacity"));
    assert!(!checked("registered,ready"));
    assert!(!checked("capacity-ish"));
    assert!(!checked(""));
}

#[test]
fn a_tolerance_over_100_percent_is_100() {
    assert_eq!(Tolerance::percent(250), Tolerance::percent(100));
    assert!(Tolerance::percent(100).allows(1000, 1000));
}
