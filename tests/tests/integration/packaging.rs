//! The shipped artefacts, checked as built: the agent's .deb installed into
//! a real Debian root and removed again, the .rpm's files and scripts, both
//! for x86_64 and aarch64 (static binary of the right machine within its
//! size budget, the arm64 packages the same as the amd64 ones but for it), the
//! systemd unit under systemd-analyze, the server's Kustomize base, the
//! guest RBAC's kustomization and the example EC2NodeClass/NodePool against
//! a real kube-apiserver, and the server's OCI image unpacked and run.
//!
//! `tests/run` builds the artefacts first (`packaging/build`,
//! `packaging/build-image`); the Debian root comes from
//! `packaging/debian-root` (cached by `tests/setup/install-deps`). These
//! tests need root (chroot, file ownership), as the rest of the suite does.

use anyhow::{bail, ensure, Context, Result};
use autonode_tests::kube::controlplane::{kube_bin_dir, ControlPlane};
use autonode_tests::kube::manifest::{apply_manifest, documents};
use autonode_tests::server::{
    binary, serves_nodeclass_admission, GuestRbac, GUEST_RBAC_FILES, NODECLASS_ADMISSION_FILE,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::{pinned_kind, Scope};
use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The workspace version every crate inherits.
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The version as the packages spell it (`packaging/version --package`): a
/// pre-release's `-` as `~`, which Debian and RPM order before the release.
fn package_version() -> String {
    version().replacen('-', "~", 1)
}

/// Runs a command, fails with its output unless it succeeds; returns stdout.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !output.status.success() {
        bail!(
            "{program} {} failed ({}):\n{}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The one file in target/packages/ whose name starts and ends so.
fn package(prefix: &str, suffix: &str) -> Result<PathBuf> {
    let dir = workspace().join("target/packages");
    let found: Vec<PathBuf> = fs::read_dir(&dir)
        .with_context(|| format!("{}: run packaging/build (tests/run does)", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with(prefix) && name.ends_with(suffix)
        })
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!(
            "no {prefix}*{suffix} in {}: run packaging/build",
            dir.display()
        ),
        more => bail!("several packages: {more:?}"),
    }
}

fn mode(path: &Path) -> Result<u32> {
    Ok(fs::symlink_metadata(path)
        .with_context(|| format!("{} is missing", path.display()))?
        .permissions()
        .mode()
        & 0o7777)
}

/// Symlinks under `dir` whose target names the agent's unit.
fn unit_symlinks(dir: &Path) -> Result<Vec<String>> {
    let out = run(
        "find",
        &[
            &dir.to_string_lossy(),
            "-type",
            "l",
            "-lname",
            "*autonode-agent*",
        ],
    )?;
    Ok(out.lines().map(str::to_string).collect())
}

/// A fresh Debian 12 root (minbase + systemd), extracted from the cache.
pub(crate) fn debian_root() -> Result<tempfile::TempDir> {
    let tarball = run(
        &workspace().join("packaging/debian-root").to_string_lossy(),
        &[],
    )?;
    let root = tempfile::Builder::new()
        .prefix("autonode-debroot-")
        .tempdir()?;
    run(
        "tar",
        &[
            "--same-owner",
            "--numeric-owner",
            "-xpf",
            tarball.trim(),
            "-C",
            &root.path().to_string_lossy(),
        ],
    )?;
    Ok(root)
}

pub(crate) fn chroot(root: &Path, args: &[&str]) -> Result<String> {
    let mut all = vec![root.to_str().context("root path")?];
    all.extend_from_slice(args);
    run("chroot", &all)
}

/// The AMI recipe's provisioning (packaging/bake/provision, which the
/// Packer template and the VM test image's build both run), in a real
/// Debian root as a chroot bake would: kubelet placed, its AMI-level flags
/// written, the .deb installed and its unit enabled, the runtime enabled,
/// and kubelet's version recorded in the form the agent reads. The image
/// here has a runtime, so nothing is downloaded.
#[test]
fn the_bake_script_provisions_a_root_and_records_kubelets_version() -> Result<()> {
    let deb = package("autonode-agent_", "_amd64.deb")?;
    let root = debian_root()?;
    let r = root.path();
    let bake = r.join("tmp/bake");
    fs::create_dir_all(&bake)?;
    fs::copy(&deb, bake.join("autonode-agent.deb"))?;
    for file in ["provision", "kubelet.service"] {
        fs::copy(
            workspace().join("packaging/bake").join(file),
            bake.join(file),
        )?;
    }
    // A kubelet that only answers --version, as a 1.37 one does.
    let kubelet = "#!/bin/sh\necho 'Kubernetes v1.37.2'\n";
    fs::write(bake.join("kubelet"), kubelet)?;
    let unit = "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n";
    fs::write(r.join("usr/lib/systemd/system/containerd.service"), unit)?;

    chroot(
        r,
        &[
            "/tmp/bake/provision",
            "--kubelet",
            "/tmp/bake/kubelet",
            "/tmp/bake/autonode-agent.deb",
        ],
    )?;
    assert_eq!(mode(&r.join("usr/bin/kubelet"))?, 0o755);
    let record = fs::read_to_string(r.join("etc/autonode/kubelet-version"))?;
    let pairs: Vec<&str> = record.lines().filter(|l| !l.starts_with('#')).collect();
    let size = kubelet.len();
    assert_eq!(
        pairs,
        [
            "kubelet=/usr/bin/kubelet",
            &format!("size={size}"),
            "version=v1.37.2"
        ],
        "{record}"
    );
    assert_eq!(mode(&r.join("etc/autonode/kubelet-version"))?, 0o644);
    let flags = fs::read_to_string(r.join("etc/default/kubelet"))?;
    assert!(flags.contains("KUBELET_EXTRA_ARGS=\"\""), "{flags}");
    // The root had no kubelet unit: the recipe's is installed.
    assert_eq!(
        fs::read(r.join("usr/lib/systemd/system/kubelet.service"))?,
        fs::read(workspace().join("packaging/bake/kubelet.service"))?
    );
    for unit in [
        "autonode-agent.service",
        "containerd.service",
        "kubelet.service",
    ] {
        let enabled = chroot(r, &["systemctl", "is-enabled", unit])?;
        assert_eq!(enabled.trim(), "enabled", "{unit}");
    }

    // A package that is not one fails, naming it.
    fs::write(bake.join("agent.tgz"), "x")?;
    let refused = chroot(r, &["/tmp/bake/provision", "/tmp/bake/agent.tgz"]);
    let err = refused.expect_err("a .tgz is no package").to_string();
    assert!(err.contains("neither a .deb nor an .rpm"), "{err}");
    Ok(())
}

/// The .deb in a real Debian root: files and modes, the unit enabled (not
/// started: there is no systemd running), the binary runs there, the unit
/// verifies, and removal leaves no unit, drop-in or symlink behind.
#[test]
fn deb_installs_enabled_and_removes_cleanly() -> Result<()> {
    let deb = package("autonode-agent_", "_amd64.deb")?;
    let info = run(
        "dpkg-deb",
        &["--field", &deb.to_string_lossy(), "Version", "Depends"],
    )?;
    assert!(
        info.contains(&format!("Version: {}-1", package_version())),
        "{info}"
    );
    assert!(
        !info.contains("libc"),
        "a static binary depends on no libc: {info}"
    );

    let root = debian_root()?;
    let r = root.path();
    fs::copy(&deb, r.join("tmp/autonode-agent.deb"))?;
    chroot(r, &["dpkg", "-i", "/tmp/autonode-agent.deb"])?;

    for (path, want) in [
        ("usr/bin/autonode-agent", 0o755),
        ("usr/lib/systemd/system/autonode-agent.service", 0o644),
        (
            "usr/lib/systemd/system/kubelet.service.d/10-autonode-agent.conf",
            0o644,
        ),
        ("etc/autonode", 0o755),
        ("var/lib/autonode", 0o700),
        ("usr/share/doc/autonode-agent/copyright", 0o644),
        ("usr/share/doc/autonode-agent/agent.md", 0o644),
        ("usr/share/doc/autonode-agent/ignition.md", 0o644),
        ("usr/share/doc/autonode-agent/design.md", 0o644),
        ("usr/share/doc/autonode-agent/agent.toml.example", 0o644),
    ] {
        let full = r.join(path);
        assert_eq!(mode(&full)?, want, "mode of /{path}");
        let meta = fs::metadata(&full)?;
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "owner of /{path}");
    }
    let copyright = fs::read_to_string(r.join("usr/share/doc/autonode-agent/copyright"))?;
    assert!(copyright.contains("Apache License"), "{copyright}");
    // The agent's own documentation, as docs/ has it; not the repository's
    // README, which is about the whole project.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for doc in ["agent.md", "ignition.md", "design.md"] {
        let shipped = fs::read(r.join("usr/share/doc/autonode-agent").join(doc))?;
        assert!(
            shipped == fs::read(repo.join("docs").join(doc))?,
            "/usr/share/doc/autonode-agent/{doc} differs from docs/{doc}"
        );
    }
    assert!(!r.join("usr/share/doc/autonode-agent/README.md").exists());
    // Never shipped: a local config would override every node's userData.
    assert!(!r.join("etc/autonode/agent.toml").exists());

    // Enabled offline, as on an AMI build: the wants symlink, and systemctl
    // agrees. Nothing started it (no systemd runs in the root).
    let wants = r.join("etc/systemd/system/multi-user.target.wants/autonode-agent.service");
    let link = fs::read_link(&wants).context("multi-user.target.wants symlink")?;
    assert!(
        link.ends_with("autonode-agent.service"),
        "{}",
        link.display()
    );
    let enabled = chroot(r, &["systemctl", "is-enabled", "autonode-agent.service"])?;
    assert_eq!(enabled.trim(), "enabled");

    let printed = chroot(r, &["/usr/bin/autonode-agent", "--version"])?;
    assert_eq!(printed.trim(), format!("autonode-agent {}", version()));

    // The unit as installed, with its binary present: systemd's own checks,
    // and its exposure score must stay "OK" or better (below 4.0).
    chroot(
        r,
        &[
            "systemd-analyze",
            "verify",
            "/usr/lib/systemd/system/autonode-agent.service",
        ],
    )?;
    let security = run(
        "systemd-analyze",
        &[
            "security",
            "--offline=yes",
            "--threshold=40",
            &r.join("usr/lib/systemd/system/autonode-agent.service")
                .to_string_lossy(),
        ],
    )?;
    assert!(security.contains("Overall exposure level"), "{security}");
    let kubelet_dropin = fs::read_to_string(
        r.join("usr/lib/systemd/system/kubelet.service.d/10-autonode-agent.conf"),
    )?;
    assert!(kubelet_dropin.contains("Requires=autonode-agent.service"));
    assert!(kubelet_dropin.contains("After=autonode-agent.service"));
    check_boot_order(r)?;

    // Simulate a node that ran: state the purge must remove.
    fs::write(r.join("var/lib/autonode/state.json"), "{}")?;

    chroot(r, &["dpkg", "-r", "autonode-agent"])?;
    for path in [
        "usr/bin/autonode-agent",
        "usr/lib/systemd/system/autonode-agent.service",
        "lib/systemd/system/autonode-agent.service",
        "usr/lib/systemd/system/kubelet.service.d/10-autonode-agent.conf",
        "etc/systemd/system/autonode-agent.service",
    ] {
        assert!(!r.join(path).exists(), "/{path} is left after removal");
    }
    let links = unit_symlinks(&r.join("etc/systemd"))?;
    assert!(links.is_empty(), "symlinks left after removal: {links:?}");
    // Removal keeps the node's state; purge removes it.
    assert!(r.join("var/lib/autonode/state.json").exists());
    chroot(r, &["dpkg", "--purge", "autonode-agent"])?;
    assert!(
        !r.join("var/lib/autonode").exists(),
        "purge leaves /var/lib/autonode"
    );
    let status = Command::new("chroot")
        .args([r.to_str().unwrap(), "dpkg", "-s", "autonode-agent"])
        .output()?;
    assert!(!status.status.success(), "still known to dpkg after purge");
    Ok(())
}

