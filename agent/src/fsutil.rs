//! Writing files so that a crash never leaves half of one, and every path
//! stays under a root (`/` in production, a temp dir in tests).
//!
//! A file is written to a temp file in the same directory with its final
//! mode and renamed over the target, so readers see the old contents or the
//! new, never a mix. When that must also hold after a power cut is a
//! [`Durability`] chosen by the caller: each file on its own (two journal
//! commits per file), or the whole phase at once with one
//! [`sync_filesystems`] before the phase is recorded as done (the agent's
//! own files, which a resumed run rewrites anyway). Writes that would
//! change nothing are skipped, so re-runs are idempotent.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Component, Path, PathBuf};

/// A filesystem error with the path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("{path}: {cause}")]
    Io { path: PathBuf, cause: io::Error },
    #[error("{0:?} must be an absolute path without '..'")]
    BadPath(String),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FsError + '_ {
    move |source| FsError::Io {
        path: path.to_path_buf(),
        cause: source,
    }
}

/// When a write is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Before the call returns: the file is fsynced before the rename and
    /// its directory after, so even a power cut leaves the old contents or
    /// the new. For files that a later run might not rewrite (Ignition's
    /// `overwrite: false` would refuse its own half-written file).
    Immediate,
    /// At the caller's next [`sync_filesystems`]. Until then a power cut may
    /// leave the file empty; only for files that are rewritten whenever the
    /// work that wrote them is redone, by a caller that records the work as
    /// done only after that sync. One sync per phase instead of two per
    /// file: most of the agent's time on disk.
    Deferred,
}

/// Owner ids to set; `None` keeps the writer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Owner {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// The directory every absolute path is resolved under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root(PathBuf);

impl Root {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Root(path.into())
    }

    pub fn as_path(&self) -> &Path {
        &self.0
    }

    /// `abs` (absolute, no `..`) under the root. Symlinks among the parent
    /// directories are followed as if the root were `/` (so `/var/run ->
    /// ../run` and `/lib -> usr/lib` work under a test root, and a link to
    /// `/etc` cannot lead a write out of the root); the last component is
    /// not followed.
    pub fn join(&self, abs: &str) -> Result<PathBuf, FsError> {
        let path = Path::new(abs);
        if !path.is_absolute() {
            return Err(FsError::BadPath(abs.into()));
        }
        let mut parts = Vec::new();
        for component in path.components() {
            match component {
                Component::RootDir | Component::CurDir => {}
                Component::Normal(part) => parts.push(part.to_os_string()),
                Component::ParentDir | Component::Prefix(_) => {
                    return Err(FsError::BadPath(abs.into()))
                }
            }
        }
        let Some(last) = parts.pop() else {
            return Ok(self.0.clone());
        };
        Ok(self.resolve_dirs(parts, abs)?.join(last))
    }

    fn resolve_dirs(&self, parts: Vec<OsString>, abs: &str) -> Result<PathBuf, FsError> {
        let mut pending: VecDeque<Part> = parts.into_iter().map(Part::Name).collect();
        let mut dir = self.0.clone();
        let mut depth = 0usize;
        let mut hops = 0;
        while let Some(part) = pending.pop_front() {
            let name = match part {
                Part::Parent => {
                    if depth > 0 {
                        dir.pop();
                        depth -= 1;
                    }
                    continue;
                }
                Part::Name(name) => name,
            };
            let candidate = dir.join(&name);
            let Ok(target) = fs::read_link(&candidate) else {
                dir = candidate;
                depth += 1;
                continue;
            };
            hops += 1;
            if hops > 40 {
                return Err(FsError::BadPath(abs.into()));
            }
            if target.is_absolute() {
                dir = self.0.clone();
                depth = 0;
            }
            for component in target.components().rev() {
                match component {
                    Component::Normal(part) => pending.push_front(Part::Name(part.to_os_string())),
                    Component::ParentDir => pending.push_front(Part::Parent),
                    _ => {}
                }
            }
        }
        Ok(dir)
    }
}

enum Part {
    Name(OsString),
    Parent,
}

/// Creates `dir` and missing parents with `mode` (parents Ignition-style
/// 0755); existing directories are left as they are.
pub fn create_dirs(dir: &Path, mode: u32) -> Result<(), FsError> {
    create_dirs_with(dir, mode, Durability::Immediate)
}

