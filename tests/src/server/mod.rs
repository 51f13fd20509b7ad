//! autonode-server run as a real process against a test control plane.
//!
//! The server authenticates to the guest cluster as the ServiceAccount in
//! `packaging/guest/rbac.yaml`, bound only to the roles of the shipped
//! guest RBAC files its flags call for ([`GuestRbac`]), so every test that
//! joins through it also proves those files are sufficient.
//!
//! Around it: the [`helm`] chart that deploys it, the operator's
//! [`ignition`] configs it reads, the earlier revisions of it and of the
//! agent for the [`skew`] tests, and one test's [`world`] (control plane,
//! fake cloud and server together).

pub mod attestation;
pub mod helm;
pub mod ignition;
pub mod skew;
pub mod world;

use crate::cloud::fakecloud::ec2::{TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY};
use crate::harness::pki::Ca;
use crate::harness::poll::Seen;
use crate::harness::process::Daemon;
use crate::kube::controlplane::{free_port, ControlPlane};
use crate::kube::manifest::{apply_manifest, delete_manifest};
use crate::kube::version::KubeVersion;
use anyhow::{bail, Context, Result};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::Client;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tempfile::TempDir;

/// The guest-cluster RBAC the project ships: every file of
/// `packaging/guest/` but its `kustomization.yaml`, by name. `rbac.yaml` is
/// the base; the others are each for one feature ([`GuestRbac`]).
pub const GUEST_RBAC_FILES: [(&str, &str); 6] = [
    (
        "rbac.yaml",
        include_str!("../../../packaging/guest/rbac.yaml"),
    ),
    (
        "rbac-ignition-secrets.yaml",
        include_str!("../../../packaging/guest/rbac-ignition-secrets.yaml"),
    ),
    (
        "rbac-delete-nodeclaims.yaml",
        include_str!("../../../packaging/guest/rbac-delete-nodeclaims.yaml"),
    ),
    (
        "rbac-manage-nodeclasses.yaml",
        include_str!("../../../packaging/guest/rbac-manage-nodeclasses.yaml"),
    ),
    (
        "rbac-install-crds.yaml",
        include_str!("../../../packaging/guest/rbac-install-crds.yaml"),
    ),
    (
        NODECLASS_ADMISSION_FILE,
        include_str!("../../../packaging/guest/admission-manage-nodeclasses.yaml"),
    ),
];
/// The file that refuses class editors' changes to the kept EC2NodeClass
/// fields at admission (`--manage-nodeclasses`, Kubernetes 1.30+).
pub const NODECLASS_ADMISSION_FILE: &str = "admission-manage-nodeclasses.yaml";
/// The ConfigMap in that file that tells the policy what the server keeps.
pub const NODECLASS_ADMISSION_SETTINGS: &str = "autonode-nodeclass-admission";
/// `packaging/guest/kustomization.yaml`: the files the default flags need.
pub const GUEST_KUSTOMIZATION: &str = include_str!("../../../packaging/guest/kustomization.yaml");
/// Where a [`ServerToken::File`] server's kubeconfig reads its token
/// from, in the server's directory ([`TestServer::dir`]).
pub const TOKEN_FILE: &str = "guest.token";
/// The object a [`ServerToken::File`] server's first token is bound to,
/// in the server's ServiceAccount's namespace: deleting it revokes that
/// token (a test object, holding nothing).
pub const TOKEN_ANCHOR: &str = "autonode-test-token-anchor";
/// The namespace and name of the server's ServiceAccount in that manifest.
pub const SERVER_SERVICE_ACCOUNT: (&str, &str) = ("autonode-system", "autonode-server");

/// The user the server's requests come as (its ServiceAccount).
pub fn server_user() -> String {
    let (namespace, name) = SERVER_SERVICE_ACCOUNT;
    format!("system:serviceaccount:{namespace}:{name}")
}

