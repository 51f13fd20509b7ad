//! The rules a parsed config must meet: everything that would fail on a
//! node, or that Ignition itself refuses, is refused here, so the server
//! never serves it and the agent never half-applies it.
//!
//! Where autonode is stricter than Ignition 2.14's `ignition-validate`, the
//! rule says so (user/group name syntax, `/` in unit names, mask with
//! contents, `03.1.0`-style versions, unit files with lines outside
//! `key=value`): each would do something on the node nobody meant.

use super::data::{self, parse_hash};
use super::types::{Config, Contents, Dropin, Group, OwnerId, Unit, User};
use super::SpecError;
use std::collections::BTreeMap;

/// Unit types systemd knows, by suffix.
const UNIT_SUFFIXES: &[&str] = &[
    ".service",
    ".socket",
    ".device",
    ".mount",
    ".automount",
    ".swap",
    ".target",
    ".path",
    ".timer",
    ".snapshot",
    ".slice",
    ".scope",
];

/// Checks every rule; the first broken one is the error.
pub fn validate(config: &Config) -> Result<(), SpecError> {
    let minor = config.ignition.minor().unwrap_or(super::MAX_MINOR);
    storage(config, minor)?;
    units(&config.systemd.units)?;
    users(&config.passwd.users)?;
    groups(&config.passwd.groups)
}

/// Files, directories and links: one path namespace, as on disk.
fn storage(config: &Config, minor: u32) -> Result<(), SpecError> {
    let mut seen = Seen::new("path");
    let storage = &config.storage;
    for (i, file) in storage.files.iter().enumerate() {
        let at = format!("storage.files[{i}]");
        entry(
            &at,
            &file.path,
            file.mode,
            &file.user,
            &file.group,
            &mut seen,
        )?;
        if file.overwrite == Some(true) && file.contents.source.is_none() {
            return Err(SpecError::OverwriteWithoutSource { path: at });
        }
        contents(&file.contents, &format!("{at}.contents"), minor)?;
    }
    for (i, dir) in storage.directories.iter().enumerate() {
        let at = format!("storage.directories[{i}]");
        entry(&at, &dir.path, dir.mode, &dir.user, &dir.group, &mut seen)?;
    }
    for (i, link) in storage.links.iter().enumerate() {
        let at = format!("storage.links[{i}]");
        entry(&at, &link.path, None, &link.user, &link.group, &mut seen)?;
        if link.hard == Some(true) {
            return Err(SpecError::Unsupported(format!("{at}.hard")));
        }
        if link.target.is_empty() {
            return Err(invalid(&format!("{at}.target"), "a link needs a target"));
        }
    }
    under_links(config)
}

/// No file, directory or link under a link of the same config, as Ignition
/// 2.14 validates ("file path includes link in config"): written through
/// the link, the entry would land wherever the link points.
fn under_links(config: &Config) -> Result<(), SpecError> {
    let storage = &config.storage;
    let entries = storage
        .files
        .iter()
        .enumerate()
        .map(|(i, f)| (format!("storage.files[{i}].path"), &f.path))
        .chain(
            storage
                .directories
                .iter()
                .enumerate()
                .map(|(i, d)| (format!("storage.directories[{i}].path"), &d.path)),
        )
        .chain(
            storage
                .links
                .iter()
                .enumerate()
                .map(|(i, l)| (format!("storage.links[{i}].path"), &l.path)),
        );
    for (at, path) in entries {
        let parent = storage.links.iter().enumerate().find(|(_, link)| {
            path.strip_prefix(link.path.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
        });
        if let Some((j, link)) = parent {
            return Err(SpecError::UnderLink {
                path: at,
                value: path.clone(),
                link: format!("storage.links[{j}].path"),
                link_value: link.path.clone(),
            });
        }
    }
    Ok(())
}

/// What every storage entry has: a path, maybe a mode, owners.
fn entry(
    at: &str,
    path: &str,
    mode: Option<u32>,
    user: &OwnerId,
    group: &OwnerId,
    seen: &mut Seen,
) -> Result<(), SpecError> {
    check_path(&format!("{at}.path"), path)?;
    seen.insert(path, at)?;
    if let Some(mode) = mode.filter(|m| *m > 0o7777) {
        return Err(SpecError::Mode {
            path: format!("{at}.mode"),
            mode,
        });
    }
    owner(&format!("{at}.user"), user)?;
    owner(&format!("{at}.group"), group)
}

/// Absolute and fully simplified, as Ignition requires: no `.` or `..`
/// components, no `//`, no trailing `/` (only `/` itself).
fn check_path(at: &str, path: &str) -> Result<(), SpecError> {
    let bad = |reason| SpecError::Path {
        path: at.to_string(),
        value: path.to_string(),
        reason,
    };
    if !path.starts_with('/') {
        return Err(bad("must be an absolute path"));
    }
    if path == "/" {
        return Ok(());
    }
    if path[1..]
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(bad(
            "must be fully simplified (no '.', '..', '//' or trailing '/')",
        ));
    }
    if path.contains('\0') {
        return Err(bad("contains a NUL byte"));
    }
    Ok(())
}

