//! Which kubelet this node runs, found once per kubelet binary.
//!
//! The answer decides where per-node settings go (see
//! [`super::settings`]). In order:
//! 1. the image's record ([`super::VERSION_RECORD`]), written when the
//!    image was baked (packaging/bake/provision), as long as it names this
//!    binary (its path and size): one small file, and the way every image
//!    should answer;
//! 2. the state directory's cache, under the binary's identity (path,
//!    size, mtime): a reboot or a resumed run asks no second time, and a
//!    replaced kubelet is asked afresh;
//! 3. the version Kubernetes' build stamped into the binary, read from its
//!    Go build information ([`super::buildinfo`]), a few kilobytes; a
//!    kubelet built with `-trimpath` has no such record (Go then leaves
//!    the linker flags out);
//! 4. `kubelet --version`, which runs a 100 MB Go binary: 0.1 s on a real
//!    machine, over ten seconds under software emulation, on the boot's
//!    path. It starts early and runs while the agent makes keys and waits
//!    on the server; its answer is cached. Kept for images baked without a
//!    record (every image baked before it existed), which the caller warns
//!    about.

use super::KubeletError;
use crate::fsutil::{self, Durability, Owner};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, UNIX_EPOCH};

/// How long `kubelet --version` may take: minutes would mean a hung binary,
/// not a slow machine (it takes about a second under software emulation).
const TIMEOUT: Duration = Duration::from_secs(60);

/// A kubelet's `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KubeletVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl KubeletVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        KubeletVersion {
            major,
            minor,
            patch,
        }
    }

    /// The version in `kubelet --version`'s output: `Kubernetes v1.34.1`,
    /// also with a vendor suffix (`v1.31.0-eks-abc`, `v1.30.2+k3s1`).
    pub fn parse(output: &str) -> Option<Self> {
        output.split_whitespace().find_map(|word| {
            let numbers = word.strip_prefix('v')?;
            let end = numbers
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(numbers.len());
            let mut parts = numbers[..end].split('.').map(str::parse::<u32>);
            let version = KubeletVersion::new(
                parts.next()?.ok()?,
                parts.next()?.ok()?,
                parts.next()?.ok()?,
            );
            (parts.next().is_none() && version.major == 1).then_some(version)
        })
    }

    /// Whether this kubelet is at least `major.minor`.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

impl fmt::Display for KubeletVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A kubelet binary as the cache knows it: replaced or rebuilt, it is
/// another binary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct BinaryIdentity {
    path: PathBuf,
    size: u64,
    mtime_s: u64,
    mtime_ns: u32,
}

impl BinaryIdentity {
    fn of(path: &Path) -> Result<Self, KubeletError> {
        let meta = std::fs::metadata(path).map_err(|e| KubeletError::Version {
            program: path.display().to_string(),
            reason: format!("{e} (is kubelet installed there? see --kubelet-path)"),
        })?;
        // A clock before 1970 is no reason to fail: such a binary is just
        // never found in the cache.
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .unwrap_or_default();
        Ok(BinaryIdentity {
            path: path.to_path_buf(),
            size: meta.len(),
            mtime_s: mtime.as_secs(),
            mtime_ns: mtime.subsec_nanos(),
        })
    }
}

/// The cache file: one binary, one version.
#[derive(Debug, Serialize, Deserialize)]
struct Cached {
    binary: BinaryIdentity,
    version: KubeletVersion,
}

/// What [`Probe::finish`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub version: KubeletVersion,
    pub found: Found,
}

/// Where [`Answer::version`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// The image's record, made when it was baked, read in this long.
    Recorded(Duration),
    Cached,
    /// The binary's Go build information, read in this long.
    BuildInfo(Duration),
    /// `kubelet --version`, which ran this long (until the agent saw it
    /// exit).
    Ran(Duration),
}

impl Found {
    /// For the log: `recorded`, `cached`, `build-info`, `kubelet-version`.
    pub fn name(&self) -> &'static str {
        match self {
            Found::Recorded(_) => "recorded",
            Found::Cached => "cached",
            Found::BuildInfo(_) => "build-info",
            Found::Ran(_) => "kubelet-version",
        }
    }

    /// What finding it cost (zero when cached).
    pub fn took(&self) -> Duration {
        match self {
            Found::Cached => Duration::ZERO,
            Found::Recorded(took) | Found::BuildInfo(took) | Found::Ran(took) => *took,
        }
    }
}