/// `systemd-analyze verify` in `root`: its messages (stderr), failing
/// only if the command does. An ordering cycle is not a failure to it:
/// it deletes a job to break the cycle and says so.
fn verify_units(root: &Path, units: &[&str]) -> Result<String> {
    let output = Command::new("chroot")
        .arg(root)
        .args(["systemd-analyze", "verify"])
        .args(units)
        .output()
        .context("running systemd-analyze verify")?;
    let messages = String::from_utf8_lossy(&output.stderr).into_owned();
    ensure!(
        output.status.success(),
        "systemd-analyze verify {units:?}: {}\n{messages}",
        output.status
    );
    Ok(messages)
}

/// The installed agent unit and kubelet drop-in with stand-ins for an
/// AMI's kubelet (the upstream package's: no runtime ordering) and its
/// runtimes (containerd's and CRI-O's own orderings), all started in one
/// transaction: no ordering cycle. And systemd sees the drop-in order
/// kubelet after each runtime: a runtime unit ordered after kubelet makes
/// a cycle through kubelet's job.
fn check_boot_order(root: &Path) -> Result<()> {
    let units = root.join("etc/systemd/system");
    let unit = |name: &str, unit_section: &str| -> Result<()> {
        let mut text = format!("[Unit]\n{unit_section}\n");
        if name.ends_with(".service") {
            text.push_str("[Service]\nExecStart=/usr/bin/true\n");
        }
        fs::write(units.join(name), text).with_context(|| name.to_string())
    };
    unit(
        "kubelet.service",
        "Wants=network-online.target\nAfter=network-online.target",
    )?;
    unit("containerd.service", "After=network.target local-fs.target")?;
    unit(
        "crio.service",
        "Wants=network-online.target\nAfter=network-online.target",
    )?;
    unit(
        "autonode-boot.target",
        "Wants=autonode-agent.service kubelet.service containerd.service crio.service",
    )?;
    let messages = verify_units(root, &["autonode-boot.target"])?;
    ensure!(
        !messages.contains("ordering cycle"),
        "the boot units form an ordering cycle:\n{messages}"
    );
    for runtime in ["containerd.service", "crio.service"] {
        unit(runtime, "After=kubelet.service")?;
        let messages = verify_units(root, &["autonode-boot.target"])?;
        // systemd names the cycle from either end.
        let cycle = messages.lines().any(|l| {
            l.contains("Found ordering cycle on")
                && l.contains("kubelet.service")
                && l.contains(runtime)
        });
        ensure!(cycle, "kubelet is not ordered after {runtime}:\n{messages}");
        unit(runtime, "")?;
    }
    for name in [
        "kubelet.service",
        "containerd.service",
        "crio.service",
        "autonode-boot.target",
    ] {
        fs::remove_file(units.join(name))?;
    }
    Ok(())
}

