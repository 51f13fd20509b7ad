//! Writing systemd units, drop-ins, masks and enablement under a root.
//!
//! Enabling is done offline, as `systemctl enable`/`preset` would: the
//! unit's `[Install]` section becomes symlinks in `/etc/systemd/system`:
//! `WantedBy=`/`RequiredBy=` links in `<target>.wants`/`.requires`,
//! `Alias=` links beside them, and every unit named by `Also=` is enabled
//! the same way. A template (`getty@.service`) is enabled as its
//! `DefaultInstance=` (`getty@tty1.service`) and, without one, not at all
//! (as `systemctl preset` leaves it); an instance (`foo@bar.service`) gets
//! links named for the instance that point at the template's file. Links
//! point at the unit file where systemd's search path finds it first.
//!
//! This works under any root (so it is testable without systemd) and does
//! not depend on the unit being known to a running systemd yet; the agent
//! runs `systemctl daemon-reload` and starts the enabled units afterwards
//! (see `kubelet`). Ignition itself writes a preset file instead, which only
//! works because it runs before systemd's first-boot preset pass; the agent
//! runs later, so it makes the links that pass would have made.

use super::IgnitionError;
use crate::fsutil::{self, Durability, Owner, Root};
use autonode_shared::ignition::Unit;
use std::path::{Path, PathBuf};

/// Where units written by the config go.
pub const UNIT_DIR: &str = "/etc/systemd/system";
/// Where installed units are looked for, in systemd's order (the first
/// found is the one linked to, as `systemctl enable` does).
const SEARCH_DIRS: [&str; 5] = [
    UNIT_DIR,
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
];
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

/// What enabling one unit did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Enabled {
    /// Whether any link changed.
    pub changed: bool,
    /// The unit to start now: the unit itself, or the instance a template
    /// was enabled as. `None` when nothing was enabled (a template without
    /// `DefaultInstance=`), so a template name is never started.
    pub start: Option<String>,
}

/// Writes one unit's file, drop-ins and mask; whether anything changed.
/// Enablement is separate ([`enablement`]) and comes after every unit is
/// written, so `Also=` and instances can name units later in the config.
pub fn write(root: &Root, unit: &Unit) -> Result<bool, IgnitionError> {
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
    Ok(changed)
}

/// Applies one unit's `enabled`: links for `true`, none for `false`,
/// nothing touched when unset. A masked unit is never enabled (systemd
/// refuses to), only warned about.
pub fn enablement(root: &Root, unit: &Unit) -> Result<Enabled, IgnitionError> {
    match unit.enabled {
        Some(true) if unit.mask == Some(true) => {
            log::warn!("unit {} is masked; not enabling it", unit.name);
            Ok(Enabled::default())
        }
        Some(true) => enable_unit(root, &unit.name, Durability::Immediate),
        Some(false) => Ok(Enabled {
            changed: disable(root, &unit.name)?,
            start: None,
        }),
        None => Ok(Enabled::default()),
    }
}

/// Enables `name` (see the module doc) with the [`Durability`] the caller
/// needs; whether any link changed.
pub fn enable(root: &Root, name: &str, durability: Durability) -> Result<bool, IgnitionError> {
    Ok(enable_unit(root, name, durability)?.changed)
}

/// Enables `name` and, through `Also=`, the units it names.
pub fn enable_unit(
    root: &Root,
    name: &str,
    durability: Durability,
) -> Result<Enabled, IgnitionError> {
    enable_with_also(root, name, durability, &mut Vec::new())
}

fn enable_with_also(
    root: &Root,
    name: &str,
    durability: Durability,
    seen: &mut Vec<String>,
) -> Result<Enabled, IgnitionError> {
    if seen.iter().any(|s| s == name) {
        // `Also=` cycles are legal (a socket and its service name each other).
        return Ok(Enabled::default());
    }
    seen.push(name.to_string());
    let (path, real) =
        find_unit(root, name)?.ok_or_else(|| invalid(name, "enabled, but no unit file exists"))?;
    let install = install_section(&read(&path)?);
    let Some(link_name) = concrete_name(name, &install) else {
        log::warn!("template {name} has no DefaultInstance=; enabling it does nothing");
        return Ok(Enabled::default());
    };
    if install.is_empty() {
        log::warn!("unit {name} has no [Install] section; enabling it does nothing");
    }
    let mut changed = false;
    for (key, value) in &install {
        let link = match key.as_str() {
            "WantedBy" => format!("{UNIT_DIR}/{value}.wants/{link_name}"),
            "RequiredBy" => format!("{UNIT_DIR}/{value}.requires/{link_name}"),
            "Alias" => format!("{UNIT_DIR}/{}", alias_name(value, &link_name)),
            "Also" => {
                check_install_value(name, key, value)?;
                changed |= enable_with_also(root, value, durability, seen)?.changed;
                continue;
            }
            _ => continue,
        };
        check_install_value(name, key, value)?;
        changed |= fsutil::symlink_with(Path::new(&real), &root.join(&link)?, durability)?;
    }
    Ok(Enabled {
        changed,
        start: Some(link_name),
    })
}