fn owner(at: &str, owner: &OwnerId) -> Result<(), SpecError> {
    match (&owner.id, &owner.name) {
        (Some(_), Some(_)) => Err(SpecError::OwnerIdAndName {
            path: at.to_string(),
        }),
        (None, Some(name)) => check_name(&format!("{at}.name"), name),
        _ => Ok(()),
    }
}

/// A file's source, compression and hash; the data is decoded and the
/// hash checked here, at render time, not first on the node.
fn contents(contents: &Contents, at: &str, minor: u32) -> Result<(), SpecError> {
    if let Some(source) = contents.source.as_deref() {
        if !source.is_empty() && !source.starts_with("data:") {
            let scheme = source.split(':').next().unwrap_or_default();
            return Err(SpecError::Unsupported(format!(
                "{at}.source ({scheme}: sources; only inline data: URLs)"
            )));
        }
    }
    if let Some(hash) = &contents.verification.hash {
        let hash_at = format!("{at}.verification.hash");
        let (function, _) = parse_hash(hash).map_err(|reason| SpecError::Hash {
            path: hash_at.clone(),
            reason,
        })?;
        // Ignition 2.14 refuses sha256 under 3.0.0 ("unrecognized hash").
        if function == "sha256" && minor < 1 {
            return Err(SpecError::TooNew {
                path: hash_at,
                since: 1,
                version: "3.0.0".into(),
            });
        }
    }
    if contents.source.is_none() {
        return match contents.compression.as_deref() {
            None | Some("") | Some("gzip") => Ok(()),
            Some(other) => Err(SpecError::Compression {
                path: format!("{at}.compression"),
                value: other.to_string(),
            }),
        };
    }
    data::decode(contents, at).map(drop)
}

fn units(units: &[Unit]) -> Result<(), SpecError> {
    let mut seen = Seen::new("unit");
    for (i, unit) in units.iter().enumerate() {
        let at = format!("systemd.units[{i}]");
        unit_name(&format!("{at}.name"), &unit.name)?;
        seen.insert(&unit.name, &at)?;
        if unit.mask == Some(true) && unit.contents.is_some() {
            return Err(SpecError::MaskWithContents { path: at });
        }
        if let Some(text) = &unit.contents {
            unit_file(&format!("{at}.contents"), text)?;
        }
        dropins(&at, &unit.dropins)?;
    }
    Ok(())
}

fn dropins(unit_at: &str, dropins: &[Dropin]) -> Result<(), SpecError> {
    let mut seen = Seen::new("drop-in");
    for (i, dropin) in dropins.iter().enumerate() {
        let at = format!("{unit_at}.dropins[{i}]");
        let name = &dropin.name;
        let stem_ok = name.strip_suffix(".conf").is_some_and(|s| !s.is_empty());
        if !stem_ok || name.contains('/') {
            return Err(name_error(
                &format!("{at}.name"),
                name,
                "is not a drop-in name (<name>.conf, without '/')",
            ));
        }
        seen.insert(name, &at)?;
        if let Some(text) = &dropin.contents {
            unit_file(&format!("{at}.contents"), text)?;
        }
    }
    Ok(())
}