/// Where the answer comes from.
enum Source {
    Known(KubeletVersion, Found),
    Running { child: Child, started: Instant },
    Failed(KubeletError),
}

/// Where a [`Probe`] looks, and for what.
#[derive(Debug, Clone, Copy)]
pub struct Places<'a> {
    /// The kubelet binary, as this process reaches it (under the root).
    pub kubelet: &'a Path,
    /// Its path as the machine names it (`--kubelet-path`): what the
    /// image's record names.
    pub named: &'a Path,
    /// The agent's cache, in its state directory.
    pub cache: &'a Path,
    /// The image's record ([`super::VERSION_RECORD`], under the root).
    pub record: &'a Path,
}

/// `kubelet --version`, started by [`Probe::start`] and read by
/// [`Probe::finish`]; in between the agent does other work.
pub struct Probe {
    program: PathBuf,
    cache: PathBuf,
    binary: Option<BinaryIdentity>,
    source: Source,
}

impl Probe {
    /// Looks the kubelet up in the image's record, the cache and its
    /// build information, else starts `kubelet --version`. Never fails
    /// here: a failure is reported by [`Probe::finish`], when (and if) the
    /// version is needed.
    pub fn start(places: Places<'_>) -> Probe {
        let (binary, source) = match BinaryIdentity::of(places.kubelet) {
            Ok(binary) => {
                let source = find(places, &binary);
                (Some(binary), source)
            }
            Err(e) => (None, Source::Failed(e)),
        };
        Probe {
            program: places.kubelet.to_path_buf(),
            cache: places.cache.to_path_buf(),
            binary,
            source,
        }
    }

    /// The version (waiting for `kubelet --version` if it still runs).
    pub fn finish(mut self) -> Result<Answer, KubeletError> {
        // Taken out of a type with a Drop: a placeholder stays behind.
        let source = std::mem::replace(
            &mut self.source,
            Source::Failed(KubeletError::Version {
                program: self.program.display().to_string(),
                reason: "already finished".into(),
            }),
        );
        let (child, started) = match source {
            Source::Known(version, found) => return Ok(Answer { version, found }),
            Source::Failed(e) => return Err(e),
            Source::Running { child, started } => (child, started),
        };
        let output = wait(child, started, &self.program)?;
        let ran = started.elapsed();
        let version = KubeletVersion::parse(&output).ok_or_else(|| KubeletError::Version {
            program: self.program.display().to_string(),
            reason: format!("no Kubernetes version (v1.x.y) in its output {output:?}"),
        })?;
        if let Some(binary) = self.binary.take() {
            write_cache(&self.cache, binary, version);
        }
        Ok(Answer {
            version,
            found: Found::Ran(ran),
        })
    }
}

impl Drop for Probe {
    /// A probe the agent no longer needs (it failed before applying) must
    /// not outlive it.
    fn drop(&mut self) {
        if let Source::Running { child, .. } = &mut self.source {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The image's record, the cache, the build information, else a
/// `kubelet --version` started.
fn find(places: Places<'_>, binary: &BinaryIdentity) -> Source {
    let kubelet = places.kubelet;
    let read = Instant::now();
    if let Some(version) = read_record(places.record, places.named, binary.size) {
        return Source::Known(version, Found::Recorded(read.elapsed()));
    }
    if let Some(version) = read_cache(places.cache, binary) {
        return Source::Known(version, Found::Cached);
    }
    let read = Instant::now();
    let stamped = super::buildinfo::stamped_version(kubelet);
    if let Some(version) = stamped.as_deref().and_then(KubeletVersion::parse) {
        return Source::Known(version, Found::BuildInfo(read.elapsed()));
    }
    match spawn(kubelet) {
        Ok(child) => Source::Running {
            child,
            started: Instant::now(),
        },
        Err(e) => Source::Failed(e),
    }
}

fn spawn(kubelet: &Path) -> Result<Child, KubeletError> {
    Command::new(kubelet)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| KubeletError::Version {
            program: kubelet.display().to_string(),
            reason: format!("cannot run it: {e}"),
        })
}

/// Waits for the probe, at most [`TIMEOUT`] from its start. Its output is a
/// line, far below a pipe's buffer: waiting before reading cannot block it.
fn wait(mut child: Child, started: Instant, program: &Path) -> Result<String, KubeletError> {
    let failed = |reason: String| KubeletError::Version {
        program: program.display().to_string(),
        reason,
    };
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() > TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed(format!("no answer in {TIMEOUT:?}")));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(failed(e.to_string())),
        }
    }
    let output = child
        .wait_with_output()
        .map_err(|e| failed(e.to_string()))?;
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(failed(format!("{}: {}", output.status, stderr.trim())));
    }
    Ok(stdout)
}

