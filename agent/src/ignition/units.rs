//! Writing systemd units, drop-ins, masks and enablement under a root.
//!
//! Enabling is done offline, as `systemctl enable` would: the unit's
//! `[Install]` section (`WantedBy=`, `RequiredBy=`, `Alias=`) becomes
//! symlinks in `/etc/systemd/system`. This works under any root (so it is
//! testable without systemd) and does not depend on the unit being known to
//! a running systemd yet; the agent runs `systemctl daemon-reload` and
//! starts the enabled units afterwards (see `kubelet`). Ignition itself
//! writes a preset file instead, which only works because it runs before
//! systemd's first-boot preset pass; the agent runs later.

use super::spec::Unit;
use super::IgnitionError;
use crate::fsutil::{self, Durability, Owner, Root};
use std::path::{Path, PathBuf};

/// Where units written by the config go.
pub const UNIT_DIR: &str = "/etc/systemd/system";
/// Where installed units are looked for when the config only enables one.
const SEARCH_DIRS: [&str; 3] = [UNIT_DIR, "/usr/lib/systemd/system", "/lib/systemd/system"];
const SUFFIXES: [&str; 9] = [
    ".service",
    ".socket",
    ".timer",
    ".target",
    ".path",
    ".mount",
    ".automount",
    ".swap",
    ".slice",
];

fn invalid(name: &str, reason: &str) -> IgnitionError {
    IgnitionError::Unit {
        name: name.to_string(),
        reason: reason.to_string(),
    }
}

fn check_name(name: &str, suffixes: &[&str]) -> bool {
    !name.contains('/')
        && !name.starts_with('.')
        && suffixes
            .iter()
            .any(|s| name.len() > s.len() && name.ends_with(s))
}

/// Applies one unit; whether anything changed.
pub fn apply(root: &Root, unit: &Unit) -> Result<bool, IgnitionError> {
    if !check_name(&unit.name, &SUFFIXES) {
        return Err(invalid(&unit.name, "not a unit name"));
    }
    let path = root.join(&format!("{UNIT_DIR}/{}", unit.name))?;
    let mut changed = false;
    if unit.mask == Some(true) {
        if unit.contents.is_some() {
            return Err(invalid(&unit.name, "mask and contents are exclusive"));
        }
        changed |= fsutil::symlink_atomic(Path::new("/dev/null"), &path)?;
    } else if unit.mask == Some(false)
        && std::fs::read_link(&path).is_ok_and(|t| t == Path::new("/dev/null"))
    {
        changed |= fsutil::remove_file(&path)?;
    }
    if let Some(contents) = &unit.contents {
        changed |= fsutil::write_atomic(&path, contents.as_bytes(), 0o644, Owner::default())?;
    }
    for dropin in &unit.dropins {
        if !check_name(&dropin.name, &[".conf"]) {
            return Err(invalid(
                &unit.name,
                &format!("drop-in {:?} is not a .conf file name", dropin.name),
            ));
        }
        if let Some(contents) = &dropin.contents {
            let dropin_path = root.join(&format!("{UNIT_DIR}/{}.d/{}", unit.name, dropin.name))?;
            changed |=
                fsutil::write_atomic(&dropin_path, contents.as_bytes(), 0o644, Owner::default())?;
        }
    }
    changed |= match unit.enabled {
        Some(true) => enable(root, &unit.name, Durability::Immediate)?,
        Some(false) => disable(root, &unit.name)?,
        None => false,
    };
    Ok(changed)
}

/// The unit file for `name` under the root, and its path on the real root.
/// An instance (`a@b.service`) falls back to its template (`a@.service`).
fn find_unit(root: &Root, name: &str) -> Result<Option<(PathBuf, String)>, IgnitionError> {
    let mut names = vec![name.to_string()];
    if let Some((prefix, rest)) = name.split_once('@') {
        if let Some(dot) = rest.rfind('.') {
            names.push(format!("{prefix}@{}", &rest[dot..]));
        }
    }
    for candidate in &names {
        for dir in SEARCH_DIRS {
            let real = format!("{dir}/{candidate}");
            let path = root.join(&real)?;
            if path.is_file() {
                return Ok(Some((path, real)));
            }
        }
    }
    Ok(None)
}

/// Symlinks for the unit's `[Install]` section, as `systemctl enable` does,
/// with the [`Durability`] the caller needs.
pub fn enable(root: &Root, name: &str, durability: Durability) -> Result<bool, IgnitionError> {
    let (path, real) =
        find_unit(root, name)?.ok_or_else(|| invalid(name, "enabled, but no unit file exists"))?;
    let text = std::fs::read_to_string(&path)
        .map_err(|e| IgnitionError::Fs(fsutil::FsError::Io { path, cause: e }))?;
    let install = install_section(&text);
    if install.is_empty() {
        log::warn!("unit {name} has no [Install] section; enabling it does nothing");
    }
    let mut changed = false;
    for (key, value) in install {
        let link = match key.as_str() {
            "WantedBy" => format!("{UNIT_DIR}/{value}.wants/{name}"),
            "RequiredBy" => format!("{UNIT_DIR}/{value}.requires/{name}"),
            "Alias" => format!("{UNIT_DIR}/{value}"),
            _ => continue,
        };
        if value.contains('/') {
            return Err(invalid(
                name,
                &format!("[Install] {key}={value} is not a unit name"),
            ));
        }
        changed |= fsutil::symlink_with(Path::new(&real), &root.join(&link)?, durability)?;
    }
    Ok(changed)
}

/// Removes the unit's links from every `.wants`/`.requires` directory.
pub fn disable(root: &Root, name: &str) -> Result<bool, IgnitionError> {
    let dir = root.join(UNIT_DIR)?;
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(false);
    };
    let mut changed = false;
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if file_name.ends_with(".wants") || file_name.ends_with(".requires") {
            changed |= fsutil::remove_file(&entry.path().join(name))?;
        }
    }
    Ok(changed)
}

/// `(key, value)` pairs of the `[Install]` section; space-separated lists
/// are split, as systemd does.
pub fn install_section(unit: &str) -> Vec<(String, String)> {
    let mut in_install = false;
    let mut out = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            in_install = line == "[Install]";
            continue;
        }
        if !in_install || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            for word in value.split_whitespace() {
                out.push((key.trim().to_string(), word.to_string()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_section_lists() {
        let unit = "[Unit]\nWantedBy=no.target\n[Install]\n# comment\nWantedBy=multi-user.target  b.target\nRequiredBy=c.target\n";
        assert_eq!(
            install_section(unit),
            [
                ("WantedBy".to_string(), "multi-user.target".to_string()),
                ("WantedBy".into(), "b.target".into()),
                ("RequiredBy".into(), "c.target".into())
            ]
        );
    }

    #[test]
    fn names() {
        assert!(check_name("kubelet.service", &SUFFIXES));
        assert!(!check_name("../x.service", &SUFFIXES));
        assert!(!check_name(".service", &SUFFIXES));
        assert!(!check_name("x.conf", &SUFFIXES));
    }
}
