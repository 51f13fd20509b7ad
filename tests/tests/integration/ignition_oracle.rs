//! autonode's Ignition support judged by the real Ignition (Debian's 2.14):
//! every case of tests/ignition/corpus/ gets the same verdict from
//! `autonode-agent ignition apply` as from the real files stage (or is one
//! of autonode's documented refusals of valid Ignition), leaves the same
//! tree, and applies a second time without changing anything. Spec 3.4–3.6,
//! which this Ignition cannot read, are proven through their 3.3 twins.
//! docs/ignition.md's lists of supported and refused features are the
//! corpus's.
//!
//! Needs root (useradd --root, file owners), as the rest of the suite does,
//! and `ignition` installed (tests/setup/install-deps).

use anyhow::{Context, Result};
use autonode_tests::oracles::ignition::{
    self as oracle, diff, load_corpus, run_autonode, run_ignition, seed_root, snapshot, validate,
    with_version, Case, Expect, Snapshot, Verdict,
};
use autonode_tests::server::binary;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The spec versions Debian's Ignition cannot read, checked by twin.
const NEWER_VERSIONS: &[&str] = &["3.4.0", "3.5.0", "3.6.0"];

fn agent() -> PathBuf {
    binary("autonode-agent").expect("autonode-agent is built")
}

fn corpus() -> Vec<Case> {
    let cases = load_corpus(&oracle::corpus_dir()).expect("loading the corpus");
    assert!(cases.len() >= 40, "the corpus lost cases: {}", cases.len());
    cases
}

/// autonode's apply of `config` into a fresh root seeded for `case`; the
/// verdict and the tree.
fn autonode_once(case: &Case, work: &Path, config: &Path) -> Result<(Verdict, Snapshot)> {
    let root = work.join("autonode");
    seed_root(&root, &case.sidecar.seed)?;
    let run = run_autonode(&agent(), &root, config)?;
    Ok((run.verdict, snapshot(&root)?))
}

/// Checks one case; every problem, as lines of text.
fn check(case: &Case) -> Result<Vec<String>> {
    let work = tempfile::tempdir()?;
    let seeded = work.path().join("seed");
    seed_root(&seeded, &case.sidecar.seed)?;
    let seeded = snapshot(&seeded)?;
    let autonode_root = work.path().join("autonode");
    seed_root(&autonode_root, &case.sidecar.seed)?;
    let first = run_autonode(&agent(), &autonode_root, &case.config)?;
    let after_first = snapshot(&autonode_root)?;
    let validation = validate(&case.config)?;
    let mut problems = Vec::new();
    if case.sidecar.expect == Expect::RefusedByAutonode {
        if !validation.accepted {
            problems.push(format!(
                "corpus: not valid Ignition, so not a deliberate refusal: {}",
                validation.message
            ));
        }
        if !matches!(first.verdict, Verdict::Refused(_)) {
            problems.push(format!(
                "autonode does not refuse it (exit 2): {:?}",
                first.verdict
            ));
        }
        problems.extend(refusal_problems(
            case,
            &first.verdict,
            &seeded,
            &after_first,
        ));
        return Ok(problems);
    }
    let ignition_work = work.path().join("ignition");
    seed_root(&ignition_work.join("root"), &case.sidecar.seed)?;
    let theirs = run_ignition(&ignition_work, &case.config)?;
    let ignition_applied = validation.accepted && theirs == Verdict::Applied;
    if case.sidecar.expect == Expect::Refused {
        if ignition_applied {
            problems.push("corpus: the real Ignition applies it".to_string());
        }
        problems.extend(refusal_problems(
            case,
            &first.verdict,
            &seeded,
            &after_first,
        ));
        return Ok(problems);
    }
    if !ignition_applied {
        problems.push(format!(
            "corpus: the real Ignition refuses it: {} {theirs:?}",
            validation.message
        ));
    }
    if first.verdict != Verdict::Applied {
        problems.push(format!(
            "autonode does not apply what Ignition applies: {:?}",
            first.verdict
        ));
        return Ok(problems);
    }
    let theirs = snapshot(&ignition_work.join("root"))?;
    for d in diff(("ignition", &theirs), ("autonode", &after_first), false) {
        problems.push(format!("tree: {d}"));
    }
    problems.extend(second_run_problems(case, &autonode_root, &after_first)?);
    Ok(problems)
}

/// autonode's apply again on its own result: applied, "changed: 0", and no
/// entry rewritten.
fn second_run_problems(case: &Case, root: &Path, after_first: &Snapshot) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let second = run_autonode(&agent(), root, &case.config)?;
    let changed = second.report.lines().next().unwrap_or_default().to_string();
    if second.verdict != Verdict::Applied || changed != "changed: 0 entries" {
        problems.push(format!(
            "second run: {:?}, reported {changed:?} (expected no change)",
            second.verdict
        ));
    }
    let after_second = snapshot(root)?;
    for d in diff(
        ("first run", after_first),
        ("second run", &after_second),
        true,
    ) {
        problems.push(format!("second run changed the tree: {d}"));
    }
    Ok(problems)
}