fn create_dirs_with(dir: &Path, mode: u32, durability: Durability) -> Result<(), FsError> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dirs_with(parent, 0o755, durability)?;
    }
    match fs::DirBuilder::new().mode(mode).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(io_err(dir)(e)),
        _ => {}
    }
    // DirBuilder's mode is filtered by the umask; set it exactly.
    fs::set_permissions(dir, fs::Permissions::from_mode(mode)).map_err(io_err(dir))?;
    match dir.parent() {
        Some(parent) if durability == Durability::Immediate => sync_dir(parent),
        _ => Ok(()),
    }
}

/// Whether `path` already holds exactly `contents` with `mode` and owner.
pub fn is_current(path: &Path, contents: &[u8], mode: u32, owner: Owner) -> bool {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return false;
    };
    meta.is_file()
        && meta.mode() & 0o7777 == mode
        && owner.uid.is_none_or(|uid| uid == meta.uid())
        && owner.gid.is_none_or(|gid| gid == meta.gid())
        && meta.len() == contents.len() as u64
        && fs::read(path).is_ok_and(|existing| existing == contents)
}

/// Writes `contents` to `path` atomically with `mode` and `owner`, creating
/// parent directories, durably before it returns. Returns whether anything
/// changed.
pub fn write_atomic(
    path: &Path,
    contents: &[u8],
    mode: u32,
    owner: Owner,
) -> Result<bool, FsError> {
    write_with(path, contents, mode, owner, Durability::Immediate)
}

/// [`write_atomic`] with the [`Durability`] the caller needs.
pub fn write_with(
    path: &Path,
    contents: &[u8],
    mode: u32,
    owner: Owner,
    durability: Durability,
) -> Result<bool, FsError> {
    if is_current(path, contents, mode, owner) {
        return Ok(false);
    }
    let dir = path
        .parent()
        .ok_or_else(|| FsError::BadPath(path.display().to_string()))?;
    create_dirs_with(dir, 0o755, durability)?;
    let temp = temp_path(path);
    let result = write_temp(&temp, contents, mode, owner, durability)
        .and_then(|()| fs::rename(&temp, path).map_err(io_err(path)));
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result?;
    if durability == Durability::Immediate {
        sync_dir(dir)?;
    }
    Ok(true)
}

fn write_temp(
    temp: &Path,
    contents: &[u8],
    mode: u32,
    owner: Owner,
    durability: Durability,
) -> Result<(), FsError> {
    let _ = fs::remove_file(temp);
    // Created with the final mode (0600 for keys): never readable by
    // others, not even for a moment.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode & 0o777)
        .open(temp)
        .map_err(io_err(temp))?;
    file.write_all(contents).map_err(io_err(temp))?;
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(io_err(temp))?;
    if owner.uid.is_some() || owner.gid.is_some() {
        std::os::unix::fs::fchown(&file, owner.uid, owner.gid).map_err(io_err(temp))?;
        // chown clears setuid/setgid bits; put them back.
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io_err(temp))?;
    }
    match durability {
        Durability::Immediate => file.sync_all().map_err(io_err(temp)),
        Durability::Deferred => Ok(()),
    }
}

/// Points `link` at `target`, replacing whatever is at `link` atomically,
/// durably before it returns. Returns whether anything changed.
pub fn symlink_atomic(target: &Path, link: &Path) -> Result<bool, FsError> {
    symlink_with(target, link, Durability::Immediate)
}

/// [`symlink_atomic`] with the [`Durability`] the caller needs.
pub fn symlink_with(target: &Path, link: &Path, durability: Durability) -> Result<bool, FsError> {
    if fs::read_link(link).is_ok_and(|current| current == target) {
        return Ok(false);
    }
    let dir = link
        .parent()
        .ok_or_else(|| FsError::BadPath(link.display().to_string()))?;
    create_dirs_with(dir, 0o755, durability)?;
    let temp = temp_path(link);
    let _ = fs::remove_file(&temp);
    std::os::unix::fs::symlink(target, &temp).map_err(io_err(&temp))?;
    if let Err(e) = fs::rename(&temp, link) {
        let _ = fs::remove_file(&temp);
        return Err(io_err(link)(e));
    }
    if durability == Durability::Immediate {
        sync_dir(dir)?;
    }
    Ok(true)
}

