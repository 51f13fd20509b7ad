//! docs/architecture.md's layout table names every module of the three
//! crates, and nothing that is gone. The table is read against the source
//! tree as it is when the test runs, so a module added, moved or renamed
//! without its row fails here rather than leaving the map quietly wrong
//! (the README's old table had fallen many modules behind).
//!
//! Two rules of the tree are checked here too: the server's top level
//! holds its role folders and nothing else, so a new module has to say
//! which role it serves; and a module with parts is `foo/mod.rs`, never
//! `foo.rs` beside `foo/`, so a module is found in one place.
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

/// What may stand at the top of `server/src`: the crate roots, the role
/// folders (the subcommands, the HTTPS front, the join, the agents'
/// reports, the Kubernetes plumbing, EC2, the leader's controllers, the
/// primitives they share) and the log format that both the binary and the
/// Events use.
const SERVER_TOP: &[&str] = &[
    "lib.rs",
    "main.rs",
    "logfmt.rs",
    "cmd/",
    "front/",
    "join/",
    "report/",
    "kube/",
    "ec2/",
    "attestation/",
    "controllers/",
    "primitives/",
];

/// The entries at the top of `dir`, folders with a trailing `/`.
fn top_level(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .map(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                format!("{name}/")
            } else {
                name.to_string()
            }
        })
        .collect()
}

/// Every `foo.rs` under `dir` that has a folder `foo/` beside it.
fn both_conventions(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            if path.with_extension("rs").is_file() {
                out.push(path.with_extension("rs"));
            }
            both_conventions(&path, out);
        }
    }
}

#[test]
fn the_servers_top_level_holds_its_role_folders_only() {
    let found = top_level(&repo().join("server/src"));
    let allowed: BTreeSet<String> = SERVER_TOP.iter().map(|s| s.to_string()).collect();
    let stray: Vec<&String> = found.difference(&allowed).collect();
    assert!(
        stray.is_empty(),
        "server/src holds more than its role folders: {stray:?} (put each where its role is: \
         cmd/, front/, join/, report/, kube/, ec2/, attestation/, controllers/ or primitives/)"
    );
}

#[test]
fn a_module_with_parts_is_a_folder_with_mod_rs() {
    let root = repo();
    let mut found = Vec::new();
    for source in SOURCE_ROOTS.iter().chain(["tests/src"].iter()) {
        both_conventions(&root.join(source), &mut found);
    }
    assert!(
        found.is_empty(),
        "modules written as foo.rs beside foo/ (move each to foo/mod.rs): {found:?}"
    );
}

/// The section of docs/architecture.md that lists the join's steps.
const STEPS_HEADING: &str = "### The server, for each join";

/// The step names of a list in `text`: each line (its prefix `prefix`
/// taken off first) that opens with a bold name, `- **admit**` or
/// `1. **admit**`.
fn bold_list(text: &str, prefix: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(str::trim_start)
        .filter_map(|l| {
            let rest = l.strip_prefix("- ").or_else(|| {
                l.split_once(". ")
                    .map(|(_, r)| r)
                    .filter(|_| l.starts_with(|c: char| c.is_ascii_digit()))
            })?;
            let name = rest.strip_prefix("**")?.split("**").next()?;
            Some(name.to_string())
        })
        .collect()
}

/// The section under `heading` up to the next heading of any level.
fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let Some(start) = doc.find(heading) else {
        return "";
    };
    let body = &doc[start + heading.len()..];
    let end = body.find("\n#").unwrap_or(body.len());
    &body[..end]
}

#[test]
fn the_joins_steps_are_one_list_in_code_docs_files_and_metrics() {
    use autonode_server::join::Step;
    let root = repo();
    let steps: Vec<String> = Step::ALL.iter().map(|s| s.name().to_string()).collect();

    let module = fs::read_to_string(root.join("server/src/join/mod.rs")).expect("join/mod.rs");
    assert_eq!(
        bold_list(&module, "//!"),
        steps,
        "server/src/join/mod.rs's module docs list other steps than join::Step::ALL"
    );
    let doc = fs::read_to_string(root.join(DOC)).expect("reading docs/architecture.md");
    assert_eq!(
        bold_list(section(&doc, STEPS_HEADING), ""),
        steps,
        "{DOC}'s {STEPS_HEADING:?} lists other steps than join::Step::ALL (server/src/join/mod.rs)"
    );
    for step in &steps {
        let file = format!("server/src/join/{step}.rs");
        assert!(
            root.join(&file).is_file(),
            "the step {step} has no file {file}"
        );
    }
    // The metric's label is the step's name: recorded under that name.
    let metrics = autonode_server::kube::metrics::Metrics::new();
    for step in Step::ALL {
        metrics.steps().done(step.name());
    }
    let text = metrics.render();
    for step in &steps {
        assert!(
            text.contains(&format!(
                "autonode_join_step_duration_seconds_count{{step=\"{step}\"}}"
            )),
            "no join_step_duration_seconds for {step} in:\n{text}"
        );
    }
}

