//! The release signed the way each ecosystem checks it (`packaging/sign`,
//! issue 49), judged by that ecosystem's own tool, and each tool shown
//! refusing what an attacker between the release and the machine could
//! serve instead: apt installing the agent from the signed repository into
//! a Debian root with `signed-by` the release key, and refusing a modified
//! index, a package whose hash no longer matches, a Release signed by
//! another key and an unsigned one; `rpm -K` against the imported key, and
//! its refusal of a modified package and of one signed by another key;
//! `helm verify` on the chart and its provenance file; `gpg --verify` of
//! `SHA256SUMS.asc`; `skopeo standalone-verify` of the image's signature.
//!
//! The artifacts are what `packaging/release --here` left in
//! `target/release/<version>/` (or `AUTONODE_RELEASE_DIR`; tests/run makes
//! them; unsigned there, as
//! CI holds no release key): each test copies them and signs the copy with
//! a throwaway key of its own. Whatever architectures were built are
//! signed and checked (both in CI, amd64 only where the arm64 lane is not
//! built); the install runs the amd64 package, which this machine runs.
//! Needs root (chroot), as the rest of the suite does.

use crate::packaging::{chroot, debian_root, run, workspace};
use anyhow::{bail, ensure, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// A command's output, whatever its exit status.
fn output(command: &mut Command) -> Result<Output> {
    command
        .output()
        .with_context(|| format!("running {command:?}"))
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs a command that must succeed; its stdout and stderr together.
fn accepted(command: &mut Command) -> Result<String> {
    let out = output(command)?;
    if !out.status.success() {
        bail!("{command:?} failed ({}):\n{}", out.status, text(&out));
    }
    Ok(text(&out))
}

/// Runs a command that must fail (the check refusing); its output.
fn refused(command: &mut Command) -> Result<String> {
    let out = output(command)?;
    ensure!(
        !out.status.success(),
        "{command:?} accepted what it must refuse:\n{}",
        text(&out)
    );
    Ok(text(&out))
}

/// A throwaway OpenPGP key (RSA, as Helm reads no other) in a GnuPG home
/// of its own, deleted with it: the armored secret key `packaging/sign`
/// takes, the armored public key and a binary keyring of it (apt's
/// `signed-by`, `helm verify --keyring`, gpgv).
struct Key {
    home: tempfile::TempDir,
    fingerprint: String,
    secret: PathBuf,
    public: PathBuf,
    keyring: PathBuf,
}

impl Key {
    fn new(name: &str) -> Result<Self> {
        let home = tempfile::Builder::new().prefix("autonode-gpg-").tempdir()?;
        let mut key = Self {
            fingerprint: String::new(),
            secret: home.path().join("secret.asc"),
            public: home.path().join("public.asc"),
            keyring: home.path().join("public.gpg"),
            home,
        };
        let uid = format!("{name} <{}@autonode.invalid>", name.replace(' ', "-"));
        key.gpg(&[
            "--passphrase",
            "",
            "--quick-gen-key",
            &uid,
            "rsa2048",
            "sign",
            "never",
        ])?;
        let listed = key.gpg(&["--with-colons", "--list-secret-keys"])?;
        key.fingerprint = listed
            .lines()
            .find_map(|l| l.strip_prefix("fpr:"))
            .and_then(|rest| rest.split(':').find(|f| f.len() == 40))
            .context("no fingerprint listed")?
            .to_string();
        let fingerprint = key.fingerprint.clone();
        let secret = key.gpg(&["--armor", "--export-secret-keys", &fingerprint])?;
        fs::write(&key.secret, secret)?;
        let public = key.gpg(&["--armor", "--export", &fingerprint])?;
        fs::write(&key.public, public)?;
        let keyring = key.keyring.to_string_lossy().into_owned();
        key.gpg(&["--output", &keyring, "--export", &fingerprint])?;
        Ok(key)
    }

    /// gpg in this key's home, in batch mode.
    fn gpg(&self, args: &[&str]) -> Result<String> {
        let out = output(
            Command::new("gpg")
                .env("GNUPGHOME", self.home.path())
                .args(["--batch", "--yes", "--quiet"])
                .args(args),
        )?;
        ensure!(out.status.success(), "gpg {args:?}: {}", text(&out));
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Key {
    /// Ends the gpg-agent that key generation started in this home.
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .env("GNUPGHOME", self.home.path())
            .args(["--kill", "all"])
            .output();
    }
}

/// A copy of the release `packaging/release --here` built (the files
/// SHA256SUMS lists, and it), signed by `packaging/sign` with a throwaway
/// key.
struct Signed {
    dir: tempfile::TempDir,
    key: Key,
}

fn signed_release() -> Result<Signed> {
    // AUTONODE_RELEASE_DIR: another release directory to judge (a release
    // built elsewhere, before it is published).
    let built = std::env::var_os("AUTONODE_RELEASE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/release-here"));
    let sums = fs::read_to_string(built.join("SHA256SUMS")).with_context(|| {
        format!(
            "{}: run packaging/release --here (tests/run does)",
            built.display()
        )
    })?;
    let dir = tempfile::Builder::new()
        .prefix("autonode-signed-")
        .tempdir()?;
    for name in sums
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .chain(["SHA256SUMS"])
    {
        let name = name.trim_start_matches('*');
        fs::copy(built.join(name), dir.path().join(name))
            .with_context(|| format!("copying {name}"))?;
    }
    let key = Key::new("autonode test release")?;
    accepted(
        Command::new(workspace().join("packaging/sign"))
            .arg(dir.path())
            .env("AUTONODE_RELEASE_KEY", &key.secret)
            .env_remove("GNUPGHOME"),
    )?;
    Ok(Signed { dir, key })
}

/// The files in `dir` whose names end so, sorted.
fn files_ending(dir: &Path, suffix: &str) -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    found.sort();
    ensure!(!found.is_empty(), "no *{suffix} in {}", dir.display());
    Ok(found)
}

/// Flips the last byte of a file, keeping its size: only a hash check
/// notices.
fn flip_last_byte(path: &Path) -> Result<()> {
    let mut bytes = fs::read(path)?;
    let last = bytes.last_mut().context("empty file")?;
    *last ^= 0xff;
    fs::write(path, bytes)?;
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    if to.exists() {
        fs::remove_dir_all(to)?;
    }
    fs::create_dir_all(to.parent().context("no parent")?)?;
    run(
        "cp",
        &["-a", &from.to_string_lossy(), &to.to_string_lossy()],
    )?;
    Ok(())
}

/// A chroot command's outcome (the chroot helper of packaging.rs fails on
/// any error; the refusals need the output of a failure).
fn in_root(root: &Path, args: &[&str]) -> Command {
    let mut command = Command::new("chroot");
    command
        .arg(root)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive");
    command
}

/// Where the root's apt finds the repository, and a fresh start: the
/// repository as `repo` has it, no index downloaded before.
fn serve_apt(root: &Path, repo: &Path) -> Result<()> {
    copy_tree(repo, &root.join("srv/autonode/apt"))?;
    let lists = root.join("var/lib/apt/lists");
    if lists.exists() {
        fs::remove_dir_all(&lists)?;
    }
    fs::create_dir_all(lists.join("partial"))?;
    Ok(())
}

/// The agent from the signed APT repository into a Debian root whose only
/// source is that repository, `signed-by` the release key: installed and
/// run. Then what a mirror or proxy could serve instead, each refused by
/// apt with the agent left uninstalled: a Packages index changed after
/// signing (pointing at another package), a package whose bytes no longer
/// match its index, an index re-signed by another key, and the repository
/// with its signatures removed.
#[test]
fn apt_installs_the_agent_from_the_signed_repository_and_refuses_tampered_ones() -> Result<()> {
    let signed = signed_release()?;
    let apt = signed.dir.path().join("apt");
    let root = debian_root()?;
    let r = root.path();
    // This repository only: no Debian mirror is asked, nothing else signs.
    let _ = fs::remove_file(r.join("etc/apt/sources.list"));
    for entry in fs::read_dir(r.join("etc/apt/sources.list.d"))? {
        fs::remove_file(entry?.path())?;
    }
    fs::create_dir_all(r.join("usr/share/keyrings"))?;
    fs::copy(
        &signed.key.keyring,
        r.join("usr/share/keyrings/autonode.gpg"),
    )?;
    fs::write(
        r.join("etc/apt/sources.list.d/autonode.list"),
        "deb [signed-by=/usr/share/keyrings/autonode.gpg] file:/srv/autonode/apt stable main\n",
    )?;

    // Every architecture's package is in its index.
    for deb in files_ending(signed.dir.path(), ".deb")? {
        let arch = run(
            "dpkg-deb",
            &["--field", &deb.to_string_lossy(), "Architecture"],
        )?;
        let index = fs::read_to_string(
            apt.join(format!("dists/stable/main/binary-{}/Packages", arch.trim())),
        )?;
        let name = deb.file_name().context("name")?.to_string_lossy();
        assert!(index.contains(&format!("/{name}\n")), "{name}: {index}");
    }

    serve_apt(r, &apt)?;
    accepted(&mut in_root(r, &["apt-get", "update"]))?;
    accepted(&mut in_root(
        r,
        &["apt-get", "install", "-y", "autonode-agent"],
    ))?;
    let printed = chroot(r, &["/usr/bin/autonode-agent", "--version"])?;
    assert_eq!(printed.trim(), format!("autonode-agent {}", version()));
    accepted(&mut in_root(
        r,
        &["apt-get", "purge", "-y", "autonode-agent"],
    ))?;
    let not_installed = |what: &str| {
        assert!(
            !r.join("usr/bin/autonode-agent").exists(),
            "{what}: the agent was installed"
        );
    };

    // 1. The amd64 index changed after signing: another package's hash.
    let work = tempfile::Builder::new().prefix("autonode-apt-").tempdir()?;
    let tampered = work.path().join("apt");
    copy_tree(&apt, &tampered)?;
    let index = tampered.join("dists/stable/main/binary-amd64/Packages");
    let text_before = fs::read_to_string(&index)?;
    let changed: String = text_before
        .lines()
        .map(|l| match l.strip_prefix("SHA256: ") {
            Some(_) => format!("SHA256: {}\n", "0".repeat(64)),
            None => format!("{l}\n"),
        })
        .collect();
    fs::write(&index, &changed)?;
    fs::remove_file(index.with_extension("gz"))?;
    run("gzip", &["-9n", "--keep", &index.to_string_lossy()])?;
    serve_apt(r, &tampered)?;
    let said = refused(&mut in_root(r, &["apt-get", "update", "--error-on=any"]))?;
    assert!(
        said.contains("Hash Sum mismatch") || said.contains("unexpected size"),
        "a modified Packages: {said}"
    );
    let said = refused(&mut in_root(
        r,
        &["apt-get", "install", "-y", "autonode-agent"],
    ))?;
    assert!(said.contains("Unable to locate package"), "{said}");
    not_installed("a modified Packages");

    // 2. The package's bytes changed (same size): the index is intact.
    copy_tree(&apt, &tampered)?;
    let deb = files_ending(&tampered.join("pool/main/a/autonode-agent"), "_amd64.deb")?;
    flip_last_byte(&deb[0])?;
    serve_apt(r, &tampered)?;
    accepted(&mut in_root(r, &["apt-get", "update"]))?;
    let said = refused(&mut in_root(
        r,
        &["apt-get", "install", "-y", "autonode-agent"],
    ))?;
    assert!(
        said.contains("Hash Sum mismatch") || said.contains("Hashes of expected file"),
        "a package whose hash no longer matches: {said}"
    );
    not_installed("a package whose hash no longer matches");

    // 3. Modified and re-signed with another key: the index and Release
    // consistent, their signature not the release key's.
    let attacker = Key::new("attacker")?;
    copy_tree(&apt, &tampered)?;
    fs::write(&index, &changed)?;
    fs::remove_file(index.with_extension("gz"))?;
    run("gzip", &["-9n", "--keep", &index.to_string_lossy()])?;
    let dists = tampered.join("dists/stable");
    for name in ["Release", "InRelease", "Release.gpg"] {
        fs::remove_file(dists.join(name))?;
    }
    let release = accepted(
        Command::new("apt-ftparchive")
            .current_dir(&tampered)
            .args(["-o", "APT::FTPArchive::Release::Suite=stable"])
            .args(["-o", "APT::FTPArchive::Release::Codename=stable"])
            .args(["release", "dists/stable"]),
    )?;
    fs::write(dists.join("Release"), release.as_bytes())?;
    let (plain, inline) = (dists.join("Release"), dists.join("InRelease"));
    attacker.gpg(&[
        "--local-user",
        &attacker.fingerprint,
        "--clearsign",
        "--output",
        &inline.to_string_lossy(),
        &plain.to_string_lossy(),
    ])?;
    serve_apt(r, &tampered)?;
    let said = refused(&mut in_root(r, &["apt-get", "update", "--error-on=any"]))?;
    assert!(
        said.contains("NO_PUBKEY") || said.contains("not signed"),
        "a Release signed by another key: {said}"
    );
    let said = refused(&mut in_root(
        r,
        &["apt-get", "install", "-y", "autonode-agent"],
    ))?;
    assert!(said.contains("Unable to locate package"), "{said}");
    not_installed("a Release signed by another key");

    // 4. The signatures removed: an unsigned repository is refused.
    copy_tree(&apt, &tampered)?;
    fs::remove_file(dists.join("InRelease"))?;
    fs::remove_file(dists.join("Release.gpg"))?;
    serve_apt(r, &tampered)?;
    let said = refused(&mut in_root(r, &["apt-get", "update", "--error-on=any"]))?;
    assert!(
        said.contains("not signed"),
        "an unsigned repository: {said}"
    );
    not_installed("an unsigned repository");
    Ok(())
}

/// `rpm` with a database of its own, so importing a key touches nothing
/// of this machine.
fn rpm_in(db: &Path) -> Command {
    let mut command = Command::new("rpm");
    command.arg("--dbpath").arg(db);
    command
}

/// The YUM repository's packages, signed inside: `rpm -K` refuses them
/// before the release key is imported and accepts them after, with the
/// signature checked ("digests signatures OK"); a package changed after
/// signing and one signed by another key are refused. Its header and
/// payload are SHA256SUMS' package's, and the repository's metadata is
/// signed by the same key (dnf's repo_gpgcheck).
#[test]
fn rpm_checks_the_signature_against_the_imported_key_and_refuses_tampered_rpms() -> Result<()> {
    let signed = signed_release()?;
    let yum = signed.dir.path().join("yum");
    let db = tempfile::Builder::new()
        .prefix("autonode-rpmdb-")
        .tempdir()?;
    accepted(rpm_in(db.path()).arg("--initdb"))?;
    let rpms = files_ending(&yum, ".rpm")?;

    for rpm in &rpms {
        let said = refused(rpm_in(db.path()).arg("-Kv").arg(rpm))?;
        assert!(said.contains("NOKEY"), "no key imported yet: {said}");
    }
    accepted(rpm_in(db.path()).arg("--import").arg(&signed.key.public))?;
    let work = tempfile::Builder::new().prefix("autonode-rpm-").tempdir()?;
    let attacker = Key::new("attacker")?;
    for rpm in &rpms {
        let said = accepted(rpm_in(db.path()).arg("-K").arg(rpm))?;
        assert!(said.contains("digests signatures OK"), "{said}");

        // Signed inside, and nothing else changed: its header and payload
        // are the release's reproducible package's (their digests, which
        // the signature covers).
        let name = rpm.file_name().context("name")?;
        let digests = |path: &Path| -> Result<String> {
            run(
                "rpm",
                &[
                    "-qp",
                    "--queryformat",
                    "%{SHA256HEADER} %{PAYLOADDIGEST}",
                    &path.to_string_lossy(),
                ],
            )
        };
        assert_eq!(
            digests(rpm)?,
            digests(&signed.dir.path().join(name))?,
            "{}: not SHA256SUMS' package with a signature added",
            name.to_string_lossy()
        );

        let tampered = work.path().join("tampered.rpm");
        fs::copy(rpm, &tampered)?;
        flip_last_byte(&tampered)?;
        let said = refused(rpm_in(db.path()).arg("-K").arg(&tampered))?;
        assert!(said.contains("NOT OK"), "a modified package: {said}");

        let other = work.path().join("other.rpm");
        fs::copy(signed.dir.path().join(name), &other)?;
        accepted(
            Command::new("rpmsign")
                .arg("--addsign")
                .args(["--define", "__gpg /usr/bin/gpg"])
                .args(["--define", &format!("_gpg_name {}", attacker.fingerprint)])
                .args([
                    "--define",
                    &format!("_gpg_path {}", attacker.home.path().display()),
                ])
                .args(["--define", "_gpg_sign_cmd_extra_args --batch"])
                .arg(&other),
        )?;
        let said = refused(rpm_in(db.path()).arg("-Kv").arg(&other))?;
        assert!(said.contains("NOKEY"), "signed by another key: {said}");
    }

    // The metadata dnf reads, signed; a changed repomd.xml is refused.
    let repomd = yum.join("repodata/repomd.xml");
    let signature = yum.join("repodata/repomd.xml.asc");
    let gpgv = |data: &Path, keyring: &Path| {
        let mut command = Command::new("gpgv");
        command
            .arg("--keyring")
            .arg(keyring)
            .arg(&signature)
            .arg(data);
        command
    };
    accepted(&mut gpgv(&repomd, &signed.key.keyring))?;
    let primary = fs::read_to_string(&repomd)?;
    assert!(primary.contains("primary"), "{primary}");
    let changed = work.path().join("repomd.xml");
    fs::write(&changed, primary.replacen("<revision>", "<revision>1", 1))?;
    let said = refused(&mut gpgv(&changed, &signed.key.keyring))?;
    assert!(
        said.contains("BAD signature"),
        "a modified repomd.xml: {said}"
    );
    Ok(())
}

/// `helm verify` accepts the chart with its provenance file against the
/// release key; refuses the chart with a changed file (the provenance's
/// SHA-256 no longer matches) and the same chart signed by another key.
#[test]
fn helm_verify_accepts_the_signed_chart_and_refuses_tampered_ones() -> Result<()> {
    let signed = signed_release()?;
    let helm = run(
        &workspace()
            .join("tests/setup/install-helm")
            .to_string_lossy(),
        &[],
    )?;
    let helm = helm.trim();
    let chart = signed
        .dir
        .path()
        .join(format!("autonode-server-{}.tgz", version()));
    let verify = |chart: &Path| {
        let mut command = Command::new(helm);
        command
            .arg("verify")
            .arg("--keyring")
            .arg(&signed.key.keyring)
            .arg(chart);
        command
    };
    let said = accepted(&mut verify(&chart))?;
    assert!(
        said.contains(&format!(
            "Using Key With Fingerprint: {}",
            signed.key.fingerprint
        )),
        "{said}"
    );

    // The chart's values changed (the image pointed elsewhere), repacked
    // under the same name, the provenance file kept.
    let work = tempfile::Builder::new()
        .prefix("autonode-chart-")
        .tempdir()?;
    let w = work.path();
    run(
        "tar",
        &["-xzf", &chart.to_string_lossy(), "-C", &w.to_string_lossy()],
    )?;
    let values = w.join("autonode-server/values.yaml");
    let text = fs::read_to_string(&values)?;
    ensure!(text.contains("repository: autonode-server"), "{text}");
    fs::write(
        &values,
        text.replace(
            "repository: autonode-server",
            "repository: evil.example/autonode-server",
        ),
    )?;
    let tampered = w.join("tampered");
    fs::create_dir(&tampered)?;
    let tampered_chart = tampered.join(chart.file_name().context("name")?);
    run(
        "tar",
        &[
            "-czf",
            &tampered_chart.to_string_lossy(),
            "-C",
            &w.to_string_lossy(),
            "autonode-server",
        ],
    )?;
    fs::copy(
        chart.with_extension("tgz.prov"),
        tampered_chart.with_extension("tgz.prov"),
    )?;
    let said = refused(&mut verify(&tampered_chart))?;
    assert!(
        said.contains("sha256 sum does not match") || said.contains("do not match"),
        "a changed chart: {said}"
    );

    // The release's very chart, its provenance signed by another key.
    let attacker = Key::new("attacker")?;
    let secring = attacker.home.path().join("secring.gpg");
    attacker.gpg(&[
        "--output",
        &secring.to_string_lossy(),
        "--export-secret-keys",
        &attacker.fingerprint,
    ])?;
    let other = w.join("other");
    // Packaged at the release's time, as packaging/sign does.
    let info = fs::read_to_string(signed.dir.path().join("BUILDINFO"))?;
    let epoch = info
        .lines()
        .find_map(|l| l.strip_prefix("source_date_epoch="))
        .context("BUILDINFO names no source_date_epoch")?;
    accepted(
        Command::new(workspace().join("packaging/chart"))
            .env("SOURCE_DATE_EPOCH", epoch)
            .arg(helm)
            .arg(workspace().join("packaging/helm/autonode-server"))
            .arg(version())
            .arg(&other)
            .args(["--sign", "--key", "attacker", "--keyring"])
            .arg(&secring),
    )?;
    let other_chart = other.join(chart.file_name().context("name")?);
    assert!(
        fs::read(&other_chart)? == fs::read(&chart)?,
        "not the same bytes"
    );
    let said = refused(&mut verify(&other_chart))?;
    assert!(
        said.contains("unknown entity") || said.contains("key"),
        "signed by another key: {said}"
    );
    Ok(())
}

/// `gpg --verify SHA256SUMS.asc`: good with the release key; a changed
/// checksum and a signature by another key are refused.
#[test]
fn the_checksums_signature_verifies_and_refuses_tampering() -> Result<()> {
    let signed = signed_release()?;
    let d = signed.dir.path();
    // A verifier's keyring: the public key only.
    let verifier = tempfile::Builder::new().prefix("autonode-gpg-").tempdir()?;
    let _agent = KillAgent(verifier.path().to_path_buf());
    let gpg = |args: &[&Path]| {
        let mut command = Command::new("gpg");
        command
            .env("GNUPGHOME", verifier.path())
            .args(["--batch", "--status-fd", "1"])
            .args(args);
        command
    };
    accepted(gpg(&[Path::new("--import"), &signed.key.public]).current_dir(d))?;
    let sums = d.join("SHA256SUMS");
    let asc = d.join("SHA256SUMS.asc");
    let said = accepted(&mut gpg(&[Path::new("--verify"), &asc, &sums]))?;
    assert!(
        said.contains(&format!("VALIDSIG {}", signed.key.fingerprint)),
        "{said}"
    );

    let work = tempfile::Builder::new()
        .prefix("autonode-sums-")
        .tempdir()?;
    let changed = work.path().join("SHA256SUMS");
    let text = fs::read_to_string(&sums)?;
    let first_hash = text.split_whitespace().next().context("empty SHA256SUMS")?;
    fs::write(&changed, text.replacen(first_hash, &"0".repeat(64), 1))?;
    let said = refused(&mut gpg(&[Path::new("--verify"), &asc, &changed]))?;
    assert!(said.contains("BADSIG"), "a changed SHA256SUMS: {said}");

    let attacker = Key::new("attacker")?;
    let other = work.path().join("SHA256SUMS.asc");
    attacker.gpg(&[
        "--local-user",
        &attacker.fingerprint,
        "--armor",
        "--detach-sign",
        "--output",
        &other.to_string_lossy(),
        &sums.to_string_lossy(),
    ])?;
    let said = refused(&mut gpg(&[Path::new("--verify"), &other, &sums]))?;
    assert!(
        said.contains("NO_PUBKEY") || said.contains("ERRSIG"),
        "signed by another key: {said}"
    );
    Ok(())
}

/// Ends a verifier home's gpg-agent, if one was started.
struct KillAgent(PathBuf);

impl Drop for KillAgent {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .env("GNUPGHOME", &self.0)
            .args(["--kill", "all"])
            .output();
    }
}