/// The .rpm: files with their modes, the scripts enable and never start or
/// stop, the version, no shared-library requirements; then installed into
/// the Debian root and erased.
#[test]
fn rpm_contents_and_scripts() -> Result<()> {
    let rpm = package("autonode-agent-", ".x86_64.rpm")?;
    let rpm = rpm.to_string_lossy();

    let version_out = run("rpm", &["-qp", "--queryformat", "%{NAME} %{VERSION}", &rpm])?;
    assert_eq!(version_out, format!("autonode-agent {}", package_version()));

    // path → mode, from `rpm -qp --dump` (path size mtime digest mode ...).
    let dump = run("rpm", &["-qp", "--dump", &rpm])?;
    let modes: std::collections::HashMap<&str, u32> = dump
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((*f.first()?, u32::from_str_radix(f.get(4)?, 8).ok()?))
        })
        .collect();
    for (path, want) in [
        ("/usr/bin/autonode-agent", 0o100755),
        ("/usr/lib/systemd/system/autonode-agent.service", 0o100644),
        (
            "/usr/lib/systemd/system/kubelet.service.d/10-autonode-agent.conf",
            0o100644,
        ),
        ("/usr/share/licenses/autonode-agent/LICENSE", 0o100644),
        ("/usr/share/doc/autonode-agent/agent.md", 0o100644),
        ("/usr/share/doc/autonode-agent/ignition.md", 0o100644),
        ("/usr/share/doc/autonode-agent/design.md", 0o100644),
        ("/usr/share/doc/autonode-agent/agent.toml.example", 0o100644),
    ] {
        assert_eq!(modes.get(path), Some(&want), "{path} in\n{dump}");
    }
    let list = run("rpm", &["-qlp", &rpm])?;
    assert!(!list.contains("agent.toml\n"), "{list}");
    assert!(!list.contains("README.md"), "{list}");

    let scripts = run("rpm", &["-qp", "--scripts", &rpm])?;
    // The directories come from %post (see packaging/rpm/post.sh).
    assert!(
        scripts.contains("install -d -m 0755 /etc/autonode"),
        "{scripts}"
    );
    assert!(
        scripts.contains("install -d -m 0700 /var/lib/autonode"),
        "{scripts}"
    );
    assert!(
        scripts.contains("systemctl --no-reload enable autonode-agent.service"),
        "{scripts}"
    );
    assert!(
        scripts.contains("systemctl --no-reload disable autonode-agent.service"),
        "{scripts}"
    );
    for forbidden in [
        "systemctl start",
        "systemctl restart",
        "systemctl stop",
        "try-restart",
    ] {
        assert!(!scripts.contains(forbidden), "{forbidden:?} in\n{scripts}");
    }

    let requires = run("rpm", &["-qp", "--requires", &rpm])?;
    assert!(
        !requires.contains(".so"),
        "a static binary needs no libraries:\n{requires}"
    );
    assert!(requires.contains("systemd"), "{requires}");

    // Installed and erased for real, scripts included (they run chrooted):
    // Debian's rpm into the Debian root, with its own database.
    let root = debian_root()?;
    let r = root.path();
    let r_arg = format!("--root={}", r.display());
    run("rpm", &[&r_arg, "--initdb"])?;
    // --nodeps: the root's systemd is a dpkg package, unknown to rpm.
    run("rpm", &[&r_arg, "-i", "--nodeps", &rpm])?;
    assert_eq!(mode(&r.join("etc/autonode"))?, 0o755);
    assert_eq!(mode(&r.join("var/lib/autonode"))?, 0o700);
    let enabled = chroot(r, &["systemctl", "is-enabled", "autonode-agent.service"])?;
    assert_eq!(enabled.trim(), "enabled");
    run("rpm", &[&r_arg, "-e", "autonode-agent"])?;
    assert!(!r
        .join("usr/lib/systemd/system/autonode-agent.service")
        .exists());
    assert!(!r
        .join("usr/lib/systemd/system/kubelet.service.d/10-autonode-agent.conf")
        .exists());
    let links = unit_symlinks(&r.join("etc/systemd"))?;
    assert!(links.is_empty(), "symlinks left after erase: {links:?}");
    assert!(!r.join("var/lib/autonode").exists());
    Ok(())
}

