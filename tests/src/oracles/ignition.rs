//! The real Ignition as the test oracle for autonode's Ignition support.
//!
//! Debian's `ignition` package (2.14, spec 3.0–3.3) gives two judges:
//! `ignition-validate`, and the real `files` stage run into a temporary root
//! (`-platform file`, after `fetch-offline` has cached the config). autonode's
//! side is the real `autonode-agent ignition apply --root DIR FILE`. Both
//! sides start from the same seeded root (copies of the host's passwd files,
//! an SELinux config, the unit files and pre-existing entries a case
//! declares), and the trees they leave are compared as [`Snapshot`]s.
//!
//! A case of the corpus (tests/ignition/corpus/) is `NAME.ign`, the config,
//! beside `NAME.case.json`, a [`Sidecar`]: the expected verdict, the README
//! features it proves, and what the root holds beforehand.

use anyhow::{bail, ensure, Context, Result};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The real Ignition binary, as Debian installs it for dracut.
pub const IGNITION: &str = "/usr/lib/dracut/modules.d/30ignition/ignition";
/// Where the seeded roots copy unit files from.
pub const HOST_UNITS: &str = "/lib/systemd/system";
/// Where a seeded root holds those unit files (Debian is merged-/usr).
pub const ROOT_UNITS: &str = "/usr/lib/systemd/system";
/// The file Ignition records enablement in, instead of links.
pub const PRESET_FILE: &str = "/etc/systemd/system-preset/20-ignition.preset";
/// Paths only Ignition writes, about itself: never compared.
pub const IGNORED: &[&str] = &[
    "/etc/.ignition-result.json",
    "/etc/.pwd.lock",
    "/etc/systemd/system-preset",
];
/// Longest a real Ignition stage may take (they take well under a second).
const STAGE_TIMEOUT_SECS: &str = "60";

/// The verdict a case expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expect {
    /// Both apply it, to the same tree.
    Accepted,
    /// Both refuse it.
    Refused,
    /// Valid Ignition that autonode refuses on purpose (disks, remote
    /// sources, ...); the real stages are not run (they would touch disks
    /// or the network).
    RefusedByAutonode,
}

/// `NAME.case.json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sidecar {
    pub expect: Expect,
    /// For refusals: words autonode's message must contain.
    #[serde(default)]
    pub reason: Option<String>,
    /// The README's feature keys this case proves (supported if accepted,
    /// refused otherwise).
    pub features: Vec<String>,
    #[serde(default)]
    pub seed: Seed,
    /// Whether the case also runs as 3.4.0, 3.5.0 and 3.6.0 (false where
    /// the version changes the meaning, e.g. special mode bits).
    #[serde(default = "yes")]
    pub twins: bool,
}

fn yes() -> bool {
    true
}

/// What a root holds before either side runs, beyond the base (passwd
/// files and the SELinux config).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seed {
    /// Unit files copied from the host's /lib/systemd/system.
    #[serde(default)]
    pub units: Vec<String>,
    /// Regular files: path → contents (mode 0644) or {contents, mode}.
    #[serde(default)]
    pub files: BTreeMap<String, SeedFile>,
    /// Symbolic links: path → target.
    #[serde(default)]
    pub links: BTreeMap<String, String>,
    /// Directories (mode 0755).
    #[serde(default)]
    pub directories: Vec<String>,
}

/// A pre-existing regular file.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SeedFile {
    Text(String),
    WithMode { contents: String, mode: u32 },
}

/// One corpus case.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub config: PathBuf,
    pub sidecar: Sidecar,
}

/// The corpus directory in the source tree.
pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ignition/corpus")
}