/// What an image records of its kubelet when it is baked: `key=value`
/// lines (`#` starts a comment), so that a shell script writes it and a
/// person reads it:
///
/// ```text
/// kubelet=/usr/bin/kubelet
/// size=104857600
/// version=v1.37.2
/// ```
///
/// `version` is `kubelet --version`'s, as run at bake time. The binary is
/// named by its path and size, not its mtime (as the cache does): an image
/// copied file by file (a tar, `mkfs.ext4 -d`, a snapshot restored) may
/// keep the mtime to the second only, and two kubelet releases of the same
/// size do not happen. Not by a digest either: hashing 100 MB at boot
/// costs what the record saves.
#[derive(Debug, PartialEq, Eq)]
struct Record {
    kubelet: PathBuf,
    size: u64,
    version: KubeletVersion,
}

/// Why a record could not be read.
#[derive(Debug, thiserror::Error)]
enum RecordError {
    #[error("not key=value: {0:?}")]
    NotAPair(String),
    #[error("{key}={value:?} is not {want}")]
    Value {
        key: &'static str,
        value: String,
        want: &'static str,
    },
    #[error("no {0}=")]
    Missing(&'static str),
}

impl Record {
    fn parse(text: &str) -> Result<Record, RecordError> {
        let (mut kubelet, mut size, mut version) = (None, None, None);
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(RecordError::NotAPair(line.to_string()));
            };
            let value = value.trim();
            match key.trim() {
                "kubelet" => kubelet = Some(PathBuf::from(value)),
                "size" => {
                    let parsed = value.parse().map_err(|_| RecordError::Value {
                        key: "size",
                        value: value.to_string(),
                        want: "a number of bytes",
                    });
                    size = Some(parsed?);
                }
                "version" => {
                    let parsed = KubeletVersion::parse(value).ok_or_else(|| RecordError::Value {
                        key: "version",
                        value: value.to_string(),
                        want: "a version v1.x.y",
                    });
                    version = Some(parsed?);
                }
                // Later keys are for later agents.
                _ => {}
            }
        }
        Ok(Record {
            kubelet: kubelet.ok_or(RecordError::Missing("kubelet"))?,
            size: size.ok_or(RecordError::Missing("size"))?,
            version: version.ok_or(RecordError::Missing("version"))?,
        })
    }
}

/// The version the image recorded for the kubelet at `named`, `size`
/// bytes. No record is the normal case of an older image (the caller warns
/// if kubelet must run); a record of another binary (kubelet replaced
/// after the bake) or an unreadable one is said and passed over.
fn read_record(record: &Path, named: &Path, size: u64) -> Option<KubeletVersion> {
    let text = match std::fs::read_to_string(record) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            log::warn!(
                "reading the image's kubelet record {}: {e}",
                record.display()
            );
            return None;
        }
    };
    match Record::parse(&text) {
        Ok(found) if found.kubelet == named && found.size == size => Some(found.version),
        Ok(found) => {
            log::warn!(
                "the image's kubelet record {} is of {} ({} bytes), not of {} ({size} bytes): kubelet changed after the image was baked; not used",
                record.display(),
                found.kubelet.display(),
                found.size,
                named.display()
            );
            None
        }
        Err(e) => {
            log::warn!(
                "the image's kubelet record {} is unreadable ({e}); not used",
                record.display()
            );
            None
        }
    }
}