/// Which of the shipped guest RBAC files a server runs under: the base and
/// one optional file per feature that is on. [`GuestRbac::for_flags`] is
/// what an operator reads off the server's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestRbac {
    /// `rbac-ignition-secrets.yaml`: Ignition configs in Secrets. The
    /// server watches them whatever its flags, so on unless a test means
    /// to show what happens without it.
    pub ignition_secrets: bool,
    /// `rbac-delete-nodeclaims.yaml`: `--delete-failed-nodeclaims`.
    pub delete_nodeclaims: bool,
    /// `rbac-manage-nodeclasses.yaml`: `--manage-nodeclasses`.
    pub manage_nodeclasses: bool,
    /// `rbac-install-crds.yaml`: `--install-crds`.
    pub install_crds: bool,
    /// [`NODECLASS_ADMISSION_FILE`]: `--manage-nodeclasses`, applied only
    /// where the API server serves the policy's API
    /// ([`serves_nodeclass_admission`]).
    pub nodeclass_admission: bool,
}

impl Default for GuestRbac {
    /// What the server's default flags need (`kustomization.yaml`'s set).
    fn default() -> Self {
        Self::for_flags(&[])
    }
}

impl GuestRbac {
    /// The files `autonode-server serve` with `args` needs (each flag's
    /// default where `args` do not set it; the last setting wins).
    pub fn for_flags(args: &[String]) -> Self {
        Self {
            ignition_secrets: bool_flag(args, "ignition-secrets").unwrap_or(true),
            delete_nodeclaims: bool_flag(args, "delete-failed-nodeclaims").unwrap_or(true),
            manage_nodeclasses: bool_flag(args, "manage-nodeclasses").unwrap_or(true),
            install_crds: bool_flag(args, "install-crds").unwrap_or(false),
            nodeclass_admission: bool_flag(args, "manage-nodeclasses").unwrap_or(true),
        }
    }

    /// These files but the admission policy: what a test server runs
    /// under unless the test asks for the policy. Most tests play a class
    /// editor with the admin's credential to see what the upkeep does, and
    /// the policy would refuse those edits before the upkeep saw them.
    pub fn without_admission(self) -> Self {
        Self {
            nodeclass_admission: false,
            ..self
        }
    }

    /// The names of the files, in [`GUEST_RBAC_FILES`]' order.
    pub fn files(&self) -> Vec<&'static str> {
        GUEST_RBAC_FILES
            .iter()
            .map(|(name, _)| *name)
            .filter(|name| self.wants(name))
            .collect()
    }

    fn wants(&self, file: &str) -> bool {
        match file {
            "rbac-ignition-secrets.yaml" => self.ignition_secrets,
            "rbac-delete-nodeclaims.yaml" => self.delete_nodeclaims,
            "rbac-manage-nodeclasses.yaml" => self.manage_nodeclasses,
            "rbac-install-crds.yaml" => self.install_crds,
            NODECLASS_ADMISSION_FILE => self.nodeclass_admission,
            _ => true,
        }
    }

    /// Makes the guest cluster (at `version`) grant the server exactly
    /// these files: applies them and deletes the objects of the others (an
    /// earlier server's, on the same control plane). The admission policy
    /// is left out where the API server does not serve its API, as the
    /// docs tell operators to.
    pub async fn apply(&self, admin: &Client, version: KubeVersion) -> Result<()> {
        for (name, text) in GUEST_RBAC_FILES {
            if name == NODECLASS_ADMISSION_FILE && !serves_nodeclass_admission(version) {
                continue;
            }
            if self.wants(name) {
                apply_manifest(admin, text)
                    .await
                    .with_context(|| format!("packaging/guest/{name}"))?;
            } else {
                delete_manifest(admin, text)
                    .await
                    .with_context(|| format!("packaging/guest/{name}"))?;
            }
        }
        Ok(())
    }
}

/// Whether an API server at `version` serves what the admission policy
/// file is written in (`admissionregistration.k8s.io/v1`
/// ValidatingAdmissionPolicy: GA, on by default, from 1.30).
pub fn serves_nodeclass_admission(version: KubeVersion) -> bool {
    version.at_least(1, 30)
}

