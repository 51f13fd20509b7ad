//! The shipped artefacts, checked as built: the agent's .deb installed into
//! a real Debian root and removed again, the .rpm's files and scripts, the
//! systemd unit under systemd-analyze, the server's Kustomize base, the
//! guest RBAC's kustomization and the example EC2NodeClass/NodePool against
//! a real kube-apiserver, and the server's OCI image unpacked and run.
//!
//! `tests/run` builds the artefacts first (`packaging/build`,
//! `packaging/build-image`); the Debian root comes from
//! `packaging/debian-root` (cached by `tests/setup/install-deps`). These
//! tests need root (chroot, file ownership), as the rest of the suite does.

use anyhow::{bail, ensure, Context, Result};
use autonode_tests::controlplane::{kube_bin_dir, ControlPlane};
use autonode_tests::server::{apply_manifest, binary, GuestRbac, GUEST_RBAC_FILES};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::{pinned_kind, Scope};
use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The workspace version every crate inherits.
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Runs a command, fails with its output unless it succeeds; returns stdout.
fn run(program: &str, args: &[&str]) -> Result<String> {
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
fn debian_root() -> Result<tempfile::TempDir> {
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

fn chroot(root: &Path, args: &[&str]) -> Result<String> {
    let mut all = vec![root.to_str().context("root path")?];
    all.extend_from_slice(args);
    run("chroot", &all)
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
    assert!(info.contains(&format!("Version: {}", version())), "{info}");
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
        ("usr/share/doc/autonode-agent/README.md", 0o644),
    ] {
        let full = r.join(path);
        assert_eq!(mode(&full)?, want, "mode of /{path}");
        let meta = fs::metadata(&full)?;
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "owner of /{path}");
    }
    let copyright = fs::read_to_string(r.join("usr/share/doc/autonode-agent/copyright"))?;
    assert!(copyright.contains("Apache License"), "{copyright}");
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

/// The .rpm: files with their modes, the scripts enable and never start or
/// stop, the version, no shared-library requirements; then installed into
/// the Debian root and erased.
#[test]
fn rpm_contents_and_scripts() -> Result<()> {
    let rpm = package("autonode-agent-", ".x86_64.rpm")?;
    let rpm = rpm.to_string_lossy();

    let version_out = run("rpm", &["-qp", "--queryformat", "%{NAME} %{VERSION}", &rpm])?;
    assert_eq!(version_out, format!("autonode-agent {}", version()));

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
        ("/usr/share/doc/autonode-agent/README.md", 0o100644),
    ] {
        assert_eq!(modes.get(path), Some(&want), "{path} in\n{dump}");
    }
    let list = run("rpm", &["-qlp", &rpm])?;
    assert!(!list.contains("agent.toml\n"), "{list}");

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

/// `kubectl kustomize` of packaging/server with the project's kubectl
/// (v1.20.2, Kustomize 2.0.3: the base must not need newer).
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
    let mut docs = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&yaml) {
        use serde::Deserialize as _;
        docs.push(serde_json::Value::deserialize(document)?);
    }
    Ok(docs)
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
        ["autonode-server-tls", "autonode-guest-kubeconfig"]
    );
    // Settings reach the server as its AUTONODE_* variables: the paths of
    // the mounted Secrets and, from the generated ConfigMap, the rest.
    let env = container["env"].to_string();
    for var in [
        "AUTONODE_TLS_CERT",
        "AUTONODE_TLS_KEY",
        "AUTONODE_KUBECONFIG",
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
    // policy/v1 PodDisruptionBudgets exist from Kubernetes 1.21; the test
    // apiserver is 1.20, which serves the same schema as policy/v1beta1.
    let policy_v1 = client
        .list_api_group_resources("policy/v1")
        .await
        .map(|list| {
            list.resources
                .iter()
                .any(|r| r.kind == "PodDisruptionBudget")
        })
        .unwrap_or(false);
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
            for document in serde_yaml::Deserializer::from_str(text) {
                use serde::Deserialize as _;
                expected.push(serde_json::Value::deserialize(document)?);
            }
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
    // Kustomize puts the Namespace first.
    for doc in &built {
        apply_manifest(&client, &doc.to_string()).await?;
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
    let document = autonode_agent::config::Document::from_user_data(user_data.as_bytes())?;
    autonode_agent::config::Config::resolve(document)?;

    let pool = get("karpenter.sh", "v1", "NodePool").await?;
    let class_ref = &pool.data["spec"]["template"]["spec"]["nodeClassRef"];
    assert_eq!(class_ref["kind"], "EC2NodeClass");
    assert_eq!(class_ref["name"], "autonode");
    Ok(())
}