/// One architecture the agent is packaged for: its names in the .deb and
/// .rpm world, its ELF machine number, and how this x86_64 machine runs it.
struct Arch {
    deb: &'static str,
    rpm: &'static str,
    /// e_machine: EM_X86_64 (62), EM_AARCH64 (183).
    elf_machine: u16,
    /// The program that runs the binary here, if it is foreign.
    emulator: Option<&'static str>,
}

const ARCHES: [Arch; 2] = [
    Arch {
        deb: "amd64",
        rpm: "x86_64",
        elf_machine: 62,
        emulator: None,
    },
    Arch {
        deb: "arm64",
        rpm: "aarch64",
        elf_machine: 183,
        emulator: Some("qemu-aarch64-static"),
    },
];

/// The agent's size budget on every architecture: it ships on every AMI
/// (docs/agent.md, *The static binary*: 4 MiB).
const AGENT_SIZE_LIMIT: u64 = 4 << 20;

/// What a 64-bit little-endian ELF file says of itself: its machine, and
/// whether it names a program interpreter (PT_INTERP), i.e. needs a dynamic
/// loader. Read here rather than with `file` or `ldd`: ldd cannot judge a
/// foreign binary, and `file` is not on a minimal machine.
fn elf_machine_and_interp(bytes: &[u8]) -> Result<(u16, bool)> {
    ensure!(bytes.len() >= 64 && bytes[..4] == *b"\x7fELF", "not ELF");
    ensure!(
        bytes[4] == 2 && bytes[5] == 1,
        "not 64-bit little-endian ELF"
    );
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let machine = u16_at(18);
    let phoff = u64::from_le_bytes(bytes[32..40].try_into()?) as usize;
    let (phentsize, phnum) = (u16_at(54) as usize, u16_at(56) as usize);
    ensure!(
        phentsize >= 4 && phoff + phentsize * phnum <= bytes.len(),
        "program headers out of the file"
    );
    const PT_INTERP: u32 = 3;
    let interp = (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) == PT_INTERP
    });
    Ok((machine, interp))
}

/// Every file under `root` (relative path → mode, content; symlinks by
/// their target), for comparing two unpacked packages.
fn tree(root: &Path) -> Result<std::collections::BTreeMap<String, (u32, Vec<u8>)>> {
    let mut out = std::collections::BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            let meta = fs::symlink_metadata(&path)?;
            let rel = path.strip_prefix(root)?.to_string_lossy().into_owned();
            let content = if meta.file_type().is_symlink() {
                fs::read_link(&path)?.into_os_string().into_encoded_bytes()
            } else if meta.is_dir() {
                dirs.push(path.clone());
                Vec::new()
            } else {
                fs::read(&path)?
            };
            out.insert(rel, (meta.permissions().mode(), content));
        }
    }
    Ok(out)
}

/// Both architectures' packages, as built by packaging/build: the
/// architecture fields, one static binary of the right machine in both
/// packages of an architecture (the .rpm's digest is the .deb's file's),
/// within the size budget, and it runs (the aarch64 one under QEMU's
/// user-mode emulation) and says its version.
#[test]
fn agent_packages_for_both_architectures() -> Result<()> {
    use sha2::Digest as _;
    for arch in &ARCHES {
        let deb = package("autonode-agent_", &format!("_{}.deb", arch.deb))?;
        let rpm = package("autonode-agent-", &format!(".{}.rpm", arch.rpm))?;
        let (deb, rpm) = (deb.to_string_lossy(), rpm.to_string_lossy());
        let field = run("dpkg-deb", &["--field", &deb, "Architecture"])?;
        assert_eq!(field.trim(), arch.deb, "{deb}");
        let rpm_arch = run("rpm", &["-qp", "--queryformat", "%{ARCH}", &rpm])?;
        assert_eq!(rpm_arch, arch.rpm, "{rpm}");

        let unpacked = tempfile::Builder::new().prefix("autonode-deb-").tempdir()?;
        run(
            "dpkg-deb",
            &["-x", &deb, &unpacked.path().to_string_lossy()],
        )?;
        let binary = unpacked.path().join("usr/bin/autonode-agent");
        let bytes = fs::read(&binary)?;
        let (machine, interp) = elf_machine_and_interp(&bytes)?;
        assert_eq!(machine, arch.elf_machine, "{deb}: ELF machine");
        assert!(
            !interp,
            "{deb}: the agent must be static (it has PT_INTERP)"
        );
        assert!(
            bytes.len() as u64 <= AGENT_SIZE_LIMIT,
            "{deb}: the agent is {} bytes, over its budget of {AGENT_SIZE_LIMIT}",
            bytes.len()
        );

        // The same file in the .rpm: `--dump` gives its SHA-256.
        let dump = run("rpm", &["-qp", "--dump", &rpm])?;
        let line = dump
            .lines()
            .find(|l| l.starts_with("/usr/bin/autonode-agent "))
            .with_context(|| format!("no /usr/bin/autonode-agent in {rpm}:\n{dump}"))?;
        let digest = format!("{:x}", sha2::Sha256::digest(&bytes));
        assert!(
            line.split_whitespace().nth(3) == Some(digest.as_str()),
            "{rpm}'s binary is not {deb}'s ({digest}): {line}"
        );

        let path = binary.to_string_lossy();
        let printed = match arch.emulator {
            None => run(&path, &["--version"])?,
            Some(emulator) => run(emulator, &[&path, "--version"])?,
        };
        assert_eq!(printed.trim(), format!("autonode-agent {}", version()));
    }
    Ok(())
}