/// The data of [`NODECLASS_ADMISSION_SETTINGS`] for a server run with
/// `args`: the values of its flags of the same names, as the file's header
/// tells operators to write them (the last setting wins).
pub fn nodeclass_admission_settings(args: &[String]) -> serde_json::Value {
    let enforce = bool_flag(args, "enforce-metadata-options").unwrap_or(true);
    serde_json::json!({
        "nodeclass-names": string_flag(args, "nodeclass-names").unwrap_or_default(),
        "ami-ids": string_flag(args, "ami-ids").unwrap_or_default(),
        "enforce-metadata-options": enforce.to_string(),
    })
}

/// Tells the admission policy what a server run with `args` keeps (the
/// settings ConfigMap, [`nodeclass_admission_settings`]).
pub async fn set_nodeclass_admission_settings(admin: &Client, args: &[String]) -> Result<()> {
    let map = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": NODECLASS_ADMISSION_SETTINGS, "namespace": SERVER_SERVICE_ACCOUNT.0},
        "data": nodeclass_admission_settings(args),
    });
    apply_manifest(admin, &map.to_string())
        .await
        .context("the admission policy's settings")
}

/// The value `args` give the flag `--name` (`--name=V` or `--name V`), the
/// last one winning.
fn string_flag(args: &[String], name: &str) -> Option<String> {
    let long = format!("--{name}");
    let mut found = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if let Some(value) = arg.strip_prefix(&format!("{long}=")) {
            found = Some(value.to_string());
        } else if arg == &long {
            found = iter.next().cloned();
        }
    }
    found
}

/// The value `args` give the boolean flag `--name` (`--name=V`, `--name V`,
/// or a bare `--name` for true), the last one winning.
fn bool_flag(args: &[String], name: &str) -> Option<bool> {
    let long = format!("--{name}");
    let mut found = None;
    let mut iter = args.iter().peekable();
    while let Some(arg) = iter.next() {
        let Some(rest) = arg.strip_prefix(&long) else {
            continue;
        };
        if let Some(value) = rest.strip_prefix('=') {
            found = Some(value == "true");
        } else if rest.is_empty() {
            found = match iter.peek().map(|v| v.as_str()) {
                Some(value @ ("true" | "false")) => {
                    iter.next();
                    Some(value == "true")
                }
                _ => Some(true),
            };
        }
    }
    found
}

/// What the server is told about the cloud.
pub struct CloudSettings {
    /// PEM of the CA that plays AWS's identity-signing role.
    pub identity_ca_pem: String,
    /// The fake EC2 endpoint.
    pub ec2_endpoint: String,
    pub accounts: Vec<String>,
    pub regions: Vec<String>,
}

/// How a test wants its server.
pub struct Setup<'a> {
    pub extra_args: &'a [String],
    /// Also in the serving certificate (where a VM reaches the server
    /// through a forward).
    pub extra_ips: &'a [IpAddr],
    /// Where it reaches the API server, if not directly (a relay).
    pub api_url: Option<&'a str>,
    /// Return once `/readyz` says so (else once it serves, `/healthz`: for
    /// tests of what keeps it unready).
    pub wait_ready: bool,
    /// The guest RBAC files to run under; `None`: those `extra_args` call
    /// for ([`GuestRbac::for_flags`]) but the admission policy
    /// ([`GuestRbac::without_admission`]). With the policy, its settings
    /// are those of `extra_args`.
    pub rbac: Option<GuestRbac>,
    /// A guest RBAC manifest to run under instead of the shipped files
    /// (the Helm chart's rendering); it must create the server's
    /// ServiceAccount. `rbac` is then unused.
    pub rbac_manifest: Option<&'a str>,
    /// Where the server's token comes from.
    pub token: ServerToken,
    /// The CA the join API's certificate chains to; `None`: a new one.
    /// Given, a test can render userData (which pins it) before the
    /// server starts, and a second server can serve the same machines.
    pub join_ca: Option<&'a Ca>,
    /// The server binary; `None`: [`server_binary`] (an earlier
    /// revision's, for the skew tests: [`crate::server::skew`]).
    pub binary: Option<&'a Path>,
    /// Serve the join API with an RSA key of this many bits (what
    /// cert-manager issues) rather than an ECDSA one: what a handshake
    /// costs the server then.
    pub rsa_serving_key: Option<usize>,
    /// More environment, as a Deployment's `env` sets it (`AUTONODE_*`
    /// settings, which a server that does not know one ignores).
    pub env: &'a [(&'a str, &'a str)],
}

