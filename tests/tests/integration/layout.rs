//! docs/architecture.md's layout table names every module of the three
//! crates, and nothing that is gone. The table is read against the source
//! tree as it is when the test runs, so a module added, moved or renamed
//! without its row fails here rather than leaving the map quietly wrong
//! (the README's old table had fallen many modules behind).
//!
//! Needs nothing but the checkout: no root, no control plane.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The crates' source roots whose modules the table must list.
const SOURCE_ROOTS: &[&str] = &["agent/src", "server/src", "shared/src"];

/// The document and the heading of its table section.
const DOC: &str = "docs/architecture.md";
const HEADING: &str = "## Layout";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

/// How the table names a module file: its path from the repository root,
/// a folder module (`x/mod.rs`) by its folder (`x/`). Sibling test files
/// (`tests.rs`) are the module's own tests, not modules of their own.
fn row_key(relative: &Path) -> Option<String> {
    let text = relative.to_str()?.replace('\\', "/");
    if !text.ends_with(".rs") || text.ends_with("/tests.rs") {
        return None;
    }
    Some(match text.strip_suffix("mod.rs") {
        Some(folder) => folder.to_string(),
        None => text,
    })
}

/// Every module file under `dir`, as [`row_key`] names it, with its first
/// `//!` line (what a missing row could say).
fn modules(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            modules(root, &path, out);
            continue;
        }
        let relative = path.strip_prefix(root).expect("under the repository");
        if let Some(key) = row_key(relative) {
            let first_doc = fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("//!").map(|d| d.trim().to_string()))
                .unwrap_or_default();
            out.push((key, first_doc));
        }
    }
}

/// The first backticked cell of each table row in the section under
/// [`HEADING`] (up to the next `## ` heading).
fn table_rows(doc: &str) -> BTreeSet<String> {
    doc.lines()
        .skip_while(|l| l.trim_end() != HEADING)
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_layout_table_names_every_module_and_nothing_else() {
    let root = repo();
    let doc = fs::read_to_string(root.join(DOC)).expect("reading docs/architecture.md");
    let rows = table_rows(&doc);
    assert!(!rows.is_empty(), "{DOC}: no table rows under {HEADING:?}");

    let mut found = Vec::new();
    for source in SOURCE_ROOTS {
        modules(&root, &root.join(source), &mut found);
    }
    let missing: Vec<String> = found
        .iter()
        .filter(|(key, _)| !rows.contains(key))
        .map(|(key, what)| format!("| `{key}` | {what} |"))
        .collect();
    let present: BTreeSet<&str> = found.iter().map(|(key, _)| key.as_str()).collect();
    let stale: Vec<&String> = rows
        .iter()
        .filter(|row| SOURCE_ROOTS.iter().any(|s| row.starts_with(s)))
        .filter(|row| !present.contains(row.as_str()))
        .collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "{DOC}'s {HEADING} table is out of date.\n\
         Modules without a row (add them; the text is each file's first doc line):\n{}\n\
         Rows for modules that no longer exist (remove or rename them):\n{}",
        missing.join("\n"),
        stale
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
}

#[test]
fn rows_are_read_from_the_layout_section_only() {
    let doc = "# t\n| `a/src/x.rs` | no |\n## Layout\n\n| path | what |\n|---|---|\n\
               | `a/src/y.rs` | yes |\n| `a/src/z/` | a folder |\n## Next\n| `a/src/w.rs` | no |\n";
    let rows: Vec<String> = table_rows(doc).into_iter().collect();
    assert_eq!(rows, ["a/src/y.rs", "a/src/z/"]);
}

#[test]
fn folder_modules_are_named_by_their_folder_and_tests_are_not_modules() {
    assert_eq!(
        row_key(Path::new("shared/src/csr/mod.rs")).as_deref(),
        Some("shared/src/csr/")
    );
    assert_eq!(
        row_key(Path::new("shared/src/csr/rules.rs")).as_deref(),
        Some("shared/src/csr/rules.rs")
    );
    assert_eq!(row_key(Path::new("shared/src/csr/tests.rs")), None);
    assert_eq!(row_key(Path::new("shared/README.md")), None);
}
