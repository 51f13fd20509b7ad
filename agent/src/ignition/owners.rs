//! Users and groups as the root's own `/etc/passwd`, `/etc/shadow` and
//! `/etc/group` list them: owners given by name, whether a `passwd` entry
//! exists, and what it holds (so `usermod` runs only for what differs).
//!
//! Never the host's NSS: under a test root (or `ignition apply --root`),
//! the names must mean what they will mean on the node, and on the node the
//! files are what `useradd` just wrote (passwd is applied before storage,
//! as Ignition orders it).

use super::IgnitionError;
use crate::fsutil::{FsError, Owner, Root};
use autonode_shared::ignition::{Config, OwnerId};

/// One `/etc/passwd` entry, the fields the agent uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswdEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub gecos: String,
    pub home: String,
    pub shell: String,
}

/// The user `name` in the root's `/etc/passwd`, if any.
pub fn user(root: &Root, name: &str) -> Result<Option<PasswdEntry>, IgnitionError> {
    for line in read(root, "/etc/passwd")?.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.first() != Some(&name) || fields.len() < 7 {
            continue;
        }
        let (Ok(uid), Ok(gid)) = (fields[2].parse(), fields[3].parse()) else {
            return Err(unknown(name, "its /etc/passwd entry has a bad uid or gid"));
        };
        return Ok(Some(PasswdEntry {
            name: name.to_string(),
            uid,
            gid,
            gecos: fields[4].to_string(),
            home: fields[5].to_string(),
            shell: fields[6].to_string(),
        }));
    }
    Ok(None)
}

/// The name of the user with `uid` in the root's `/etc/passwd`, if any
/// (for messages about who owns a directory).
pub fn user_name(root: &Root, uid: u32) -> Result<Option<String>, IgnitionError> {
    let uid = uid.to_string();
    Ok(read(root, "/etc/passwd")?.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.get(2) == Some(&uid.as_str())).then(|| fields[0].to_string())
    }))
}

/// The password hash of user `name` in the root's `/etc/shadow`, if the
/// user has a line there.
pub fn shadow_hash(root: &Root, name: &str) -> Result<Option<String>, IgnitionError> {
    Ok(read(root, "/etc/shadow")?.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next() == Some(name)).then(|| fields.next().unwrap_or_default().to_string())
    }))
}

/// The groups of the root's `/etc/group` that list `name` as a member
/// (its supplementary groups, as `usermod --groups` sets them).
pub fn member_of(root: &Root, name: &str) -> Result<Vec<String>, IgnitionError> {
    let mut groups = Vec::new();
    for line in read(root, "/etc/group")?.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        let listed = fields
            .get(3)
            .is_some_and(|members| members.split(',').any(|m| m == name));
        if listed {
            groups.push(fields[0].to_string());
        }
    }
    Ok(groups)
}

/// The gid of group `name` in the root's `/etc/group`, if any.
pub fn group(root: &Root, name: &str) -> Result<Option<u32>, IgnitionError> {
    for line in read(root, "/etc/group")?.lines() {
        let mut fields = line.split(':');
        if fields.next() != Some(name) {
            continue;
        }
        return match fields.nth(1).map(str::parse) {
            Some(Ok(gid)) => Ok(Some(gid)),
            _ => Err(unknown(name, "its /etc/group entry has a bad gid")),
        };
    }
    Ok(None)
}

/// The owner ids of a storage entry at `path`: ids as given, names looked
/// up under the root. An unknown name is an error naming the entry.
pub fn resolve(
    root: &Root,
    path: &str,
    user: &OwnerId,
    group: &OwnerId,
) -> Result<Owner, IgnitionError> {
    let uid = match (&user.id, &user.name) {
        (Some(id), _) => Some(*id),
        (None, Some(name)) => Some(
            self::user(root, name)?
                .ok_or_else(|| missing(path, "user", name, "/etc/passwd"))?
                .uid,
        ),
        (None, None) => None,
    };
    let gid = match (&group.id, &group.name) {
        (Some(id), _) => Some(*id),
        (None, Some(name)) => Some(
            self::group(root, name)?.ok_or_else(|| missing(path, "group", name, "/etc/group"))?,
        ),
        (None, None) => None,
    };
    Ok(Owner { uid, gid })
}