/// The image's signature, as podman and CRI-O check it (the containers'
/// "simple signing" format; `skopeo standalone-verify`): good for the
/// archive's manifest and the released reference with the release key; a
/// changed manifest, another reference and a signature by another key
/// are refused.
#[test]
fn the_image_signature_verifies_and_refuses_tampering() -> Result<()> {
    let signed = signed_release()?;
    let d = signed.dir.path();
    let work = tempfile::Builder::new()
        .prefix("autonode-image-")
        .tempdir()?;
    let w = work.path();
    run(
        "tar",
        &[
            "-xf",
            &d.join("autonode-server-oci.tar").to_string_lossy(),
            "-C",
            &w.to_string_lossy(),
        ],
    )?;
    let index: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(w.join("index.json"))?)?;
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .context("no manifest in index.json")?;
    let manifest = w
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"));
    let reference = format!("autonode-server:{}", version());
    let signature = d.join("autonode-server-image.sig");

    let verifier = w.join("gnupg");
    fs::create_dir(&verifier)?;
    let _agent = KillAgent(verifier.clone());
    accepted(
        Command::new("gpg")
            .env("GNUPGHOME", &verifier)
            .args(["--batch", "--import"])
            .arg(&signed.key.public),
    )?;
    let verify = |manifest: &Path, reference: &str, signature: &Path| {
        let mut command = Command::new("skopeo");
        command
            .env("GNUPGHOME", &verifier)
            .arg("standalone-verify")
            .arg(manifest)
            .arg(reference)
            .arg(&signed.key.fingerprint)
            .arg(signature);
        command
    };
    let said = accepted(&mut verify(&manifest, &reference, &signature))?;
    assert!(said.contains(digest), "{said}");

    let changed = w.join("manifest.json");
    let text = fs::read_to_string(&manifest)?;
    fs::write(
        &changed,
        text.replacen("\"schemaVersion\":2", "\"schemaVersion\":2 ", 1),
    )?;
    ensure!(
        fs::read(&changed)? != fs::read(&manifest)?,
        "the manifest was not changed"
    );
    refused(&mut verify(&changed, &reference, &signature))?;

    refused(&mut verify(&manifest, "autonode-server:0.0.1", &signature))?;

    let attacker = Key::new("attacker")?;
    let other = w.join("other.sig");
    accepted(
        Command::new("skopeo")
            .env("GNUPGHOME", attacker.home.path())
            .arg("standalone-sign")
            .arg("--output")
            .arg(&other)
            .arg(&manifest)
            .arg(&reference)
            .arg(&attacker.fingerprint),
    )?;
    let said = refused(&mut verify(&manifest, &reference, &other))?;
    assert!(!said.is_empty(), "signed by another key");
    Ok(())
}

