//! One version, said the same everywhere (issue 49, item 1). The workspace's
//! version drives the packages, the image tag, the chart's version and
//! appVersion, the Kustomize base's image tag, the Packer template's
//! default and the server's list of released agents; between releases it is
//! the next release's pre-release (`0.3.0-dev`), ahead of every release
//! CHANGELOG.md lists, so nothing built from main says it is a release.
//! Each release has a record in the tree (`packaging/releases/X.Y.Z.toml`)
//! naming the commit it was cut from, which CHANGELOG.md and
//! tests/skew/revisions name too. `packaging/cut` makes every one of these
//! edits and the tag; it is run here on a scratch repository holding the
//! files it edits, never on this one.
//!
//! Needs nothing but the checkout and git: seconds.

use anyhow::{bail, ensure, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

/// `(major, minor, patch, is a release)`: a pre-release orders before its
/// release, as semantic versioning has it.
type Version = (u64, u64, u64, bool);

fn parse(text: &str) -> Result<Version> {
    let (core, pre) = match text.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (text, None),
    };
    let parts: Vec<u64> = core
        .split('.')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{text:?} is not X.Y.Z[-pre]"))?;
    let [major, minor, patch] = parts[..] else {
        bail!("{text:?} is not X.Y.Z[-pre]");
    };
    ensure!(pre != Some(""), "{text:?} has an empty pre-release");
    Ok((major, minor, patch, pre.is_none()))
}

/// The value of the first line of `text` starting with `prefix`, its
/// quotes taken off.
fn after<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map(|v| v.trim().trim_matches('"'))
}

/// A Packer template's `agent_version` default.
fn agent_version(template: &str) -> Option<&str> {
    template
        .split("variable \"agent_version\"")
        .nth(1)
        .and_then(|s| after(s, "  default     = "))
}

fn read(root: &Path, path: &str) -> Result<String> {
    fs::read_to_string(root.join(path)).with_context(|| format!("reading {path}"))
}

/// A release record: `packaging/releases/<version>.toml`.
struct Record {
    version: String,
    commit: String,
}

fn records(root: &Path) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(root.join("packaging/releases"))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let Some(version) = name.strip_suffix(".toml") else {
            bail!("packaging/releases/{name} is not a release record (X.Y.Z.toml)");
        };
        let text = fs::read_to_string(&path)?;
        ensure!(
            parse(version)?.3,
            "packaging/releases/{name}: {version} is not a release"
        );
        ensure!(
            after(&text, "version = ") == Some(version),
            "packaging/releases/{name} says another version"
        );
        let commit = after(&text, "commit = ").unwrap_or_default().to_string();
        ensure!(
            commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
            "packaging/releases/{name} names no full commit"
        );
        out.push(Record {
            version: version.to_string(),
            commit,
        });
    }
    out.sort_by_key(|r| parse(&r.version).ok());
    Ok(out)
}

/// CHANGELOG.md's releases, in the order listed: `(version, cut from)`.
fn changelog_releases(changelog: &str) -> Vec<(String, Option<String>)> {
    changelog
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .filter(|l| *l != "Unreleased")
        .map(|l| {
            let version = l.split_whitespace().next().unwrap_or_default();
            let commit = l.split("cut from ").nth(1).map(|c| c.trim().to_string());
            (version.to_string(), commit)
        })
        .collect()
}