/// A refusal must say why (the sidecar's words); a refusal of the config
/// (exit 2) must also leave the root as seeded: nothing of a refused config
/// is applied. A failure of the machine (exit 1) may have got part way, as
/// the real Ignition's failures do.
fn refusal_problems(
    case: &Case,
    verdict: &Verdict,
    seeded: &Snapshot,
    after: &Snapshot,
) -> Vec<String> {
    let mut problems = Vec::new();
    let why = match verdict {
        Verdict::Applied => {
            problems.push("autonode applies it (exit 0)".to_string());
            return problems;
        }
        Verdict::Refused(why) | Verdict::Failed(why) => why,
    };
    if let Some(reason) = &case.sidecar.reason {
        if !why.to_lowercase().contains(&reason.to_lowercase()) {
            problems.push(format!("autonode's refusal does not say {reason:?}: {why}"));
        }
    }
    if matches!(verdict, Verdict::Refused(_)) {
        for d in diff(("seeded", seeded), ("autonode", after), false) {
            problems.push(format!("refused but changed the root: {d}"));
        }
    }
    problems
}

fn report(failures: &[(String, Vec<String>)]) -> String {
    let mut text = String::new();
    for (name, problems) in failures {
        text.push_str(&format!("\n{name}:\n"));
        for p in problems {
            text.push_str(&format!("  - {p}\n"));
        }
    }
    text
}

#[test]
fn corpus_cases_get_the_real_ignitions_verdict_and_tree() {
    let cases = corpus();
    let mut failures = Vec::new();
    for case in &cases {
        let problems = check(case)
            .with_context(|| format!("case {}", case.name))
            .unwrap_or_else(|e| vec![format!("harness: {e:#}")]);
        eprintln!(
            "ignition oracle: {} {:?}: {}",
            case.name,
            case.sidecar.expect,
            if problems.is_empty() { "ok" } else { "DIFFERS" }
        );
        if !problems.is_empty() {
            failures.push((case.name.clone(), problems));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from the real Ignition:{}",
        failures.len(),
        cases.len(),
        report(&failures)
    );
}

#[test]
fn versions_3_4_to_3_6_apply_like_their_3_3_twins() {
    let mut failures = Vec::new();
    let mut twins = 0;
    for case in corpus().iter().filter(|c| c.sidecar.twins) {
        let work = tempfile::tempdir().expect("tempdir");
        let (base_verdict, base_tree) =
            autonode_once(case, &work.path().join("base"), &case.config).expect("autonode");
        for version in NEWER_VERSIONS {
            let twin = work.path().join(format!("{version}.ign"));
            with_version(&case.config, version, &twin).expect("twin");
            let (verdict, tree) =
                autonode_once(case, &work.path().join(version), &twin).expect("autonode");
            twins += 1;
            let mut problems = Vec::new();
            let same = std::mem::discriminant(&verdict) == std::mem::discriminant(&base_verdict);
            if !same {
                problems.push(format!(
                    "verdict {verdict:?}, the original's {base_verdict:?}"
                ));
            }
            for d in diff(("original", &base_tree), (version, &tree), false) {
                problems.push(format!("tree: {d}"));
            }
            if !problems.is_empty() {
                failures.push((format!("{} as {version}", case.name), problems));
            }
        }
    }
    assert!(twins > 0, "no case to make twins of");
    assert!(
        failures.is_empty(),
        "newer versions differ:{}",
        report(&failures)
    );
}

#[test]
fn the_ignition_doc_lists_what_the_corpus_proves() {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ignition.md");
    let doc = std::fs::read_to_string(&doc_path).expect("reading docs/ignition.md");
    let supported = oracle::readme_keys(&doc, "**Supported**").expect("supported list");
    let refused = oracle::readme_keys(&doc, "**Refused**").expect("refused list");
    let mut proven = BTreeSet::new();
    let mut refusals = BTreeSet::new();
    for case in corpus() {
        let set = if case.sidecar.expect == Expect::Accepted {
            &mut proven
        } else {
            &mut refusals
        };
        set.extend(case.sidecar.features.iter().cloned());
    }
    let both: Vec<_> = proven.intersection(&refusals).collect();
    assert!(
        both.is_empty(),
        "features both proven and refused: {both:?}"
    );
    assert_eq!(
        supported, proven,
        "docs/ignition.md's **Supported** list and the accepted corpus cases' features differ"
    );
    assert_eq!(
        refused, refusals,
        "docs/ignition.md's **Refused** list and the refused corpus cases' features differ"
    );
}