/// Removes a file or symlink if present. Returns whether anything changed.
pub fn remove_file(path: &Path) -> Result<bool, FsError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(path)(e)),
    }
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.autonode-{}.tmp", std::process::id()))
}

/// Makes a rename or create in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<(), FsError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// Makes every [`Durability::Deferred`] write so far durable on the
/// filesystems holding `paths` (each filesystem once: syncfs(2) commits its
/// journal and data together, which costs about what one fsync does).
/// A path that does not exist stands for its nearest existing parent.
pub fn sync_filesystems<P: AsRef<Path>>(paths: &[P]) -> Result<(), FsError> {
    let mut synced = Vec::new();
    for path in paths {
        let mut path = path.as_ref();
        while !path.exists() {
            match path.parent() {
                Some(parent) => path = parent,
                None => break,
            }
        }
        let file = File::open(path).map_err(io_err(path))?;
        let device = file.metadata().map_err(io_err(path))?.dev();
        if synced.contains(&device) {
            continue;
        }
        nix::unistd::syncfs(&file).map_err(|e| io_err(path)(e.into()))?;
        synced.push(device);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_join_refuses_escapes() {
        let root = Root::new("/tmp/r");
        assert_eq!(root.join("/etc/x").unwrap(), PathBuf::from("/tmp/r/etc/x"));
        assert!(root.join("etc/x").is_err());
        assert!(root.join("/etc/../../x").is_err());
    }

    #[test]
    fn parent_symlinks_stay_under_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        fs::create_dir_all(dir.path().join("run")).unwrap();
        fs::create_dir_all(dir.path().join("var")).unwrap();
        std::os::unix::fs::symlink("../run", dir.path().join("var/run")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("escape")).unwrap();
        assert_eq!(root.join("/var/run/x").unwrap(), dir.path().join("run/x"));
        assert_eq!(
            root.join("/escape/passwd").unwrap(),
            dir.path().join("etc/passwd")
        );
        std::os::unix::fs::symlink("../../../..", dir.path().join("up")).unwrap();
        assert_eq!(root.join("/up/x").unwrap(), dir.path().join("x"));
        std::os::unix::fs::symlink("loop", dir.path().join("loop")).unwrap();
        assert!(root.join("/loop/x").is_err());
    }

    #[test]
    fn atomic_write_sets_mode_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/key.pem");
        assert!(write_atomic(&path, b"secret", 0o600, Owner::default()).unwrap());
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert!(!write_atomic(&path, b"secret", 0o600, Owner::default()).unwrap());
        assert!(write_atomic(&path, b"secret", 0o640, Owner::default()).unwrap());
        assert!(write_atomic(&path, b"other", 0o640, Owner::default()).unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"other");
        let leftovers = fs::read_dir(path.parent().unwrap()).unwrap().count();
        assert_eq!(leftovers, 1);
    }

    #[test]
    fn deferred_writes_are_complete_to_readers_and_synced_by_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/kubeconfig");
        let owner = Owner::default();
        assert!(write_with(&path, b"new", 0o600, owner, Durability::Deferred).unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert!(!write_with(&path, b"new", 0o600, owner, Durability::Deferred).unwrap());
        let link = dir.path().join("c/current");
        assert!(symlink_with(Path::new("kubeconfig"), &link, Durability::Deferred).unwrap());
        // Paths not created yet stand for their nearest existing parent.
        let absent = dir.path().join("not/yet");
        sync_filesystems(&[path.as_path(), link.as_path(), absent.as_path()]).unwrap();
        let leftovers = fs::read_dir(path.parent().unwrap()).unwrap().count();
        assert_eq!(leftovers, 1);
    }

    #[test]
    fn symlinks_replace_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("l");
        assert!(symlink_atomic(Path::new("/a"), &link).unwrap());
        assert!(!symlink_atomic(Path::new("/a"), &link).unwrap());
        assert!(symlink_atomic(Path::new("/b"), &link).unwrap());
        assert_eq!(fs::read_link(&link).unwrap(), PathBuf::from("/b"));
        assert!(remove_file(&link).unwrap());
        assert!(!remove_file(&link).unwrap());
    }
}