/// Every place a tree writes its version agrees with the workspace's, and
/// its releases agree with their records.
fn check_tree(root: &Path) -> Result<String> {
    let cargo = read(root, "Cargo.toml")?;
    let workspace = cargo
        .split("[workspace.package]")
        .nth(1)
        .and_then(|s| after(s, "version = "))
        .context("Cargo.toml has no [workspace.package] version")?
        .to_string();
    let ours = parse(&workspace)?;
    let package = workspace.replacen('-', "~", 1);
    let printed = Command::new(root.join("packaging/version")).output()?;
    ensure!(
        String::from_utf8_lossy(&printed.stdout).trim() == workspace,
        "packaging/version does not print {workspace}"
    );

    let chart = read(root, "packaging/helm/autonode-server/Chart.yaml")?;
    let kustomize = read(root, "packaging/server/kustomization.yaml")?;
    let packer = read(root, "packaging/examples/packer/autonode.pkr.hcl")?;
    let attestable = read(
        root,
        "packaging/examples/packer/attestable/autonode-attestable.pkr.hcl",
    )?;

    let places = [
        (
            "the chart's version",
            after(&chart, "version: "),
            &workspace,
        ),
        (
            "the chart's appVersion",
            after(&chart, "appVersion: "),
            &workspace,
        ),
        (
            "the Kustomize base's image tag",
            after(&kustomize, "    newTag: "),
            &workspace,
        ),
        (
            "the Packer template's agent_version default",
            agent_version(&packer),
            &package,
        ),
        (
            "the attestable Packer template's agent_version default",
            agent_version(&attestable),
            &package,
        ),
    ];
    for (what, found, want) in places {
        ensure!(
            found == Some(want.as_str()),
            "{what} is {found:?}, the workspace's version {want:?} (packaging/cut moves them together)"
        );
    }

    let changelog = read(root, "CHANGELOG.md")?;
    ensure!(
        changelog.lines().find(|l| l.starts_with("## ")) == Some("## Unreleased"),
        "CHANGELOG.md's first section is not `## Unreleased`"
    );
    let releases = changelog_releases(&changelog);
    let (newest, _) = releases.first().context("CHANGELOG.md lists no release")?;
    let newest_v = parse(newest)?;
    if ours.3 {
        ensure!(
            *newest == workspace,
            "the workspace is release {workspace}, but CHANGELOG.md's newest release is {newest}"
        );
    } else {
        ensure!(
            (ours.0, ours.1, ours.2) > (newest_v.0, newest_v.1, newest_v.2),
            "the workspace's {workspace} is not ahead of CHANGELOG.md's newest release {newest}: \
             between releases main is the next release's pre-release"
        );
    }

    let records = records(root)?;
    let skew = read(root, "tests/skew/revisions")?;
    for (version, commit) in &releases {
        let record = records.iter().find(|r| r.version == *version);
        if *version == workspace {
            // The release commit itself: its record names it, so it comes after.
            ensure!(
                record.is_none() && commit.is_none(),
                "release {version} names its own commit"
            );
            continue;
        }
        let record = record.with_context(|| {
            format!("CHANGELOG.md's release {version} has no packaging/releases/{version}.toml")
        })?;
        ensure!(
            commit.as_deref() == Some(record.commit.as_str()),
            "CHANGELOG.md's heading of {version} says cut from {commit:?}, its record {}",
            record.commit
        );
        let line = format!("{}  v{version}", record.commit);
        ensure!(
            skew.lines().any(|l| l.trim() == line),
            "tests/skew/revisions lacks `{line}`"
        );
    }
    for record in &records {
        ensure!(
            releases.iter().any(|(v, _)| *v == record.version),
            "packaging/releases/{}.toml has no CHANGELOG.md release",
            record.version
        );
    }

    // The server's list of released agents: the revisions before the first
    // release (0.1.0), every recorded release, and this one if it is one.
    let agents = read(root, "server/src/join/agents.rs")?;
    let line = agents
        .lines()
        .find(|l| l.starts_with("pub const RELEASED: &[&str] = &["))
        .context("server/src/join/agents.rs has no RELEASED line")?;
    let listed: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
    let mut want = vec!["0.1.0".to_string()];
    want.extend(records.iter().map(|r| r.version.clone()));
    if ours.3 && !want.contains(&workspace) {
        want.push(workspace.clone());
    }
    ensure!(
        listed == want,
        "RELEASED in server/src/join/agents.rs is {listed:?}, the releases are {want:?}"
    );
    Ok(workspace)
}

#[test]
fn every_place_says_the_workspaces_version_and_every_release_has_its_record() -> Result<()> {
    let version = check_tree(&repo())?;
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    Ok(())
}