/// Every case of `dir`, sorted by name; a config without a sidecar (or the
/// reverse) is an error, so no case is silently skipped.
pub fn load_corpus(dir: &Path) -> Result<Vec<Case>> {
    let mut names = BTreeSet::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let file = entry?.file_name().to_string_lossy().into_owned();
        if let Some(name) = file.strip_suffix(".case.json") {
            names.insert(name.to_string());
        } else if let Some(name) = file.strip_suffix(".ign") {
            names.insert(name.to_string());
        } else {
            bail!(
                "{}/{file}: neither NAME.ign nor NAME.case.json",
                dir.display()
            );
        }
    }
    names
        .into_iter()
        .map(|name| {
            let config = dir.join(format!("{name}.ign"));
            ensure!(config.exists(), "{}: missing", config.display());
            let sidecar_path = dir.join(format!("{name}.case.json"));
            let text = fs::read_to_string(&sidecar_path)
                .with_context(|| format!("{}: every case needs one", sidecar_path.display()))?;
            let sidecar: Sidecar = serde_json::from_str(&text)
                .with_context(|| format!("{}: not a valid sidecar", sidecar_path.display()))?;
            ensure!(
                sidecar.expect != Expect::RefusedByAutonode || sidecar.reason.is_some(),
                "{}: a deliberate refusal names its reason",
                sidecar_path.display()
            );
            ensure!(
                !sidecar.features.is_empty(),
                "{}: name the README features the case proves",
                sidecar_path.display()
            );
            Ok(Case {
                name,
                config,
                sidecar,
            })
        })
        .collect()
}

/// `root`/`abs` for an absolute path of a config or seed.
fn under(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

/// Creates `root` and fills it: the host's passwd, group, shadow and
/// gshadow, an SELinux config saying disabled (else Ignition's relabel
/// step fails earlier), and `seed`.
pub fn seed_root(root: &Path, seed: &Seed) -> Result<()> {
    fs::create_dir_all(root.join("etc/selinux"))?;
    fs::write(
        root.join("etc/selinux/config"),
        "SELINUX=disabled\nSELINUXTYPE=targeted\n",
    )?;
    for name in ["passwd", "group", "shadow", "gshadow"] {
        let from = Path::new("/etc").join(name);
        fs::copy(&from, root.join("etc").join(name))
            .with_context(|| format!("copying {}", from.display()))?;
    }
    for dir in &seed.directories {
        fs::create_dir_all(under(root, dir))?;
    }
    for unit in &seed.units {
        let from = Path::new(HOST_UNITS).join(unit);
        let to = under(root, &format!("{ROOT_UNITS}/{unit}"));
        fs::create_dir_all(to.parent().context("unit path")?)?;
        fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
    }
    for (path, file) in &seed.files {
        let (contents, mode) = match file {
            SeedFile::Text(text) => (text.as_str(), 0o644),
            SeedFile::WithMode { contents, mode } => (contents.as_str(), *mode),
        };
        let to = under(root, path);
        fs::create_dir_all(to.parent().context("seed path")?)?;
        fs::write(&to, contents)?;
        fs::set_permissions(&to, fs::Permissions::from_mode(mode))?;
    }
    for (path, target) in &seed.links {
        let to = under(root, path);
        fs::create_dir_all(to.parent().context("seed link")?)?;
        std::os::unix::fs::symlink(target, &to)?;
    }
    Ok(())
}

/// What `ignition-validate` said.
#[derive(Debug, Clone)]
pub struct Validation {
    pub accepted: bool,
    pub message: String,
}

/// Runs `ignition-validate FILE`.
pub fn validate(config: &Path) -> Result<Validation> {
    let output = Command::new("ignition-validate")
        .arg(config)
        .output()
        .context(
            "running ignition-validate (install Debian's `ignition`: tests/setup/install-deps)",
        )?;
    Ok(Validation {
        accepted: output.status.success(),
        message: output_text(&output).trim().to_string(),
    })
}

fn output_text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// What one side did with a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Applied,
    Refused(String),
    /// autonode's exit 1: the machine, not the config, is at fault.
    Failed(String),
}

