//! Writing a parsed Ignition config's storage section under a root.
//!
//! Idempotent: what is already as asked is left alone, so a second run
//! changes nothing. Where Ignition would fail on an existing node
//! (`overwrite` false), the agent accepts a node that is already exactly as
//! asked (its own earlier run) and refuses anything else.
//!
//! Contents are decoded by [`autonode_shared::ignition::decode`] (shared with the
//! server): `source: ""` is an empty file like any other contents, so with
//! `overwrite` it replaces a file, a link or (as Ignition does) a
//! directory; an absent source keeps an existing file's contents. Owners
//! given by name are looked up in the root's own databases ([`owners`]).

use super::owners;
use super::IgnitionError;
use crate::fsutil::{self, Owner, Root};
use autonode_shared::ignition::{decode, Directory, File, Link, Storage};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

/// The first spec minor version (3.4.0) whose modes keep setuid, setgid
/// and sticky; Ignition drops them from older configs.
const SPECIAL_BITS_SINCE: u32 = 4;

/// `mode` as Ignition applies it under spec 3.`minor`: before 3.4.0 the
/// setuid, setgid and sticky bits are dropped, with a warning naming the
/// path (so 0o4755 becomes 0o755), as Ignition 2.14 does.
pub fn effective_mode(path: &str, mode: u32, minor: u32) -> u32 {
    let special = mode & 0o7000;
    if special == 0 || minor >= SPECIAL_BITS_SINCE {
        return mode;
    }
    log::warn!(
        "{path}: mode {mode:#o} has setuid/setgid/sticky bits, which Ignition drops before spec 3.4.0; applying {:#o}",
        mode & 0o777
    );
    mode & 0o777
}

/// Applies one `storage.directories` entry of a spec 3.`minor` config.
pub fn directory(root: &Root, dir: &Directory, minor: u32) -> Result<bool, IgnitionError> {
    let path = root.join(&dir.path)?;
    let mode = effective_mode(&dir.path, dir.mode.unwrap_or(0o755), minor);
    check_directory(&path, dir)?;
    let meta = std::fs::symlink_metadata(&path).ok();
    let mut changed = false;
    if meta.as_ref().is_some_and(|m| !m.is_dir()) {
        changed |= fsutil::remove_file(&path)?;
    }
    if !path.is_dir() {
        fsutil::create_dirs(&path, mode)?;
        changed = true;
    }
    let owner = owners::resolve(root, &dir.path, &dir.user, &dir.group)?;
    changed |= set_meta(&path, mode, owner)?;
    Ok(changed)
}

/// Applies one `storage.files` entry of a spec 3.`minor` config.
pub fn file(root: &Root, file: &File, minor: u32) -> Result<bool, IgnitionError> {
    let path = root.join(&file.path)?;
    check_file(&path, file)?;
    let meta = std::fs::symlink_metadata(&path).ok();
    let exists_as_file = meta.as_ref().is_some_and(|m| m.is_file());
    let owner = owners::resolve(root, &file.path, &file.user, &file.group)?;
    let contents = match &file.contents.source {
        Some(_) => decode(&file.contents, &file.path)?,
        // No source: keep an existing file's contents, else create it empty.
        None if exists_as_file => std::fs::read(&path).map_err(|e| io(&path, e))?,
        None => Vec::new(),
    };
    let existing_mode = meta
        .as_ref()
        .filter(|_| exists_as_file)
        .map(|m| m.mode() & 0o7777);
    let mode = match file.mode {
        Some(mode) => effective_mode(&file.path, mode, minor),
        None => existing_mode
            .filter(|_| file.contents.source.is_none())
            .unwrap_or(0o644),
    };
    if meta.as_ref().is_some_and(|m| m.is_dir()) {
        std::fs::remove_dir_all(&path).map_err(|e| io(&path, e))?;
    } else if meta.is_some() && !exists_as_file {
        fsutil::remove_file(&path)?;
    }
    Ok(fsutil::write_atomic(&path, &contents, mode, owner)?)
}

/// Applies one `storage.links` entry (symbolic; the target is kept as
/// written, so absolute targets resolve on the real root at run time).
pub fn link(root: &Root, link: &Link) -> Result<bool, IgnitionError> {
    let path = root.join(&link.path)?;
    let target = Path::new(&link.target);
    let owner = owners::resolve(root, &link.path, &link.user, &link.group)?;
    if std::fs::read_link(&path).ok().as_deref() == Some(target) {
        return set_link_owner(&path, owner);
    }
    check_link(&path, link)?;
    fsutil::symlink_atomic(target, &path)?;
    set_link_owner(&path, owner)?;
    Ok(true)
}