/// The arm64 packages differ from the amd64 ones in their binary and
/// architecture only: the same files with the same modes and bytes (units,
/// drop-in, docs), the same maintainer scripts, control fields, rpm
/// requirements and scripts. So what the amd64 tests above prove of the
/// installed packages (installed into a Debian root, enabled, removed)
/// holds for arm64, whose binary this x86_64 machine cannot run natively.
#[test]
fn arm64_packages_match_amd64_but_for_the_binary() -> Result<()> {
    let [amd64, arm64] = &ARCHES;
    let unpack = |arch: &Arch| -> Result<(tempfile::TempDir, String)> {
        let deb = package("autonode-agent_", &format!("_{}.deb", arch.deb))?;
        let deb = deb.to_string_lossy().into_owned();
        let dir = tempfile::Builder::new().prefix("autonode-deb-").tempdir()?;
        let data = dir.path().join("data");
        let control = dir.path().join("control");
        run("dpkg-deb", &["-x", &deb, &data.to_string_lossy()])?;
        run("dpkg-deb", &["-e", &deb, &control.to_string_lossy()])?;
        Ok((dir, deb))
    };
    let ((a, a_deb), (b, b_deb)) = (unpack(amd64)?, unpack(arm64)?);
    let files = |dir: &Path, skip: &[&str]| -> Result<_> {
        let mut t = tree(dir)?;
        for s in skip {
            ensure!(t.remove(*s).is_some(), "{s} missing in {}", dir.display());
        }
        Ok(t)
    };
    let (fa, fb) = (
        files(&a.path().join("data"), &["usr/bin/autonode-agent"])?,
        files(&b.path().join("data"), &["usr/bin/autonode-agent"])?,
    );
    assert!(
        fa.contains_key("usr/lib/systemd/system/autonode-agent.service"),
        "{:?}",
        fa.keys()
    );
    let names = |t: &std::collections::BTreeMap<String, _>| t.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&fa),
        names(&fb),
        "{a_deb} and {b_deb} hold other files"
    );
    for (path, want) in &fa {
        assert!(
            fb[path] == *want,
            "/{path} differs between {a_deb} and {b_deb}"
        );
    }
    // Maintainer scripts and conffiles the same; control names the
    // architecture and the installed size (its other fields compared below).
    // (cargo-deb writes md5sums only on request; dropped if there.)
    let scripts = |dir: &Path| -> Result<_> {
        let mut t = files(dir, &["control"])?;
        t.remove("md5sums");
        Ok(t)
    };
    let (ca, cb) = (
        scripts(&a.path().join("control"))?,
        scripts(&b.path().join("control"))?,
    );
    assert!(ca.contains_key("postinst"), "{:?}", ca.keys());
    assert!(ca == cb, "maintainer scripts differ: {a_deb}, {b_deb}");
    let fields = |deb: &str| -> Result<String> {
        Ok(run("dpkg-deb", &["--field", deb])?
            .lines()
            .filter(|l| !l.starts_with("Architecture:") && !l.starts_with("Installed-Size:"))
            .collect::<Vec<_>>()
            .join("\n"))
    };
    assert_eq!(fields(&a_deb)?, fields(&b_deb)?);

    let rpm = |arch: &Arch| -> Result<String> {
        Ok(package("autonode-agent-", &format!(".{}.rpm", arch.rpm))?
            .to_string_lossy()
            .into_owned())
    };
    let (ra, rb) = (rpm(amd64)?, rpm(arm64)?);
    // `--dump`: path size mtime digest mode …; the mtime is the build's.
    let dump = |rpm: &str| -> Result<Vec<String>> {
        Ok(run("rpm", &["-qp", "--dump", rpm])?
            .lines()
            .filter(|l| !l.starts_with("/usr/bin/autonode-agent "))
            .map(|l| {
                let mut f: Vec<&str> = l.split_whitespace().collect();
                if f.len() > 2 {
                    f.remove(2);
                }
                f.join(" ")
            })
            .collect())
    };
    let (da, db) = (dump(&ra)?, dump(&rb)?);
    assert!(da.len() >= 6, "{da:?}");
    assert_eq!(da, db, "{ra} and {rb} hold other files");
    for query in ["--scripts", "--requires", "--provides"] {
        // rpm names the architecture in provides as "name(x86-64)" and
        // "name(aarch-64)".
        let strip = |text: String| {
            text.replace("(x86-64)", "(ARCH)")
                .replace("(aarch-64)", "(ARCH)")
        };
        assert_eq!(
            strip(run("rpm", &["-qp", query, &ra])?),
            strip(run("rpm", &["-qp", query, &rb])?),
            "rpm {query}"
        );
    }
    Ok(())
}

/// Reads the OCI layout's image for `tag`: (config JSON, layer blob paths).
fn oci_image(layout: &Path, tag: &str) -> Result<(serde_json::Value, Vec<PathBuf>)> {
    let read = |path: &Path| -> Result<serde_json::Value> {
        Ok(serde_json::from_slice(
            &fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        )?)
    };
    let blob = |digest: &serde_json::Value| -> Result<PathBuf> {
        let digest = digest.as_str().context("digest")?;
        let (alg, hex) = digest.split_once(':').context("digest form")?;
        Ok(layout.join("blobs").join(alg).join(hex))
    };
    let index = read(&layout.join("index.json"))?;
    let manifest = index["manifests"]
        .as_array()
        .context("index.json manifests")?
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .with_context(|| format!("no tag {tag} in {index}"))?;
    let manifest = read(&blob(&manifest["digest"])?)?;
    let config = read(&blob(&manifest["config"]["digest"])?)?;
    let layers = manifest["layers"]
        .as_array()
        .context("manifest layers")?
        .iter()
        .map(|l| blob(&l["digest"]))
        .collect::<Result<Vec<_>>>()?;
    Ok((config, layers))
}

