//! Applying `passwd` (users and groups) as Ignition's files stage does.
//!
//! Groups first, then users, each in config order, with the shadow tools
//! and the options Ignition passes: a new group is `groupadd` (gid,
//! password hash or `*`, `--system`); a new user is `useradd` (home,
//! `--create-home` unless `noCreateHome`, password hash or `*`, uid, gecos,
//! primary group, groups, `--no-user-group`, `--no-log-init`, `--system`,
//! shell); an existing user is `usermod` with the fields set (`--home` with
//! `--move-home`). Ignition then sets a given hash once more with `usermod
//! --password` (kept after `useradd`: it leaves Ignition's backup files). `shouldExist: false` (spec 3.2.0 and later) is `userdel
//! --remove` / `groupdel` when the entry exists.
//!
//! SSH keys go to `~/.ssh/authorized_keys.d/ignition` (0600, directories
//! 0700 where created, all owned by the user and its primary group), as
//! Ignition 2.14 writes them: as the user. So, as there, a home that is
//! missing (`noCreateHome`) and not the user's to create, or that belongs
//! to someone else, is a failure ([`IgnitionError::Home`]), checked before
//! anything is written under it; a home's parents are never created or
//! taken over.
//!
//! Under a test root the tools get `--root DIR` (they chroot); at `/` they
//! run without it, so the agent needs no CAP_SYS_CHROOT on a node.
//! Idempotent where Ignition is not: an existing group is left alone when
//! its gid is as asked (Ignition's `groupadd` would fail), and `usermod` is
//! given only the fields that differ from the user's entry in the root's
//! passwd, shadow and group files (and not run when none does: it
//! rewrites the databases and their backups even when nothing changes),
//! so the agent's second run changes nothing.

use super::owners::{self, PasswdEntry};
use super::IgnitionError;
use crate::fsutil::{self, FsError, Owner, Root};
use autonode_shared::ignition::{Group, Passwd, User};
use std::collections::BTreeSet;
use std::fs::Metadata;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Applies `passwd` under `root`; how many entries changed something.
/// (`shouldExist` under a spec older than 3.2.0 was refused by the parse.)
pub fn apply(root: &Root, passwd: &Passwd) -> Result<usize, IgnitionError> {
    let tools = Tools::new(root)?;
    let mut changed = 0;
    for group in &passwd.groups {
        changed += usize::from(apply_group(root, &tools, group)?);
    }
    for user in &passwd.users {
        changed += usize::from(apply_user(root, &tools, user)?);
    }
    Ok(changed)
}

/// The refusals of `passwd` found before anything is written: a group
/// that exists with another gid than asked.
pub fn preflight(root: &Root, passwd: &Passwd) -> Result<(), IgnitionError> {
    for group in passwd
        .groups
        .iter()
        .filter(|g| g.should_exist != Some(false))
    {
        gid_clash(owners::group(root, &group.name)?, group)?;
    }
    Ok(())
}

/// Refuses changing an existing group's gid (Ignition does not).
fn gid_clash(existing: Option<u32>, group: &Group) -> Result<(), IgnitionError> {
    match (existing, group.gid) {
        (Some(gid), Some(wanted)) if gid != wanted => Err(invalid(
            &group.name,
            &format!(
                "the group exists with gid {gid}, not {wanted}; Ignition does not change a group"
            ),
        )),
        _ => Ok(()),
    }
}

fn apply_group(root: &Root, tools: &Tools, group: &Group) -> Result<bool, IgnitionError> {
    let existing = owners::group(root, &group.name)?;
    if group.should_exist == Some(false) {
        if existing.is_none() {
            return Ok(false);
        }
        tools.run("groupdel", vec![group.name.clone()])?;
        return Ok(true);
    }
    gid_clash(existing, group)?;
    if existing.is_some() {
        return Ok(false);
    }
    tools.run("groupadd", groupadd_args(group))?;
    Ok(true)
}

