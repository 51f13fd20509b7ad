//! Writing a parsed Ignition config's storage section under a root.
//!
//! Idempotent: what is already as asked is left alone, so a second run
//! changes nothing. Where Ignition would fail on an existing node
//! (`overwrite` false), the agent accepts a node that is already exactly as
//! asked (its own earlier run) and refuses anything else.

use super::spec::{Contents, Directory, File, Link, OwnerId};
use super::IgnitionError;
use crate::fsutil::{self, Owner, Root};
use base64::Engine as _;
use sha2::{Digest as _, Sha256, Sha512};
use std::io::Read as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

/// Largest decompressed file: protects the node from a gzip bomb.
const MAX_FILE: u64 = 64 * 1024 * 1024;

fn owner(user: OwnerId, group: OwnerId) -> Owner {
    Owner {
        uid: user.id,
        gid: group.id,
    }
}

/// Applies one `storage.directories` entry.
pub fn directory(root: &Root, dir: &Directory) -> Result<bool, IgnitionError> {
    let path = root.join(&dir.path)?;
    let mode = dir.mode.unwrap_or(0o755);
    let meta = std::fs::symlink_metadata(&path).ok();
    let mut changed = false;
    if meta.as_ref().is_some_and(|m| !m.is_dir()) {
        if dir.overwrite != Some(true) {
            return Err(conflict(
                &dir.path,
                "exists and is not a directory (overwrite is false)",
            ));
        }
        changed |= fsutil::remove_file(&path)?;
    }
    if !path.is_dir() {
        fsutil::create_dirs(&path, mode)?;
        changed = true;
    }
    changed |= set_meta(&path, mode, owner(dir.user, dir.group))?;
    Ok(changed)
}

/// Applies one `storage.files` entry.
pub fn file(root: &Root, file: &File) -> Result<bool, IgnitionError> {
    let path = root.join(&file.path)?;
    let meta = std::fs::symlink_metadata(&path).ok();
    let exists_as_file = meta.as_ref().is_some_and(|m| m.is_file());
    let overwrite = file.overwrite == Some(true);
    if meta.is_some() && !exists_as_file && !overwrite {
        return Err(conflict(
            &file.path,
            "exists and is not a regular file (overwrite is false)",
        ));
    }
    let owner = owner(file.user, file.group);
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
    let mode = file
        .mode
        .or(existing_mode.filter(|_| file.contents.source.is_none()))
        .unwrap_or(0o644);
    if exists_as_file && !overwrite && file.contents.source.is_some() {
        let same = std::fs::read(&path).is_ok_and(|current| current == contents);
        if !same {
            return Err(conflict(
                &file.path,
                "exists with other contents (overwrite is false)",
            ));
        }
    }
    if meta.is_some() && !exists_as_file {
        fsutil::remove_file(&path)?;
    }
    Ok(fsutil::write_atomic(&path, &contents, mode, owner)?)
}

/// Applies one `storage.links` entry (symbolic; the target is kept as
/// written, so absolute targets resolve on the real root at run time).
pub fn link(root: &Root, link: &Link) -> Result<bool, IgnitionError> {
    let path = root.join(&link.path)?;
    let target = Path::new(&link.target);
    let current = std::fs::read_link(&path).ok();
    if current.as_deref() == Some(target) {
        return set_link_owner(&path, owner(link.user, link.group));
    }
    if std::fs::symlink_metadata(&path).is_ok() {
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
    }
    fsutil::symlink_atomic(target, &path)?;
    set_link_owner(&path, owner(link.user, link.group))?;
    Ok(true)
}

/// The file's contents: data URL, decompressed, verified.
pub fn decode(contents: &Contents, path: &str) -> Result<Vec<u8>, IgnitionError> {
    let source = contents.source.as_deref().unwrap_or_default();
    let bad = |reason: String| IgnitionError::Source {
        path: path.to_string(),
        reason,
    };
    let raw = data_url(source).map_err(bad)?;
    let data = match contents.compression.as_deref() {
        Some("gzip") => gunzip(&raw).map_err(bad)?,
        _ => raw,
    };
    if let Some(hash) = &contents.verification.hash {
        verify(hash, &data).map_err(bad)?;
    }
    Ok(data)
}

/// Decodes `data:[<mediatype>][;base64],<data>` (RFC 2397).
pub fn data_url(url: &str) -> Result<Vec<u8>, String> {
    let rest = url.strip_prefix("data:").ok_or("not a data: URL")?;
    let (meta, data) = rest.split_once(',').ok_or("data: URL without ','")?;
    let bytes = percent_decode(data)?;
    if meta.split(';').any(|p| p.eq_ignore_ascii_case("base64")) {
        let compact: Vec<u8> = bytes
            .into_iter()
            .filter(|b| !b.is_ascii_whitespace())
            .collect();
        return base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map_err(|e| format!("bad base64: {e}"));
    }
    Ok(bytes)
}

fn percent_decode(data: &str) -> Result<Vec<u8>, String> {
    let bytes = data.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok());
            let byte = hex
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("bad %-escape in data: URL")?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(out)
}

fn gunzip(data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .take(MAX_FILE + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("gzip: {e}"))?;
    if out.len() as u64 > MAX_FILE {
        return Err(format!("decompresses to more than {MAX_FILE} bytes"));
    }
    Ok(out)
}

/// `sha256-<hex>` or `sha512-<hex>`, over the decompressed contents.
fn verify(hash: &str, data: &[u8]) -> Result<(), String> {
    let actual: Vec<u8> = match hash.split_once('-') {
        Some(("sha256", _)) => Sha256::digest(data).to_vec(),
        Some(("sha512", _)) => Sha512::digest(data).to_vec(),
        _ => return Err(format!("unsupported hash {hash:?}")),
    };
    let hex: String = actual.iter().map(|b| format!("{b:02x}")).collect();
    let expected = hash
        .split_once('-')
        .map(|(_, h)| h.to_ascii_lowercase())
        .unwrap_or_default();
    if hex == expected {
        Ok(())
    } else {
        Err(format!("hash mismatch: expected {hash}, got {hex}"))
    }
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

    #[test]
    fn data_urls() {
        assert_eq!(
            data_url("data:,hello%20world%0A").unwrap(),
            b"hello world\n"
        );
        assert_eq!(
            data_url("data:text/plain;charset=utf-8;base64,aGk=").unwrap(),
            b"hi"
        );
        assert!(data_url("data:;base64,***").is_err());
        assert!(data_url("data:,%zz").is_err());
        assert!(data_url("https://x").is_err());
    }

    #[test]
    fn hashes() {
        let sha256 = "sha256-2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
        assert!(verify(sha256, b"hello").is_ok());
        assert!(verify(sha256, b"hellO").is_err());
    }
}