/// Refuses an `[Install]` value that is not a plain unit name: a path
/// would put a link outside `/etc/systemd/system`, and `%` specifiers are
/// not expanded here.
fn check_install_value(name: &str, key: &str, value: &str) -> Result<(), IgnitionError> {
    let plain = !value.contains(['/', '%']) && !value.starts_with('.') && value.contains('.');
    if plain {
        Ok(())
    } else {
        Err(invalid(
            name,
            &format!("[Install] {key}={value} is not a unit name autonode can link"),
        ))
    }
}

/// `(prefix, instance, suffix)` of `a@b.service`: `("a", "b", ".service")`;
/// the instance is empty for a template. `None` for a plain unit.
fn split_instance(name: &str) -> Option<(&str, &str, &str)> {
    let (prefix, rest) = name.split_once('@')?;
    let dot = rest.rfind('.')?;
    Some((prefix, &rest[..dot], &rest[dot..]))
}

/// The name links are made under: the unit's own, or for a template its
/// `DefaultInstance=` (`None` without one).
fn concrete_name(name: &str, install: &[(String, String)]) -> Option<String> {
    match split_instance(name) {
        Some((prefix, "", suffix)) => install
            .iter()
            .rev()
            .find(|(key, _)| key == "DefaultInstance")
            .map(|(_, instance)| format!("{prefix}@{instance}{suffix}")),
        _ => Some(name.to_string()),
    }
}

/// A template alias (`x@.service`) of an instance takes its instance.
fn alias_name(alias: &str, link_name: &str) -> String {
    match (split_instance(alias), split_instance(link_name)) {
        (Some((prefix, "", suffix)), Some((_, instance, _))) if !instance.is_empty() => {
            format!("{prefix}@{instance}{suffix}")
        }
        _ => alias.to_string(),
    }
}

fn read(path: &Path) -> Result<String, IgnitionError> {
    std::fs::read_to_string(path).map_err(|e| {
        IgnitionError::Fs(fsutil::FsError::Io {
            path: path.to_path_buf(),
            cause: e,
        })
    })
}