/// A report's steps, in order: as the join's, each is a file of its
/// folder, listed once in the folder's module docs.
const REPORT_STEPS: &[&str] = &["authenticate", "act"];

#[test]
fn the_reports_steps_are_one_list_in_its_module_docs_and_files() {
    let root = repo();
    let module = fs::read_to_string(root.join("server/src/report/mod.rs")).expect("report/mod.rs");
    assert_eq!(
        bold_list(&module, "//!"),
        REPORT_STEPS,
        "server/src/report/mod.rs's module docs list other steps"
    );
    for step in REPORT_STEPS {
        let file = format!("server/src/report/{step}.rs");
        assert!(
            root.join(&file).is_file(),
            "the report's step {step} has no file {file}"
        );
    }
}

/// The units a doc names things in: each table row on its own, each
/// sentence of the other paragraphs.
fn doc_units(doc: &str) -> Vec<String> {
    let mut paragraphs = Vec::new();
    let mut units = Vec::new();
    let mut paragraph = String::new();
    for line in doc.lines() {
        if line.trim_start().starts_with('|') {
            units.push(line.to_string());
        } else if line.trim().is_empty() {
            paragraphs.push(std::mem::take(&mut paragraph));
        } else {
            paragraph.push_str(line);
            paragraph.push(' ');
        }
    }
    paragraphs.push(paragraph);
    for paragraph in paragraphs {
        units.extend(paragraph.split(". ").map(str::to_string));
    }
    units.retain(|u| !u.trim().is_empty());
    units
}

/// The spans of `text` between backticks.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The words a doc names as join steps that are not steps: in a unit about
/// the join's steps (naming their metric or the dashboard's *Join steps*),
/// every lower-case code word (letters and digits) but the label's own
/// name, `step`.
fn stray_step_names(doc: &str, steps: &[String]) -> Vec<String> {
    doc_units(doc)
        .iter()
        .filter(|u| u.contains("join_step_duration_seconds") || u.contains("Join steps"))
        .flat_map(|u| code_spans(u))
        .filter(|w| {
            w.starts_with(|c: char| c.is_ascii_lowercase())
                && w.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && *w != "step"
        })
        .filter(|w| !steps.iter().any(|s| s == w))
        .map(str::to_string)
        .collect()
}

/// The `autonode_…` names `doc` uses as metrics (not inside a longer
/// identifier or a path).
fn metric_names(doc: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = doc.as_bytes();
    let mut from = 0;
    while let Some(at) = doc[from..].find("autonode_").map(|i| i + from) {
        let inside = at > 0 && {
            let before = bytes[at - 1];
            before.is_ascii_alphanumeric() || before == b'_' || before == b':'
        };
        let end = doc[at..]
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .map_or(doc.len(), |i| i + at);
        let path = doc[end..].starts_with("::");
        if !inside && !path {
            names.insert(doc[at..end].to_string());
        }
        from = end.max(at + 1);
    }
    names
}

/// Every markdown doc an operator reads: the README and docs/.
fn operator_docs() -> Vec<(String, String)> {
    let root = repo();
    let mut paths = vec![root.join("README.md")];
    for entry in fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.expect("docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            paths.push(path);
        }
    }
    paths
        .into_iter()
        .map(|p| {
            let text = fs::read_to_string(&p).expect("reading a doc");
            (p.display().to_string(), text)
        })
        .collect()
}

/// The metrics the server registers (`autonode_` and the name each
/// `register` call in its metrics module gives).
fn registered_metrics() -> Vec<String> {
    let source = fs::read_to_string(repo().join("server/src/kube/metrics.rs")).expect("metrics.rs");
    source
        .split(".register(")
        .skip(1)
        .filter_map(|call| call.split('"').nth(1))
        .map(|name| format!("autonode_{name}"))
        .collect()
}