/// How the harness gets the server's ServiceAccount token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ServerToken {
    /// The TokenRequest API (works on every version; what most tests use).
    #[default]
    Requested,
    /// The documented path (docs/rbac.md): the kubeconfig names a token
    /// file (`tokenFile`, [`TOKEN_FILE`]) that the platform renews and the
    /// server re-reads. Its first token is bound to [`TOKEN_ANCHOR`], so a
    /// test can revoke it.
    File,
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Self {
            extra_args: &[],
            extra_ips: &[],
            api_url: None,
            wait_ready: true,
            rbac: None,
            rbac_manifest: None,
            token: ServerToken::Requested,
            join_ca: None,
            binary: None,
            rsa_serving_key: None,
            env: &[],
        }
    }
}

/// A running autonode-server.
pub struct TestServer {
    daemon: Daemon,
    url: String,
    metrics_url: String,
    ca_pem: String,
    dir: TempDir,
}

impl TestServer {
    /// Grants the guest RBAC files `extra_args` call for and starts the
    /// server under its ServiceAccount with `extra_args`; returns once it is
    /// ready.
    pub async fn start(
        cp: &ControlPlane,
        cloud: &CloudSettings,
        extra_args: &[String],
    ) -> Result<Self> {
        let setup = Setup {
            extra_args,
            ..Setup::default()
        };
        Self::launch(cp, cloud, &setup).await
    }