/// The real `fetch-offline` then `files` stages, applying `config` into
/// `work`/root (already seeded); `work`/run holds Ignition's own state.
/// Enablement is then made real with `systemctl --root preset`.
pub fn run_ignition(work: &Path, config: &Path) -> Result<Verdict> {
    ensure!(
        Path::new(IGNITION).exists(),
        "{IGNITION} is missing: install Debian's `ignition` (tests/setup/install-deps does)"
    );
    let root = work.join("root");
    let run = work.join("run");
    fs::create_dir_all(&run)?;
    let cache = run.join("ign.json");
    let common = |stage: &str| {
        let mut command = Command::new("timeout");
        command
            .args([
                STAGE_TIMEOUT_SECS,
                IGNITION,
                "-platform",
                "file",
                "-stage",
                stage,
            ])
            .arg("-root")
            .arg(&root)
            .arg("-config-cache")
            .arg(&cache)
            .arg("-state-file")
            .arg(run.join("state"))
            .arg("-log-to-stdout")
            .env("IGNITION_CONFIG_FILE", config);
        command
    };
    let fetch = common("fetch-offline")
        .arg("-neednet")
        .arg(run.join("neednet"))
        .output()
        .context("running Ignition's fetch-offline stage")?;
    if !fetch.status.success() {
        return Ok(Verdict::Refused(criticals(&output_text(&fetch))));
    }
    let files = common("files")
        .output()
        .context("running Ignition's files stage")?;
    let log = output_text(&files);
    fs::write(work.join("ignition-files.log"), &log)?;
    if !files.status.success() && !only_harmless_failures(&log) {
        return Ok(Verdict::Refused(criticals(&log)));
    }
    apply_presets(&root)?;
    Ok(Verdict::Applied)
}

/// The CRITICAL lines of a log, which say why Ignition stopped.
fn criticals(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| l.starts_with("CRITICAL")).collect();
    if lines.is_empty() {
        log.trim().to_string()
    } else {
        lines.join("\n")
    }
}

/// Whether a failed files stage failed only after everything was written:
/// relabelling (no `setfiles` here) or asking a systemd that is not
/// running about a template unit. Every op but those must have finished.
fn only_harmless_failures(log: &str) -> bool {
    let harmless = |line: &str| {
        line.contains("[failed]   relabeling ")
            || line.contains("failed to handle relabeling: ")
            || line.contains("failed to create units: dial unix /run/systemd/private: ")
    };
    let failed_ops = log
        .lines()
        .filter(|l| l.contains("[failed]") || l.starts_with("CRITICAL"));
    let mut any = false;
    for line in failed_ops {
        any = true;
        if !harmless(line) {
            return false;
        }
    }
    any && every_op_finished(log)
}

/// Whether every op the log says was started (but relabelling) finished.
fn every_op_finished(log: &str) -> bool {
    let after = |marker: &str| -> BTreeSet<String> {
        log.lines()
            .filter_map(|l| l.split_once(marker))
            .map(|(op, what)| format!("{op} {}", what.trim()))
            .filter(|op| !op.contains(" relabeling "))
            .collect()
    };
    after("[started]") == after("[finished]")
}

/// `systemctl --root=ROOT preset` for every unit Ignition's preset file
/// names, so its enablement becomes the links autonode writes directly.
pub fn apply_presets(root: &Path) -> Result<()> {
    let presets = match fs::read_to_string(under(root, PRESET_FILE)) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return forget_presets(root),
        Err(e) => return Err(e).context("reading Ignition's preset file"),
    };
    for line in presets.lines() {
        let mut words = line.split_whitespace();
        let (Some(_), Some(unit)) = (words.next(), words.next()) else {
            continue;
        };
        let instances: Vec<&str> = words.collect();
        let names: Vec<String> = if instances.is_empty() {
            vec![unit.to_string()]
        } else {
            let (prefix, suffix) = unit
                .split_once("@.")
                .context("instances of a non-template")?;
            instances
                .iter()
                .map(|i| format!("{prefix}@{i}.{suffix}"))
                .collect()
        };
        let output = Command::new("systemctl")
            .arg(format!("--root={}", root.display()))
            .arg("preset")
            .args(&names)
            .output()
            .context("running systemctl preset")?;
        // A masked unit stays masked: systemd's preset refuses it, as it
        // would at first boot.
        let text = output_text(&output);
        ensure!(
            output.status.success() || text.contains(" is masked"),
            "systemctl --root preset {names:?}: {text}"
        );
    }
    forget_presets(root)
}

/// Removes Ignition's preset file, and /etc/systemd if the preset file was
/// all it held (autonode writes links instead, so it has no such directory).
fn forget_presets(root: &Path) -> Result<()> {
    let presets = under(root, "/etc/systemd/system-preset");
    if presets.exists() {
        fs::remove_dir_all(&presets)?;
    }
    let systemd = under(root, "/etc/systemd");
    if systemd.is_dir() && fs::read_dir(&systemd)?.next().is_none() {
        fs::remove_dir(&systemd)?;
    }
    Ok(())
}

