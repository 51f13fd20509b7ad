//! The documentation's relative links lead somewhere: every `[text](path)`
//! and `[text](path#anchor)` in README.md, docs/*.md and packaging/'s
//! Markdown names a file or folder of the checkout and, for an anchor, a
//! heading of that file as GitHub slugs it. And the README stays short
//! enough to read in ten minutes: everything else belongs in docs/.
//!
//! Needs nothing but the checkout: no root, no control plane.

use autonode_tests::machines::vm::repo_root as repo;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The README's budget, in lines.
const README_MAX_LINES: usize = 200;

/// The documents whose links are checked: README.md, docs/*.md and every
/// Markdown file under packaging/, sorted.
fn documents(root: &Path) -> Vec<PathBuf> {
    fn markdown_under(dir: &Path, deep: bool, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                if deep {
                    markdown_under(&path, deep, out);
                }
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root.join("README.md")];
    markdown_under(&root.join("docs"), false, &mut out);
    markdown_under(&root.join("packaging"), true, &mut out);
    out.sort();
    out
}

/// The lines of `text` outside fenced code blocks (``` or ~~~), with their
/// numbers from 1.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// `line` without its inline code spans, which hold no links.
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                rest = after;
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of the inline links (and images) in `text`, with the line
/// each is on: what sits between `](` and the next `)`, before any title.
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (number, line) in prose_lines(text) {
        let line = without_code(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or_default();
            if !target.is_empty() {
                out.push((number, target.to_string()));
            }
            rest = &after[end..];
        }
    }
    out
}

/// A heading's anchor as GitHub makes it: the text as rendered (code
/// spans, emphasis and links reduced to their words), lower-cased, with
/// every character but letters, digits, `-`, `_` and spaces dropped, and
/// spaces turned into `-`.
fn slug(heading: &str) -> String {
    let mut rendered = String::new();
    let mut rest = heading;
    // A link renders as its text.
    while let Some(open) = rest.find('[') {
        let (before, after) = rest.split_at(open);
        rendered.push_str(before);
        match after.find("](").zip(after.find(')')) {
            Some((mid, close)) if mid < close => {
                rendered.push_str(&after[1..mid]);
                rest = &after[close + 1..];
            }
            _ => {
                rendered.push('[');
                rest = &after[1..];
            }
        }
    }
    rendered.push_str(rest);
    rendered
        .to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || c == '-' || c == '_' || c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a document's ATX headings, a repeated one numbered as
/// GitHub numbers it (`x`, `x-1`, `x-2`).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#').trim());
        let mut anchor = base.clone();
        let mut n = 0;
        while out.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        out.insert(anchor);
    }
    out
}

/// `path` with `.` and `..` resolved lexically, as a browser resolves a
/// relative link.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with each relative link of `doc` (a file under `root`):
/// a target that does not exist, one that leaves the checkout, or an
/// anchor no heading of the target makes.
fn broken_links(root: &Path, doc: &Path) -> Vec<String> {
    let text = fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
    let shown = doc.strip_prefix(root).unwrap_or(doc).display().to_string();
    let mut problems = Vec::new();
    for (line, target) in link_targets(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (target.as_str(), None),
        };
        let file = if path.is_empty() {
            doc.to_path_buf()
        } else {
            normalize(&doc.parent().expect("a file's folder").join(path))
        };
        if !file.starts_with(root) {
            problems.push(format!("{shown}:{line}: {target} leaves the repository"));
            continue;
        }
        if !file.exists() {
            problems.push(format!("{shown}:{line}: {target}: no such file"));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if file.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let headings = anchors(&fs::read_to_string(&file).unwrap_or_default());
        if !headings.contains(anchor) {
            problems.push(format!(
                "{shown}:{line}: {target}: no heading makes #{anchor} in {}",
                file.strip_prefix(root).unwrap_or(&file).display()
            ));
        }
    }
    problems
}

#[test]
fn every_relative_link_in_the_docs_leads_to_a_file_and_heading_that_exist() {
    let root = repo();
    let docs = documents(&root);
    assert!(docs.len() > 8, "too few documents found: {docs:?}");
    let problems: Vec<String> = docs.iter().flat_map(|d| broken_links(&root, d)).collect();
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_readme_is_under_200_lines() {
    let readme = fs::read_to_string(repo().join("README.md")).expect("reading README.md");
    let lines = readme.lines().count();
    assert!(
        lines < README_MAX_LINES,
        "README.md has {lines} lines; keep it under {README_MAX_LINES} and move detail to docs/"
    );
}

#[test]
fn headings_are_slugged_as_github_slugs_them() {
    assert_eq!(slug("The agent's size"), "the-agents-size");
    assert_eq!(
        slug("Kubelet versions: what the agent writes, and what was tested"),
        "kubelet-versions-what-the-agent-writes-and-what-was-tested"
    );
    assert_eq!(
        slug("userData for Ignition-first AMIs"),
        "userdata-for-ignition-first-amis"
    );
    assert_eq!(
        slug("`serve` and `--check-config`"),
        "serve-and---check-config"
    );
    assert_eq!(slug("See [the design](design.md)"), "see-the-design");
    assert_eq!(slug("snake_case stays"), "snake_case-stays");
    let twice = anchors("# A\n\n## Notes\n\n```\n# not a heading\n```\n\n## Notes\n");
    assert_eq!(twice, ["a", "notes", "notes-1"].map(String::from).into());
}

#[test]
fn a_missing_file_or_heading_is_reported_and_code_is_not_read() {
    let root = tempfile::tempdir().expect("a temporary folder");
    let docs = root.path().join("docs");
    fs::create_dir(&docs).expect("docs/");
    fs::write(docs.join("other.md"), "# Other\n\n## Real section\n").expect("other.md");
    let doc = docs.join("doc.md");
    fs::write(
        &doc,
        "# Doc\n\n\
         [fine](other.md#real-section) [self](#doc) [web](https://example.com/x#y)\n\
         [gone](missing.md) [no heading](other.md#no-such-section)\n\
         [outside](../../etc/passwd) `[in code](missing-too.md)`\n\
         ```\n[in a fence](missing-three.md)\n```\n",
    )
    .expect("doc.md");
    let problems = broken_links(root.path(), &doc);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("docs/doc.md:4: missing.md: no such file"));
    assert!(problems[1].contains("#no-such-section"));
    assert!(problems[2].contains("leaves the repository"));
}