    /// [`TestServer::start`] with everything a test may vary.
    pub async fn launch(
        cp: &ControlPlane,
        cloud: &CloudSettings,
        setup: &Setup<'_>,
    ) -> Result<Self> {
        // A free port can be taken by another test's process before the
        // server binds it (nextest runs tests as separate processes, which
        // choose ports independently): it then exits at once, and is
        // started again on new ports, as the control plane's API server is.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let server = Self::spawn(cp, cloud, setup).await?;
            let started = if setup.wait_ready {
                server.wait_ready().await
            } else {
                server.wait_for("/healthz").await
            };
            match started {
                Ok(()) => return Ok(server),
                Err(_) if attempts < 3 && server.lost_its_port() => {
                    eprintln!("autonode-server: a port was taken meanwhile; new ports");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether the server exited because a port it was given was taken.
    fn lost_its_port(&self) -> bool {
        self.daemon.check_alive().is_err()
            && self
                .log()
                .to_ascii_lowercase()
                .contains("address already in use")
    }

    async fn spawn(cp: &ControlPlane, cloud: &CloudSettings, setup: &Setup<'_>) -> Result<Self> {
        let admin = cp.admin().await?;
        let rbac = setup
            .rbac
            .unwrap_or_else(|| GuestRbac::for_flags(setup.extra_args).without_admission());
        match setup.rbac_manifest {
            Some(yaml) => apply_manifest(&admin, yaml)
                .await
                .context("applying the test's guest RBAC manifest")?,
            None => {
                rbac.apply(&admin, cp.version()).await?;
                if rbac.nodeclass_admission && serves_nodeclass_admission(cp.version()) {
                    set_nodeclass_admission_settings(&admin, setup.extra_args).await?;
                }
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("autonode-server-")
            .tempdir()?;
        let user = match setup.token {
            ServerToken::Requested => {
                let token = service_account_token(&admin, SERVER_SERVICE_ACCOUNT, None).await?;
                serde_json::json!({ "token": token })
            }
            ServerToken::File => {
                let anchor = Some(token_anchor(&admin).await?);
                let token = service_account_token(&admin, SERVER_SERVICE_ACCOUNT, anchor).await?;
                let file = dir.path().join(TOKEN_FILE);
                std::fs::write(&file, token).context("writing the token file")?;
                serde_json::json!({ "tokenFile": file })
            }
        };
        let kubeconfig = dir.path().join("guest.kubeconfig");
        let api_url = setup.api_url.unwrap_or(cp.url());
        write_kubeconfig(&kubeconfig, api_url, cp.ca().cert_pem(), user)?;

        let made;
        let join_ca = match setup.join_ca {
            Some(ca) => ca,
            None => {
                made = Ca::new("autonode-join-ca")?;
                &made
            }
        };
        let mut ips = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
        ips.extend_from_slice(setup.extra_ips);
        let serving = match setup.rsa_serving_key {
            Some(bits) => join_ca.server_rsa(&["localhost"], &ips, bits)?,
            None => join_ca.server(&["localhost"], &ips)?,
        };
        let put = |name: &str, text: &str| -> Result<PathBuf> {
            let path = dir.path().join(name);
            std::fs::write(&path, text).with_context(|| format!("writing {name}"))?;
            Ok(path)
        };
        // The chain with its CA, as deployments serve it: agents that pin
        // the CA by its hash (`server-ca-sha256`) find it there.
        let chain = format!("{}{}", serving.cert_pem, join_ca.cert_pem());
        let cert = put("tls.crt", &chain)?;
        let key = put("tls.key", &serving.key_pem)?;
        std::fs::create_dir_all(dir.path().join("identity-certs"))?;
        put("identity-certs/any.pem", &cloud.identity_ca_pem)?;

        let (port, metrics_port) = (free_port()?, free_port()?);
        let mut args = vec![
            "serve".to_string(),
            format!("--listen=127.0.0.1:{port}"),
            format!("--metrics-listen=127.0.0.1:{metrics_port}"),
            format!("--tls-cert={}", cert.display()),
            format!("--tls-key={}", key.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!(
                "--identity-certs={}",
                dir.path().join("identity-certs").display()
            ),
            format!("--ec2-endpoint={}", cloud.ec2_endpoint),
            format!("--allowed-regions={}", cloud.regions.join(",")),
        ];
        // Unless the test sets its own (a wrong allow-list, say): the
        // flag's values add up.
        if !setup
            .extra_args
            .iter()
            .any(|a| a.starts_with("--allowed-accounts"))
        {
            args.push(format!("--allowed-accounts={}", cloud.accounts.join(",")));
        }
        // Unless the test sets its own (the flag may be given once).
        if !setup
            .extra_args
            .iter()
            .any(|a| a.starts_with("--csr-timeout"))
        {
            args.push("--csr-timeout=30".to_string());
        }
        args.extend_from_slice(setup.extra_args);
        let binary = match setup.binary {
            Some(path) => path.to_path_buf(),
            None => server_binary()?,
        };
        let mut env = vec![
            ("RUST_LOG", "info,autonode_server=debug"),
            // An error that ends it is its last lines, not a backtrace
            // (RUST_BACKTRACE, when set, would also capture one for
            // every anyhow error); panics still print theirs.
            ("RUST_LIB_BACKTRACE", "0"),
            ("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", TEST_SECRET_ACCESS_KEY),
            ("AWS_REGION", "us-west-2"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            // As packaging/server/deployment.yaml and the chart run it.
            ("MALLOC_ARENA_MAX", "2"),
        ];
        env.extend_from_slice(setup.env);
        let daemon = Daemon::spawn_with_env("autonode-server", &binary, &args, dir.path(), &env)?;
        Ok(Self {
            daemon,
            url: format!("https://127.0.0.1:{port}"),
            metrics_url: format!("http://127.0.0.1:{metrics_port}"),
            ca_pem: join_ca.cert_pem().to_string(),
            dir,
        })
    }

    /// The join API's base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The `/metrics` port's base URL.
    pub fn metrics_url(&self) -> &str {
        &self.metrics_url
    }

    /// The CA the join API's certificate chains to (what agents pin).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("autonode-server.log")).unwrap_or_default()
    }

    /// How many of the server's log lines so far are warnings that
    /// contain `text` (a message or a field's value).
    pub fn warn_lines(&self, text: &str) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains("WARN") && l.contains(text))
            .count()
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }

    /// Whether it leads now, as its `autonode_leader` gauge says.
    pub async fn leads(&self) -> Result<bool> {
        let metrics = http_get(&format!("{}/metrics", self.metrics_url()))
            .await?
            .1;
        let line = metrics
            .lines()
            .find(|l| l.starts_with("autonode_leader "))
            .context("no autonode_leader metric")?;
        Ok(line.trim_start_matches("autonode_leader ").trim() == "1")
    }

    /// A new serving key and certificate from `ca` (the `join_ca` it was
    /// started with) in place of its files, as a cert-manager renewal with
    /// `rotationPolicy: Always` (its default since v1.18) leaves them: read
    /// within seconds, and at the next start.
    pub fn rotate_tls_key(&self, ca: &Ca) -> Result<()> {
        let serving = ca.server(&["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])?;
        let chain = format!("{}{}", serving.cert_pem, ca.cert_pem());
        std::fs::write(self.dir().join("tls.crt"), chain)?;
        std::fs::write(self.dir().join("tls.key"), serving.key_pem)?;
        Ok(())
    }

    /// Its working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The guest cluster as the server sees it: its kubeconfig, the
    /// ServiceAccount's token.
    pub async fn guest_client(&self) -> Result<Client> {
        crate::kube::controlplane::kube_client(&self.dir.path().join("guest.kubeconfig")).await
    }

    /// Stops the server as a Deployment rollout does (SIGTERM: it finishes
    /// what it is doing and hands its Lease over), within `grace`; `true`
    /// if it stopped by itself.
    pub fn terminate(&self, grace: std::time::Duration) -> bool {
        self.daemon.terminate(grace)
    }

    /// Kills the server outright (SIGKILL: no shutdown, in-flight joins
    /// cut off) and waits for it to be gone.
    pub fn kill(&self) {
        self.daemon.kill();
    }

    /// Starts the server again (killing it first if it still runs): same
    /// ports, certificates, kubeconfig and flags; its log goes on in the
    /// same file. Returns once it is ready (`/readyz`, within 30 s).
    pub async fn restart(&self) -> Result<()> {
        self.daemon.restart()?;
        self.wait_ready().await
    }

    /// The server's resident memory (`VmRSS`), in bytes.
    pub fn rss_bytes(&self) -> Result<u64> {
        crate::harness::process::status_bytes(self.pid(), "VmRSS:")
    }

    /// The server's peak resident memory (`VmHWM`), in bytes.
    pub fn peak_rss_bytes(&self) -> Result<u64> {
        crate::harness::process::status_bytes(self.pid(), "VmHWM:")
    }

    /// Polls `/readyz` until the server can judge joins.
    async fn wait_ready(&self) -> Result<()> {
        self.wait_for("/readyz").await
    }

    /// Polls an observability endpoint until it answers 200.
    async fn wait_for(&self, path: &str) -> Result<()> {
        let ready = || async {
            let answer = http_get(&format!("{}{path}", self.metrics_url)).await;
            let ok = answer.as_ref().is_ok_and(|(s, _)| *s == 200);
            Ok(Seen(ok.then_some(()), format!("last answer: {answer:?}")))
        };
        let what = format!("200 from autonode-server's {path}");
        self.daemon
            .wait_for(
                &what,
                Duration::from_secs(30),
                Duration::from_millis(100),
                ready,
            )
            .await
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("AUTONODE_TEST_LOGS").is_some() {
            eprintln!("{}", self.daemon.log_tail(60));
        }
    }
}

/// A plain HTTP GET on loopback: (status, body).
pub async fn http_get(url: &str) -> Result<(u16, String)> {
    let output = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(r#"exec 3<>"/dev/tcp/$1/$2"; printf 'GET %s HTTP/1.0\r\nHost: x\r\n\r\n' "$3" >&3; cat <&3"#)
        .arg("get")
        .args(split_url(url)?)
        .output()
        .await?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no HTTP status")?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

fn split_url(url: &str) -> Result<[String; 3]> {
    let rest = url.strip_prefix("http://").context("only http:// URLs")?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = authority.rsplit_once(':').context("URL needs a port")?;
    Ok([host.to_string(), port.to_string(), format!("/{path}")])
}

/// The server binary [`TestServer`] runs: `$AUTONODE_SERVER_BIN` when set
/// (`tests/bench/compare` points it at a build of another revision), else
/// the one built next to the tests.
pub fn server_binary() -> Result<PathBuf> {
    match std::env::var_os("AUTONODE_SERVER_BIN") {
        Some(path) => Ok(PathBuf::from(path)),
        None => binary("autonode-server"),
    }
}

/// What `autonode-server render-userdata` prints with `args`.
pub fn render_user_data(args: &[String]) -> Result<String> {
    let output = std::process::Command::new(binary("autonode-server")?)
        .arg("render-userdata")
        .args(args)
        .output()
        .context("running autonode-server render-userdata")?;
    if !output.status.success() {
        bail!(
            "render-userdata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// Where cargo put a workspace binary (built by `cargo build --workspace`,
/// which `tests/run` does before the tests).
pub fn binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // Tests run from target/<profile>/deps/, the demo from target/<profile>/.
    let candidates: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(name))
        .collect();
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .with_context(|| format!("{name} is not built next to {}: run `cargo build --workspace --bins` (tests/run does)", exe.display()))
}

/// How long the server's test token is valid: longer than any test runs.
const TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);

/// A token for a ServiceAccount from the TokenRequest API
/// (`serviceaccounts/<name>/token`), on every version: since 1.24 no token
/// Secret is made for a ServiceAccount. The API server needs a signing
/// key, issuer and audience for it (see the control plane's flags). The
/// token is bound to the ServiceAccount, and to `bound` when given: valid
/// while they exist.
pub async fn service_account_token(
    client: &Client,
    (namespace, name): (&str, &str),
    bound: Option<BoundObjectReference>,
) -> Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            // No audiences: the API server's own (`--api-audiences`).
            audiences: Vec::new(),
            expiration_seconds: Some(TOKEN_LIFETIME.as_secs() as i64),
            bound_object_ref: bound,
        },
        ..Default::default()
    };
    let response = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for ServiceAccount {namespace}/{name}"))?;
    let token = response
        .status
        .map(|s| s.token)
        .filter(|t| !t.is_empty())
        .with_context(|| format!("no token in the TokenRequest for {namespace}/{name}"))?;
    Ok(token)
}

/// Creates [`TOKEN_ANCHOR`], an empty Secret in the server's
/// ServiceAccount's namespace, for a token to be bound to.
async fn token_anchor(client: &Client) -> Result<BoundObjectReference> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SERVER_SERVICE_ACCOUNT.0);
    let anchor = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(TOKEN_ANCHOR.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    let created = secrets
        .create(&PostParams::default(), &anchor)
        .await
        .context("creating the token's anchor")?;
    Ok(BoundObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Secret".into()),
        name: Some(TOKEN_ANCHOR.into()),
        uid: created.metadata.uid,
    })
}

/// A kubeconfig for `url` whose user is `user` (a token, or a token file).
fn write_kubeconfig(path: &Path, url: &str, ca_pem: &str, user: serde_json::Value) -> Result<()> {
    use base64::Engine as _;
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "guest", "cluster": {
            "server": url,
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca_pem),
        }}],
        "users": [{"name": "autonode-server", "user": user}],
        "contexts": [{"name": "guest", "context": {"cluster": "guest", "user": "autonode-server"}}],
        "current-context": "guest",
    });
    std::fs::write(path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// The most warn lines the server's refusal-line limiter lets through for
/// `reasons` refusal reasons flooded since `since`: each reason's burst,
/// and one per period the flood lasted (however slow the machine).
pub fn refusal_line_budget(since: std::time::Instant, reasons: usize) -> usize {
    use autonode_server::primitives::limiter::{REFUSAL_LINE_BURST, REFUSAL_LINE_PERIOD};
    let periods = since.elapsed().as_secs() / REFUSAL_LINE_PERIOD.as_secs();
    let per_reason = u64::from(REFUSAL_LINE_BURST) + periods + 1;
    reasons * usize::try_from(per_reason).unwrap_or(usize::MAX)
}