fn apply_user(root: &Root, tools: &Tools, user: &User) -> Result<bool, IgnitionError> {
    let existing = owners::user(root, &user.name)?;
    if user.should_exist == Some(false) {
        if existing.is_none() {
            return Ok(false);
        }
        tools.run("userdel", vec!["--remove".into(), user.name.clone()])?;
        return Ok(true);
    }
    let created = existing.is_none();
    let mut changed = match existing {
        None => {
            tools.run("useradd", useradd_args(user))?;
            true
        }
        Some(entry) => {
            let args = usermod_args(user, &current(root, user, entry)?);
            // Nothing differs: usermod would still rewrite the databases.
            let differs = args.len() > 1;
            if differs {
                tools.run("usermod", args)?;
            }
            differs
        }
    };
    changed |= authorize_keys(root, user)?;
    // Ignition sets a given hash once more. After useradd that is kept,
    // though useradd set it already: it rewrites /etc/passwd- and
    // /etc/shadow-, and the oracle compares those backups with Ignition's.
    // Otherwise only when the shadow line differs, so a second run leaves
    // the databases alone.
    let wanted = user.password_hash.as_ref().map(|_| password(user));
    let differs = || Ok::<_, IgnitionError>(owners::shadow_hash(root, &user.name)? != wanted);
    if wanted.is_some() && (created || differs()?) {
        let args = vec!["--password".into(), password(user), user.name.clone()];
        tools.run("usermod", args)?;
        changed = true;
    }
    Ok(changed)
}

/// What an existing user has now, to compare with what is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    pub entry: PasswdEntry,
    /// The password hash in /etc/shadow (`None` without a line there).
    pub hash: Option<String>,
    /// The gid the config's primary group names (`None` if no such group).
    pub primary_gid: Option<u32>,
    /// The groups listing the user as a member.
    pub groups: BTreeSet<String>,
}

fn current(root: &Root, user: &User, entry: PasswdEntry) -> Result<Current, IgnitionError> {
    let primary_gid = match nonempty(&user.primary_group) {
        Some(group) => owners::group(root, group)?,
        None => None,
    };
    Ok(Current {
        hash: owners::shadow_hash(root, &entry.name)?,
        groups: owners::member_of(root, &entry.name)?.into_iter().collect(),
        primary_gid,
        entry,
    })
}

fn password(user: &User) -> String {
    match user.password_hash.as_deref() {
        None | Some("") => "*".to_string(),
        Some(hash) => hash.to_string(),
    }
}

/// `groupadd`'s arguments (without `--root`), as Ignition passes them.
pub fn groupadd_args(group: &Group) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(gid) = group.gid {
        args.extend(["--gid".into(), gid.to_string()]);
    }
    let hash = group.password_hash.as_deref().filter(|h| !h.is_empty());
    args.extend(["--password".into(), hash.unwrap_or("*").to_string()]);
    if group.system == Some(true) {
        args.push("--system".into());
    }
    args.push(group.name.clone());
    args
}

/// `useradd`'s arguments (without `--root`), as Ignition passes them.
pub fn useradd_args(user: &User) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(home) = nonempty(&user.home_dir) {
        args.extend(["--home-dir".into(), home.to_string()]);
    }
    let create = if user.no_create_home == Some(true) {
        "--no-create-home"
    } else {
        "--create-home"
    };
    args.push(create.into());
    let flags = [
        (user.no_user_group, "--no-user-group"),
        (user.system, "--system"),
        (user.no_log_init, "--no-log-init"),
    ];
    for (set, flag) in flags {
        if set == Some(true) {
            args.push(flag.into());
        }
    }
    args.extend(["--password".into(), password(user)]);
    args.extend(common_args(user));
    args
}

