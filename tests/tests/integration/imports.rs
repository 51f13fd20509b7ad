//! Imports point one way. Inside every folder of a crate, at every level,
//! the modules of that folder never import their way back to themselves
//! (issue 15's proof, extended in issue 25 from the crate's top level to
//! every folder, and from `crate::` paths to `super::` and `self::` ones);
//! and in the server, nothing on the join path (`front/`, `join/`,
//! `report/`, `kube/`, `ec2/`, `primitives/`) imports the leader's
//! controllers, the front names nothing of `kube/` but its metrics and the
//! NodeClaim cache's readiness, and `primitives/` imports no role folder. A cycle means two modules
//! each need the other, so neither can be read, tested or moved alone; a
//! join that reaches into a controller runs code that is meant to run on
//! the leader only.
//!
//! Read from the source tree as it is when the test runs: the code of each
//! module's files, without comments and without its tests (a `tests.rs`
//! file, or an inline `#[cfg(test)] mod tests`, which may reach anywhere).
//! A folder's own `mod.rs` is the folder, not one of its children: its
//! children naming an item of it through `super::` is how a folder's
//! parts share its vocabulary, not a cycle.
//!
//! Needs nothing but the checkout: no root, no control plane.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The crates' source roots.
const SOURCE_ROOTS: &[&str] = &["agent/src", "server/src", "shared/src", "tests/src"];

/// The server's folders on the join path, and the folder they must not
/// import: the controllers run on the leader only.
const JOIN_PATH: &[&str] = &["front", "join", "report", "kube", "ec2", "primitives"];
const LEADER_ONLY: &str = "controllers";

/// A module's path from its crate's root (`["join", "render"]`).
type ModPath = Vec<String>;

/// Each child module of one folder, with the siblings it imports.
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