/// Refuses, before anything is written, a storage entry's owner name that
/// neither the node nor the config's `passwd` has (a user's own group
/// counts, as `useradd` makes it unless `noUserGroup`).
pub fn preflight(root: &Root, config: &Config) -> Result<(), IgnitionError> {
    let passwd = &config.passwd;
    let users = passwd
        .users
        .iter()
        .filter(|u| u.should_exist != Some(false));
    let user_groups = users
        .clone()
        .filter(|u| u.no_user_group != Some(true))
        .map(|u| u.name.as_str());
    let groups: Vec<&str> = passwd
        .groups
        .iter()
        .filter(|g| g.should_exist != Some(false))
        .map(|g| g.name.as_str())
        .chain(user_groups)
        .collect();
    let users: Vec<&str> = users.map(|u| u.name.as_str()).collect();
    let storage = &config.storage;
    let entries = storage
        .files
        .iter()
        .map(|f| (&f.path, &f.user, &f.group))
        .chain(
            storage
                .directories
                .iter()
                .map(|d| (&d.path, &d.user, &d.group)),
        )
        .chain(storage.links.iter().map(|l| (&l.path, &l.user, &l.group)));
    for (path, user, group) in entries {
        if let Some(name) = user.name.as_deref().filter(|n| !users.contains(n)) {
            self::user(root, name)?.ok_or_else(|| missing(path, "user", name, "/etc/passwd"))?;
        }
        if let Some(name) = group.name.as_deref().filter(|n| !groups.contains(n)) {
            self::group(root, name)?.ok_or_else(|| missing(path, "group", name, "/etc/group"))?;
        }
    }
    Ok(())
}

/// A missing file reads as empty: a root without `/etc/group` has no groups.
fn read(root: &Root, file: &str) -> Result<String, IgnitionError> {
    let path = root.join(file)?;
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(cause) => Err(IgnitionError::Fs(FsError::Io { path, cause })),
    }
}

fn missing(path: &str, kind: &str, name: &str, file: &str) -> IgnitionError {
    IgnitionError::Owner {
        path: path.to_string(),
        reason: format!(
            "{kind} {name:?} does not exist in the node's {file}; create it under passwd or give a numeric id"
        ),
    }
}

fn unknown(name: &str, reason: &str) -> IgnitionError {
    IgnitionError::Owner {
        path: name.to_string(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_with(passwd: &str, group: &str) -> (tempfile::TempDir, Root) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/passwd"), passwd).unwrap();
        std::fs::write(dir.path().join("etc/group"), group).unwrap();
        let root = Root::new(dir.path());
        (dir, root)
    }

    fn named(name: &str) -> OwnerId {
        OwnerId {
            id: None,
            name: Some(name.to_string()),
        }
    }

    #[test]
    fn names_resolve_against_the_roots_files() {
        let (_dir, root) = root_with(
            "root:x:0:0:root:/root:/bin/bash\ncore:x:1500:1600:Core:/home/core:/bin/sh\n",
            "root:x:0:\nwheel:x:10:core\n",
        );
        let owner = resolve(&root, "/etc/x", &named("core"), &named("wheel")).unwrap();
        assert_eq!(
            owner,
            Owner {
                uid: Some(1500),
                gid: Some(10)
            }
        );
        let by_id = OwnerId {
            id: Some(7),
            name: None,
        };
        let owner = resolve(&root, "/etc/x", &by_id, &OwnerId::default()).unwrap();
        assert_eq!(
            owner,
            Owner {
                uid: Some(7),
                gid: None
            }
        );
        let core = user(&root, "core").unwrap().unwrap();
        assert_eq!((core.gid, core.home.as_str()), (1600, "/home/core"));
        assert_eq!(
            (core.gecos.as_str(), core.shell.as_str()),
            ("Core", "/bin/sh")
        );
        assert_eq!(user_name(&root, 1500).unwrap().as_deref(), Some("core"));
        assert_eq!(user_name(&root, 15).unwrap(), None);
        assert_eq!(member_of(&root, "core").unwrap(), ["wheel"]);
        assert!(member_of(&root, "cor").unwrap().is_empty());
        // A prefix is not a match.
        assert_eq!(user(&root, "cor").unwrap(), None);
    }

    #[test]
    fn unknown_names_name_the_entry() {
        let (_dir, root) = root_with("root:x:0:0::/root:/bin/sh\n", "root:x:0:\n");
        let err = resolve(&root, "/etc/x", &named("nobody2"), &OwnerId::default()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("/etc/x") && text.contains("nobody2"),
            "{text}"
        );
        let err = resolve(&root, "/etc/y", &OwnerId::default(), &named("g")).unwrap_err();
        assert!(err.to_string().contains("group \"g\""), "{err}");
        let (dir, bad) = root_with("core:x:abc:0::/:/bin/sh\n", "g:x:-1:\n");
        std::fs::write(
            dir.path().join("etc/shadow"),
            "core:$6$h:19000::::::\nx::1:\n",
        )
        .unwrap();
        assert_eq!(shadow_hash(&bad, "core").unwrap().as_deref(), Some("$6$h"));
        assert_eq!(shadow_hash(&bad, "x").unwrap().as_deref(), Some(""));
        assert_eq!(shadow_hash(&bad, "cor").unwrap(), None);
        assert!(user(&bad, "core").is_err());
        assert!(group(&bad, "g").is_err());
    }
}