/// The reproducibility check (`packaging/reproduce`, which tests/run runs
/// on a second build) compares what it must: the same SHA256SUMS pass, a
/// differing artifact fails naming it, and with `--arches` each line of the
/// partial second build must be the first's.
#[test]
fn the_reproducibility_check_refuses_differing_builds() -> Result<()> {
    let sums = "1111111111111111111111111111111111111111111111111111111111111111  a.deb\n\
                2222222222222222222222222222222222222222222222222222222222222222  b.rpm\n";
    let work = tempfile::Builder::new()
        .prefix("autonode-repro-")
        .tempdir()?;
    let (first, second) = (work.path().join("first"), work.path().join("second"));
    fs::create_dir(&first)?;
    fs::create_dir(&second)?;
    fs::write(first.join("SHA256SUMS"), sums)?;
    let compare = |extra: &[&str]| {
        let mut command = Command::new(workspace().join("packaging/reproduce"));
        command
            .arg("--compare")
            .arg(&first)
            .arg(&second)
            .args(extra);
        command
    };
    fs::write(second.join("SHA256SUMS"), sums)?;
    accepted(&mut compare(&[]))?;
    fs::write(second.join("SHA256SUMS"), sums.replacen("2222", "3333", 1))?;
    let said = refused(&mut compare(&[]))?;
    assert!(said.contains("b.rpm"), "{said}");
    let partial = sums.lines().next().context("a line")?;
    fs::write(second.join("SHA256SUMS"), format!("{partial}\n"))?;
    accepted(&mut compare(&["--arches", "x86_64"]))?;
    refused(&mut compare(&[]))?;
    fs::write(
        second.join("SHA256SUMS"),
        format!("{}\n", partial.replacen("1111", "4444", 1)),
    )?;
    let said = refused(&mut compare(&["--arches", "x86_64"]))?;
    assert!(said.contains("a.deb"), "{said}");
    Ok(())
}