/// `usermod`'s arguments for an existing user, in Ignition's order: only
/// the fields set that differ from `now`; just the name when none does.
pub fn usermod_args(user: &User, now: &Current) -> Vec<String> {
    let mut args = Vec::new();
    let entry = &now.entry;
    if let Some(home) = nonempty(&user.home_dir).filter(|h| *h != entry.home) {
        args.extend(["--home".into(), home.to_string(), "--move-home".into()]);
    }
    if user.password_hash.is_some() && now.hash.as_deref() != Some(&password(user)) {
        args.extend(["--password".into(), password(user)]);
    }
    if let Some(uid) = user.uid.filter(|u| *u != entry.uid) {
        args.extend(["--uid".into(), uid.to_string()]);
    }
    if let Some(gecos) = nonempty(&user.gecos).filter(|g| *g != entry.gecos) {
        args.extend(["--comment".into(), gecos.to_string()]);
    }
    let primary = nonempty(&user.primary_group);
    if let Some(group) = primary.filter(|_| now.primary_gid != Some(entry.gid)) {
        args.extend(["--gid".into(), group.to_string()]);
    }
    let wanted: BTreeSet<String> = user.groups.iter().cloned().collect();
    if !user.groups.is_empty() && wanted != now.groups {
        args.extend(["--groups".into(), user.groups.join(",")]);
    }
    if let Some(shell) = nonempty(&user.shell).filter(|s| *s != entry.shell) {
        args.extend(["--shell".into(), shell.to_string()]);
    }
    args.push(user.name.clone());
    args
}

/// `useradd`'s options for the fields set, then the name.
fn common_args(user: &User) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(uid) = user.uid {
        args.extend(["--uid".into(), uid.to_string()]);
    }
    if let Some(gecos) = nonempty(&user.gecos) {
        args.extend(["--comment".into(), gecos.to_string()]);
    }
    if let Some(group) = nonempty(&user.primary_group) {
        args.extend(["--gid".into(), group.to_string()]);
    }
    if !user.groups.is_empty() {
        args.extend(["--groups".into(), user.groups.join(",")]);
    }
    if let Some(shell) = nonempty(&user.shell) {
        args.extend(["--shell".into(), shell.to_string()]);
    }
    args.push(user.name.clone());
    args
}

/// Ignition treats an empty string as unset.
fn nonempty(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.is_empty())
}

/// Writes the user's keys to `~/.ssh/authorized_keys.d/ignition`.
fn authorize_keys(root: &Root, user: &User) -> Result<bool, IgnitionError> {
    if user.ssh_authorized_keys.is_empty() {
        return Ok(false);
    }
    let entry = owners::user(root, &user.name)?
        .ok_or_else(|| invalid(&user.name, "is not in the node's /etc/passwd after useradd"))?;
    let owner = Owner {
        uid: Some(entry.uid),
        gid: Some(entry.gid),
    };
    let home = match entry.home.trim_end_matches('/') {
        "" => "/",
        home => home,
    };
    let dir = Path::new(home).join(".ssh/authorized_keys.d");
    let mut changed = private_dirs(root, &entry, Path::new(home))?;
    let mut keys = user.ssh_authorized_keys.join("\n");
    if !keys.ends_with('\n') {
        keys.push('\n');
    }
    let path = root.join(&format!("{}/ignition", dir.display()))?;
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        // Ignition opens an existing file for writing, as the user.
        if entry.uid != 0 && meta.uid() != entry.uid {
            let what = path_in(&dir, "ignition");
            return Err(home_error(
                root,
                &entry,
                &format!("write {what}"),
                &what,
                &meta,
            ));
        }
    }
    changed |= fsutil::write_atomic(&path, keys.as_bytes(), 0o600, owner)?;
    Ok(changed)
}