/// The server's image: FROM scratch (only what build-image put there),
/// non-root, its static binary runs from the unpacked root filesystem as
/// that user, and the CA bundle the EC2 client needs is in place.
#[test]
fn oci_image_unpacks_and_runs() -> Result<()> {
    let layout = workspace().join("target/packages/autonode-server-oci");
    ensure!(
        layout.join("index.json").exists(),
        "{}: run packaging/build-image (tests/run does)",
        layout.display()
    );
    let (config, layers) = oci_image(&layout, version())?;
    assert_eq!(config["architecture"], "amd64");
    assert_eq!(config["os"], "linux");
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(
        config["config"]["Entrypoint"][0],
        "/usr/bin/autonode-server"
    );
    assert_eq!(config["config"]["Cmd"][0], "serve");

    let rootfs = tempfile::Builder::new().prefix("autonode-oci-").tempdir()?;
    let r = rootfs.path();
    for layer in &layers {
        // Layers are gzip tars (umoci's default); no whiteouts in a
        // FROM-scratch image of one layer.
        run(
            "tar",
            &[
                "--same-owner",
                "-xpzf",
                &layer.to_string_lossy(),
                "-C",
                &r.to_string_lossy(),
            ],
        )?;
    }
    let mut files = run(
        "find",
        &[&r.to_string_lossy(), "-mindepth", "1", "-not", "-type", "d"],
    )?
    .lines()
    .map(|l| l.trim_start_matches(r.to_str().unwrap()).to_string())
    .collect::<Vec<_>>();
    files.sort();
    assert_eq!(
        files,
        [
            "/etc/group",
            "/etc/nsswitch.conf",
            "/etc/passwd",
            "/etc/ssl/certs/ca-certificates.crt",
            "/usr/bin/autonode-server",
        ],
        "the image holds exactly these files"
    );
    let bundle = fs::read_to_string(r.join("etc/ssl/certs/ca-certificates.crt"))?;
    assert!(
        bundle.matches("BEGIN CERTIFICATE").count() > 100,
        "CA bundle too small"
    );
    assert_eq!(mode(&r.join("usr/bin/autonode-server"))?, 0o755);

    let ldd = Command::new("ldd")
        .arg(r.join("usr/bin/autonode-server"))
        .output()?;
    let ldd =
        String::from_utf8_lossy(&ldd.stdout).into_owned() + &String::from_utf8_lossy(&ldd.stderr);
    assert!(!ldd.contains("=>"), "the server must be static:\n{ldd}");

    // As the image's user, in a root that has nothing else.
    let printed = run(
        "chroot",
        &[
            "--userspec=65532:65532",
            r.to_str().unwrap(),
            "/usr/bin/autonode-server",
            "--version",
        ],
    )?;
    assert_eq!(printed.trim(), format!("autonode-server {}", version()));
    Ok(())
}

/// `kubectl kustomize` of packaging/server with the kubectl of the version
/// under test: on the oldest supported (`tests/run --kube 1.26`, Kustomize
/// 4.5.7) this is the floor the base must not need more than.
fn kustomize_server() -> Result<Vec<serde_json::Value>> {
    kustomize("packaging/server")
}

/// `kubectl kustomize` of a directory of the workspace with the project's
/// kubectl, document by document.
fn kustomize(dir: &str) -> Result<Vec<serde_json::Value>> {
    let kubectl = kube_bin_dir()?.join("kubectl");
    let yaml = run(
        &kubectl.to_string_lossy(),
        &["kustomize", &workspace().join(dir).to_string_lossy()],
    )?;
    documents(&yaml)
}

/// The server's Kustomize base: what it must hold, then server-side
/// dry-run applied to a real kube-apiserver in a namespace of its own.
#[tokio::test]
async fn server_kustomization_dry_runs_on_apiserver() -> Result<()> {
    let docs = kustomize_server()?;
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    for kind in [
        "ServiceAccount",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ConfigMap",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], 2);
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let container = &pod["containers"][0];
    let sc = &container["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"][0], "ALL");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], "metrics");
    assert!(container["resources"]["requests"]["cpu"].is_string());
    assert!(container["resources"]["requests"]["memory"].is_string());
    let secrets: Vec<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["secret"]["secretName"].as_str())
        .collect();
    assert_eq!(
        secrets,
        [
            "autonode-server-tls",
            "autonode-guest-kubeconfig",
            "autonode-seal-key"
        ]
    );
    // Settings reach the server as its AUTONODE_* variables: the paths of
    // the mounted Secrets and, from the generated ConfigMap, the rest.
    let env = container["env"].to_string();
    for var in [
        "AUTONODE_TLS_CERT",
        "AUTONODE_TLS_KEY",
        "AUTONODE_KUBECONFIG",
        "AUTONODE_SEAL_KEY_FILE",
        "AUTONODE_PREVIOUS_SEAL_KEY_FILE",
    ] {
        assert!(env.contains(var), "{var} not set: {env}");
    }
    let configmap = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    assert_eq!(
        container["envFrom"][0]["configMapRef"]["name"], configmap["metadata"]["name"],
        "the Deployment must name the generated (hashed) ConfigMap"
    );
    // The PDB and Service select the Deployment's pods.
    let labels = &spec["template"]["metadata"]["labels"];
    for kind in ["PodDisruptionBudget", "Service"] {
        let doc = docs.iter().find(|d| d["kind"] == kind).unwrap();
        let selector = match kind {
            "Service" => &doc["spec"]["selector"],
            _ => &doc["spec"]["selector"]["matchLabels"],
        };
        for (k, v) in selector.as_object().unwrap() {
            assert_eq!(&labels[k], v, "{kind} selector {k}");
        }
    }

    let cp = ControlPlane::start().await?;
    let client = cp.admin().await?;
    let namespace = "autonode-cp-test";
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))?,
        )
        .await?;
    let policy_v1 = autonode_tests::kube::controlplane::serves_policy_v1_pdbs(&client).await;
    for mut doc in docs {
        if doc["apiVersion"] == "policy/v1" && !policy_v1 {
            doc["apiVersion"] = "policy/v1beta1".into();
        }
        let object: DynamicObject = serde_json::from_value(doc)?;
        let types = object.types.clone().context("apiVersion/kind")?;
        let gvk = GroupVersionKind::try_from(&types)?;
        let (resource, caps) = pinned_kind(&client, &gvk).await?;
        assert!(
            matches!(caps.scope, Scope::Namespaced),
            "{} is cluster-scoped: a base for one namespace holds none",
            gvk.kind
        );
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let name = object.metadata.name.clone().context("name")?;
        let mut params = PatchParams::apply("autonode-tests").force();
        params.dry_run = true;
        api.patch(&name, &params, &Patch::Apply(&object))
            .await
            .with_context(|| format!("server-side dry-run of {} {name}", gvk.kind))?;
    }
    Ok(())
}