/// `<name>.<type>`, a known type, no `/` (stricter than Ignition, which
/// would write it into a subdirectory systemd never reads).
fn unit_name(at: &str, name: &str) -> Result<(), SpecError> {
    let stem = UNIT_SUFFIXES
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix));
    if stem.is_none_or(str::is_empty) {
        return Err(name_error(
            at,
            name,
            "is not a unit name (<name>.service, .socket, .timer, .mount, .target, ...)",
        ));
    }
    if name.contains('/') || name.chars().any(char::is_whitespace) {
        return Err(name_error(at, name, "must not contain '/' or whitespace"));
    }
    Ok(())
}

/// Unit file syntax: after a `[Section]`, every line is blank, a comment
/// or `key=value` (Ignition refuses `[Unit]\nFoo`; autonode also refuses
/// text before the first section, which systemd would ignore).
fn unit_file(at: &str, text: &str) -> Result<(), SpecError> {
    let mut continued = false;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        let ok = continued
            || trimmed.is_empty()
            || trimmed.starts_with('#')
            || trimmed.starts_with(';')
            || (trimmed.starts_with('[') && trimmed.ends_with(']'))
            || trimmed.contains('=');
        if !ok {
            return Err(invalid(
                at,
                &format!(
                    "line {} is not [Section], key=value or a comment: {trimmed:?}",
                    n + 1
                ),
            ));
        }
        continued = trimmed.ends_with('\\');
    }
    Ok(())
}

fn users(users: &[User]) -> Result<(), SpecError> {
    let mut seen = Seen::new("user");
    for (i, user) in users.iter().enumerate() {
        let at = format!("passwd.users[{i}]");
        check_name(&format!("{at}.name"), &user.name)?;
        seen.insert(&user.name, &at)?;
        if let Some(group) = &user.primary_group {
            check_name(&format!("{at}.primaryGroup"), group)?;
        }
        for (j, group) in user.groups.iter().enumerate() {
            check_name(&format!("{at}.groups[{j}]"), group)?;
        }
        if let Some(home) = &user.home_dir {
            if !home.starts_with('/') {
                return Err(SpecError::Path {
                    path: format!("{at}.homeDir"),
                    value: home.clone(),
                    reason: "must be an absolute path",
                });
            }
        }
    }
    Ok(())
}

fn groups(groups: &[Group]) -> Result<(), SpecError> {
    let mut seen = Seen::new("group");
    for (i, group) in groups.iter().enumerate() {
        let at = format!("passwd.groups[{i}]");
        check_name(&format!("{at}.name"), &group.name)?;
        seen.insert(&group.name, &at)?;
    }
    Ok(())
}

/// A user or group name useradd/groupadd accept everywhere: a letter or
/// `_` first, then letters, digits, `_`, `-`, `.`, an optional final `$`,
/// at most 32 characters. (Ignition does not check; the node would fail.)
fn check_name(at: &str, name: &str) -> Result<(), SpecError> {
    let body = name.strip_suffix('$').unwrap_or(name);
    let first_ok = body
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = body
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if first_ok && rest_ok && name.len() <= 32 {
        Ok(())
    } else {
        Err(name_error(
            at,
            name,
            "is not a valid user or group name (letter or '_' first, then letters, digits, '_', '-', '.'; at most 32)",
        ))
    }
}

/// Names already used in one namespace, with where they were first.
struct Seen {
    what: &'static str,
    first: BTreeMap<String, String>,
}

impl Seen {
    fn new(what: &'static str) -> Self {
        Self {
            what,
            first: BTreeMap::new(),
        }
    }

    fn insert(&mut self, name: &str, at: &str) -> Result<(), SpecError> {
        match self.first.get(name) {
            Some(first) => Err(SpecError::Duplicate {
                path: at.to_string(),
                what: self.what,
                name: name.to_string(),
                first: first.clone(),
            }),
            None => {
                self.first.insert(name.to_string(), at.to_string());
                Ok(())
            }
        }
    }
}

fn name_error(at: &str, name: &str, reason: &'static str) -> SpecError {
    SpecError::Name {
        path: at.to_string(),
        name: name.to_string(),
        reason,
    }
}

fn invalid(at: &str, reason: &str) -> SpecError {
    SpecError::Invalid {
        path: at.to_string(),
        reason: reason.to_string(),
    }
}