/// `dir`/`name` as the node sees it, for messages.
fn path_in(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// Makes `home`, `home/.ssh` and `home/.ssh/authorized_keys.d` exist, as
/// Ignition's `MkdirAll` run as the user does: each missing one is created
/// 0700 and owned by the user, only where the user may create it (its
/// parent is writable by the user), and the keys' directory must be the
/// user's to write in. Every check of a directory comes before anything is
/// created in it, so a refusal leaves the home untouched; the home's own
/// parents are never created. Whether anything was created.
fn private_dirs(root: &Root, entry: &PasswdEntry, home: &Path) -> Result<bool, IgnitionError> {
    let chain = [
        home.to_path_buf(),
        home.join(".ssh"),
        home.join(".ssh/authorized_keys.d"),
    ];
    let parent = home.parent().unwrap_or(Path::new("/")).to_path_buf();
    let mut changed = false;
    for (abs, parent) in chain.iter().zip([&parent, &chain[0], &chain[1]]) {
        let path = root.join(&abs.to_string_lossy())?;
        if std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let parent_meta = std::fs::metadata(root.join(&parent.to_string_lossy())?).ok();
        let Some(parent_meta) = parent_meta.filter(Metadata::is_dir) else {
            let reason = format!(
                "{} does not exist, nor does {}; autonode does not create a home's parents (Ignition fails here too)",
                abs.display(),
                parent.display()
            );
            return Err(home_reason(entry, reason));
        };
        if !writable(&parent_meta, entry) {
            let action = format!("create {}", abs.display());
            let dir = parent.display().to_string();
            return Err(home_error(root, entry, &action, &dir, &parent_meta));
        }
        create_private(&path, entry)?;
        changed = true;
    }
    let keys_dir = std::fs::metadata(root.join(&chain[2].to_string_lossy())?)
        .map_err(|cause| fs_error(&chain[2], cause))?;
    if !writable(&keys_dir, entry) {
        let action = format!("write {}", path_in(&chain[2], "ignition"));
        let dir = chain[2].display().to_string();
        return Err(home_error(root, entry, &action, &dir, &keys_dir));
    }
    Ok(changed)
}

/// Whether the user may create entries in a directory with `meta`, by its
/// owner, its group (the user's primary one) or everyone; root may anywhere.
fn writable(meta: &Metadata, entry: &PasswdEntry) -> bool {
    let mode = meta.mode();
    let can = |shift: u32| (mode >> shift) & 0o3 == 0o3;
    entry.uid == 0
        || (meta.uid() == entry.uid && can(6))
        || (meta.gid() == entry.gid && can(3))
        || can(0)
}

/// Creates `path` 0700, owned by the user and its primary group.
fn create_private(path: &Path, entry: &PasswdEntry) -> Result<(), IgnitionError> {
    let fs_err = |cause| fs_error(path, cause);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(fs_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(fs_err)?;
    std::os::unix::fs::chown(path, Some(entry.uid), Some(entry.gid)).map_err(fs_err)
}

/// The failure to do `action` as the user, because `what` (`meta`) is not
/// the user's: naming its owner.
fn home_error(
    root: &Root,
    entry: &PasswdEntry,
    action: &str,
    what: &str,
    meta: &Metadata,
) -> IgnitionError {
    let owner = match owners::user_name(root, meta.uid()) {
        Ok(Some(name)) => format!("{name} (uid {})", meta.uid()),
        _ => format!("uid {}", meta.uid()),
    };
    let reason = format!(
        "cannot {action}: {what} is owned by {owner}, mode {:04o}, not writable by {} (uid {}); Ignition writes the keys as the user and fails here too",
        meta.mode() & 0o7777,
        entry.name,
        entry.uid,
    );
    home_reason(entry, reason)
}

fn home_reason(entry: &PasswdEntry, reason: String) -> IgnitionError {
    IgnitionError::Home {
        user: entry.name.clone(),
        reason,
    }
}

fn fs_error(path: &Path, cause: std::io::Error) -> IgnitionError {
    IgnitionError::Fs(FsError::Io {
        path: path.to_path_buf(),
        cause,
    })
}

/// Runs the shadow tools, with `--root` unless the root is `/`.
struct Tools {
    root: Option<PathBuf>,
}

impl Tools {
    fn new(root: &Root) -> Result<Self, IgnitionError> {
        if root.as_path() == Path::new("/") {
            return Ok(Tools { root: None });
        }
        // The tools chroot into it and want an absolute path.
        let path = std::fs::canonicalize(root.as_path()).map_err(|cause| {
            IgnitionError::Fs(FsError::Io {
                path: root.as_path().to_path_buf(),
                cause,
            })
        })?;
        Ok(Tools { root: Some(path) })
    }

    fn run(&self, program: &str, args: Vec<String>) -> Result<(), IgnitionError> {
        let mut all = Vec::new();
        if let Some(root) = &self.root {
            all.extend(["--root".into(), root.to_string_lossy().into_owned()]);
        }
        all.extend(args);
        let shown = show(program, &all);
        log::info!("running {shown}");
        let output =
            Command::new(program)
                .args(&all)
                .output()
                .map_err(|e| IgnitionError::Command {
                    command: shown.clone(),
                    status: "not run".into(),
                    stderr: e.to_string(),
                })?;
        if output.status.success() {
            return Ok(());
        }
        Err(IgnitionError::Command {
            command: shown,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

/// The command line for messages, with password hashes left out.
fn show(program: &str, args: &[String]) -> String {
    let mut words = vec![program.to_string()];
    let mut hide = false;
    for arg in args {
        words.push(if hide {
            "<hash>".into()
        } else {
            format!("{arg:?}")
        });
        hide = arg == "--password";
    }
    words.join(" ")
}

fn invalid(name: &str, reason: &str) -> IgnitionError {
    IgnitionError::Passwd {
        name: name.to_string(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The databases the shadow tools write, to see that a run left them.
    fn databases(root: &Root) -> Vec<Option<Vec<u8>>> {
        ["/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow"]
            .iter()
            .map(|file| std::fs::read(root.join(file).unwrap()).ok())
            .collect()
    }

    fn user(name: &str) -> User {
        User {
            name: name.into(),
            ..User::default()
        }
    }

    /// An existing user as the seeded root has it: uid 1000, gid 100,
    /// home /home/NAME, shell /bin/sh, hash `$6$old`, in group `g1`.
    fn now(name: &str) -> Current {
        Current {
            entry: PasswdEntry {
                name: name.into(),
                uid: 1000,
                gid: 100,
                gecos: "Old".into(),
                home: format!("/home/{name}"),
                shell: "/bin/sh".into(),
            },
            hash: Some("$6$old".into()),
            primary_gid: Some(100),
            groups: ["g1".to_string()].into_iter().collect(),
        }
    }

    /// A second run must not rewrite passwd and shadow: usermod does, even
    /// when every value is already as asked.
    #[test]
    fn usermod_gets_only_what_differs() {
        let same = User {
            uid: Some(1000),
            gecos: Some("Old".into()),
            home_dir: Some("/home/x".into()),
            shell: Some("/bin/sh".into()),
            password_hash: Some("$6$old".into()),
            primary_group: Some("users".into()),
            groups: vec!["g1".into()],
            ..user("x")
        };
        assert_eq!(usermod_args(&same, &now("x")), ["x"]);
        let other = User {
            uid: Some(1001),
            shell: Some("/bin/bash".into()),
            password_hash: Some("$6$new".into()),
            groups: vec!["g1".into(), "g2".into()],
            ..same.clone()
        };
        assert_eq!(
            usermod_args(&other, &now("x")),
            [
                "--password",
                "$6$new",
                "--uid",
                "1001",
                "--groups",
                "g1,g2",
                "--shell",
                "/bin/bash",
                "x"
            ]
        );
        let moved_group = Current {
            primary_gid: Some(7),
            ..now("x")
        };
        assert_eq!(usermod_args(&same, &moved_group), ["--gid", "users", "x"]);
    }

    /// The argument lists Debian's Ignition 2.14 ran for the same entries
    /// (from its log, `--root` left out).
    #[test]
    fn arguments_are_ignitions() {
        let core = User {
            uid: Some(1500),
            ssh_authorized_keys: vec!["k".into()],
            groups: vec!["g1".into(), "g2".into()],
            gecos: Some("Core User".into()),
            shell: Some("/bin/sh".into()),
            ..user("core")
        };
        assert_eq!(
            useradd_args(&core),
            [
                "--create-home",
                "--password",
                "*",
                "--uid",
                "1500",
                "--comment",
                "Core User",
                "--groups",
                "g1,g2",
                "--shell",
                "/bin/sh",
                "core"
            ]
        );
        let nohome = User {
            no_create_home: Some(true),
            home_dir: Some("/var/lib/nohome".into()),
            system: Some(true),
            password_hash: Some("$6$abc$def".into()),
            ..user("nohome")
        };
        assert_eq!(
            useradd_args(&nohome),
            [
                "--home-dir",
                "/var/lib/nohome",
                "--no-create-home",
                "--system",
                "--password",
                "$6$abc$def",
                "nohome"
            ]
        );
        assert_eq!(usermod_args(&user("root"), &now("root")), ["root"]);
        let moved = User {
            home_dir: Some("/srv/x".into()),
            password_hash: Some(String::new()),
            primary_group: Some("wheel".into()),
            ..user("x")
        };
        assert_eq!(
            usermod_args(
                &moved,
                &Current {
                    primary_gid: Some(10),
                    ..now("x")
                }
            ),
            [
                "--home",
                "/srv/x",
                "--move-home",
                "--password",
                "*",
                "--gid",
                "wheel",
                "x"
            ]
        );
        let g1 = Group {
            name: "g1".into(),
            gid: Some(2001),
            ..Group::default()
        };
        assert_eq!(
            groupadd_args(&g1),
            ["--gid", "2001", "--password", "*", "g1"]
        );
        let g2 = Group {
            name: "g2".into(),
            system: Some(true),
            ..Group::default()
        };
        assert_eq!(groupadd_args(&g2), ["--password", "*", "--system", "g2"]);
        assert_eq!(
            show(
                "usermod",
                &["--password".into(), "$6$secret".into(), "x".into()]
            ),
            "usermod \"--password\" <hash> \"x\""
        );
    }

    /// The shadow tools chroot into a test root: only root may. The suite
    /// runs as root (tests/run; its network namespaces need it too), so a
    /// non-root run fails here rather than passing without testing.
    fn privileged_root() -> Option<(tempfile::TempDir, Root)> {
        assert!(
            std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0),
            "run as root: useradd --root chroots into the test root"
        );
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        let files = [
            (
                "passwd",
                "root:x:0:0:root:/root:/bin/sh\nnews:x:9:9:news:/var/spool/news:/bin/sh\n",
            ),
            (
                "shadow",
                "root:*:19000:0:99999:7:::\nnews:*:19000:0:99999:7:::\n",
            ),
            ("group", "root:x:0:\nnews:x:9:\nplugdev:x:46:\n"),
            ("gshadow", "root:*::\nnews:*::\nplugdev:*::\n"),
        ];
        for (name, text) in files {
            std::fs::write(etc.join(name), text).unwrap();
        }
        std::fs::set_permissions(etc.join("shadow"), std::fs::Permissions::from_mode(0o640))
            .unwrap();
        let root = Root::new(dir.path());
        Some((dir, root))
    }

    #[test]
    fn users_groups_and_keys_under_a_root_and_idempotent() {
        let Some((dir, root)) = privileged_root() else {
            return;
        };
        let passwd = Passwd {
            groups: vec![Group {
                name: "g1".into(),
                gid: Some(2001),
                ..Group::default()
            }],
            users: vec![
                User {
                    uid: Some(1500),
                    groups: vec!["g1".into()],
                    ssh_authorized_keys: vec!["ssh-ed25519 AAAA a".into(), "ssh-rsa BBBB b".into()],
                    ..user("core")
                },
                User {
                    ssh_authorized_keys: vec!["ssh-ed25519 CCCC root".into()],
                    ..user("root")
                },
            ],
        };
        assert!(apply(&root, &passwd).unwrap() >= 3);
        let core = owners::user(&root, "core").unwrap().unwrap();
        assert_eq!((core.uid, core.home.as_str()), (1500, "/home/core"));
        assert_eq!(owners::group(&root, "g1").unwrap(), Some(2001));
        let group_file = std::fs::read_to_string(dir.path().join("etc/group")).unwrap();
        assert!(group_file.contains("g1:x:2001:core"), "{group_file}");
        let keys = dir.path().join("home/core/.ssh/authorized_keys.d/ignition");
        assert_eq!(
            std::fs::read_to_string(&keys).unwrap(),
            "ssh-ed25519 AAAA a\nssh-rsa BBBB b\n"
        );
        let meta = std::fs::metadata(&keys).unwrap();
        assert_eq!(
            (meta.mode() & 0o7777, meta.uid(), meta.gid()),
            (0o600, 1500, core.gid)
        );
        for private in [
            "home/core/.ssh",
            "home/core/.ssh/authorized_keys.d",
            "root",
            "root/.ssh",
        ] {
            let meta = std::fs::metadata(dir.path().join(private)).unwrap();
            assert_eq!(meta.mode() & 0o7777, 0o700, "{private}");
        }
        let root_keys = dir.path().join("root/.ssh/authorized_keys.d/ignition");
        assert_eq!(
            std::fs::read_to_string(root_keys).unwrap(),
            "ssh-ed25519 CCCC root\n"
        );
        let before = databases(&root);
        assert_eq!(
            apply(&root, &passwd).unwrap(),
            0,
            "a second run changes nothing"
        );
        assert_eq!(databases(&root), before);
    }

    #[test]
    fn should_exist_false_removes_what_exists() {
        let Some((dir, root)) = privileged_root() else {
            return;
        };
        let gone = |name: &str| Group {
            name: name.into(),
            should_exist: Some(false),
            ..Group::default()
        };
        let passwd = Passwd {
            groups: vec![gone("plugdev"), gone("nosuchgroup")],
            users: vec![
                User {
                    should_exist: Some(false),
                    ..user("news")
                },
                User {
                    should_exist: Some(false),
                    ..user("nosuchuser")
                },
            ],
        };
        assert_eq!(apply(&root, &passwd).unwrap(), 2);
        assert_eq!(owners::user(&root, "news").unwrap(), None);
        assert_eq!(owners::group(&root, "plugdev").unwrap(), None);
        assert_eq!(apply(&root, &passwd).unwrap(), 0);
        let group_file = std::fs::read_to_string(dir.path().join("etc/group")).unwrap();
        assert!(group_file.starts_with("root:x:0:"), "{group_file}");
    }

    /// (inode, ctime) of the databases and their backups: a rewrite with
    /// the same contents still shows.
    fn stamps(dir: &Path) -> Vec<(u64, i64, i64)> {
        ["passwd", "passwd-", "shadow", "shadow-", "group", "gshadow"]
            .iter()
            .map(|f| match std::fs::metadata(dir.join("etc").join(f)) {
                Ok(m) => (m.ino(), m.ctime(), m.ctime_nsec()),
                Err(_) => (0, 0, 0),
            })
            .collect()
    }

    #[test]
    fn a_second_run_leaves_a_full_user_untouched() {
        let Some((dir, root)) = privileged_root() else {
            return;
        };
        let full = User {
            uid: Some(2001),
            gecos: Some("Alice".into()),
            home_dir: Some("/srv/alice".into()),
            shell: Some("/bin/bash".into()),
            primary_group: Some("news".into()),
            groups: vec!["plugdev".into()],
            password_hash: Some("$6$salt$hash".into()),
            ..user("alice")
        };
        let passwd = Passwd {
            users: vec![full.clone()],
            ..Passwd::default()
        };
        assert_eq!(apply(&root, &passwd).unwrap(), 1);
        let before = stamps(dir.path());
        assert_eq!(apply(&root, &passwd).unwrap(), 0);
        assert_eq!(stamps(dir.path()), before, "nothing rewritten");
        // A real difference is applied and counted.
        let changed = Passwd {
            users: vec![User {
                shell: Some("/bin/sh".into()),
                ..full
            }],
            ..Passwd::default()
        };
        assert_eq!(apply(&root, &changed).unwrap(), 1);
        let alice = owners::user(&root, "alice").unwrap().unwrap();
        assert_eq!((alice.shell.as_str(), alice.uid), ("/bin/sh", 2001));
        assert_eq!(
            owners::shadow_hash(&root, "alice").unwrap().as_deref(),
            Some("$6$salt$hash")
        );
    }

    fn keyed(name: &str) -> User {
        User {
            ssh_authorized_keys: vec!["ssh-ed25519 AAAA k".into()],
            ..user(name)
        }
    }

    fn only(user: User) -> Passwd {
        Passwd {
            users: vec![user],
            ..Passwd::default()
        }
    }

    /// Ignition writes the keys as the user: a home the user does not own
    /// fails, and nothing is written under it.
    #[test]
    fn keys_fail_in_a_home_owned_by_someone_else() {
        let Some((dir, root)) = privileged_root() else {
            return;
        };
        let home = dir.path().join("srv/erin");
        std::fs::create_dir_all(&home).unwrap();
        let err = apply(
            &root,
            &only(User {
                home_dir: Some("/srv/erin".into()),
                ..keyed("erin")
            }),
        )
        .unwrap_err();
        assert!(matches!(err, IgnitionError::Home { .. }), "{err:?}");
        assert!(!err.is_refusal(), "the node's state, not the config");
        let text = err.to_string();
        assert!(
            text.contains("\"erin\"") && text.contains("/srv/erin is owned by root (uid 0)"),
            "{text}"
        );
        assert_eq!(
            std::fs::read_dir(&home).unwrap().count(),
            0,
            "nothing written"
        );
    }

    /// A home's parents are never created or taken over: Ignition, as the
    /// user, cannot create them either.
    #[test]
    fn keys_without_a_home_never_create_or_take_its_parents() {
        let Some((dir, root)) = privileged_root() else {
            return;
        };
        let frank = User {
            no_create_home: Some(true),
            ..keyed("frank")
        };
        let err = apply(&root, &only(frank.clone())).unwrap_err();
        assert!(
            err.to_string().contains("/home/frank does not exist"),
            "{err}"
        );
        assert!(!dir.path().join("home").exists(), "/home not created");
        // With /home there (root's, 0755), the user still may not create
        // its home in it, and /home stays as it was.
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = apply(&root, &only(frank)).unwrap_err();
        assert!(
            err.to_string().contains("cannot create /home/frank"),
            "{err}"
        );
        let meta = std::fs::metadata(&home).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o755));
        assert_eq!(std::fs::read_dir(&home).unwrap().count(), 0);
    }

    #[test]
    fn tool_failures_and_gid_clashes_are_typed_and_say_why() {
        let Some((_dir, root)) = privileged_root() else {
            return;
        };
        let bad = Passwd {
            users: vec![User {
                primary_group: Some("nosuchgroup".into()),
                ..user("core")
            }],
            ..Passwd::default()
        };
        let err = apply(&root, &bad).unwrap_err();
        let IgnitionError::Command {
            command, stderr, ..
        } = &err
        else {
            panic!("{err:?}");
        };
        assert!(command.starts_with("useradd"), "{command}");
        assert!(stderr.contains("nosuchgroup"), "{stderr}");
        assert!(!err.is_refusal());
        let clash = Passwd {
            groups: vec![Group {
                name: "news".into(),
                gid: Some(99),
                ..Group::default()
            }],
            ..Passwd::default()
        };
        let err = apply(&root, &clash).unwrap_err();
        assert!(err.to_string().contains("gid 9, not 99"), "{err}");
    }
}