/// The text of the admission policy's file.
fn admission_text() -> &'static str {
    GUEST_RBAC_FILES
        .iter()
        .find(|(name, _)| *name == NODECLASS_ADMISSION_FILE)
        .map(|(_, text)| *text)
        .unwrap_or_default()
}

/// The guest RBAC's kustomization (`kubectl apply -k packaging/guest`) with
/// Kustomize 2.0.3: exactly the objects of the files the default flags
/// need, the set the tests run a default server under, and a real
/// kube-apiserver takes them.
#[tokio::test]
async fn guest_rbac_kustomization_builds_the_default_set_and_applies() -> Result<()> {
    let built = kustomize("packaging/guest")?;
    let wanted = GuestRbac::default().files();
    let mut expected = Vec::new();
    for (name, text) in GUEST_RBAC_FILES {
        if wanted.contains(&name) {
            expected.extend(documents(text)?);
        }
    }
    let sorted = |docs: &[serde_json::Value]| {
        let mut texts: Vec<String> = docs.iter().map(|d| d.to_string()).collect();
        texts.sort();
        texts
    };
    assert_eq!(sorted(&built), sorted(&expected));

    let cp = ControlPlane::start().await?;
    let client = cp.admin().await?;
    // Before 1.30 the admission policy's file is left out, as docs/rbac.md
    // says: its objects are the ones that file holds.
    let admission = documents(admission_text())?;
    let served = serves_nodeclass_admission(cp.version());
    // Kustomize puts the Namespace first.
    for doc in &built {
        if served || !admission.contains(doc) {
            apply_manifest(&client, &doc.to_string()).await?;
        }
    }
    Ok(())
}

/// The example EC2NodeClass and NodePool: accepted by a real apiserver with
/// Karpenter's CRDs, with the settings the agent relies on; the userData is
/// a config the agent accepts.
#[tokio::test]
async fn example_nodeclass_and_nodepool_are_accepted() -> Result<()> {
    let examples = workspace().join("packaging/examples");
    let nodeclass = fs::read_to_string(examples.join("ec2nodeclass.yaml"))?;
    let nodepool = fs::read_to_string(examples.join("nodepool.yaml"))?;

    let cp = ControlPlane::start().await?;
    let client = cp.admin().await?;
    apply_manifest(&client, &nodeclass).await?;
    apply_manifest(&client, &nodepool).await?;

    let get = |group: &str, version: &str, kind: &str| {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let client = client.clone();
        async move {
            let (resource, _) = pinned_kind(&client, &gvk).await?;
            let api: Api<DynamicObject> = Api::all_with(client, &resource);
            anyhow::Ok(api.get("autonode").await?)
        }
    };
    let class = get("karpenter.k8s.aws", "v1", "EC2NodeClass").await?;
    let spec = &class.data["spec"];
    assert_eq!(spec["amiFamily"], "Custom");
    assert_eq!(spec["metadataOptions"]["httpTokens"], "required");
    assert_eq!(spec["metadataOptions"]["httpPutResponseHopLimit"], 1);
    assert_eq!(spec["metadataOptions"]["httpEndpoint"], "enabled");
    let user_data = spec["userData"].as_str().context("userData")?;
    // The example's userData is what the server renders for its settings
    // (the command in the example's comment), so it cannot drift.
    let rendered = run(
        &binary("autonode-server")?.to_string_lossy(),
        &[
            "render-userdata",
            "--public-url",
            "https://autonode.prod-eu-1.example.com:8443",
            "--join-ca-file",
            &examples.join("example-join-ca.crt").to_string_lossy(),
            "--cluster-name",
            "prod-eu-1",
            "--agent-deadline",
            "600",
        ],
    )?;
    assert_eq!(user_data, rendered, "regenerate the example's userData");
    let document = autonode_agent::config::document_from_user_data(user_data.as_bytes())?;
    autonode_agent::config::Config::resolve(document)?;

    let pool = get("karpenter.sh", "v1", "NodePool").await?;
    let class_ref = &pool.data["spec"]["template"]["spec"]["nodeClassRef"];
    assert_eq!(class_ref["kind"], "EC2NodeClass");
    assert_eq!(class_ref["name"], "autonode");
    Ok(())
}

/// What `packaging/release --here` (tests/run makes it) left for this
/// tree, in `target/release-here/` (never a release's own
/// `target/release/<version>/`): the four agent packages, the image, the
/// chart packaged at the workspace's version, a CycloneDX SBOM per binary
/// describing that binary and its dependencies, the `BUILDINFO` naming the
/// compilers, and `SHA256SUMS` naming exactly those files and verifying
/// every one.
#[test]
fn the_release_has_every_artifact_an_sbom_per_binary_and_checksums_that_verify() -> Result<()> {
    let version = env!("CARGO_PKG_VERSION");
    let package = package_version();
    let dir = workspace().join("target/release-here");
    let mut expected: Vec<String> = vec![
        format!("autonode-agent_{package}-1_amd64.deb"),
        format!("autonode-agent_{package}-1_arm64.deb"),
        format!("autonode-agent-{package}-1.x86_64.rpm"),
        format!("autonode-agent-{package}-1.aarch64.rpm"),
        "autonode-server-oci.tar".into(),
        format!("autonode-server-{version}.tgz"),
        "autonode-agent.cdx.json".into(),
        "autonode-server.cdx.json".into(),
        "BUILDINFO".into(),
    ];
    expected.sort();
    let sums = fs::read_to_string(dir.join("SHA256SUMS")).with_context(|| {
        format!(
            "{}: run packaging/release --here (tests/run does)",
            dir.display()
        )
    })?;
    let mut listed: Vec<String> = sums
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|name| name.trim_start_matches('*').to_string())
        .collect();
    listed.sort();
    assert_eq!(listed, expected, "SHA256SUMS lists other files");
    let check = Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&dir)
        .output()?;
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    for binary in ["autonode-agent", "autonode-server"] {
        let text = fs::read_to_string(dir.join(format!("{binary}.cdx.json")))?;
        let sbom: serde_json::Value = serde_json::from_str(&text)?;
        assert_eq!(sbom["bomFormat"], "CycloneDX", "{binary}");
        assert_eq!(sbom["metadata"]["component"]["name"], binary);
        let components = sbom["components"].as_array().map_or(0, Vec::len);
        assert!(components > 20, "{binary}: {components} components");
    }
    // What a rebuild needs to get the same bytes: the commit's time and
    // both compilers, the aarch64 one (Debian's moving rustc-web) with
    // its package version.
    let info = fs::read_to_string(dir.join("BUILDINFO"))?;
    for key in [
        "source_date_epoch=1",
        "x86_64.rustc=1.",
        "aarch64.rustc=1.",
        "aarch64.deb.rustc-web=1.",
        "image.ca-certificates=2",
    ] {
        assert!(
            info.lines().any(|l| l.starts_with(key)),
            "BUILDINFO lacks {key}: {info}"
        );
    }
    Ok(())
}