/// Docs that cannot drift from the code: wherever a doc names the join's
/// steps (a sentence or table row about the `step` label or the
/// dashboard's panel), only `join::Step`'s names; and every `autonode_…`
/// metric any doc names is one the server registers.
#[test]
fn docs_name_only_the_join_steps_and_metrics_the_server_has() {
    use autonode_server::join::Step;
    let steps: Vec<String> = Step::ALL.iter().map(|s| s.name().to_string()).collect();
    let exported = registered_metrics();
    assert!(
        exported.iter().any(|m| m == "autonode_joins"),
        "no metrics read from the registry: {exported:?}"
    );
    let known = |name: &str| {
        exported.iter().any(|base| {
            name == base
                || ["_total", "_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| name.strip_suffix(suffix) == Some(base))
        })
    };
    let mut wrong = Vec::new();
    for (path, doc) in operator_docs() {
        for word in stray_step_names(&doc, &steps) {
            wrong.push(format!("{path}: `{word}` among the join's steps"));
        }
        for name in metric_names(&doc) {
            if !known(&name) {
                wrong.push(format!(
                    "{path}: metric {name}, which the server does not register"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "docs drifted from the code:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_drift_check_catches_the_old_runbooks_step_names_and_unknown_metrics() {
    let steps: Vec<String> = ["admit", "attest", "bind", "approve"]
        .map(String::from)
        .into();
    let old = "The dashboard's *Join steps* panel shows where the time goes: `ec2` (EC2's\n\
               answers), `prepare` (the API server's writes), `certificates`.\n\n\
               Milestones: `certificates`, `registered`.\n";
    assert_eq!(
        stray_step_names(old, &steps),
        ["ec2", "prepare", "certificates"]
    );
    let row =
        "| `autonode_join_step_duration_seconds{step}` | `admit`, `bind` |\n| `none` | other |\n";
    assert!(stray_step_names(row, &steps).is_empty());
    let text = "`autonode_joins_total`, `autonode_server::join`, `x_autonode_y`, autonode_gone.";
    assert_eq!(
        metric_names(text).into_iter().collect::<Vec<_>>(),
        ["autonode_gone", "autonode_joins_total"]
    );
}

#[test]
fn step_lists_are_read_from_bold_names_only() {
    let text = "//! intro\n//! 1. **admit** (x): y\n//!    more\n//! 2. **attest**: z\n//! - **bind** w\n//! plain\n";
    assert_eq!(bold_list(text, "//!"), ["admit", "attest", "bind"]);
    let doc = "## A\n- **no**\n### The server, for each join\ntext\n- **admit** (a)\n  more\n- **bind**\n\n## B\n- **no**\n";
    assert_eq!(
        bold_list(section(doc, STEPS_HEADING), ""),
        ["admit", "bind"]
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

/// The reasons docs/operations.md's table names, in its order.
fn reasons_in_table(doc: &str) -> Vec<String> {
    section(doc, "## Event and condition reasons")
        .lines()
        .filter_map(|line| {
            line.strip_prefix("| `")?
                .split('`')
                .next()
                .map(str::to_string)
        })
        .collect()
}

#[test]
fn every_reason_the_server_writes_is_in_the_operators_table_and_nothing_else() {
    use autonode_server::kube::reason::Reason;
    let doc = fs::read_to_string(repo().join("docs/operations.md")).expect("docs/operations.md");
    let code: Vec<String> = Reason::ALL.iter().map(|r| r.as_str().to_string()).collect();
    assert_eq!(
        reasons_in_table(&doc),
        code,
        "docs/operations.md's reasons table differs from kube::reason::Reason::ALL"
    );
    let dropped = "## Event and condition reasons\n\n| Reason |\n|---|\n| `Attested` |\n";
    assert_eq!(reasons_in_table(dropped), ["Attested"], "the table is read");
}

/// How wall time can be read without the one clock.
const WALL_CLOCK_READS: &[&str] = &["now_utc(", "Timestamp::now(", "SystemTime::now("];

/// Each line of `text` before its `#[cfg(test)]` module that reads wall
/// time directly (tests may fix their own times).
fn wall_clock_reads(text: &str) -> Vec<String> {
    code_lines_naming(text, WALL_CLOCK_READS)
}

/// Each line of code in `text` before its `#[cfg(test)]` module that names
/// one of `needles`.
fn code_lines_naming(text: &str, needles: &[&str]) -> Vec<String> {
    text.lines()
        .take_while(|line| line.trim() != "#[cfg(test)]")
        .filter(|line| !line.trim_start().starts_with("//"))
        .filter(|line| needles.iter().any(|needle| line.contains(needle)))
        .map(|line| line.trim().to_string())
        .collect()
}

/// Where the real clock may be chosen: the clock itself, each binary's
/// start (which hands it to every part that reads "now", so tests can hand
/// them another), and AWS request signing, whose time AWS checks against
/// its own and which no other clock may serve.
const REAL_CLOCK_CHOSEN_IN: &[&str] = &[
    "shared/src/clock.rs",
    "server/src/cmd/serve.rs",
    "agent/src/phases/mod.rs",
    "server/src/ec2/credentials.rs",
    "server/src/ec2/transport.rs",
];

#[test]
fn the_real_clock_is_chosen_where_each_binary_starts_not_in_its_parts() {
    let chosen = source_lines_naming(REAL_CLOCK_CHOSEN_IN, &["Clock::SYSTEM", "Clock::default()"]);
    assert!(
        chosen.is_empty(),
        "the real clock chosen inside a part (take the Clock its binary hands over):\n{}",
        chosen.join("\n")
    );
    for allowed in REAL_CLOCK_CHOSEN_IN {
        assert!(
            repo().join(allowed).is_file(),
            "{allowed} is gone: update the list"
        );
    }
}

/// `file: line` for each line of code in the sources, outside test
/// modules and the files `except`, that names one of `needles`.
fn source_lines_naming(except: &[&str], needles: &[&str]) -> Vec<String> {
    let root = repo();
    let mut files = Vec::new();
    for source in SOURCE_ROOTS {
        rust_files(&root.join(source), &mut files);
    }
    files
        .iter()
        .filter_map(|path| {
            let shown = path
                .strip_prefix(&root)
                .unwrap_or(path)
                .display()
                .to_string();
            (!except.contains(&shown.as_str())).then_some((path, shown))
        })
        .flat_map(|(path, shown)| {
            let text = fs::read_to_string(path).unwrap_or_default();
            code_lines_naming(&text, needles)
                .into_iter()
                .map(move |line| format!("{shown}: {line}"))
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tests.rs") {
            out.push(path);
        }
    }
}

/// The ways the agent could read wall time itself: the clock's, rustls's,
/// and the standard library's.
const AGENT_WALL_TIME_READS: &[&str] = &[
    "Clock::SYSTEM",
    "Clock::default()",
    "UnixTime::now(",
    "SystemTime::now(",
    "UNIX_EPOCH.elapsed(",
    "now_utc(",
];

/// Each read of wall time in `text` (its code before the `#[cfg(test)]`
/// module, white space taken out so a call split over lines is found).
fn agent_wall_time_reads(text: &str) -> Vec<&'static str> {
    let code: String = text
        .lines()
        .take_while(|line| line.trim() != "#[cfg(test)]")
        .filter(|line| !line.trim_start().starts_with("//"))
        .flat_map(|line| line.chars().filter(|c| !c.is_whitespace()))
        .collect();
    AGENT_WALL_TIME_READS
        .iter()
        .flat_map(|needle| code.matches(needle).map(move |_| *needle))
        .collect()
}

#[test]
fn the_agent_reads_wall_time_in_one_place() {
    let root = repo();
    let mut files = Vec::new();
    rust_files(&root.join("agent/src"), &mut files);
    let reads: Vec<String> = files
        .iter()
        .flat_map(|path| {
            let text = fs::read_to_string(path).unwrap_or_default();
            let shown = path
                .strip_prefix(&root)
                .unwrap_or(path)
                .display()
                .to_string();
            agent_wall_time_reads(&text)
                .into_iter()
                .map(move |read| format!("{shown}: {read}"))
        })
        .collect();
    assert_eq!(
        reads,
        ["agent/src/phases/mod.rs: Clock::SYSTEM"],
        "the agent reads wall time once, in its one clock, handed to every part that needs it"
    );
    let split = "let seed = std::time::UNIX_EPOCH\n    .elapsed()\n#[cfg(test)]\nClock::SYSTEM";
    assert_eq!(agent_wall_time_reads(split), ["UNIX_EPOCH.elapsed("]);
}

#[test]
fn wall_time_is_read_through_the_one_clock_only() {
    let reads = source_lines_naming(&["shared/src/clock.rs"], WALL_CLOCK_READS);
    assert!(
        reads.is_empty(),
        "wall time read outside shared/src/clock.rs (take a Clock instead):\n{}",
        reads.join("\n")
    );
    let sample = "let a = Clock::SYSTEM.unix();\nlet b = time::OffsetDateTime::now_utc();\n\
                  #[cfg(test)]\nlet c = OffsetDateTime::now_utc();\n";
    assert_eq!(
        wall_clock_reads(sample),
        ["let b = time::OffsetDateTime::now_utc();"],
        "direct reads are found, test modules skipped"
    );
}

/// What may stand at the top of the test harness (`tests/src`): its root,
/// the bench and demo binaries, and the role folders. A new module says
/// which role it serves by the folder it goes in; the folders import one
/// way (imports.rs), from `harness/` up to `fleet/`.
const HARNESS_TOP: &[&str] = &[
    "lib.rs",
    "bin/",
    "harness/",
    "kube/",
    "cloud/",
    "network/",
    "karpenter/",
    "callers/",
    "server/",
    "machines/",
    "fleet/",
    "oracles/",
];

/// The harness's modules as lib.rs's index names them: each role folder
/// (`cloud`) and each module directly in it (`cloud::moto`), from the
/// entries at the top of `src`. A flat file at the top is a module too.
fn harness_modules(src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in top_level(src) {
        if entry == "lib.rs" || entry == "bin/" {
            continue;
        }
        let Some(folder) = entry.strip_suffix('/') else {
            found.extend(entry.strip_suffix(".rs").map(str::to_string));
            continue;
        };
        found.push(folder.to_string());
        for child in top_level(&src.join(folder)) {
            let name = child
                .strip_suffix('/')
                .or_else(|| child.strip_suffix(".rs"));
            match name {
                Some("mod" | "tests") | None => {}
                Some(name) => found.push(format!("{folder}::{name}")),
            }
        }
    }
    found
}

#[test]
fn the_harness_top_level_holds_its_role_folders_only() {
    let src = repo().join("tests/src");
    let found = top_level(&src);
    let allowed: BTreeSet<String> = HARNESS_TOP.iter().map(|s| s.to_string()).collect();
    let stray: Vec<&String> = found.difference(&allowed).collect();
    assert!(
        stray.is_empty(),
        "tests/src holds more than its role folders: {stray:?} (put each where its role is: {})",
        HARNESS_TOP[2..].join(", ")
    );
    let without_mod: Vec<&&str> = HARNESS_TOP[2..]
        .iter()
        .filter(|folder| !src.join(folder).join("mod.rs").is_file())
        .collect();
    assert!(
        without_mod.is_empty(),
        "role folders without a mod.rs: {without_mod:?}"
    );
}

#[test]
fn the_harness_index_names_every_module() {
    let src = repo().join("tests/src");
    let lib = fs::read_to_string(src.join("lib.rs")).expect("reading tests/src/lib.rs");
    let index: String = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let missing: Vec<String> = harness_modules(&src)
        .into_iter()
        .filter(|module| !index.contains(&format!("[`{module}`]")))
        .collect();
    assert!(
        missing.is_empty(),
        "tests/src/lib.rs's index does not name these modules (a line `[`module`]: what it is` each): \
         {missing:?}"
    );
}

/// `file: line` for each line of code under the harness and the
/// integration tests, outside `except` (and this file, whose needles name
/// them), that names one of `needles`.
fn test_lines_naming(except: &[&str], needles: &[&str]) -> Vec<String> {
    let root = repo();
    let mut files = Vec::new();
    for dir in ["tests/src", "tests/tests"] {
        rust_files(&root.join(dir), &mut files);
    }
    let mut found = Vec::new();
    for path in files {
        let shown = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        if except.contains(&shown.as_str()) || shown.ends_with("integration/layout.rs") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap_or_default();
        for line in code_lines_naming(&text, needles) {
            found.push(format!("{shown}: {line}"));
        }
    }
    found
}

/// Asserts that `what` is written in `home` only: no line of code
/// elsewhere names one of `needles` (its body's marks), and its
/// definition, `definition`, stands once.
fn written_once(what: &str, home: &str, definition: &str, needles: &[&str]) {
    let elsewhere = test_lines_naming(&[home], needles);
    assert!(
        elsewhere.is_empty(),
        "{what} written outside {home} (call the one there):\n{}",
        elsewhere.join("\n")
    );
    let defined = test_lines_naming(&[], &[definition]);
    assert_eq!(
        defined.len(),
        1,
        "{what} defined more than once: {defined:?}"
    );
}

#[test]
fn the_harness_splits_yaml_documents_in_one_place() {
    written_once(
        "the YAML document splitter",
        "tests/src/kube/manifest.rs",
        "fn documents(yaml",
        &["Deserializer::from_str", "split(\"\\n---", "split(\"---"],
    );
}

#[test]
fn the_harness_follows_a_claim_to_its_machine_in_one_place() {
    // The wait for a launched machine's Node is follow_claim's body.
    written_once(
        "follow_claim",
        "tests/src/fleet/journey.rs",
        "fn follow_claim",
        &["fn follow_claim", "\"the machine's Node\""],
    );
}