/// What `autonode-agent ignition apply` did.
#[derive(Debug, Clone)]
pub struct AgentRun {
    pub verdict: Verdict,
    /// Its stdout: what it changed.
    pub report: String,
}

/// Runs `agent ignition apply --root ROOT CONFIG`: exit 0 applied, 2
/// refused, 1 failed (the machine); anything else is an error of the test.
pub fn run_autonode(agent: &Path, root: &Path, config: &Path) -> Result<AgentRun> {
    let output = Command::new(agent)
        .args(["ignition", "apply", "--root"])
        .arg(root)
        .arg(config)
        .output()
        .with_context(|| format!("running {}", agent.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    let verdict = match output.status.code() {
        Some(0) => Verdict::Applied,
        Some(2) => Verdict::Refused(stderr),
        Some(1) => Verdict::Failed(stderr),
        _ => bail!(
            "autonode-agent ignition apply failed on this machine ({}): {stderr}",
            output.status
        ),
    };
    Ok(AgentRun {
        verdict,
        report: String::from_utf8_lossy(&output.stdout).into_owned(),
    })
}

/// One entry of a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    /// Permission bits (and setuid/setgid/sticky); 0 for links.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Inode and change time: not compared between the two sides, only
    /// between two runs of one side (a rewrite with equal contents shows).
    pub stamp: (u64, i64, i64),
}

/// What an entry is, with what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    File(Vec<u8>),
    Dir,
    Link(String),
    Other,
}

/// A tree: absolute path (as the node sees it) → entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot(pub BTreeMap<String, Entry>);

/// Walks `root`, leaving out [`IGNORED`] paths; /etc/shadow's date fields
/// are blanked (each side ran on its own day).
pub fn snapshot(root: &Path) -> Result<Snapshot> {
    let mut entries = BTreeMap::new();
    walk(root, "", &mut entries)?;
    Ok(Snapshot(entries))
}

fn walk(root: &Path, rel: &str, entries: &mut BTreeMap<String, Entry>) -> Result<()> {
    let dir = if rel.is_empty() {
        root.to_path_buf()
    } else {
        under(root, rel)
    };
    for item in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let item = item?;
        let path = format!("{rel}/{}", item.file_name().to_string_lossy());
        if IGNORED.contains(&path.as_str()) {
            continue;
        }
        let meta = item.path().symlink_metadata()?;
        let kind = if meta.file_type().is_symlink() {
            Kind::Link(fs::read_link(item.path())?.to_string_lossy().into_owned())
        } else if meta.is_dir() {
            Kind::Dir
        } else if meta.is_file() {
            let data = fs::read(item.path())?;
            Kind::File(if path == "/etc/shadow" {
                blank_shadow_dates(&data)
            } else {
                data
            })
        } else {
            Kind::Other
        };
        let is_dir = kind == Kind::Dir;
        let mode = if matches!(kind, Kind::Link(_)) {
            0
        } else {
            meta.mode() & 0o7777
        };
        let stamp = (meta.ino(), meta.ctime(), meta.ctime_nsec());
        entries.insert(
            path.clone(),
            Entry {
                kind,
                mode,
                uid: meta.uid(),
                gid: meta.gid(),
                stamp,
            },
        );
        if is_dir {
            walk(root, &path, entries)?;
        }
    }
    Ok(())
}

/// /etc/shadow with each line's third field (last change, in days) empty.
fn blank_shadow_dates(data: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(data);
    let mut out = String::new();
    for line in text.lines() {
        let mut fields: Vec<&str> = line.split(':').collect();
        if fields.len() > 2 {
            fields[2] = "";
        }
        out.push_str(&fields.join(":"));
        out.push('\n');
    }
    out.into_bytes()
}