/// The module a file is, from its path under the crate's `src`:
/// `join/mod.rs` is `join`, `join/bind.rs` is `join::bind`, and `lib.rs`
/// and `main.rs` are the crate's root. The binary's `bin/NAME/…` files
/// are a crate of their own, rooted at `bin/NAME`.
fn module_of(relative: &Path) -> ModPath {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap_or_default();
    let stem = file.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
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

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths a `use` tree or a path expression at the start of `text`
/// names, each as its segments, groups expanded (`a::{b, c::{d}}` is
/// `a::b` and `a::c::d`). `self` inside a group names the group's prefix.
fn expand(text: &str) -> Vec<Vec<String>> {
    fn tree(text: &str, at: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let bytes: Vec<char> = text.chars().collect();
        let mut path = prefix.to_vec();
        loop {
            while *at < bytes.len() && bytes[*at].is_whitespace() {
                *at += 1;
            }
            if *at < bytes.len() && bytes[*at] == '{' {
                *at += 1;
                loop {
                    tree(text, at, &path, out);
                    while *at < bytes.len() && bytes[*at].is_whitespace() {
                        *at += 1;
                    }
                    match bytes.get(*at) {
                        Some(',') => *at += 1,
                        Some('}') => {
                            *at += 1;
                            return;
                        }
                        _ => return,
                    }
                    while *at < bytes.len() && bytes[*at].is_whitespace() {
                        *at += 1;
                    }
                    if bytes.get(*at) == Some(&'}') {
                        *at += 1;
                        return;
                    }
                }
            }
            let start = *at;
            while *at < bytes.len() && is_ident(bytes[*at]) {
                *at += 1;
            }
            let segment: String = bytes[start..*at].iter().collect();
            if segment.is_empty() {
                break;
            }
            // `self` in a group names the group's prefix; at the start
            // it is the anchor `resolve` reads.
            if !(segment == "self" && !prefix.is_empty() && path.len() == prefix.len()) {
                path.push(segment);
            }
            if bytes.get(*at) == Some(&':') && bytes.get(*at + 1) == Some(&':') {
                *at += 2;
                continue;
            }
            break;
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
    let mut out = Vec::new();
    tree(text, &mut 0, &[], &mut out);
    out
}

/// The modules (and items) `code` names through `crate::`, `super::` and
/// `self::` paths, resolved against `module`, the file's own module.
fn named(code: &str, module: &[String]) -> BTreeSet<ModPath> {
    let mut found = BTreeSet::new();
    let chars: Vec<(usize, char)> = code.char_indices().collect();
    for (i, &(at, _)) in chars.iter().enumerate() {
        let before = if i == 0 { None } else { Some(chars[i - 1].1) };
        if before.is_some_and(|c| is_ident(c) || c == '$' || c == ':') {
            continue;
        }
        let rest = &code[at..];
        if !["crate::", "super::", "self::"]
            .into_iter()
            .any(|a| rest.starts_with(a))
        {
            continue;
        }
        // One `use` tree is far shorter than this; the bound keeps the
        // reading linear in the file's length.
        let tree: String = rest.chars().take(4000).collect();
        for path in expand(&tree) {
            if let Some(resolved) = resolve(&path, module) {
                found.insert(resolved);
            }
        }
    }
    found
}

/// The root of the crate `module` is in: a binary under `bin/NAME/` is a
/// crate of its own.
fn crate_root(module: &[String]) -> ModPath {
    match module {
        [bin, name, ..] if bin == "bin" => vec![bin.clone(), name.clone()],
        _ => Vec::new(),
    }
}

/// `path` (starting `crate`, `super` or `self`) from the crate's root;
/// `None` where it climbs out of the crate.
fn resolve(path: &[String], module: &[String]) -> Option<ModPath> {
    let mut segments = path.iter().peekable();
    let mut base: ModPath = match segments.next().map(String::as_str) {
        Some("crate") => crate_root(module),
        Some("self") => module.to_vec(),
        Some("super") => {
            let mut up = module.to_vec();
            up.pop()?;
            up
        }
        _ => return None,
    };
    while segments.peek().is_some_and(|s| s.as_str() == "super") {
        segments.next();
        base.pop()?;
    }
    base.extend(segments.cloned());
    Some(base)
}

/// Every file of the crate at `src`, as its module and the paths it names.
fn crate_uses(src: &Path) -> Vec<(ModPath, BTreeSet<ModPath>)> {
    let mut found = Vec::new();
    files(src, &mut found);
    found
        .into_iter()
        .map(|file| {
            let relative = file.strip_prefix(src).expect("under src");
            let module = module_of(relative);
            let text = fs::read_to_string(&file).unwrap_or_default();
            let uses = named(&code(&text), &module);
            (module, uses)
        })
        .collect()
}

/// The modules of the crate at `src`: every `.rs` file and every folder.
fn known_modules(src: &Path) -> BTreeSet<ModPath> {
    let mut found = Vec::new();
    files(src, &mut found);
    let mut known = BTreeSet::new();
    for file in found {
        let module = module_of(file.strip_prefix(src).expect("under src"));
        for end in 0..=module.len() {
            known.insert(module[..end].to_vec());
        }
    }
    known
}

/// For every folder (module with children) of a crate, the edges between
/// its children: child `a` imports child `b` when a file in `a` names a
/// path in `b`. A folder's own file (its `mod.rs`) is not a child.
fn folder_edges(
    uses: &[(ModPath, BTreeSet<ModPath>)],
    known: &BTreeSet<ModPath>,
) -> BTreeMap<ModPath, Edges> {
    let mut folders: BTreeMap<ModPath, Edges> = BTreeMap::new();
    for module in known {
        if let Some((name, parent)) = module.split_last() {
            folders
                .entry(parent.to_vec())
                .or_default()
                .entry(name.clone())
                .or_default();
        }
    }
    for (module, targets) in uses {
        for target in targets {
            // The deepest folder that holds both: their first difference
            // is the pair of siblings the import runs between.
            let common = module
                .iter()
                .zip(target.iter())
                .take_while(|(a, b)| a == b)
                .count();
            if common >= module.len() || common >= target.len() {
                continue;
            }
            let folder = module[..common].to_vec();
            let from = &module[common];
            let to = &target[common];
            let is_module = known.contains(&target[..=common].to_vec());
            if is_module {
                folders
                    .entry(folder)
                    .or_default()
                    .entry(from.clone())
                    .or_default()
                    .insert(to.clone());
            }
        }
    }
    folders
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

/// Every cycle found, one per folder, named by folder.
fn cycles(src: &Path) -> Vec<String> {
    let known = known_modules(src);
    let uses = crate_uses(src);
    folder_edges(&uses, &known)
        .iter()
        .filter_map(|(folder, edges)| {
            cycle(edges).map(|found| format!("{}: {}", folder.join("::"), found.join(" -> ")))
        })
        .collect()
}

#[test]
fn no_module_of_any_folder_imports_its_way_back_to_itself() {
    let root = repo();
    let mut found = Vec::new();
    for src in SOURCE_ROOTS {
        let known = known_modules(&root.join(src));
        assert!(known.len() > 5, "{src}: too few modules read: {known:?}");
        found.extend(
            cycles(&root.join(src))
                .into_iter()
                .map(|c| format!("{src}: {c}")),
        );
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

#[test]
fn nothing_on_the_join_path_imports_the_leaders_controllers() {
    let src = repo().join("server/src");
    let wrong: Vec<String> = crate_uses(&src)
        .into_iter()
        .filter(|(module, _)| {
            module
                .first()
                .is_some_and(|m| JOIN_PATH.contains(&m.as_str()))
        })
        .flat_map(|(module, targets)| {
            targets
                .into_iter()
                .filter(|t| t.first().is_some_and(|m| m == LEADER_ONLY))
                .map(move |t| format!("{} -> {}", module.join("::"), t.join("::")))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "the join path imports the leader's controllers (move what both need down to kube/ or join/):\n{}",
        wrong.join("\n")
    );
}

/// What the HTTPS front may name of the Kubernetes plumbing: its metrics,
/// and the NodeClaim cache it asks whether it is ready. The front is
/// transport (routing, TLS, body limits, status codes); reading, judging
/// and acting on NodeClaims is the join's and the report's (issue 37).
const FRONT_MAY_NAME_OF_KUBE: &[&[&str]] =
    &[&["kube", "metrics"], &["kube", "nodeclaim", "NodeClaims"]];

/// Each `module -> target` of the server whose module is under `folder`
/// and whose target `wrong` picks.
fn server_uses_from(folder: &str, wrong: impl Fn(&ModPath) -> bool) -> Vec<String> {
    crate_uses(&repo().join("server/src"))
        .into_iter()
        .filter(|(module, _)| module.first().is_some_and(|m| m == folder))
        .flat_map(|(module, targets)| {
            targets
                .into_iter()
                .filter(|t| wrong(t))
                .map(|t| format!("{} -> {}", module.join("::"), t.join("::")))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn the_front_holds_transport_and_acts_on_no_nodeclaim() {
    let wrong = server_uses_from("front", |t| {
        t.first().is_some_and(|m| m == "kube")
            && !FRONT_MAY_NAME_OF_KUBE.iter().any(|allowed| {
                t.starts_with(&allowed.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            })
    });
    assert!(
        wrong.is_empty(),
        "front/ reaches into the Kubernetes plumbing (a report's or a join's work belongs in report/ or join/):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_primitives_import_no_role_folder() {
    let wrong = server_uses_from("primitives", |t| {
        t.first().is_some_and(|m| m != "primitives")
    });
    assert!(
        wrong.is_empty(),
        "primitives/ imports a role folder (a primitive is built on nothing of the server's):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn uses_are_read_from_code_groups_included_and_tests_left_out() {
    let text = "//! see crate::doc\nuse crate::a::X;\nuse crate::{b, c::{D, E}};\n\
                fn f() { crate::d::g(); $crate::m!(); }\n#[cfg(test)]\nmod tests {\n    use crate::t;\n}\n";
    let names: Vec<String> = named(&code(text), &[])
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(names, ["a::X", "b", "c::D", "c::E", "d::g"]);
}

#[test]
fn super_and_self_paths_are_resolved_from_the_file_s_module() {
    let module: ModPath = vec!["kubelet".into(), "version".into()];
    let text = "use super::buildinfo::read;\nuse super::{KubeletError, settings};\n\
                fn f() { self::inner::g(); super::super::fsutil::h(); }\n";
    let names: Vec<String> = named(text, &module)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        names,
        [
            "fsutil::h",
            "kubelet::KubeletError",
            "kubelet::buildinfo::read",
            "kubelet::settings",
            "kubelet::version::inner::g"
        ]
    );
}

#[test]
fn siblings_that_use_each_other_through_super_are_a_cycle_and_a_parent_is_not() {
    let known: BTreeSet<ModPath> = [
        vec![],
        vec!["k".to_string()],
        vec!["k".to_string(), "a".to_string()],
        vec!["k".to_string(), "b".to_string()],
    ]
    .into_iter()
    .collect();
    let file = |m: &[&str], text: &str| {
        let module: ModPath = m.iter().map(|s| s.to_string()).collect();
        let uses = named(text, &module);
        (module, uses)
    };
    let parent_only = [
        file(&["k"], "use self::a::X; use self::b::Y;"),
        file(&["k", "a"], "use super::Shared; use super::b::Y;"),
        file(&["k", "b"], "use super::Shared;"),
    ];
    let edges = folder_edges(&parent_only, &known);
    assert_eq!(cycle(&edges[&vec!["k".to_string()]]), None);
    let both = [
        file(&["k", "a"], "use super::b::Y;"),
        file(&["k", "b"], "fn f() { crate::k::a::g() }"),
    ];
    let edges = folder_edges(&both, &known);
    assert_eq!(
        cycle(&edges[&vec!["k".to_string()]])
            .map(|c| c.join(" -> "))
            .as_deref(),
        Some("a -> b -> a")
    );
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
