//! No import cycles between the top-level modules of a crate (issue 15's
//! proof): a module that names `crate::x` depends on `x`, and following
//! those edges never leads back. A cycle means two modules each need the
//! other, so neither can be read, tested or moved alone.
//!
//! Read from the source tree as it is when the test runs: the code of each
//! module's files, without comments and without its tests (a `tests.rs`
//! file, or an inline `#[cfg(test)] mod tests`, which may reach anywhere).
//!
//! Needs nothing but the checkout: no root, no control plane.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The crates' source roots.
const SOURCE_ROOTS: &[&str] = &["agent/src", "server/src", "shared/src", "tests/src"];

/// Each top-level module's dependencies on its siblings.
type Edges = BTreeMap<String, BTreeSet<String>>;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

/// The `.rs` files under `dir`, tests left out.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() && name != "tests" {
            files(&path, out);
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// A file's code: comment lines dropped, and everything from an inline
/// test module on (they close the files that have one).
fn code(text: &str) -> String {
    let mut kept = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]"
            && lines.peek().is_some_and(|next| {
                next.trim_start().trim_start_matches("pub(crate) ") == "mod tests {"
            })
        {
            break;
        }
        if !trimmed.starts_with("//") {
            kept.push(line);
        }
    }
    kept.join("\n")
}

/// The top-level modules `code` names: `crate::x…`, and each item of a
/// group `crate::{x, y::z}`.
fn named(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        if code[..at].ends_with('$') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            names.insert(ident(rest));
            continue;
        };
        let mut depth = 1;
        let mut start = true;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 1 => break,
                '}' => depth -= 1,
                ',' if depth == 1 => start = true,
                c if c.is_whitespace() => {}
                _ if start && depth == 1 => {
                    names.insert(ident(&group[i..]));
                    start = false;
                }
                _ => {}
            }
        }
    }
    names
}

/// The edges between the top-level modules of the crate at `src`.
fn edges(src: &Path) -> Edges {
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in fs::read_dir(src).unwrap_or_else(|e| panic!("reading {}: {e}", src.display())) {
        let path = entry.expect("a directory entry").path();
        let name = path.file_stem().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            let mut found = Vec::new();
            files(&path, &mut found);
            modules.entry(name.to_string()).or_default().extend(found);
        } else if name != "lib" && name != "main" && path.extension().is_some_and(|e| e == "rs") {
            modules.entry(name.to_string()).or_default().push(path);
        }
    }
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(module, files)| {
            let uses = files
                .iter()
                .flat_map(|f| named(&code(&fs::read_to_string(f).unwrap_or_default())))
                .filter(|target| target != module && known.contains(target))
                .collect();
            (module.clone(), uses)
        })
        .collect()
}

/// A cycle among `edges`, as the path that closes it, if there is one.
fn cycle(edges: &Edges) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &Edges,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, edges, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_of_a_crate_imports_its_way_back_to_itself() {
    let root = repo();
    for src in SOURCE_ROOTS {
        let edges = edges(&root.join(src));
        assert!(edges.len() > 5, "{src}: too few modules read: {edges:?}");
        if let Some(found) = cycle(&edges) {
            panic!("{src}: import cycle {}", found.join(" -> "));
        }
    }
}

#[test]
fn uses_are_read_from_code_groups_included_and_tests_left_out() {
    let text = "//! see crate::doc\nuse crate::a::X;\nuse crate::{b, c::{D, E}};\n\
                fn f() { crate::d::g(); $crate::m!(); }\n#[cfg(test)]\nmod tests {\n    use crate::t;\n}\n";
    let names: Vec<String> = named(&code(text)).into_iter().collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
}

#[test]
fn a_cycle_is_found_and_named() {
    let edges: Edges = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        cycle(&edges).map(|c| c.join(" -> ")).as_deref(),
        Some("a -> b -> c -> a")
    );
    let mut acyclic = edges;
    acyclic.insert("c".into(), BTreeSet::new());
    assert_eq!(cycle(&acyclic), None);
}