/// The Keep a Changelog form: each section's `###` headings are of the
/// known kinds, in their order ("Upgrading", what to do, first).
#[test]
fn the_changelog_groups_each_release_by_kind_of_change() -> Result<()> {
    const KINDS: [&str; 7] = [
        "Upgrading",
        "Added",
        "Changed",
        "Deprecated",
        "Removed",
        "Fixed",
        "Security",
    ];
    let changelog = read(&repo(), "CHANGELOG.md")?;
    for section in changelog.split("\n## ").skip(1) {
        let title = section.lines().next().unwrap_or_default();
        let mut last = 0;
        for heading in section.lines().filter_map(|l| l.strip_prefix("### ")) {
            let kind = KINDS.iter().position(|k| *k == heading).with_context(|| {
                format!("CHANGELOG.md `## {title}`: `### {heading}` is none of {KINDS:?}")
            })?;
            ensure!(
                kind >= last,
                "CHANGELOG.md `## {title}`: `### {heading}` out of order ({KINDS:?})"
            );
            last = kind;
        }
    }
    Ok(())
}

/// `program` in `dir` as a scratch repository's git sees it: an identity
/// of its own, no user or system configuration (no signing, no hooks).
fn in_scratch(program: impl AsRef<std::ffi::OsStr>, dir: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "cut test")
        .env("GIT_AUTHOR_EMAIL", "cut@test.invalid")
        .env("GIT_COMMITTER_NAME", "cut test")
        .env("GIT_COMMITTER_EMAIL", "cut@test.invalid")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1");
    command
}

fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let output = in_scratch("git", dir)
        .args(args)
        .output()
        .with_context(|| format!("git {args:?}"))?;
    ensure!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// What `packaging/cut` reads and edits, copied from this checkout as it is
/// (uncommitted changes too): a scratch repository of these is all it needs.
const CUT_FILES: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "CHANGELOG.md",
    "README.md",
    "packaging/cut",
    "packaging/version",
    "packaging/build-image",
    "packaging/helm/autonode-server/Chart.yaml",
    "packaging/server/kustomization.yaml",
    "packaging/server/README.md",
    "packaging/examples/AMI.md",
    "packaging/examples/packer/autonode.pkr.hcl",
    "packaging/examples/packer/attestable/autonode-attestable.pkr.hcl",
    "server/src/join/agents.rs",
    "tests/skew/revisions",
    "tests/public-surface.txt",
];

fn scratch() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    let copy = |path: &Path| -> Result<()> {
        let relative = path.strip_prefix(repo())?;
        let to = dir.path().join(relative);
        fs::create_dir_all(to.parent().context("a parent")?)?;
        fs::copy(path, &to).with_context(|| format!("copying {}", path.display()))?;
        Ok(())
    };
    for file in CUT_FILES {
        copy(&repo().join(file))?;
    }
    for entry in fs::read_dir(repo().join("packaging/releases"))? {
        copy(&entry?.path())?;
    }
    git(dir.path(), &["init", "-q", "-b", "main"])?;
    git(dir.path(), &["add", "-A"])?;
    git(dir.path(), &["commit", "-q", "-m", "before the cut"])?;
    Ok(dir)
}

/// `packaging/cut` on a scratch repository: the release commit says the
/// release everywhere and carries the annotated tag; the commit after it
/// records the release and moves every version on to the next
/// pre-release; both trees pass the check above. A version not ahead of
/// the tree's, or a dirty tree, is refused. This repository gains no tag.
#[test]
fn cut_makes_every_edit_and_an_annotated_tag_on_a_scratch_repository() -> Result<()> {
    let ours = env!("CARGO_PKG_VERSION");
    let Some((release, _)) = ours.split_once('-') else {
        // A release commit: the cut of the next one is tried from main.
        return Ok(());
    };
    let dir = scratch()?;
    let root = dir.path();
    let cut = |args: &[&str]| {
        in_scratch(root.join("packaging/cut"), root)
            .args(args)
            .output()
    };

    let newest = records(root)?.pop().context("no release record")?.version;
    let again = cut(&[&newest])?;
    assert!(
        !again.status.success(),
        "cutting {newest} again was allowed"
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("record already"));

    let done = cut(&[release, "--date", "2026-12-24"])?;
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let tag = format!("v{release}");
    assert_eq!(
        git(root, &["cat-file", "-t", &tag])?,
        "tag",
        "an annotated tag"
    );
    let tagged = git(root, &["rev-parse", &format!("{tag}^{{commit}}")])?;
    assert_eq!(tagged, git(root, &["rev-parse", "HEAD~1"])?);

    // The release commit, as its tag has it.
    git(root, &["checkout", "-q", &tag])?;
    assert_eq!(check_tree(root)?, release);
    let changelog = read(root, "CHANGELOG.md")?;
    assert!(changelog.contains(&format!("## Unreleased\n\n## {release} (2026-12-24)\n")));
    // Main after it.
    git(root, &["checkout", "-q", "main"])?;
    let next = check_tree(root)?;
    assert!(
        next.ends_with("-dev") && parse(&next)? > parse(release)?,
        "{next}"
    );
    let record = read(root, &format!("packaging/releases/{release}.toml"))?;
    assert_eq!(after(&record, "commit = "), Some(tagged.as_str()));
    let readme = read(root, "README.md")?;
    assert!(
        readme.contains(&format!("The current release is {release} ")),
        "README"
    );
    assert!(
        git(root, &["status", "--porcelain"])?.is_empty(),
        "the cut left changes"
    );
    let surface = read(root, "tests/public-surface.txt")?;
    assert!(
        !surface
            .lines()
            .any(|l| l.starts_with("+ ") || l.starts_with("- ")),
        "the cut left the public surface's marks"
    );

    // A dirty tree is refused; this repository has no such tag.
    fs::write(root.join("README.md"), "changed")?;
    let dirty = cut(&["9.9.9"])?;
    assert!(!dirty.status.success() && String::from_utf8_lossy(&dirty.stderr).contains("changes"));
    let ours_tags = git(&repo(), &["tag", "--list", &tag])?;
    assert!(ours_tags.is_empty(), "this repository has {tag}");
    Ok(())
}