fn read_cache(cache: &Path, binary: &BinaryIdentity) -> Option<KubeletVersion> {
    let bytes = std::fs::read(cache).ok()?;
    let cached: Cached = serde_json::from_slice(&bytes).ok()?;
    (cached.binary == *binary).then_some(cached.version)
}

/// Best effort: without the cache the next run asks kubelet again.
fn write_cache(cache: &Path, binary: BinaryIdentity, version: KubeletVersion) {
    let cached = Cached { binary, version };
    let written = serde_json::to_vec_pretty(&cached)
        .map_err(|e| e.to_string())
        .and_then(|json| {
            fsutil::write_with(cache, &json, 0o644, Owner::default(), Durability::Deferred)
                .map_err(|e| e.to_string())
        });
    if let Err(e) = written {
        log::warn!("caching kubelet's version in {}: {e}", cache.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A kubelet that prints `output` and counts its runs in `<path>.runs`.
    fn fake_kubelet(dir: &Path, output: &str) -> PathBuf {
        let path = dir.join("kubelet");
        let runs = dir.join("kubelet.runs");
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\necho run >> '{}'\necho '{output}'\n",
                runs.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// A probe of `kubelet` with `cache` and no image record.
    fn probe(kubelet: &Path, cache: &Path) -> Probe {
        let record = cache.with_extension("no-record");
        Probe::start(Places {
            kubelet,
            named: kubelet,
            cache,
            record: &record,
        })
    }

    fn runs(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("kubelet.runs"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    #[test]
    fn parses_kubelet_version_output() {
        let cases = [
            ("Kubernetes v1.34.1", KubeletVersion::new(1, 34, 1)),
            ("Kubernetes v1.20.2\n", KubeletVersion::new(1, 20, 2)),
            (
                "Kubernetes v1.31.0-eks-abc123",
                KubeletVersion::new(1, 31, 0),
            ),
            ("Kubernetes v1.30.2+k3s1", KubeletVersion::new(1, 30, 2)),
        ];
        for (output, want) in cases {
            assert_eq!(KubeletVersion::parse(output), Some(want), "{output}");
        }
        for bad in [
            "",
            "Kubernetes",
            "Kubernetes v1.34",
            "v2.0.0",
            "1.34.1",
            "vx.y.z",
        ] {
            assert_eq!(KubeletVersion::parse(bad), None, "{bad}");
        }
        assert!(KubeletVersion::new(1, 27, 0).at_least(1, 27));
        assert!(!KubeletVersion::new(1, 26, 15).at_least(1, 27));
        assert_eq!(KubeletVersion::new(1, 34, 1).to_string(), "v1.34.1");
    }

    #[test]
    fn asks_kubelet_once_then_the_cache_until_the_binary_changes() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = fake_kubelet(dir.path(), "Kubernetes v1.26.3");
        let cache = dir.path().join("state/kubelet-version.json");
        let first = probe(&kubelet, &cache).finish().unwrap();
        assert_eq!(first.version, KubeletVersion::new(1, 26, 3));
        assert!(matches!(first.found, Found::Ran(_)));
        let second = probe(&kubelet, &cache).finish().unwrap();
        let cached = Answer {
            version: KubeletVersion::new(1, 26, 3),
            found: Found::Cached,
        };
        assert_eq!(second, cached);
        assert_eq!(runs(dir.path()), 1);

        // A new kubelet (another size) is asked again.
        let kubelet = fake_kubelet(dir.path(), "Kubernetes v1.34.10");
        let third = probe(&kubelet, &cache).finish().unwrap();
        assert_eq!(third.version, KubeletVersion::new(1, 34, 10));
        assert!(matches!(third.found, Found::Ran(_)));
        assert_eq!(runs(dir.path()), 2);
    }

    #[test]
    fn a_missing_failing_or_silent_kubelet_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache.json");
        let err = probe(&dir.path().join("nope"), &cache)
            .finish()
            .unwrap_err();
        assert!(err.to_string().contains("--kubelet-path"), "{err}");

        let kubelet = fake_kubelet(dir.path(), "not a version");
        let err = probe(&kubelet, &cache).finish().unwrap_err();
        assert!(err.to_string().contains("no Kubernetes version"), "{err}");
        assert!(!cache.exists());

        let failing = dir.path().join("failing");
        std::fs::write(&failing, "#!/bin/sh\necho broken >&2\nexit 3\n").unwrap();
        std::fs::set_permissions(&failing, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = probe(&failing, &cache).finish().unwrap_err();
        assert!(err.to_string().contains("broken"), "{err}");

        let not_executable = dir.path().join("plain");
        std::fs::write(&not_executable, "x").unwrap();
        let err = probe(&not_executable, &cache).finish().unwrap_err();
        assert!(err.to_string().contains("cannot run it"), "{err}");
    }

    #[test]
    fn a_corrupt_cache_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = fake_kubelet(dir.path(), "Kubernetes v1.23.0");
        let cache = dir.path().join("cache.json");
        std::fs::write(&cache, "{not json").unwrap();
        let answer = probe(&kubelet, &cache).finish().unwrap();
        assert_eq!(answer.version, KubeletVersion::new(1, 23, 0));
        assert!(matches!(answer.found, Found::Ran(_)));
        let answer = probe(&kubelet, &cache).finish().unwrap();
        assert_eq!(answer.found, Found::Cached);
    }

    #[test]
    fn a_stamped_kubelet_is_read_not_run() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = dir.path().join("kubelet");
        std::fs::write(
            &kubelet,
            super::super::buildinfo::tests::stamped_kubelet("v1.34.1"),
        )
        .unwrap();
        // Not executable: running it would fail.
        std::fs::set_permissions(&kubelet, std::fs::Permissions::from_mode(0o644)).unwrap();
        let cache = dir.path().join("cache.json");
        let answer = probe(&kubelet, &cache).finish().unwrap();
        assert_eq!(answer.version, KubeletVersion::new(1, 34, 1));
        assert!(matches!(answer.found, Found::BuildInfo(_)));
        assert_eq!(answer.found.name(), "build-info");
    }

    #[test]
    fn the_images_record_answers_without_running_kubelet() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = fake_kubelet(dir.path(), "Kubernetes v1.37.2");
        let size = std::fs::metadata(&kubelet).unwrap().len();
        let named = Path::new("/usr/bin/kubelet");
        let cache = dir.path().join("state/kubelet-version.json");
        let record = dir.path().join("kubelet-version");
        let places = Places {
            kubelet: &kubelet,
            named,
            cache: &cache,
            record: &record,
        };
        std::fs::write(
            &record,
            format!("# baked\nkubelet=/usr/bin/kubelet\nsize={size}\nversion=v1.37.2\nlater=key\n"),
        )
        .unwrap();
        let answer = Probe::start(places).finish().unwrap();
        assert_eq!(answer.version, KubeletVersion::new(1, 37, 2));
        assert!(matches!(answer.found, Found::Recorded(_)));
        assert_eq!(answer.found.name(), "recorded");
        assert_eq!(runs(dir.path()), 0);
        assert!(!cache.exists(), "a recorded version needs no cache");

        // Another binary than the record's (replaced after the bake, or
        // another path): kubelet is asked, and the record left alone.
        for other in [
            format!(
                "kubelet=/usr/bin/kubelet\nsize={}\nversion=v1.37.2\n",
                size + 1
            ),
            format!("kubelet=/opt/bin/kubelet\nsize={size}\nversion=v1.37.2\n"),
            "size=12\nversion=v1.37.2\n".to_string(),
            "kubelet=/usr/bin/kubelet\nsize=x\nversion=v1.37.2\n".to_string(),
            format!("kubelet=/usr/bin/kubelet\nsize={size}\nversion=1.37\n"),
        ] {
            std::fs::write(&record, &other).unwrap();
            let _ = std::fs::remove_file(&cache);
            let answer = Probe::start(places).finish().unwrap();
            assert!(matches!(answer.found, Found::Ran(_)), "{other}");
        }
        assert_eq!(runs(dir.path()), 5);
    }
}