/// The unit file for `name` under the root, and its path on the real root.
/// An instance (`a@b.service`) falls back to its template (`a@.service`).
fn find_unit(root: &Root, name: &str) -> Result<Option<(PathBuf, String)>, IgnitionError> {
    let mut names = vec![name.to_string()];
    if let Some((prefix, instance, suffix)) = split_instance(name) {
        if !instance.is_empty() {
            names.push(format!("{prefix}@{suffix}"));
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

/// Removes the unit's links: from every `.wants`/`.requires` directory, and
/// its `Alias=` links that point at it. Only symlinks are removed.
pub fn disable(root: &Root, name: &str) -> Result<bool, IgnitionError> {
    let found = find_unit(root, name)?;
    let install = match &found {
        Some((path, _)) => install_section(&read(path)?),
        None => Vec::new(),
    };
    let link_name = concrete_name(name, &install).unwrap_or_else(|| name.to_string());
    let mut changed = false;
    let dir = root.join(UNIT_DIR)?;
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            if file_name.ends_with(".wants") || file_name.ends_with(".requires") {
                let removed = remove_link(&entry.path().join(&link_name), None)?;
                if removed {
                    remove_if_empty(&entry.path())?;
                }
                changed |= removed;
            }
        }
    }
    if let Some((_, real)) = &found {
        for (key, value) in &install {
            if key == "Alias" && check_install_value(name, key, value).is_ok() {
                let alias = root.join(&format!("{UNIT_DIR}/{}", alias_name(value, &link_name)))?;
                changed |= remove_link(&alias, Some(Path::new(real)))?;
            }
        }
    }
    Ok(changed)
}

/// Removes a `.wants`/`.requires` directory that disabling just emptied,
/// as `systemctl disable` does (the oracle's tree has no such directory);
/// one that still holds anything stays.
fn remove_if_empty(dir: &Path) -> Result<(), IgnitionError> {
    let io = |cause| {
        IgnitionError::Fs(fsutil::FsError::Io {
            path: dir.to_path_buf(),
            cause,
        })
    };
    if std::fs::read_dir(dir).map_err(io)?.next().is_some() {
        return Ok(());
    }
    // remove_dir, not remove_dir_all: it refuses a directory something
    // was put into meanwhile.
    std::fs::remove_dir(dir).map_err(io)
}

/// Removes `path` if it is a symlink (to `target`, when given).
fn remove_link(path: &Path, target: Option<&Path>) -> Result<bool, IgnitionError> {
    match std::fs::read_link(path) {
        Ok(current) if target.is_none_or(|t| t == current) => Ok(fsutil::remove_file(path)?),
        _ => Ok(false),
    }
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

    /// The `[Install]` sections of Debian 12's units (systemd 252).
    const DEBIAN_UNITS: [(&str, &str); 6] = [
        (
            "systemd-networkd.service",
            "[Install]\nWantedBy=multi-user.target\nAlso=systemd-networkd.socket\n\
             Alias=dbus-org.freedesktop.network1.service\n\
             Also=systemd-network-generator.service\nAlso=systemd-networkd-wait-online.service\n",
        ),
        (
            "systemd-networkd.socket",
            "[Install]\nWantedBy=sockets.target\n",
        ),
        (
            "systemd-network-generator.service",
            "[Install]\nWantedBy=sysinit.target\n",
        ),
        (
            "systemd-networkd-wait-online.service",
            "[Install]\nWantedBy=network-online.target\n",
        ),
        (
            "getty@.service",
            "[Install]\nWantedBy=getty.target\nDefaultInstance=tty1\n",
        ),
        (
            "serial-getty@.service",
            "[Install]\nWantedBy=getty.target\n",
        ),
    ];

    fn debian_root() -> (tempfile::TempDir, Root) {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("lib/systemd/system");
        std::fs::create_dir_all(&lib).unwrap();
        for (name, text) in DEBIAN_UNITS {
            std::fs::write(
                lib.join(name),
                format!("[Unit]\nDescription={name}\n{text}"),
            )
            .unwrap();
        }
        let root = Root::new(dir.path());
        (dir, root)
    }

    /// Every symlink under the root's /etc, as `path -> target`.
    fn links(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut dirs = vec![root.join("etc")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                match std::fs::read_link(&path) {
                    Ok(target) => out.push(format!(
                        "{} -> {}",
                        path.strip_prefix(root).unwrap().display(),
                        target.display()
                    )),
                    Err(_) if path.is_dir() => dirs.push(path),
                    Err(_) => {}
                }
            }
        }
        out.sort();
        out
    }

    fn unit(name: &str, enabled: bool, contents: Option<&str>) -> Unit {
        Unit {
            name: name.into(),
            enabled: Some(enabled),
            mask: None,
            contents: contents.map(str::to_string),
            dropins: Vec::new(),
        }
    }

    /// The links `systemctl --root=R enable` (systemd 252) made for these
    /// units, copied from its output.
    const SYSTEMCTL_LINKS: [&str; 8] = [
        "etc/systemd/system/dbus-org.freedesktop.network1.service -> /lib/systemd/system/systemd-networkd.service",
        "etc/systemd/system/getty.target.wants/getty@tty1.service -> /lib/systemd/system/getty@.service",
        "etc/systemd/system/getty.target.wants/serial-getty@ttyS0.service -> /lib/systemd/system/serial-getty@.service",
        "etc/systemd/system/getty.target.wants/serial-getty@ttyS1.service -> /lib/systemd/system/serial-getty@.service",
        "etc/systemd/system/multi-user.target.wants/systemd-networkd.service -> /lib/systemd/system/systemd-networkd.service",
        "etc/systemd/system/network-online.target.wants/systemd-networkd-wait-online.service -> /lib/systemd/system/systemd-networkd-wait-online.service",
        "etc/systemd/system/sockets.target.wants/systemd-networkd.socket -> /lib/systemd/system/systemd-networkd.socket",
        "etc/systemd/system/sysinit.target.wants/systemd-network-generator.service -> /lib/systemd/system/systemd-network-generator.service",
    ];

    #[test]
    fn enabling_makes_the_links_systemctl_makes() {
        let (dir, root) = debian_root();
        let mut started = Vec::new();
        for name in [
            "systemd-networkd.service",
            "getty@.service",
            "serial-getty@ttyS0.service",
            "serial-getty@ttyS1.service",
            "serial-getty@.service",
        ] {
            let enabled = enablement(&root, &unit(name, true, None)).unwrap();
            started.extend(enabled.start);
        }
        assert_eq!(links(dir.path()), SYSTEMCTL_LINKS);
        // Templates are started as their instance, or not at all.
        assert_eq!(
            started,
            [
                "systemd-networkd.service",
                "getty@tty1.service",
                "serial-getty@ttyS0.service",
                "serial-getty@ttyS1.service"
            ]
        );
        let again = enable_unit(&root, "systemd-networkd.service", Durability::Immediate);
        assert!(!again.unwrap().changed, "a second run changes nothing");
    }

    /// The same comparison against this machine's `systemctl`, when it has
    /// one that works offline (`--root`), so a systemd that links
    /// differently is noticed.
    #[test]
    fn links_match_the_local_systemctl() {
        let (ours, root) = debian_root();
        let (theirs, _) = debian_root();
        let names = [
            "systemd-networkd.service",
            "getty@.service",
            "serial-getty@ttyS0.service",
        ];
        let output = std::process::Command::new("systemctl")
            .arg(format!("--root={}", theirs.path().display()))
            .arg("enable")
            .args(names)
            .output();
        // tests/setup/install-deps installs systemd: its systemctl is the
        // oracle here, and its absence is a failure, not a skip.
        let output = output.expect("systemctl (Debian's systemd package) runs");
        assert!(
            output.status.success(),
            "systemctl --root enable: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        for name in names {
            enable(&root, name, Durability::Immediate).unwrap();
        }
        assert_eq!(links(ours.path()), links(theirs.path()));
    }

    #[test]
    fn own_units_templates_aliases_and_disable() {
        let (dir, root) = debian_root();
        let template = "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\nAlias=alias@.service\n";
        let own = "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\nAlias=own-alias.service\nRequiredBy=x.target\n";
        let units = [
            unit("my@.service", true, Some(template)),
            unit("my@a.service", true, None),
            unit("own.service", true, Some(own)),
        ];
        for u in &units {
            write(&root, u).unwrap();
        }
        let started: Vec<_> = units
            .iter()
            .filter_map(|u| enablement(&root, u).unwrap().start)
            .collect();
        assert_eq!(started, ["my@a.service", "own.service"]);
        // As `systemctl preset` made them from Ignition's preset file.
        let expected = [
            "etc/systemd/system/alias@a.service -> /etc/systemd/system/my@.service",
            "etc/systemd/system/multi-user.target.wants/my@a.service -> /etc/systemd/system/my@.service",
            "etc/systemd/system/multi-user.target.wants/own.service -> /etc/systemd/system/own.service",
            "etc/systemd/system/own-alias.service -> /etc/systemd/system/own.service",
            "etc/systemd/system/x.target.requires/own.service -> /etc/systemd/system/own.service",
        ];
        assert_eq!(links(dir.path()), expected);
        assert!(
            enablement(&root, &unit("own.service", false, None))
                .unwrap()
                .changed
        );
        assert_eq!(links(dir.path()), expected[..2]);
        let system = dir.path().join("etc/systemd/system");
        assert!(
            !system.join("x.target.requires").exists(),
            "the emptied .requires directory goes, as with systemctl disable"
        );
        assert!(
            system.join("multi-user.target.wants").is_dir(),
            "a .wants directory still holding links stays"
        );
        assert!(!disable(&root, "own.service").unwrap());
    }

    #[test]
    fn bad_install_values_and_missing_units_are_refused() {
        let (_dir, root) = debian_root();
        let err = enable(&root, "nothere.service", Durability::Immediate).unwrap_err();
        assert!(err.to_string().contains("nothere.service"), "{err}");
        for bad in [
            "WantedBy=../../etc/x.target",
            "Also=%i.service",
            "Alias=/x.service",
        ] {
            let text = format!("[Install]\n{bad}\n");
            write(&root, &unit("bad.service", true, Some(&text))).unwrap();
            let err = enable(&root, "bad.service", Durability::Immediate).unwrap_err();
            assert!(err.to_string().contains(bad), "{err} should name {bad}");
        }
        let looped = "[Install]\nWantedBy=a.target\nAlso=loop.service\n";
        write(&root, &unit("loop.service", true, Some(looped))).unwrap();
        assert!(enable(&root, "loop.service", Durability::Immediate).unwrap());
    }

    #[test]
    fn names() {
        assert!(check_name("kubelet.service", &SUFFIXES));
        assert!(!check_name("../x.service", &SUFFIXES));
        assert!(!check_name(".service", &SUFFIXES));
        assert!(!check_name("x.conf", &SUFFIXES));
    }
}