/// Stand-ins for the builds `packaging/release` runs (minutes of CPU, and
/// other tests' subject: packaging::, and the reproducible builds'): each
/// writes its artifacts from the tree it runs in, so two builds of one
/// commit give the same bytes and a build of another commit other ones.
/// `cargo` answers only `cyclonedx`, `helm` only `package`.
const STUBS: &[(&str, &str)] = &[
    (
        "packaging/build",
        "#!/usr/bin/env bash\nset -e\nv=$(packaging/version --package)\nd=${CARGO_TARGET_DIR:-target}/packages\nmkdir -p \"$d\"\n\
         for f in autonode-agent_$v-1_amd64.deb autonode-agent_$v-1_arm64.deb autonode-agent-$v-1.x86_64.rpm autonode-agent-$v-1.aarch64.rpm; do\n\
         git rev-parse HEAD >\"$d/$f\"; echo \"$f\" >>\"$d/$f\"; done\n",
    ),
    (
        "packaging/build-image",
        "#!/usr/bin/env bash\nset -e\nd=${CARGO_TARGET_DIR:-target}/packages\nmkdir -p \"$d\"\ngit rev-parse HEAD >\"$d/autonode-server-oci.tar\"\n",
    ),
    (
        "stubs/cargo",
        "#!/usr/bin/env bash\nset -e\n[ \"$1\" = cyclonedx ] || exit 1\nmkdir -p agent server shared tests\n\
         echo '{}' >agent/autonode-agent_bin.cdx.json\necho '{}' >server/autonode-server_bin.cdx.json\n",
    ),
    ("stubs/cargo-cyclonedx", "#!/bin/sh\nexit 0\n"),
    (
        "packaging/chart",
        "#!/usr/bin/env bash\nset -e\nmkdir -p \"$4\"\ncat \"$2/Chart.yaml\" >\"$4/autonode-server-$3.tgz\"\n",
    ),
    ("packaging/buildinfo", "#!/bin/sh\necho stood-in\n"),
    (
        "stubs/helm",
        "#!/usr/bin/env bash\nset -e\n[ \"$1\" = package ] || exit 1\nv=$4\nd=${@: -1}\n\
         cat \"$2/Chart.yaml\" >\"$d/autonode-server-$v.tgz\"\n",
    ),
    (
        "tests/setup/install-helm",
        "#!/bin/sh\necho \"$(cd \"$(dirname \"$0\")/../..\" && pwd)/stubs/helm\"\n",
    ),
];