/// Refuses a directory entry where something else is, without overwrite.
fn check_directory(path: &Path, dir: &Directory) -> Result<(), IgnitionError> {
    let meta = std::fs::symlink_metadata(path).ok();
    if meta.is_some_and(|m| !m.is_dir()) && dir.overwrite != Some(true) {
        return Err(conflict(
            &dir.path,
            "exists and is not a directory (overwrite is false)",
        ));
    }
    Ok(())
}

/// Refuses a file entry, without overwrite, where something other than a
/// regular file is, or a file with other contents than a given source.
fn check_file(path: &Path, file: &File) -> Result<(), IgnitionError> {
    if file.overwrite == Some(true) {
        return Ok(());
    }
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.is_file() {
        return Err(conflict(
            &file.path,
            "exists and is not a regular file (overwrite is false)",
        ));
    }
    if file.contents.source.is_some() {
        let contents = decode(&file.contents, &file.path)?;
        if !std::fs::read(path).is_ok_and(|current| current == contents) {
            return Err(conflict(
                &file.path,
                "exists with other contents (overwrite is false)",
            ));
        }
    }
    Ok(())
}

/// Refuses a link entry where something else is, without overwrite, and a
/// directory even with it (its contents would be lost).
fn check_link(path: &Path, link: &Link) -> Result<(), IgnitionError> {
    let current = std::fs::read_link(path).ok();
    if current.as_deref() == Some(Path::new(&link.target))
        || std::fs::symlink_metadata(path).is_err()
    {
        return Ok(());
    }
    if link.overwrite != Some(true) {
        return Err(conflict(
            &link.path,
            "exists and is not this link (overwrite is false)",
        ));
    }
    if path.is_dir() && current.is_none() {
        return Err(conflict(
            &link.path,
            "is a directory; refusing to delete it",
        ));
    }
    Ok(())
}

/// Checks, before anything is written, every conflict the entries of
/// `storage` would meet on the node as it is now, so a refused config
/// leaves the node as it was. An entry under another entry of the config
/// is left to the apply: what is at its path now may be replaced first.
pub fn preflight(root: &Root, storage: &Storage) -> Result<(), IgnitionError> {
    let paths: Vec<&str> = storage
        .files
        .iter()
        .map(|f| f.path.as_str())
        .chain(storage.directories.iter().map(|d| d.path.as_str()))
        .chain(storage.links.iter().map(|l| l.path.as_str()))
        .collect();
    let nested = |path: &str| {
        paths.iter().any(|p| {
            path.strip_prefix(p)
                .is_some_and(|rest| rest.starts_with('/'))
        })
    };
    for dir in storage.directories.iter().filter(|d| !nested(&d.path)) {
        check_directory(&root.join(&dir.path)?, dir)?;
    }
    for file in storage.files.iter().filter(|f| !nested(&f.path)) {
        check_file(&root.join(&file.path)?, file)?;
    }
    for link in storage.links.iter().filter(|l| !nested(&l.path)) {
        check_link(&root.join(&link.path)?, link)?;
    }
    Ok(())
}

/// Sets mode and owner of an existing directory; whether anything changed.
fn set_meta(path: &Path, mode: u32, owner: Owner) -> Result<bool, IgnitionError> {
    let meta = std::fs::metadata(path).map_err(|e| io(path, e))?;
    let mut changed = false;
    let wrong_owner =
        owner.uid.is_some_and(|u| u != meta.uid()) || owner.gid.is_some_and(|g| g != meta.gid());
    if wrong_owner {
        std::os::unix::fs::chown(path, owner.uid, owner.gid).map_err(|e| io(path, e))?;
        changed = true;
    }
    if wrong_owner || meta.mode() & 0o7777 != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io(path, e))?;
        changed = true;
    }
    Ok(changed)
}

fn set_link_owner(path: &Path, owner: Owner) -> Result<bool, IgnitionError> {
    if owner.uid.is_none() && owner.gid.is_none() {
        return Ok(false);
    }
    let meta = std::fs::symlink_metadata(path).map_err(|e| io(path, e))?;
    if owner.uid.is_none_or(|u| u == meta.uid()) && owner.gid.is_none_or(|g| g == meta.gid()) {
        return Ok(false);
    }
    std::os::unix::fs::lchown(path, owner.uid, owner.gid).map_err(|e| io(path, e))?;
    Ok(true)
}

fn conflict(path: &str, reason: &str) -> IgnitionError {
    IgnitionError::Conflict {
        path: path.to_string(),
        reason: reason.to_string(),
    }
}