/// A difference between two snapshots, readable on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference(pub String);

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Every difference between `left` and `right` (named so in the text);
/// with `stamps`, a rewritten entry counts too.
pub fn diff(left: (&str, &Snapshot), right: (&str, &Snapshot), stamps: bool) -> Vec<Difference> {
    let (ln, l) = left;
    let (rn, r) = right;
    let mut out = Vec::new();
    let paths: BTreeSet<&String> = l.0.keys().chain(r.0.keys()).collect();
    for path in paths {
        match (l.0.get(path), r.0.get(path)) {
            (Some(a), None) => out.push(Difference(format!(
                "{path}: only {ln} has it ({})",
                describe(a)
            ))),
            (None, Some(b)) => out.push(Difference(format!(
                "{path}: only {rn} has it ({})",
                describe(b)
            ))),
            (Some(a), Some(b)) => {
                if let Some(d) = entry_diff(path, (ln, a), (rn, b), stamps) {
                    out.push(d);
                }
            }
            (None, None) => {}
        }
    }
    out
}

fn entry_diff(
    path: &str,
    (ln, a): (&str, &Entry),
    (rn, b): (&str, &Entry),
    stamps: bool,
) -> Option<Difference> {
    let mut parts = Vec::new();
    match (&a.kind, &b.kind) {
        (Kind::File(x), Kind::File(y)) if x != y => {
            parts.push(format!("contents differ:\n{}", text_diff((ln, x), (rn, y))));
        }
        (x, y) if std::mem::discriminant(x) != std::mem::discriminant(y) || x != y => {
            parts.push(format!("{ln}: {}, {rn}: {}", describe(a), describe(b)));
        }
        _ => {}
    }
    if a.mode != b.mode {
        parts.push(format!("mode {ln} {:04o}, {rn} {:04o}", a.mode, b.mode));
    }
    if (a.uid, a.gid) != (b.uid, b.gid) {
        parts.push(format!(
            "owner {ln} {}:{}, {rn} {}:{}",
            a.uid, a.gid, b.uid, b.gid
        ));
    }
    if stamps && a.stamp != b.stamp && a.kind != Kind::Dir {
        parts.push("rewritten (new inode or change time)".to_string());
    }
    (!parts.is_empty()).then(|| Difference(format!("{path}: {}", parts.join("; "))))
}

fn describe(e: &Entry) -> String {
    let what = match &e.kind {
        Kind::File(data) => format!("file, {} bytes", data.len()),
        Kind::Dir => "directory".to_string(),
        Kind::Link(target) => format!("link to {target}"),
        Kind::Other => "special file".to_string(),
    };
    format!("{what}, mode {:04o}, owner {}:{}", e.mode, e.uid, e.gid)
}

/// Lines only one side has, in order; short for binary or huge files.
fn text_diff((ln, x): (&str, &[u8]), (rn, y): (&str, &[u8])) -> String {
    let (Ok(xs), Ok(ys)) = (std::str::from_utf8(x), std::str::from_utf8(y)) else {
        return format!(
            "    (binary: {ln} {} bytes, {rn} {} bytes)",
            x.len(),
            y.len()
        );
    };
    let xl: BTreeSet<&str> = xs.lines().collect();
    let yl: BTreeSet<&str> = ys.lines().collect();
    let mut out = Vec::new();
    for line in xs.lines().filter(|l| !yl.contains(l)) {
        out.push(format!("    {ln}: {line:?}"));
    }
    for line in ys.lines().filter(|l| !xl.contains(l)) {
        out.push(format!("    {rn}: {line:?}"));
    }
    if out.is_empty() {
        out.push(format!(
            "    (same lines, different order or line endings: {xs:?} vs {ys:?})"
        ));
    }
    out.truncate(20);
    out.join("\n")
}

/// `config` with `ignition.version` replaced, for the 3.4–3.6 twins of a
/// case the real Ignition (≤3.3) has judged.
pub fn with_version(config: &Path, version: &str, out: &Path) -> Result<()> {
    let text = fs::read_to_string(config)?;
    let mut value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", config.display()))?;
    let meta = value
        .get_mut("ignition")
        .and_then(|m| m.as_object_mut())
        .with_context(|| format!("{}: no `ignition` object", config.display()))?;
    meta.insert("version".into(), version.into());
    fs::write(out, serde_json::to_vec_pretty(&value)?)?;
    Ok(())
}