/// `nitro-tpm-pcr-compute`'s output for an attestable AMI, as the tool
/// prints it: its shape is aws/NitroTPM-Tools'
/// nitro-tpm-pcr-compute/src/build_info.rs (a pretty-printed object whose
/// one key `Measurements` holds `HashAlgorithm`, the Debug name of
/// aws-lc-rs's SHA384, then `PCR<n>` in index order) and its README's
/// "Output". The values are real: PCR4, PCR7 and PCR12 of the NitroTPM
/// document `nitrotpm-biomodel-2026-08-13.cbor` (a real AWS-signed
/// document, shared/nitro-attestation/), whose PCR7 is also the standard
/// boot value the tool computes (Secure Boot off, no PK, KEK, db or dbx)
/// and PCR12 the tool's zero (no command line given to the UKI).
const PCR_COMPUTE_OUTPUT: &str = r#"{
  "Measurements": {
    "HashAlgorithm": "SHA384",
    "PCR4": "3c428daf639a86655cbe8aeff1eeb298f59c6a82d8ea6fdc34c6f3af1d2582f091a25aca4a6f390c32f0f7701952829a",
    "PCR7": "98441c7f7625d10058c47683aec486ce311c633235eb555593a7ee791121e3578ae72d04ecef661f272d59058b77af35",
    "PCR12": "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
  }
}
"#;

/// Runs packaging/bake/measurements on `input` (its stdin) for the AMI
/// `name`: its exit status, stdout and stderr.
fn measurements(name: &str, input: &str) -> Result<(bool, String, String)> {
    use std::io::Write as _;
    let mut child = Command::new(workspace().join("packaging/bake/measurements"))
        .args(["--name", name])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running packaging/bake/measurements")?;
    child
        .stdin
        .take()
        .context("its stdin")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    Ok((
        out.status.success(),
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

/// The attestable bake's output: nitro-tpm-pcr-compute's JSON becomes the
/// one `measurements:` entry the server's --attestation-policy reads,
/// named after the AMI, each PCR an index and a quoted 96-hex string (the
/// all-zero PCR12 a string, not a number). What is not that tool's SHA-384
/// output with PCR4, PCR7 and PCR12 is refused with a reason, and nothing
/// is written.
#[test]
fn the_bake_turns_the_pcr_tools_output_into_the_policys_measurements() -> Result<()> {
    let name = "autonode-node-al2023-0.3.0-dev-x86_64-202612061830";
    let (ok, yaml, err) = measurements(name, PCR_COMPUTE_OUTPUT)?;
    ensure!(ok, "refused the tool's real output: {err}");
    let policy: serde_yaml::Value = serde_yaml::from_str(&yaml)?;
    let entries = policy["measurements"]
        .as_mapping()
        .context("no measurements map")?;
    assert_eq!(entries.len(), 1, "{yaml}");
    let pcrs = entries
        .get(name)
        .and_then(|e| e["pcrs"].as_mapping())
        .with_context(|| format!("no {name}.pcrs in {yaml}"))?;
    let got: Vec<(u64, String)> = pcrs
        .iter()
        .map(|(k, v)| Some((k.as_u64()?, v.as_str()?.to_string())))
        .collect::<Option<_>>()
        .with_context(|| format!("PCRs not index: string in {yaml}"))?;
    let source: serde_json::Value = serde_json::from_str(PCR_COMPUTE_OUTPUT)?;
    let want: Vec<(u64, String)> = [4, 7, 12]
        .iter()
        .map(|i| (*i, source["Measurements"][format!("PCR{i}")].to_string()))
        .map(|(i, quoted)| (i, quoted.trim_matches('"').to_string()))
        .collect();
    assert_eq!(got, want, "{yaml}");

    let good: serde_json::Value = serde_json::from_str(PCR_COMPUTE_OUTPUT)?;
    let with = |key: &str, value: serde_json::Value| {
        let mut doc = good.clone();
        doc["Measurements"][key] = value;
        doc.to_string()
    };
    let without = |key: &str| {
        let mut doc = good.clone();
        if let Some(m) = doc["Measurements"].as_object_mut() {
            m.remove(key);
        }
        doc.to_string()
    };
    let pcr4 = "PCR4";
    let bad = [
        (with("HashAlgorithm", "SHA256".into()), "HashAlgorithm"),
        (with(pcr4, "ab".repeat(32).into()), "96 hex"),
        (with(pcr4, "g".repeat(96).into()), "96 hex"),
        (with(pcr4, 4.into()), "96 hex"),
        (without("PCR4"), "PCR4"),
        (without("PCR7"), "PCR7"),
        (without("PCR12"), "PCR12"),
        (with("PCR30", "0".repeat(96).into()), "unknown key"),
        (good["Measurements"].to_string(), "Measurements"),
        ("not json".to_string(), "line 1"),
    ];
    for (input, reason) in bad {
        let (ok, out, err) = measurements(name, &input)?;
        assert!(!ok && out.is_empty(), "accepted {input}: {out}");
        assert!(err.contains(reason), "{input}: {err} (wanted {reason})");
    }
    let (ok, _, err) = measurements("a\"b", PCR_COMPUTE_OUTPUT)?;
    assert!(!ok && err.contains("AMI name"), "{err}");
    Ok(())
}