fn io(path: &Path, source: std::io::Error) -> IgnitionError {
    IgnitionError::Fs(fsutil::FsError::Io {
        path: path.to_path_buf(),
        cause: source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use autonode_shared::ignition::{Contents, OwnerId};

    fn empty_file(path: &str, overwrite: Option<bool>) -> File {
        File {
            path: path.into(),
            overwrite,
            mode: None,
            user: OwnerId::default(),
            group: OwnerId::default(),
            contents: Contents {
                source: Some(String::new()),
                ..Contents::default()
            },
        }
    }

    /// What Debian's Ignition 2.14 did with the same entries.
    #[test]
    fn an_empty_source_is_an_empty_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let etc = dir.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        std::fs::write(etc.join("a"), "hello").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", etc.join("d")).unwrap();
        std::fs::create_dir_all(etc.join("e/sub")).unwrap();
        std::fs::write(etc.join("f"), "hello").unwrap();
        for path in ["/etc/a", "/etc/b", "/etc/d", "/etc/e"] {
            assert!(
                file(&root, &empty_file(path, Some(true)), 3).unwrap(),
                "{path}"
            );
            let meta = std::fs::symlink_metadata(dir.path().join(&path[1..])).unwrap();
            assert!(meta.is_file() && meta.len() == 0, "{path}");
            assert_eq!(meta.mode() & 0o7777, 0o644, "{path}");
            assert!(
                !file(&root, &empty_file(path, Some(true)), 3).unwrap(),
                "{path} again"
            );
        }
        // Without overwrite, an existing file with contents is a conflict;
        // an empty one is already as asked.
        let err = file(&root, &empty_file("/etc/f", None), 3).unwrap_err();
        assert!(matches!(err, IgnitionError::Conflict { .. }), "{err}");
        assert_eq!(std::fs::read(etc.join("f")).unwrap(), b"hello");
        assert!(!file(&root, &empty_file("/etc/a", None), 3).unwrap());
    }

    #[test]
    fn owners_by_name_come_from_the_roots_passwd() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let me = std::fs::metadata(dir.path()).unwrap();
        let etc = dir.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        // Names only this root knows, for ids this process may chown to.
        let passwd = format!(
            "nodeuser:x:{}:{}::/home/nodeuser:/bin/sh\n",
            me.uid(),
            me.gid()
        );
        std::fs::write(etc.join("passwd"), passwd).unwrap();
        std::fs::write(etc.join("group"), format!("nodegroup:x:{}:\n", me.gid())).unwrap();
        let named = |name: &str| OwnerId {
            id: None,
            name: Some(name.into()),
        };
        let owned = File {
            user: named("nodeuser"),
            group: named("nodegroup"),
            ..empty_file("/etc/owned", None)
        };
        file(&root, &owned, 3).unwrap();
        let meta = std::fs::metadata(etc.join("owned")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (me.uid(), me.gid()));
        let stranger = File {
            user: named("root-on-the-host-only"),
            ..empty_file("/etc/other", None)
        };
        let err = file(&root, &stranger, 3).unwrap_err();
        assert!(matches!(err, IgnitionError::Owner { .. }), "{err}");
        assert!(err.to_string().contains("/etc/other"), "{err}");
        assert!(
            !etc.join("other").exists(),
            "nothing written for a refused entry"
        );
    }

    /// Ignition 2.14 left 0o755 and 0o777 for these under 3.3.0; 3.4.0
    /// keeps the bits.
    #[test]
    fn special_bits_are_dropped_before_3_4() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let mode_of = |p: &str| {
            let meta = std::fs::metadata(dir.path().join(p)).unwrap();
            meta.mode() & 0o7777
        };
        let suid = File {
            mode: Some(0o4755),
            ..empty_file("/suid", None)
        };
        let sticky = Directory {
            path: "/sticky".into(),
            overwrite: None,
            mode: Some(0o1777),
            user: OwnerId::default(),
            group: OwnerId::default(),
        };
        file(&root, &suid, 3).unwrap();
        directory(&root, &sticky, 3).unwrap();
        assert_eq!((mode_of("suid"), mode_of("sticky")), (0o755, 0o777));
        assert!(!file(&root, &suid, 3).unwrap(), "idempotent under 3.3");
        assert!(file(&root, &suid, 4).unwrap());
        assert!(directory(&root, &sticky, 4).unwrap());
        assert_eq!((mode_of("suid"), mode_of("sticky")), (0o4755, 0o1777));
        assert_eq!(effective_mode("/x", 0o2750, 6), 0o2750);
        assert_eq!(effective_mode("/x", 0o640, 0), 0o640);
    }
}