/// The backticked keys of the README's bullets under `heading` (a line
/// starting with it), up to the next blank-line-separated paragraph that
/// is not a bullet list.
pub fn readme_keys(readme: &str, heading: &str) -> Result<BTreeSet<String>> {
    let start = readme
        .lines()
        .position(|l| l.starts_with(heading))
        .with_context(|| format!("README has no line starting {heading:?}"))?;
    let mut keys = BTreeSet::new();
    for line in readme.lines().skip(start + 1) {
        let line = line.trim_end();
        if line.is_empty() && !keys.is_empty() {
            break;
        }
        if let Some(rest) = line.strip_prefix("- `") {
            let key = rest.split('`').next().unwrap_or_default();
            keys.insert(key.to_string());
        }
    }
    ensure!(!keys.is_empty(), "README: no bullets under {heading:?}");
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: Kind, mode: u32) -> Entry {
        Entry {
            kind,
            mode,
            uid: 0,
            gid: 0,
            stamp: (1, 2, 3),
        }
    }

    #[test]
    fn shadow_dates_are_blanked_and_nothing_else() {
        let shadow = b"root:*:19000:0:99999:7:::\nbob:!:20780::::::\n";
        assert_eq!(
            blank_shadow_dates(shadow),
            b"root:*::0:99999:7:::\nbob:!:::::::\n".to_vec()
        );
    }

    #[test]
    fn diff_names_contents_modes_owners_and_missing_entries() {
        let mut a = Snapshot::default();
        let mut b = Snapshot::default();
        a.0.insert("/f".into(), entry(Kind::File(b"x\ny\n".to_vec()), 0o644));
        b.0.insert("/f".into(), entry(Kind::File(b"x\nz\n".to_vec()), 0o600));
        a.0.insert("/only".into(), entry(Kind::Dir, 0o755));
        b.0.insert("/l".into(), entry(Kind::Link("/t".into()), 0));
        let text: Vec<String> = diff(("ignition", &a), ("autonode", &b), false)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(text.len(), 3, "{text:?}");
        assert!(text[0].contains("ignition: \"y\"") && text[0].contains("autonode: \"z\""));
        assert!(text[0].contains("mode ignition 0644, autonode 0600"));
        assert!(text[1].starts_with("/l: only autonode has it (link to /t"));
        assert!(text[2].starts_with("/only: only ignition has it (directory"));
        assert!(diff(("a", &a), ("a", &a), true).is_empty());
        let mut rewritten = a.clone();
        if let Some(e) = rewritten.0.get_mut("/f") {
            e.stamp = (9, 9, 9);
        }
        assert!(diff(("a", &a), ("b", &rewritten), false).is_empty());
        assert_eq!(diff(("a", &a), ("b", &rewritten), true).len(), 1);
    }

    #[test]
    fn only_the_known_trailing_failures_are_harmless() {
        let relabel = "INFO : files: op(3): [started]  writing file\n\
                       INFO : files: op(3): [finished] writing file\n\
                       CRITICAL : files: op(9): [failed]   relabeling 14 patterns: exec: \"setfiles\"\n\
                       CRITICAL : Ignition failed: failed to handle relabeling: exec";
        assert!(only_harmless_failures(relabel));
        let real = "CRITICAL : files: op(2): [failed]   writing file \"/x\": it exists\n\
                    CRITICAL : Ignition failed: failed to handle relabeling";
        assert!(!only_harmless_failures(real));
        assert!(!only_harmless_failures("INFO : nothing failed"));
        let unfinished = "INFO : files: op(4): [started]  writing unit \"a@.service\"\n\
                          CRITICAL : Ignition failed: failed to create units: dial unix /run/systemd/private: connect";
        assert!(!only_harmless_failures(unfinished));
    }

    #[test]
    fn readme_keys_are_the_bullets_under_the_heading() {
        let readme = "intro\n**Supported**\n\n- `a.b`: yes\n- `c` too\n\nlater\n- `d`: no\n";
        let keys = readme_keys(readme, "**Supported**").expect("keys");
        assert_eq!(keys.into_iter().collect::<Vec<_>>(), ["a.b", "c"]);
        assert!(readme_keys(readme, "**Refused**").is_err());
    }
}