/// `packaging/release X.Y.Z` on a scratch repository after a cut, with the
/// builds stood in for: it builds the commit the record names into
/// `target/release/X.Y.Z/`; `--record` writes the artifacts' SHA-256 into
/// the record, a later build must give them, and a record whose hashes or
/// commit another file contradicts is refused. `--here` writes
/// `target/release-here/`, never a release's folder.
#[test]
fn release_builds_the_recorded_commit_and_holds_it_to_the_recorded_hashes() -> Result<()> {
    let ours = env!("CARGO_PKG_VERSION");
    let Some((release, _)) = ours.split_once('-') else {
        return Ok(());
    };
    let dir = scratch()?;
    let root = dir.path();
    for (path, text) in STUBS {
        let file = root.join(path);
        fs::create_dir_all(file.parent().context("a parent")?)?;
        fs::write(&file, text)?;
        Command::new("chmod").arg("+x").arg(&file).status()?;
    }
    let chart = "packaging/helm/autonode-server";
    let copied = Command::new("cp")
        .args([
            "-a",
            &repo().join(chart).to_string_lossy(),
            &root.join("packaging/helm").to_string_lossy(),
        ])
        .status()?;
    ensure!(copied.success(), "copying the chart");
    fs::copy(
        repo().join("packaging/release"),
        root.join("packaging/release"),
    )?;
    fs::write(root.join(".gitignore"), "target/\n")?;
    git(root, &["add", "-A"])?;
    git(root, &["commit", "-q", "-m", "the builds stood in for"])?;
    let cut = in_scratch(root.join("packaging/cut"), root)
        .arg(release)
        .output()?;
    ensure!(
        cut.status.success(),
        "{}",
        String::from_utf8_lossy(&cut.stderr)
    );

    let path = format!(
        "{}:{}",
        root.join("stubs").display(),
        std::env::var("PATH")?
    );
    let release_run = |args: &[&str]| {
        in_scratch(root.join("packaging/release"), root)
            .args(args)
            .env("PATH", &path)
            .output()
    };
    let said = |run: &std::process::Output| String::from_utf8_lossy(&run.stderr).into_owned();
    let record = root.join(format!("packaging/releases/{release}.toml"));
    let out = root.join("target/release").join(release);

    let first = release_run(&[release])?;
    assert!(first.status.success(), "{}", said(&first));
    assert!(
        said(&first).contains("lists no SHA-256"),
        "{}",
        said(&first)
    );
    let tagged = git(root, &["rev-parse", &format!("v{release}^{{commit}}")])?;
    let deb = fs::read_to_string(out.join(format!("autonode-agent_{release}-1_amd64.deb")))?;
    assert!(deb.starts_with(&tagged), "built from another commit: {deb}");

    let recorded = release_run(&[release, "--record"])?;
    assert!(recorded.status.success(), "{}", said(&recorded));
    let text = fs::read_to_string(&record)?;
    // version, date, commit; then the nine artifacts (BUILDINFO among them).
    assert_eq!(text.matches(" = \"").count(), 3 + 9, "{text}");
    let again = release_run(&[release])?;
    assert!(
        again.status.success() && said(&again).contains("every artifact has the SHA-256"),
        "{}",
        said(&again)
    );

    // Another artifact than the recorded one is refused, loudly.
    let digest = text
        .lines()
        .find(|l| l.contains(".deb\" = \""))
        .context("a .deb hash")?;
    let (name, hash) = digest.split_once(" = \"").context("name = \"hash\"")?;
    let flipped = if hash.starts_with('0') { "1" } else { "0" };
    let forged = format!("{name} = \"{flipped}{}", &hash[1..]);
    fs::write(&record, text.replace(digest, &forged))?;
    let tampered = release_run(&[release])?;
    assert!(
        !tampered.status.success() && said(&tampered).contains("are not the ones"),
        "{}",
        said(&tampered)
    );
    // A record naming another commit than the changelog is refused.
    let other = git(root, &["rev-parse", "HEAD~2"])?;
    fs::write(&record, text.replace(&tagged, &other))?;
    let moved = release_run(&[release])?;
    assert!(
        !moved.status.success() && said(&moved).contains("does not name"),
        "{}",
        said(&moved)
    );

    fs::write(&record, &text)?;
    let here = release_run(&["--here"])?;
    assert!(here.status.success(), "{}", said(&here));
    assert!(root.join("target/release-here/SHA256SUMS").is_file());
    let next = check_tree(root)?;
    assert!(
        !root.join("target/release").join(&next).exists(),
        "--here wrote {next}'s folder"
    );
    Ok(())
}
